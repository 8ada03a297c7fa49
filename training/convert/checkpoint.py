"""Checkpoint I/O: the official checkpoint files (safetensors, torch zip or pickle; Lightning, dict-wrapped or bare
state_dicts) and the official constructor kwargs, read into plain tensors and dicts."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from ..cli import UsageError
from ..weights import checkpoint_format, parse_json
from .base import (
    REFERENCE_PREFIX,
    ConversionError,
    OfficialSource,
)


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _strip(key: str, prefix: str) -> str:
    while key.startswith(prefix):
        key = key[len(prefix) :]
    return key


class InertObject:
    """Stands in for a Python object of a checkpoint that is not part of the weights (Lightning's hyper-parameters,
    an argparse Namespace, OmegaConf nodes, a loop's state): it keeps the arguments and state it is given and runs
    no code of the class it replaces. Subclassed once per replaced name (`_inert_class`)."""

    replaces = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> InertObject:
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__["inert_args"] = (args, kwargs)

    def __setstate__(self, state: Any) -> None:
        self.__dict__["inert_state"] = state

    def __repr__(self) -> str:
        return f"<inert placeholder of {self.replaces}>"


def _inert_class(name: str) -> type:
    return type(name.rsplit(".", 1)[-1], (InertObject,), {"replaces": name, "__module__": __name__})


def refuse_pickle(path: Path, why: str) -> ConversionError:
    """The error for a checkpoint that only full unpickling can read (`why`: what the safe reader found)."""
    return ConversionError(
        f"checkpoint {path} holds Python objects besides tensors that cannot be read safely ({why}); only full "
        "unpickling can read it, and unpickling can run arbitrary code. It was not loaded. If you trust the "
        "file's origin, pass --trust-pickle (the converted folder holds safetensors only); otherwise ask for a "
        "safetensors export."
    )


def _load_with_placeholders(path: Path, kind: str) -> tuple[Any, list[str]]:
    """torch's weights-only unpickler with every class or function it does not allow replaced by an inert
    placeholder: the tensors are read, and no code named by the file runs. (checkpoint, replaced names)."""
    if kind != "zip":  # the names a legacy pickle file refers to are not listed by torch
        raise refuse_pickle(path, "a legacy torch.save file with non-tensor objects")
    try:
        names = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    except Exception as err:
        raise ConversionError(
            f"cannot read checkpoint {path}: truncated or corrupt ({type(err).__name__}: {err})"
        ) from err
    stand_ins = [(_inert_class(name), name) for name in names]
    try:
        with torch.serialization.safe_globals(stand_ins):
            return torch.load(path, map_location="cpu", weights_only=True), names
    except pickle.UnpicklingError as err:
        # e.g. a dict or list subclass: the weights-only unpickler fills only real dicts and lists
        raise refuse_pickle(path, f"objects of {', '.join(names) or 'unknown classes'}: {err}") from err
    except Exception as err:
        raise ConversionError(
            f"cannot read checkpoint {path}: truncated or corrupt ({type(err).__name__}: {err})"
        ) from err


def load_raw(path: Path, trust_pickle: bool) -> tuple[Any, list[str]]:
    """(the loaded object, the names of the non-tensor classes read as inert placeholders)."""
    try:
        kind = checkpoint_format(
            path
        )  # a file that is no checkpoint at all is not "a pickle that needs trust"
    except UsageError as err:
        raise ConversionError(str(err)) from None
    if kind == "safetensors" or path.suffix == ".safetensors":
        try:
            return load_file(str(path)), []
        except Exception as err:  # SafetensorError derives from Exception only
            raise ConversionError(
                f"cannot read checkpoint {path}: truncated or not a safetensors file ({err})"
            ) from err
    try:
        return torch.load(path, map_location="cpu", weights_only=True), []
    except pickle.UnpicklingError as err:
        if "Weights only load failed" not in str(err):
            raise ConversionError(f"cannot read checkpoint {path}: truncated or corrupt ({err})") from err
    except Exception as err:
        raise ConversionError(
            f"cannot read checkpoint {path}: truncated or corrupt ({type(err).__name__}: {err})"
        ) from err
    if not trust_pickle:
        return _load_with_placeholders(path, kind)
    try:
        return torch.load(path, map_location="cpu", weights_only=False), []
    except Exception as err:
        raise ConversionError(
            f"cannot read checkpoint {path}: truncated or corrupt ({type(err).__name__}: {err})"
        ) from err


def read_checkpoint(
    path: str | Path, trust_pickle: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], str]:
    """(official state_dict with prefixes stripped, reference tensors under `golden/`, layout description)."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"checkpoint {path} does not exist")
    raw, replaced = load_raw(path, trust_pickle)
    if not isinstance(raw, dict):
        raise ConversionError(f"checkpoint {path} holds a {type(raw).__name__}, not a state_dict")
    if isinstance(raw.get("state_dict"), dict):
        layout, state, lightning = (
            "PyTorch-Lightning checkpoint (`state_dict`, `model.` prefix)",
            raw["state_dict"],
            True,
        )
    elif isinstance(raw.get("model_state_dict"), dict):
        layout, state, lightning = "native dict (`model_state_dict`)", raw["model_state_dict"], False
    elif all(isinstance(value, torch.Tensor) for value in raw.values()):
        layout, state, lightning = "bare state_dict", raw, False
    else:
        raise ConversionError(
            f"checkpoint {path}: unrecognised layout (top-level keys {sorted(map(str, raw))[:8]}); expected a "
            "Lightning checkpoint with `state_dict`, a dict with `model_state_dict`, or a bare state_dict"
        )
    official: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if isinstance(value, InertObject):  # the weights themselves need a class torch does not allow
            raise refuse_pickle(path, f"weight {key!r} is an object of {value.replaces}")
        if not isinstance(value, torch.Tensor):
            raise ConversionError(
                f"checkpoint {path}: entry {key!r} is a {type(value).__name__}, not a tensor"
            )
        if key.startswith(REFERENCE_PREFIX):
            reference[key] = value
            continue
        name = _strip(key, "module.")
        if lightning:
            if not name.startswith("model."):
                raise ConversionError(
                    f"checkpoint {path}: Lightning state_dict key {key!r} does not start with `model.`; only "
                    "the wrapped model's weights can be converted"
                )
            name = _strip(name[len("model.") :], "module.")
        if name in official:
            raise ConversionError(
                f"checkpoint {path}: key {key!r} duplicates {name!r} once prefixes are stripped"
            )
        official[name] = value
    if replaced:
        layout += (
            f"; its other Python objects ({', '.join(replaced)}) were read as inert placeholders, no code of "
            "theirs was run"
        )
    return official, reference, layout


def read_mapping(path: Path) -> Any:
    """An official config file (JSON or YAML) as a mapping; `ConversionError` naming the file if unreadable."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConversionError(f"cannot read official config {path}: {err}") from err
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as err:
            raise ConversionError(
                "reading a YAML official config needs PyYAML; pass the constructor kwargs as JSON instead"
            ) from err
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConversionError(f"official config {path} is not valid YAML: {err}") from err
    try:
        return parse_json(text)
    except ValueError as err:  # JSONDecodeError, or JSON nested too deeply (`parse_json`)
        raise ConversionError(f"official config {path} is not valid JSON: {err}") from err


def read_official_config(path: str | Path, source: OfficialSource) -> tuple[dict[str, Any], dict[str, Any]]:
    """(normalised official constructor kwargs, provenance such as the repository and commit)."""
    path = Path(path)
    data = read_mapping(path)
    if not isinstance(data, dict):
        raise ConversionError(f"official config {path} must hold a mapping of constructor kwargs")
    provenance = dict(data.get("source") or {}) if isinstance(data.get("source"), dict) else {}
    if isinstance(data.get("constructor"), dict):  # the fixtures' JSON: {"constructor": {"kwargs": ...}}
        raw = data["constructor"].get("kwargs", {})
    elif isinstance(data.get("model"), dict):  # a Hydra run config: the model group holds the kwargs
        raw = {**{k: v for k, v in data.items() if k in source.spec}, **data["model"]}
    else:
        raw = data
    provenance["ignored_kwargs"] = sorted(key for key in raw if key in source.ignored)
    return source.normalise_kwargs(raw, where=str(path)), provenance


def fingerprint(state: dict[str, torch.Tensor]) -> str:
    """sha256 over names, dtypes, shapes and bytes of a state_dict (order independent)."""
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
