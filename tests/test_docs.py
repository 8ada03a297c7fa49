"""The documentation works as written.

* Every ```python block of README.md and docs/*.md whose first line is `# runnable` runs, in a fresh process, against
  a tiny Hyper-SET image classifier saved where the examples say `runs/demo-hyperset` (the folder `make demo`
  writes). Blocks without that line are illustrative (they name files or checkpoints a test cannot have).
* Every relative link and every repository path in the shipped Markdown resolves to a file of the repository, and no
  shipped file (Markdown, package code, CI scripts) points to material a user does not have.
* README.md stays a getting-started page.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from fixtures import hyperset_config, run_at_once

from energyformers import (
    HyperSetConfig,
    HyperSetForImageClassification,
    HyperSetForTokenClassification,
    LoopedTransformerConfig,
    LoopedTransformerForTokenClassification,
)
from energyformers.training.processing import build_image_processor

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
CARDS = sorted((ROOT / "model_cards").glob("*.md"))
# What an installed package or a clone gives a user: the Markdown above, the package's code and the CI scripts.
SHIPPED_CODE = sorted(
    [
        *(
            path
            for folder in ("energyformers", "modeling", "configuration", "training")
            for path in (ROOT / folder).rglob("*.py")
        ),
        *(path for path in (ROOT / ".ci").iterdir() if path.is_file()),
    ]
)
RUNNABLE = "# runnable"
DEMO_FOLDER = "runs/demo-hyperset"
README_LINE_LIMIT = 250

# Files that exist only where this package is developed, never in a clone or an install.
NOT_SHIPPED = re.compile(
    r"ARCHITECTURE\.md|specs?/|shared/"
    # a design note named bare (the family names are shipped as docs/<family>.md and model_cards/<family>.md)
    r"|(?<![\w/.-])(?<!\]\()(?:kernels|recurrent-depth|hf-v5-notes|data|recipes|mim|deep-supervision|checkpoints|hyperset"
    r"|imixer|hyperbf)\.md"
)
# Remote code (modeling/ and configuration/, what a Hub repository carries beside the weights) has neither the
# repository's other folders nor its Markdown: a path into them, or a `.md` file, points a Hub user nowhere. The
# marker lines of the blocks kept identical across files name the test that keeps them so; they are exempt.
REMOTE_CODE = ("modeling", "configuration")
NOT_IN_REMOTE_CODE = re.compile(
    r"(?<![\w./-])(?:benchmarks|docs|model_cards|tests|training|\.ci)/[\w./-]*|[\w-]+\.md\b"
)
BLOCK_MARKER = re.compile(r"^# --- .*\(tests/test_\w+\.py checks\) ---$")
# Development history has no place in what users read: state what is.
HISTORY = re.compile(
    r"previous release|earlier release|previous session|\bissue \d+|was withdrawn", re.IGNORECASE
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A path in backticks that starts at a top-level folder of the repository, e.g. `benchmarks/results/speed.md`.
TOP_LEVEL = (
    "benchmarks",
    "configuration",
    "docs",
    "energyformers",
    "model_cards",
    "modeling",
    "tests",
    "training",
)
REPO_PATH = re.compile(r"`((?:" + "|".join(TOP_LEVEL) + r")/[\w./-]*)`")


def python_blocks(path: Path) -> list[str]:
    return re.findall(
        r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL
    )


def runnable_blocks() -> list[tuple[str, str]]:
    return [
        (f"{path.relative_to(ROOT)}#{index}", block)
        for path in DOCS
        for index, block in enumerate(python_blocks(path))
        if block.startswith(RUNNABLE)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny trained-looking Hyper-SET digits classifier saved as `make demo` saves one (model + image processor)."""
    torch.manual_seed(0)
    config = hyperset_config("image", num_channels=3, num_labels=10, num_iterations=2)
    config.id2label = {i: str(i) for i in range(10)}
    config.label2id = {str(i): i for i in range(10)}
    folder = tmp_path_factory.mktemp("docs") / "demo-hyperset"
    HyperSetForImageClassification(config).eval().save_pretrained(folder)
    build_image_processor(config).save_pretrained(folder)
    return folder


