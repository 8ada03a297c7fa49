"""`energyformers release`: the reference checkpoints of every family as Hub-ready folders under `dist/`.

For each family in `energyformers.FAMILIES` and each reference dataset (digits and fashion_mnist for images,
rotten_tomatoes for text) it trains the model with the train CLI's defaults (`energyformers train --model F
--dataset D --output_dir runs/release/F-D`, in a subprocess, so every run is exactly the documented command),
or reuses a finished run folder, or takes the folders given with `--take`; draws each folder's dynamics with
`energyformers inspect` (figures and inspect.json in the folder, linked from the card; a folder given with `--take`
is never written to: it is inspected in a copy under `dist/`, removed afterwards); then it exports each one with
`export_model_dir` to `dist/<model>-<dataset>/` (git-ignored) with its card and measured metrics, and writes
`dist/release.json` (what was released, with the measured test metrics) and the commands to push them.

A masked-image-modelling folder (`energyformers train --task mim`, Hyper-SET's or the looped Transformer's, the
paper's Table 2) given with `--take` is exported as `dist/<model>-mim-<dataset>/` with its image tokenizer; it is not
inspected (`inspect` draws its decode sequence of a given image, not dataset dynamics).

`--mim hyperset looped-transformer` also trains those masked-image-modelling heads (`energyformers train --task mim
--model M`, the paper's Table 2) on the image datasets among `--datasets` and exports them like a taken MIM folder;
`--models` with no name leaves the families out (`release --models --mim hyperset`).

`--baselines vit` also trains transformers' ViT (the papers' image baseline) with the same command on the image
reference datasets and records its test metrics under "baselines" in release.json, beside the families'; a
baseline is not a published model, so it is neither inspected nor exported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from ..tokenizer_fit import MIM_TASK
from .cli import CommandParser, UsageError, check_output_folder, run_command
from .weights import read_json_object

REFERENCE_DATASETS = ("digits", "fashion_mnist", "rotten_tomatoes")
# The built-in datasets of `energyformers train` (the keys of `training.data.BUILTIN_DATASETS`, known without
# importing the datasets stack; a test checks they stay equal): a release is named `<model>-<dataset>` after one.
TRAIN_DATASETS = ("digits", "fashion_mnist", "mnist5k", "rotten_tomatoes", "spam", "sudoku", "sudoku-hard")
IMAGE_DATASETS = ("digits", "fashion_mnist")  # the reference datasets of images
# The keys of `energyformers.FAMILIES`, known without importing the models (a test checks they stay equal).
RELEASED_MODEL_TYPES = ("hyperbf", "hyperset", "imixer")
# transformers' own baselines (`energyformers.registry.TRANSFORMERS_BASELINES`; a test checks they stay equal) and
# the reference datasets each can train on: trained beside the families for comparison, never exported.
BASELINE_DATASETS = {"vit": IMAGE_DATASETS}
# The models with a masked-image-modelling head (the registry's `AutoModelForMaskedImageModeling` entries; a test
# checks they stay equal): Hyper-SET and Table 2's looped-Transformer baseline, both exported (docs/mim.md).
MIM_MODELS = ("hyperset", "looped-transformer")
# The `energyformers train` flags release sets itself on every run it trains (`train_command`), by their dests, with
# why: the same flag after `--` would override release's own (argparse keeps the last), so it is refused.
RELEASE_SETS = {
    "model": "release sets --model itself, to each model of --models, --mim and --baselines",
    "dataset": "release sets --dataset itself, to each of --datasets",
    "output_dir": "release sets --output_dir itself, to --runs_dir/<model>-<dataset>, where it finds the run again "
    "to export it; choose the folder with --runs_dir",
    "overwrite_output_dir": "release sets --overwrite_output_dir itself on every run it trains; --retrain trains "
    "finished runs again",
    "task": "release sets --task itself: the families train on their datasets' task, the models of --mim with "
    "--task mim",
    "help": "`energyformers train --help` lists the flags that can follow --",
}


def _finished(run_dir: Path) -> bool:
    return all((run_dir / name).is_file() for name in ("config.json", "model.safetensors", "metrics.json"))


# What to do about a metrics.json release cannot use, the end of its one-line message.
RUN_RECORD_REMEDY = (
    "it is the run's record, written by `energyformers train`: restore it or train the run again"
)


def _run_record(run_dir: Path) -> dict:
    """The metrics.json of a finished run, with what release reads of it checked: the model and the dataset it is
    released under (text; `inspect` runs on that dataset) and its test metrics (an object of numbers, or none: the
    summary's). FileNotFoundError when it is missing, ValueError naming the file for anything else (unreadable, not
    JSON, not a train run's)."""
    metrics_path = run_dir / "metrics.json"
    if not metrics_path.is_file():
        raise FileNotFoundError(
            f"{run_dir}: missing metrics.json; a release needs the run's measured metrics (train with "
            "`energyformers train`, which writes it)."
        )
    metrics = read_json_object(metrics_path, {"model": str, "dataset": str}, remedy=RUN_RECORD_REMEDY)
    for key in ("model", "dataset"):
        if not metrics[key]:
            raise ValueError(f'{metrics_path}: {key}="" is not a name; {RUN_RECORD_REMEDY}.')
    test = metrics.get("test") or {}
    if not isinstance(test, dict) or not all(
        value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
        for value in test.values()
    ):
        raise ValueError(
            f"{metrics_path}: test={test!r}; expected the run's test metrics, an object of numbers"
        )
    return metrics


def _release_name(run_dir: Path, metrics: dict) -> str:
    """The release name of the run in `run_dir` from its `_run_record`: the card's default model name
    (`card.default_model_name`, `<model>-<dataset>`, `<model>-mim-<dataset>` for masked image modelling), the model
    type read from the folder's config.json as the card reads it. The name is joined to --dist_dir, so one that is
    not a single folder name (`folder_name_problem`) is a ValueError naming the folder."""
    from .card import LOCAL_PATHS_KEY, default_model_name

    config = read_json_object(run_dir / "config.json", {"model_type": str})
    local_paths = metrics.get(LOCAL_PATHS_KEY)
    name = default_model_name(
        config["model_type"],
        metrics["dataset"],
        local_paths if isinstance(local_paths, dict) else None,
        mim=metrics.get("task") == MIM_TASK,
    )
    problem = folder_name_problem(name)
    if problem is not None:
        raise ValueError(
            f"{run_dir}: its release name {name!r} (config.json's model_type, metrics.json's dataset) {problem}; "
            "it names a folder of --dist_dir"
        )
    return name


def folder_name_problem(name: str) -> str | None:
    """Why `name` is not one plain folder name that stays where it is joined (no separator, no `.` or `..`, no
    hidden name, no control character such as a newline, at most 255 bytes); None when it is one."""
    if not name or name in {".", ".."} or name.startswith("."):
        return "is empty, `.`, `..` or a hidden name"
    if any(sep in name for sep in {"/", "\\", os.sep, os.altsep or "/"}):
        return "holds a path separator"
    if any(ord(char) < 32 or ord(char) == 127 for char in name):
        return "holds a control character"
    if len(os.fsencode(name)) > 255:
        return "is longer than a folder name may be (255 bytes)"
    return None


def check_taken_folder(folder: Path) -> None:
    """What `--take` needs of a folder, checked without the models: a model folder (config.json, readable weights)
    with the metrics.json of its run. A `UsageError` naming the flag and the folder."""
    from .export import check_model_dir

    check_model_dir(folder, flag="--take")
    if not (folder / "metrics.json").is_file():
        raise UsageError(
            f"--take {folder}: missing metrics.json; a release needs the run's measured metrics (train with "
            "`energyformers train`, which writes it)"
        )


def check_taken_models(folders: list[Path]) -> dict[Path, str]:
    """The release name of each `--take` folder, after `export`'s check of its content (an energyformers model
    with its processor), so a folder that cannot be released is refused before anything is inspected or written.
    A `UsageError` naming the flag."""
    from .export import inspect_model_dir

    names: dict[Path, str] = {}
    for folder in folders:
        try:
            inspect_model_dir(folder)
            name = _release_name(folder, _run_record(folder))
        except (FileNotFoundError, ValueError) as err:  # the messages name the folder or its file
            raise UsageError(f"--take: {err}") from None
        twin = next((other for other, taken in names.items() if taken == name), None)
        if twin is not None:
            raise UsageError(f"--take {twin} {folder}: both would be released as {name!r}; take one of them")
        names[folder] = name
    return names


# A Hub dataset id: NAME or NAMESPACE/NAME (what `data.load_data` sends to the Hub).
_HUB_DATASET_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def dataset_problem(name: str) -> str | None:
    """Why `energyformers train --dataset NAME` could not load `name`, decided as its loader (`data.load_data`)
    decides, without loading anything: a built-in, an existing local folder or file, or (the Hub being online) a
    Hub dataset id are accepted; None then, else the reason as text (a Hub dataset that does not exist is only
    found out by the training run)."""
    from huggingface_hub import constants

    if name in TRAIN_DATASETS or Path(name).expanduser().exists():
        return None
    allowed = (
        f"expected a built-in dataset of `energyformers train` ({', '.join(TRAIN_DATASETS)}), an existing local "
        "folder or file, or a Hub dataset id"
    )
    if name.startswith((".", "/", "~")) or name.count("/") > 1:  # as load_data: a path, never a Hub id
        return f"no such local folder or file; {allowed}"
    if not _HUB_DATASET_ID.fullmatch(name):
        return f"not a built-in dataset, a local path or a Hub dataset id; {allowed}"
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return (
            "not a built-in dataset of `energyformers train` nor a local path, and the Hub is offline "
            f"(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); {allowed}"
        )
    return None


def run_dir_name(model: str, dataset: str, mim: bool = False) -> str:
    """The folder under --runs_dir that `energyformers train --model MODEL --dataset DATASET` trains into, named as
    the release is (`card.default_model_name`: a data file by its stem, a Hub id or local folder by its last
    part)."""
    from .card import default_model_name

    return default_model_name(model, dataset, mim=mim)


def train_command(model: str, dataset: str, run_dir: Path, train_args: list[str]) -> list[str]:
    """The `energyformers train` command line of one reference run (`train_args` appended)."""
    return [
        sys.executable,
        "-m",
        "energyformers",
        "train",
        "--model",
        model,
        "--dataset",
        dataset,
        "--output_dir",
        str(run_dir),
        "--overwrite_output_dir",
        *train_args,
    ]


def inspect_command(run_dir: Path, dataset: str) -> list[str]:
    """`energyformers inspect` of a run folder into itself, on `dataset` (the one its metrics.json names)."""
    command = [sys.executable, "-m", "energyformers", "inspect", str(run_dir), "--output_dir", str(run_dir)]
    return [*command, "--dataset", dataset]


def training_runs(
    args: argparse.Namespace,
) -> tuple[list[tuple[Path, list[str]]], list[tuple[Path, list[str]]]]:
    """The run folder and `energyformers train` command of every run release trains when it is not finished yet (or
    with --retrain): the models' (the families', then the --mim heads', named apart), which are exported, and the
    baselines', which are only reported. None with --take."""
    models: list[tuple[Path, list[str]]] = []
    baselines: list[tuple[Path, list[str]]] = []
    if args.take:
        return models, baselines
    for model in args.models:
        for dataset in args.datasets:
            run_dir = args.runs_dir / run_dir_name(model, dataset)
            models.append((run_dir, train_command(model, dataset, run_dir, args.train_args)))
    for model in args.mim:  # masked image modelling: exported like the families, named apart
        for dataset in [d for d in args.datasets if d in IMAGE_DATASETS]:
            run_dir = args.runs_dir / run_dir_name(model, dataset, mim=True)
            models.append(
                (run_dir, train_command(model, dataset, run_dir, ["--task", "mim", *args.train_args]))
            )
    for model in args.baselines:  # trained with the same command on the image datasets they take
        for dataset in [d for d in args.datasets if d in BASELINE_DATASETS[model]]:
            run_dir = args.runs_dir / run_dir_name(model, dataset)
            baselines.append((run_dir, train_command(model, dataset, run_dir, args.train_args)))
    return models, baselines


class _GivenFlag(argparse.Action):
    """Records a flag as it was given: its option string and values, as one shell-quoted string."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | list[str] | None,
        option_string: str | None = None,
    ) -> None:
        values = [] if values is None else [values] if isinstance(values, str) else list(values)
        setattr(namespace, self.dest, shlex.join([option_string or "", *values]))


def given_train_flags(train_args: list[str]) -> dict[str, str]:
    """The `energyformers train` flags among `train_args`, as {dest: the flag with its values as given}, matched as
    train's own parser matches them (aliases such as --output-dir, unambiguous abbreviations such as --output_d); {}
    where train's parser cannot read them (it names the mistake itself)."""
    from .arguments import build_parser as build_train_parser

    quiet = CommandParser(add_help=False, argument_default=argparse.SUPPRESS)
    for action in build_train_parser("energyformers train", "")._actions:
        if action.option_strings:
            quiet.add_argument(
                *action.option_strings, dest=action.dest, nargs=action.nargs, action=_GivenFlag
            )
    try:
        given, _ = quiet.parse_known_args(train_args)
    except UsageError:
        return {}
    return vars(given)


def check_train_args(args: argparse.Namespace) -> None:
    """The flags after `--`, checked before any work: none that release sets itself (`RELEASE_SETS`), and every run
    release may train (`training_runs`) accepted by `energyformers train`'s own checks, as it will run it. A
    `UsageError` naming the flag; with --take (nothing trained) the flags are refused."""
    from .arguments import redacted_argv

    if args.take:
        if args.train_args:
            # a token's value redacted, as in every command release shows
            shown = shlex.join(redacted_argv(args.train_args))
            raise UsageError(
                f"-- {shown}: flags for the training runs, but --take trains nothing; leave them out"
            )
        return
    given = given_train_flags(args.train_args)
    for dest, why in RELEASE_SETS.items():
        if dest in given:
            raise UsageError(f"{given[dest]} (after --): {why}")
    from .train import parse as parse_train  # light: the arguments only, no torch

    models, baselines = training_runs(args)
    for _, command in [*models, *baselines]:
        try:
            parse_train(command[4:])
        except UsageError as err:
            refused = UsageError(f"{err} (in `{_shown(command)}`, a run release trains)")
            refused.hint = err.hint
            raise refused from None


def build_parser() -> argparse.ArgumentParser:
    """The `energyformers release` argument parser."""
    parser = CommandParser(
        prog="energyformers release",
        description="Train (or take) the reference checkpoints and export Hub-ready folders under dist/. "
        "Arguments after `--` are passed to every `energyformers train` run.",
    )
    parser.add_argument(
        "--models",
        nargs="*",
        default=None,
        metavar="MODEL",
        help=f"families to release: some of {', '.join(RELEASED_MODEL_TYPES)} (default: all; none: `--models` alone, "
        "with --mim)",
    )
    parser.add_argument(
        "--mim",
        nargs="+",
        default=[],
        metavar="MODEL",
        help=f"also train the masked-image-modelling heads of these models ({', '.join(MIM_MODELS)}) on the "
        "image datasets among --datasets (`energyformers train --task mim`) and export them as "
        "<model>-mim-<dataset>",
    )
    parser.add_argument(
        "--baselines",
        nargs="+",
        default=[],
        metavar="MODEL",
        help=f"also train these baselines ({', '.join(BASELINE_DATASETS)}) with the same command on the image "
        "datasets among --datasets, and report their test metrics in release.json beside the families' "
        "(baselines are not exported)",
    )
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=list(REFERENCE_DATASETS),
        metavar="DATASET",
        help=f"datasets to train each family on, as `energyformers train --dataset` takes them: built-ins "
        f"({', '.join(TRAIN_DATASETS)}), local folders or files, Hub ids (default: {' '.join(REFERENCE_DATASETS)})",
    )
    parser.add_argument(
        "--take",
        nargs="+",
        type=Path,
        default=None,
        metavar="MODEL_DIR",
        help="release these finished model folders instead of training",
    )
    parser.add_argument("--runs_dir", type=Path, default=Path("runs/release"), help="where training runs go")
    parser.add_argument("--dist_dir", type=Path, default=Path("dist"), help="where the Hub-ready folders go")
    parser.add_argument("--retrain", action="store_true", help="train again even if a finished run exists")
    parser.add_argument("--namespace", default=None, help="Hub user/org shown in the cards' loading snippets")
    parser.add_argument("--dry_run", action="store_true", help="print the plan, train and write nothing")
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """The arguments, and the `energyformers train` flags after `--`; `--take` folders must be folders."""
    split = argv.index("--") if "--" in argv else len(argv)
    parser = build_parser()
    args = parser.parse_args(argv[:split])
    args.train_args = argv[split + 1 :]
    unknown = [m for m in args.models or () if m not in RELEASED_MODEL_TYPES]
    if unknown:
        hint = [m for m in unknown if m in BASELINE_DATASETS]
        also = f" ({' '.join(hint)} is a baseline: pass --baselines {' '.join(hint)})" if hint else ""
        parser.error(
            f"--models {' '.join(unknown)}: unknown; expected some of {sorted(RELEASED_MODEL_TYPES)}{also}"
        )
    wrong = [m for m in args.baselines if m not in BASELINE_DATASETS]
    if wrong:
        parser.error(f"--baselines {' '.join(wrong)}: unknown; expected some of {sorted(BASELINE_DATASETS)}")
    wrong = [m for m in args.mim if m not in MIM_MODELS]
    if wrong:
        parser.error(
            f"--mim {' '.join(wrong)}: no masked-image-modelling head; expected some of {list(MIM_MODELS)}"
        )
    for flag in ("baselines", "mim"):
        if getattr(args, flag) and args.take:
            parser.error(f"--{flag} trains; --take releases given folders: pass one of them")
    if args.models == [] and not args.mim:
        parser.error("--models with no name releases no family; name some, or add --mim MODEL")
    for dataset in args.datasets:  # refused in a dry run too: the plan it prints must be one that runs
        problem = dataset_problem(dataset)
        if problem:
            parser.error(f"--datasets {dataset}: {problem}")
    named: dict[str, str] = {}  # a run folder and a release per dataset name (`run_dir_name`)
    for dataset in args.datasets:
        name = run_dir_name("<model>", dataset)
        if name in named and named[name] != dataset:
            parser.error(
                f"--datasets {named[name]} {dataset}: both would be trained into and released as {name}; "
                "pass one of them"
            )
        named[name] = dataset
    if args.mim and not set(args.datasets) & set(IMAGE_DATASETS):
        parser.error(f"--mim trains on images: --datasets needs one of {list(IMAGE_DATASETS)}")
    for folder in args.take or ():
        check_taken_folder(folder)
    for flag in ("runs_dir", "dist_dir"):  # release adds folders of its own names to them
        check_output_folder(getattr(args, flag), f"--{flag}", None)
    args.models = list(RELEASED_MODEL_TYPES) if args.models is None else args.models
    check_train_args(args)
    return args


