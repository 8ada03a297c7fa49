"""`energyformers predict DIR INPUT...`: classify image files or texts, or reconstruct masked images, with a saved
model folder.

    energyformers predict runs/demo-hyperset img1.png img2.jpg
    energyformers predict runs/rt-hyperset "a gripping, funny film" "two hours I will never get back"
    echo "one text per line" | energyformers predict runs/rt-hyperset -

A text classifier trained on sentence pairs takes each input as `TEXT<TAB>PAIR` with `--text_pairs` (split at the
first TAB, given to the pipeline as {"text", "text_pair"}):

    printf 'a gripping film\\tthe acting is good\\n' | energyformers predict runs/pairs-hyperbf - --text_pairs

Uses `transformers.pipeline` on the folder (model + saved processor/tokenizer), exactly as a user would;
the task follows the saved head (`config.architectures`): image, text or token classification.
The depth flags (`--num_iterations` for Hyper-SET and the looped Transformer; `--halting_tolerance`,
`--halting_criterion` for Hyper-SET; `--fixed_point_iterations`, `--fixed_point_solver`, `--fixed_point_tolerance`
for iMixer) choose the test-time depth of every model call through `energyformers.pipelines`, without editing the
saved config:

    energyformers predict runs/demo-hyperset img.png --num_iterations 24 --halting_tolerance 1e-3

The search flags (`--search_trajectories K`, `--search_noise`, `--search_seed`, `--search_selector`; Hyper-SET and
the looped Transformer) run test-time search: K perturbed trajectories per input, one kept per input by the
selector; `--halting_threshold` sets where a halting head stops the supervision steps:

    energyformers predict runs/sudoku-hyperset - --search_trajectories 8 --search_noise 0.1 --search_selector sudoku

A masked-image-modelling folder (its image tokenizer saved beside the weights) reconstructs image files instead,
through `transformers.pipeline("masked-image-modeling", model=DIR)` (`MaskedImageModelingPipeline`): each image is
tokenized, a `--mask_ratio` share of its codes masked (seeded by `--seed`), decoded in `--steps` MaskGIT steps and
measured against the input; one line of metrics per image, and with `--output_dir` its reconstruction as
`<stem>.reconstruction.png`:

    energyformers predict runs/mim-digits img1.png img2.png --mask_ratio 0.4 --steps 8 --output_dir recon --json

A flag of the other kind of model (`--mask_ratio` for a classifier, `--top_k` or a search flag for a
masked-image-modelling model) is refused, naming the flag and the model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..auto_registration import AUTO_HEADS
from ..tokenizer_fit import MIM_TASK, TOKENIZER_CONFIG_NAME
from .arguments import check_attn_flag
from .cli import CommandParser, UsageError, check_model_source, check_output_folder, in_hub_cache, run_command

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Suffixes of image files (the image-folder loader's list): such a path given to a text model is a mistake.
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
# A Sudoku puzzle string (`processing.cell_tokenizer`): 81 cells, each a digit (0 = blank) or '.' (blank).
SUDOKU_CELLS = 81
SUDOKU_CELL_CHARACTERS = frozenset("0123456789.")


# Depth flags: the forward argument each sets (`energyformers.pipelines.DEPTH_ARGUMENTS`) and its help.
DEPTH_FLAGS = {
    "num_iterations": "iterations of each recurrent block (Hyper-SET, looped Transformer); default: the config's",
    "halting_tolerance": "stop iterating once the update is below this (Hyper-SET; > 0); default: the config's",
    "halting_criterion": "what --halting_tolerance measures (Hyper-SET): the state or the energy change",
    "fixed_point_iterations": "fixed-point steps of each token mixer (iMixer; >= 0); default: the config's",
    "fixed_point_solver": "fixed-point solver (iMixer); default: the config's",
    "fixed_point_tolerance": "stop the tolerance solvers below this residual (iMixer; > 0); default: the config's",
    "halting_threshold": "a sample stops its supervision steps once the halting head's probability exceeds this "
    "(models with halting_head; in (0, 1)); default: 0.5",
    "search_trajectories": "test-time search: K trajectories per input from perturbed starts, one kept by "
    "--search_selector (Hyper-SET, looped Transformer; >= 1); default: no search",
    "search_noise": "scale σ >= 0 of the Gaussian noise on the starting state, relative to each token's rms "
    "(trajectory 0 starts unperturbed); default: 0",
    "search_seed": "seed of the search noise (>= 0); default: a fresh draw",
    "search_selector": "which trajectory to keep: lowest final energy (Hyper-SET), highest mean confidence, or a "
    "valid Sudoku board (else lowest energy / highest confidence); default: energy (Hyper-SET), confidence (looped)",
}
# The package's own choices (`HyperSetConfig.choices["halting_criterion"]`, `modeling_hyperset.SEARCH_SELECTORS`,
# `IMixerConfig.choices["fixed_point_solver"]`), copied so `--help` imports no torch; a test keeps them equal.
HALTING_CRITERIA = ("state", "energy")
SEARCH_SELECTORS = ("energy", "confidence", "sudoku")
FIXED_POINT_SOLVERS = ("unrolled", "picard", "anderson")


def add_halting_and_solver_flags(group: Any) -> None:
    """Hyper-SET's halting and iMixer's fixed-point flags (`DEPTH_FLAGS`), as `predict` and `evaluate` take them."""
    group.add_argument("--halting_tolerance", type=float, help=DEPTH_FLAGS["halting_tolerance"])
    group.add_argument("--halting_criterion", choices=HALTING_CRITERIA, help=DEPTH_FLAGS["halting_criterion"])
    group.add_argument("--fixed_point_iterations", type=int, help=DEPTH_FLAGS["fixed_point_iterations"])
    group.add_argument(
        "--fixed_point_solver", choices=FIXED_POINT_SOLVERS, help=DEPTH_FLAGS["fixed_point_solver"]
    )
    group.add_argument("--fixed_point_tolerance", type=float, help=DEPTH_FLAGS["fixed_point_tolerance"])


# Masked-image-modelling flags: call arguments of `MaskedImageModelingPipeline` (`--num_iterations`, a depth flag, is
# one as well), and `--output_dir`. `MIM_SCHEDULES` is `MASKGIT_SCHEDULES`' names (a test keeps them equal; naming
# them here keeps argument parsing free of torch).
MIM_FLAGS = {
    "mask_ratio": "share of each image's codes masked before decoding, in [0, 1]; default: 0.4 (the paper's)",
    "steps": "MaskGIT decoding steps (>= 1); default: the model's decode default (24)",
    "schedule": "how many masked codes each decoding step fixes; default: arccos",
    "temperature": "sampling temperature of the codes (> 0); default: 1",
    "randomize_temperature": "scale of the Gumbel noise on the confidence ranking (>= 0); default: 4.5",
    "seed": "seed of the mask and of the decoding, the same for every image (>= 0); default: 0",
    "output_dir": "write each reconstruction as DIR/<stem>.reconstruction.png (the folder is created); "
    "default: print the metrics only",
    "lpips_weights": "also print LPIPS (and tokenizer_lpips), its backbone read from this local file (torchvision's "
    "alexnet-owt-7be5be79.pth, vgg16-397923af.pth or squeezenet1_1-b8a52dc0.pth; needs torchvision); nothing is "
    "downloaded",
}
# Of the flags above, those that build the pipeline rather than go to each call.
MIM_PIPELINE_FLAGS = ("lpips_weights",)
MIM_SCHEDULES = ("arccos", "cosine", "linear", "root", "square")
# The allowed values of the numeric masked-image-modelling flags (`inspect` takes some of them too): (test, allowed).
MIM_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "mask_ratio": (lambda v: 0 <= v <= 1, "a fraction in [0, 1]"),  # NaN fails both comparisons
    "steps": (lambda v: v >= 1, "an integer >= 1"),
    "temperature": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
    "randomize_temperature": (lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"),
    # torch.Generator.manual_seed's range
    "seed": (lambda v: 0 <= v < 2**63, "an integer in [0, 2**63)"),
}
# Flags of the classification heads only: a masked-image-modelling model has no labels to rank, and its decoding
# runs no halting or search.
CLASSIFICATION_FLAGS = ("top_k", *(name for name in DEPTH_FLAGS if name != "num_iterations"))
MIM_SUFFIX = ".reconstruction.png"
# The model_types predict runs: the package's families and baselines (`energyformers.auto_registration`, light) and
# transformers' own baselines the training CLI trains (`registry.TRANSFORMERS_BASELINES`; a test keeps them equal).
MODEL_TYPES = (*AUTO_HEADS, "vit")


def build_parser() -> argparse.ArgumentParser:
    """The `energyformers predict` argument parser."""
    p = CommandParser(prog="energyformers predict", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", help="a folder written by `energyformers train` (or a Hub repo id)")
    p.add_argument(
        "inputs",
        nargs="+",
        help="image paths for image and masked-image-modelling models, texts for text models (a file's name is "
        "refused: '-' reads one text per line from stdin, e.g. '- < reviews.txt')",
    )
    p.add_argument("--top_k", type=int, help="labels shown per input, best first (classifiers; default: 1)")
    p.add_argument(
        "--text_pairs",
        action="store_true",
        help="each input is a sentence pair, TEXT<TAB>PAIR, split at the first TAB (text classifiers; the texts "
        "train and evaluate read from --text_column and --text_pair_column)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per input")
    p.add_argument(
        "--trust_remote_code", action="store_true", help="for exported folders without the package"
    )
    p.add_argument(
        "--attn_implementation",
        help="attention implementation, as transformers' attn_implementation (hyperset: eager, sdpa, triton; "
        "hyperbf, looped-transformer: eager, sdpa; imixer: eager); unset: the model's default",
    )
    depth = p.add_argument_group(
        "test-time depth (passed to every model call; the flags the model's forward takes)"
    )
    depth.add_argument("--num_iterations", type=int, help=DEPTH_FLAGS["num_iterations"])
    add_halting_and_solver_flags(depth)
    search = p.add_argument_group("test-time search and halting (passed to every model call)")
    search.add_argument("--halting_threshold", type=float, help=DEPTH_FLAGS["halting_threshold"])
    search.add_argument("--search_trajectories", type=int, help=DEPTH_FLAGS["search_trajectories"])
    search.add_argument("--search_noise", type=float, help=DEPTH_FLAGS["search_noise"])
    search.add_argument("--search_seed", type=int, help=DEPTH_FLAGS["search_seed"])
    search.add_argument("--search_selector", choices=SEARCH_SELECTORS, help=DEPTH_FLAGS["search_selector"])
    mim = p.add_argument_group(
        "masked-image-modelling models (reconstruct image files; --num_iterations sets the depth of each step)"
    )
    mim.add_argument("--mask_ratio", type=float, help=MIM_FLAGS["mask_ratio"])
    mim.add_argument("--steps", type=int, help=MIM_FLAGS["steps"])
    mim.add_argument("--schedule", choices=MIM_SCHEDULES, help=MIM_FLAGS["schedule"])
    mim.add_argument("--temperature", type=float, help=MIM_FLAGS["temperature"])
    mim.add_argument("--randomize_temperature", type=float, help=MIM_FLAGS["randomize_temperature"])
    mim.add_argument("--seed", type=int, help=MIM_FLAGS["seed"])
    mim.add_argument("--output_dir", metavar="DIR", help=MIM_FLAGS["output_dir"])
    mim.add_argument("--lpips_weights", metavar="FILE", help=MIM_FLAGS["lpips_weights"])
    return p


def depth_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The depth flags that were given, as forward arguments; a `UsageError` for a value out of range."""
    given = {name: getattr(args, name) for name in DEPTH_FLAGS if getattr(args, name) is not None}
    ranges = {
        "num_iterations": (lambda v: v >= 1, "an integer >= 1"),
        "halting_tolerance": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
        "fixed_point_iterations": (lambda v: v >= 0, "an integer >= 0"),
        "fixed_point_tolerance": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
        "halting_threshold": (lambda v: 0 < v < 1, "a number in (0, 1)"),
        "search_trajectories": (lambda v: v >= 1, "an integer >= 1"),
        "search_noise": (lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"),
        "search_seed": (lambda v: 0 <= v < 2**63, "an integer in [0, 2**63)"),
    }
    check_ranges(given, ranges)
    orphans = [f"--{name}" for name in ("search_noise", "search_seed", "search_selector") if name in given]
    if orphans and "search_trajectories" not in given:
        raise UsageError(f"{orphans[0]}: a test-time search flag; pass --search_trajectories K as well")
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top_k {args.top_k}: expected an integer >= 1")
    return given


def check_ranges(given: dict[str, Any], ranges: dict[str, tuple[Callable[[Any], bool], str]]) -> None:
    """A `UsageError` naming the first given flag whose value is out of its range ({flag: (test, allowed)})."""
    for name, value in given.items():
        ok, allowed = ranges.get(name, (lambda v: True, ""))
        if not ok(value):
            raise UsageError(f"--{name} {value}: expected {allowed}")


def mim_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The masked-image-modelling flags that were given, as `MaskedImageModelingPipeline` call arguments
    (`--output_dir` is not one); a `UsageError` for a value out of range."""
    given = {name: getattr(args, name) for name in MIM_FLAGS if getattr(args, name) is not None}
    check_ranges(given, MIM_RANGES)
    output_dir = given.pop("output_dir", None)
    if output_dir is not None:  # created if missing; the reconstructions go beside any files already there
        check_output_folder(output_dir, "--output_dir", None)
    for name in MIM_PIPELINE_FLAGS:
        given.pop(name, None)
    return given


def check_lpips_weights(path: str | None) -> None:
    """`--lpips_weights`: a file named as torchvision names the backbone, and a torchvision that imports here (a
    `UsageError` naming the flag otherwise); nothing is loaded."""
    if path is None:
        return
    from ..mim import check_perceptual_weights  # imports torch: only when the flag is given

    try:
        check_perceptual_weights(path, None, flags=True)
    except (OSError, ValueError, ImportError) as err:
        raise UsageError(str(err)) from None


def check_model_type(
    folder: Path, config: dict[str, Any], allowed: tuple[str, ...], trust_remote_code: bool = False
) -> None:
    """A local folder's config.json names one of the `allowed` model_types (a `UsageError` naming the file, the
    model_type and those allowed, as `export` words it); a folder with remote code (`auto_map`) run with
    `--trust_remote_code` brings its own model class and is left to it."""
    model_type = config.get("model_type")
    if model_type in allowed or (trust_remote_code and "auto_map" in config):
        return
    raise UsageError(
        f"{folder / 'config.json'}: model_type={model_type!r} is not an energyformers family; expected one of "
        f"{sorted(allowed)}"
    )


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse and check everything that needs no model: flags, the folder and its weights, the input files."""
    args = build_parser().parse_args(argv)
    args.depth = depth_arguments(args)
    args.mim = mim_arguments(args)
    folder = check_model_source(args.model_dir, "model folder")
    args.local_input_type = None
    if folder is not None:  # a local folder: what is wrong with it is named here, before torch loads

        def check_flags(architecture: str | None, first: str) -> None:
            check_flags_for_kind(args, architecture or first, architecture is not None)

        config, architecture = check_local_model_folder(
            folder,
            args.model_dir,
            MODEL_TYPES,
            trust_remote_code=args.trust_remote_code,
            check_flags=check_flags,
        )
        if architecture is not None:
            check_lpips_weights(args.lpips_weights)
        args.local_input_type = input_kind(config, architecture)
        check_text_pairs_flag(args, args.local_input_type, _first(config.get("architectures")))
        check_halting_criterion(args.depth, config)
        check_attn_flag(args.attn_implementation, str(config.get("model_type", "")))
    if args.inputs == ["-"]:
        # "\r\n": a file with Windows line ends would otherwise leave "\r" in each text, and in the printed line;
        # a blank line is skipped, and each input keeps its line's number (1-based) for the messages that name it
        lines = [(number, line.rstrip("\r\n")) for number, line in enumerate(sys.stdin, 1) if line.strip()]
        args.texts = [text for _, text in lines]
        labels = [f"line {number} of stdin" for number, _ in lines]
    else:
        args.texts = args.inputs
        labels = [f"input {number}" for number in range(1, len(args.inputs) + 1)]
    if not args.texts:
        raise UsageError("inputs -: standard input held no non-empty line; pass one input per line")
    args.pairs = split_pairs(args.texts, labels) if args.text_pairs else None
    if args.local_input_type is not None:
        check_inputs(args.model_dir, args.local_input_type, args.texts, from_stdin=args.inputs == ["-"])
    if folder is not None and args.local_input_type == "sequence":
        warn_on_mismatched_pairs(run_metrics(args.model_dir, folder), args.model_dir, args.text_pairs)
    return args


