"""`energyformers export MODEL_DIR OUT_DIR`: turn a model folder into a Hub-ready folder.

The result loads two ways (docs/hub.md): with `energyformers` installed through the
registered Auto classes, and without it through `trust_remote_code=True`, because it carries

* `model.safetensors` (copied byte for byte; pickle checkpoints are never read or written),
* `config.json` with `auto_map` naming every Auto class of the family in `energyformers.FAMILIES`,
* the image processor or tokenizer files; a masked-image-modelling head's image tokenizer
  (`vq_tokenizer_config.json` + `vq_tokenizer.safetensors`, or a VQGAN's subfolder: `energyformers.mim`) instead
  of a text tokenizer, which such a head has none of (its inputs are the codes of that image tokenizer); each is
  loaded and tried first as a user of the export loads it (`processing.load_processor`), so a broken one is never
  published,
* flat remote code `configuration_<stem>.py` + `modeling_<stem>.py`, generated from the package sources by
  rewriting the single `from ..configuration.configuration_<stem> import <Arch>Config` line; anything else
  that would not import without the package (other relative imports, `energyformers`, third-party modules
  beyond torch/transformers) is refused, checked on the parsed source,
* for a masked-image-modelling head, its pipeline: `pipeline_mim.py` + `mim.py`, cut from the package's
  `MaskedImageModelingPipeline` and the `energyformers.mim` definitions it uses (`remote_code.mim_pipeline_sources`),
  named in config.json's `custom_pipelines`, so `transformers.pipeline("masked-image-modeling", model=...,
  trust_remote_code=True)` runs it without the package,
* `LICENSE`: the package's Apache-2.0 text, the license of the code the folder carries,
* `README.md`: the model card (`training/card.py`: `model_cards/card.md` with the family's sections) rendered
  with `huggingface_hub.ModelCard` and the run's measured metrics (`metrics.json`) as `model-index` results,
* the run's `metrics.json` and training curve, and what `energyformers inspect` wrote into the folder
  (`inspect.json` and its figures). A Hub file holds no path of the machine it was made on, and two exports of one
  run are the same bytes wherever it lay: the copy of `inspect.json` names the model by its Hub id (`repo_id`), else
  by the exported folder's name, and a decoded image by its file name (`published_inspect_report`); the copy of
  `metrics.json`, and the card rendered from it, show the run's local paths (`--output_dir`, a local `--dataset`
  file, a `--from_pretrained` folder, ... in the arguments and the command) by their names
  (`published_run_metrics`, `is_local_path`).

This module assembles the folder; the remote code is `training/remote_code.py`, the card `training/card.py`.

The folder is assembled in a hidden sibling directory and renamed into place at the end, so a failure
(missing files, bad remote code, weights that do not match the config) leaves no partial export behind.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import shutil
import sys
from pathlib import Path, PureWindowsPath
from typing import Any

from ..tokenizer_fit import MIM_AUTO_CLASS, TOKENIZER_CONFIG_NAME, TOKENIZER_WEIGHTS_NAME
from .arguments import COLUMN_FLAGS, redacted_argv
from .card import LOCAL_PATHS_KEY, read_run_metrics, render_model_card
from .interrupt import (
    locked_output_dir,
    publish,
    restore_interrupted_publish,
    staging_folder,
)
from .remote_code import (
    LICENSE_FILE,
    auto_map,
    custom_pipelines,
    generate_remote_code,
    license_text,
    mim_pipeline_sources,
    remote_code_sources,
)
from .weights import (
    PICKLE_WEIGHTS,
    check_model_folder,
    check_weights_readable,
    read_json_object,
    weight_files,
)

logger = logging.getLogger(__name__)

# Carried along when present, beside the processor's files (`processing.PROCESSOR_FILES`): the card links the
# metrics, curve and `energyformers inspect` figures; a converted checkpoint's official extras make the reverse
# conversion of the exported folder exact.
EXTRA_FILES = ("metrics.json", "training_curve.png", "official_extras.safetensors", "inspect.json")
INSPECT_REPORT = "inspect.json"
RUN_METRICS = "metrics.json"
INSPECT_REMEDY = "run `energyformers inspect` on the folder again, or delete the file"
TOKENIZER_REMEDY = (
    "save the image tokenizer again (PatchKMeansTokenizer / VQGANTokenizer .save_pretrained(model_dir))"
)


# The head of masked image modelling: its inputs are the codes of an image tokenizer (`energyformers.mim`), saved
# beside it by `energyformers train --task mim`; a converted checkpoint has none (the paper's VQGAN is not part of
# it), so the tokenizer is carried when present and never required.
def vq_tokenizer_files(model_dir: Path) -> list[str]:
    """The image tokenizer files of a masked-image-modelling folder, as paths relative to it (a VQGAN's diffusers
    folder included); [] when the folder has none. A tokenizer config without the files it names is refused."""
    config_path = model_dir / TOKENIZER_CONFIG_NAME
    if not config_path.is_file():
        return []
    settings = read_json_object(config_path, optional={"subfolder": str}, remedy=TOKENIZER_REMEDY)
    subfolder = settings.get("subfolder")
    if subfolder is None:  # PatchKMeansTokenizer: its codebook beside the config
        if not (model_dir / TOKENIZER_WEIGHTS_NAME).is_file():
            raise FileNotFoundError(
                f"{model_dir}: {TOKENIZER_CONFIG_NAME} without {TOKENIZER_WEIGHTS_NAME}; save the image tokenizer "
                "again (PatchKMeansTokenizer.save_pretrained(model_dir))."
            )
        return [TOKENIZER_CONFIG_NAME, TOKENIZER_WEIGHTS_NAME]
    folder = model_dir / str(subfolder)
    inside = folder.resolve().is_relative_to(model_dir.resolve()) and Path(str(subfolder)).parts[:1] != (
        "..",
    )
    if not inside or not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{config_path}: subfolder={subfolder!r} is not a model folder inside {model_dir} (a VQGAN saved with "
            "VQGANTokenizer.save_pretrained(model_dir) has its config.json there)."
        )
    nested = sorted(str(path.relative_to(model_dir)) for path in folder.rglob("*") if path.is_file())
    return [TOKENIZER_CONFIG_NAME, *nested]


def published_inspect_report(path: Path, model_name: str) -> str:
    """The text of `inspect.json` (at `path`) as an export carries it: `model_dir` is `model_name` (the Hub id, else
    the exported folder's name), and a local `--dataset` (in `inputs` and the accuracy entry) and a masked-image-
    modelling report's decoded `image` are their names (`is_local_path`, `local_name`), in place of the local paths
    `inspect` recorded (a local report keeps them: they say what was inspected there)."""
    report = read_json_object(path, remedy=INSPECT_REMEDY)

    def published(value: str) -> str:
        return local_name(value) if is_local_path(value) else value

    if "model_dir" in report:
        report["model_dir"] = model_name
    mim = report.get("mim")
    if isinstance(mim, dict) and isinstance(mim.get("image"), str):
        mim["image"] = local_name(mim["image"])
    for key in ("accuracy", "accuracy_vs_iterations"):
        entry = report.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("dataset"), str):
            entry["dataset"] = published(entry["dataset"])
    inputs = report.get("inputs")
    if isinstance(inputs, str) and inputs.endswith(", first batch)"):  # "DATASET (split, first batch)"
        dataset, _, rest = inputs.rpartition(" (")
        report["inputs"] = f"{published(dataset)} ({rest}"
    return json.dumps(report, indent=1) + "\n"


# ------------------------------------------------------------------------------------- published records
# What a Hub file shows of the training machine's files and folders: their names. Only the arguments that take a path
# (`PATH_ARGUMENTS`) are read as paths; a value counts as a local path by its spelling alone, so the rule gives the
# same answer on every machine (an export made elsewhere, or after the files are gone, publishes the same bytes):
# absolute, home-relative (`~`), or relative with a `.`/`..` part or more than two parts. Built-in names and Hub ids
# (`name`, `org/name`) never look like that; a short relative path (`data.csv`, `runs/base`) is published as typed,
# as it names nothing outside the folder the command ran in. Every other value is a name (a column, a metric, a
# recipe, a `--config` value), which may hold `/` anywhere: only a whole value spelled as an absolute path
# (`is_absolute_path`) is taken for one there, and a column name never (`COLUMN_FLAGS`).
PATH_ARGUMENTS = ("output_dir", "dataset", "from_pretrained", "tokenizer", "lpips_weights", "fid_weights")
LOCAL_ARGUMENTS = ("output_dir",)  # `energyformers train --output_dir`: the run folder, whatever its spelling
LOCAL_RECIPE_FIELDS = ("resumed_from",)  # the checkpoint a resumed run continued from, inside its work folder
WINDOWS_DRIVE = re.compile(r"[A-Za-z]:[\\/]")


def is_absolute_path(value: str) -> bool:
    """Whether `value` is spelled as an absolute or home-relative path (POSIX or Windows)."""
    return value.startswith(("~", "/", "\\")) or bool(WINDOWS_DRIVE.match(value))


def is_local_path(value: str) -> bool:
    """Whether `value`, the value of a path argument, is spelled as a path of the machine it was recorded on (the
    rule above)."""
    if is_absolute_path(value):
        return True
    if "://" in value:  # a URL (hf://datasets/...): not a path of the machine
        return False
    parts = value.replace("\\", "/").split("/")
    return "." in parts or ".." in parts or len([part for part in parts if part]) > 2


def local_name(value: str) -> str:
    """How a Hub file names the local path `value`: its last part (the folder or file name)."""
    return PureWindowsPath(value.rstrip("/\\")).name or value


def published_command(command: str, shown: dict[str, str]) -> str:
    """`command` (as `shlex.join` recorded it) with a token's value redacted (`redacted_argv`, whether or not the
    recorded command already was) and each value that is a local path, alone or as `--flag=PATH`, replaced by its
    name: a recorded path (`shown` maps each to its name) or an absolute path; the value of a column flag is kept
    whatever it is (a flag's values are the words after it, up to the next flag)."""
    kept = {f"--{name}" for name in COLUMN_FLAGS}
    flag = ""

    def publish_value(value: str) -> str:
        if flag in kept:
            return value
        if value in shown:
            return shown[value]
        return local_name(value) if is_absolute_path(value) else value

    words = []
    for word in redacted_argv(shlex.split(command)):
        if word.startswith("--"):
            flag, equals, value = word.partition("=")
            words.append(flag + equals + publish_value(value) if equals else word)
        else:
            words.append(publish_value(word))
    return shlex.join(words)


def published_run_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """A run's metrics.json as an export carries it: every recorded local path (the path arguments spelled as local
    paths, the recorded `--output_dir` and checkpoint) shown by its name, in the arguments, the recipe and its
    command, and anywhere a message quotes it, and any other value spelled as an absolute path; names (columns,
    metrics, `--config` values) are kept as recorded. `local_paths` lists {flag: name} of the arguments so shown
    (kept from an earlier export), for the card to say so. The run folder's own metrics.json keeps them: it records
    the run where it ran."""
    published = json.loads(json.dumps(metrics))  # a copy, whatever the nesting
    local = dict(published.get(LOCAL_PATHS_KEY) or {})
    shown: dict[str, str] = {}
    for group in (published.get("arguments") or {}).values():
        for key, value in (group if isinstance(group, dict) else {}).items():
            if key not in PATH_ARGUMENTS or not isinstance(value, str):
                continue
            if key in LOCAL_ARGUMENTS or is_local_path(value):
                shown[value] = local[f"--{key}"] = local_name(value)
    recipe = published.get("recipe") if isinstance(published.get("recipe"), dict) else {}
    for key in LOCAL_RECIPE_FIELDS:
        if isinstance(recipe.get(key), str):
            shown[recipe[key]] = local_name(recipe[key])
    # in free text (a warning naming the data) only what cannot be part of a word: the absolute ones, longest first
    quoted = sorted(
        (value for value in shown if is_local_path(value) and len(value) > 1), key=len, reverse=True
    )

    def publish(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: publish(item) for key, item in value.items()}
        if isinstance(value, list):
            return [publish(item) for item in value]
        if not isinstance(value, str):
            return value
        if value in shown:
            return shown[value]
        if is_absolute_path(value) and not any(char.isspace() for char in value):
            return local_name(value)
        for path in quoted:
            value = value.replace(path, shown[path])
        return value

    command = recipe.get("command")
    columns = {
        (group_name, key): value
        for group_name, group in (metrics.get("arguments") or {}).items()
        if isinstance(group, dict)
        for key, value in group.items()
        if key in COLUMN_FLAGS
    }
    published = publish(published)
    for (group_name, key), value in columns.items():  # a column name is never a path
        published["arguments"][group_name][key] = value
    if "columns" in metrics:
        published["columns"] = json.loads(json.dumps(metrics["columns"]))
    if isinstance(command, str):
        try:
            published["recipe"]["command"] = published_command(command, shown)
        except ValueError:  # unbalanced quotes: not what `energyformers train` records; paths as quoted above
            words = published["recipe"]["command"].split(" ")
            published["recipe"]["command"] = " ".join(redacted_argv(words))
    if local:
        published[LOCAL_PATHS_KEY] = dict(sorted(local.items()))
    return published


def dynamics_figures(model_dir: Path) -> list[str]:
    """The PNGs `energyformers inspect` wrote into the folder (listed in its inspect.json), present ones only."""
    report = model_dir / INSPECT_REPORT
    if not report.is_file():
        return []
    names = read_json_object(report, optional={"figures": list}, remedy=INSPECT_REMEDY).get("figures") or []
    return [
        name
        for name in names
        if isinstance(name, str) and Path(name).name == name and (model_dir / name).is_file()
    ]


# ---------------------------------------------------------------------------------------- model folder
def inspect_model_dir(model_dir: str | os.PathLike) -> dict[str, Any]:
    """Validate a model folder and describe it: config, family, head, task, files to carry, metrics."""
    import energyformers
    from energyformers import FAMILIES, INPUT_TYPES, task_of

    from .processing import PROCESSOR_FILES, load_processor  # loads transformers: not at this module's import
    from .remote_code import exportable_models

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model folder {str(model_dir)!r} does not exist or is not a directory.")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{model_dir}: missing config.json (write the folder with save_pretrained).")
    config = read_json_object(
        config_path, optional={"model_type": str, "architectures": list, "input_type": str}
    )
    model_type = config.get("model_type")
    baselines = getattr(energyformers, "BASELINES", {})
    models = exportable_models()
    if model_type not in models:
        raise ValueError(
            f"{config_path}: model_type={model_type!r} is not an energyformers family; expected one of {sorted(FAMILIES)}."
        )
    heads = {head.__name__: auto for auto, head in models[model_type].heads.items()}
    architectures = config.get("architectures") or []
    unknown = [a for a in architectures if not isinstance(a, str) or a not in heads]
    if len(architectures) != 1 or unknown:
        raise ValueError(
            f"{config_path}: architectures={architectures!r}; expected exactly one of {sorted(heads)}."
        )
    architecture = architectures[0]
    auto_class = heads[architecture]
    # A baseline is a measurement tool, not a published model, except where the paper publishes it: Table 2 of
    # Hyper-SET compares its masked-image-modelling model with the looped Transformer's, and sharing both lets the
    # comparison be rerun from the Hub.
    if model_type in baselines and auto_class != MIM_AUTO_CLASS:
        raise ValueError(
            f"{config_path}: model_type={model_type!r} ({architecture}) is a baseline for side-by-side measurements, "
            f"not a published model; export and push take the energyformers families {sorted(FAMILIES)} and, of "
            f"the baselines, the masked-image-modelling heads ({MIM_AUTO_CLASS}, the paper's Table 2)."
        )
    input_type = config.get("input_type", "image")
    if input_type not in INPUT_TYPES:
        raise ValueError(f"{config_path}: input_type={input_type!r}; expected one of {sorted(INPUT_TYPES)}.")
    try:
        task = task_of(input_type, auto_class)
    except ValueError as err:  # e.g. an image-classification head saved with input_type="sequence"
        raise ValueError(f"{config_path}: {architecture}: {err}") from err

    files = weight_files(model_dir)
    check_weights_readable(model_dir)
    mim = auto_class == MIM_AUTO_CLASS
    # what a user of the export loads beside the model, loaded here first: nothing broken is published
    load_processor(model_dir, config, mim=mim)
    files += [name for name in (*PROCESSOR_FILES, *EXTRA_FILES) if (model_dir / name).is_file()]
    files += vq_tokenizer_files(model_dir) if mim else []
    files += dynamics_figures(model_dir)
    metrics_path = model_dir / RUN_METRICS
    metrics = read_run_metrics(metrics_path) if metrics_path.is_file() else None
    return {
        "model_dir": model_dir,
        "config": config,
        "model_type": model_type,
        "architecture": architecture,
        "auto_class": auto_class,
        "input_type": input_type,
        "task": task,
        "files": files,
        "metrics": metrics,
    }


