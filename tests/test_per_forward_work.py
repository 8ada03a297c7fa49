"""Work that depends only on shapes or on the module tree is done once per forward, not at every iteration or step,
with outputs equal bit for bit to the per-call work they replace. Counted, not timed:

* Hyper-SET `sdpa`: the sink key's constant tensors (zero and one columns, the sink rows, the padding mask's sink
  column) are built at the first iteration of a forward and reused; no zero-width `F.pad` copy of q, k, v on CPU.
* iMixer: the residual stream is contiguous from the patch embedding on, so no LayerNorm gets a strided input
  (which it would copy); `is_dispatched` walks F's modules once per solve, not at every fixed-point step.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from fixtures import DispatchedOps, hyperset_config, imixer_config

from energyformers import (
    HyperSetForImageClassification,
    HyperSetForSequenceClassification,
    IMixerForImageClassification,
)
from energyformers.modeling import modeling_hyperset, modeling_imixer

_aten = torch.ops.aten
BATCH = 3


# ------------------------------------------------------------------------------------------- Hyper-SET sdpa


def hyperset_case(input_type: str, num_iterations: int) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = hyperset_config(input_type, num_iterations=num_iterations, attn_implementation="sdpa")
    generator = torch.Generator().manual_seed(1)
    if input_type == "image":
        model = HyperSetForImageClassification(config)
        inputs = {"pixel_values": torch.randn(BATCH, 1, 8, 8, generator=generator)}
    else:  # padded: the masked path, whose SDPA mask has a sink column
        model = HyperSetForSequenceClassification(config)
        mask = torch.ones(BATCH, 7, dtype=torch.long)
        mask[0, 4:] = 0
        inputs = {"input_ids": torch.randint(0, 20, (BATCH, 7), generator=generator), "attention_mask": mask}
    return model.eval(), inputs


def counted_ops(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> Counter:
    with torch.no_grad(), DispatchedOps() as recorded:
        model(**inputs)
    return Counter(str(func.overloadpacket) for func in recorded.funcs)


@pytest.mark.parametrize("input_type", ["image", "sequence"])
def test_hyperset_sdpa_builds_its_constants_once_per_forward_and_pads_nothing_on_cpu(input_type):
    shallow, deep = 2, 6
    counts = {t: counted_ops(*hyperset_case(input_type, t)) for t in (shallow, deep)}
    layers = hyperset_config(input_type).num_hidden_layers
    per_iteration = {
        name: (counts[deep][name] - counts[shallow][name]) / (layers * (deep - shallow))
        for name in ("aten.new_zeros", "aten.new_ones", "aten.cat", "aten.constant_pad_nd")
    }
    # two sink-attention calls per iteration, each concatenating its inputs with the constants: keys (2), queries
    # (1), values (2); and [v, weighted values] once. The constants themselves, and the padding mask, are built at
    # the first iteration only
    expected = {"aten.new_zeros": 0, "aten.new_ones": 0, "aten.cat": 11, "aten.constant_pad_nd": 0}
    assert per_iteration == expected, f"ops added per iteration: {per_iteration}, expected {expected}"


def without_reuse(monkeypatch) -> None:
    """Every constant built at every call, as outside a forward (`sink_constants_scope`)."""
    monkeypatch.setattr(modeling_hyperset, "_reused", lambda key, build: build())


@pytest.mark.parametrize("input_type", ["image", "sequence"])
def test_hyperset_sdpa_outputs_and_gradients_equal_those_of_constants_built_per_call(input_type, monkeypatch):
    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model, inputs = hyperset_case(input_type, 3)
        with torch.no_grad():
            logits = model(**inputs).logits
        model.train()
        model(**inputs, labels=torch.arange(BATCH) % 4).loss.backward()
        return logits, [p.grad for p in model.parameters() if p.grad is not None]

    reused, reused_grads = run()
    without_reuse(monkeypatch)
    built, built_grads = run()
    # the same values enter the same operations: equal, not close
    assert torch.equal(reused, built), f"max difference {(reused - built).abs().max().item()}"
    assert len(reused_grads) == len(built_grads) > 0
    assert all(torch.equal(a, b) for a, b in zip(reused_grads, built_grads)), "gradients differ"


# ---------------------------------------------------------------------------------------------------- iMixer


def imixer_case(**overrides) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = IMixerForImageClassification(imixer_config("image", **overrides))
    pixels = torch.randn(BATCH, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    return model, {"pixel_values": pixels}


@pytest.mark.parametrize("training", [False, True])
def test_imixer_layernorms_read_a_contiguous_stream(training):
    """A strided LayerNorm input is copied by the kernel first: 2 per block and the final norm, forward and
    backward, which one copy after the patch embedding replaces."""
    model, inputs = imixer_case()
    model.train(training)
    strided = []
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    handles = [
        norm.register_forward_pre_hook(
            lambda module, args, name=name: None if args[0].is_contiguous() else strided.append(name)
        )
        for name, norm in model.named_modules()
        if norm in norms
    ]
    with torch.set_grad_enabled(training):
        model(**inputs)
    for handle in handles:
        handle.remove()
    assert len(norms) == 2 * imixer_config("image").num_hidden_layers + 1
    assert strided == [], f"LayerNorms reading a non-contiguous input: {strided} of {len(norms)}"


def test_imixer_logits_do_not_depend_on_the_stream_layout():
    """The same values in a transposed (non-contiguous) layout after the patch embedding give the same logits, bit
    for bit: the copy changes where the values sit, not what is computed."""
    model, inputs = imixer_case()
    model.eval()
    with torch.no_grad():
        contiguous = model(**inputs).logits

        def transposed(module, args, output):  # (B, S, D) values, stored as (B, D, S)
            tokens, *rest = output
            return (tokens.transpose(1, 2).contiguous().transpose(1, 2), *rest)

        handle = model.imixer.embeddings.register_forward_hook(transposed)
        strided = model(**inputs).logits
        handle.remove()
    assert torch.equal(contiguous, strided), f"max difference {(contiguous - strided).abs().max().item()}"


@pytest.mark.parametrize(
    "call",
    [
        pytest.param({}, id="unrolled"),
        pytest.param({"fixed_point_solver": "picard", "fixed_point_tolerance": 1e-30}, id="picard"),
        pytest.param({"fixed_point_gradient": "implicit", "train": True}, id="implicit-backward"),
    ],
)
def test_imixer_walks_for_hooks_once_per_solve_whatever_the_steps(call, monkeypatch):
    """`is_dispatched(fc_sn1)`, `is_dispatched(fc_sn2)`: once per block and forward (backward's adjoint solve
    included), not at every fixed-point step."""
    call = dict(call)
    train = call.pop("train", False)
    walks = Counter()
    walk = modeling_imixer.is_dispatched

    def counted(module):
        walks[steps] += 1
        return walk(module)

    monkeypatch.setattr(modeling_imixer, "is_dispatched", counted)
    for steps in (2, 6):
        model, inputs = imixer_case(fixed_point_iterations=6)
        model.train(train)
        out = model(**inputs, fixed_point_iterations=steps, labels=torch.arange(BATCH) % 4, **call)
        if train:
            out.loss.backward()
    layers = imixer_config("image").num_hidden_layers
    assert walks == {2: 2 * layers, 6: 2 * layers}, f"walks per forward by steps: {dict(walks)}"