def check_text_pairs_flag(args: argparse.Namespace, kind: str, architecture: str) -> None:
    """`--text_pairs` is for text classifiers (`input_kind` "sequence"): a `UsageError` naming the flag and the
    model for any other (an image, masked-image-modelling or Sudoku model)."""
    if not args.text_pairs or kind == "sequence":
        return
    what = {
        "mim": "a masked-image-modelling model, which reconstructs image files",
        "cells": "a Sudoku model, which takes puzzle strings",
    }.get(kind, "an image model, which classifies image files")
    raise UsageError(
        f"--text_pairs: sentence pairs are for text classifiers, and {args.model_dir} is {what} ({architecture})"
    )


def split_pairs(texts: list[str], labels: list[str] | None = None) -> list[tuple[str, str]]:
    """`--text_pairs`' inputs, each `TEXT<TAB>PAIR`, split at the first TAB (a later TAB belongs to the pair); a
    `UsageError` naming the first input without a TAB or with an empty half by its label in `labels` (unset:
    `input N`, N its 1-based position; `parse` names a line of stdin by its line number) and its text, shortened."""
    pairs = []
    labels = labels or [f"input {number}" for number in range(1, len(texts) + 1)]
    for label, text in zip(labels, texts, strict=True):
        text_, tab, pair = text.partition("\t")
        if not tab or not text_.strip() or not pair.strip():
            shown = text if len(text) <= 40 else text[:37] + "..."
            problem = (
                "no TAB"
                if not tab
                else "an empty text before the TAB"
                if not text_.strip()
                else ("an empty pair after the TAB")
            )
            raise UsageError(
                f"--text_pairs: {label} {shown!r} has {problem}; each input is TEXT<TAB>PAIR (in a shell: "
                "$'first\\tsecond', or one pair per line from stdin with -)"
            )
        pairs.append((text_, pair))
    return pairs


