"""Every head of every family, image and sequence, compiles as one graph and exports, matching eager mode.

Value checks on the inputs (vocabulary range, iMixer's count of real tokens) read tensors into Python; they run
in eager mode only, so under `torch.compile(fullgraph=True)` (which raises on any graph break) and `torch.export`
there is none. The
default tests use dynamo's capture with the `aot_eager` backend (the graph, AOT autograd and decompositions,
without code generation, which takes minutes on 2 cores); `-m slow` also runs the inductor backend.
"""

from __future__ import annotations

import os

import pytest
import torch
from fixtures import (
    ALL,
    HEADS,
    Case,
    assert_close_to_scale,
    cases,
    labelled,
    main_output,
    perturb,
    rounding,
    tiny_mim_model,
)

import energyformers
from energyformers import HyperSetForImageClassification, HyperSetForSequenceClassification
from energyformers.modeling.modeling_hyperset import ALL_ATTENTION_FUNCTIONS


def build(case: Case | torch.nn.Module, train: bool = False) -> torch.nn.Module:
    model = perturb(
        case if isinstance(case, torch.nn.Module) else case.build()
    )  # zero-initialised heads and step sizes would hide wrong numbers
    return model.train(train)


# An evaluation forward with gradients on has AOT autograd trace the joint forward and backward graph, twice the
# compile time of the inference graph (no_grad) and traced again per head in training mode by the next test: every
# case compiles under no_grad, one base model per family (on sequences: the padded path) also with gradients, and
# `-m slow` compiles every case with gradients.
WITH_GRAD = {
    Case.of(getattr(energyformers, f"{family}Model"), "sequence")
    for family in ("HyperSet", "IMixer", "HyperBF")
}
FULLGRAPH = [pytest.param(case, False, id=f"{case}-no_grad") for case in ALL] + [
    pytest.param(case, True, id=f"{case}-grad", marks=() if case in WITH_GRAD else pytest.mark.slow)
    for case in ALL
]


@pytest.mark.parametrize("case, grad", FULLGRAPH)
def test_compile_fullgraph_matches_eager(case, grad):
    torch._dynamo.reset()
    model, inputs = build(case), case.inputs()
    with torch.set_grad_enabled(grad):
        expected = main_output(model(**inputs))
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        got = main_output(compiled(**inputs))
        assert got.requires_grad == grad, (
            f"grad={grad}: the compiled output's requires_grad is {got.requires_grad}"
        )
        torch.testing.assert_close(got, expected)
        other = case.inputs(seed=1)  # new values, same shapes: no recompilation needed, same answer as eager
        torch.testing.assert_close(main_output(compiled(**other)), main_output(model(**other)))


@cases(HEADS)
def test_compiled_training_step_matches_eager_gradients(case):
    torch._dynamo.reset()
    inputs = case.inputs(labels=True)
    eager, compiled = build(case, train=True), build(case, train=True)
    eager(**inputs).loss.backward()
    torch.compile(compiled, fullgraph=True, backend="aot_eager")(**inputs).loss.backward()
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, msg=labelled(name))


@cases(ALL)
def test_torch_export_matches_eager(case):
    model, inputs = build(case), case.inputs()
    program = torch.export.export(model, (), inputs)
    for seed in (0, 1):
        inputs = case.inputs(seed=seed)
        torch.testing.assert_close(main_output(program.module()(**inputs)), main_output(model(**inputs)))