def check_weights_load(info: dict[str, Any]) -> int:
    """Load the folder with the in-package class; refuse weights that do not match the config
    (`load_fitting_weights`, the check every command makes)."""
    from .remote_code import exportable_models
    from .weights import load_fitting_weights

    model_class = exportable_models()[info["model_type"]].heads[info["auto_class"]]
    try:
        model = load_fitting_weights(model_class, info["model_dir"])
    except (OSError, RuntimeError) as err:  # e.g. a shard that safetensors cannot read
        raise ValueError(
            f"{info['model_dir']}: cannot load the weights ({' '.join(str(err).split())})"
        ) from err
    return model.num_parameters()


# ----------------------------------------------------------------------------------------------- export
def export_model_dir(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    repo_id: str | None = None,
    overwrite: bool = False,
    info: dict[str, Any] | None = None,
) -> Path:
    """Write a Hub-ready copy of `model_dir` to `out_dir` (see the module docstring); returns `out_dir`.

    `repo_id` only personalises the loading snippets of the card. An existing non-empty `out_dir` is replaced
    only with `overwrite=True`, and only after the new folder is complete (else FileExistsError, as for a file
    there; NotADirectoryError / PermissionError when it cannot be created or written). `info` is `inspect_model_dir(model_dir)`
    where the caller has it already (push), so the folder is checked and its processor loaded once per command.
    """
    from .cli import check_output_folder

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    problem = overlap_problem(model_dir, out_dir, overwrite, ("model_dir", "out_dir", "overwrite=True"))
    if problem is not None:
        raise ValueError(problem)
    check = dict(overwrite=overwrite, error=FileExistsError)
    check_output_folder(out_dir, "out_dir", "overwrite=True", **check, repair_first=True)
    # the folder's lock (train's) from the repair to the rename: no other command repairs or replaces it meanwhile
    with locked_output_dir(out_dir, flag="out_dir"):
        # the previous folder back from where a command killed between its two renames left it, then checked as such
        restore_interrupted_publish(out_dir)
        check_output_folder(out_dir, "out_dir", "overwrite=True", **check)
        return write_export(model_dir, out_dir, repo_id=repo_id, info=info)


