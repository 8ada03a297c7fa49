"""Static rules of the repository layout (docs/development.md), read from the source text.

The three model files are siblings: the same shared helpers (input checks with one wording of each error, attention
selection, loading), the attention families' helpers in Hyper-SET's and HyperBF's files only, the same skeleton, and
only `torch`, `transformers` and their own config imported, so the Hub export is a one-line rewrite.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import re
from pathlib import Path

import pytest

import energyformers
from energyformers import BASELINES, FAMILIES

ROOT = Path(__file__).resolve().parents[1]
MODELING = {family: ROOT / "modeling" / f"modeling_{spec.stem}.py" for family, spec in FAMILIES.items()}
# Marked blocks of the model files: each is identical in the family files that carry it and absent from the others,
# and holds only what each of those files uses. A block's markers name no file of tests/: the model files are copied
# verbatim into Hub repositories, which have none.
SHARED_BEGIN = (
    "# --- shared helpers: identical in energyformers' three family model files (its test suite checks) ---"
)
SHARED_END = "# --- end of shared helpers ---"
ATTENTION_BEGIN = "# --- attention-family helpers: identical in energyformers' Hyper-SET and HyperBF files (its test suite checks) ---"
ATTENTION_END = "# --- end of attention-family helpers ---"
INTEGER_BEGIN = (
    "# --- integer check: identical in energyformers' Hyper-SET and iMixer files (its test suite checks) ---"
)
INTEGER_END = "# --- end of integer check ---"
# block → (markers, the families whose files carry it, definitions it must hold)
MARKED_BLOCKS = {
    "shared helpers": (
        (SHARED_BEGIN, SHARED_END),
        ("hyperset", "hyperbf", "imixer"),
        (
            "_check_inputs",
            "select_attn_implementation",
            "load_naming_unreadable_file",
            "masked_mean",
            "is_dispatched",
            "FamilyPreTrainedMixin",
        ),
    ),
    "attention-family helpers": (
        (ATTENTION_BEGIN, ATTENTION_END),
        ("hyperset", "hyperbf"),
        (
            "SoftmaxAttentionNames",
            "eager_attention_forward",
            "_check_position_ids",
            "interpolate_positions",
            "pool_tokens",
            "is_plain_linear",
        ),
    ),
    "integer check": ((INTEGER_BEGIN, INTEGER_END), ("hyperset", "imixer"), ("_is_integer",)),
}


def marked_block(path: Path, begin: str, end: str) -> str:
    text = path.read_text()
    assert text.count(begin) == 1 and text.count(end) == 1, f"{path.name}: markers missing or repeated"
    return text[text.index(begin) : text.index(end)]


def without_marked_blocks(path: Path) -> str:
    """The file's text with every marked block it carries cut out."""
    text = path.read_text()
    for begin, end in (markers for markers, _, _ in MARKED_BLOCKS.values()):
        if begin in text:
            text = text.replace(marked_block(path, begin, end), "")
    return text


def top_level_definitions(source: str) -> dict[str, ast.stmt]:
    """The top-level names `source` defines (functions, classes, constants), each with its statement."""
    definitions = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            definitions[node.name] = node
        elif isinstance(node, ast.Assign):
            targets = [n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)]
            definitions |= dict.fromkeys(targets, node)
    return definitions


def test_marked_blocks_name_the_registrys_families():
    """The shared-helpers block is in every family's file (a new family carries it too); the others in some."""
    assert set(MARKED_BLOCKS["shared helpers"][1]) == set(MODELING)
    assert {family for _, families, _ in MARKED_BLOCKS.values() for family in families} <= set(MODELING)


