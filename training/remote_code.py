"""Hub remote code: the flat `configuration_<stem>.py` + `modeling_<stem>.py` of a family, and `auto_map`.

Generated from the package sources by rewriting the single `from ..configuration.configuration_<stem> import
<Arch>Config` line of the modeling file to a same-folder import. Anything else that would not import without the
package (other relative imports, `energyformers`, third-party modules beyond torch/transformers) is refused,
checked on the parsed source.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ALLOWED_TOP_LEVEL = frozenset(sys.stdlib_module_names) | {"torch", "transformers"}


def remote_code_sources(model_type: str) -> dict[str, str]:
    """{filename: source} of the flat remote code for a registered family, validated with `check_remote_code`."""
    from energyformers import FAMILIES

    if model_type not in FAMILIES:
        raise ValueError(f"unknown model_type={model_type!r}; registered families: {sorted(FAMILIES)}")
    stem = FAMILIES[model_type].stem
    config_class = FAMILIES[model_type].config_class.__name__
    sources = {}
    for package, name in (("configuration", f"configuration_{stem}"), ("modeling", f"modeling_{stem}")):
        spec = importlib.util.find_spec(f"energyformers.{package}.{name}")
        if spec is None or spec.origin is None:
            raise ValueError(f"cannot find the source of energyformers.{package}.{name}")
        sources[f"{name}.py"] = Path(spec.origin).read_text(encoding="utf-8")

    return generate_remote_code(sources, stem, config_class)


def generate_remote_code(sources: dict[str, str], stem: str, config_class: str) -> dict[str, str]:
    """Rewrite the modeling file's one package import of its config to a same-folder import, then check."""
    modeling_name = f"modeling_{stem}.py"
    package_line = f"from ..configuration.configuration_{stem} import {config_class}"
    lines = sources[modeling_name].splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == package_line]
    if len(hits) != 1:
        raise ValueError(
            f"{modeling_name} must contain the line {package_line!r} exactly once at top level "
            f"(found {len(hits)}); it is the only import the Hub export rewrites."
        )
    lines[hits[0]] = f"from .configuration_{stem} import {config_class}\n"
    sources = {**sources, modeling_name: "".join(lines)}
    check_remote_code(sources, stem, config_class)
    return sources


def check_remote_code(sources: dict[str, str], stem: str, config_class: str) -> None:
    """Raise ValueError unless the files import only stdlib, torch, transformers and the sibling config."""
    sibling = f"configuration_{stem}"
    for filename, source in sources.items():
        tree = ast.parse(source, filename=filename)
        optional = _optional_package_imports(tree)
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                allowed = filename == f"modeling_{stem}.py" and node.level == 1 and node.module == sibling
                if not allowed or [alias.name for alias in node.names] != [config_class]:
                    raise ValueError(
                        f"{filename}: relative import `from {'.' * node.level}{node.module or ''} import "
                        f"{', '.join(a.name for a in node.names)}` (line {node.lineno}) would not load from the Hub; "
                        f"only `from .{sibling} import {config_class}` is allowed in remote code."
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
    """`config.auto_map` for every Auto class the family registers, pointing at the flat remote code."""
    from energyformers import FAMILIES

    family = FAMILIES[model_type]
    return {
        auto: f"{'configuration' if auto == 'AutoConfig' else 'modeling'}_{family.stem}.{name}"
        for auto, name in family.auto_map.items()
    }


__all__ = [
    "ALLOWED_TOP_LEVEL",
    "OPTIONAL_PACKAGE_MODULES",
    "auto_map",
    "check_remote_code",
    "generate_remote_code",
    "remote_code_sources",
]
