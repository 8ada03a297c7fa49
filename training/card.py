"""The model card: one renderer and one template for every model folder (training runs and Hub exports).

`model_cards/card.md` is the card (Jinja, rendered by `huggingface_hub.ModelCard.from_template`); each
family's `model_cards/<model_type>.md` holds only what differs per family, as named sections
(`<!-- section: NAME -->`: display_name, summary, usage_note, intended_use, reference, deviations, citation).
A model without its own section file (a baseline) uses `model_cards/baseline.md`. The run's measured metrics
(`metrics.json`) become the card's `model-index` results and its evaluation table.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path, PureWindowsPath
from typing import Any

from ..tokenizer_fit import MIM_AUTO_CLASS, MIM_TASK, TOKENIZER_CONFIG_NAME, TOKENIZER_WEIGHTS_NAME
from .weights import read_json_object

logger = logging.getLogger(__name__)

# Template folders: the repository's model_cards/ (editable installs), or where a wheel's data-files put them.
CARD_TEMPLATE_DIRS = (
    Path(__file__).resolve().parent.parent / "model_cards",
    Path(sys.prefix) / "share" / "energyformers" / "model_cards",
)
CARD_TEMPLATE = "card.md"
BASELINE_SECTIONS = "baseline.md"
SECTIONS = ("display_name", "summary", "usage_note", "intended_use", "reference", "deviations", "citation")

# Config fields listed in the card's hyper-parameter table, where the config has them.
CARD_CONFIG_KEYS = (
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
    # recurrent-depth training (`RecurrentDepthConfig`): a loss on several iterations, supervision steps with a
    # detached carry, the halting head; they say how the checkpoint was trained to use its depth
    "deep_supervision",
    "deep_supervision_interval",
    "deep_supervision_samples",
    "deep_supervision_weights",
    "supervision_steps",
    "halting_head",
    "halting_loss_weight",
    "num_centers",
    "image_size",
    "patch_size",
    "num_channels",
    "vocab_size",
    "max_position_embeddings",
)
IMAGE_ONLY_KEYS = frozenset({"image_size", "patch_size", "num_channels"})
# Masked image modelling (`…ForMaskedImageModeling`, docs/mim.md): the Hub has no masked-image-modelling task. The
# model fills masked regions of an image given as the codes of an image tokenizer, and with that tokenizer (carried
# in the folder) an image goes in and its reconstruction comes out: the Hub's "image-to-image" task, whose subtask
# "image-inpainting" is what it does. The package's task name, "masked-image-modeling" (`energyformers.INPUT_TYPES`,
# the task `MaskedImageModelingPipeline` is registered as with transformers), is not a Hub task, so it is a tag. Not
# "fill-mask": that is the Hub's text task (its widget and transformers' pipeline of that name take text with a mask
# token).
MIM_PIPELINE_TAG = "image-to-image"
# (metrics.json key, model-index metric type, display name) of the metrics a MIM run logs, in table order
MIM_METRICS = (
    ("masked_token_accuracy", "accuracy", "masked-token accuracy"),
    ("decoded_token_accuracy", "accuracy", "decoded-token accuracy"),
    ("psnr", "psnr", "PSNR (dB)"),
    ("ssim", "ssim", "SSIM"),
    ("tokenizer_psnr", "psnr", "tokenizer PSNR (dB)"),
)
SEQUENCE_ONLY_KEYS = frozenset({"vocab_size", "max_position_embeddings"})
# A token-classification head is the package's Sudoku model (`energyformers train --dataset sudoku|sudoku-hard`,
# docs/training.md): its inputs are 81-cell puzzles and its run logs these metrics (`evaluation.task_metrics`).
SUDOKU_TASK = "token-classification"
SUDOKU_METRICS = (
    ("blank_cell_accuracy", "accuracy", "blank-cell accuracy"),
    ("board_accuracy", "accuracy", "board accuracy"),
)
CLASSIFICATION_METRICS = (("accuracy", "accuracy", "Accuracy"), ("f1_macro", "f1", "F1 (macro)"))
# The card's example puzzle: a well-known 30-given board with one solution, row by row, 0 = blank (the cell
# tokenizer of `training/processing.py` also reads "." as blank and ignores whitespace).
SUDOKU_EXAMPLE = "530070000600195000098000060800060003400080001700020006060000280000419005000080079"
# The text classifiers' example sentence: words of the movie-review vocabulary the reference runs train on.
TEXT_EXAMPLE = "a gripping, well acted film"
# A sentence-pair classifier's example, in the form transformers' text-classification pipeline takes a pair.
PAIR_EXAMPLE = {"text": TEXT_EXAMPLE, "text_pair": "the acting is good"}


def find_template(name: str) -> Path | None:
    """`name` in the first card-template folder that has it."""
    return next((d / name for d in CARD_TEMPLATE_DIRS if (d / name).is_file()), None)


def read_sections(path: Path) -> dict[str, str]:
    """The named sections of a family file (`<!-- section: NAME -->` up to the next marker)."""
    parts = re.split(r"^<!-- section: (\w+) -->\n", path.read_text(encoding="utf-8"), flags=re.M)
    sections = {name: text.strip() for name, text in zip(parts[1::2], parts[2::2])}
    missing = [name for name in SECTIONS if name not in sections]
    if missing:
        raise ValueError(f"{path}: missing card sections {missing}; expected {list(SECTIONS)}")
    return sections


# Characters a code span must not hold raw: control characters (a newline), and the line and paragraph separators
CONTROL_CATEGORIES = ("Cc", "Zl", "Zp")


def inline_code(text: str) -> str:
    """`text` as a Markdown code span, shown as typed whatever it holds: a label comes from the dataset (a class
    folder, a CSV value), and raw it could add Markdown or HTML to the card (a heading, a link). The fence is one
    backtick longer than the longest run inside; a control character (a newline would start a line of its own) is
    shown as its escape (`\\n`)."""
    import unicodedata

    shown = "".join(
        char.encode("unicode_escape").decode("ascii")
        if unicodedata.category(char) in CONTROL_CATEGORIES
        else char
        for char in text
    )
    if not shown.strip(" "):  # no code span is empty or spaces only: Markdown would strip or drop them
        shown = repr(shown)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", shown)), default=0) + 1)
    # a space inside each fence, which Markdown strips, keeps a backtick at an end apart from the fence, and keeps
    # the spaces of a label that starts and ends with one (Markdown strips one of each then)
    pad = " " if shown[:1] == "`" or shown[-1:] == "`" or shown[:1] == shown[-1:] == " " else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def _label_list(labels: list[Any], limit: int = 20) -> str:
    shown = ", ".join(inline_code(str(label)) for label in labels[:limit])
    return shown + (f", … ({len(labels)} in total)" if len(labels) > limit else "")


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else "—" if value is None else str(value)


# The fields of a run's metrics.json the card reads, each with the type it must have where present (not null).
METRICS_FIELDS = {
    "dataset": str,
    "preset": str,
    "recipe": dict,
    "eval": dict,
    "test": dict,
    "wall_time_s": (int, float),
    "warnings": list,
    "columns": dict,
    "local_paths": dict,
}
# The key of an exported metrics.json listing {flag: name} of the arguments that named files or folders of the
# training machine, which it and the card show by their names (`export.published_run_metrics`).
LOCAL_PATHS_KEY = "local_paths"
LOCAL_DATASET = "A local file or folder of the machine it was trained on, named here by its name."
METRICS_REMEDY = "it is the run's record, written by `energyformers train`: restore it, or delete it to publish the model without metrics"


def read_run_metrics(path: Path) -> dict[str, Any]:
    """A run's metrics.json as the card reads it: an object whose fields (`METRICS_FIELDS`, the recipe's
    from_pretrained, the warnings) have the types the card renders; a ValueError naming the file otherwise."""
    metrics = read_json_object(path, optional=METRICS_FIELDS, remedy=METRICS_REMEDY)
    source = (metrics.get("recipe") or {}).get("from_pretrained")
    if source is not None and not isinstance(source, str):
        raise ValueError(
            f"{path}: recipe.from_pretrained={json.dumps(source)} is not a string; {METRICS_REMEDY}."
        )
    if not all(isinstance(warning, str) for warning in metrics.get("warnings") or []):
        raise ValueError(f"{path}: warnings holds a value that is not a string; {METRICS_REMEDY}.")
    if not all(isinstance(column, str) for column in (metrics.get("columns") or {}).values()):
        raise ValueError(f"{path}: columns holds a value that is not a string; {METRICS_REMEDY}.")
    if not all(isinstance(name, str) for name in (metrics.get(LOCAL_PATHS_KEY) or {}).values()):
        raise ValueError(f"{path}: {LOCAL_PATHS_KEY} holds a value that is not a string; {METRICS_REMEDY}.")
    return metrics


def sentence_pair_columns(metrics: dict[str, Any]) -> tuple[str, str] | None:
    """The (text, text pair) columns of a model trained on sentence pairs, as its run recorded the columns it read
    (metrics.json's `columns`); None for a model of single inputs or without that record. The tokenizer cannot
    tell: every text run's has the pair template, `[CLS] A [SEP] B [SEP]`."""
    columns = metrics.get("columns") or {}
    if not columns.get("text_pair_column"):
        return None
    return columns.get("text_column") or "text", columns["text_pair_column"]


def provenance(metrics: dict[str, Any], dataset_name: str) -> str:
    """ "This model was trained from scratch on X." or "This model is a fine-tuned version of Y on X."."""
    source = (metrics.get("recipe") or {}).get("from_pretrained")
    on = f" on {dataset_name}" if dataset_name else ""
    if not source:
        return f"This model was trained from scratch{on}." if metrics else ""
    # a local folder: one an export showed by its name, or one here (the run folder's own card)
    local = "--from_pretrained" in (metrics.get(LOCAL_PATHS_KEY) or {}) or Path(source).exists()
    shown = f"`{Path(source).name}`" if local else f"[{source}](https://huggingface.co/{source})"
    return f"This model is a fine-tuned version of {shown}{on}."


def _vq_tokenizer_class(info: dict[str, Any]) -> str | None:
    """The image tokenizer class a MIM folder carries (named in its `vq_tokenizer_config.json`), None without one."""
    if TOKENIZER_CONFIG_NAME not in info["files"]:
        return None
    if "model_dir" in info:  # an export reads the folder; a run's card is written before its folder is final
        path = Path(info["model_dir"]) / TOKENIZER_CONFIG_NAME
        return read_json_object(path, optional={"tokenizer_class": str}).get("tokenizer_class")
    # what `energyformers.mim` writes: a codebook beside the config, or a VQGAN in a subfolder
    return "PatchKMeansTokenizer" if TOKENIZER_WEIGHTS_NAME in info["files"] else "VQGANTokenizer"


def dataset_card_fields(dataset: str | None) -> tuple[str | None, str | None, str]:
    """(display name, Hub dataset id, description) of a dataset a run recorded, from the built-in datasets' table
    (`training/data.py`, `BUILTIN_DATASETS`); a dataset outside it is shown by its name."""
    if not dataset:
        return None, None, ""
    from .data import BUILTIN_DATASETS  # the datasets library loads only when a card names a dataset

    builtin = BUILTIN_DATASETS.get(dataset)
    if builtin is None:
        return dataset, None, ""
    return builtin.display_name, builtin.hub_id, builtin.description


def dataset_short_name(dataset: str, local_paths: dict[str, str]) -> str:
    """How a model's default name shows the dataset it was trained on: a local data file by its stem (`reviews` of
    `/data/reviews.csv`, or of `reviews.csv` as an export names it), a local folder by its name, a Hub dataset by its
    repository's name (`imdb` of `stanfordnlp/imdb`: a model name holds no "/"), a built-in by its name. Light (no
    `datasets`): `release` asks it before anything trains."""
    from .cli import TABLE_BUILDERS
    from .export import is_local_path, local_name

    # local: named so by an export (`local_paths`), spelled as a path, or a data file the loader reads, which only
    # a local path is (a Hub dataset is a repo id); a built-in is none of these and keeps its name
    suffix = PureWindowsPath(dataset).suffix.lower()
    if not (dataset == local_paths.get("--dataset") or is_local_path(dataset) or suffix in TABLE_BUILDERS):
        return dataset.rsplit("/", 1)[-1]
    name = local_name(dataset)
    stem, suffix = PureWindowsPath(name).stem, PureWindowsPath(name).suffix
    return stem if suffix.lower() in TABLE_BUILDERS and stem else name


def default_model_name(
    model_type: str, dataset: str, local_paths: dict[str, str] | None = None, mim: bool = False
) -> str:
    """`<model>-<dataset>` (`<model>-mim-<dataset>` for masked image modelling, named apart from the same model's
    classifier), the dataset as `dataset_short_name` shows it: the card's model name without a repo id or run name,
    and the name of the folders `release` trains into and exports to."""
    return f"{model_type}-{'mim-' if mim else ''}{dataset_short_name(dataset, local_paths or {})}"


def conversion_record(
    *,
    official_class: str,
    repository: str,
    commit: str | None,
    checkpoint: str,
    sha256: str,
    layout: str,
    dtype: str,
    kwargs: dict[str, Any],
    notes: list[str],
    processor: str,
    extras_file: str,
    extras: list[str],
    input_description: str,
    checks: list[tuple[str, float, float]],
) -> dict[str, Any]:
    """What `render_model_card(..., conversion=...)` shows of a conversion: the official source and checkpoint,
    the structure notes and the verification `checks` as (what, max abs difference, tolerance)."""
    shown = ", ".join(f"`{key}`" for key in extras[:6]) + (", …" if len(extras) > 6 else "")
    return {
        "official_class": official_class,
        "repository": repository,
        "commit": commit,
        "checkpoint": checkpoint,
        "sha256": sha256,
        "layout": layout,
        "dtype": dtype,
        "kwargs_json": json.dumps(kwargs, indent=2),
        "notes": list(notes),
        "processor": processor,
        "extras_file": extras_file,
        "extras": list(extras),
        "extras_shown": shown,
        "input": input_description,
        "checks": [
            {"what": what, "error": f"{error:.3e}", "tolerance": f"{tolerance:.0e}"}
            for what, error, tolerance in checks
        ],
    }


def render_model_card(
    info: dict[str, Any],
    repo_id: str | None = None,
    num_parameters: int | None = None,
    *,
    remote_code: bool = True,
    conversion: dict[str, Any] | None = None,
) -> Any:
    """`card.md` with the family's sections, filled with the folder's config and measured metrics.

    `info` describes the folder (keys of `export.inspect_model_dir`: config, model_type, architecture,
    auto_class, input_type, task, files, metrics); `remote_code` says whether the folder carries the flat
    remote code (an export does, a training run's folder does not). `conversion` (`conversion_record`) makes
    it the card of a folder `energyformers convert` wrote from the authors' checkpoint: its provenance and
    verification replace the training recipe. Returns a `huggingface_hub.ModelCard`.
    """
    import jinja2
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    import energyformers

    config, metrics, task = info["config"], info["metrics"] or {}, info["task"]
    # Without the run's metrics.json nothing is known of the training (data, recipe, evaluation, even whether the
    # model was trained at all): the card then states only what the folder itself holds.
    recorded = bool(metrics)
    mim = info["auto_class"] == MIM_AUTO_CLASS
    pipeline_tag = MIM_PIPELINE_TAG if mim else task
    dataset = metrics.get("dataset")
    display, hub_id, description = dataset_card_fields(dataset)
    # (metrics.json key, model-index type, name): what the run measured for this head
    sudoku = not mim and task == SUDOKU_TASK
    measured = MIM_METRICS if mim else SUDOKU_METRICS if sudoku else CLASSIFICATION_METRICS
    eval_results, rows = [], []
    for split in ("test", "eval"):
        split_metrics = metrics.get(split) or {}
        if any(split_metrics.get(key) is not None for key, _, _ in measured):
            values = " | ".join(_fmt(split_metrics.get(key)) for key, _, _ in measured)
            rows.append(f"| {display} | {split} | {values} |")
    reported = (
        "test" if metrics.get("test") else "eval"
    )  # model-index: the held-out test split when there is one
    for key, metric_type, metric_name in measured:
        value = (metrics.get(reported) or {}).get(key)
        if value is not None:
            eval_results.append(
                EvalResult(
                    task_type=pipeline_tag,
                    dataset_type=hub_id or dataset,
                    dataset_name=display,
                    dataset_split=reported,
                    metric_type=metric_type,
                    metric_name=metric_name,
                    metric_value=value,
                    metric_args={"average": "macro"} if key == "f1_macro" else None,
                )
            )
    model_type = info["model_type"]
    local_paths = metrics.get(LOCAL_PATHS_KEY) or {}
    if dataset:
        default_name = default_model_name(model_type, dataset, local_paths, mim)
    else:
        default_name = f"{model_type}-{'mim-' if mim else ''}model"
    name = repo_id.split("/")[-1] if repo_id else info.get("name") or default_name
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        license="apache-2.0",
        # a MIM head reads image codes and a Sudoku head digits, not text, although their input_type is "sequence"
        language="en" if info["input_type"] == "sequence" and not (mim or sudoku) else None,
        tags=[
            "energyformers",
            model_type,
            # a baseline (the looped Transformer) is a plain Transformer, not an energy-based model
            *([] if model_type in getattr(energyformers, "BASELINES", {}) else ["energy-based"]),
            *(["custom_code"] if remote_code else []),
            *(["converted-checkpoint"] if conversion else []),
            *([MIM_TASK, "image-inpainting", "maskgit"] if mim else [task]),
        ],
        datasets=[hub_id] if hub_id else None,
        # the metrics the card reports a value of (none without an evaluation)
        metrics=list(dict.fromkeys(result.metric_type for result in eval_results)) or None,
        model_name=name,
        eval_results=eval_results or None,
    )
    recipe = metrics.get("recipe") or {}
    if "--dataset" in local_paths and dataset == local_paths["--dataset"]:
        description = LOCAL_DATASET
    pairs = sentence_pair_columns(metrics) if task == "text-classification" else None
    skip = SEQUENCE_ONLY_KEYS if info["input_type"] == "image" else IMAGE_ONLY_KEYS
    hyper = {k: config[k] for k in CARD_CONFIG_KEYS if k in config and k not in skip}
    models = {**energyformers.FAMILIES, **getattr(energyformers, "BASELINES", {})}
    stem = getattr(models.get(model_type), "stem", model_type)
    remote_files = []
    if remote_code and model_type in models:
        from .remote_code import MIM_PIPELINE_FILE, MIM_TOKENIZER_FILE, remote_code_sources

        # a MIM export also carries its pipeline (`export_model_dir`), cut from the package sources as well
        generated = [
            *remote_code_sources(model_type),
            *([MIM_PIPELINE_FILE, MIM_TOKENIZER_FILE] if mim else []),
        ]
        remote_files = [f"`{name}`" for name in sorted(generated)]
    variables = {
        "model_name": name,
        "repo_id": repo_id or f"<your-namespace>/{name}",
        "model_type": model_type,
        "stem": stem,
        "architecture": info["architecture"],
        "auto_class": info["auto_class"],
        "task": "masked image modelling (MaskGIT-style, over the codes of an image tokenizer)"
        if mim
        else task,
        "pipeline_tag": pipeline_tag,
        "mim": mim,
        "sudoku": sudoku,
        "vq_tokenizer": _vq_tokenizer_class(info) if mim else None,
        "remote_files": ", ".join(remote_files),
        "input_type": info["input_type"],
        "processor_class": energyformers.INPUT_TYPES[info["input_type"]].processor_class,
        "example_input": json.dumps(
            "path/to/image.png"
            if info["input_type"] == "image"
            else SUDOKU_EXAMPLE
            if sudoku
            else PAIR_EXAMPLE
            if pairs
            else TEXT_EXAMPLE
        ),
        "pair_columns": pairs,
        # a MIM head has no classes (its outputs are codes; config.id2label is transformers' default)
        "labels": "" if mim else _label_list(list((config.get("id2label") or {}).values())),
        "num_parameters": f"{num_parameters:,}" if num_parameters else _fmt(metrics.get("num_parameters")),
        "config_summary": "\n".join(f"| `{k}` | `{json.dumps(v)}` |" for k, v in hyper.items()),
        "dataset_name": display or "not recorded",
        "dataset_description": description,
        "provenance": provenance(metrics, f"`{dataset}`" if dataset else ""),
        "preset": metrics.get("preset") or "not recorded",
        "recipe_command": recipe.get("command") or "not recorded",
        "local_paths": ", ".join(f"`{flag} {name}`" for flag, name in local_paths.items()),
        "recipe_summary": ", ".join(
            f"{k}={v}" for k, v in recipe.items() if k != "command" and isinstance(v, (int, float, str))
        )
        or "not recorded",
        "wall_time": f"{metrics['wall_time_s']:.1f}"
        if metrics.get("wall_time_s") is not None
        else "not recorded",
        "eval_rows": "\n".join(rows),
        "has_metrics": bool(rows),
        "recorded": recorded,
        "has_curve": "training_curve.png" in info["files"],
        "dynamics_figures": [
            name for name in info["files"] if name.endswith(".png") and name != "training_curve.png"
        ],
        "warnings": "; ".join(metrics.get("warnings") or []),
        "remote_code": remote_code,
        "energyformers_version": energyformers.__version__,
        "conversion": conversion,
    }
    template = find_template(CARD_TEMPLATE)
    family_file = find_template(f"{model_type}.md") or find_template(BASELINE_SECTIONS)
    variables["sections_file"] = getattr(family_file, "name", None)  # named in the card's "Generated by" line
    if (
        template is None or family_file is None
    ):  # e.g. an install without the repository's model_cards/ folder
        logger.warning(
            "no card template %s / %s.md in %s; using huggingface_hub's default",
            CARD_TEMPLATE,
            model_type,
            CARD_TEMPLATE_DIRS,
        )
        return ModelCard.from_template(
            card_data, model_id=name, model_summary=f"{info['architecture']} (energyformers)"
        )
    sections = {
        key: jinja2.Template(text).render(**variables) for key, text in read_sections(family_file).items()
    }
    return ModelCard.from_template(card_data, template_path=str(template), **variables, **sections)


__all__ = [
    "CARD_CONFIG_KEYS",
    "CARD_TEMPLATE_DIRS",
    "LOCAL_PATHS_KEY",
    "MIM_METRICS",
    "MIM_PIPELINE_TAG",
    "conversion_record",
    "dataset_card_fields",
    "dataset_short_name",
    "default_model_name",
    "find_template",
    "provenance",
    "read_sections",
    "render_model_card",
    "sentence_pair_columns",
]
