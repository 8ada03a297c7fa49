"""Presets: one table per family in `energyformers.presets`, read by `from_preset` with the package installed and
absent from the Hub's remote code, whose `from_preset` says so."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest

from energyformers import FAMILIES, HyperBFConfig, HyperSetConfig, IMixerConfig, LoopedTransformerConfig
from energyformers import presets as presets_module
from energyformers.presets import HYPERSET_PRESETS, LOOPED_TRANSFORMER_PRESETS, PRESET_SOURCES, PRESETS
from energyformers.training.remote_code import check_remote_code, remote_code_sources

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"hyperset": HyperSetConfig, "imixer": IMixerConfig, "hyperbf": HyperBFConfig}
# Every preset table and the page that documents its family (the baseline's rows are its masked-image-modelling
# models, documented beside Hyper-SET's in docs/mim.md).
TABLES = {**PRESETS, "looped-transformer": LOOPED_TRANSFORMER_PRESETS}
FAMILY_DOCS = {
    "hyperset": ROOT / "docs" / "hyperset.md",
    "imixer": ROOT / "docs" / "imixer.md",
    "hyperbf": ROOT / "docs" / "hyperbf.md",
    "looped-transformer": ROOT / "docs" / "mim.md",
}
# A source names where a row comes from (docs/development.md, "Contributing"): a paper's table or section, the
# authors' released checkpoint, or "ours: <why>" for a setting of this package's own.
CITATION = re.compile(r"\bTable \d+|§\d|CBMM memo \d+|the authors' released checkpoint")


def test_every_family_has_one_table_and_from_preset_reads_it():
    assert set(PRESETS) == set(CONFIGS) <= set(FAMILIES)
    for model_type, config_class in CONFIGS.items():
        for name, fields in PRESETS[model_type].items():
            # the CLI's sequence presets take the vocabulary from the data
            data = (
                {"vocab_size": 100}
                if fields.get("input_type") == "sequence" and "vocab_size" not in fields
                else {}
            )
            config = config_class.from_preset(name, **data)
            differs = {k: (getattr(config, k), v) for k, v in fields.items() if getattr(config, k) != v}
            assert not differs, f"{config_class.__name__}.from_preset({name!r}): (config, table) {differs}"


@pytest.mark.parametrize("model_type", sorted(TABLES))
def test_every_preset_row_cites_its_source_and_is_listed_in_its_family_doc(model_type):
    sources = getattr(presets_module, "PRESET_SOURCES", {}).get(model_type, {})
    names = set(TABLES[model_type])
    assert set(sources) == names, (
        f"{model_type}: presets without a source {sorted(names - set(sources))}, "
        f"sources without a preset {sorted(set(sources) - names)} (energyformers/presets.py, PRESET_SOURCES)"
    )
    uncited = {
        name: source
        for name, source in sources.items()
        if not (CITATION.search(source) or re.fullmatch(r"ours: \S.{9,}", source))
    }
    assert not uncited, (
        f"{model_type}: sources that name no table, section or release and are not 'ours: <why>': {uncited}"
    )
    doc = FAMILY_DOCS[model_type]
    text = doc.read_text(encoding="utf-8")
    unlisted = sorted(name for name in names if f"`{name}`" not in text)
    assert not unlisted, f"{model_type}: presets not listed as `name` in {doc.relative_to(ROOT)}: {unlisted}"


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_remote_code_carries_no_preset_table(model_type):
    sources = remote_code_sources(model_type)
    for filename, source in sources.items():
        for name in PRESETS[
            model_type
        ]:  # a table entry `"name": dict(` / `"name": {` (the name alone may be a value)
            entry = re.search(rf'"{re.escape(name)}"\s*:\s*(dict\(|\{{)', source)
            assert entry is None, f"{filename} still holds preset {name!r}: {entry.group(0) if entry else ''}"
        assert "_PRESETS" not in source, f"{filename} still names a preset table"


def _load_remote_config(model_type: str, folder: Path, monkeypatch) -> type:
    """The exported configuration file imported on its own, with `energyformers` not importable."""
    sources = remote_code_sources(model_type)
    name = f"configuration_{FAMILIES[model_type].stem}"
    path = folder / f"{name}.py"
    path.write_text(sources[f"{name}.py"])
    monkeypatch.setitem(sys.modules, "energyformers", None)  # `import energyformers...` raises ImportError
    monkeypatch.setitem(sys.modules, "energyformers.presets", None)
    spec = importlib.util.spec_from_file_location(f"remote_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, CONFIGS[model_type].__name__)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_remote_code_from_preset_without_the_package_says_the_presets_need_it(
    model_type, tmp_path, monkeypatch
):
    remote = _load_remote_config(model_type, tmp_path, monkeypatch)
    name = next(iter(PRESETS[model_type]))
    with pytest.raises(
        ImportError, match=rf"from_preset\('{name}'\).*energyformers package.*explicit fields"
    ):
        remote.from_preset(name)
    assert remote(hidden_size=96).hidden_size == 96  # explicit fields need no package


def test_remote_code_check_allows_only_the_guarded_presets_import():
    guarded = (
        "def f():\n    try:\n        from energyformers.presets import preset_fields\n"
        "    except ImportError:\n        raise\n"
    )
    check_remote_code({"configuration_x.py": guarded}, "x", "XConfig")
    unguarded = "def f():\n    from energyformers.presets import preset_fields\n"
    with pytest.raises(ValueError, match=r"energyformers\.presets"):
        check_remote_code({"configuration_x.py": unguarded}, "x", "XConfig")
    other = guarded.replace("energyformers.presets", "energyformers.training")
    with pytest.raises(ValueError, match=r"energyformers\.training"):
        check_remote_code({"configuration_x.py": other}, "x", "XConfig")
    wrong_handler = guarded.replace("ImportError", "ValueError")
    with pytest.raises(ValueError, match=r"energyformers\.presets"):
        check_remote_code({"configuration_x.py": wrong_handler}, "x", "XConfig")


# One preset of each config class, its own rows and, for the baseline, a Hyper-SET row (built through
# `from_hyperset`) and one of its own rows.
OVERRIDE_CASES = [
    (HyperSetConfig, "cifar10-small"),
    (IMixerConfig, "s16"),
    (HyperBFConfig, "tiny"),
    (LoopedTransformerConfig, "cifar10-small"),
    (LoopedTransformerConfig, "mim-1-12-4d"),
]


@pytest.mark.parametrize(("config_class", "name"), OVERRIDE_CASES, ids=lambda v: getattr(v, "__name__", v))
def test_from_preset_refuses_a_misspelt_override_naming_the_closest_field(config_class, name):
    # transformers keeps an unknown keyword as an attribute nothing reads: the model would get the preset's width
    with pytest.raises(ValueError) as raised:
        config_class.from_preset(name, hiden_size=32)
    message = str(raised.value)
    assert f"{config_class.__name__}.from_preset" in message, message
    assert "hiden_size=32" in message and "'hidden_size'" in message, message


@pytest.mark.parametrize(("config_class", "name"), OVERRIDE_CASES, ids=lambda v: getattr(v, "__name__", v))
def test_from_preset_takes_config_fields_and_transformers_keywords(config_class, name):
    labels = {0: "cat", 1: "dog", 2: "fish"}
    config = config_class.from_preset(
        name,
        hidden_size=96,  # divisible by every preset's head count
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
        problem_type="single_label_classification",
        attn_implementation="eager",
        output_hidden_states=True,
    )
    got = (config.hidden_size, config.num_labels, config.problem_type, config._attn_implementation)
    assert got == (96, 3, "single_label_classification", "eager"), got
    assert config.output_hidden_states is True
    assert config_class.from_preset(name, num_labels=5).num_labels == 5


def test_from_preset_closest_names_include_transformers_keywords():
    with pytest.raises(ValueError, match=r"num_label=3.*'num_labels'"):
        IMixerConfig.from_preset("s16", num_label=3)


def test_from_hyperset_refuses_a_misspelt_override_and_leaves_hyperset_options_to_the_constructor():
    source = HyperSetConfig.from_preset("cifar10-small")
    with pytest.raises(
        ValueError, match=r"LoopedTransformerConfig\.from_hyperset: unknown override hiden_size"
    ):
        LoopedTransformerConfig.from_hyperset(source, hiden_size=32)
    # a Hyper-SET option is a known name, refused with the constructor's message that says whose option it is
    with pytest.raises(ValueError, match=r"invalid qkv_norm='shared'; a Hyper-SET option"):
        LoopedTransformerConfig.from_preset("cifar10-small", qkv_norm="shared")


def test_looped_transformer_unknown_preset_names_its_class_and_every_preset_it_takes():
    with pytest.raises(ValueError) as raised:
        LoopedTransformerConfig.from_preset("bogus")
    message = str(raised.value)
    assert message.startswith("LoopedTransformerConfig: unknown preset name='bogus'"), message
    listed = set(ast.literal_eval(re.search(r"expected one of (\[[^]]*\])", message).group(1)))
    expected = {*LOOPED_TRANSFORMER_PRESETS, *HYPERSET_PRESETS}
    assert listed == expected, f"listed {sorted(listed)}, takes {sorted(expected)}"
    for name in listed:  # every listed name is one it takes (the CLI's sequence rows want a vocabulary)
        LoopedTransformerConfig.from_preset(name, vocab_size=16)
    with pytest.raises(ValueError, match=r"^LoopedTransformerConfig: unknown preset"):
        LoopedTransformerConfig.preset_fields("bogus")


def test_from_preset_and_preset_fields_read_alike_in_the_three_families():
    """One wording: a reader of `help(IMixerConfig.from_preset)` learns what a reader of Hyper-SET's does."""
    for method in ("from_preset", "preset_fields"):
        docs = {cls.__name__: inspect.getdoc(getattr(cls, method)) for cls in CONFIGS.values()}
        assert len(set(docs.values())) == 1, f"{method} docstrings differ: {docs}"
    assert "PRESET_SOURCES" in inspect.getdoc(HyperSetConfig.preset_fields)  # where each row comes from


