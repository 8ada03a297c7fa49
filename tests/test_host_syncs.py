"""No host-device synchronisation in the default image paths: every family's image classifier, eval forward and
training step (forward and backward), makes none; Hyper-SET's (and the looped baseline's) deep-supervised training
step and S > 1 supervision steps neither. Found on CPU with `host_syncs.counting_host_syncs` (what it counts and
what it cannot see: its docstring). At these model sizes a GPU step is launch-bound, and one sync stalls the launch
queue until the device has drained it.

Sequence inputs make exactly one per forward, by design: the input check reads the ids' range (and an integer
mask's stray values) in one stacked `.tolist()`, once also over S supervision steps. The halting head's early
stop reads which samples go on once per step boundary, by design.
"""

from __future__ import annotations

import pytest
import torch
from device_proxy import module_to_accelerator, to_accelerator
from fixtures import TINY, Case, looped_transformer_config
from host_syncs import HostSyncs, counting_host_syncs

from energyformers import (
    HyperBFConfig,
    HyperBFForImageClassification,
    HyperBFForSequenceClassification,
    HyperSetConfig,
    HyperSetForImageClassification,
    HyperSetForSequenceClassification,
    IMixerConfig,
    IMixerForImageClassification,
)
from energyformers.configuration.configuration_looped_transformer import LoopedTransformerConfig
from energyformers.modeling.modeling_hyperset import HyperSetForTokenClassification
from energyformers.modeling.modeling_looped_transformer import (
    LoopedTransformerForImageClassification,
    LoopedTransformerForSequenceClassification,
    LoopedTransformerForTokenClassification,
)
from energyformers.training.setup import cli_preset

HYPERSET = Case.of(HyperSetForImageClassification)
CLASSES = {
    "hyperset": (HyperSetForImageClassification, HyperSetConfig),
    "imixer": (IMixerForImageClassification, IMixerConfig),
    "hyperbf": (HyperBFForImageClassification, HyperBFConfig),
    "looped-transformer": (LoopedTransformerForImageClassification, LoopedTransformerConfig),
}
# the tiny image geometry of tests/fixtures.py, given to the CLI presets as the dataset would
GEOMETRY = dict(image_size=8, patch_size=2, num_channels=1, num_labels=4)


def _image_classifier(
    family: str, sizes: str, labels: bool, **overrides: object
) -> tuple[torch.nn.Module, dict]:
    """The model and its inputs. `sizes`: "tiny" (the config's defaults at the fixtures' tiny sizes) or "cli" (what
    `energyformers train` builds: the family's `cli-image` preset, at the tiny image geometry)."""
    model_class, config_class = CLASSES[family]
    inputs = HYPERSET.inputs(labels=labels)  # the looped baseline's, and the geometry of `GEOMETRY`
    torch.manual_seed(0)
    if sizes == "cli":
        config = config_class(**{**cli_preset(family, "image"), **GEOMETRY, **overrides})
    elif family == "looped-transformer":
        config = looped_transformer_config("image", **overrides)
    else:
        config = TINY[family].config("image", **overrides)
        inputs = Case.of(model_class).inputs(labels=labels)
    return model_class(config), inputs


def _syncs(model: torch.nn.Module, inputs: dict, train: bool, **call: object) -> HostSyncs:
    """The syncs of an eval forward without autograd, or of a training forward and the backward of its loss, with
    model and inputs on the stand-in device (moved before counting: that copy is the caller's, once)."""
    model.train(train)
    module_to_accelerator(model)
    inputs = to_accelerator(inputs)
    with counting_host_syncs() as probe:
        if train:
            model(**inputs, **call).loss.backward()
        else:
            with torch.no_grad():
                model(**inputs, **call)
    return probe


def _report(probe: HostSyncs) -> str:
    return f"{len(probe.found)} host syncs:\n  " + "\n  ".join(map(str, probe.found))


# ---------------------------------------------------------------- the detector fires


