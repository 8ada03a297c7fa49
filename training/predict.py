"""`energyformers predict DIR INPUT...`: classify image files or texts with a saved model folder.

    energyformers predict runs/demo-hyperset img1.png img2.jpg
    energyformers predict runs/rt-hyperset "a gripping, funny film" "two hours I will never get back"
    echo "one text per line" | energyformers predict runs/rt-hyperset -

Uses `transformers.pipeline` on the folder (model + saved processor/tokenizer), exactly as a user would;
the task follows the saved head (`config.architectures`): image, text or token classification.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Suffixes of image files (the image-folder loader's list): such a path given to a text model is a mistake.
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="energyformers predict", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", help="a folder written by `energyformers train` (or a Hub repo id)")
    p.add_argument(
        "inputs", nargs="+", help="image paths for image models, texts for text models; '-' reads stdin lines"
    )
    p.add_argument("--top_k", type=int, default=1, help="labels shown per input, best first (default: 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object per input")
    p.add_argument(
        "--trust_remote_code", action="store_true", help="for exported folders without the package"
    )
    return p


def task_for(config) -> str:
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    import transformers

    from energyformers import INPUT_TYPES  # importing energyformers registers the Auto classes

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    folder = Path(args.model_dir).expanduser()
    if folder.is_dir():  # a local folder: unreadable weights are named here, not in a safetensors traceback
        from .weights import check_weights_readable

        try:
            check_weights_readable(folder, flag=str(folder))
        except (OSError, ValueError) as err:
            print(f"energyformers predict: error: {err}", file=sys.stderr)
            return 2
    elif args.model_dir.startswith((".", "/", "~")) or args.model_dir.count("/") > 1:
        print(
            f"energyformers predict: error: model folder {args.model_dir!r} does not exist", file=sys.stderr
        )
        return 2
    try:
        config = transformers.AutoConfig.from_pretrained(
            args.model_dir, trust_remote_code=args.trust_remote_code
        )
    except (OSError, ValueError) as err:
        print(
            f"energyformers predict: error: cannot load a model from {args.model_dir!r}: {err}",
            file=sys.stderr,
        )
        return 2
    input_type = getattr(config, "input_type", "image")
    if input_type not in INPUT_TYPES:
        print(
            f"energyformers predict: error: {args.model_dir} has input_type={input_type!r}; "
            f"expected one of {sorted(INPUT_TYPES)}",
            file=sys.stderr,
        )
        return 2
    task = task_for(config)
    if INPUT_TYPES[input_type].tasks[task] == "AutoModel":
        print(
            f"energyformers predict: error: {args.model_dir} is a bare backbone "
            f"({(config.architectures or ['?'])[0]}) without a classification head",
            file=sys.stderr,
        )
        return 2
    inputs = (
        [line.rstrip("\n") for line in sys.stdin if line.strip()] if args.inputs == ["-"] else args.inputs
    )
    if input_type == "sequence":  # a text model classifies strings: an image path would be classified as text
        images = [x for x in inputs if Path(x).suffix.lower() in IMAGE_SUFFIXES and Path(x).is_file()]
        if images:
            print(
                f"energyformers predict: error: {args.model_dir} is a text model (input_type='sequence') and "
                f"{images[0]!r} is an image file; pass texts, or an image model folder for images",
                file=sys.stderr,
            )
            return 2
    if input_type == "image":
        missing = [x for x in inputs if not Path(x).is_file()]
        if missing:
            print(
                f"energyformers predict: error: {args.model_dir} classifies images; no such file: {missing[0]}",
                file=sys.stderr,
            )
            return 2
        from PIL import Image

        from .processing import to_rgb

        inputs = [to_rgb(Image.open(x)) for x in inputs]  # any mode (RGBA, P, 16-bit grey) → RGB
    kwargs = {"trust_remote_code": args.trust_remote_code}
    if input_type == "image":
        processor_class = getattr(transformers, INPUT_TYPES[input_type].processor_class)
        kwargs["image_processor"] = processor_class.from_pretrained(args.model_dir, backend="pil")
    classify = transformers.pipeline(task, model=args.model_dir, **kwargs)
    if task == "token-classification":  # one prediction per token; --top_k does not apply
        call = {}
    else:
        call = {"top_k": args.top_k} | ({"truncation": True} if task == "text-classification" else {})
    outputs = classify(inputs, **call)
    shown = args.inputs if args.inputs != ["-"] else inputs
    for source, out in zip(shown, outputs):
        out = out if isinstance(out, list) else [out]
        if args.json:
            print(json.dumps({"input": source, "predictions": out}, default=float))  # token scores: numpy
        elif task == "token-classification":
            tagged = " ".join(f"{o['word']}/{o['entity']} ({o['score']:.3f})" for o in out)
            print(f"{source if len(source) <= 60 else source[:57] + '...'}\t{tagged}")
        else:
            ranked = ", ".join(f"{o['label']} ({o['score']:.3f})" for o in out)
            print(f"{source if len(source) <= 60 else source[:57] + '...'}\t{ranked}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
