"""Hub remote code: the flat `configuration_<stem>.py` + `modeling_<stem>.py` of a model, and `auto_map`.

Generated from the package sources by rewriting each modeling file's single `from ..configuration.configuration_<stem>
import <Arch>Config` line to a same-folder import. A model whose files import a sibling module of the package (the
looped-Transformer baseline builds on Hyper-SET's embeddings, loss and decoding: `from .modeling_hyperset import ...`,
`from .configuration_hyperset import ...`) carries those files too, rewritten the same way, so the same-folder imports
resolve in the flat folder. Anything else that would not import without the package (other relative imports,
`energyformers`, third-party modules beyond torch/transformers) is refused, checked on the parsed source.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

from ..tokenizer_fit import MIM_AUTO_CLASS, MIM_TASK

ALLOWED_TOP_LEVEL = frozenset(sys.stdlib_module_names) | {"torch", "transformers"}

# The package's license, written beside the remote code it copies: Apache-2.0 §4(a) asks that a redistribution of
# the work give its recipients a copy of the license.
LICENSE_FILE = "LICENSE"


def license_text() -> str:
    """The package's LICENSE text: from the source checkout (an editable install, a clone) or from the installed
    distribution's metadata (a wheel keeps it in `*.dist-info/licenses/`). FileNotFoundError when neither has it."""
    import importlib.metadata

    checkout = Path(__file__).resolve().parents[1] / LICENSE_FILE
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    try:
        files = importlib.metadata.distribution("energyformers").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == LICENSE_FILE and Path(file.locate()).is_file():
            return Path(file.locate()).read_text(encoding="utf-8")
    raise FileNotFoundError(
        "the energyformers package's LICENSE file is neither in its source folder nor in its installed metadata; "
        "reinstall the package"
    )


def exportable_models() -> dict:
    """model_type -> `Family` of everything whose code can be exported: the families and the package's own
    baselines (whether a baseline's folder may be exported is `export.inspect_model_dir`'s decision)."""
    import energyformers

    return {**energyformers.FAMILIES, **getattr(energyformers, "BASELINES", {})}


def _read_source(package: str, name: str) -> str:
    module = ".".join(part for part in ("energyformers", package, name) if part)
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"cannot find the source of {module}")
    return Path(spec.origin).read_text(encoding="utf-8")


def _sibling_imports(filename: str, source: str) -> set[str]:
    """The package modules `filename` imports from its own package (`from .configuration_x import ...` in a
    configuration file, `from .modeling_x import ...` in a modeling file): the other files the flat folder needs."""
    prefix = filename.split("_", 1)[0] + "_"
    return {
        f"{node.module}.py"
        for node in ast.walk(ast.parse(source, filename=filename))
        if isinstance(node, ast.ImportFrom)
        and node.level == 1
        and node.module
        and node.module.startswith(prefix)
        and f"{node.module}.py" != filename
    }


def remote_code_sources(model_type: str) -> dict[str, str]:
    """{filename: source} of the flat remote code of a registered model, validated with `check_remote_code`:
    its configuration and modeling files and the package files they import (transitively)."""
    models = exportable_models()
    if model_type not in models:
        raise ValueError(f"unknown model_type={model_type!r}; registered models: {sorted(models)}")
    stem = models[model_type].stem
    config_classes = {family.stem: family.config_class.__name__ for family in models.values()}
    sources: dict[str, str] = {}
    pending = [f"configuration_{stem}.py", f"modeling_{stem}.py"]
    while pending:
        filename = pending.pop()
        if filename in sources:
            continue
        package = filename.split("_", 1)[0]
        sources[filename] = _read_source(package, filename.removesuffix(".py"))
        pending += sorted(_sibling_imports(filename, sources[filename]) - set(sources))
        if package == "modeling":  # a modeling file's config comes with it
            pending.append(f"configuration_{filename.removeprefix('modeling_')}")
    dependencies = {
        other: config_classes[other]
        for name in sources
        if name.startswith("modeling_") and (other := name.removeprefix("modeling_")[:-3]) != stem
    }
    return generate_remote_code(sources, stem, config_classes[stem], dependencies)