def write_export(model_dir: Path, out_dir: Path, *, repo_id: str | None, info: dict[str, Any] | None) -> Path:
    """`export_model_dir`'s work once `out_dir` is checked and locked: the files staged beside it, then published."""
    info = inspect_model_dir(model_dir) if info is None else info
    sources = remote_code_sources(info["model_type"])  # fails before anything is written
    mim = info["auto_class"] == MIM_AUTO_CLASS
    if mim:  # the pipeline too: transformers has no masked-image-modelling task of its own
        sources.update(mim_pipeline_sources())
    sources[LICENSE_FILE] = license_text()  # the license of the code it carries
    num_parameters = check_weights_load(info)

    # what the folder publishes of the run: its record without the training machine's paths, the card rendered from it
    metrics = None if info["metrics"] is None else published_run_metrics(info["metrics"])
    # a SIGTERM or Ctrl-C removes the staging folder; what a SIGKILL left, the next export to `out_dir` removes
    with staging_folder(out_dir) as staging:
        for name in info["files"]:  # names relative to the folder (a VQGAN's files are in a subfolder)
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            if name == INSPECT_REPORT:
                report = published_inspect_report(model_dir / name, repo_id or out_dir.resolve().name)
                (staging / name).write_text(report, encoding="utf-8")
            elif name == RUN_METRICS and metrics is not None:
                (staging / name).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
            else:
                shutil.copyfile(model_dir / name, staging / name)
        for name, source in sources.items():
            (staging / name).write_text(source, encoding="utf-8")
        config = dict(info["config"])
        config["auto_map"] = auto_map(info["model_type"])
        if mim:
            config["custom_pipelines"] = custom_pipelines()
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        card = render_model_card({**info, "metrics": metrics}, repo_id=repo_id, num_parameters=num_parameters)
        card.save(staging / "README.md")
        # an existing folder (`check_output_folder` refused a file) replaced whole, once the new one is complete
        publish(staging, out_dir, overwrite=True)
    return out_dir