def run_metrics(model_dir: str, folder: Path | None) -> dict[str, Any] | None:
    """The model's run record (metrics.json) as the card reads it: from a local `folder`, or for a Hub repo id from
    the repo through transformers' `cached_file` (offline, or with the Hub unreachable, from the cache only); None
    where there is none, or it cannot be read or parsed (prediction does not need one)."""
    from .card import read_run_metrics

    path: str | Path | None = folder / "metrics.json" if folder is not None else None
    if folder is None:
        from transformers.utils import cached_file

        try:
            # a repo without the file, or no Hub and no cached copy, is an unknown record, not an error; the
            # private keywords are cached_file's only switches for that (transformers has no public equivalent)
            path = cached_file(
                model_dir,
                "metrics.json",
                _raise_exceptions_for_missing_entries=False,
                _raise_exceptions_for_connection_errors=False,
            )
        except OSError:
            return None
    if path is None or not Path(path).is_file():
        return None
    try:
        return read_run_metrics(Path(path))
    except (OSError, ValueError):
        return None


def trained_texts(metrics: dict[str, Any] | None) -> tuple[str, str] | str | None:
    """What a text classifier was trained on, as its run recorded it: the (text, text pair) columns of sentence
    pairs (`card.sentence_pair_columns`); for single texts, what they came from (the column, or a built-in dataset:
    the built-ins hold single texts and record no columns); None where the record does not say (no metrics.json)."""
    from .card import sentence_pair_columns

    if not metrics:
        return None
    pairs = sentence_pair_columns(metrics)
    if pairs is not None:
        return pairs
    columns = metrics.get("columns") or {}
    if columns.get("text_column"):
        return f"the column {columns['text_column']!r}"
    dataset = metrics.get("dataset")
    if not columns and isinstance(dataset, str):
        from .data import BUILTIN_DATASETS  # the datasets library loads only for a record without columns

        if dataset in BUILTIN_DATASETS:
            return f"the built-in dataset {dataset!r}"
    return None