@pytest.mark.parametrize("block_name", list(MARKED_BLOCKS))
def test_marked_block_is_identical_in_exactly_the_files_that_carry_it(block_name):
    """Edit the block in one file and copy it unchanged into the others: a copy that drifts fails here, with the
    difference from the first file's copy."""
    (begin, end), carriers, required = MARKED_BLOCKS[block_name]
    for family, path in MODELING.items():
        text = path.read_text()
        if family not in carriers:
            assert begin not in text and end not in text, f"{path.name} carries the {block_name} block"
    blocks = {family: marked_block(MODELING[family], begin, end) for family in carriers}
    reference_family, reference = next(iter(blocks.items()))
    missing = [
        name for name in required if f"def {name}(" not in reference and f"class {name}" not in reference
    ]
    assert missing == [], f"{missing} are not in the {block_name} block"
    for family, block in blocks.items():
        difference = "".join(
            difflib.unified_diff(
                reference.splitlines(keepends=True),
                block.splitlines(keepends=True),
                MODELING[reference_family].name,
                MODELING[family].name,
                n=1,
            )
        )
        assert block == reference, f"the {block_name} block of {MODELING[family].name} differs:\n{difference}"


@pytest.mark.parametrize("family", list(MODELING))
def test_marked_blocks_hold_only_what_their_file_uses(family):
    """Each file carries only the helpers it uses: every definition of each marked block it carries is reached from
    the code outside the blocks (for Hyper-SET's file also from the names the looped baseline imports from it),
    directly or through another helper of the blocks."""
    path = MODELING[family]
    definitions = {}
    for (begin, end), carriers, _ in MARKED_BLOCKS.values():
        if family in carriers:
            definitions |= top_level_definitions(marked_block(path, begin, end))

    def names_in(tree: ast.AST) -> set[str]:
        return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}

    reached = names_in(ast.parse(without_marked_blocks(path))) & set(definitions)
    looped = ast.parse((ROOT / "modeling" / "modeling_looped_transformer.py").read_text())
    for node in ast.walk(looped):
        if isinstance(node, ast.ImportFrom) and node.module == f"modeling_{FAMILIES[family].stem}":
            reached |= {alias.name for alias in node.names} & set(definitions)
    frontier = set(reached)
    while frontier:
        frontier = {n for name in frontier for n in names_in(definitions[name]) if n in definitions} - reached
        reached |= frontier
    unused = sorted(set(definitions) - reached)
    assert unused == [], (
        f"{path.name} carries helpers it never uses: {unused}; move them to the block of the files that do"
    )


def test_marked_block_helpers_are_defined_in_their_blocks_only():
    """A helper of a marked block is defined nowhere else in the model files (no second copy outside the blocks,
    e.g. an `eager_attention_forward` of the looped baseline's own: it imports Hyper-SET's)."""
    helpers = set()
    for (begin, end), carriers, _ in MARKED_BLOCKS.values():
        helpers |= set(top_level_definitions(marked_block(MODELING[carriers[0]], begin, end)))
    own = {}
    for path in sorted((ROOT / "modeling").glob("modeling_*.py")):
        defined = set(top_level_definitions(without_marked_blocks(path))) & helpers
        if defined:
            own[path.name] = sorted(defined)
    assert own == {}, f"marked-block helpers defined outside their blocks: {own}"