def generate_remote_code(
    sources: dict[str, str], stem: str, config_class: str, dependencies: dict[str, str] | None = None
) -> dict[str, str]:
    """Rewrite each modeling file's one package import of its config to a same-folder import, then check.

    `stem` / `config_class` name the exported model; `dependencies` ({stem: config class}) the other models whose
    files `sources` carries because the model's files import them.
    """
    config_classes = {stem: config_class, **(dependencies or {})}
    sources = dict(sources)
    for own, own_config in config_classes.items():
        modeling_name = f"modeling_{own}.py"
        if modeling_name not in sources:
            raise ValueError(f"remote code for {stem!r} needs {modeling_name}; got {sorted(sources)}")
        package_line = f"from ..configuration.configuration_{own} import {own_config}"
        lines = sources[modeling_name].splitlines(keepends=True)
        hits = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == package_line]
        if len(hits) != 1:
            raise ValueError(
                f"{modeling_name} must contain the line {package_line!r} exactly once at top level "
                f"(found {len(hits)}); it is the only import the Hub export rewrites."
            )
        lines[hits[0]] = f"from .configuration_{own} import {own_config}\n"
        sources[modeling_name] = "".join(lines)
    check_remote_code(sources, stem, config_class, dependencies)
    return sources


def check_remote_code(
    sources: dict[str, str], stem: str, config_class: str, dependencies: dict[str, str] | None = None
) -> None:
    """Raise ValueError unless the files import only stdlib, torch, transformers and each other: a modeling file
    its own config (`from .configuration_<stem> import <Config>`) and the other modeling files carried, a
    configuration file the other configuration files carried."""
    config_classes = {stem: config_class, **(dependencies or {})}
    for filename, source in sources.items():
        tree = ast.parse(source, filename=filename)
        optional = _optional_package_imports(tree)
        package = filename.split("_", 1)[0]
        own = filename.removeprefix(f"{package}_").removesuffix(".py")
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                names = [alias.name for alias in node.names]
                sibling = f"{node.module}.py" in sources and node.module.startswith(f"{package}_")
                own_config = (
                    package == "modeling"
                    and own in config_classes
                    and node.module == f"configuration_{own}"
                    and names == [config_classes[own]]
                )
                if node.level != 1 or not node.module or not (own_config or (sibling and "*" not in names)):
                    allowed = (
                        f"`from .configuration_{own} import {config_classes[own]}`"
                        if package == "modeling" and own in config_classes
                        else "none"
                    )
                    raise ValueError(
                        f"{filename}: relative import `from {'.' * node.level}{node.module or ''} import "
                        f"{', '.join(names)}` (line {node.lineno}) would not load from the Hub; "
                        f"only {allowed} and imports of the other {package} files exported with it "
                        f"({sorted(n for n in sources if n.startswith(package + '_') and n != filename)}) are "
                        "allowed in remote code."
                    )
                continue
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            elif (
                isinstance(node, ast.Call)
                and (
                    getattr(node.func, "attr", None) == "import_module"
                    or getattr(node.func, "id", None) == "__import__"
                )
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                modules = [node.args[0].value]  # dynamic import of a literal name: the same rules apply
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top == "energyformers":
                    raise ValueError(
                        f"{filename}: imports {module!r} (line {node.lineno}); remote code must work without "
                        "energyformers installed."
                    )
                if top not in ALLOWED_TOP_LEVEL:
                    raise ValueError(
                        f"{filename}: imports {module!r} (line {node.lineno}); remote code may import only the "
                        "standard library, torch and transformers."
                    )


# Package modules remote code may try to import, inside `try: ... except ImportError:` (transformers' own import
# check skips try blocks too), to offer more where the package is installed: the configs' presets.
OPTIONAL_PACKAGE_MODULES = frozenset({"energyformers.presets"})


def _optional_package_imports(tree: ast.AST) -> set[int]:
    """ids of the `from energyformers.presets import ...` nodes guarded by an `except ImportError` handler."""
    guarded = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        names = {getattr(handler.type, "id", None) for handler in node.handlers if handler.type is not None}
        if not names & {"ImportError", "ModuleNotFoundError"}:
            continue
        for statement in node.body:
            if isinstance(statement, ast.ImportFrom) and statement.module in OPTIONAL_PACKAGE_MODULES:
                guarded.add(id(statement))
    return guarded


def auto_map(model_type: str) -> dict[str, str]:
    """`config.auto_map` for every Auto class the model registers, pointing at the flat remote code."""
    family = exportable_models()[model_type]
    return {
        auto: f"{'configuration' if auto == 'AutoConfig' else 'modeling'}_{family.stem}.{name}"
        for auto, name in family.auto_map.items()
    }


__all__ = [
    "ALLOWED_TOP_LEVEL",
    "OPTIONAL_PACKAGE_MODULES",
    "auto_map",
    "check_remote_code",
    "exportable_models",
    "generate_remote_code",
    "remote_code_sources",
]


# ------------------------------------------------------------------------ masked-image-modelling pipeline
# transformers has no masked-image-modelling task; a MIM folder names its pipeline in config.json's
# `custom_pipelines`, which `transformers.pipeline(task, model=folder, trust_remote_code=True)` loads from the folder.
# The module is cut from the package's own sources: `MaskedImageModelingPipeline` from energyformers/pipelines.py
# and, as the same-folder `mim.py` its `from .mim import ...` lines name, the definitions of energyformers/mim.py it
# needs (transitively).
MIM_PIPELINE_CLASS = "MaskedImageModelingPipeline"
MIM_PIPELINE_FILE = "pipeline_mim.py"
MIM_TOKENIZER_FILE = "mim.py"
# Methods left out of the folder's mim.py, and why: neither is used by the pipeline, and each needs more than
# remote code may import (transformers' own import check would demand scikit-learn of every user).
MIM_OMITTED_METHODS = {
    ("PatchKMeansTokenizer", "fit"): "fitting a codebook needs scikit-learn",
    ("VQGANTokenizer", "from_taming"): "converting a taming checkpoint needs energyformers.training",
}
# What the pipeline files may import: at top level what every transformers user has; inside functions also
# transformers' own dependencies and torchmetrics (the reconstruction's PSNR/SSIM: transformers names it when it is
# missing); anything else only inside a `try` block, which transformers' import check skips (the code handles the
# failure: `except ImportError` or a message naming the package).
PIPELINE_TOP_LEVEL = ALLOWED_TOP_LEVEL | {"numpy", "PIL"}
PIPELINE_LAZY = PIPELINE_TOP_LEVEL | {"safetensors", "huggingface_hub", "torchmetrics"}
# transformers finds the files a remote module needs with this pattern over its text (docstrings included)
_RELATIVE_IMPORT_LINE = re.compile(r"^\s*from\s+\.(\S+)\s+import", flags=re.MULTILINE)


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {
        name.id
        for target in targets
        if target is not None
        for name in ast.walk(target)
        if isinstance(name, ast.Name)
    }


def _statement_lines(lines: list[str], node: ast.stmt) -> tuple[int, int]:
    """[start, end) of a top-level statement's lines: its decorators and the comment lines right above it."""
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    return start, node.end_lineno


def extract_definitions(
    source: str, filename: str, roots: set[str], omit: dict[tuple[str, str], str] | None = None
) -> str:
    """The top-level statements of `source` that define `roots` and everything they use (transitively), in their
    order and byte for byte, after a `from __future__` line; methods named in `omit` ({(class, method): why}) cut.
    Raises ValueError for a root `source` does not define."""
    tree = ast.parse(source, filename=filename)
    lines = source.splitlines(keepends=True)
    statements = [node for node in tree.body if not isinstance(node, ast.Expr)]  # the docstring and calls
    binders = {name: node for node in statements for name in _bound_names(node)}
    missing = sorted(roots - set(binders))
    if missing:
        raise ValueError(f"{filename} defines no {missing}; the remote pipeline needs them.")
    omit = dict(omit or {})
    needed, pending = set(), sorted(roots)
    while pending:
        node = binders[pending.pop()]
        if id(node) in needed:
            continue
        needed.add(id(node))
        cut = {
            id(m)
            for m in getattr(node, "body", [])
            if (getattr(node, "name", None), getattr(m, "name", None)) in omit
        }
        used = {
            n.id
            for part in ([node] if not cut else [m for m in node.body if id(m) not in cut] + node.bases)
            for n in ast.walk(part)
            if isinstance(n, ast.Name)
        }
        pending += sorted(name for name in used & set(binders) if id(binders[name]) not in needed)
    chunks = []
    for node in statements:
        if id(node) not in needed or (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            continue
        start, end = _statement_lines(lines, node)
        text = lines[start:end]
        for method in getattr(node, "body", []):
            if (getattr(node, "name", None), getattr(method, "name", None)) in omit:
                m_start, m_end = _statement_lines(lines, method)
                while m_end < len(lines) and not lines[m_end].strip():  # the blank line after it
                    m_end += 1
                text[m_start - start : m_end - start] = [""] * (m_end - m_start)
                del omit[(node.name, method.name)]
        chunks.append("".join(text))
    if omit:
        raise ValueError(f"{filename}: methods to leave out not found: {sorted(omit)}")
    imports = [c for c in chunks if c.startswith(("import ", "from "))]
    rest = [c for c in chunks if not c.startswith(("import ", "from "))]
    return "from __future__ import annotations\n\n" + "".join(imports) + "\n\n" + "\n\n".join(rest)


def _inline_package_imports(source: str, filename: str) -> str:
    """`source` with each `from .module import ...` line replaced by that package module's statements (less its
    docstring and `from __future__` line), so that what `source` takes from a sibling module (mim.py's
    `tokenizer_fit` names) travels inside the one generated file instead of naming a file the folder lacks."""
    lines = source.splitlines(keepends=True)
    for node in reversed(ast.parse(source, filename=filename).body):  # from the end: line numbers stay valid
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            module_source = _read_source("", node.module)
            body = [
                ast.get_source_segment(module_source, statement) + "\n"
                for statement in ast.parse(module_source).body
                if not isinstance(statement, ast.Expr)  # the docstring
                and not (isinstance(statement, ast.ImportFrom) and statement.module == "__future__")
            ]
            lines[node.lineno - 1 : node.end_lineno] = ["\n\n".join(body)]
    return "".join(lines)


def mim_pipeline_sources() -> dict[str, str]:
    """{filename: source} of the masked-image-modelling pipeline a MIM folder carries (`MIM_PIPELINE_FILE` and the
    `MIM_TOKENIZER_FILE` it imports), cut from the package sources and checked with `check_pipeline_code`."""
    header = (
        '"""{what}, generated by `energyformers export` from the energyformers package\'s {origin}\n'
        "(the definitions it needs, unchanged), so that a folder or Hub repo loads it with\n"
        '`transformers.pipeline("{task}", model=..., trust_remote_code=True)` without the package."""\n\n'
    )
    pipeline_source = _read_source("", "pipelines")
    pipeline = extract_definitions(pipeline_source, "energyformers/pipelines.py", {MIM_PIPELINE_CLASS})
    stem = MIM_TOKENIZER_FILE.removesuffix(".py")
    wanted = {
        alias.name
        for node in ast.walk(ast.parse(pipeline))
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module == stem
        for alias in node.names
    }
    tokenizer = extract_definitions(
        _inline_package_imports(_read_source("", "mim"), "energyformers/mim.py"),
        "energyformers/mim.py",
        wanted,
        omit=MIM_OMITTED_METHODS,
    )
    sources = {
        MIM_PIPELINE_FILE: header.format(
            what="The masked-image-modelling pipeline", origin="pipelines.py", task=MIM_TASK
        )
        + pipeline,
        MIM_TOKENIZER_FILE: header.format(
            what="Image tokenizers, masking and metrics of the masked-image-modelling pipeline",
            origin="mim.py and tokenizer_fit.py",
            task=MIM_TASK,
        )
        + tokenizer,
    }
    check_pipeline_code(sources)
    return sources


def check_pipeline_code(sources: dict[str, str]) -> None:
    """Raise ValueError unless the pipeline files load without the package: relative imports only of names another
    of the files defines, nothing of `energyformers`, at top level only `PIPELINE_TOP_LEVEL`, inside functions only
    `PIPELINE_LAZY`, anything else only inside a `try` block."""
    defined = {
        filename.removesuffix(".py"): {n for node in ast.parse(source).body for n in _bound_names(node)}
        for filename, source in sources.items()
    }
    for filename, source in sources.items():
        for match in _RELATIVE_IMPORT_LINE.finditer(source):
            if match.group(1) not in defined:
                raise ValueError(
                    f"{filename}: the line {match.group(0).strip()!r} makes transformers look for "
                    f"{match.group(1)}.py, which the folder does not carry ({sorted(sources)})."
                )
        tree = ast.parse(source, filename=filename)
        guarded = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.Try)
            for statement in node.body
            for inner in ast.walk(statement)
        }
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                names = {alias.name for alias in node.names}
                unknown = sorted(names - defined.get(node.module or "", set()))
                if node.level != 1 or node.module not in defined or unknown:
                    raise ValueError(
                        f"{filename}: `from {'.' * node.level}{node.module or ''} import {', '.join(sorted(names))}` "
                        f"(line {node.lineno}) imports what the folder's files {sorted(sources)} do not define."
                    )
                continue
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                top = module.split(".")[0]
                allowed = PIPELINE_TOP_LEVEL if id(node) in top_level else PIPELINE_LAZY
                if top == "energyformers" or (id(node) not in guarded and top not in allowed):
                    where = "at top level" if id(node) in top_level else "inside a function"
                    raise ValueError(
                        f"{filename}: imports {module!r} (line {node.lineno}) {where}; the remote pipeline may "
                        f"import {sorted(allowed - set(sys.stdlib_module_names))} and the standard library there, "
                        "other packages only inside a `try` block, and never energyformers."
                    )


