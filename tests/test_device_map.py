"""Big-model inference: `from_pretrained(folder, device_map=..., offload_folder=...)` with cpu/disk offload, and
transformers' `device_map="auto"` split over several accelerators, give the logits of the model loaded whole, for
every family's image and sequence head and the looped baseline.

Offload maps: every module that holds tensors on "disk" as its own entry (each parameter is loaded only inside its
owner's forward), and the layers on "disk" with the rest on "cpu". Splits run on CPU stand-ins of 2 and 4
accelerators under accelerate's own hooks (`tests/device_proxy.py`). A dispatched model takes the hook-safe path
(docs/usage.md, "Large-model inference"); an undispatched one runs the same ops as before
(`test_undispatched_model_runs_the_fast_path`). Beyond the logits: Hyper-SET's energies, the masked-image-modelling
heads' MaskGIT decoding, HyperBF's centers cache, and the image-classification and masked-image-modelling pipelines
loaded with a `device_map`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from device_proxy import Accelerated, accelerator, place
from fixtures import (
    BASELINE_TINY,
    Case,
    DispatchedOps,
    assert_close_to_scale,
    main_output,
    perturb,
    rounding,
)
from torch import nn

from energyformers import BASELINES, FAMILIES

pytest.importorskip("accelerate")

IMPLEMENTATIONS = ("eager", "sdpa")


@dataclasses.dataclass(frozen=True)
class Subject:
    """A tiny head to load with a device map: its name, auto class, config factory and inputs."""

    name: str
    auto_name: str
    model_class: type
    config: Callable[..., transformers.PretrainedConfig]
    inputs: Callable[[], dict[str, torch.Tensor]]

    def build(self, **overrides: object) -> nn.Module:
        torch.manual_seed(0)
        # perturbed: zero-initialised step sizes and classifiers would hide a wrong or skipped read
        return perturb(self.model_class(self.config(**overrides))).eval()

    def __str__(self) -> str:
        return self.name


def subjects() -> list[Subject]:
    found = []
    heads = [(family, spec.heads) for family, spec in FAMILIES.items()]
    heads += [(name, spec.heads) for name, spec in BASELINES.items()]
    for family, family_heads in heads:
        for auto_name, input_type in (
            ("AutoModelForImageClassification", "image"),
            ("AutoModelForSequenceClassification", "sequence"),
        ):
            cls = family_heads[auto_name]
            # the baseline shares the tiny inputs of the family it is measured against
            case = Case("hyperset" if family in BASELINES else family, auto_name, input_type)
            tiny = BASELINE_TINY[family] if family in BASELINES else case.tiny
            found.append(
                Subject(
                    f"{cls.__name__}-{input_type}",
                    auto_name,
                    cls,
                    lambda it=input_type, tiny=tiny, **o: tiny.config(it, **o),
                    case.inputs,
                )
            )
    return found


SUBJECTS = subjects()


def holders(model: nn.Module) -> list[str]:
    """The names of the modules that hold a parameter or buffer of their own."""
    return [
        name
        for name, module in model.named_modules()
        if next(module.parameters(recurse=False), None) is not None
        or next(module.buffers(recurse=False), None) is not None
    ]


def leaf_disk(model: nn.Module) -> dict[str, str]:
    """Every tensor-holding module on "disk" as its own entry: each parameter is loaded only inside its owner."""
    return dict.fromkeys(holders(model), "disk")


def layers_disk(model: nn.Module) -> dict[str, str]:
    """The layers on "disk" (each loads whole), every other tensor-holding module on "cpu"."""
    base = getattr(model, model.base_model_prefix, model)  # a head's backbone, or the base model itself
    prefix = f"{model.base_model_prefix}.layers" if base is not model else "layers"
    device_map = {f"{prefix}.{i}": "disk" for i in range(len(base.layers))}
    device_map.update({name: "cpu" for name in holders(model) if not name.startswith(prefix)})
    return device_map


MAPS = {"leaf-disk": leaf_disk, "layers-disk": layers_disk}


def load_dispatched(
    subject: Subject, model: nn.Module, folder: Path, device_map: dict[str, str], implementation: str
) -> nn.Module:
    auto_class = getattr(transformers, subject.auto_name)
    loaded = auto_class.from_pretrained(
        folder,
        device_map=device_map,
        offload_folder=folder / "offload",
        attn_implementation=implementation,
    ).eval()
    assert loaded.hf_device_map == device_map
    return loaded


def implementations(model: nn.Module) -> list[str]:
    return [name for name in IMPLEMENTATIONS if name in type(model).attn_implementations]


def check_offloaded_logits(subject: Subject, tmp_path: Path, **overrides: object) -> None:
    model = subject.build(**overrides)
    model.save_pretrained(tmp_path)
    inputs = subject.inputs()
    for implementation in implementations(model):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            expected = main_output(model(**inputs))
        for map_name, make_map in MAPS.items():
            loaded = load_dispatched(subject, model, tmp_path, make_map(model), implementation)
            with torch.no_grad():
                got = main_output(loaded(**inputs))
            what = f"{subject} {implementation} {map_name}"
            if subject.name.startswith("HyperBF") and implementation != "eager":
                # a hooked `values` takes the explicit RBF feedforward, the undispatched model the folded one (one
                # sdpa call): the same softmax over K centers, its logits summed in another order, a dot product of
                # the folded width w = hidden + 2 per layer, each rounding relative to the logits' size (≤ 1 here:
                # the scale of assert_close_to_scale)
                width, layers = model.config.hidden_size + 2, model.config.num_hidden_layers
                assert_close_to_scale(got, expected, rounding(torch.float32, width * layers), what)
                continue
            # the same arithmetic in the same order: the hook-safe path reads W through the module (x·I is exact in
            # float32) and recomputes per layer what the fast path computes once, so equality is exact
            delta = (got - expected).abs().max().item()
            assert torch.equal(got, expected), f"{what}: max |Δ| = {delta:.3g}"


@pytest.mark.parametrize("subject", SUBJECTS, ids=str)
def test_offloaded_model_gives_the_logits_of_the_whole_model(subject: Subject, tmp_path: Path) -> None:
    check_offloaded_logits(subject, tmp_path)


@pytest.mark.parametrize(
    "subject", [s for s in SUBJECTS if s.name.startswith(("HyperSet", "Looped"))], ids=str
)
def test_offloaded_supervision_steps(subject: Subject, tmp_path: Path) -> None:
    """Outer supervision steps count the steps each sample ran on a device of the inputs, not the classifier's."""
    check_offloaded_logits(subject, tmp_path, supervision_steps=2)