def test_the_readme_has_a_runnable_example_with_test_time_depth():
    readme_blocks = [block for name, block in runnable_blocks() if name.startswith("README.md")]
    assert readme_blocks, f"README.md has no ```python block starting with {RUNNABLE!r}"
    assert any("num_iterations=" in block and "halting_tolerance=" in block for block in readme_blocks), (
        "the README's runnable example no longer shows test-time depth (num_iterations, halting_tolerance)"
    )


@pytest.fixture(scope="module")
def block_runs(demo_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """name -> (code run, finished process) of every runnable block, each in a fresh interpreter (in this one other
    tests have already imported submodules a reader's process has not) in a folder of its own, run at once.

    Each block also gets a TMPDIR of its own under pytest's temporary folder, so whatever a block leaves in its
    temporary directory (a `tempfile` folder, torch's or transformers' caches) is pytest's to clean, never the
    caller's TMPDIR's."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    codes = {name: block.replace(DEMO_FOLDER, demo_folder.as_posix()) for name, block in runnable_blocks()}
    commands = {}
    for name, code in codes.items():
        folder = tmp_path_factory.mktemp("block")
        temporary = folder / "tmp"
        temporary.mkdir()
        commands[name] = dict(
            args=[sys.executable, "-c", code], cwd=folder, env={**env, "TMPDIR": temporary.as_posix()}
        )
    done = run_at_once(commands, timeout=300)
    return {name: (codes[name], done[name]) for name in codes}


@pytest.mark.parametrize("name", [name for name, _ in runnable_blocks()])
def test_runnable_block_runs_as_written(name, block_runs):
    code, result = block_runs[name]
    assert result.returncode == 0, f"{name} failed:\n{code}\n--- stderr ---\n{result.stderr[-4000:]}"


def test_relative_links_and_repository_paths_resolve():
    dead = []
    # model_cards/card.md is the Jinja template of a checkpoint's card: its links point into that checkpoint's folder.
    for path in [*DOCS, *(card for card in CARDS if card.name != "card.md")]:
        text = path.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            if not resolved.exists():
                dead.append(f"{path.relative_to(ROOT)}: link {target}")
            elif anchor and resolved.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", resolved.read_text(encoding="utf-8"), flags=re.MULTILINE)
                if anchor not in {slug(heading) for heading in headings}:
                    dead.append(f"{path.relative_to(ROOT)}: link {target} (no such heading)")
        for repo_path in REPO_PATH.findall(text):
            if not any(char in repo_path for char in "<*{") and not (ROOT / repo_path).exists():
                dead.append(f"{path.relative_to(ROOT)}: path `{repo_path}`")
    assert not dead, "dead links or paths:\n" + "\n".join(dead)


def local_links(path: Path) -> list[Path]:
    """The files a Markdown file links to (images included), web links and in-page anchors left out."""
    targets = (target.partition("#")[0] for target in LINK.findall(path.read_text(encoding="utf-8")))
    return [
        (path.parent / target).resolve() for target in targets if target and not re.match(r"[a-z]+:", target)
    ]


def test_every_result_file_is_reached_from_the_benchmarks_page():
    """A reader of docs/benchmarks.md finds every file under benchmarks/results/: linked there, or linked from a
    result page linked there (a page's plots, a run record it names)."""
    results = RESULTS.resolve()
    reached, pages = set(), [ROOT / "docs" / "benchmarks.md"]
    while pages:
        for target in local_links(pages.pop()):
            if target.parent == results and target not in reached:
                reached.add(target)
                if target.suffix == ".md" and target.is_file():
                    pages.append(target)
    unreached = sorted(path.name for path in results.iterdir() if path.resolve() not in reached)
    assert not unreached, f"result files no link from docs/benchmarks.md reaches: {unreached}"


def records_its_run(stem: str) -> bool:
    """Whether a result's header records the run as benchmarks/provenance.py writes it: a result page's every
    `Run:` line names a commit and no `Command:` is unrecorded; a result with no page, a JSON `run` with the commit."""
    page = RESULTS / f"{stem}.md"
    if page.is_file():
        text = page.read_text(encoding="utf-8")
        runs = re.findall(r"^\s*Run: (.*)$", text, flags=re.MULTILINE)
        commands = re.findall(r"^\s*Command: `([^`]*)`", text, flags=re.MULTILINE)
        return (
            bool(runs)
            and all(re.search(r"; commit [0-9a-f]{7,40};", run) for run in runs)
            and "not recorded" not in commands
        )
    run = json.loads((RESULTS / f"{stem}.json").read_text(encoding="utf-8")).get("run")
    return isinstance(run, dict) and bool(run.get("git_commit"))


def test_the_results_said_to_lack_their_run_record_are_those_that_lack_it():
    """docs/benchmarks.md says every result file records its run and names the exceptions; a file refreshed by its
    script leaves that list, one written without the record joins it."""
    stems = {path.stem for path in RESULTS.iterdir() if path.suffix in (".md", ".json")}
    sentence = re.search(
        r"to be refreshed at their next run: (.*?)\. ", flowing(ROOT / "docs" / "benchmarks.md")
    )
    assert sentence, "docs/benchmarks.md no longer names the result files to be refreshed at their next run"
    named = set(re.findall(r"[a-z_]+", sentence.group(1))) & stems
    lacking = {stem for stem in stems if not records_its_run(stem)}
    assert named == lacking, (
        f"named as lacking their run record but recording it (remove them from the list): {sorted(named - lacking)}; "
        f"lacking it but not named: {sorted(lacking - named)}"
    )


def test_no_shipped_file_points_to_material_users_do_not_have():
    found = []
    for path in [*DOCS, *CARDS, *SHIPPED_CODE]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            remote = path.relative_to(ROOT).parts[0] in REMOTE_CODE and not BLOCK_MARKER.match(line.strip())
            for pattern in (NOT_SHIPPED, HISTORY, *([NOT_IN_REMOTE_CODE] if remote else [])):
                match = pattern.search(line)
                if match:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in {line.strip()!r}")
    assert not found, "references to files users do not have, or development history:\n" + "\n".join(found)


def test_readme_is_a_getting_started_page():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_LINE_LIMIT, (
        f"README.md has {lines} lines (at most {README_LINE_LIMIT}); move reference to docs/"
    )


# Claims that no Hyper-SET iteration can keep: its updates are gradients in the normalised projections, not in x,
# and the step sizes are learned with either sign (model_cards/hyperset.md, "Energy descent"), so neither energy, nor
# their sum, is guaranteed to fall at every iteration.
UNCONDITIONAL_DESCENT = re.compile(
    r"exact gradient steps? on|every iteration (?:is )?an energy descent|each iteration descends|"
    r"makes the iteration converge|gradient of an energy of x",
    re.IGNORECASE,
)


def test_no_text_promises_an_energy_descent_the_iteration_does_not_guarantee():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()!r}"
        for path in [*DOCS, *CARDS, *SHIPPED_CODE]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if UNCONDITIONAL_DESCENT.search(line)
    ]
    assert not found, "unconditional energy-descent claims:\n" + "\n".join(found)
    assert (
        "Energy descent: what is and is not guaranteed" in (ROOT / "model_cards" / "hyperset.md").read_text()
    )


