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
import sys
from pathlib import Path

ALLOWED_TOP_LEVEL = frozenset(sys.stdlib_module_names) | {"torch", "transformers"}
PACKAGES = ("configuration", "modeling")


def exportable_models() -> dict:
    """model_type -> `Family` of everything whose code can be exported: the families and the package's own
    baselines (whether a baseline's folder may be exported is `export.inspect_model_dir`'s decision)."""
    import energyformers

    return {**energyformers.FAMILIES, **getattr(energyformers, "BASELINES", {})}


def _read_source(package: str, name: str) -> str:
    spec = importlib.util.find_spec(f"energyformers.{package}.{name}")
    if spec is None or spec.origin is None:
        raise ValueError(f"cannot find the source of energyformers.{package}.{name}")
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
