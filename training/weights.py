"""The weight files of a model folder: which they are, and whether they can be read.

`train --from_pretrained`, `predict`, `inspect`, `evaluate`, `export`, `push` and `release` check a folder here
first (`check_model_folder`), so a truncated or corrupt
`model.safetensors` is reported by file name in one line instead of a raw `SafetensorError` traceback.
They load the weights through `load_fitting_weights`, so weights that do not fit the config (another model_type,
another size) are refused instead of leaving the model randomly initialised; `load_or_refuse` words its failures as
the command's one-line error.
Weights are safetensors only; pickle checkpoints are never read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")


class WeightsMismatchError(ValueError):
    """Weights that do not fit the config (`load_fitting_weights`): the message is one line naming the folder and
    the tensors, so a command shows it as it is rather than wrapping it as an unreadable folder."""


# How `read_json_object` words the type a field should have.
JSON_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
JSON_TYPE_NAMES.update({list: "a list", dict: "an object"})
JsonTypes = type | tuple[type, ...]
SHOWN_JSON = 40  # the characters of a refused value a message shows


def _json_type_name(types: JsonTypes) -> str:
    names = [JSON_TYPE_NAMES.get(t, t.__name__) for t in (types if isinstance(types, tuple) else (types,))]
    return "a number" if set(names) == {"an integer", "a number"} else " or ".join(names)


def has_type(value: Any, types: JsonTypes) -> bool:
    """Whether a JSON value is of `types`, as `read_json_object` checks a field."""
    # JSON's true/false are Python bools, which are ints too: an integer field does not take them
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        return False
    return isinstance(value, types)


class JSONNestingError(ValueError):
    """JSON nested more deeply than Python's parser recurses (`parse_json`)."""


# What `parse_json` says of such JSON; `energyformers.mim` words it alike
TOO_DEEP = "nested too deeply to read: Python's JSON parser stops at its recursion limit"


def parse_json(text: str) -> Any:
    """`json.loads(text)`, the one parse of JSON a user gives (a file, a flag's value). The parser's RecursionError
    on JSON nested more deeply than it recurses is raised as `JSONNestingError` (a ValueError), so each reader's
    one-line error for bad JSON, naming its file or flag, covers it."""
    try:
        return json.loads(text)
    except RecursionError:
        raise JSONNestingError(TOO_DEEP) from None


# `energyformers.mim.read_tokenizer_settings` keeps a copy of this reader (the exported pipeline code cannot import
# the training package): the two word a refused file alike and must stay in step (tests/test_json_shapes.py).
def read_json_object(
    path: str | os.PathLike,
    fields: Mapping[str, JsonTypes] | None = None,
    *,
    optional: Mapping[str, JsonTypes] | None = None,
    remedy: str = "save it again with save_pretrained",
) -> dict[str, Any]:
    """The JSON object in `path`, the one reader of the files a user can edit or a broken run leaves behind
    (config.json, metrics.json, inspect.json, an image tokenizer's settings, a checkpoint's state file).

    `fields` are keys the object must have, each with a value of the given type(s); `optional` keys may be absent
    or null, and have that type otherwise. A ValueError in one line naming the file, what it holds and what was
    expected, then `remedy` (how to get a good file), when the file cannot be read, is not valid JSON, holds
    another value than an object, or lacks a field or holds one of another type. Light (json only), so the
    argument checks use it before anything heavy loads."""
    path = Path(path)
    try:
        value = parse_json(path.read_text())
    except OSError as err:  # e.g. no permission to read it
        raise ValueError(f"{path}: cannot be read ({err.strerror or err}); {remedy}.") from None
    except ValueError as err:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"{path}: not valid JSON ({' '.join(str(err).split())}); {remedy}.") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: holds a JSON {type(value).__name__}, not an object; {remedy}.")
    for key, types in {**(optional or {}), **(fields or {})}.items():
        if key not in value or value[key] is None:
            if fields and key in fields:
                raise ValueError(f"{path}: no {key!r} ({_json_type_name(types)}); {remedy}.")
            continue
        if not has_type(value[key], types):
            shown = json.dumps(value[key])
            shown = shown if len(shown) <= SHOWN_JSON else f"{shown[: SHOWN_JSON - 3]}..."
            raise ValueError(f"{path}: {key}={shown} is not {_json_type_name(types)}; {remedy}.")
    return value


def weight_files(model_dir: str | os.PathLike) -> list[str]:
    """`model.safetensors`, or the index and its shards; FileNotFoundError (ValueError for a broken index) naming
    the folder and what is missing."""
    try:
        return _weight_files(Path(model_dir).expanduser())
    except (FileNotFoundError, ValueError) as err:
        raise type(err)(f"{model_dir}: {err}") from None