def test_image_presets_are_rgb_unless_their_source_says_how_to_serve_them():
    """transformers' image pipelines convert every image to RGB, and so does the CLI's image processor: a preset
    with another channel count must say so where its row is described (PRESET_SOURCES)."""
    unexplained = {
        (model_type, name): fields["num_channels"]
        for model_type, table in PRESETS.items()
        for name, fields in table.items()
        if fields.get("input_type", "image") == "image"
        and fields.get("num_channels", 3) != 3
        and not all(
            text in PRESET_SOURCES[model_type][name]
            for text in (f"num_channels={fields['num_channels']}", "num_channels=3", "RGB")
        )
    }
    assert not unexplained, (
        f"non-RGB image presets whose source does not say how to serve them: {unexplained}"
    )


@pytest.mark.parametrize("name", sorted(HYPERSET_PRESETS))
def test_looped_preset_fields_build_what_from_preset_builds(name):
    """The training CLI builds from `preset_fields` (plus the data's geometry), users from `from_preset`: both give
    the baseline of a Hyper-SET row, with its own 4 · hidden_size MLP rather than Hyper-SET's dictionary size."""
    fields = LoopedTransformerConfig.preset_fields(name)
    data = {}
    if fields.get("input_type") == "sequence" and fields.get("vocab_size") is None:
        data = {"vocab_size": 16}  # a text row leaves it to the data (the CLI reads it from the tokenizer)
    built = LoopedTransformerConfig(**{**fields, **data}).to_dict()
    expected = LoopedTransformerConfig.from_preset(name, **data).to_dict()
    assert built == expected, {
        k: (built.get(k), expected.get(k)) for k in built if built.get(k) != expected.get(k)
    }
    assert built["intermediate_size"] == 4 * built["hidden_size"], built


