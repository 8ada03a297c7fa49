"""Export for deployment: ONNX graphs run under onnxruntime give eager's logits, and what an export cannot keep says so.

* iMixer's tolerance solvers (`picard`, `anderson`) stop each sample on a host read of its residual in eager mode; an
  exported graph has no data-dependent exit, so it runs every step with the stopped samples frozen, and must give
  the logits of eager's early stop, on the export input and on another batch.
* The legacy exporter (`dynamo=False`) writes a graph onnxruntime loads for iMixer's sequence model, and for its
  tolerance solvers one that runs every step, as torch.export's does.
* Hyper-SET's adaptive halting (`halting_tolerance`) is dropped under torch.export (and so ONNX export): a warning,
  once, says that every iteration runs.

docs/usage.md, "Quantization and ONNX".
"""

from __future__ import annotations

import io
import logging
import warnings

import pytest
import torch
from fixtures import Case, Records, assert_close_to_scale, in_ci, main_output, perturb, rounding
from torch.export import Dim

from energyformers import (
    HyperSetForSequenceClassification,
    IMixerForImageClassification,
    IMixerForSequenceClassification,
)
from energyformers.modeling import modeling_hyperset

try:
    import onnxruntime
    import onnxscript  # noqa: F401  (torch.onnx.export(dynamo=True) needs it)
except ImportError:  # a dev extra (pyproject.toml); only an environment installed before it lacks it
    if in_ci():
        raise
    pytest.skip(
        "onnxruntime / onnxscript are not installed: pip install -e '.[dev]'", allow_module_level=True
    )


class Logits(torch.nn.Module):
    """The model's logits as the graph's one output, from its inputs given by name."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names
        # in eval mode like the model: the legacy exporter restores the wrapper's mode after tracing, recursively,
        # and a wrapper left in training mode would put the model in training mode (iMixer's training forward
        # refines its spectral-norm buffers, and the eager reference would move)
        self.eval()

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs))).logits


def run_onnx(model_bytes: bytes, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    feeds = {arg.name: value.numpy() for arg, value in zip(session.get_inputs(), inputs.values())}
    return torch.from_numpy(session.run(None, feeds)[0])


# One block, at most 5 steps, Anderson over the last 2: at this tolerance eager stops the block after 3 steps
# (both solvers, both batches below), so the graph's last steps must leave every stopped sample as it was.
SOLVE = dict(num_hidden_layers=1, fixed_point_iterations=5, fixed_point_tolerance=0.1, anderson_memory=2)


def solver_case(solver: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The tiny iMixer image model with a tolerance solver, and two batches: the export input and another (other
    size, 4× the scale)."""
    case = Case.of(IMixerForImageClassification)
    model = perturb(case.build(fixed_point_solver=solver, **SOLVE))
    batches = {
        "export input": case.inputs()["pixel_values"],
        "other batch": 4.0 * case.inputs(seed=1)["pixel_values"][:2],
    }
    for name, pixels in batches.items():
        with torch.no_grad():
            steps = model(
                pixel_values=pixels, output_fixed_point_residuals=True
            ).fixed_point_residuals.iterations
        assert int(steps.max()) < SOLVE["fixed_point_iterations"], f"{name}: eager ran {steps.tolist()} steps"
    return model, batches