def custom_pipelines() -> dict[str, dict]:
    """config.json's `custom_pipelines` of a MIM folder: the task, the folder's pipeline class, its Auto class."""
    return {
        MIM_TASK: {
            "impl": f"{MIM_PIPELINE_FILE.removesuffix('.py')}.{MIM_PIPELINE_CLASS}",
            "pt": [MIM_AUTO_CLASS],
            "type": "image",
        }
    }


__all__ += [
    "MIM_PIPELINE_FILE",
    "MIM_TOKENIZER_FILE",
    "check_pipeline_code",
    "custom_pipelines",
    "extract_definitions",
    "mim_pipeline_sources",
]


def write_folder_code(config: Any, folder: str | os.PathLike) -> list[Path]:
    """Write the remote code an exported folder carries into `folder`, for `config` being saved there (the package's
    `RecurrentDepthConfig.save_pretrained` calls it when the config has `auto_map`, i.e. was read from an export):
    the family's configuration and modeling files with the package's LICENSE (unless the folder has a LICENSE of its
    own), and when the config's stored `custom_pipelines` names the
    masked-image-modelling pipeline, that pipeline's files too. `auto_map` and that entry are set to what the
    written files define, as `export` writes them. Returns the paths written.

    This is what transformers' `custom_object_save` does for a class loaded as remote code; the package's classes
    are not remote code, so a folder loaded with the package and saved again would otherwise name files it lacks."""
    stored = dict(config.to_dict().get("custom_pipelines") or {})
    sources = remote_code_sources(config.model_type)  # refuses before anything is written
    if MIM_TASK in stored:
        sources.update(mim_pipeline_sources())
        stored.update(custom_pipelines())
        config.custom_pipelines = stored
    config.auto_map = auto_map(config.model_type)
    if not (Path(folder) / LICENSE_FILE).exists():  # a license of the folder's own (its weights') is kept
        sources[LICENSE_FILE] = license_text()
    os.makedirs(folder, exist_ok=True)
    written = []
    for name, source in sources.items():
        path = Path(folder) / name
        path.write_text(source, encoding="utf-8")
        written.append(path)
    return written


__all__ += ["LICENSE_FILE", "license_text", "write_folder_code"]
