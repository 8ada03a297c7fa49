"""Presets: one table per family in `energyformers.presets`, read by `from_preset` with the package installed and
absent from the Hub's remote code, whose `from_preset` says so."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from energyformers import FAMILIES, HyperBFConfig, HyperSetConfig, IMixerConfig
from energyformers import presets as presets_module
from energyformers.presets import LOOPED_TRANSFORMER_PRESETS, PRESETS
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