def _weight_files(model_dir: Path) -> list[str]:
    """`weight_files`, with messages that do not name the folder: each caller names it once, in its own words."""
    if (model_dir / "model.safetensors").is_file():
        return ["model.safetensors"]
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(parse_json(index.read_text())["weight_map"].values()))
            if not all(isinstance(shard, str) for shard in shards):
                raise TypeError("a weight_map value is not a file name")
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as err:
            raise ValueError(f"{index.name} is not a safetensors index ({err})") from None
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise FileNotFoundError(f"shards listed in {index.name} are missing: {missing}")
        return [index.name, *shards]
    pickles = [name for name in PICKLE_WEIGHTS if (model_dir / name).exists()]
    hint = (
        f" (found pickle weights {pickles}: re-save with save_pretrained, which writes safetensors)"
        if pickles
        else ""
    )
    raise FileNotFoundError(f"missing model.safetensors{hint}.")


def check_weights_readable(model_dir: str | os.PathLike, label: str = "model folder") -> None:
    """Open every safetensors file of `model_dir` (header and size check, no tensor is loaded).

    The message is `<label> <model_dir>: <problem>`: `label` says which argument the folder is (`model folder`,
    `--from_pretrained`), never the path, which this function adds itself, spelled as the caller passed it, so the
    folder is named once. ValueError when a file is truncated or corrupt (or the index is broken),
    FileNotFoundError when there are no safetensors weights.
    """
    from safetensors import safe_open

    folder = Path(model_dir).expanduser()
    try:
        names = _weight_files(folder)
    except (FileNotFoundError, ValueError) as err:
        raise type(err)(f"{label} {model_dir}: {err}") from None
    for name in names:
        if not name.endswith(".safetensors"):
            continue
        try:
            with safe_open(str(folder / name), framework="numpy"):  # numpy: the check needs no torch
                pass
        except Exception as err:  # safetensors raises its own SafetensorError (no public base class)
            raise ValueError(
                f"{label} {model_dir}: {name} cannot be read ({err}); the file is truncated or corrupt. Copy or "
                "download it again, or re-save the model with save_pretrained"
            ) from None