@pytest.mark.parametrize(
    ("family", "card"),
    [("hyperset",) * 2, ("hyperbf",) * 2, ("imixer",) * 2, ("looped-transformer", "baseline")],
)
def test_model_card_output_flags_are_forward_arguments(family, card):
    """A flag a model card tells users to pass (`output_…=True`) is an argument of the family's model `forward`."""
    import inspect

    from energyformers import registry

    models = {**registry.FAMILIES, **registry.BASELINES}[family].heads.values()
    flags = set(re.findall(r"`(output_\w+)=True`", (ROOT / "model_cards" / f"{card}.md").read_text()))
    accepted = set().union(*(inspect.signature(model.forward).parameters for model in models))
    assert flags <= accepted, (
        f"{family}: card flags {sorted(flags - accepted)} not in forward({sorted(accepted)})"
    )


# ------------------------------------------------------------------------- numbers quoted from result files

RESULTS = ROOT / "benchmarks" / "results"


def flowing(path: Path) -> str:
    """The file's text with every run of whitespace as one space, so a quote wrapped over lines is found."""
    return " ".join(path.read_text(encoding="utf-8").split())


def test_flop_counts_quoted_in_the_speed_section_are_those_of_the_gpu_speed_results():
    groups = json.loads((RESULTS / "gpu_speed.json").read_text(encoding="utf-8"))["groups"]
    hyperset_group = groups["Hyper-SET cifar10-small, 224²/16 (197 tokens, T=12)"]["variants"]
    imixer_group = groups["iMixer-S/16 (n=2) vs Mixer (n=0)"]["variants"]
    hyperset = hyperset_group["Hyper-SET (eager)"]["flops"]["forward"]
    vit = hyperset_group["ViT 384×6h×12 (sdpa)"]["flops"]["forward"]
    imixer = imixer_group["iMixer-S/16"]["flops"]["forward"]
    mixer = imixer_group["Mixer-S/16 (n=0)"]["flops"]["forward"]
    quotes = [
        f"FLOP ratio against ViT is {vit / hyperset:.2f}",
        f"{vit / 1e9:.2f} GFLOP per image for ViT against {hyperset / 1e9:.2f} for Hyper-SET",
        f"counts {imixer / 1e9:.2f} GFLOP per image (forward) for iMixer-S/16 (n = 2) against {mixer / 1e9:.2f}",
    ]
    text = flowing(ROOT / "docs" / "benchmarks.md")
    missing = [quote for quote in quotes if quote not in text]
    assert not missing, f"docs/benchmarks.md does not quote gpu_speed.json's FLOP counts as: {missing}"