def build_parser() -> argparse.ArgumentParser:
    """The `energyformers export` argument parser."""
    from .cli import CommandParser

    parser = CommandParser(
        prog="energyformers export",
        description="Write a Hub-ready folder (safetensors, auto_map, processor, remote code, model card).",
    )
    parser.add_argument("model_dir", help="folder written by `energyformers train` (or save_pretrained)")
    parser.add_argument("out_dir", help="where to write the Hub-ready folder")
    parser.add_argument(
        "--repo-id", "--repo_id", dest="repo_id", help="Hub id shown in the card's loading snippets"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    return parser


def overlap_problem(
    model_dir: Path,
    out_dir: Path,
    overwrite: bool,
    names: tuple[str, str, str] = ("MODEL_DIR", "OUT_DIR", "--overwrite"),
) -> str | None:
    """Why writing the export of `model_dir` to `out_dir` would destroy the model, or None: OUT_DIR is MODEL_DIR,
    or holds it (replacing OUT_DIR deletes the model with it), or is a folder inside it holding files of the model
    (a VQGAN image tokenizer's subfolder) that `overwrite` would replace. Any other folder inside MODEL_DIR is fine:
    the export lists the files it carries, so a later export of MODEL_DIR does not take it along.
    `names`: how the caller spells MODEL_DIR, OUT_DIR and the overwrite flag. Light: reads JSON and folders only."""
    model_name, out_name, overwrite_flag = names
    model, out = model_dir.expanduser().resolve(), out_dir.expanduser().resolve()
    if out == model:
        return f"{out_name} {out_dir} is {model_name} itself; name another folder to write the export into"
    if model.is_relative_to(out):
        return (
            f"{out_name} {out_dir} holds {model_name} {model_dir}, which replacing {out_name} would delete; name a "
            "folder outside it"
        )
    if overwrite and out.is_relative_to(model) and out.is_dir():
        try:
            nested = vq_tokenizer_files(model)
        except (OSError, ValueError):  # a broken tokenizer config: `inspect_model_dir` names it
            nested = []
        held = [name for name in nested if (model / name).resolve().is_relative_to(out)]
        if held:
            return (
                f"{out_name} {out_dir} holds {held[0]} of {model_name} {model_dir}, which {overwrite_flag} would "
                "delete; name a folder that holds no part of the model"
            )
    return None


def check_model_dir(
    model_dir: str | os.PathLike,
    out_dir: str | None = None,
    *,
    overwrite: bool = False,
    flag: str = "model folder",
) -> None:
    """The checks `export`, `push` and `release --take` make before the models load: a model folder with a config
    and readable weights; for `export`, an output that is a folder, neither the model folder nor one holding it
    (`overlap_problem`), and new or empty unless `--overwrite`. A `UsageError` naming `flag` and the path (once)."""
    from .cli import UsageError, check_output_folder

    folder = Path(model_dir).expanduser()
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"{flag} {model_dir} {what}; pass a folder written by `energyformers train`")
    check_model_folder(model_dir, label=flag)
    if out_dir is None:
        return
    problem = overlap_problem(Path(model_dir), Path(out_dir), overwrite)
    if problem is not None:
        raise UsageError(problem)
    # repaired and checked again as `export_model_dir` does, for this check to see the folder as the export will; a
    # command using the folder is refused here
    check_output_folder(out_dir, "OUT_DIR", "--overwrite", overwrite=overwrite, repair_first=True)
    with locked_output_dir(out_dir, flag="OUT_DIR"):
        restore_interrupted_publish(Path(out_dir).expanduser())
        check_output_folder(out_dir, "OUT_DIR", "--overwrite", overwrite=overwrite)