class TorchCalls(torch.overrides.TorchFunctionMode):
    """Records the name of every torch function an eager forward calls (before any decomposition, as export's
    graph names them)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


# ops that tell the plain weight path from the one for wrapped or quantized Linears: Hyper-SET's tied Wᵀ built as
# module(I) − module(0) (`eye`), HyperBF's values folded into an attention call (`scaled_dot_product`: one more
# per layer than on the explicit path)
PATH_OPS = ("eye", "scaled_dot_product")


@pytest.mark.parametrize(
    "model_class", ["HyperSetForSequenceClassification", "HyperBFForSequenceClassification"]
)
def test_non_strict_export_of_a_plain_model_takes_the_plain_weight_path(model_class):
    """Non-strict `torch.export` (what `torch.onnx.export(dynamo=True)` runs) traces with FakeTensor parameters:
    a plain Linear is still read as a tensor, so the program runs the ops the eager forward runs."""
    case = Case.of(getattr(energyformers, model_class))
    model, inputs = build(case.build(attn_implementation="sdpa")), case.inputs()
    with torch.no_grad(), TorchCalls() as eager:
        model(**inputs)
    program = torch.export.export(model, (), inputs)
    exported = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    counts = {
        op: (sum(op in name for name in eager.names), sum(op in name for name in exported)) for op in PATH_OPS
    }
    assert all(a == b for a, b in counts.values()), f"{model_class}: (eager, exported) op counts {counts}"
    assert counts["eye"][0] == 0, f"{model_class}: the eager forward of a plain model builds Wᵀ: {counts}"


# inductor's code generation (C++ on CPU) costs ~15 s a model: the default run compiles Hyper-SET's image classifier,
# the family's headline head; `-m slow` every head of every family
INDUCTOR_DEFAULT = "HyperSetForImageClassification-image"


@pytest.mark.parametrize(
    "case",
    [case if str(case) == INDUCTOR_DEFAULT else pytest.param(case, marks=pytest.mark.slow) for case in ALL],
    ids=str,
)
def test_inductor_compile_matches_eager(case):
    torch._dynamo.reset()
    model, inputs = build(case), case.inputs()
    compiled = torch.compile(model, fullgraph=True)
    # inductor fuses and reorders the float32 sums of the whole forward (2 layers × up to 3 iterations, each with
    # sums over the tokens and channels): 256 roundings of the output's largest magnitude
    assert_close_to_scale(
        main_output(compiled(**inputs)),
        main_output(model(**inputs)),
        rounding(torch.float32, 256),
        "inductor",
    )


def test_one_iteration_is_traced_once():
    """The layer step is one nested compile region: the graph calls one subgraph L·T times instead of unrolling
    the loop, so the graph, and compile time, barely grow with the depth T."""
    if not hasattr(torch.compiler, "nested_compile_region"):
        pytest.skip("torch.compiler.nested_compile_region needs torch >= 2.8")
    case = Case.of(HyperSetForImageClassification)
    sizes = {}
    for depth in (2, 5):
        torch._dynamo.reset()
        graphs = []

        def keep_graph(graph_module, example_inputs, graphs=graphs):
            graphs.append(graph_module)
            return graph_module

        model = build(case.build(num_iterations=depth))
        torch.compile(model, fullgraph=True, backend=keep_graph)(**case.inputs())
        (graph,) = graphs
        calls = [node for node in graph.graph.nodes if node.target is torch.ops.higher_order.invoke_subgraph]
        assert len(calls) == model.config.num_hidden_layers * depth
        assert len({node.args[0].target for node in calls}) == 1  # one traced step, shared by both layers
        sizes[depth] = len(graph.graph.nodes)
    # unrolled, one iteration is ~50 nodes; a call of the region is a handful (the call, its outputs)
    assert (sizes[5] - sizes[2]) / (3 * case.config().num_hidden_layers) <= 8


def test_export_traces_the_layer_step_without_dynamo():
    """Non-strict `torch.export` traces the layer step as plain code: torch would run Dynamo on the nested compile
    region anew at each of the L·T calls (several times the cost of the unrolled trace); torch.compile keeps the
    region (`test_one_iteration_is_traced_once`)."""
    case = Case.of(HyperSetForSequenceClassification)
    model, inputs = build(case), case.inputs()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    program = torch.export.export(model, (), inputs)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs == 0, f"non-strict export compiled {graphs} Dynamo graphs"
    torch.testing.assert_close(main_output(program.module()(**inputs)), main_output(model(**inputs)))


@pytest.mark.parametrize("name", ["sdpa", "triton"])
@cases([Case.of(HyperSetForSequenceClassification)])
def test_attention_implementations_compile_and_export(case, name):
    """The SDPA path and the fused kernel (a custom operator) compile as one graph and export, matching eager
    mode, forward and training gradients; padded sequences included."""
    if name == "triton" and name not in ALL_ATTENTION_FUNCTIONS:
        pytest.skip("Triton is not installed")
    if name == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton runs on CPU only in its interpreter (conftest.py sets it where there is no CUDA)")
    torch._dynamo.reset()
    # Triton's interpreter runs the kernel's programs one after another, one per (batch row, head): 2 rows (the
    # first padded, the second not) and 2 heads, a third of the tiny case's 3 × 4. Two iterations of both layers:
    # the traced step is still reused across layers and iterations, and the kernel runs L·T = 4 times per pass
    inputs = {key: value[:2] for key, value in case.inputs(labels=True).items()}
    assert inputs["attention_mask"][0].sum() < inputs["attention_mask"][1].sum(), inputs["attention_mask"]
    eager, compiled = (
        build(case.build(num_iterations=2, num_attention_heads=2), train=True) for _ in range(2)
    )
    for model in (eager, compiled):
        model.set_attn_implementation(name)
        with torch.no_grad():
            model.hyperset.step_sizes.proj.bias.fill_(0.3)  # large steps: the attention shows in the output
    expected = eager(**inputs)
    expected.loss.backward()
    got = torch.compile(compiled, fullgraph=True, backend="aot_eager")(**inputs)
    got.loss.backward()
    torch.testing.assert_close(got.logits, expected.logits)
    for (key, a), b in zip(eager.named_parameters(), compiled.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, msg=labelled(key))
    inputs.pop("labels")
    program = torch.export.export(eager.eval(), (), inputs)
    torch.testing.assert_close(main_output(program.module()(**inputs)), main_output(eager(**inputs)))


@pytest.mark.parametrize("halting", [False, True], ids=["fixed-depth", "halting"])
def test_constant_step_sizes_are_computed_once(halting, monkeypatch):
    """Step sizes conditioned on the embedded input with one condition c (the Sudoku preset) are the same at every
    iteration: the model computes them once per forward, with the same outputs and gradients as per iteration."""
    from energyformers.modeling.modeling_hyperset import HyperSetStepSizes

    case = Case.of(HyperSetForSequenceClassification)
    overrides = dict(step_size_condition="input", iteration_conditioning="none")
    assert HyperSetStepSizes.constant_over_iterations(case.config(**overrides))
    inputs = case.inputs(labels=not halting)
    results, calls = [], {}
    for hoisted in (True, False):
        monkeypatch.setattr(
            HyperSetStepSizes, "constant_over_iterations", staticmethod(lambda config, value=hoisted: value)
        )
        model = build(case.build(**overrides), train=not halting)
        counted = []
        model.hyperset.step_sizes.register_forward_hook(lambda *args, counted=counted: counted.append(1))
        if halting:
            outputs = model(**inputs, halting_tolerance=1e-3)
        else:
            outputs = model(**inputs)
            outputs.loss.backward()
        results.append((outputs.logits, [p.grad for p in model.parameters()]))
        calls[hoisted] = len(counted)
    assert calls[True] == 0 and calls[False] > 0  # hoisted: the layers never call the network
    (logits, grads), (reference, reference_grads) = results
    torch.testing.assert_close(logits, reference, atol=0, rtol=0)
    for grad, reference_grad in zip(grads, reference_grads):
        if reference_grad is not None:
            # one sum of the step sizes' gradient over the 3 iterations instead of one per iteration: the same
            # terms added in another order, a few roundings of the largest
            assert_close_to_scale(
                grad, reference_grad, rounding(torch.float32, 4), "hoisted step sizes' gradient"
            )


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_step_sizes_computed_once_compile_and_train(attn_implementation):
    """The Sudoku preset computes [α | γ] once per forward and passes them to every iteration; the traced iteration
    is reused for all T, so it must get the same inputs each time (an unused input aliasing another once shifted
    them: the wrong tensor arrived as the step sizes)."""
    from energyformers import HyperSetConfig, HyperSetForTokenClassification

    torch._dynamo.reset()
    config = HyperSetConfig.from_preset(
        "sudoku", hidden_size=16, num_attention_heads=2, intermediate_size=64, num_iterations=3
    )
    model = perturb(
        HyperSetForTokenClassification._from_config(config, attn_implementation=attn_implementation)
    )
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 10, (2, 81), generator=generator)
    labels = torch.randint(0, 9, (2, 81), generator=generator)
    compiled = torch.compile(model.eval(), fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids).logits, model(input_ids=ids).logits)
    model.train()
    compiled(input_ids=ids, labels=labels).loss.backward()
    compiled_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model(input_ids=ids, labels=labels).loss.backward()
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(compiled_grads[name], parameter.grad, msg=labelled(name))


def _mim_batch(seed: int) -> dict[str, torch.Tensor]:
    """Codes with [MASK] (= 8) at about half the positions; labels the true codes there, −100 elsewhere."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 8, (2, 16), generator=g)
    masked = torch.rand(2, 16, generator=g) < 0.5
    masked[:, 0] = True
    return {"input_ids": codes.masked_fill(masked, 8), "labels": codes.masked_fill(~masked, -100)}