@pytest.mark.parametrize(
    ("result", "script"),
    [("sudoku_search.json", "benchmarks/sudoku_search.py"), ("sudoku_easy.md", "benchmarks/sudoku_easy.py")],
)
def test_the_documented_benchmark_command_is_the_recorded_one(result, script):
    """The command docs/benchmarks.md gives for a result is the one its result file records (interpreter and
    environment variables aside), so a reader who runs it gets that model folder and those flags."""
    source = RESULTS / result
    if source.suffix == ".json":
        result_json = json.loads(source.read_text(encoding="utf-8"))
        # the run's provenance (benchmarks/provenance.py), or the top-level command of a file written before it
        recorded = result_json["run"]["command"] if "run" in result_json else result_json["command"]
    else:
        recorded = re.search(r"^Command: `([^`]*)`", source.read_text(encoding="utf-8"), re.MULTILINE).group(
            1
        )
    arguments = recorded[recorded.index(script) :]
    documented = flowing(ROOT / "docs" / "benchmarks.md")
    assert arguments in documented, (
        f"docs/benchmarks.md does not give the command recorded in {result}: {arguments!r}"
    )


def test_paper_size_sudoku_parameter_counts_quoted_are_what_the_preset_builds():
    def count(model: torch.nn.Module) -> int:
        return sum(p.numel() for p in model.parameters())

    with torch.device("meta"):  # shapes only: the counts need no weights
        hyperset = count(HyperSetForTokenClassification(HyperSetConfig.from_preset("sudoku")))
        authors = count(HyperSetForTokenClassification(HyperSetConfig.from_preset("sudoku-authors")))
        looped = count(LoopedTransformerForTokenClassification(LoopedTransformerConfig.from_preset("sudoku")))
    # The committed result was measured when the baseline's Sudoku head was LayerNorm → Linear with bias, d + 9
    # parameters more than Hyper-SET's RMSNorm → bias-free Linear it has now: it may quote that count while
    # docs/benchmarks.md says beside it that the page predates the change (a rerun quotes the current count).
    sudoku = LoopedTransformerConfig.from_preset("sudoku")
    old_head = looped + sudoku.hidden_size + sudoku.num_labels
    result = flowing(ROOT / "benchmarks/results/sudoku_depth.md")
    measured = next(
        (n for n in (looped, old_head) if f"and looped Transformer {n:,} parameters" in result), None
    )
    assert measured is not None, f"sudoku_depth.md quotes neither {looped:,} nor the old head's {old_head:,}"
    quotes = [
        (
            "docs/benchmarks.md",
            f"`--preset sudoku` builds {hyperset:,} Hyper-SET parameters, the `sudoku-authors` structure with the "
            f"authors' time MLP {authors:,}, the looped Transformer {looped:,}",
        ),
        ("docs/hyperset.md", f"| {authors:,} | {hyperset:,} |"),
    ]
    if measured == old_head:
        quotes.append(
            ("docs/benchmarks.md", f"its quoted paper-size count {old_head:,} against {looped:,} now")
        )
    wrong = [f"{path}: {quote!r}" for path, quote in quotes if quote not in flowing(ROOT / path)]
    assert not wrong, "Sudoku preset counts quoted otherwise than built:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    ("preset", "head"),
    [
        ("cifar10-small", HyperSetForImageClassification),
        ("cifar10-small-scaleup", HyperSetForImageClassification),
        ("imagenet1k-640", HyperSetForImageClassification),
        ("sudoku", HyperSetForTokenClassification),
    ],
)
def test_paper_preset_counts_quoted_for_both_iteration_conditionings_are_what_the_preset_builds(preset, head):
    """docs/hyperset.md's table gives each paper row's count with `iteration_conditioning="sinusoidal"` (the
    paper's) and with the default `"none"`."""
    counts = {}
    for conditioning in ("sinusoidal", "none"):
        with torch.device("meta"):  # shapes only: the counts need no weights
            model = head(HyperSetConfig.from_preset(preset, iteration_conditioning=conditioning))
        counts[conditioning] = sum(p.numel() for p in model.parameters())
    row = next(
        (
            line
            for line in (ROOT / "docs/hyperset.md").read_text(encoding="utf-8").splitlines()
            if line.startswith(f"| `{preset}`")
        ),
        None,
    )
    assert row is not None, f"docs/hyperset.md has no table row for `{preset}`"
    quoted = row.rstrip(" |").split(" | ")[-2:]
    built = [f"{counts['sinusoidal']:,}", f"{counts['none']:,}"]
    assert quoted == built, f"{preset}: docs/hyperset.md quotes (sinusoidal, none) = {quoted}, built {built}"
    # the page's arithmetic: "d parameters in place of the MLP's 512·d + d² + 5d (512·d + d² + 2d in the Sudoku
    # model ...)", the sinusoid being 512 wide
    d, width = model.config.hidden_size, HyperSetConfig.from_preset(preset).time_embedding_dim
    time_mlp = width * d + d * d + (2 if preset == "sudoku" else 5) * d
    assert (width, counts["sinusoidal"] - counts["none"]) == (512, time_mlp - d), (
        f"{preset}: time MLP of {counts['sinusoidal'] - counts['none'] + d:,} parameters, the page says {time_mlp:,}"
    )


