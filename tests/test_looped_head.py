"""The looped-Transformer baseline's head is Hyper-SET's (docs/training.md, the baseline section): the norm before
the classifier and the classifier's bias follow the shared `classifier_norm` / `classifier_bias` fields, so a
baseline built from any Hyper-SET config (the Sudoku presets' RMSNorm → bias-free Linear included) differs from it
in the trunk only; folders saved before the baseline had the two fields load with the head they were saved with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fixtures import hyperset_config
from safetensors.torch import load_file

from energyformers import (
    HyperSetConfig,
    HyperSetForImageClassification,
    HyperSetForMaskedImageModeling,
    HyperSetForTokenClassification,
    LoopedTransformerConfig,
    LoopedTransformerForImageClassification,
    LoopedTransformerForMaskedImageModeling,
    LoopedTransformerForTokenClassification,
)
from energyformers.configuration.configuration_looped_transformer import HYPERSET_ONLY_FIELDS
from energyformers.training.setup import check_override_names

HEAD_FIELDS = ("classifier_norm", "classifier_bias")
ROOT = Path(__file__).resolve().parents[1]


def head_structure(model: torch.nn.Module, names: tuple[str, ...]) -> dict[str, object]:
    """Module type of each head submodule and the name → shape of its parameters, to compare two heads."""
    structure: dict[str, object] = {}
    for name in names:
        module = getattr(model, name)
        structure[name] = type(module)
        for parameter_name, parameter in module.named_parameters():
            structure[f"{name}.{parameter_name}"] = tuple(parameter.shape)
    return structure


@pytest.mark.parametrize("build", ["from_hyperset", "from_preset"])
def test_sudoku_baseline_head_is_hypersets_head(build):
    """Both ways of building the Sudoku baseline (the benchmarks' `from_hyperset`, the CLI's `--preset sudoku`) give
    Hyper-SET's RMSNorm → bias-free Linear, same module types, parameter names and shapes."""
    hyperset_config_ = HyperSetConfig.from_preset("sudoku")
    assert (hyperset_config_.classifier_norm, hyperset_config_.classifier_bias) == ("rmsnorm", False)
    if build == "from_hyperset":
        looped_config = LoopedTransformerConfig.from_hyperset(hyperset_config_)
    else:
        looped_config = LoopedTransformerConfig.from_preset("sudoku")
    with torch.device("meta"):  # structure only: no weights needed
        hyperset = HyperSetForTokenClassification(hyperset_config_)
        looped = LoopedTransformerForTokenClassification(looped_config)
    heads = ("layernorm", "classifier")
    got, expected = head_structure(looped, heads), head_structure(hyperset, heads)
    assert got == expected, f"baseline head {got} != Hyper-SET head {expected}"
    assert isinstance(looped.layernorm, torch.nn.RMSNorm), looped.layernorm
    assert looped.classifier.bias is None, looped.classifier
    # the Sudoku preset's RMSNorm uses the config's epsilon, as Hyper-SET's
    assert looped.layernorm.eps == hyperset.layernorm.eps, (looped.layernorm.eps, hyperset.layernorm.eps)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("bias", [True, False])
def test_hyperset_head_weights_load_into_the_baseline_head_strictly(norm, bias):
    """Same parameter names and shapes for every head option: Hyper-SET's trained head drops into the baseline's
    (strict loading) and computes the same logits from the same state."""
    torch.manual_seed(0)
    config = hyperset_config("image", classifier_norm=norm, classifier_bias=bias)
    source = HyperSetForImageClassification(config).eval()
    target = LoopedTransformerForImageClassification(LoopedTransformerConfig.from_hyperset(config)).eval()
    for name in ("layernorm", "classifier"):
        getattr(target, name).load_state_dict(getattr(source, name).state_dict(), strict=True)
    state = torch.randn(3, config.hidden_size)
    with torch.no_grad():
        got = target.classifier(target.layernorm(state))
        expected = source.classifier(source.layernorm(state))
    # same modules, same weights, same input on the same device: the same kernels, so exactly equal
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "fields", [("rmsnorm", False), ("rmsnorm", True), ("layernorm", False), ("layernorm", True)]
)
def test_from_hyperset_and_preset_fields_carry_the_head_fields(fields):
    norm, bias = fields
    source = hyperset_config("sequence", classifier_norm=norm, classifier_bias=bias)
    baseline = LoopedTransformerConfig.from_hyperset(source)
    got = tuple(getattr(baseline, name) for name in HEAD_FIELDS)
    assert got == fields, f"from_hyperset carried {got}, expected {fields}"
    saved = baseline.to_dict()
    assert tuple(saved[name] for name in HEAD_FIELDS) == fields, {
        name: saved.get(name) for name in HEAD_FIELDS
    }


def test_preset_fields_and_cli_config_names_carry_the_head_fields():
    assert not set(HEAD_FIELDS) & set(HYPERSET_ONLY_FIELDS), HYPERSET_ONLY_FIELDS
    fields = LoopedTransformerConfig.preset_fields("sudoku")
    got = {name: fields.get(name) for name in HEAD_FIELDS}
    assert got == {"classifier_norm": "rmsnorm", "classifier_bias": False}, got
    # `--config classifier_norm=rmsnorm classifier_bias=false` is accepted for the baseline (no UsageError)
    check_override_names(LoopedTransformerConfig, {"classifier_norm": "rmsnorm", "classifier_bias": False})
    assert set(LoopedTransformerConfig.choices["classifier_norm"]) == {"layernorm", "rmsnorm"}