@pytest.mark.parametrize(
    "model_type",
    [
        "hyperset",
        "looped-transformer",
    ],
)
def test_masked_image_modelling_heads_compile_train_and_export(model_type):
    """Both MIM heads on masked code grids: one graph (fullgraph, aot_eager) forward and training step matching
    eager mode, and `torch.export`; the seeded MaskGIT decoding runs the compiled forward to the same codes."""
    torch._dynamo.reset()
    # one graph needs a fixed training depth: the presets' random depth is drawn on the host (the next test)
    eager, compiled_model = (tiny_mim_model(model_type, iteration_sampling="fixed") for _ in range(2))
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    batch = _mim_batch(0)
    eager.train()(**batch).loss.backward()
    compiled_model.train()
    compiled(**batch).loss.backward()
    for (name, a), b in zip(eager.named_parameters(), compiled_model.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, msg=labelled(name))
    eager.eval(), compiled_model.eval()
    inputs = {"input_ids": _mim_batch(1)["input_ids"]}
    with torch.no_grad():
        torch.testing.assert_close(compiled(**inputs).logits, eager(**inputs).logits)
        program = torch.export.export(eager, (), inputs)
        torch.testing.assert_close(program.module()(**inputs).logits, eager(**inputs).logits)
    # decode calls the model's forward; with the compiled graph as that forward the seeded samples are the same
    reference = eager.decode(inputs["input_ids"], steps=3, seed=0)
    compiled_model.forward = compiled  # the module calls `self(...)`; route it through the compiled graph
    got = type(compiled_model).decode(compiled_model, inputs["input_ids"], steps=3, seed=0)
    assert torch.equal(got.codes, reference.codes), (got.codes, reference.codes)


@pytest.mark.parametrize("model_type", ["hyperset", "looped-transformer"])
def test_random_depth_training_compiles_with_a_graph_break_and_matches_eager(model_type):
    """The `cli-mim` presets draw each training forward's depth on the host (`iteration_sampling="uniform"`): without
    fullgraph the compiled model breaks the graph there, draws the same depths and gives eager's losses and grads."""
    torch._dynamo.reset()
    eager, compiled_model = tiny_mim_model(model_type), tiny_mim_model(model_type)
    assert eager.config.iteration_sampling == "uniform", eager.config.iteration_sampling
    compiled = torch.compile(compiled_model, backend="aot_eager")
    eager.train(), compiled_model.train()
    for step in range(3):
        batch = _mim_batch(step)
        expected, got = eager(**batch).loss, compiled(**batch).loss
        expected.backward(), got.backward()
        torch.testing.assert_close(got, expected, msg=f"step {step}")
    for (name, a), b in zip(eager.named_parameters(), compiled_model.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, msg=labelled(name))