def export_solver(model: torch.nn.Module, pixels: torch.Tensor) -> torch.export.ExportedProgram:
    # forward(*inputs) takes one tuple argument: its one tensor has a dynamic batch
    shapes = (({0: Dim("batch", min=1, max=16)},),)
    return torch.export.export(Logits(model, ("pixel_values",)), (pixels,), dynamic_shapes=shapes)


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_tolerance_solvers_export_to_onnx_and_match_eager(solver):
    model, batches = solver_case(solver)
    program = export_solver(model, batches["export input"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's own deprecation notes
        model_bytes = torch.onnx.export(program, dynamo=True, verbose=False).model_proto.SerializeToString()
    for name, pixels in batches.items():
        with torch.no_grad():
            expected = main_output(model(pixel_values=pixels))
        # the exported program runs the same operations; the steps eager skipped only select the stopped samples'
        # values: a few roundings
        got = program.module()(pixels)
        assert_close_to_scale(
            got, expected, rounding(torch.float32, 16), f"{solver}, {name}: exported program"
        )
        # the same float32 operations in onnxruntime's kernels and order (Anderson's weights solved in float64 by
        # elimination instead of LAPACK): a few hundred roundings of the largest logit bound the difference
        got = run_onnx(model_bytes, {"pixel_values": pixels})
        assert_close_to_scale(got, expected, rounding(torch.float32, 256), f"{solver}, {name}: onnxruntime")


def legacy_export(model: torch.nn.Module, inputs: dict[str, torch.Tensor], dynamic: dict[int, str]) -> bytes:
    """`model`'s logits from `inputs` through the legacy exporter (`dynamo=False`, the JIT tracer), with the axes
    `dynamic` of every input dynamic."""
    names = tuple(inputs)
    graph = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer notes
        torch.onnx.export(
            Logits(model, names),
            tuple(inputs.values()),
            graph,
            input_names=list(names),
            output_names=["logits"],
            dynamic_axes=dict.fromkeys(names, dynamic),
            dynamo=False,
            opset_version=17,
        )
    return graph.getvalue()


def test_legacy_export_of_the_sequence_model_loads_in_onnxruntime():
    """The slot ranks of the real tokens are a cumulative sum of the padding mask: summed as integers, since ONNX's
    CumSum takes no bool input (onnxruntime refused the graph)."""
    case = Case.of(IMixerForSequenceClassification)
    model = perturb(case.build())
    inputs = case.inputs()
    graph = legacy_export(model, inputs, {0: "batch", 1: "length"})
    with torch.no_grad():
        expected = main_output(model(**inputs))
    got = run_onnx(graph, inputs)
    # the same float32 operations in onnxruntime's kernels and order over 2 blocks: a few hundred roundings of the
    # largest logit bound the difference
    assert_close_to_scale(got, expected, rounding(torch.float32, 256), "legacy export: onnxruntime")


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_tolerance_solvers_export_through_the_legacy_exporter_and_match_eager(solver):
    """The legacy exporter records a graph with the JIT tracer, not torch.export: the solve runs every step there
    too (no step count of the export input baked in), and Anderson solves by elimination (no linear solve in
    ONNX)."""
    model, batches = solver_case(solver)
    # on this input Picard needs a step more than on the export input, so a graph that stopped where the export
    # input did gives other logits (Anderson solves both in 3 steps; its graph had no linear solve to export)
    batches["small input"] = 0.01 * batches["export input"]
    steps = {}
    for name, pixels in batches.items():
        with torch.no_grad():
            out = model(pixel_values=pixels, output_fixed_point_residuals=True)
        steps[name] = int(out.fixed_point_residuals.iterations.max())
    if solver == "picard":
        assert steps["small input"] > steps["export input"], f"eager steps {steps}: the test cannot tell"
    graph = legacy_export(model, {"pixel_values": batches["export input"]}, {0: "batch"})
    for name, pixels in batches.items():
        with torch.no_grad():
            expected = main_output(model(pixel_values=pixels))
        got = run_onnx(graph, {"pixel_values": pixels})
        assert_close_to_scale(
            got,
            expected,
            rounding(torch.float32, 256),
            f"{solver}, {name} ({steps[name]} eager steps): onnxruntime",
        )


def eager_then_export(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor]
) -> tuple[list[str], list[str], torch.export.ExportedProgram]:
    """What Hyper-SET's logger said during one eager no-grad call of `model`, then during `torch.export` of it
    (each list on its own), and the exported program."""
    # transformers' `warning_once` remembers every message it gave for the process (an lru_cache): forgotten here,
    # so the export's warning shows whatever ran before in this process
    logging.Logger.warning_once.cache_clear()
    records = Records()
    modeling_hyperset.logger.addHandler(records)
    try:
        with torch.no_grad():
            model(**inputs)
        eager = list(records.messages)
        program = torch.export.export(model, (), dict(inputs))
    finally:
        modeling_hyperset.logger.removeHandler(records)
    return eager, records.messages[len(eager) :], program


# Each export-warning test runs its check twice in its process: the second run sees its warning too, whatever
# ran before it in the process (this check, a rerun, another order).


def test_exporting_with_adaptive_halting_warns_that_every_iteration_runs():
    for _ in range(2):
        check_adaptive_halting_warning()


def test_exporting_with_the_halting_head_warns_that_every_outer_step_runs():
    """The halting head's early stop (eval, supervision_steps > 1) is a data-dependent exit as halting_tolerance
    is: under torch.export it is dropped with a warning, and the program runs every outer step."""
    for _ in range(2):
        check_halting_head_warning()


def check_adaptive_halting_warning() -> None:
    case = Case.of(HyperSetForSequenceClassification)
    tolerance = 0.3125
    model = perturb(case.build(num_iterations=4, halting_tolerance=tolerance))
    inputs = case.inputs()
    eager_messages, messages, program = eager_then_export(model, inputs)  # eager: halting runs, no warning
    halting = [message for message in messages if "halting_tolerance" in message]
    assert not [m for m in eager_messages if "halting_tolerance" in m], eager_messages
    assert len(halting) == 1, f"expected one warning, got {halting}"
    assert f"halting_tolerance={tolerance}" in halting[0] and "all num_iterations" in halting[0], halting[0]
    # what the warning says: the exported program is the model at its full depth, without halting
    with torch.no_grad():
        full_depth = main_output(
            perturb(case.build(num_iterations=4))(**inputs)
        )  # the same weights, no tolerance
        halted = main_output(model(**inputs))
    exported = main_output(program.module()(**inputs))
    assert not torch.allclose(halted, full_depth), (
        "halting changed nothing: the test cannot tell the two apart"
    )
    assert_close_to_scale(exported, full_depth, rounding(torch.float32, 64), "exported program vs full depth")


def check_halting_head_warning() -> None:
    case = Case.of(HyperSetForSequenceClassification)
    model = perturb(case.build(supervision_steps=3, halting_head=True))
    inputs = case.inputs()
    eager_messages, messages, program = eager_then_export(
        model, inputs
    )  # eager: the head stops samples early
    stop = [message for message in messages if "halting head's early stop" in message]
    assert not [m for m in eager_messages if "halting head's early stop" in m], eager_messages
    assert len(stop) == 1 and "supervision_steps=3" in stop[0], f"expected one warning, got {stop}"
    with torch.no_grad():
        # a threshold no probability exceeds: eager runs all three steps for every sample, as the program does
        every_step = main_output(model(**inputs, halting_threshold=1 - 1e-12))
    exported = main_output(program.module()(**inputs))
    assert_close_to_scale(exported, every_step, rounding(torch.float32, 64), "exported program vs every step")