@pytest.mark.parametrize(
    "overrides",
    [dict(step_size_condition="input"), dict(iteration_conditioning="sinusoidal")],
    ids=["constant-step-sizes", "sinusoidal-conditions"],
)
def test_offloaded_hyperset_step_size_variants(overrides: dict, tmp_path: Path) -> None:
    """Step sizes computed once per forward (conditioned on the input, one condition) and per-iteration conditions
    from the time MLP: both read the step-size network's parameters through its own calls."""
    subject = next(s for s in SUBJECTS if s.name.startswith("HyperSetForImageClassification"))
    check_offloaded_logits(subject, tmp_path, **overrides)


@pytest.mark.parametrize(
    "call",
    [
        dict(output_final_energy=True),
        dict(halting_tolerance=1e-3, halting_criterion="energy"),
        dict(output_energies=True),
    ],
    ids=["final-energy", "energy-halting", "energy-traces"],
)
def test_offloaded_hyperset_energies(call: dict, tmp_path: Path) -> None:
    """The energies are computed outside the layers' forwards (by the model, between iterations): on the hook-safe
    path W and D come from calls of their hooked Linears on the state's device, so they equal the whole model's,
    the per-iteration traces of `output_energies` (E_ATTN, E_FF, effective rank, mean angle) included."""
    case = Case("hyperset", "AutoModel", "image")
    model = perturb(case.build())
    model.save_pretrained(tmp_path)
    inputs = case.inputs()
    with torch.no_grad():
        expected = model(**inputs, **call)
    loaded = transformers.AutoModel.from_pretrained(
        tmp_path, device_map=leaf_disk(model), offload_folder=tmp_path / "offload"
    ).eval()
    with torch.no_grad():
        got = loaded(**inputs, **call)
    fields = [
        (name, getattr(got, name), getattr(expected, name)) for name in ("last_hidden_state", "final_energy")
    ]
    fields.append(("iterations_used", got.iterations_used, expected.iterations_used))
    if expected.energies is not None:
        fields += [(name, got.energies[name], value) for name, value in expected.energies.items()]
    for name, got_value, expected_value in fields:
        if expected_value is None:
            continue
        delta = (got_value.double() - expected_value.double()).abs().max().item()
        assert torch.equal(got_value, expected_value), f"{name}: max |Δ| = {delta:.3g}"


