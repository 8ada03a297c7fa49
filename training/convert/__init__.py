"""`energyformers convert`: the authors' official checkpoints ↔ model folders of this package.

Forward (official → ours)::

    energyformers convert --source {imixer,hyperbf,hyperset-ic,hyperset-sudoku} CHECKPOINT \\
        --official-config KWARGS.json|RUN.yaml --output_dir DIR [--dtype float32|float64]

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
# `OfficialSource`), one module per official source (`imixer`, `hyperbf`, `hyperset`) and `write` (the verified
# forward and reverse conversions). The names below are the public ones (`convert_cli`, tests).
from __future__ import annotations

from .base import (
    DEFAULT_ATOL,
    DTYPES,
    EXTRAS_FILE,
    KEPT_KWARGS,
    REFERENCE_PREFIX,
    ConversionError,
    NotExpressible,
    OfficialSource,
)
from .checkpoint import fingerprint, read_checkpoint, read_official_config, sha256_file
from .hyperbf import HyperBFSource
from .hyperset import HyperSetICSource, HyperSetSudokuSource
from .imixer import IMixerSource
from .write import SOURCES, convert_checkpoint, export_official

__all__ = [
    "DEFAULT_ATOL",
    "DTYPES",
    "EXTRAS_FILE",
    "KEPT_KWARGS",
    "REFERENCE_PREFIX",
    "SOURCES",
    "ConversionError",
    "HyperBFSource",
    "HyperSetICSource",
    "HyperSetSudokuSource",
    "IMixerSource",
    "NotExpressible",
    "OfficialSource",
    "convert_checkpoint",
    "export_official",
    "fingerprint",
    "read_checkpoint",
    "read_official_config",
    "sha256_file",
]