def test_defaults_are_the_old_head():
    """Defaults = the head the baseline always built before the fields existed: LayerNorm → Linear with bias."""
    config = LoopedTransformerConfig(
        hidden_size=16, num_attention_heads=4, image_size=8, patch_size=2, num_labels=3
    )
    assert (config.classifier_norm, config.classifier_bias) == ("layernorm", True)
    model = LoopedTransformerForImageClassification(config)
    assert type(model.layernorm) is torch.nn.LayerNorm, model.layernorm
    assert model.classifier.bias is not None, model.classifier


@pytest.mark.parametrize(
    ("name", "value"), [("classifier_norm", "batchnorm"), ("classifier_bias", "yes"), ("classifier_bias", 1)]
)
def test_bad_head_fields_are_refused_naming_the_argument(name, value):
    with pytest.raises(ValueError, match=rf"{name}={value!r}") as caught:
        LoopedTransformerConfig(hidden_size=16, num_attention_heads=4, **{name: value})
    assert "Hyper-SET option" not in str(caught.value), caught.value  # a field of the baseline now


def strip_head_fields(folder) -> None:
    """Make a folder saved now look like one saved before the baseline had the two fields: its config.json then
    carried neither (the weights' keys are the same)."""
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    for name in HEAD_FIELDS:
        config.pop(name)
    path.write_text(json.dumps(config), encoding="utf-8")


def test_old_classifier_folder_loads_unchanged(tmp_path):
    """A classifier folder of the old code: config.json without the head fields, `layernorm.bias` and
    `classifier.bias` in the weights. The defaults rebuild exactly that head: every key loads, none is missing, and
    the logits are the saved model's."""
    torch.manual_seed(0)
    config = LoopedTransformerConfig(
        hidden_size=16, num_attention_heads=4, image_size=8, patch_size=2, num_labels=3
    )
    model = LoopedTransformerForImageClassification(config).eval()
    with torch.no_grad():  # non-trivial head weights, so a re-initialised head could not pass
        for parameter in (*model.layernorm.parameters(), *model.classifier.parameters()):
            parameter.normal_()
    model.save_pretrained(tmp_path)
    strip_head_fields(tmp_path)
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"layernorm.bias", "classifier.bias"} <= keys, sorted(keys)

    loaded, info = LoopedTransformerForImageClassification.from_pretrained(tmp_path, output_loading_info=True)
    loaded.eval()
    assert (loaded.config.classifier_norm, loaded.config.classifier_bias) == ("layernorm", True)
    problems = {
        kind: info[kind] for kind in ("missing_keys", "unexpected_keys", "mismatched_keys") if info[kind]
    }
    assert not problems, problems
    pixels = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        got, expected = loaded(pixel_values=pixels).logits, model(pixel_values=pixels).logits
    # the same weights through the same modules on the same device: the same kernels, so exactly equal
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_old_masked_image_modeling_folder_loads_with_its_rmsnorm_head(tmp_path):
    """The masked-image-modelling baseline always had RMSNorm → Linear with bias, not the default norm: its old
    folders (no `classifier_norm` in config.json) load with that head, while its presets now say so explicitly."""
    torch.manual_seed(0)
    config = LoopedTransformerConfig.from_preset(
        "cli-mim", hidden_size=16, num_attention_heads=4, vocab_size=9
    )
    assert (config.classifier_norm, config.classifier_bias) == ("rmsnorm", True)
    model = LoopedTransformerForMaskedImageModeling(config).eval()
    model.save_pretrained(tmp_path)
    strip_head_fields(tmp_path)

    loaded, info = LoopedTransformerForMaskedImageModeling.from_pretrained(tmp_path, output_loading_info=True)
    loaded.eval()
    assert isinstance(loaded.layernorm, torch.nn.RMSNorm), loaded.layernorm
    assert (loaded.config.classifier_norm, loaded.config.classifier_bias) == ("rmsnorm", True)
    problems = {
        kind: info[kind] for kind in ("missing_keys", "unexpected_keys", "mismatched_keys") if info[kind]
    }
    assert not problems, problems
    ids = torch.randint(0, 9, (2, config.max_position_embeddings))
    with torch.no_grad():
        got, expected = loaded(input_ids=ids).logits, model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # same weights, modules, device: exactly equal


def test_masked_image_modeling_baseline_head_is_hypersets():
    """Table 2's pair: the baseline of Hyper-SET's MIM preset has Hyper-SET's MIM head (norm and code head)."""
    hyperset_config_ = HyperSetConfig.from_preset("mim-1-12-d")
    with torch.device("meta"):
        hyperset = HyperSetForMaskedImageModeling(hyperset_config_)
        looped = LoopedTransformerForMaskedImageModeling(
            LoopedTransformerConfig.from_hyperset(hyperset_config_)
        )
        table_2 = LoopedTransformerForMaskedImageModeling(LoopedTransformerConfig.from_preset("mim-1-12-4d"))
    heads = ("layernorm", "code_head")
    expected = head_structure(hyperset, heads)
    for name, model in (("from_hyperset", looped), ("mim-1-12-4d", table_2)):
        got = head_structure(model, heads)
        assert got == expected, f"{name}: baseline MIM head {got} != Hyper-SET's {expected}"


def test_docs_say_the_heads_are_the_same():
    """docs/training.md's baseline section says the two models share the head fields and differ in the trunk only,
    and no longer quotes a head difference; `from_hyperset` promises the head in its summary line."""
    training = " ".join((ROOT / "docs" / "training.md").read_text(encoding="utf-8").split())
    for quote in (
        "`classifier_norm` and `classifier_bias` are fields of both configs",
        "differ in the trunk only",
    ):
        assert quote in training, f"docs/training.md does not say {quote!r}"
    assert "the baseline's head has a LayerNorm bias and a classifier bias more" not in training
    summary = (LoopedTransformerConfig.from_hyperset.__doc__ or "").strip().splitlines()[0]
    assert "head" in summary, f"from_hyperset's summary does not promise the head: {summary!r}"
