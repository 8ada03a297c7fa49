"""Device and dtype mix-ups that only a GPU run would show, caught on CPU.

`device_proxy` stands in for an accelerator (module docstring there says how and what it cannot see): every
family's heads run forward and backward with the model and inputs on the stand-in device, and so do the paths with
tensors of their own (deep supervision, halting, test-time search, MaskGIT's schedule, iMixer's solvers, the looped
baseline). The bfloat16 tests run a bfloat16 model's energy paths, which compute in float32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from device_proxy import (
    DeviceMismatch,
    accelerator,
    module_to_accelerator,
    on_accelerator,
    to_accelerator,
)
from fixtures import ALL, Case, cases, labelled, main_output, rounding

from energyformers.configuration.configuration_looped_transformer import LoopedTransformerConfig
from energyformers.modeling.modeling_hyperset import maskgit_schedule
from energyformers.modeling.modeling_looped_transformer import LoopedTransformerForTokenClassification


def _case(family: str, auto_name: str) -> Case:
    return next(c for c in ALL if c.family == family and c.auto_name == auto_name)


def _run_on_stand_in(model: torch.nn.Module, inputs: dict, train: bool, **call: object) -> object:
    """Forward (and backward of the loss in training) on the stand-in; every tensor output and gradient on it."""
    model.train(train)
    module_to_accelerator(model)
    inputs = to_accelerator(inputs)
    with accelerator():
        outputs = model(**inputs, **call)
        if train:
            loss = outputs.loss if getattr(outputs, "loss", None) is not None else main_output(outputs).mean()
            loss.backward()
            off = [
                n for n, p in model.named_parameters() if p.grad is not None and not on_accelerator(p.grad)
            ]
            assert not off, f"gradients not on the device: {off}"
    off = [k for k, v in outputs.items() if isinstance(v, torch.Tensor) and not on_accelerator(v)]
    assert not off, f"outputs left on the CPU: {off}"
    return outputs


def test_the_stand_in_rejects_what_cuda_rejects() -> None:
    x = to_accelerator(torch.ones(2, 3))
    with accelerator():
        with pytest.raises(DeviceMismatch, match="CPU tensor of shape"):
            x + torch.ones(2, 3)  # a tensor made without device=
        with pytest.raises(DeviceMismatch, match="CPU tensor of shape"):
            x @ torch.ones(3, 2)  # the meta device alone lets this through
        with pytest.raises(DeviceMismatch, match="generator"):
            torch.randn(3, generator=torch.Generator().manual_seed(0), device=x.device)
        with pytest.raises(TypeError, match="numpy"):
            np.asarray(x.detach())
        # what CUDA allows: 0-dim CPU tensors, CPU indices, .cpu(), .item(), device-following factories
        assert on_accelerator(x * torch.tensor(2.0)) and on_accelerator(x[torch.tensor([1])])
        assert on_accelerator(torch.zeros(2, device=x.device)) and on_accelerator(
            torch.tensor([1], device=x.device)
        )
        assert on_accelerator(torch.randn(2, generator=torch.Generator(x.device), device=x.device))
        assert not on_accelerator(x.cpu()) and x.sum().item() == 6.0


def test_in_place_ops_on_lists_of_tensors_write_the_stand_in_tensors() -> None:
    """`torch._foreach_copy_` (iMixer's power iteration writes its u, v buffers with one): its aten op returns
    nothing, which the stand-in must hand back as such, and it writes every destination."""
    targets = [to_accelerator(torch.zeros(2)), to_accelerator(torch.zeros(3))]
    with accelerator():
        sources = [torch.ones(2, device=targets[0].device), torch.full((3,), 2.0, device=targets[0].device)]
        torch._foreach_copy_(targets, sources)
    assert all(on_accelerator(t) for t in targets)
    assert [t.tolist() for t in targets] == [[1.0, 1.0], [2.0, 2.0, 2.0]], targets


@cases(ALL)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_every_head_runs_on_the_stand_in(case: Case, train: bool) -> None:
    _run_on_stand_in(case.build(), case.inputs(labels=not case.is_base), train)


TOKEN = ("hyperset", "AutoModelForTokenClassification")
IMAGE = ("hyperset", "AutoModelForImageClassification")
MIXER = ("imixer", "AutoModelForImageClassification")
VARIANTS = {  # name: (case, config overrides, train, call arguments)
    "deep-supervision-all-linear": (TOKEN, dict(deep_supervision="all", deep_supervision_weights="linear"), True, {}),
    "deep-supervision-random": (TOKEN, dict(deep_supervision="random"), True, {}),
    "random-depth": (IMAGE, dict(iteration_sampling="poisson-lognormal", min_iterations=1, max_iterations=4), True, {}),
    "halting-head-train": (TOKEN, dict(supervision_steps=3, halting_head=True), True, {}),
    "halting-head-eval": (IMAGE, dict(supervision_steps=2, halting_head=True), False, dict(halting_threshold=0.01)),
    "halting-energy": (IMAGE, {}, False, dict(halting_tolerance=1e-3, halting_criterion="energy")),
    "search-energy": (TOKEN, {}, False, dict(search_trajectories=3, search_noise=0.1, search_seed=1)),
    "gated-feedforward": (IMAGE, dict(feedforward_energy="gated", feature_map="silu"), True, {}),
    "imixer-anderson-implicit": (MIXER, dict(fixed_point_solver="anderson", fixed_point_gradient="implicit"), True, {}),
    "imixer-picard-phantom": (MIXER, dict(fixed_point_solver="picard", fixed_point_gradient="phantom"), True, {}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(VARIANTS))
def test_paths_with_tensors_of_their_own_run_on_the_stand_in(name: str) -> None:
    (family, auto_name), overrides, train, call = VARIANTS[name]
    case = _case(family, auto_name)
    _run_on_stand_in(case.build(**overrides), case.inputs(labels=True), train, **call)


def test_looped_baseline_with_outer_steps_runs_on_the_stand_in() -> None:
    case = _case(*TOKEN)
    torch.manual_seed(0)
    config = LoopedTransformerConfig(
        input_type="sequence", hidden_size=16, num_attention_heads=4, intermediate_size=24, num_hidden_layers=1,
        num_iterations=2, vocab_size=20, max_position_embeddings=16, num_labels=4, deep_supervision="all",
        supervision_steps=2, halting_head=True,
    )  # fmt: skip
    _run_on_stand_in(LoopedTransformerForTokenClassification(config), case.inputs(labels=True), train=True)


def test_maskgit_schedule_stays_on_the_counts_device() -> None:
    """MaskGIT decoding's per-step counts: its weights were made on the CPU and multiplied with device counts."""
    counts = to_accelerator(torch.tensor([5, 0, 16]))
    with accelerator():
        schedule = maskgit_schedule(counts, steps=4)
    assert on_accelerator(schedule)
    expected = maskgit_schedule(torch.tensor([5, 0, 16]), steps=4)
    assert torch.equal(schedule.cpu(), expected), f"{schedule.cpu()} != {expected}"


@pytest.mark.parametrize(
    "call",
    [
        dict(output_energies=True),
        dict(halting_tolerance=1e-3, halting_criterion="energy"),
        dict(search_trajectories=2, search_noise=0.1, search_seed=0),
    ],
    ids=["energies", "halting-energy", "search-energy"],
)
@pytest.mark.parametrize("attention_energy", ["bisoftmax", "linear"])
def test_energy_paths_of_a_bfloat16_model(call: dict, attention_energy: str) -> None:
    """The energies are computed in float32 from a bfloat16 model's states: its weights must follow."""
    case = _case(*TOKEN)
    extra = dict(feature_map="elu+1") if attention_energy == "linear" else {}
    model = case.build(attention_energy=attention_energy, **extra).to(torch.bfloat16)
    reference = case.build(attention_energy=attention_energy, **extra)
    reference.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    inputs = case.inputs()
    with torch.no_grad():
        outputs, expected = model(**inputs, **call), reference(**inputs, **call)
    pairs = {  # the float32 energies of each path, bfloat16 model vs its float32 copy
        "energies": lambda o: (o.energies.attention_energy, o.energies.feedforward_energy),
        "search_energies": lambda o: (o.search_energies,),
    }
    compared = [name for name in pairs if getattr(outputs, name, None) is not None]
    for name in compared:
        for got, want in zip(pairs[name](outputs), pairs[name](expected), strict=True):
            assert got.dtype == torch.float32, f"{name}: {got.dtype}"
            # bfloat16 weights and states against float32 ones, energies summed in float32: 4 bfloat16 ulps of the
            # largest energy (the bfloat16 roundings of the states average out in the sums)
            bound = rounding(torch.bfloat16, 4, float(want.abs().max()))
            torch.testing.assert_close(got, want, rtol=0, atol=bound, msg=labelled(name))
    if "halting_criterion" in call:  # the energy decides when to stop: the same iterations as in float32
        compared.append("iterations_used")
        assert torch.equal(outputs.iterations_used, expected.iterations_used), (
            f"{outputs.iterations_used} != {expected.iterations_used}"
        )
    assert compared, f"{call} returned none of the energy outputs: {list(outputs.keys())}"
    assert torch.isfinite(main_output(outputs)).all()