def test_the_detector_sees_every_kind_of_host_sync_and_nothing_else():
    device_values = to_accelerator(torch.tensor([0.5, -1.0, 2.0]))
    host_values = torch.tensor([1.0, 2.0, 3.0])
    syncing = {
        "item/bool/int/float": [
            lambda x: x.sum().item(),
            lambda x: bool(x[0] > 0),
            lambda x: int(x.argmax()),
            lambda x: float(x.max()),
        ],
        "nonzero": [lambda x: x.nonzero(), lambda x: torch.where(x > 0)],
        "boolean-mask indexing": [lambda x: x[x > 0], lambda x: x.clone().__setitem__(x > 0, x.new_zeros(2))],
        "masked_select": [lambda x: x.masked_select(x > 0)],
        "unique": [lambda x: x.unique()],
        "equal": [lambda x: torch.equal(x, x)],
        "tolist": [lambda x: x.tolist()],
        "host-to-device copy (torch.tensor(data, device=))": [
            lambda x: torch.tensor([1.0, 2.0], device=x.device),
            lambda x: torch.as_tensor([1.0, 2.0], device=x.device),
        ],
        "host-to-device copy": [lambda x: host_values.to(x.device), lambda x: x.clone().copy_(host_values)],
        "host-to-device copy (CPU index)": [lambda x: x[torch.tensor([0, 2])]],
        "device-to-host copy": [lambda x: x.cpu()],
    }
    for kind, calls in syncing.items():
        for index, call in enumerate(calls):
            with counting_host_syncs() as probe:
                call(device_values)
            assert [sync.kind for sync in probe.found] == [kind], f"{kind} #{index}: {_report(probe)}"
    quiet = [  # what CUDA runs without waiting
        lambda x: x * torch.tensor(2.0),  # a 0-dim CPU tensor: a kernel argument
        lambda x: x * 0.5 + x.sum(),
        lambda x: torch.zeros(3, device=x.device) + torch.full((), 2.0, device=x.device),
        lambda x: x[to_accelerator(torch.tensor([0, 2]))],  # device indices
        lambda x: torch.where(x > 0, x, 0.0),
        lambda x: x.nonzero_static(size=3),
    ]
    for index, call in enumerate(quiet):
        with counting_host_syncs() as probe:
            call(device_values)
        assert not probe.found, f"quiet #{index}: {_report(probe)}"


def test_the_detector_sees_hyperset_halting_read_the_device():
    # adaptive halting decides on the host which samples go on: a read per iteration, by design
    model, inputs = _image_classifier("hyperset", "tiny", labels=False)
    with torch.no_grad():  # the state moves: no sample halts at the first iteration
        model.hyperset.step_sizes.proj.bias.fill_(0.5)
    probe = _syncs(model, inputs, train=False, halting_tolerance=1e-30)
    # which samples go on: one boolean mask per iteration of each layer (none halts at this tolerance)
    config = model.config
    assert len(probe.found) == config.num_hidden_layers * config.num_iterations, _report(probe)
    assert all(
        sync.kind == "boolean-mask indexing" and "_iterate_until_halted" in sync.where for sync in probe.found
    ), _report(probe)


# ---------------------------------------------------------------- the default paths make none


@pytest.mark.parametrize("sizes", ["tiny", "cli"])
@pytest.mark.parametrize("family", list(CLASSES))
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_an_image_classifier_makes_no_host_sync(family, sizes, train):
    model, inputs = _image_classifier(family, sizes, labels=train)
    probe = _syncs(model, inputs, train=train)
    assert not probe.found, _report(probe)
    if train:  # the probe saw the backward too (autograd runs it with the same dispatch modes)
        assert any("backward" in op for op in probe.ops), sorted(set(probe.ops))


@pytest.mark.parametrize(
    "supervision",
    [
        {"deep_supervision": "all", "deep_supervision_weights": "linear"},
        {"deep_supervision": "every", "deep_supervision_interval": 2},
        {"deep_supervision": "random", "deep_supervision_samples": 2},
    ],
    ids=lambda supervision: supervision["deep_supervision"],
)
@pytest.mark.parametrize("steps", [1, 2], ids=["S1", "S2"])
@pytest.mark.parametrize("family", ["hyperset", "looped-transformer"])
def test_a_deep_supervised_training_step_makes_no_host_sync(family, supervision, steps):
    # the loss weights are Python numbers: a weight tensor would be copied to the device at every step
    model, inputs = _image_classifier(family, "cli", labels=True, supervision_steps=steps, **supervision)
    probe = _syncs(model, inputs, train=True)
    assert not probe.found, _report(probe)