def test_test_time_search_is_an_argument_of_the_classification_heads_only():
    """docs/mim.md ("The heads") and docs/hyperset.md ("Test-time search"): the classification heads of Hyper-SET and
    the looped baseline take `search_trajectories`, the masked-image-modelling heads do not (their refusal of deep
    supervision, supervision steps and the halting head is tests/test_mim.py's)."""
    import inspect

    import energyformers

    heads = {
        name: "search_trajectories" in inspect.signature(getattr(energyformers, name).forward).parameters
        for family in ("HyperSet", "LoopedTransformer")
        for task in (
            "ImageClassification",
            "SequenceClassification",
            "TokenClassification",
            "MaskedImageModeling",
        )
        for name in (f"{family}For{task}",)
    }
    wrong = {name: takes for name, takes in heads.items() if takes == name.endswith("MaskedImageModeling")}
    assert not wrong, (
        f"heads whose search_trajectories argument is not as the docs say (True: takes it): {wrong}"
    )


def test_the_option_list_names_the_feature_maps_the_config_accepts():
    """`HyperSetConfig.choices` has no `feature_map` (a cross-field rule, not a choice table): the option list of
    docs/hyperset.md names the public constant that lists them, and lists the same names."""
    from energyformers.configuration.configuration_hyperset import FEATURE_MAPS

    text = " ".join((ROOT / "docs" / "hyperset.md").read_text().split())
    entry = re.search(
        r"`feature_map` \(φ of `linear`/`gated`: (?P<names>[^,]+), listed in `(?P<where>[\w.]+)`", text
    )
    assert entry is not None, "docs/hyperset.md: no feature_map entry naming its list"
    assert tuple(re.findall(r"`([^`]+)`", entry["names"])) == FEATURE_MAPS, (entry["names"], FEATURE_MAPS)
    module, _, name = entry["where"].rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is FEATURE_MAPS, entry["where"]
    assert "feature_map" not in HyperSetConfig.choices