def warn_on_mismatched_pairs(metrics: dict[str, Any] | None, model_dir: str, text_pairs: bool) -> None:
    """One warning on stderr when the inputs are not what the text classifier was trained on (its run's
    `metrics`): single texts (no `--text_pairs`) to a model trained on sentence pairs, or pairs (`--text_pairs`) to
    one trained on single texts. It still classifies them, which is not what it learnt to read; nothing is said
    where the record is missing."""
    trained = trained_texts(metrics)
    if trained is None:
        return
    if isinstance(trained, tuple) and not text_pairs:
        print(
            f"warning: {model_dir} was trained on sentence pairs (the columns {trained[0]!r} and {trained[1]!r}); "
            "each input is classified as a single text: pass --text_pairs and inputs TEXT<TAB>PAIR to give it pairs",
            file=sys.stderr,
            flush=True,
        )
    elif isinstance(trained, str) and text_pairs:
        print(
            f"warning: {model_dir} was trained on single texts ({trained}), not sentence pairs; each pair is "
            "classified as one input, [CLS] TEXT [SEP] PAIR [SEP], which it never saw in training: give single "
            "texts (without --text_pairs)",
            file=sys.stderr,
            flush=True,
        )


def check_local_model_folder(
    folder: Path,
    model_dir: str,
    allowed: tuple[str, ...],
    *,
    trust_remote_code: bool = False,
    check_flags: Callable[[str | None, str], None] | None = None,
    inputs: list[str] | None = None,
) -> tuple[dict[str, Any], str | None]:
    """The checks `predict` and `inspect` make on a local model folder before torch loads, in this order: its
    config.json is readable and names one of the `allowed` model_types, its weights are readable; then
    `check_flags(mim_architecture, first_architecture)` (the command's own refusal of flags of the other kind of
    model); a masked-image-modelling folder holds its image tokenizer; and each of `inputs` (when given) is what the
    model takes. A `UsageError` for the first problem; returns (config as JSON, the masked-image-modelling head or
    None)."""
    from .weights import check_model_folder

    config = check_model_folder(
        model_dir, check_config=lambda config: check_model_type(folder, config, allowed, trust_remote_code)
    )
    architecture = masked_image_modeling_head(config.get("architectures"))
    if check_flags is not None:
        check_flags(architecture, _first(config.get("architectures")))
    if architecture is not None:
        check_image_tokenizer(folder, model_dir, config)
    if inputs:
        check_inputs(model_dir, input_kind(config, architecture), inputs)
    return config, architecture


def input_kind(config: dict[str, Any], architecture: str | None) -> str:
    """What a model reads, as `check_inputs` names it: "mim" for a masked-image-modelling head (image files to
    reconstruct), "cells" for a token-classification head (the Sudoku models: puzzle strings), else its config's
    input_type ("image" or "sequence")."""
    if architecture is not None:
        return "mim"
    if _first(config.get("architectures")).endswith("ForTokenClassification"):
        return "cells"
    return str(config.get("input_type", "image"))


def _first(architectures: Any) -> str:
    return str((architectures or ["?"])[0])


def masked_image_modeling_head(architectures: Any) -> str | None:
    """The masked-image-modelling head among a config's `architectures` (the task "masked-image-modeling":
    `HyperSetForMaskedImageModeling`, `LoopedTransformerForMaskedImageModeling`), None for any other model."""
    names = [a for a in (architectures or []) if isinstance(a, str) and a.endswith("ForMaskedImageModeling")]
    return names[0] if names else None


def refuse_mim_flags(given: list[str], model_dir: str, architecture: str, command: str) -> None:
    """A `UsageError` naming the first masked-image-modelling flag in `given` (`--mask_ratio`, ...), for a model
    that is not a masked-image-modelling one; `command` says what the command does with such a model instead."""
    if given:
        raise UsageError(
            f"{given[0]}: a masked-image-modelling flag, and {model_dir} is not a masked-image-modelling "
            f"model ({architecture}); {command}"
        )


