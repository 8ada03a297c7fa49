"""`energyformers convert`: the command line of the `training/convert/` package (the converters themselves).

Kept apart so that `energyformers convert --help` answers without importing torch and the model files.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .cli import CommandParser, UsageError, check_output_file, check_output_folder, run_command
from .convert.released import HUB_REPO, RELEASED, released_file, unavailable_message
from .convert.sources import SOURCE_MODELS, reverse_input_problem
from .interrupt import publish_leftovers
from .weights import checkpoint_format

# The keys of `convert.SOURCES` and `convert.DTYPES` (a test checks they stay equal).
SOURCE_NAMES = ("hyperbf", "hyperset-ic", "hyperset-mim", "hyperset-sudoku", "imixer")
DTYPE_NAMES = ("float32", "float64")
DEFAULT_DTYPE = "float32"
# The sources whose models read images (their folder gets an image processor, normalised by --image-mean/--image-std),
# known without torch from the head class each source converts to (a test checks them against the converters).
IMAGE_SOURCES = tuple(s for s, (_, head) in SOURCE_MODELS.items() if head.endswith("ForImageClassification"))
# The flags of one direction only, as --help spells them: given in the other direction they would be ignored, so they
# are refused there. Forward: an official checkpoint -> our folder; --reverse: our folder -> an official file.
FORWARD_FLAGS = {
    "official_config": "--official-config",
    "output_dir": "--output_dir",
    "dtype": "--dtype",
    "trust_pickle": "--trust-pickle",
    "reference": "--reference",
    "image_mean": "--image-mean",
    "image_std": "--image-std",
}
REVERSE_FLAGS = {"output": "--output"}


def build_parser() -> argparse.ArgumentParser:
    """The `energyformers convert` argument parser."""
    released = ", ".join(f.filename for f in RELEASED if f.source is not None)
    parser = CommandParser(
        prog="energyformers convert",
        description="Convert the authors' official checkpoints into verified model folders, and back. The "
        f"released files of the Hub repository {HUB_REPO} ({released}) are recognised by their published "
        "names and need neither --source nor --official-config.",
    )
    parser.add_argument(
        "--source",
        choices=SOURCE_NAMES,
        help="the official model class (optional for the authors' released files; required with --reverse)",
    )
    parser.add_argument("checkpoint", help="official checkpoint (forward) or our model folder (--reverse)")
    parser.add_argument(
        "--official-config",
        "--official_config",
        dest="official_config",
        help="the official constructor kwargs: JSON object, a fixture JSON with constructor.kwargs, or YAML "
        "(shipped with the converter for the authors' released files)",
    )
    parser.add_argument("--output_dir", "--output-dir", dest="output_dir", help="model folder to write")
    parser.add_argument(
        "--dtype", choices=DTYPE_NAMES, help=f"dtype of the written weights (default {DEFAULT_DTYPE})"
    )
    parser.add_argument(
        "--trust-pickle", action="store_true", help="allow full unpickling of a trusted checkpoint"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    parser.add_argument("--reference", help="safetensors with golden/input/* and golden/{f32,f64}/logits")
    parser.add_argument(
        "--atol",
        type=float,
        help="verification tolerance, times max(1, max |logit|) (default 1e-10 float64, 1e-5 float32)",
    )
    parser.add_argument(
        "--image-mean", type=float, nargs=3, help="processor normalisation mean (default 0.5)"
    )
    parser.add_argument("--image-std", type=float, nargs=3, help="processor normalisation std (default 0.5)")
    parser.add_argument("--reverse", action="store_true", help="our model folder -> official state_dict")
    parser.add_argument("--output", help="with --reverse: the official .safetensors file to write")
    return parser


def check_normalization(mean: list[float] | None, std: list[float] | None) -> None:
    """`--image-mean` finite and `--image-std` finite and > 0 (the processor divides by it), or a `UsageError`;
    None is a flag not given (the default 0.5)."""
    for flag, values, positive in (("--image-mean", mean, False), ("--image-std", std, True)):
        if values is not None and not all(math.isfinite(v) and (v > 0 or not positive) for v in values):
            allowed = "finite values > 0" if positive else "finite values"
            raise UsageError(f"{flag} {' '.join(str(v) for v in values)}: expected {len(values)} {allowed}")


def _shown(flag: str, value: object) -> str:
    """A flag as the user gave it: `--flag` for a switch, else `--flag value` (a list as its values)."""
    if value is True:
        return flag
    return f"{flag} {' '.join(map(str, value)) if isinstance(value, list) else value}"


def check_applicable(args: argparse.Namespace) -> None:
    """A `UsageError` naming a flag that does nothing in the direction asked for, and when it applies: the
    conversion's flags with --reverse, --output without it, and the image normalisation for a model that reads no
    images (the source given, or the one the authors' released file converts with)."""
    if args.reverse:
        for dest, flag in FORWARD_FLAGS.items():
            value = getattr(args, dest)
            if value not in (None, False):
                raise UsageError(
                    f"{_shown(flag, value)}: applies to converting an official checkpoint, not with --reverse "
                    "(which reads our model folder and writes the official file --output names, in the folder's "
                    "own dtype)"
                )
        return
    for dest, flag in REVERSE_FLAGS.items():
        value = getattr(args, dest)
        if value is not None:
            raise UsageError(
                f"{_shown(flag, value)}: applies with --reverse only (the official file it writes); converting "
                "an official checkpoint writes the folder --output_dir names"
            )
    released = released_file(args.checkpoint)
    source = args.source or (released.source if released is not None else None)
    if source is None or source in IMAGE_SOURCES:
        return
    for flag, value in (("--image-mean", args.image_mean), ("--image-std", args.image_std)):
        if value is not None:
            raise UsageError(
                f"{_shown(flag, value)}: applies to models that read images (--source "
                f"{', '.join(IMAGE_SOURCES)}); a {source} model reads no images, its folder has no image processor"
            )


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse and check what needs no torch: the flags that go together and apply, and that the checkpoint is one."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_applicable(args)
    check_normalization(args.image_mean, args.image_std)
    if args.atol is not None and not (math.isfinite(args.atol) and args.atol > 0):
        raise UsageError(f"--atol {args.atol}: expected a finite tolerance > 0")
    if args.reverse:
        if not args.source:
            parser.error("--reverse needs --source")
        if not args.output:
            parser.error("--reverse needs --output FILE.safetensors")
        if not Path(args.checkpoint).is_dir():
            raise UsageError(
                f"{args.checkpoint}: with --reverse the input is our model folder, which "
                f"{'is a file' if Path(args.checkpoint).exists() else 'does not exist'}"
            )
        problem = reverse_input_problem(args.source, args.checkpoint)
        if problem is not None:
            raise UsageError(problem)
        output = Path(args.output).expanduser()
        # what a killed conversion to --output left is repaired first, under the file's lock (`export_official`),
        # and the file checked then: it may be the half-published file that goes back to the previous pair
        repaired = publish_leftovers(output, [output, output.with_suffix(".json")])
        check_output_file(
            args.output, "--output", None if repaired else "--overwrite", overwrite=args.overwrite
        )
        return args
    released = released_file(args.checkpoint)
    if released is not None and released.source is None:  # refused before the file is even opened
        raise UsageError(unavailable_message(released))
    if not args.output_dir:
        parser.error("converting a checkpoint needs --output_dir")
    if released is None and not (args.source and args.official_config):
        missing = " and ".join(
            flag
            for flag, value in (("--source", args.source), ("--official-config", args.official_config))
            if not value
        )
        raise UsageError(
            f"converting a checkpoint needs {missing}: only the authors' released files of {HUB_REPO} are "
            "recognised by their published names ("
            + ", ".join(f.filename for f in RELEASED if f.source is not None)
            + ")"
        )
    if released is not None and args.source not in (None, released.source):
        raise UsageError(
            f"--source {args.source}: {released.filename} is the authors' {released.description}; it converts "
            f"with --source {released.source} (or no --source)"
        )
    # a file that is no checkpoint at all is named here, before torch loads
    if checkpoint_format(args.checkpoint) == "safetensors" and args.trust_pickle:
        raise UsageError(
            f"--trust-pickle: {args.checkpoint} is a safetensors file, read without unpickling; the flag applies to "
            "torch.save checkpoints (zip or pickle)"
        )
    if args.official_config and not Path(args.official_config).is_file():
        raise UsageError(
            f"--official-config {args.official_config}: no such file; expected a JSON file of constructor "
            "kwargs, a fixture JSON or a YAML file"
        )
    # a killed conversion's leftovers are repaired first, under the folder's lock (`convert_checkpoint`)
    check_output_folder(
        args.output_dir, "--output_dir", "--overwrite", overwrite=args.overwrite, repair_first=True
    )
    args.dtype = args.dtype or DEFAULT_DTYPE
    return args


def run(args: argparse.Namespace) -> int:
    """Convert the checkpoint (with --reverse: write ours in the official layout); returns the exit status."""
    from transformers.utils import logging as hf_logging

    from .convert import convert_checkpoint, export_official

    progress = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one save and one load of a single file: the bars are noise here
    try:
        if args.reverse:
            export_official(
                args.source, args.checkpoint, args.output, overwrite=args.overwrite, atol=args.atol
            )
        else:
            convert_checkpoint(
                args.source,
                args.checkpoint,
                args.official_config,
                args.output_dir,
                dtype=args.dtype,
                trust_pickle=args.trust_pickle,
                overwrite=args.overwrite,
                reference=args.reference,
                atol=args.atol,
                image_mean=args.image_mean,
                image_std=args.image_std,
            )
    finally:
        if progress:
            hf_logging.enable_progress_bar()
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point of `energyformers convert`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_command("convert", parse, run, argv, writes_to=written_folders)


def written_folders(args: argparse.Namespace) -> list[Path]:
    """Where a conversion writes (for `run_command`'s full-disk report): the folder holding --output_dir, in which
    its staging folder is, or with --reverse the folder of --output."""
    return [Path(args.output if args.reverse else args.output_dir).expanduser().absolute().parent]


if __name__ == "__main__":
    raise SystemExit(main())
