"""Attention selection goes through transformers' own mechanism (Hyper-SET and the looped-Transformer baseline).

No private `PreTrainedModel` hook is overridden in the model files, config.json holds what transformers writes (no
implementation, no private flag), and model folders saved by the code before this rule load with the same outputs
(tests/data/saved_before_attention_selection, written by that code).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from fixtures import Case
from safetensors.torch import load_file
from transformers import (
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
)

from energyformers import HyperSetForImageClassification
from energyformers.modeling import modeling_hyperset, modeling_looped_transformer

ROOT = Path(__file__).resolve().parents[1]
SAVED = Path(__file__).resolve().parent / "data" / "saved_before_attention_selection"
MODEL_FILES = [Path(modeling_hyperset.__file__), Path(modeling_looped_transformer.__file__)]
# transformers' documented extension point: every model file defines it
ALLOWED_PRIVATE_OVERRIDES = {"_init_weights"}


def pretrained_model_subclasses(tree: ast.Module) -> list[ast.ClassDef]:
    """Classes of a module that derive, within the module, from `PreTrainedModel`."""
    derived, classes = {"PreTrainedModel"}, [node for node in tree.body if isinstance(node, ast.ClassDef)]
    found = []
    for node in classes:  # a base is defined before its subclasses
        bases = {base.id for base in node.bases if isinstance(base, ast.Name)}
        if bases & derived:
            derived.add(node.name)
            found.append(node)
    return found


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda path: path.name)
def test_model_files_override_no_private_pretrained_model_hook(path):
    tree = ast.parse(path.read_text())
    classes = pretrained_model_subclasses(tree)
    assert classes, f"{path.name}: no PreTrainedModel subclass found"
    shadowing = [
        f"{node.name}.{item.name}"
        for node in classes
        for item in node.body
        if isinstance(item, ast.FunctionDef)
        and item.name.startswith("_")
        and not item.name.startswith("__")
        and hasattr(PreTrainedModel, item.name)
        and item.name not in ALLOWED_PRIVATE_OVERRIDES
    ]
    assert not shadowing, f"{path.name} overrides private PreTrainedModel hooks: {shadowing}"


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
        assert not torch.allclose(changed, reference), "the registered implementation was not used"
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