def check_model_folder(
    model_dir: str | os.PathLike,
    label: str = "model folder",
    check_config: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The check every command makes of a local model folder before anything loads: a folder `save_pretrained`
    wrote, with a config.json holding a JSON object and readable weights (`check_weights_readable`). Returns the
    config as JSON.

    `check_config` (the caller's own check of the config, e.g. its model_type) runs before the weights are opened,
    so a folder of another kind of model is named as that, not by its weight files. Each problem is a `UsageError`
    worded `<label> <model_dir>: <problem>` (`label` as in `check_weights_readable`)."""
    from .cli import UsageError

    folder = Path(model_dir).expanduser()
    path = folder / "config.json"
    if not path.is_file():
        raise UsageError(f"{label} {model_dir}: no config.json; expected a folder written by save_pretrained")
    try:
        config = parse_json(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"{label} {model_dir}: config.json is not readable JSON ({err})") from None
    if not isinstance(config, dict):
        raise UsageError(
            f"{label} {model_dir}: config.json holds a JSON {type(config).__name__}, not an object"
        )
    if check_config is not None:
        check_config(config)
    try:
        check_weights_readable(model_dir, label=label)
    except (OSError, ValueError) as err:  # unreadable weights named here, not in a safetensors traceback
        raise UsageError(str(err)) from None
    return config


# How many tensor names a weights-fit message shows of each kind
SHOWN_TENSORS = 3


def weights_fit_problem(
    source: str | os.PathLike,
    loading: dict[str, Any],
    allowed: Callable[[str, str], bool] | None = None,
) -> str | None:
    """What `from_pretrained(..., output_loading_info=True)`'s `loading` says does not fit, in one line naming
    `source` and the first few tensors of each kind (missing, unexpected, mismatched), or None when all fits.

    `allowed(kind, name)` (kind "missing", "unexpected" or "mismatched") exempts tensors the caller re-initialises
    on purpose, e.g. a classifier whose label set changed."""
    parts = []
    for kind in ("missing", "unexpected", "mismatched"):
        entries = loading.get(f"{kind}_keys") or ()
        # mismatched entries are (name, saved shape, model shape)
        named = sorted((e if isinstance(e, tuple) else (e,)) for e in entries)
        named = [e for e in named if allowed is None or not allowed(kind, e[0])]
        if not named:
            continue
        shown = [
            f"{e[0]} {tuple(e[1])} saved, {tuple(e[2])} in the model" if len(e) == 3 else e[0]
            for e in named[:SHOWN_TENSORS]
        ]
        more = f", ... ({len(named)} in all)" if len(named) > SHOWN_TENSORS else ""
        parts.append(f"{kind} {', '.join(shown)}{more}")
    errors = [" ".join(str(e).split()) for e in loading.get("error_msgs") or ()]
    if errors:
        parts.append(f"errors {errors[0]}")
    if not parts:
        return None
    return (
        f"{source}: weights do not match config.json (model_type, sizes): {'; '.join(parts)}; "
        "the model would run with randomly initialised tensors"
    )


def load_fitting_weights(
    model_class: Any,
    source: str | os.PathLike,
    allowed: Callable[[str, str], bool] | None = None,
    **kwargs: Any,
) -> Any:
    """`model_class.from_pretrained(source, **kwargs)`, refusing weights that do not fit the config: a
    `WeightsMismatchError` worded by `weights_fit_problem` (the loader's own errors pass through). Shared by predict,
    evaluate, inspect, export and `train --from_pretrained`, so every command refuses the same folders."""
    # a tensor of another shape is reported in `loading` (and refused below) instead of raised as a size mismatch
    kwargs.setdefault("ignore_mismatched_sizes", True)
    model, loading = model_class.from_pretrained(source, output_loading_info=True, **kwargs)
    problem = weights_fit_problem(source, loading, allowed)
    if problem is not None:
        raise WeightsMismatchError(problem)
    return model


def load_or_refuse(
    model_class: Any,
    source: str | os.PathLike,
    *,
    error: type[Exception],
    message: Callable[[Exception], str],
    label: str | None = None,
    allowed: Callable[[str, str], bool] | None = None,
    **kwargs: Any,
) -> Any:
    """`load_fitting_weights(model_class, source, allowed, **kwargs)`, its failures raised as the command's one-line
    `error` (its `UsageError` class): weights that do not fit in `WeightsMismatchError`'s words, already one line
    naming the folder and the tensors (after `label`, how the command names the argument, when given); any other
    `OSError`, `RuntimeError` or `ValueError` of the loader in the words `message(err)` gives it."""
    try:
        return load_fitting_weights(model_class, source, allowed, **kwargs)
    except (OSError, RuntimeError, ValueError) as err:  # unreadable or mismatched weights
        if isinstance(err, WeightsMismatchError):
            raise error(str(err) if label is None else f"{label} {err}") from err
        raise error(message(err)) from err


# What `checkpoint_format` recognises, for its error message.
CHECKPOINT_FORMATS = (
    "a .safetensors file, or a torch.save file (zip archive or legacy pickle: .pt/.pth/.ckpt/.bin)"
)
_PICKLE_PROTOCOL = 0x80  # first byte of a pickle of protocol >= 2 (torch.save's legacy format)
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default format since PyTorch 1.6 is a zip archive


def checkpoint_format(path: str | Path) -> str:
    """ "safetensors", "zip" or "pickle": what the file's first bytes say it is, read without torch.

    Raises `UsageError` naming the file when it does not exist or is none of these (a text file, an image, a
    truncated header), so such a file is reported as "not a checkpoint", not as a pickle that needs trust.
    """
    from .cli import UsageError

    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise UsageError(f"checkpoint {path} {what}; expected {CHECKPOINT_FORMATS}")
    with open(path, "rb") as handle:
        head = handle.read(9)
    if head.startswith(_ZIP_MAGIC):
        return "zip"
    if head[:1] == bytes([_PICKLE_PROTOCOL]) and len(head) > 1 and 2 <= head[1] <= 5:
        return "pickle"
    # safetensors: an 8-byte little-endian header length, then the JSON header (a truncated file is reported by
    # the loader, which names the file)
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    size = path.stat().st_size
    raise UsageError(
        f"checkpoint {path} ({size} bytes) is not a checkpoint: neither safetensors, nor a zip or pickle "
        f"torch.save file; expected {CHECKPOINT_FORMATS}"
    )


__all__ = [
    "CHECKPOINT_FORMATS",
    "PICKLE_WEIGHTS",
    "SHOWN_TENSORS",
    "WeightsMismatchError",
    "check_model_folder",
    "check_weights_readable",
    "checkpoint_format",
    "load_fitting_weights",
    "load_or_refuse",
    "weight_files",
    "weights_fit_problem",
]