def check_flags_for_kind(args: argparse.Namespace, architecture: str, mim: bool) -> None:
    """A flag of the other kind of model is a `UsageError` naming it and the model: a masked-image-modelling flag
    for a classifier, a classification, halting or search flag (or stdin texts) for a masked-image-modelling
    model."""
    if mim:
        wrong = [f"--{name}" for name in CLASSIFICATION_FLAGS if getattr(args, name) is not None]
        if wrong:
            raise UsageError(
                f"{wrong[0]}: a classifier's flag (labels, halting, search), and {args.model_dir} is a "
                f"masked-image-modelling model ({architecture}), which reconstructs images; it takes "
                "--num_iterations and "
                f"{', '.join('--' + name for name in MIM_FLAGS)}"
            )
        if args.inputs == ["-"]:
            raise UsageError(
                f"'-' (texts from stdin): {args.model_dir} is a masked-image-modelling model ({architecture}), "
                "which reconstructs image files; pass image paths"
            )
    else:
        wrong = [f"--{name}" for name in MIM_FLAGS if getattr(args, name) is not None]
        refuse_mim_flags(wrong, args.model_dir, architecture, "predict classifies with it")


def no_image_tokenizer(model_dir: str, config: Any = None) -> str:
    """The command line's message for a masked-image-modelling model without an image tokenizer: how to save one
    into the folder (the commands take no tokenizer flag; the Python pipeline's `vq_tokenizer=` is not one), and,
    with the model's `config` (object or config.json dict), the codebook and grid that tokenizer must have."""
    fits = ""
    field = (
        (lambda name: config.get(name))
        if isinstance(config, dict)
        else (lambda name: getattr(config, name, None))
    )
    vocab, positions = field("vocab_size"), field("max_position_embeddings")
    if isinstance(vocab, int) and isinstance(positions, int):
        side = math.isqrt(positions)
        grid = f"a {side} × {side} grid" if side * side == positions else f"a grid of {positions} codes"
        fits = f" ({vocab - 1} codes on {grid}: the tokenizer's codebook and grid must match the model's)"
    return (
        f"{model_dir} has no image tokenizer ({TOKENIZER_CONFIG_NAME} is missing), so its codes cannot be turned "
        "into pixels; a run folder of `energyformers train --task masked-image-modeling` holds one, else save "
        f"one into the folder{fits}: PatchKMeansTokenizer.fit(images, ...).save_pretrained({model_dir!r}) or "
        "VQGANTokenizer.save_pretrained (energyformers.mim)"
    )


def check_image_tokenizer(folder: Path, model_dir: str, config: dict[str, Any] | None = None) -> None:
    """A masked-image-modelling folder reconstructs pixels with the image tokenizer saved beside its weights, whose
    codebook and grid (as its `vq_tokenizer_config.json` records them) fit the model's `config` (config.json):
    checked before the weights load."""
    path = folder / TOKENIZER_CONFIG_NAME
    if not path.is_file():
        raise UsageError(no_image_tokenizer(model_dir, config))
    if config is None:
        return
    # the numbers' check without torch (energyformers.mim imports it): a mismatch is refused before torch loads
    from energyformers.tokenizer_fit import (
        TokenizerMismatchError,
        check_tokenizer_fits,
        saved_tokenizer_numbers,
    )

    from .export import TOKENIZER_REMEDY
    from .weights import read_json_object

    try:
        settings = read_json_object(path, remedy=TOKENIZER_REMEDY)
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        check_tokenizer_fits(*saved_tokenizer_numbers(settings), config)
    except TokenizerMismatchError as err:
        raise UsageError(f"{model_dir}: {err}") from None


def check_mim_inputs(model_dir: str, inputs: list[str]) -> None:
    """A masked-image-modelling model reconstructs image files: each input exists and PIL reads it as an image."""
    for source in inputs:
        if not Path(source).is_file():
            what = "no such file" if Path(source).suffix.lower() in IMAGE_SUFFIXES else "not an image file"
            raise UsageError(
                f"{source!r}: {what}; {model_dir} is a masked-image-modelling model, which reconstructs image "
                "files (texts are not read)"
            )
    check_readable_images(inputs)


def check_readable_images(paths: list[str]) -> None:
    """Each file is an image PIL reads, its structure (`verify`: a PNG's checksums) and its pixel data decoded to
    the end, else a `UsageError` naming it: checked for every input before the model loads, one file at a time,
    each closed before the next opens.

    `verify` alone reads a JPEG's header only, so a truncated JPEG would pass and fail later, after the model
    loaded, without its name. Decoding costs a second decode of each file (the pipeline decodes it again when it
    reaches it) but holds one image at a time; a JPEG is decoded at 1/8 scale (`draft`), which still reads its
    whole data stream, at a fraction of the time and memory."""
    from PIL import Image, UnidentifiedImageError

    for source in paths:
        try:
            with Image.open(source) as image:
                image.verify()
            with Image.open(source) as image:  # `verify` leaves the image unusable: open it again to decode
                image.draft(None, (1, 1))  # JPEG only: the smallest scale its decoder offers
                image.load()
        # PIL reports a bad PNG as SyntaxError; one of more than twice Image.MAX_IMAGE_PIXELS as a decompression bomb
        except (OSError, UnidentifiedImageError, SyntaxError, Image.DecompressionBombError) as err:
            raise UsageError(f"{source}: not a readable image ({err})") from None


def rgb_images(paths: list[str]) -> Iterator[Any]:
    """Each file of `paths` as the RGB image training sees (`processing.to_rgb`), opened only when the pipeline
    asks for the next one and closed when it asks for the one after: given to the pipeline as a generator, which it
    consumes one item at a time, so any number of files holds one file handle and one decoded image at a time."""
    from PIL import Image

    from .processing import to_rgb

    for source in paths:
        with Image.open(source) as image:
            yield to_rgb(image)  # any mode (RGBA, P, 16-bit grey) → RGB


def warn_clipped_modes(paths: list[str]) -> None:
    """The images among `paths` of 16/32-bit grey modes, which the conversion clips at 255: one warning on stderr
    naming the modes and how many of each (`processing.clipped_modes_warning`, as `train` and `evaluate` word it).
    Reads the file headers only."""
    from PIL import Image

    from .processing import CLIPPED_MODES, clipped_modes_warning

    found: dict[str, int] = {}
    for source in paths:
        with Image.open(source) as image:
            if image.mode in CLIPPED_MODES:
                found[image.mode] = found.get(image.mode, 0) + 1
    clipped = clipped_modes_warning(found)
    if clipped:
        print(f"warning: {clipped}", file=sys.stderr, flush=True)


