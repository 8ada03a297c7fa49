"""The file names of a saved image tokenizer (its settings and its codebook) are spelled once, in
`energyformers.tokenizer_fit` (torch-free, so the argument checks import them before torch loads); every other
module imports those constants."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from energyformers.tokenizer_fit import TOKENIZER_CONFIG_NAME, TOKENIZER_WEIGHTS_NAME

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("energyformers", "training", "configuration", "modeling")


@pytest.mark.parametrize("name", [TOKENIZER_CONFIG_NAME, TOKENIZER_WEIGHTS_NAME])
def test_the_file_name_is_a_literal_in_one_module_only(name: str):
    # string constants equal to the name, not prose that mentions it (docstrings and messages hold longer strings)
    spelled = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for folder in PACKAGE_FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value == name
    )
    assert len(spelled) == 1 and spelled[0].startswith("energyformers/tokenizer_fit.py:"), spelled


def test_argument_parsing_reads_it_without_torch():
    # `energyformers.training.arguments` checks a given tokenizer folder while it parses: no torch at that point
    program = (
        "import sys\n"
        "from energyformers.training import arguments\n"
        "from energyformers.tokenizer_fit import TOKENIZER_CONFIG_NAME\n"
        "print(arguments.TOKENIZER_CONFIG_NAME is TOKENIZER_CONFIG_NAME, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"], done.stdout