@pytest.mark.parametrize(
    "subject", [s for s in SUBJECTS if s.auto_name == "AutoModelForImageClassification"], ids=str
)
def test_undispatched_model_runs_the_fast_path(subject: Subject) -> None:
    """The path is chosen per call by `is_dispatched` (accelerate's `_hf_hook` on a module): with do-nothing hooks
    on every tensor-holding module a family whose fast path reads parameters outside their owners runs other ops
    (the hook-safe path) and gives the same logits; once the hooks are removed it runs exactly the ops it ran
    before they were attached."""
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_submodules

    model = subject.build()
    inputs = subject.inputs()
    for implementation in implementations(model):
        model.set_attn_implementation(implementation)
        runs = {}
        for stage in ("before", "hooked", "after"):
            if stage == "hooked":
                for name in holders(model):
                    add_hook_to_module(model.get_submodule(name), ModelHook())
            if stage == "after":
                remove_hook_from_submodules(model)
            with torch.no_grad(), DispatchedOps() as ops:
                logits = model(**inputs).logits
            runs[stage] = (ops.ops, logits)
        what = f"{subject} {implementation}"
        assert runs["after"][0] == runs["before"][0], (
            f"{what}: the fast path's ops changed after the hooks left"
        )
        assert torch.equal(runs["after"][1], runs["before"][1]), what
        # the baseline, and HyperBF's eager (explicit) feedforward, read every parameter inside its owner: one path
        if subject.name.startswith("Looped") or (
            subject.name.startswith("HyperBF") and implementation == "eager"
        ):
            assert runs["hooked"][0] == runs["before"][0], f"{what}: no hook-safe path expected"
            continue
        assert runs["hooked"][0] != runs["before"][0], f"{what}: hooked, the model still ran the fast path"
        if subject.name.startswith("HyperBF") and implementation != "eager":
            continue  # explicit vs folded feedforward: test_offloaded_model_gives_the_logits_of_the_whole_model
        delta = (runs["hooked"][1] - runs["before"][1]).abs().max().item()
        assert torch.equal(runs["hooked"][1], runs["before"][1]), f"{what}: max |Δ| = {delta:.3g}"


def auto_map(model: nn.Module, devices: int) -> dict[str, int]:
    """transformers' own `device_map="auto"` for `devices` GPUs of equal memory (what `from_pretrained` computes:
    the balanced per-device budget, then `infer_auto_device_map` with the model's `_no_split_modules`)."""
    from transformers.integrations.accelerate import get_balanced_memory, infer_auto_device_map

    budget = {**dict.fromkeys(range(devices), 10**9), "cpu": 10**10}
    balanced = get_balanced_memory(model, max_memory=budget, no_split_module_classes=model._no_split_modules)
    return dict(
        infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=model._no_split_modules)
    )