def test_backbones_name_their_inputs_through_the_mixin():
    """`_input_embed_layer` and a backbone's `main_input_name` follow `config.input_type` in one place,
    `FamilyPreTrainedMixin._set_input_names`, which every backbone's `__init__` calls."""
    names = {"_input_embed_layer", "main_input_name"}
    writers, callers = set(), set()
    for path in sorted((ROOT / "modeling").glob("modeling_*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for inner in ast.walk(node):
                stored = isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store)
                if stored and inner.attr in names and ast.unparse(inner.value) == "self":
                    writers.add(f"{path.name}:{node.name}")
                if isinstance(inner, ast.Call) and ast.unparse(inner.func) == "self._set_input_names":
                    callers.add(node.name)
    mixins = {f"modeling_{spec.stem}.py:FamilyPreTrainedMixin" for spec in FAMILIES.values()}
    assert writers == mixins, f"set by {sorted(writers)}; only FamilyPreTrainedMixin sets them"
    backbones = {spec.heads["AutoModel"].__name__ for spec in FAMILIES.values()} | {"LoopedTransformerModel"}
    assert callers == backbones, f"called by {sorted(callers)}; the backbones are {sorted(backbones)}"


def _class_method(tree: ast.Module, class_name: str, method: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return item
    raise AssertionError(f"{class_name}.{method} not found")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_forward_has_no_input_type_branch(family):
    """The embeddings own the input: `Model.forward` reads neither `input_type` nor the modality's tensors."""
    tree = ast.parse(MODELING[family].read_text())
    forward = _class_method(tree, FAMILIES[family].heads["AutoModel"].__name__, "forward")
    names = {node.attr for node in ast.walk(forward) if isinstance(node, ast.Attribute)}
    names |= {node.id for node in ast.walk(forward) if isinstance(node, ast.Name)}
    assert "input_type" not in names
    assert not any(
        isinstance(node, ast.If) and "pixel_values" in ast.unparse(node.test) for node in ast.walk(forward)
    )


@pytest.mark.parametrize("family", list(FAMILIES))
def test_modeling_file_imports_only_torch_transformers_and_its_config(family):
    tree = ast.parse(MODELING[family].read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add("." * node.level + (node.module or "").split(".")[0])
    config_import = "..configuration"
    assert roots <= {
        "__future__",
        "math",
        "numbers",
        "collections",
        "contextlib",
        "contextvars",
        "copy",
        "os",
        "functools",
        "dataclasses",
        "threading",
        "weakref",
        "torch",
        "transformers",
        config_import,
    }
    relative = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert [ast.unparse(node) for node in relative] == [
        f"from ..configuration.configuration_{FAMILIES[family].stem} import {FAMILIES[family].config_class.__name__}"
    ]


def test_registry_imports_configuration_and_modeling_directly_and_the_package_reexports_it_statically():
    tree = ast.parse((ROOT / "energyformers" / "registry.py").read_text())
    imported = {
        node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
    }
    expected = {f"configuration.configuration_{spec.stem}" for spec in FAMILIES.values()}
    expected |= {f"modeling.modeling_{spec.stem}" for spec in FAMILIES.values()}
    assert expected <= imported
    # `energyformers/__init__.py` names every public symbol in one static `from .registry import ...` (what IDEs,
    # type checkers and ruff read); the help-only command line defers that import (PEP 562 `__getattr__`).
    init = (ROOT / "energyformers" / "__init__.py").read_text()
    reexported = {
        alias.name
        for node in ast.walk(ast.parse(init))
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module == "registry"
        for alias in node.names
    }
    assert reexported == set(energyformers.__all__) - {"__version__"}
    # no dynamic imports (importlib.metadata, which reads the package's version, imports nothing of ours)
    dynamic = ("import_module", "importlib.util", "__import__", "globals()")
    for source in (init, (ROOT / "energyformers" / "registry.py").read_text()):
        assert not [word for word in dynamic if word in source], [word for word in dynamic if word in source]


def test_no_module_imports_another_modules_private_names():
    """A leading underscore means "this module's own": package code never imports such a name from elsewhere."""
    private = []
    for folder in ("energyformers", "configuration", "modeling", "training"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                internal = isinstance(node, ast.ImportFrom) and (
                    node.level > 0 or (node.module or "").startswith("energyformers")
                )
                if internal:
                    private += [
                        f"{path.name}:{node.lineno} {a.name}"
                        for a in node.names
                        if a.name.startswith("_") and not a.name.endswith("__")  # dunders are public
                    ]
    assert private == []


# The looped baseline's file is no family of `FAMILIES` (it is a baseline) but follows the same skeleton.
PRETRAINED_BASES = {
    **{
        family: (path, f"{FAMILIES[family].config_class.__name__[: -len('Config')]}PreTrainedModel")
        for family, path in MODELING.items()
    },
    "looped_transformer": (
        ROOT / "modeling" / "modeling_looped_transformer.py",
        "LoopedTransformerPreTrainedModel",
    ),
}


@pytest.mark.parametrize("family", list(PRETRAINED_BASES))
def test_pretrained_model_base_is_declarations_and_one_line_delegations(family):
    """As ViT's `ViTPreTrainedModel`: the logic every family shares (config checks at construction, attention
    selection, naming an unreadable weight file) lives once, in the shared-helpers block's `FamilyPreTrainedMixin`;
    a family's base holds class attributes, its `_init_weights`, and methods of at most one statement (a
    docstring aside)."""
    path, class_name = PRETRAINED_BASES[family]
    tree = ast.parse(path.read_text())
    (base,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name]
    bases = [ast.unparse(b) for b in base.bases]
    assert bases == ["FamilyPreTrainedMixin", "PreTrainedModel"], f"{class_name} has the bases {bases}"

    def statements(method: ast.FunctionDef) -> int:
        return len(method.body) - (ast.get_docstring(method) is not None)

    long_methods = {
        item.name: statements(item)
        for item in base.body
        if isinstance(item, ast.FunctionDef) and item.name != "_init_weights" and statements(item) > 1
    }
    assert long_methods == {}, f"{class_name}: methods of more than one statement {long_methods}"
    shared = {"__init__", "get_correct_attn_implementation", "from_pretrained"}
    own = {item.name for item in base.body if isinstance(item, ast.FunctionDef)} & shared
    assert own == set(), f"{class_name} redefines {own}, which FamilyPreTrainedMixin holds"


# Copied into Hub repositories as remote code (the whole file, or for mim.py the definitions the exported pipeline
# needs, with the comments above them), where no tests/ folder exists.
REMOTE_CODE_FILES = [
    *sorted(ROOT.glob("modeling/modeling_*.py")),
    *sorted(ROOT.glob("configuration/configuration_*.py")),
    ROOT / "energyformers" / "mim.py",
]


@pytest.mark.parametrize("path", REMOTE_CODE_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_remote_code_names_no_file_of_the_test_suite(path):
    named = [
        f"{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "tests/" in line or "test_" in line.replace("test_time", "")
    ]
    assert named == [], f"{path.name} names test files its Hub copy does not have:\n" + "\n".join(named)


# What an export writes beside each remote-code file: its family's configuration and modeling files (Hyper-SET's too
# for the looped baseline, whose exported head imports them).
SHIPPED_BESIDE = {
    "hyperset": {"hyperset"},
    "hyperbf": {"hyperbf"},
    "imixer": {"imixer"},
    "looped_transformer": {"looped_transformer", "hyperset"},
}


@pytest.mark.parametrize("path", REMOTE_CODE_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_remote_code_names_no_package_file_its_hub_copy_lacks(path):
    """A file of the package named in remote code (`configuration/__init__.py`, another family's files, the
    training code) is one a Hub user does not have, unless the export writes it beside this file."""
    package_files = {
        file.relative_to(ROOT).as_posix()
        for folder in ("configuration", "modeling", "energyformers", "training")
        for file in (ROOT / folder).rglob("*.py")
    }
    stem = path.stem.split("_", 1)[1] if path.parent.name in ("configuration", "modeling") else path.stem
    shipped = {path.name}
    for family in SHIPPED_BESIDE.get(stem, ()):
        shipped |= {f"configuration_{family}.py", f"modeling_{family}.py"}
    named = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for relative in package_files:
            name = relative.rsplit("/", 1)[-1]
            mentioned = relative in line or re.search(rf"(?<![\w/]){re.escape(name)}", line)
            if mentioned and name not in shipped:
                named.append(f"{number}: {relative}: {line.strip()}")
    assert named == [], f"{path.name} names package files its Hub copy does not have:\n" + "\n".join(named)


def test_base_models_take_add_pooling_layer_alike():
    """Every base model (the families' and the looped baseline's) takes `add_pooling_layer` as ViT's and BERT's:
    the same argument in the same place of `__init__`, and the same line in its class docstring."""
    line = "`add_pooling_layer=False` builds it without the pooler, as ViT's and BERT's: `pooler_output` is then None."
    models = [spec.heads["AutoModel"] for spec in {**FAMILIES, **BASELINES}.values()]
    assert len(models) == 4, models
    for model_class in models:
        parameters = list(inspect.signature(model_class.__init__).parameters.values())
        assert [(p.name, p.default) for p in parameters[1:]] == [
            ("config", inspect.Parameter.empty),
            ("add_pooling_layer", True),
        ], f"{model_class.__name__}.__init__{inspect.signature(model_class.__init__)}"
        assert line in " ".join(inspect.getdoc(model_class).split()), (
            f"{model_class.__name__}: docstring line"
        )