def test_every_preset_but_the_authors_checkpoints_has_time_invariant_step_sizes():
    """recurrent-depth.md: iteration_conditioning="none" is every preset's default; only the `-authors` presets
    (what `energyformers convert` builds from the authors' checkpoints) keep their t-conditioned step sizes."""
    default = inspect.signature(HyperSetConfig).parameters["iteration_conditioning"].default
    assert default == "none", default
    rows = {name: {"iteration_conditioning": default, **HYPERSET_PRESETS[name]} for name in HYPERSET_PRESETS}
    conditioned = {
        name: row["iteration_conditioning"]
        for name, row in rows.items()
        if row["iteration_conditioning"] != "none"
    }
    assert all(name.endswith("-authors") for name in conditioned), conditioned


def test_sudoku_preset_head_and_step_size_norms_account_for_the_image_structures_count():
    """docs/hyperset.md: the authors' image structure on the Sudoku preset (with their time MLP) has 5,199,433
    parameters: the RMSNorms of the step-size network (3 × 1024 weights) and a LayerNorm + biased head (d + d + 9)."""
    import torch

    from energyformers import HyperSetForTokenClassification

    def count(**overrides) -> int:
        config = HyperSetConfig.from_preset("sudoku", iteration_conditioning="sinusoidal", **overrides)
        with torch.device("meta"):
            return HyperSetForTokenClassification(config).num_parameters()

    head = dict(classifier_norm="layernorm", classifier_bias=True)
    counts = (count(), count(**head), count(**head, step_size_norm="rmsnorm"))
    assert counts == (5_195_584, 5_196_361, 5_199_433), counts