def _number(value: float | None, digits: int = 4) -> str:
    """A metric of the summary table, "—" where the run did not record it."""
    return "—" if value is None else f"{value:.{digits}f}"


def summary_row(name: str, test: dict) -> str:
    """One line of the printed summary: a classifier's test accuracy and macro F1 under the table's header, a Sudoku
    model's blank-cell and board accuracy, a masked-image-modelling model's reconstruction metrics; "—" for a
    metric its run did not record."""
    if "masked_token_accuracy" in test:  # masked image modelling: no classes, reconstruction metrics
        return (
            f"{name:<32} masked-token accuracy {_number(test['masked_token_accuracy'])}, PSNR "
            f"{_number(test.get('psnr'), 2)} dB (tokenizer bound {_number(test.get('tokenizer_psnr'), 2)} dB)"
        )
    if "blank_cell_accuracy" in test or "board_accuracy" in test:  # Sudoku (token classification)
        return (
            f"{name:<32} blank-cell accuracy {_number(test.get('blank_cell_accuracy'))}, board accuracy "
            f"{_number(test.get('board_accuracy'))}"
        )
    return f"{name:<32} {_number(test.get('accuracy')):>9} {_number(test.get('f1_macro')):>9}"


def publish(staged: dict[str, Path], dist_dir: Path, summary: dict, aside: Path) -> None:
    """Move each staged export to `dist_dir/<name>` (replacing an older one) and write `dist_dir/release.json`, all
    or nothing: a failure on the way puts the older folders back and removes the new ones, so `dist_dir` holds
    either the whole release or what it held before. `aside` is an empty folder on the same filesystem where the
    replaced folders wait until the release is complete."""
    placed: list[Path] = []
    replaced: list[tuple[Path, Path]] = []  # (dist_dir/<name>, where the older folder waits)
    record = aside / "release.json"
    record.write_text(json.dumps(summary, indent=2) + "\n")
    try:
        for name, folder in staged.items():
            final = dist_dir / name
            if os.path.lexists(final):
                final.rename(aside / name)
                replaced.append((final, aside / name))
            folder.rename(final)
            placed.append(final)
        # the last step: once release.json is there, the release is complete
        os.replace(record, dist_dir / "release.json")
    except BaseException:
        for final in reversed(placed):
            shutil.rmtree(final, ignore_errors=True)
        for final, older in reversed(replaced):
            older.rename(final)
        raise