def reconstruction_paths(inputs: list[str], output_dir: str | None) -> list[Path | None]:
    """Where each input's reconstruction goes (`<stem>.reconstruction.png` in `output_dir`); two inputs of one
    stem would overwrite each other, a `UsageError`."""
    if output_dir is None:
        return [None] * len(inputs)
    paths = [Path(output_dir).expanduser() / (Path(x).stem + MIM_SUFFIX) for x in inputs]
    seen: dict[Path, str] = {}
    for source, path in zip(inputs, paths):
        if path in seen:
            raise UsageError(
                f"--output_dir {output_dir}: {seen[path]} and {source} would both be written to {path.name}; "
                "run them with different --output_dir folders"
            )
        seen[path] = source
    return paths


def write_png(image: Any, path: Path) -> None:
    """Save `image` (PIL) to `path` through a temporary name beside it, so `path` is never half written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        image.save(tmp, format="PNG")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_inputs(model_dir: str, input_type: str, inputs: list[str], *, from_stdin: bool = False) -> None:
    """Image models take existing image files; text models take texts: not image files, and not the name of an
    existing file on the command line (`from_stdin` False), which would be classified as the text of its name (a
    file's lines are read with `-` from stdin, which also takes a text that happens to name a file);
    masked-image-modelling models (input_type "mim" here) take readable image files; Sudoku models ("cells",
    `input_kind`) take puzzle strings their cell tokenizer reads (`processing.cell_tokenizer`: 81 cells of 0-9 or
    '.', whitespace ignored), as one puzzle is one sequence of 81 cells: a shorter or longer string, or another
    character, is refused here rather than cut, padded or failed on by the tokenizer."""
    if input_type == "cells":
        for text in inputs:
            problem = puzzle_problem(text)
            if problem is not None:
                shown = text if len(text) <= 40 else text[:37] + "..."
                raise UsageError(
                    f"{model_dir}: a Sudoku model takes {SUDOKU_CELLS}-character puzzles of digits 0-9 or '.' "
                    f"(blank); got {shown!r} ({problem})"
                )
    if input_type == "mim":
        check_mim_inputs(model_dir, inputs)
    if input_type == "sequence":  # a text model classifies strings: an image path would be classified as text
        images = [x for x in inputs if Path(x).suffix.lower() in IMAGE_SUFFIXES and Path(x).is_file()]
        if images:
            raise UsageError(
                f"{model_dir} is a text model (input_type='sequence') and {images[0]!r} is an image file; "
                "pass texts, or an image model folder for images"
            )
        files = [] if from_stdin else [x for x in inputs if Path(x).is_file()]
        if files:
            raise UsageError(
                f"{model_dir} is a text model and {files[0]!r} is a file, which it would classify as the text "
                f"{files[0]!r}; to classify the file's lines (one text per line) read them from stdin: "
                f"energyformers predict {model_dir} - < {files[0]}"
            )
    if input_type == "image":
        missing = [x for x in inputs if not Path(x).is_file()]
        if missing:
            what = "is a folder, not an image file" if Path(missing[0]).is_dir() else "no such file"
            raise UsageError(f"{model_dir} classifies images; {missing[0]}: {what}")
        check_readable_images(inputs)


def check_halting_criterion(depth: dict[str, Any], config: dict[str, Any]) -> None:
    """`--halting_criterion` says what a halting tolerance measures: without `--halting_tolerance`, and with none
    saved in the config (`config` as JSON), nothing halts and the flag would change nothing, so it is refused."""
    if (
        "halting_criterion" in depth
        and "halting_tolerance" not in depth
        and config.get("halting_tolerance") is None
    ):
        raise UsageError(
            f"--halting_criterion {depth['halting_criterion']}: what --halting_tolerance measures, and no "
            "tolerance is given (the model's config saves none); pass --halting_tolerance as well"
        )


def puzzle_problem(text: str) -> str | None:
    """Why `text` is not a Sudoku puzzle string (what is wrong, in a few words), None for one."""
    cells = re.sub(r"\s+", "", text)  # the cell tokenizer's normaliser drops whitespace and line breaks
    other = next((c for c in cells if c not in SUDOKU_CELL_CHARACTERS), None)
    if other is not None:
        return f"{other!r} is not a cell"
    if len(cells) != SUDOKU_CELLS:
        return f"{len(cells)} cells"
    return None


def task_for(config: Any) -> str:
    """Pipeline task of a saved config: its head's task (`energyformers.task_of`), else the input type's default."""
    import energyformers
    from energyformers import FAMILIES, INPUT_TYPES, task_of

    input_type = getattr(config, "input_type", "image")
    models = {**FAMILIES, **getattr(energyformers, "BASELINES", {})}  # a trained baseline predicts too
    family = models.get(getattr(config, "model_type", None))
    architecture = (getattr(config, "architectures", None) or [None])[0]
    if family is not None:
        for auto_class, head in family.heads.items():
            if head.__name__ == architecture:
                try:
                    return task_of(input_type, auto_class)
                except ValueError:
                    break
    return next(iter(INPUT_TYPES[input_type].tasks))


def pipeline_class(task: str) -> type:
    """The `energyformers.pipelines` class of `task`: transformers' pipeline plus the depth call arguments."""
    from energyformers import pipelines

    return {
        "image-classification": pipelines.ImageClassificationPipeline,
        "text-classification": pipelines.TextClassificationPipeline,
        "token-classification": pipelines.TokenClassificationPipeline,
    }[task]


def pipeline_kwargs(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """The `transformers.pipeline` keywords both kinds of model take from the flags: `--trust_remote_code`,
    `--attn_implementation` (checked against the loaded config: a Hub model's family is known only now) and
    `--lpips_weights` (a keyword of the pipeline class, which `transformers.pipeline()` hands on; checked again for
    a Hub model, a local folder's in `parse`)."""
    check_lpips_weights(args.lpips_weights)
    kwargs: dict[str, Any] = {"trust_remote_code": args.trust_remote_code}
    if args.attn_implementation is not None:
        check_attn_flag(args.attn_implementation, config.model_type)
        check_attn_implementation_runs(config, args.attn_implementation)
        kwargs["model_kwargs"] = {"attn_implementation": args.attn_implementation}
    if args.lpips_weights is not None:
        kwargs["lpips_weights"] = args.lpips_weights
    return kwargs


def pipeline_model(task: str, model_dir: str, kwargs: dict[str, Any]) -> Any:
    """The model `task`'s pipeline runs, loaded here rather than by `transformers.pipeline` (which drops the loading
    report) so weights that do not fit the config are refused (`load_fitting_weights`), not run randomly
    initialised. Takes `pipeline_kwargs`' `model_kwargs` out of `kwargs` (they are the model's)."""
    from transformers.pipelines import PIPELINE_REGISTRY

    from .weights import WeightsMismatchError, load_fitting_weights

    model_class = PIPELINE_REGISTRY.check_task(task)[1]["pt"][0]
    model_kwargs = kwargs.pop("model_kwargs", {})
    try:
        return load_fitting_weights(
            model_class, model_dir, trust_remote_code=kwargs["trust_remote_code"], **model_kwargs
        )
    except (OSError, RuntimeError, ValueError) as err:
        if isinstance(err, WeightsMismatchError):  # already one line naming the folder and the tensors
            raise UsageError(str(err)) from None
        raise UsageError(cannot_load(model_dir, err)) from None


def run(args: argparse.Namespace) -> int:
    """Classify the inputs with the model; prints one line (or JSON object) per input."""
    import transformers

    from energyformers import INPUT_TYPES

    transformers.logging.set_verbosity_error()  # `run_command` restores the caller's logging afterwards
    transformers.utils.logging.disable_progress_bar()
    try:
        config = transformers.AutoConfig.from_pretrained(
            args.model_dir, trust_remote_code=args.trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise UsageError(cannot_load(args.model_dir, err)) from None
    input_type = getattr(config, "input_type", "image")
    if input_type not in INPUT_TYPES:
        raise UsageError(
            f"{args.model_dir} has input_type={input_type!r}; expected one of {sorted(INPUT_TYPES)}"
        )
    architecture = masked_image_modeling_head(getattr(config, "architectures", None))
    # again for a Hub model (a local folder was checked in `parse`)
    check_flags_for_kind(args, architecture or _first(config.architectures), architecture is not None)
    check_text_pairs_flag(args, input_kind(config.to_dict(), architecture), _first(config.architectures))
    if architecture is not None:
        return reconstruct(args, config)
    task = task_for(config)
    if INPUT_TYPES[input_type].tasks[task] == "AutoModel":
        raise UsageError(
            f"{args.model_dir} is a bare backbone ({(config.architectures or ['?'])[0]}) without a "
            "classification head"
        )
    inputs = args.texts
    if args.local_input_type is None:  # a Hub model (a local one was checked in `parse`)
        check_inputs(
            args.model_dir, input_kind(config.to_dict(), None), inputs, from_stdin=args.inputs == ["-"]
        )
    if args.local_input_type is None and input_kind(config.to_dict(), None) == "sequence":
        # a Hub model: its run record comes with the repo (a local folder's was read in `parse`)
        warn_on_mismatched_pairs(run_metrics(args.model_dir, None), args.model_dir, args.text_pairs)
    check_halting_criterion(args.depth, config.to_dict())
    if input_type == "image":
        warn_clipped_modes(inputs)
        inputs = rgb_images(inputs)  # a generator: the pipeline returns an iterator, printed as it goes
    kwargs = pipeline_kwargs(args, config)
    # given a loaded model, transformers.pipeline no longer looks for the processor beside it
    processor = load_processor_or_refuse(args.model_dir, config.to_dict())
    kwargs["image_processor" if input_type == "image" else "tokenizer"] = processor
    if args.pairs is not None:
        from .processing import no_separator_refusal

        refusal = no_separator_refusal(processor, args.model_dir, "give single texts (without --text_pairs)")
        if refusal:
            raise UsageError(refusal)
        # transformers' text-classification pipeline takes a pair as {"text", "text_pair"}
        inputs = [{"text": text, "text_pair": pair} for text, pair in args.pairs]
    model = pipeline_model(task, args.model_dir, kwargs)
    classify = transformers.pipeline(task, model=model, pipeline_class=pipeline_class(task), **kwargs)
    check_depth_arguments(classify.model, args.depth)
    if task == "token-classification":  # one prediction per token; --top_k does not apply
        call: dict[str, Any] = {}
    else:
        call = {"top_k": args.top_k or 1} | ({"truncation": True} if task == "text-classification" else {})
    outputs = classify(inputs, **call, **args.depth)
    shown = args.inputs if args.inputs != ["-"] else args.texts
    for number, (source, out) in enumerate(zip(shown, outputs)):
        out = out if isinstance(out, list) else [out]
        # a pair's record: the input as given and its two texts, as the pipeline took them
        pair = {} if args.pairs is None else dict(zip(("text", "text_pair"), args.pairs[number]))
        if args.json:
            record = {"input": source, **pair, "predictions": out}
            print(json.dumps(record, default=float))  # token scores: numpy
            continue
        if pair:  # the two texts, not the tab-joined line (nor a TAB inside the pair), so the line keeps two columns
            source = f"{pair['text']} / {pair['text_pair']}".replace("\t", " ")
        if task == "token-classification":
            tagged = " ".join(f"{o['word']}/{o['entity']} ({o['score']:.3f})" for o in out)
            print(f"{source if len(source) <= 60 else source[:57] + '...'}\t{tagged}")
        else:
            ranked = ", ".join(f"{o['label']} ({o['score']:.3f})" for o in out)
            print(f"{source if len(source) <= 60 else source[:57] + '...'}\t{ranked}")
    return 0


def reconstruct(args: argparse.Namespace, config: Any) -> int:
    """Mask and reconstruct each image with `pipeline("masked-image-modeling", model=DIR)`; one line (or JSON
    object) of metrics per image, and with `--output_dir` the reconstruction as `<stem>.reconstruction.png`."""
    import transformers

    if args.local_input_type is None:  # a Hub model (a local one was checked in `parse`)
        check_inputs(args.model_dir, "mim", args.inputs)
    paths = reconstruction_paths(args.inputs, args.output_dir)
    warn_clipped_modes(args.inputs)  # the pipeline converts them to grey or RGB as PIL does, clipping at 255
    kwargs = pipeline_kwargs(args, config)
    kwargs["vq_tokenizer"] = load_processor_or_refuse(args.model_dir, config.to_dict(), mim=True)
    model = pipeline_model(MIM_TASK, args.model_dir, kwargs)
    pipe = transformers.pipeline(MIM_TASK, model=model, **kwargs)
    call = {
        **args.mim,
        **({"num_iterations": args.depth["num_iterations"]} if "num_iterations" in args.depth else {}),
    }
    if paths[0] is not None:
        paths[0].parent.mkdir(parents=True, exist_ok=True)
    for source, path in zip(args.inputs, paths):
        out = pipe(source, **call)
        if path is not None:
            write_png(out["reconstruction"], path)
        record = {"input": source}
        for key in ("psnr", "ssim", "masked_accuracy", "tokenizer_psnr", "lpips", "tokenizer_lpips"):
            if key not in out:  # LPIPS only with --lpips_weights
                continue
            # NaN (masked_accuracy with no masked position, --mask_ratio 0) is JSON null: NaN is not JSON
            record[key] = None if math.isnan(out[key]) else float(out[key])
        record["reconstruction"] = None if path is None else str(path)
        if args.json:
            print(json.dumps(record), flush=True)
        else:
            shown = source if len(source) <= 60 else source[:57] + "..."
            numbers = ", ".join(
                f"{key} {'n/a' if value is None else f'{value:.4f}'}"
                for key, value in record.items()
                if key not in ("input", "reconstruction")
            )
            print(f"{shown}\t{numbers}" + (f"\t{path}" if path is not None else ""), flush=True)
    return 0


def load_processor_or_refuse(
    model_dir: str,
    config: dict[str, Any],
    mim: bool = False,
    build_missing: bool = False,
    flag: str | None = None,
) -> Any:
    """The processor saved with the model (`processing.load_processor`: its image processor or tokenizer, or with
    `mim` a masked-image-modelling head's image tokenizer; with `build_missing`, an image processor built from the
    config when the folder has none), loaded before the weights; a `UsageError` naming the file and what is wrong
    with it (a missing image tokenizer: how to save one), after `flag` where the folder came from one. Shared by
    predict, inspect, evaluate and `train --from_pretrained`."""
    from .processing import load_processor

    try:
        processor = load_processor(model_dir, config, mim=mim, build_missing=build_missing)
    except (OSError, ValueError) as err:  # the messages name the folder's file
        raise UsageError(f"{flag} {err}" if flag else str(err)) from None
    if mim and processor is None:
        raise UsageError(no_image_tokenizer(model_dir, config))
    return processor


def cannot_load(model_dir: str, err: Exception, label: str = "model folder") -> str:
    """The one-line message for a model (its config or its weights) transformers could not load, in the same words
    in every command; `label` is how the command names the argument (`--from_pretrained`). An `OSError` of a name
    that is no local folder means the Hub did not serve it, unless the Hub cache holds the repo and the file that
    failed is that copy's (the error names a file in the cache, or the Hub is offline, so the cache is all
    transformers read): then the cached copy is broken, and the error's words name the file. Any other error (a
    `ValueError` of the config's own checks, an invalid value in it) is the model's, and its own words say what is
    wrong."""
    if isinstance(err, OSError) and not Path(model_dir).expanduser().exists():
        from huggingface_hub import constants

        # the first line says what was not found; transformers' further lines are advice on tokens and folders
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        cache = str(constants.HF_HUB_CACHE)
        if in_hub_cache(model_dir) and (constants.HF_HUB_OFFLINE or cache in str(err)):
            return (
                f"{label} {model_dir!r}: no such local folder, and its copy in the Hub cache ({cache}) is broken "
                f"({reason})"
            )
        return f"{label} {model_dir!r}: no such local folder, and the Hub did not serve it ({reason})"
    # the whole message, on one line (the command's contract)
    return f"cannot load a model from {model_dir!r}: {' '.join(str(err).split()) or type(err).__name__}"


def check_attn_implementation_runs(config: Any, value: str) -> None:
    """`--attn_implementation` can run here for this model (e.g. Triton's kernel needs CUDA): the family's own check,
    `check_attn_implementation(config, value)` of its modeling module where it has one, run on the config before
    any weights load; its `ValueError` becomes a `UsageError` naming the flag."""
    import importlib

    from energyformers import BASELINES, FAMILIES

    family = {**FAMILIES, **BASELINES}.get(getattr(config, "model_type", None))
    if family is None:  # transformers' own or remote code: the model checks when it loads
        return
    module = importlib.import_module(family.heads["AutoModel"].__module__)
    check = getattr(module, "check_attn_implementation", None)
    if check is None:
        return
    try:
        check(config, value)
    except ValueError as err:
        raise UsageError(f"--attn_implementation {value}: {err}") from None


def check_depth_arguments(model: Any, depth: dict[str, Any]) -> None:
    """Every depth flag given is an argument of the loaded model's forward (a `UsageError` naming both), with a
    value the model takes (its `check_call_arguments`, where it has one: a flag the call would ignore, such as
    --halting_threshold without a halting head, included)."""
    import inspect

    accepted = inspect.signature(model.forward).parameters
    unknown = [name for name in depth if name not in accepted]
    if unknown:
        takes = [f"--{name}" for name in DEPTH_FLAGS if name in accepted]
        raise UsageError(
            f"--{unknown[0]}: {type(model).__name__} ({model.config.model_type}) does not take it; "
            f"its depth flags are {takes or 'none (its depth is fixed)'}"
        )
    check = getattr(model, "check_call_arguments", None)
    if depth and check is not None:
        try:
            check(**depth)
        except ValueError as err:
            given = " ".join(f"--{name} {value}" for name, value in depth.items())
            raise UsageError(f"{given}: {err}") from err


def main(argv: list[str] | None = None) -> int:
    """CLI entry point of `energyformers predict`; returns the exit status."""
    return run_command("predict", parse, run, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