@pytest.mark.filterwarnings("ignore:Device .* is not available")
@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("subject", SUBJECTS, ids=str)
def test_split_over_devices_gives_the_logits_of_the_whole_model(subject: Subject, devices: int) -> None:
    """`device_map="auto"` over 2 and 4 accelerators (`tests/device_proxy.py`: stand-ins under accelerate's own
    hooks) runs without a device mix and returns the logits on the inputs' device. Eager attention: a tensor
    subclass takes torch's math sdpa, another kernel than the CPU model's, so only eager compares bit for bit."""
    model = subject.build()
    model.set_attn_implementation("eager")
    inputs = subject.inputs()
    with torch.no_grad():
        expected = main_output(model(**inputs))
    device_map = auto_map(model, devices)
    with accelerator():
        place(model, device_map)
        if "" in device_map:  # all on one device: no hooks, the caller moves the inputs (as for one GPU)
            inputs = {name: value.to(f"meta:{device_map['']}") for name, value in inputs.items()}
        with torch.no_grad():
            got = main_output(model(**inputs))
    # the root hook returns the outputs on the inputs' device (`io_same_device`)
    first = next(iter(inputs.values()))
    assert got.device == first.device, (
        f"{subject} over {device_map}: logits on {got.device}, inputs on {first.device}"
    )
    got = got.elem if isinstance(got, Accelerated) else got
    delta = (got - expected).abs().max().item()
    assert torch.equal(got, expected), f"{subject} over {device_map}: max |Δ| = {delta:.3g}"


def first_device_budgets(model: nn.Module, step: int = 16) -> dict[int, dict[str, int]]:
    """transformers' map over 2 devices for every budget of the first device from 0 to the model's size in `step`
    bytes (the second holds the rest): {budget: map}, which moves the device boundary through every module."""
    from accelerate.utils import compute_module_sizes
    from transformers.integrations.accelerate import infer_auto_device_map

    total = compute_module_sizes(model)[""]
    return {
        budget: dict(
            infer_auto_device_map(
                model,
                max_memory={0: budget, 1: 10 * total, "cpu": 10 * total},
                no_split_module_classes=model._no_split_modules,
            )
        )
        for budget in range(0, total + step, step)
    }


@pytest.mark.filterwarnings("ignore:Device .* is not available")
@pytest.mark.parametrize(
    ("subject", "overrides"),
    [
        (next(s for s in SUBJECTS if s.name == "HyperSetForImageClassification-image"), {}),
        (next(s for s in SUBJECTS if s.name == "HyperSetForSequenceClassification-sequence"), {}),
        (
            next(s for s in SUBJECTS if s.name == "HyperSetForImageClassification-image"),
            dict(iteration_conditioning="sinusoidal"),
        ),
    ],
    ids=["image", "sequence", "image-sinusoidal"],
)
def test_split_keeps_the_hyperset_step_size_network_on_one_device(subject: Subject, overrides: dict) -> None:
    """`HyperSetStepSizes` is one `_no_split_modules` block: wherever the device boundary falls between the
    embeddings and the layers, the network lands whole on one device. Split, its condition (the `condition`
    parameter, or the time MLP) would sit on one device and its norm and projection on the next, and its forward,
    which adds the condition to the normalised state, would mix devices; each map that keeps it whole gives the
    whole model's logits."""
    model = subject.build(**overrides)
    model.set_attn_implementation("eager")  # the stand-ins' math sdpa is another kernel (see the split test)
    inputs = subject.inputs()
    with torch.no_grad():
        expected = main_output(model(**inputs))
    straddling = [
        device_map
        for device_map in first_device_budgets(model).values()
        if device_map.get("hyperset.embeddings") == 0
        and device_map.get("hyperset.layers.0", device_map.get("hyperset.layers")) == 1
    ]
    assert straddling, "no budget puts the embeddings and the layers on two devices"
    maps = {tuple(sorted(device_map.items())) for device_map in straddling}
    for device_map in map(dict, sorted(maps)):
        parts = [name for name in device_map if name.startswith("hyperset.step_sizes.")]
        assert not parts, f"{subject}: the step-size network split over {device_map}"
        placed = subject.build(**overrides)  # `place` moves a model's tensors for good: one model per map
        placed.set_attn_implementation("eager")
        with accelerator():
            place(placed, device_map)
            with torch.no_grad():
                got = main_output(placed(**inputs))
        got = got.elem if isinstance(got, Accelerated) else got
        delta = (got - expected).abs().max().item()
        assert torch.equal(got, expected), f"{subject} over {device_map}: max |Δ| = {delta:.3g}"


