"""The masked-image-modelling task ("masked-image-modeling") and its heads' Auto class are spelled once, in
`energyformers.tokenizer_fit` (torch-free, so the training CLI's argument checks import them before torch loads);
the registry, the pipeline registration, the training CLI, export, the model card and the release tools import them.
The folders an export copies (modeling/, configuration/, the pipeline cut from energyformers/pipelines.py) import
nothing of the package; they do not need either name."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from energyformers.tokenizer_fit import MIM_AUTO_CLASS, MIM_TASK

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("energyformers", "training", "configuration", "modeling")
HOME = "energyformers/tokenizer_fit.py"
# The per-family tables of the Auto classes each model registers with: every head is named there among the others
# (tests/test_new_user.py keeps the two equal), which is a table of Auto classes, not a second definition.
AUTO_HEAD_TABLES = ("energyformers/registry.py", "energyformers/auto_registration.py")


def _constants(value: str) -> list[tuple[str, int, ast.AST]]:
    """(file, line, parent node) of every string constant equal to `value` in the package's sources; docstrings and
    messages that mention it are longer strings, so only the name itself counts."""
    found = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for parent in ast.walk(tree):
                for node in ast.iter_child_nodes(parent):
                    if isinstance(node, ast.Constant) and node.value == value:
                        found.append((str(path.relative_to(ROOT)), node.lineno, parent))
    return found


def test_the_task_is_a_literal_in_one_module_only():
    spelled = sorted(f"{path}:{line}" for path, line, _ in _constants(MIM_TASK))
    assert len(spelled) == 1 and spelled[0].startswith(f"{HOME}:"), spelled


def test_the_auto_class_is_defined_in_one_module_only():
    found = _constants(MIM_AUTO_CLASS)
    # a module-level name bound to the string is a definition; one only, in the torch-free home
    definitions = sorted(f"{path}:{line}" for path, line, parent in found if isinstance(parent, ast.Assign))
    assert len(definitions) == 1 and definitions[0].startswith(f"{HOME}:"), definitions
    elsewhere = sorted(f"{path}:{line}" for path, line, _ in found if path not in (HOME, *AUTO_HEAD_TABLES))
    assert not elsewhere, f"spell it as tokenizer_fit.MIM_AUTO_CLASS: {elsewhere}"


def test_argument_parsing_reads_the_task_without_torch():
    # `energyformers.training.arguments` takes `--task masked-image-modeling` (and the recipes' task) while it
    # parses, before torch loads
    program = (
        "import sys\n"
        "from energyformers.training import arguments, recipes\n"
        "from energyformers.tokenizer_fit import MIM_TASK\n"
        "print(arguments.MIM_TASK == MIM_TASK, recipes.RECIPE_TASKS['hyperset-mim'][0] == MIM_TASK,"
        " 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "False"], done.stdout