def _shown(command: list[str]) -> str:
    """A `python -m energyformers ...` command line as the user types it: `energyformers ...`, a token's value
    redacted (`redacted_argv`: a failure's line goes into release.json)."""
    from .arguments import redacted_argv

    return shlex.join(["energyformers", *redacted_argv(command[3:])])


# A folder to release or report, and the `energyformers train` command that trains it first (None: taken as it is).
_Run = tuple[Path, list[str] | None]


class _Finished(NamedTuple):
    """A finished run as the steps after training read it: its `_run_record` and its `_release_name`."""

    record: dict
    name: str


class _Staging:
    """`dist_dir/.release-*`, made on first use: the inspected copies of `--take` folders, the exports and the
    folders a release replaces wait there until `publish`; `remove` deletes it at the end."""

    def __init__(self, dist_dir: Path) -> None:
        self.dist_dir = dist_dir
        self.folder: Path | None = None

    def path(self, *parts: str) -> Path:
        """`parts` under the staging folder, which is made (with `dist_dir`) the first time."""
        if self.folder is None:
            self.dist_dir.mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix=".release-", dir=self.dist_dir))
        return self.folder.joinpath(*parts)

    def remove(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _plan(args: argparse.Namespace) -> tuple[list[_Run], list[_Run]]:
    """Step 1: the model folders to release (given, already trained, or to be trained now) and the baselines to
    report (trained with the same command on the image datasets they take, never exported). A finished run is taken
    as it is (no command) unless --retrain."""
    if args.take:
        check_taken_models(args.take)  # bad input: refused before any folder is inspected or written
    models, baselines = training_runs(args)  # none with --take

    def pending(runs: list[tuple[Path, list[str]]]) -> list[_Run]:
        return [
            (run_dir, command if args.retrain or not _finished(run_dir) else None)
            for run_dir, command in runs
        ]

    return [(Path(d), None) for d in args.take or ()] + pending(models), pending(baselines)


def _train_missing(runs: list[_Run]) -> dict[str, str]:
    """Step 2: train each run that has a command; {run folder: why} for each that failed (the others still ship)."""
    failures: dict[str, str] = {}
    for run_dir, command in runs:
        if command is not None:
            start = time.perf_counter()
            if subprocess.run(command).returncode != 0:
                failures[str(run_dir)] = f"training failed: {_shown(command)}"
            else:
                print(f"trained {run_dir} in {time.perf_counter() - start:.0f} s", flush=True)
    return failures


def _records(runs: list[_Run], failures: dict[str, str]) -> dict[Path, _Finished]:
    """Step 3: the `_run_record` and release name of each run that did not fail, by run folder, read once for the
    steps after it; a run whose metrics.json or name cannot be read is added to `failures` (the others still
    ship)."""
    records: dict[Path, _Finished] = {}
    for run_dir, _ in runs:
        if str(run_dir) in failures:
            continue
        try:
            record = _run_record(run_dir)
            records[run_dir] = _Finished(record, _release_name(run_dir, record))
        except (FileNotFoundError, ValueError) as err:
            failures[str(run_dir)] = str(err)
    return records


def _inspect_finished(
    plan: list[_Run], records: dict[Path, _Finished], taken: bool, staging: _Staging, failures: dict[str, str]
) -> dict[Path, Path]:
    """Step 4: draw each finished folder's dynamics (`energyformers inspect` on its test split) for its card; the
    folder each one is exported from, by run folder. A run trained here is release's own output and gets the
    figures; a folder given with --take (`taken`) is the user's and is not written to: it is copied into the staging
    folder, inspected and exported from there. A failed copy or inspect is added to `failures`."""
    sources = {run_dir: run_dir for run_dir, _ in plan}
    for index, (run_dir, _) in enumerate(plan):
        if run_dir not in records or str(run_dir) in failures or (run_dir / "inspect.json").is_file():
            continue
        record, name = records[run_dir]
        if record.get("task") == MIM_TASK:
            # `inspect` draws a MIM model's decode sequence of a given image, not dataset dynamics; the card has the
            # run's training curve and reconstruction metrics
            continue
        # (staged copy, where its files end up) in inspect's output
        printed_as: tuple[str, str] | None = None
        if taken:
            sources[run_dir] = staging.path("take", str(index), run_dir.name)
            try:
                shutil.copytree(run_dir, sources[run_dir], symlinks=True)
            except OSError as err:  # a file of the folder that cannot be read (shutil.Error lists them)
                failures[str(run_dir)] = f"cannot copy it to inspect it: {err}"
                continue
            printed_as = (str(sources[run_dir]), str(staging.dist_dir / name))
        command = inspect_command(sources[run_dir], record["dataset"])
        if _run_printing(command, printed_as) != 0:
            failures[str(run_dir)] = f"inspect failed: {_shown(command)}"
    return sources


def _export_finished(
    plan: list[_Run],
    records: dict[Path, _Finished],
    sources: dict[Path, Path],
    staging: _Staging,
    namespace: str | None,
    failures: dict[str, str],
) -> tuple[dict[str, Path], dict[str, dict]]:
    """Step 5: export each finished folder into the staging folder, bound for `dist_dir/<model>-<dataset>/`. The
    staged exports and the release.json entries, by release name; a folder that cannot be exported is added to
    `failures`."""
    from .export import export_model_dir, overlap_problem

    exports: dict[str, Path] = {}
    released: dict[str, dict] = {}
    for run_dir, _ in plan:
        if run_dir not in records or str(run_dir) in failures:
            continue
        record, name = records[run_dir]
        final = staging.dist_dir / name
        try:
            if name in released:
                raise ValueError(f"two folders would both be released as {name!r}")
            problem = overlap_problem(run_dir, final, True, ("the folder", "its release folder", "release"))
            if problem is None and os.path.lexists(final) and not final.is_dir():
                problem = f"{final}: is a file, not a folder; release replaces folders only"
            if problem is not None:
                raise ValueError(problem)
            repo_id = f"{namespace}/{name}" if namespace else None
            exports[name] = export_model_dir(sources[run_dir], staging.path("export", name), repo_id=repo_id)
        except (OSError, ValueError) as err:  # the folder's content, or a file of it that cannot be read
            failures[str(run_dir)] = str(err)
            continue
        test = record.get("test") or {}
        released[name] = {"source": str(run_dir), "folder": str(final), "test": test}
    return exports, released


def _baseline_metrics(baselines: list[_Run], records: dict[Path, _Finished]) -> dict[str, dict]:
    """The baselines' measured test metrics, for side-by-side reading, by release name (those whose metrics.json
    could be read: the others failed in `_records`)."""
    return {
        records[run_dir].name: {
            "source": str(run_dir),
            "test": records[run_dir].record.get("test") or {},
        }
        for run_dir, _ in baselines
        if run_dir in records
    }


def _summary_lines(released: dict[str, dict], compared: dict[str, dict], namespace: str | None) -> list[str]:
    """Step 6: the printed summary: the metrics table, then the commands that push the released folders."""
    lines = [f"\n{'release':<32} {'test acc':>9} {'macro F1':>9}"]
    lines += [summary_row(name, entry["test"]) for name, entry in released.items()]
    lines += [summary_row(f"{name} (baseline)", entry["test"]) for name, entry in compared.items()]
    if released:
        lines.append("\npush with:")
        lines += [
            f"  energyformers push {entry['folder']} {namespace or '<your-namespace>'}/{name}"
            for name, entry in released.items()
        ]
    return lines


def run(args: argparse.Namespace) -> int:
    """Train, inspect and export as planned; returns 1 when any folder failed (the others still ship).

    Nothing under `--dist_dir` changes until every folder is exported and the summary is written: the inspected
    copies of `--take` folders and the new exports are staged in a hidden folder there, moved into place together
    at the end (`publish`), and removed, with a `--dist_dir` this run created, when anything fails before."""
    dist_dir = args.dist_dir
    created_dist = not os.path.lexists(dist_dir)
    staging = _Staging(dist_dir)
    try:
        plan, baselines = _plan(args)
        for run_dir, command in [*plan, *baselines]:
            print(f"train  {_shown(command)}" if command else f"take   {run_dir}", flush=True)
        if args.dry_run:
            return 0
        failures = _train_missing([*plan, *baselines])
        records = _records([*plan, *baselines], failures)
        sources = _inspect_finished(plan, records, bool(args.take), staging, failures)
        exports, released = _export_finished(plan, records, sources, staging, args.namespace, failures)
        compared = _baseline_metrics(baselines, records)
        # formatted before anything is published: a failure here leaves dist untouched
        summary = {"released": released, "failed": failures}
        if args.baselines:
            summary["baselines"] = compared
        lines = _summary_lines(released, compared, args.namespace)
        aside = staging.path("aside")
        aside.mkdir()
        publish(exports, dist_dir, summary, aside)
        print("\n".join(lines), flush=True)
        for source, reason in failures.items():
            print(f"energyformers release: error: {source}: {reason}", file=sys.stderr)
        return 1 if failures else 0
    finally:
        staging.remove()
        if created_dist and dist_dir.is_dir() and not any(dist_dir.iterdir()):
            dist_dir.rmdir()  # a --dist_dir this run created and left empty (a failure before publishing)


def _run_printing(command: list[str], printed_as: tuple[str, str] | None) -> int:
    """Run `command`, its output shown as it comes; with `printed_as` = (staged, final), a printed path under the
    staged copy is shown where the export puts that file (the staged copy is removed at the end). The exit status."""
    if printed_as is None:
        return subprocess.run(command).returncode
    staged, final = printed_as
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None  # stdout=PIPE
        for line in process.stdout:
            if line.startswith(staged + os.sep):
                line = final + line[len(staged) :]
            print(line, end="", flush=True)
    return process.returncode


def main(argv: list[str] | None = None) -> int:
    """CLI entry point of `energyformers release`; returns the exit status."""
    return run_command("release", parse, run, list(sys.argv[1:] if argv is None else argv))
