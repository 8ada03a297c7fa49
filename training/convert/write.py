"""The shared verification and writing: official checkpoint → verified model folder, and back."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from ..card import conversion_record, render_model_card
from ..cli import check_output_folder
from ..interrupt import (
    locked_output_dir,
    publish,
    publish_files,
    restore_interrupted_publish,
    restore_interrupted_publish_files,
    staging_folder,
)
from .base import (
    DEFAULT_ATOL,
    DTYPES,
    EXTRAS_FILE,
    KEPT_KWARGS,
    ConversionError,
    OfficialSource,
)
from .checkpoint import fingerprint, read_checkpoint, read_official_config, sha256_file
from .hyperbf import HyperBFSource
from .hyperset import HyperSetICSource, HyperSetSudokuSource
from .imixer import IMixerSource
from .mim import HyperSetMIMSource
from .released import ReleasedFile, released_file, unavailable_message
from .sources import reverse_input_problem  # the one check of the folder's kind, shared with the command line

SOURCES: dict[str, OfficialSource] = {
    source.name: source
    for source in (
        IMixerSource(),
        HyperBFSource(),
        HyperSetICSource(),
        HyperSetSudokuSource(),
        HyperSetMIMSource(),
    )
}


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def _scaled(atol: float, expected: torch.Tensor) -> float:
    """The tolerance for logits `expected`: atol × max(1, max |logit|) (float32 rounding grows with the logits)."""
    return atol * max(1.0, float(expected.detach().abs().max()))


def _set_default_permissions(*paths: Path) -> None:
    """mkdtemp / safetensors create owner-only entries; give what we write the usual umask permissions."""
    umask = os.umask(0)
    os.umask(umask)
    for path in paths:
        if path.is_dir():
            path.chmod(0o777 & ~umask)
            for child in path.iterdir():
                child.chmod(0o666 & ~umask)
        else:
            path.chmod(0o666 & ~umask)


def _write_card(folder: Path, name: str, model: PreTrainedModel, record: dict[str, Any]) -> None:
    """README.md of a converted folder: the one model card (`training/card.py`) with the conversion record."""
    from energyformers import FAMILIES, task_of

    auto_class = {head.__name__: auto for auto, head in FAMILIES[model.config.model_type].heads.items()}[
        type(model).__name__
    ]
    input_type = model.config.input_type
    info = {
        "name": name,
        "config": model.config.to_dict(),
        "model_type": model.config.model_type,
        "architecture": type(model).__name__,
        "auto_class": auto_class,
        "input_type": input_type,
        "task": task_of(input_type, auto_class),
        "files": sorted(path.name for path in folder.iterdir()),
        "metrics": None,  # converted, not trained here: the card shows the verification instead
    }
    card = render_model_card(
        info, num_parameters=model.num_parameters(), remote_code=False, conversion=record
    )
    card.save(folder / "README.md")


def resolve_released(source: str | None, checkpoint: str | Path) -> tuple[str, ReleasedFile | None]:
    """(the source to convert with, the released file `checkpoint` names or None).

    A released file that no head holds is refused here, and a `source` that contradicts the released file named,
    before anything is read or written.
    """
    released = released_file(checkpoint)
    if released is not None and released.source is None:
        raise ConversionError(unavailable_message(released))
    if released is not None and source is not None and source != released.source:
        raise ConversionError(
            f"--source {source}: {released.filename} is the authors' {released.description}, converted with "
            f"--source {released.source} (or no --source)"
        )
    if source is None:
        if released is None:
            raise ConversionError(
                f"--source is needed for {Path(checkpoint).name} (one of {sorted(SOURCES)}); it may be left out "
                "only for the authors' released files, recognised by their published names"
            )
        source = released.source
    if source not in SOURCES:
        raise ConversionError(f"--source {source!r}: expected one of {sorted(SOURCES)}")
    return source, released


def convert_checkpoint(
    source: str | None,
    checkpoint: str | Path,
    official_config: str | Path | None,
    output_dir: str | Path,
    *,
    dtype: str = "float32",
    trust_pickle: bool = False,
    overwrite: bool = False,
    reference: str | Path | None = None,
    atol: float | None = None,
    image_mean: list[float] | None = None,
    image_std: list[float] | None = None,
    log: Callable[[str], object] = print,
) -> Path:
    """Official checkpoint → verified model folder. Raises `ConversionError` before writing anything.

    `source` and `official_config` may be None for the authors' released files (recognised by file name): the
    source and the official kwargs shipped with the converter (`released.py`) are used.
    """
    source, released = resolve_released(source, checkpoint)
    if official_config is None and released is None:
        raise ConversionError(
            f"--official-config is needed for {Path(checkpoint).name}: the official constructor kwargs (JSON, a "
            "fixture JSON or YAML); only the authors' released files come with theirs"
        )
    out, torch_dtype = Path(output_dir), DTYPES[dtype]  # an unknown dtype fails before the folder is touched
    # the folder's lock (train's) from the repair to the rename: no other command repairs or replaces it meanwhile
    with locked_output_dir(out, flag="--output_dir"):
        # the previous folder back from where a command killed between its two renames left it, then checked as such
        restore_interrupted_publish(out)
        # worded as the command line's check, which leaves this one to refuse when a killed conversion left something
        check_output_folder(
            output_dir, "--output_dir", "--overwrite", overwrite=overwrite, error=ConversionError
        )
        return write_conversion(
            source,
            released,
            checkpoint,
            official_config,
            out,
            dtype=dtype,
            torch_dtype=torch_dtype,
            trust_pickle=trust_pickle,
            reference=reference,
            atol=atol,
            image_mean=image_mean,
            image_std=image_std,
            log=log,
        )


def write_conversion(
    source: str,
    released: ReleasedFile | None,
    checkpoint: str | Path,
    official_config: str | Path | None,
    out: Path,
    *,
    dtype: str,
    torch_dtype: torch.dtype,
    trust_pickle: bool,
    reference: str | Path | None,
    atol: float | None,
    image_mean: list[float] | None,
    image_std: list[float] | None,
    log: Callable[[str], object],
) -> Path:
    """`convert_checkpoint`'s work once `out` is checked and locked: the checkpoint read, converted and verified,
    the folder staged beside `out`, then published."""
    family = SOURCES[source]
    tolerance = DEFAULT_ATOL[torch_dtype] if atol is None else atol
    mean, std = image_mean or [0.5, 0.5, 0.5], image_std or [0.5, 0.5, 0.5]

    config_note = []
    if official_config is None:
        kwargs = family.normalise_kwargs(
            dict(released.kwargs), where=f"official config of {released.filename}"
        )
        provenance = {**released.provenance(), "ignored_kwargs": []}
        config_note = [
            f"Official config: shipped with the converter for the released `{released.path}` "
            f"({released.config_origin})."
        ]
    else:
        kwargs, provenance = read_official_config(official_config, family)
    state, golden, layout = read_checkpoint(checkpoint, trust_pickle)
    if reference is not None:
        golden = {k: v for k, v in read_checkpoint(reference)[1].items()}
    family.check_state(state, kwargs, f"checkpoint {Path(checkpoint).name}")
    config = family.config(kwargs)  # NotExpressible for structures our models lack
    if family.training_only:
        setattr(config, KEPT_KWARGS, {key: kwargs[key] for key in family.training_only})
    state64 = {key: value.to(torch.float64) for key, value in state.items()}
    ours = family.to_ours(state64, kwargs)

    model = family.head_class(config).to(torch_dtype).eval()
    missing, unexpected = model.load_state_dict({k: v.to(torch_dtype) for k, v in ours.items()}, strict=False)
    if missing or unexpected:  # a bug in the mapping table, not in the checkpoint
        raise ConversionError(f"internal mapping error: missing {missing[:3]}, unexpected {unexpected[:3]}")
    saved = {key: value.detach().clone() for key, value in model.state_dict().items()}

    # Official tensors that the canonical reverse does not reproduce bit for bit (kept for an exact round trip).
    canonical, _ = family.to_official({k: v.to(torch.float64) for k, v in saved.items()}, config)
    extras = {
        key: value.contiguous()
        for key, value in state.items()
        if not torch.equal(canonical[key].to(value.dtype), value)
    }

    # What the written folder must reproduce.
    checks: list[tuple[str, torch.Tensor, float]] = []  # (what, expected logits, tolerance)
    input_key = family.reference_input_key()
    gold_key = f"golden/{'f64' if torch_dtype == torch.float64 else 'f32'}/logits"
    if input_key in golden and gold_key in golden:
        inputs, described = golden[input_key], f"on the reference input `{input_key}`"
        checks.append((f"reference outputs `{gold_key}`", golden[gold_key], tolerance))
    else:
        inputs = family.example_inputs(kwargs)
        described = "on a fixed seeded input; no reference outputs of the authors' run were given"
    official = family.official_logits(state, kwargs, inputs, torch_dtype)
    checks.append(("official computation (re-implemented, same dtype)", official, tolerance))
    checks.append(("in-memory converted model", family.model_logits(model, inputs), tolerance))

    # a SIGTERM or Ctrl-C removes the staging folder; what a SIGKILL left, the next conversion to `out` removes
    with staging_folder(out) as tmp:
        model.save_pretrained(tmp)
        processor = family.processor(config, mean, std)
        if processor is not None:
            processor.save_pretrained(tmp)
        if extras:
            metadata = {"format": "pt", "source": source, "weights_fingerprint": fingerprint(saved)}
            save_file(extras, str(tmp / EXTRAS_FILE), metadata=metadata)
        reloaded = family.head_class.from_pretrained(tmp, dtype=torch_dtype).eval()
        logits = family.model_logits(reloaded, inputs)
        measured = [
            (what, _max_abs(logits, expected), _scaled(tol, expected)) for what, expected, tol in checks
        ]
        failed = [f"the {what} by {error:.3e}" for what, error, tol in measured if not error <= tol]
        if failed:
            raise ConversionError(
                f"verification failed ({dtype}, {described}): the converted folder's logits differ from "
                f"{' and from '.join(failed)} (tolerance {tolerance:.0e} × max(1, max |logit|)); nothing was "
                "written (after checking the difference, --atol can accept a larger one)"
            )
        record = conversion_record(
            official_class=family.official_class,
            repository=provenance.get("repo", family.repository),
            commit=provenance.get("commit"),
            checkpoint=Path(checkpoint).name,
            sha256=sha256_file(checkpoint),
            layout=layout,
            dtype=dtype,
            kwargs=kwargs,
            notes=config_note
            + family.structure_notes(kwargs)
            + [
                f"`{key}` in the official config ignored: {family.ignored[key]}."
                for key in provenance["ignored_kwargs"]
            ],
            processor=(
                f"Image processor: resize to the model's image size, then normalise with mean {mean} and std {std} "
                "(`--image-mean/--image-std`). Check these against the training recipe of the checkpoint: the "
                "authors' data pipeline is not part of their checkpoints."
                if family.input_kind == "image"
                else family.processor_note(kwargs)
            ),
            extras_file=EXTRAS_FILE,
            extras=sorted(extras),
            input_description=described,
            checks=measured,
        )
        _write_card(tmp, out.name, model, record)
        _set_default_permissions(tmp)
        # an old folder (or file) replaced only once the new one is complete
        publish(tmp, out, overwrite=True)
    log(f"converted {Path(checkpoint).name} ({layout}) -> {out} [{family.head_class.__name__}, {dtype}]")
    for what, error, tol in measured:
        log(f"  verified against the {what} {described}: max |Δlogits| = {error:.3e} (tolerance {tol:.0e})")
    if extras:
        log(f"  {len(extras)} official tensors without an exact counterpart kept in {EXTRAS_FILE}")
    return out


# ------------------------------------------------------------------------------------------------
# Reverse conversion
# ------------------------------------------------------------------------------------------------


def _weights_dtype(model_dir: Path) -> torch.dtype:
    path = model_dir / "model.safetensors"
    if not path.is_file():
        raise ConversionError(
            f"{model_dir} has no model.safetensors (sharded or pickle folders are not read)"
        )
    with safe_open(str(path), framework="pt") as handle:
        dtypes = {handle.get_slice(key).get_dtype() for key in handle.keys()}
    return torch.float64 if dtypes == {"F64"} else torch.float32


def export_official(
    source: str,
    model_dir: str | Path,
    output: str | Path,
    *,
    overwrite: bool = False,
    atol: float | None = None,
    log: Callable[[str], object] = print,
) -> Path:
    """Our model folder → official-layout bare state_dict (safetensors) + `<output>.json` with the kwargs.

    Holds `output`'s lock (`<output>.lock`, as the forward conversion holds its folder's) from the check of the two
    files to their replacement, which is all or nothing (`publish_files`), so two conversions to one `output` never
    leave the weights of one beside the JSON of the other."""
    model_dir, output = Path(model_dir), Path(output)
    if output.suffix != ".safetensors":
        raise ConversionError(f"--output {output}: write a .safetensors file (pickle is never written)")
    with locked_output_dir(output, flag="--output", what="file"):
        sidecar = output.with_suffix(".json")
        # what a command killed while publishing the pair left, undone as one (both files back to the previous pair,
        # or the new pair's old copies removed) with its staging folder, then the files checked as they are then
        restore_interrupted_publish_files(output, [output, sidecar])
        for path in (output, sidecar):
            if path.exists() and not overwrite:
                what = "the file" if path == output else f"its JSON {path}"
                raise ConversionError(
                    f"--output {output}: {what} exists; pass --overwrite or choose another name"
                )
        return _write_official(source, model_dir, output, sidecar, atol=atol, log=log)


def _write_official(
    source: str,
    model_dir: Path,
    output: Path,
    sidecar: Path,
    *,
    atol: float | None,
    log: Callable[[str], object],
) -> Path:
    """`export_official`'s work once `output` is checked and locked: the official tensors computed and verified,
    the file and its JSON staged beside `output`, then both moved into place."""
    family = SOURCES[source]
    problem = reverse_input_problem(source, model_dir)
    if problem is not None:  # before loading: another model's folder would load with a report of missing keys
        raise ConversionError(problem)
    torch_dtype = _weights_dtype(model_dir)
    model = family.head_class.from_pretrained(model_dir, dtype=torch_dtype).eval()
    ours = {key: value.detach() for key, value in model.state_dict().items()}
    official, kwargs = family.to_official({k: v.to(torch.float64) for k, v in ours.items()}, model.config)
    official = {key: value.to(torch_dtype).contiguous() for key, value in official.items()}
    # Which tensors are the converted ones: copies of ours (exact), the stored extras (exact while the weights are
    # those converted), or recomputed as one function-equivalent choice (named).
    recomputed = family.recomputed_keys(list(official))
    restored = 0
    extras_path = model_dir / EXTRAS_FILE
    if extras_path.is_file():
        with safe_open(str(extras_path), framework="pt") as handle:
            stored = (handle.metadata() or {}).get("weights_fingerprint")
        if stored == fingerprint(ours):
            extras = load_file(str(extras_path))
            official.update(extras)
            # the forward conversion kept every tensor the canonical reverse does not give back bit for bit
            recomputed, restored = [], len(extras)
        else:
            log(f"  note: the weights changed since conversion; {EXTRAS_FILE} is stale and not used")
    if recomputed:
        count = sum(re.sub(r"\.\d+\.", ".*.", key) in recomputed for key in official)
        mode = (
            f"function-equivalent: {count} recomputed from the model's weights ({', '.join(recomputed)}), "
            f"the other {len(official) - count} exact"
        )
    else:
        mode = "exact" + (
            f", {restored} of them the converted ones kept in {EXTRAS_FILE}" if restored else ""
        )
    family.check_state(official, kwargs, "reverse conversion")

    inputs = family.example_inputs(kwargs)
    expected = family.official_logits(official, kwargs, inputs, torch_dtype)
    error = _max_abs(expected, family.model_logits(model, inputs))
    tolerance = _scaled(DEFAULT_ATOL[torch_dtype] if atol is None else atol, expected)
    if not error <= tolerance:
        raise ConversionError(
            f"verification failed: the official computation on the exported tensors differs from the model by "
            f"{error:.3e} (tolerance {tolerance:.0e}); nothing was written"
        )
    metadata = {"format": "pt", "source": source, "official_kwargs": json.dumps(kwargs)}
    # a SIGTERM or Ctrl-C removes the staging folder; what a SIGKILL left, the next conversion to `output` repairs
    # (`export_official`, with or without --overwrite)
    with staging_folder(output) as staging:
        tmp_weights, tmp_json = staging / output.name, staging / sidecar.name
        save_file(official, str(tmp_weights), metadata=metadata)
        tmp_json.write_text(
            json.dumps(
                {
                    "source": {"repo": family.repository},
                    "constructor": {"class": family.official_class, "kwargs": kwargs},
                },
                indent=1,
            )
            + "\n"
        )
        _set_default_permissions(tmp_weights, tmp_json)
        publish_files([(tmp_weights, output), (tmp_json, sidecar)])
    log(f"wrote {output} ({len(official)} official keys, {mode}) and {sidecar}")
    log(
        f"  verified: official computation vs model on a fixed input, max |Δlogits| = {error:.3e} (tolerance {tolerance:.0e})"
    )
    return output