MIM_HEADS = {
    "hyperset": (
        FAMILIES["hyperset"].heads["AutoModelForMaskedImageModeling"],
        Case("hyperset", "AutoModel", "sequence"),
    ),
    "looped-transformer": (
        BASELINES["looped-transformer"].heads["AutoModelForMaskedImageModeling"],
        Case("hyperset", "AutoModel", "sequence"),
    ),
}


@pytest.mark.parametrize("family", MIM_HEADS)
def test_offloaded_mim_head_predicts_and_decodes_as_the_whole_model(family: str, tmp_path: Path) -> None:
    """MaskGIT decoding of a dispatched head runs on the ids' device (its code head is on meta between calls): the
    same seed gives the whole model's logits and codes."""
    model_class, case = MIM_HEADS[family]
    tiny = BASELINE_TINY[family] if family in BASELINES else case.tiny
    torch.manual_seed(0)
    model = perturb(model_class(tiny.config("sequence"))).eval()
    model.save_pretrained(tmp_path)
    input_ids = case.inputs()["input_ids"].clamp_max(model.mask_token_id - 1)
    input_ids[:, ::2] = model.mask_token_id
    with torch.no_grad():
        expected = model(input_ids=input_ids).logits
    decoded = model.decode(input_ids, steps=3, seed=0)
    loaded = transformers.AutoModelForMaskedImageModeling.from_pretrained(
        tmp_path, device_map=leaf_disk(model), offload_folder=tmp_path / "offload"
    ).eval()
    assert (
        loaded.code_head.weight.device.type == "meta"
    )  # offloaded: what the old decoding read its device from
    with torch.no_grad():
        got = loaded(input_ids=input_ids).logits
    delta = (got - expected).abs().max().item()
    assert torch.equal(got, expected), f"{family}: max |Δ| = {delta:.3g}"
    again = loaded.decode(input_ids, steps=3, seed=0)
    assert again.codes.device == input_ids.device
    for name in ("sequences", "unmasked", "confidences"):
        assert torch.equal(getattr(again, name), getattr(decoded, name)), (
            f"{family} {name}: {getattr(again, name)} vs {getattr(decoded, name)}"
        )


