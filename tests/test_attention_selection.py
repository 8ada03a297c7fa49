"""Attention selection goes through transformers' own mechanism, in every family and the looped-Transformer baseline.

Each model class declares the names `attn_implementation` takes (`attn_implementations`); any other name is refused
by the model's own message, however it is asked for (`from_pretrained`, `from_config`, `set_attn_implementation`),
while the names it takes and None select as transformers selects them. No private `PreTrainedModel` hook is
overridden in the model files, the shared mixins included, beyond the listed ones (each with its reason),
config.json holds what transformers writes (no implementation, no private flag), and
model folders saved by the code before this rule load with the same outputs
(tests/data/saved_before_attention_selection, written by that code).
"""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest
import torch
from fixtures import Case, assert_differs, looped_transformer_config
from safetensors.torch import load_file
from transformers import (
    AttentionInterface,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from energyformers import (
    HyperBFForImageClassification,
    HyperSetForImageClassification,
    IMixerForImageClassification,
    LoopedTransformerForImageClassification,
)
from energyformers.modeling import (
    modeling_hyperbf,
    modeling_hyperset,
    modeling_imixer,
    modeling_looped_transformer,
)

ROOT = Path(__file__).resolve().parents[1]
SAVED = Path(__file__).resolve().parent / "data" / "saved_before_attention_selection"
MODEL_MODULES = [modeling_hyperset, modeling_hyperbf, modeling_imixer, modeling_looped_transformer]
MODEL_FILES = [Path(module.__file__) for module in MODEL_MODULES]
ALLOWED_PRIVATE_OVERRIDES = {
    "_init_weights": "transformers' documented extension point: every model file defines it",
    # transformers' public names for turning checkpointing on differ between the versions the package supports
    # (`gradient_checkpointing_enable`, then `activation_checkpointing_enable` with the old name a deprecated alias
    # that, once overridden, becomes the new name's route and warns); every one of them reaches this hook first
    "_set_gradient_checkpointing": (
        "FamilyPreTrainedMixin refuses checkpointing a model cannot train with (iMixer's per-call schedule) in the "
        "one step every enabling path passes through, before any module changes"
    ),
}


def model_file_classes(module: object) -> list[type]:
    """The classes of the model files behind the module's `PreTrainedModel` subclasses: each subclass and every
    class in its MRO that a model file defines, mixins listed in the bases included (`FamilyPreTrainedMixin`,
    which holds the bases' logic, imported by the looped baseline from Hyper-SET's file)."""
    prefix = modeling_hyperset.__name__.rpartition(".")[0] + "."
    defined = [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and value.__module__ == module.__name__
        and issubclass(value, PreTrainedModel)
    ]
    found = {}
    for cls in defined:
        for base in cls.__mro__:
            if base.__module__.startswith(prefix):
                found[base] = None
    return list(found)


def private_hook_overrides(module: object) -> set[str]:
    """`Class.method` for every private `PreTrainedModel` method a model-file class of the module defines."""
    return {
        f"{cls.__name__}.{name}"
        for cls in model_file_classes(module)
        for name, value in vars(cls).items()
        if name.startswith("_")
        and not name.startswith("__")
        and hasattr(PreTrainedModel, name)
        and (inspect.isfunction(value) or isinstance(value, (classmethod, staticmethod, property)))
    }


@pytest.mark.parametrize("module", MODEL_MODULES, ids=lambda module: Path(module.__file__).name)
def test_model_files_override_no_private_pretrained_model_hook(module):
    classes = {cls.__name__ for cls in model_file_classes(module)}
    assert "FamilyPreTrainedMixin" in classes, (
        f"{module.__name__}: the mixins were not followed, only {classes}"
    )
    shadowing = sorted(
        name
        for name in private_hook_overrides(module)
        if name.rpartition(".")[2] not in ALLOWED_PRIVATE_OVERRIDES
    )
    assert not shadowing, f"{module.__name__} overrides private PreTrainedModel hooks: {shadowing}"


def test_every_allowed_private_override_is_still_made():
    """An allowance outlives its reason otherwise: drop a name here when its override goes."""
    made = {name.rpartition(".")[2] for module in MODEL_MODULES for name in private_hook_overrides(module)}
    stale = sorted(set(ALLOWED_PRIVATE_OVERRIDES) - made)
    assert not stale, f"allowed but overridden nowhere: {stale}; made: {sorted(made)}"


@pytest.mark.parametrize("path", [*MODEL_FILES, ROOT / "configuration" / "configuration_hyperset.py"])
def test_no_private_attention_flag_and_no_kernel_import(path):
    source = path.read_text()
    assert "_attn_implementation_autoset" not in source, f"{path.name} still uses a private flag"
    imported = [
        alias.name if isinstance(node, ast.Import) else f"{node.module}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert not [name for name in imported if "kernels" in (name or "")], f"{path.name} imports {imported}"


@pytest.mark.parametrize("name", [None, "eager", "sdpa"])
def test_config_json_is_what_transformers_writes(name, tmp_path):
    """No `_attn…` key and no implementation: transformers saves none; it is chosen where the model loads."""
    case = Case.of(HyperSetForImageClassification)
    model = case.build(attn_implementation=name)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    attention_keys = [key for key in saved if "attn" in key]
    assert not attention_keys, f"config.json holds {attention_keys} for attn_implementation={name!r}"


def test_the_kernels_module_registers_through_the_public_registration():
    """`register` reaches every Hyper-SET model's registry; transformers' global softmax registry is untouched."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as TRANSFORMERS_ATTENTION_FUNCTIONS

    def double_eager(q, k, v, keep):
        out, _ = modeling_hyperset.eager_bisoftmax_attention(q, k, v, keep)
        return 2 * out, None

    interface = modeling_hyperset.BiSoftmaxAttentionInterface
    saved = dict(interface._global_mapping)
    try:
        interface.register("doubled", double_eager)
        assert "doubled" not in TRANSFORMERS_ATTENTION_FUNCTIONS.valid_keys()
        case = Case.of(HyperSetForImageClassification)
        model = case.build()
        with torch.no_grad():
            model.hyperset.step_sizes.proj.bias.fill_(0.3)  # large steps: the attention shows in the output
        inputs = case.inputs()
        reference = model(**inputs).logits
        model.set_attn_implementation("doubled")  # looked up at call time, switched without rebuilding
        assert model.config._attn_implementation == "doubled"
        changed = model(**inputs).logits
        assert_differs(changed, reference, "the registered implementation was not used", beyond_allclose=True)
    finally:
        interface._global_mapping = saved


SAVED_FOLDERS = [
    # folder, Auto class, implementation the old code ran, that of today's load
    ("hyperset_image_default", AutoModelForImageClassification, "eager"),
    ("hyperset_tokens_sdpa", AutoModelForTokenClassification, "sdpa"),
    ("looped_tokens_default", AutoModelForSequenceClassification, "eager"),
]


@pytest.mark.parametrize(
    ("folder", "auto_class", "implementation"), SAVED_FOLDERS, ids=[f[0] for f in SAVED_FOLDERS]
)
def test_a_folder_saved_by_the_old_code_loads_with_the_same_outputs(
    folder, auto_class, implementation, tmp_path
):
    expected = load_file(SAVED / folder / "expected.safetensors")
    logits = expected.pop("logits")
    model = auto_class.from_pretrained(SAVED / folder).eval()
    # the saved `"attn_implementation"` key of the old code (an explicit choice) is honoured, as transformers
    # honours it in any config.json; without one, the CPU default is eager as before
    assert model.config._attn_implementation == implementation
    with torch.no_grad():
        got = model(**expected).logits
    # Hyper-SET runs the same operations as the old code: float32 rounding only. The looped baseline ran torch's
    # SDPA whatever its config said and now runs the eager path its config.json names: the same sums in another
    # order, float32 rounding relative to the logits' scale.
    scale = logits.abs().max().item()
    tolerance = 16 * torch.finfo(torch.float32).eps * max(scale, 1.0)
    difference = (got - logits).abs().max().item()
    assert difference <= tolerance, f"{folder}: max |new - old| = {difference:.3g} > {tolerance:.3g}"
    # re-saved by today's code: as transformers writes it
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not [key for key in saved if "attn" in key], f"{folder}: re-saved config.json holds {saved.keys()}"


# ------------------------------------------------------------------ what each family takes, however it is asked

# Every family and the baseline: (image classifier, tiny config factory, the names it takes, its default with
# attn_implementation=None, names it does not take). The default is transformers' own choice except for Hyper-SET
# (`DEFAULT_ATTN_IMPLEMENTATION`): "sdpa" where the class supports it, else "eager" (iMixer has no attention).
FAMILY_SELECTIONS = {
    "hyperset": (
        HyperSetForImageClassification,
        lambda: Case.of(HyperSetForImageClassification, "image").config(),
        ("eager", "sdpa"),
        "eager",
        ("flash_attention_2", "flex_attention", "paged|eager", "bogus"),
    ),
    "hyperbf": (
        HyperBFForImageClassification,
        lambda: Case.of(HyperBFForImageClassification, "image").config(),
        ("eager", "sdpa"),
        "sdpa",
        ("flash_attention_2", "flex_attention", "paged|eager", "triton", "bogus"),
    ),
    "imixer": (
        IMixerForImageClassification,
        lambda: Case.of(IMixerForImageClassification, "image").config(),
        ("eager",),
        "eager",
        ("sdpa", "flash_attention_2", "paged|eager", "triton", "bogus"),
    ),
    "looped-transformer": (
        LoopedTransformerForImageClassification,
        lambda: looped_transformer_config("image"),
        ("eager", "sdpa"),
        "sdpa",
        ("flash_attention_2", "flex_attention", "paged|eager", "triton", "bogus"),
    ),
}
WAYS = ["from_pretrained", "from_config", "set_attn_implementation"]


def select(family: str, way: str, name: str | None, folder: Path) -> PreTrainedModel:
    """A model of `family` whose implementation was asked for as `name`, through `way`."""
    model_class, config, _, _, _ = FAMILY_SELECTIONS[family]
    if way == "from_pretrained":
        torch.manual_seed(0)
        model_class(config()).save_pretrained(folder)
        return AutoModelForImageClassification.from_pretrained(folder, attn_implementation=name)
    if way == "from_config":
        return AutoModelForImageClassification.from_config(config(), attn_implementation=name)
    model = model_class(config())
    model.set_attn_implementation(name)
    return model


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("family", list(FAMILY_SELECTIONS))
def test_a_name_the_family_does_not_take_is_refused_by_the_model(family, way, tmp_path):
    """The model's own message (its class, the name, the names it takes), never transformers' generic one, which
    lists implementations these models do not run, asks to request support upstream or names a Hub page made of
    the folder name."""
    model_class, _, taken, _, refused = FAMILY_SELECTIONS[family]
    for name in refused:
        with pytest.raises(ValueError) as raised:
            select(family, way, name, tmp_path / name.replace("|", "-"))
        message = str(raised.value)
        assert f'`attn_implementation="{name}"` is not supported by {model_class.__name__}' in message, (
            message
        )
        listed = message.split("The only possible arguments are ", 1)[-1]
        names = ", ".join(f'`"{taken_name}"`' for taken_name in model_class.attn_implementations)
        assert listed.startswith(f"{names}, or None for the default"), (family, way, name, message)
        assert set(taken) <= set(model_class.attn_implementations), (family, taken)
        for generic in ("huggingface.co", "issues/", "whisper", 'paged|eager"`,', "yet"):
            assert generic not in message, f"{family} {way} {name}: transformers' generic text: {message}"


@pytest.mark.parametrize("family", list(FAMILY_SELECTIONS))
def test_a_refused_set_attn_implementation_leaves_the_model_as_it_was(family):
    model_class, config, _, default, refused = FAMILY_SELECTIONS[family]
    model = model_class(config())
    with pytest.raises(ValueError, match=model_class.__name__):
        model.set_attn_implementation(refused[0])
    assert model.config._attn_implementation == default


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("family", list(FAMILY_SELECTIONS))
def test_the_names_a_family_takes_and_none_select_as_before(family, way, tmp_path):
    """Each declared name selects itself; None selects the family's default (transformers' own for all but
    Hyper-SET)."""
    _, _, taken, default, _ = FAMILY_SELECTIONS[family]
    for name in [*taken, None]:
        model = select(family, way, name, tmp_path / str(name))
        expected = default if name is None else name
        assert model.config._attn_implementation == expected, (family, way, name)


@pytest.mark.parametrize("family", list(FAMILY_SELECTIONS))
def test_each_model_class_declares_what_it_takes(family):
    """`attn_implementations`, read by the shared check: what the family documents (Hyper-SET: its registry, which
    holds "triton" where the kernel is registered)."""
    model_class, _, taken, _, refused = FAMILY_SELECTIONS[family]
    declared = list(model_class.attn_implementations)
    assert set(taken) <= set(declared) and not set(refused) & set(declared), (family, declared)


# ------------------------------------------------------------------ attention functions a user registers

SOFTMAX_FAMILIES = ["hyperbf", "looped-transformer"]  # standard softmax attention: transformers' functions


@pytest.fixture
def counted_sdpa(monkeypatch):
    """transformers' sdpa under a new name, registered as a user registers one (`AttentionInterface.register`),
    counting its calls; the registration is undone after the test, so other tests see transformers' registry."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa_attention_forward(*args, **kwargs)

    # what `AttentionInterface.register` writes, through monkeypatch so that it is removed again
    monkeypatch.setitem(AttentionInterface._global_mapping, "counted_sdpa", counted)
    return calls


@pytest.mark.parametrize("family", SOFTMAX_FAMILIES)
def test_a_registered_attention_function_is_selected_and_run(family, counted_sdpa, tmp_path):
    """from_pretrained, from_config and set_attn_implementation all take the registered name, the forward calls it,
    and the logits are sdpa's (the same function under another name: equal bit for bit)."""
    model_class, config, _, _, _ = FAMILY_SELECTIONS[family]
    torch.manual_seed(0)
    model_class(config()).save_pretrained(tmp_path)
    shape = (2, config().num_channels, config().image_size, config().image_size)
    pixels = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    assert "counted_sdpa" in model_class.attn_implementations, list(model_class.attn_implementations)

    reference = AutoModelForImageClassification.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    with torch.no_grad():
        expected = reference(pixel_values=pixels).logits
    assert not counted_sdpa, f"{family}: sdpa called the registered function"

    loaded = AutoModelForImageClassification.from_pretrained(
        tmp_path, attn_implementation="counted_sdpa"
    ).eval()
    switched = AutoModelForImageClassification.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    switched.set_attn_implementation("counted_sdpa")
    built = AutoModelForImageClassification.from_config(config(), attn_implementation="counted_sdpa")
    assert built.config._attn_implementation == "counted_sdpa", family
    for way, model in (("from_pretrained", loaded), ("set_attn_implementation", switched)):
        assert model.config._attn_implementation == "counted_sdpa", (family, way)
        before = len(counted_sdpa)
        with torch.no_grad():
            got = model(pixel_values=pixels).logits
        assert len(counted_sdpa) > before, f"{family} {way}: the registered function was never called"
        difference = (got - expected).abs().max().item()
        assert torch.equal(got, expected), f"{family} {way}: max |registered - sdpa| = {difference:.3g}"


@pytest.mark.parametrize("family", ["hyperset", "imixer"])
def test_a_registered_softmax_function_is_not_taken_by_the_other_families(family, counted_sdpa):
    """Hyper-SET's bi-softmax has its own registry and iMixer no attention: a name registered in transformers'
    registry is refused by them, with their own message."""
    model_class, config, _, _, _ = FAMILY_SELECTIONS[family]
    assert "counted_sdpa" not in list(model_class.attn_implementations), family
    model = model_class(config())
    with pytest.raises(ValueError, match=f'"counted_sdpa"` is not supported by {model_class.__name__}'):
        model.set_attn_implementation("counted_sdpa")
