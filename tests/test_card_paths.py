"""A model card is read on the Hub, where nothing of this repository is: the README.md of every exported folder (each
head of each family, the masked-image-modelling heads with their image tokenizer and measured metrics, the
looped-Transformer baseline's), of a training run and of a converted checkpoint names no file of the repository
(`docs/…`, `tests/…`, `model_cards/…`); it states the fact itself. Nor does the code an exported folder ships.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from test_export import CASE_IDS, CASES, MIM_MODELS, build_mim_dir, build_model_dir, single_thread

from energyformers.training.card import conversion_record, render_model_card
from energyformers.training.export import export_model_dir, inspect_model_dir

ROOT = Path(__file__).resolve().parents[1]


def source_folders(root: Path) -> list[str]:
    """`root`'s top-level folders holding .py or .md files, but not those git ignores: a user's run folders
    (`runs/`, the README's `hub/` export) hold model cards and remote code of their own, and a docstring's example
    path into them (`runs/mim`) names no repository file."""
    candidates = sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir()
        and p.name not in (".git", ".venv")
        and not p.name.endswith(".egg-info")
        and any(f.suffix in (".py", ".md") for f in p.rglob("*"))
    )
    try:
        checked = subprocess.run(
            ["git", "-C", str(root), "check-ignore", *candidates], capture_output=True, text=True, check=False
        )
    except FileNotFoundError:  # no git: every candidate counts
        return candidates
    ignored = {Path(line).name for line in checked.stdout.splitlines()}
    return [name for name in candidates if name not in ignored]


# The repository's top-level folders that hold sources or documentation (docs, tests, benchmarks, training,
# model_cards, ...), read from the checkout so a new folder is covered; and its root files other than the LICENSE
# an export carries and the README a card would name as itself.
FOLDERS = source_folders(ROOT)
ROOT_FILES = ("pyproject.toml", "Makefile")
# a folder name followed by "/" that is not part of a longer path or URL (huggingface.co/<namespace>/...)
REPOSITORY_PATH = re.compile(
    r"(?<![\w./-])(?:" + "|".join(re.escape(name) for name in FOLDERS) + r")/[\w./-]*"
    r"|\b(?:" + "|".join(re.escape(name) for name in ROOT_FILES) + r")\b"
)


def test_the_pattern_knows_the_repository_folders():
    """The folders the cards once pointed into are among those checked (the list is read from the checkout)."""
    assert {"docs", "tests", "benchmarks", "training", "model_cards", "modeling"} <= set(FOLDERS), FOLDERS
    text = "see docs/mim.md, (`tests/test_x.py` finds), huggingface.co/docs/x, path/to/a"
    found = REPOSITORY_PATH.findall(text)
    assert found == ["docs/mim.md", "tests/test_x.py"], found


def test_folders_git_ignores_are_not_repository_folders(tmp_path):
    """A run folder `make demo` or the README's export leaves in the checkout (git-ignored) is not the repository's."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("runs/\n/hub/\n")
    for folder in ("docs", "runs/demo", "hub", "assets"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "README.md").write_text("x\n")
    assert source_folders(tmp_path) == ["assets", "docs"], source_folders(tmp_path)


def repository_paths(card: str) -> list[str]:
    """The lines of `card` that name a repository file, with what they name."""
    return [
        f"{number}: {REPOSITORY_PATH.findall(line)} in {line.strip()!r}"
        for number, line in enumerate(card.splitlines(), 1)
        if REPOSITORY_PATH.search(line)
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[str, Path]]:
    """The README.md of every exported folder, and the cards of a run folder and of a converted checkpoint; and the
    exported folders themselves (by the same names), whose code ships beside the card."""
    root = tmp_path_factory.mktemp("card-paths")
    out, folders = {}, {}
    with single_thread():
        for case_id, (model_type, auto_class, input_type, _) in zip(CASE_IDS, CASES):
            model_dir = build_model_dir(root / f"{case_id}-src", model_type, auto_class, input_type)
            folders[f"export {case_id}"] = export_model_dir(model_dir, root / case_id)
            out[f"export {case_id}"] = (folders[f"export {case_id}"] / "README.md").read_text()
            if auto_class == "AutoModelForImageClassification":
                info = inspect_model_dir(model_dir)
                out[f"run {case_id}"] = str(render_model_card(info, remote_code=False))
                record = conversion_record(
                    official_class="Official", repository="https://example.org/official", commit="0" * 40,
                    checkpoint="official.pth", sha256="0" * 64, layout="state_dict", dtype="float32",
                    kwargs={"dim": 16}, notes=["a structure note"], processor="an image processor",
                    extras_file="official_extras.safetensors", extras=["head.bias"], input_description="random images",
                    checks=[("official logits", 1e-7, 1e-5)],
                )  # fmt: skip
                out[f"convert {case_id}"] = str(render_model_card(info, conversion=record))
        # with an image tokenizer and the MIM metrics (their table and its notes)
        for model_type in MIM_MODELS:
            model_dir = build_mim_dir(root / f"{model_type}-mim-src", model_type)
            folder = export_model_dir(model_dir, root / f"{model_type}-mim", repo_id=f"org/{model_type}-mim")
            out[f"export {model_type}-mim"] = (folder / "README.md").read_text()
            folders[f"export {model_type}-mim"] = folder
    return out, folders


@pytest.fixture(scope="module")
def cards(built: tuple[dict[str, str], dict[str, Path]]) -> dict[str, str]:
    return built[0]


def test_cards_name_no_repository_file(cards):
    """No card points to `docs/`, `tests/`, `model_cards/` or any other file of the repository."""
    assert len(cards) == len(CASES) + 2 * sum(c[1] == "AutoModelForImageClassification" for c in CASES) + 2
    # the MIM table's notes were rendered
    assert all("the tokenizer's own bound" in cards[f"export {m}-mim"] for m in MIM_MODELS), MIM_MODELS
    found = {name: paths for name, card in cards.items() if (paths := repository_paths(card))}
    assert not found, "\n".join(f"{name}:\n  " + "\n  ".join(paths) for name, paths in found.items())


def test_shipped_code_names_no_repository_file(built):
    """The code an export ships (configuration, modeling, the MIM heads' pipeline and tokenizer files) is read
    on the Hub too, without this repository: its comments and docstrings name no file of it either."""
    folders = built[1]
    assert len(folders) == len(CASES) + len(MIM_MODELS), sorted(folders)
    code = {
        f"{name}/{path.name}": path.read_text()
        for name, folder in folders.items()
        for path in folder.glob("*.py")
    }
    # each folder ships its modeling file; the MIM folders their pipeline file as well
    assert all(any(key.startswith(f"{name}/modeling_") for key in code) for name in folders), sorted(code)
    assert any(key.endswith("/pipeline_mim.py") for key in code), sorted(code)
    found = {name: paths for name, text in code.items() if (paths := repository_paths(text))}
    assert not found, "\n".join(f"{name}:\n  " + "\n  ".join(paths) for name, paths in found.items())


def test_only_classification_cards_describe_deep_supervision(cards):
    """Deep supervision is a classification heads' training option (the masked-image-modelling heads refuse it), so
    only their cards explain it (the config table still lists the field's value, `"last"`, on every card)."""
    # the Hyper-SET classification cards explain it; the MIM cards (Hyper-SET's and the looped baseline's) and the
    # families without recurrent depth (iMixer, HyperBF) do not
    wrong = {
        name: said
        for name, card in cards.items()
        if (said := "loss on several iterations" in card)
        != ("hyperset" in name and not name.endswith("-mim") and "MaskedImageModeling" not in name)
    }
    assert not wrong, (
        f"cards that describe deep supervision (True) or do not (False) against their head: {wrong}"
    )
