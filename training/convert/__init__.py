"""`energyformers convert`: the authors' official checkpoints ↔ model folders of this package.

Forward (official → ours)::

    energyformers convert --source {imixer,hyperbf,hyperset-ic,hyperset-sudoku,hyperset-mim} CHECKPOINT \\
        --official-config KWARGS.json|RUN.yaml --output_dir DIR [--dtype float32|float64]
    energyformers convert RELEASED_FILE --output_dir DIR   # the authors' published files (`released`)

1. reads the checkpoint: a `.safetensors` file, or a PyTorch file through `torch.load(weights_only=True)`
   (anything that needs full unpickling is refused unless `--trust-pickle` is given; pickle is never
   written), in any of the three layouts the authors' loaders accept: a PyTorch-Lightning checkpoint
   (`state_dict`, every key prefixed `model.`), a dict with `model_state_dict`, or a bare state_dict, with
   DDP's `module.` prefixes stripped. Keys under `golden/` (the fixtures' reference outputs) are set aside
   as the reference, never mapped;
2. builds the official key list with shapes from the official constructor kwargs (`--official-config`:
   the kwargs as a JSON object, a fixture JSON with `constructor.kwargs`, or a YAML holding them) and
   checks every key and shape explicitly: an unexpected or missing key or a wrong shape is an error naming
   the first offending key (no fuzzy matching);
3. maps the weights (float64 arithmetic), loads them strictly into our model, and only then writes, into a
   hidden sibling folder renamed into place at the end: `config.json`, `model.safetensors`, the image
   processor, `README.md` (provenance, the checkpoint's sha256, the structure it uses, the verification)
   and, when needed, `official_extras.safetensors` (below);
4. reloads the written folder and checks its logits before declaring success: against the reference outputs
   when the checkpoint (or `--reference`) carries them (`golden/f64/logits` for a float64 folder,
   `golden/f32/logits` for float32), always against the official computation re-implemented here from the
   authors' code (`official_logits`, the computation order of the fixtures' JSON) on a fixed input, and
   against the in-memory converted model. Any failure removes the temporary folder; nothing is left behind.

Reverse (ours → official)::

    energyformers convert --reverse --source SOURCE MODEL_DIR --output OFFICIAL.safetensors

writes an official-layout bare state_dict (safetensors) and `OFFICIAL.json` with the official constructor
kwargs (usable as `--official-config`), and checks the official computation on it against our model.

Exactness of the round trip. Some official tensors have no exact counterpart in our model: iMixer's
`weight_sigma` buffers (logging only), and HyperBF's attention metric M, scale and RBF metric M_RBF, which
are folded into our projections (see `HyperBFSource`; the map is many-to-one). The forward conversion
stores every official tensor that the reverse mapping would not reproduce bit for bit in
`official_extras.safetensors`, together with a fingerprint of our weights; the reverse conversion uses them
while the weights are unchanged, so official → ours → official is exact. After fine-tuning it emits a
function-equivalent official state (HyperBF: M = I, per-head temperatures folded into q, k) instead. Official
constructor arguments without a field in our configs (dropout rates and other training- or init-only settings,
`OfficialSource.training_only`) are kept in config.json as `official_training_kwargs` and given back.
"""

# The package's modules: `checkpoint` (reading checkpoints and official configs), `base` (errors, constants,
# `OfficialSource`), one module per official source (`imixer`, `hyperbf`, `hyperset`, `mim`), `write` (the verified
# forward and reverse conversions) and `released` (the authors' published files and their official configs, free of
# torch). The names below are the public ones (`convert_cli`, tests); they are imported on first use, so that
# `released` can be read by the command line before torch is imported.
from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "DEFAULT_ATOL": "base",
    "DTYPES": "base",
    "EXTRAS_FILE": "base",
    "KEPT_KWARGS": "base",
    "REFERENCE_PREFIX": "base",
    "ConversionError": "base",
    "NotExpressible": "base",
    "OfficialSource": "base",
    "fingerprint": "checkpoint",
    "read_checkpoint": "checkpoint",
    "read_official_config": "checkpoint",
    "sha256_file": "checkpoint",
    "HyperBFSource": "hyperbf",
    "HyperSetICSource": "hyperset",
    "HyperSetSudokuSource": "hyperset",
    "IMixerSource": "imixer",
    "HyperSetMIMSource": "mim",
    "HUB_REPO": "released",
    "RELEASED": "released",
    "ReleasedFile": "released",
    "released_file": "released",
    "SOURCES": "write",
    "convert_checkpoint": "write",
    "export_official": "write",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