class CopyingStore:
    """An offload store whose every read is a fresh copy kept alive, as a load onto an accelerator gives a new
    allocation at every call whose address no one promises to reuse (on CPU a disk-offloaded parameter is a view of
    the store's memory map, whose address stays put)."""

    def __init__(self, store: object) -> None:
        self.store, self.copies = store, []

    def __getitem__(self, name: str) -> torch.Tensor:
        self.copies.append(self.store[name].clone())
        return self.copies[-1]

    def __contains__(self, name: str) -> bool:
        return name in self.store


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("map_name", MAPS)
def test_offloaded_hyperbf_reuses_its_centers_in_a_scope(
    implementation: str, map_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside `centers_scope` (`cached_centers`) a dispatched HyperBF computes its projected centers once per layer
    for all forwards, as the whole model does, wherever each call's copy of an offloaded parameter lands: such a
    copy cannot change (between calls the parameter is on meta), so its storage does not stamp the cache."""
    from accelerate.hooks import AlignDevicesHook

    from energyformers.modeling.modeling_hyperbf import HyperBFFeedForward
    from energyformers.pipelines import centers_scope

    subject = next(s for s in SUBJECTS if s.name == "HyperBFForImageClassification-image")
    model = subject.build()
    model.save_pretrained(tmp_path)
    inputs = subject.inputs()
    loaded = load_dispatched(subject, model, tmp_path, MAPS[map_name](model), implementation)
    with torch.no_grad():
        expected = loaded(**inputs).logits
    for module in loaded.modules():
        hook = getattr(module, "_hf_hook", None)
        for one in getattr(hook, "hooks", (hook,)):
            if isinstance(one, AlignDevicesHook) and one.offload:
                one.weights_map = CopyingStore(one.weights_map)
    computed = []
    projected_centers = HyperBFFeedForward._projected_centers

    def counted(self: HyperBFFeedForward) -> tuple[torch.Tensor, torch.Tensor]:
        computed.append(self)
        return projected_centers(self)

    monkeypatch.setattr(HyperBFFeedForward, "_projected_centers", counted)
    forwards = 3
    with torch.no_grad(), centers_scope(loaded):
        outputs = [loaded(**inputs).logits for _ in range(forwards)]
    layers = model.config.num_hidden_layers
    assert len(computed) == layers, (
        f"{implementation} {map_name}: projected centers computed {len(computed)} times in {forwards} forwards "
        f"of {layers} layers (once per layer expected)"
    )
    for got in outputs:
        delta = (got - expected).abs().max().item()
        assert torch.equal(got, expected), f"{implementation} {map_name}: max |Δ| = {delta:.3g}"


def cpu_first(model: nn.Module) -> dict[str, str]:
    """`leaf_disk` with the first module on "cpu": a pipeline takes the first device of the map as its own (and
    "disk" is no torch device), as for every transformers pipeline."""
    device_map = leaf_disk(model)
    # one without tensor-holding submodules or ancestors: a module on "cpu" places its submodules' tensors too, and
    # one under a "disk" module is placed by that module's hook; not the code head, whose offload is tested
    first = next(
        name
        for name in device_map
        if name != "code_head"
        and not any(other.startswith(f"{name}.") or name.startswith(f"{other}.") for other in device_map)
    )
    return {first: "cpu", **{name: device for name, device in device_map.items() if name != first}}


def image_classifiers() -> dict[str, Callable[[], nn.Module]]:
    from fixtures import hyperbf_config, hyperset_config, imixer_config

    return {
        "hyperset": lambda: FAMILIES["hyperset"].heads["AutoModelForImageClassification"](
            hyperset_config("image", num_channels=3)
        ),
        "hyperbf": lambda: FAMILIES["hyperbf"].heads["AutoModelForImageClassification"](
            hyperbf_config("image")
        ),
        "imixer": lambda: FAMILIES["imixer"].heads["AutoModelForImageClassification"](
            imixer_config("image", num_channels=3)
        ),
    }


@pytest.mark.parametrize("family", ["hyperset", "hyperbf", "imixer"])
def test_image_pipeline_on_a_dispatched_model(family: str, tmp_path: Path) -> None:
    """`pipeline(task, model=folder, device_map=...)`: transformers loads the model dispatched; our pipeline's call
    runs inside `centers_scope` (HyperBF's centers cache) and gives the scores of the model loaded whole from the
    same folder, depth arguments included."""
    import numpy as np
    from PIL import Image

    from energyformers.pipelines import ImageClassificationPipeline
    from energyformers.training.processing import build_image_processor

    torch.manual_seed(0)
    model = perturb(image_classifiers()[family](), seed=2).eval()
    model.save_pretrained(tmp_path)
    build_image_processor(model.config).save_pretrained(tmp_path)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)) for _ in range(3)]
    depth = {"hyperset": dict(num_iterations=3), "imixer": dict(fixed_point_iterations=3)}.get(family, {})
    whole = transformers.pipeline(
        "image-classification", model=str(tmp_path), pipeline_class=ImageClassificationPipeline
    )
    dispatched = transformers.pipeline(
        "image-classification",
        model=str(tmp_path),
        device_map=cpu_first(model),
        model_kwargs=dict(offload_folder=str(tmp_path / "offload")),
        pipeline_class=ImageClassificationPipeline,
    )
    assert dispatched.model.hf_device_map == cpu_first(model)
    expected, got = whole(images, top_k=None, **depth), dispatched(images, top_k=None, **depth)
    if family == "hyperbf":  # the explicit feedforward against the folded one (sdpa): to rounding, as above
        width, layers = model.config.hidden_size + 2, model.config.num_hidden_layers
        for got_scores, expected_scores in zip(got, expected):
            scores = {entry["label"]: entry["score"] for entry in expected_scores}
            # probabilities ≤ 1 through a softmax of logits within that bound
            bound = rounding(torch.float32, width * layers)
            assert all(abs(entry["score"] - scores[entry["label"]]) <= bound for entry in got_scores), (
                got_scores,
                expected_scores,
            )
        return
    assert got == expected


def test_mim_pipeline_on_a_dispatched_model(tmp_path: Path) -> None:
    """`pipeline("masked-image-modeling", model=folder, device_map=...)`: the pipeline leaves the device to the map
    (transformers refuses one for a dispatched model) and decodes with the code head offloaded, giving the codes and
    reconstruction of the model loaded whole."""
    from energyformers import HyperSetConfig
    from energyformers.mim import PatchKMeansTokenizer

    generator = torch.Generator().manual_seed(0)
    # 8 codes of 2 × 2 one-channel patches drawn at random (no k-means fit: the codebook's quality is not tested)
    tokenizer = PatchKMeansTokenizer(torch.rand(8, 4, generator=generator), 2, (8, 8), 1)
    config = HyperSetConfig.from_preset(
        "mim-1-12-d",
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        time_embedding_dim=16,
        num_iterations=2,
        vocab_size=tokenizer.codebook_size + 1,
        max_position_embeddings=16,  # the 4 × 4 grid
    )
    torch.manual_seed(0)
    model = perturb(FAMILIES["hyperset"].heads["AutoModelForMaskedImageModeling"](config)).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    image = torch.rand(8, 8, generator=generator).numpy()
    expected = transformers.pipeline("masked-image-modeling", model=str(tmp_path))(image, steps=3, seed=1)
    dispatched = transformers.pipeline(
        "masked-image-modeling",
        model=str(tmp_path),
        device_map=cpu_first(model),
        model_kwargs=dict(offload_folder=str(tmp_path / "offload")),
    )
    assert dispatched.model.code_head.weight.device.type == "meta"
    got = dispatched(image, steps=3, seed=1)
    for name in ("codes", "input_codes", "pixel_values"):
        assert torch.equal(got[name], expected[name]), f"{name}: {got[name]} vs {expected[name]}"
    assert got["psnr"] == expected["psnr"], (got["psnr"], expected["psnr"])


@pytest.mark.filterwarnings("ignore:Device .* is not available")
def test_split_mim_head_decodes_as_the_whole_model() -> None:
    """Over 2 stand-in accelerators the code head sits on the second: decoding runs on the ids' device (here the
    CPU), to which the root hook returns the logits, and gives the whole model's codes."""
    model_class, case = MIM_HEADS["hyperset"]
    torch.manual_seed(0)
    model = perturb(model_class(case.tiny.config("sequence"))).eval()
    model.set_attn_implementation("eager")  # the stand-ins' math sdpa is another kernel (see the split test)
    input_ids = case.inputs()["input_ids"].clamp_max(model.mask_token_id - 1)
    input_ids[:, ::2] = model.mask_token_id
    expected = model.decode(input_ids, steps=3, seed=0)
    device_map = auto_map(model, 2)
    assert device_map["code_head"] != device_map["hyperset.embeddings"], device_map
    with accelerator():
        place(model, device_map)
        got = model.decode(input_ids, steps=3, seed=0)
    assert got.codes.device == input_ids.device
    for name in ("sequences", "unmasked", "confidences"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), (
            f"{name} over {device_map}: {getattr(got, name)} vs {getattr(expected, name)}"
        )