def parse(argv: list[str]) -> argparse.Namespace:
    """The arguments, with the model folder and the output folder checked (`check_model_dir`)."""
    args = build_parser().parse_args(argv)
    check_model_dir(args.model_dir, args.out_dir, overwrite=args.overwrite)
    return args


def run(args: argparse.Namespace) -> int:
    """Export the folder; prints where it was written and returns the exit status."""
    from transformers.utils import logging as hf_logging

    from .cli import UsageError

    hf_logging.disable_progress_bar()  # the check loads the weights once: the bar is noise (run_command restores)
    try:
        out = export_model_dir(args.model_dir, args.out_dir, repo_id=args.repo_id, overwrite=args.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError) as err:  # the folder's content, or OUT_DIR taken
        raise UsageError(str(err)) from None
    print(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point of `energyformers export`; returns the exit status."""
    from .cli import run_command

    argv = list(sys.argv[1:] if argv is None else argv)
    return run_command("export", parse, run, argv, writes_to=written_folders)


def written_folders(args: argparse.Namespace) -> list[Path]:
    """Where an export writes (for `cli.run_command`'s full-disk report): the folder holding OUT_DIR, in which its
    staging folder is."""
    return [Path(args.out_dir).expanduser().absolute().parent]


__all__ = [
    "EXTRA_FILES",
    "MIM_AUTO_CLASS",
    "PICKLE_WEIGHTS",
    "auto_map",
    "check_weights_load",
    "export_model_dir",
    "generate_remote_code",
    "inspect_model_dir",
    "remote_code_sources",
    "render_model_card",
    "vq_tokenizer_files",
]