@pytest.mark.parametrize("sizes", ["tiny", "cli"])
@pytest.mark.parametrize("family", ["hyperset", "looped-transformer"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_supervision_steps_make_no_host_sync(family, sizes, train):
    # the step counts and the carry stay on the device; eval runs all S·T iterations
    model, inputs = _image_classifier(family, sizes, labels=train, supervision_steps=3)
    probe = _syncs(model, inputs, train=train)
    assert not probe.found, _report(probe)


@pytest.mark.parametrize("family", ["hyperset", "looped-transformer"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_the_halting_head_reads_the_device_once_per_step_boundary_in_eval(family, train):
    steps = 3
    model, inputs = _image_classifier(
        family, "tiny", labels=train, supervision_steps=steps, halting_head=True
    )
    probe = _syncs(model, inputs, train=train)
    # eval: which samples go on sets the next step's batch size, one read after each step but the last (by
    # design); training runs every sample through all S steps
    expected = 0 if train else steps - 1
    assert len(probe.found) == expected, _report(probe)
    assert all(
        sync.kind == "nonzero" and "classify_with_deep_supervision" in sync.where for sync in probe.found
    ), _report(probe)


# ---------------------------------------------------------------- sequence inputs: the one input-check read


# the looped baseline's sequence heads, and the Hyper-SET head whose inputs (and tiny geometry) they share
LOOPED_SEQUENCE = {
    LoopedTransformerForSequenceClassification: HyperSetForSequenceClassification,
    LoopedTransformerForTokenClassification: HyperSetForTokenClassification,
}


def _sequence_classifier(model_class: type, **overrides: object) -> tuple[torch.nn.Module, Case]:
    """The tiny model (the config's defaults) and the case whose inputs it takes."""
    if model_class in LOOPED_SEQUENCE:
        torch.manual_seed(0)
        model = model_class(looped_transformer_config("sequence", **overrides))
        return model, Case.of(LOOPED_SEQUENCE[model_class])
    case = Case.of(model_class)
    return case.build(**overrides), case


def _assert_input_check_reads(probe: HostSyncs, reads: int = 1) -> None:
    assert len(probe.found) == reads, _report(probe)
    assert all(f.kind == "tolist" and "_check_token_ids" in f.where for f in probe.found), _report(probe)


@pytest.mark.parametrize(
    "model_class",
    [
        HyperSetForSequenceClassification,
        HyperSetForTokenClassification,
        HyperBFForSequenceClassification,
        *LOOPED_SEQUENCE,
    ],
    ids=lambda model_class: model_class.__name__,
)
@pytest.mark.parametrize("mask", ["integer", "float", None], ids=["mask", "float-mask", "no-mask"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_sequence_classifier_reads_the_device_once_in_its_input_check(model_class, mask, train):
    # a float 0/1 mask's values are read in the same read as an integer mask's, with the ids' range
    model, case = _sequence_classifier(model_class)
    inputs = case.inputs(labels=train)  # padding in the first row
    if mask is None:
        del inputs["attention_mask"]
    elif mask == "float":
        inputs["attention_mask"] = inputs["attention_mask"].float()
    _assert_input_check_reads(_syncs(model, inputs, train=train))


@pytest.mark.parametrize(
    "model_class",
    [HyperSetForSequenceClassification, HyperBFForSequenceClassification, *LOOPED_SEQUENCE],
    ids=lambda model_class: model_class.__name__,
)
@pytest.mark.parametrize("dtype", [torch.long, torch.float32], ids=str)
def test_a_mask_beside_inputs_embeds_is_read_only_when_float(model_class, dtype):
    # no ids, so no read to share: an integer mask's dtype is its only check on an accelerator, while a float
    # mask's values are read once, since an additive one would be misread
    model, case = _sequence_classifier(model_class)
    inputs = case.inputs()
    inputs["inputs_embeds"] = model.get_input_embeddings()(inputs.pop("input_ids")).detach()
    inputs["attention_mask"] = inputs["attention_mask"].to(dtype)
    probe = _syncs(model, inputs, train=False)
    expected = 1 if dtype.is_floating_point else 0
    assert len(probe.found) == expected, _report(probe)
    assert all("check_keep_mask" in sync.where for sync in probe.found), _report(probe)


@pytest.mark.parametrize(
    "model_class",
    [HyperSetForSequenceClassification, HyperSetForTokenClassification, *LOOPED_SEQUENCE],
    ids=lambda model_class: model_class.__name__,
)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_supervision_steps_check_the_token_ids_once_per_step(model_class, train):
    # each step is a backbone call that checks its ids: one read per step, by design (no per-call state to skip it)
    model, case = _sequence_classifier(model_class, supervision_steps=3)
    _assert_input_check_reads(_syncs(model, case.inputs(labels=train), train=train), reads=3)
