"""The authors' released Hyper-SET checkpoints (Hub repository `Yunzhe/Hyper-SET`) and their official configs.

Recognised by file name as published, so that each converts with one command and no `--official-config`. The
constructor kwargs are those the authors' scripts build the model with: `configs/config.yaml`, then
`configs/task/<task>.yaml`, then the overrides of the script that names the file, through `create_model` of
`ic/utils.py` / `sudoku/utils.py` / `mim/utils.py` (huyunzhe/hyper-set). Kept free of torch: the command line checks a file name
before it imports anything heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HUB_REPO = "Yunzhe/Hyper-SET"
AUTHORS_REPOSITORY = "https://github.com/huyunzhe/hyper-set"
# The commit of the authors' configs and scripts read for the kwargs below (the fixtures' model files were last
# changed at this commit too).
AUTHORS_CONFIG_COMMIT = "d448df571cfdf918459aec707e331dedacfd5250"


@dataclass(frozen=True)
class ReleasedFile:
    """One released checkpoint: its path in the Hub repository, the converter source and official kwargs."""

    path: str  # relative to the root of the Hub repository, as published
    source: str | None  # `energyformers convert --source`; None: no head of this package holds it yet
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    config_origin: str = ""  # which official files give `kwargs`
    aliases: tuple[str, ...] = ()  # other names the authors' own scripts use for the same file

    @property
    def filename(self) -> str:
        """The file name as published, without its folder in the Hub repository."""
        return Path(self.path).name

    def provenance(self) -> dict[str, Any]:
        """Where `kwargs` come from, for the conversion record: the authors' repository, commit and config files."""
        return {"repo": AUTHORS_REPOSITORY, "commit": AUTHORS_CONFIG_COMMIT, "config": self.config_origin}


SUDOKU = ReleasedFile(
    path="sudoku/Sudoku_layer1_recur24_dim768_multiplier4.pth",
    source="hyperset-sudoku",
    kwargs={
        "vocab_size": 10,
        "block_size": 81,
        "n_layer": 1,
        "n_head": 12,
        "n_embd": 768,
        "time_emb": 512,
        "multiplier": 4,
        "num_classes": 9,
        "n_recur": 24,
        "model_type": "hyper-set",
        # sudoku/utils.py passes training.dropout (0.0 in configs/config.yaml) for both; embd_pdrop is the class
        # attribute of ModelConfig.
        "resid_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "embd_pdrop": 0.1,
        "adaptive_mode": "gd_with_learnable_step_size",
        "phi_func": None,
        "pos_emb": "learnable",
        "input_cond": True,
    },
    description="Sudoku model (1 layer × 24 iterations, d = 768, 12 heads, M = 4d; a bare state_dict)",
    config_origin="configs/config.yaml + configs/task/sudoku.yaml, as scripts/sudoku/eval_sudoku.sh runs it",
)

IMAGENET = ReleasedFile(
    path="ic/IC_ImageNet1k_layer12_recur1_dim768_multiplier1.ckpt",
    source="hyperset-ic",
    kwargs={
        "num_classes": 1000,
        "img_size": 224,
        # `patch` is the number of patches per side: a 16 × 16 grid of 14-pixel patches at 224².
        "patch": 16,
        "dropout": 0.0,
        "n_layer": 12,
        "n_recur": 1,
        "n_embd": 768,
        "head": 12,
        "mlp_hidden": 768,
        "use_cls_token": True,
        "input_cond": False,
        "time_embed": 512,
        "type": "hyper-set",
    },
    description=(
        "ImageNet-1k classifier (12 distinct layers × 1 iteration, d = 768, 12 heads, M = d, 224² images in a "
        "16 × 16 grid of 14-pixel patches; a PyTorch Lightning checkpoint)"
    ),
    config_origin=(
        "configs/config.yaml + configs/task/ic.yaml with the overrides of scripts/ic/finetune_ic.sh (n_layer 12, "
        "n_recur 1, n_embd 768, n_head 12, mlp_hidden 768), ImageNet-1k at 224² with 1000 classes"
    ),
    # scripts/ic/eval_ic.sh names the file with a typo
    aliases=("IC_ImageNet1k_layer12_reucr1_dim768_multiplier1.ckpt",),
)

MIM = ReleasedFile(
    path="mim/MIM_ImageNet100_layer1_recur24_dim768_multiplier8.pth",
    source="hyperset-mim",
    kwargs={
        "model": "hyper-set",
        "img_size": 256,  # a 16 × 16 grid of VQGAN codes
        "codebook_size": 1024,
        "n_embd": 768,
        "n_layer": 1,
        "n_recur": 24,
        "head": 12,
        "multiplier": 8,
        # training.dropout of configs/task/mim.yaml (the HyperSET block has no dropout)
        "dropout": 0.1,
        # mim/run.py passes the dataset's class count; ImageNet-100 (the unconditional model embeds no label)
        "nclass": 100,
        "phi_func": None,
        "adaptive_mode": "gd_with_learnable_step_size",
    },
    description=(
        "masked image modelling model (MaskTransformerUncond: 1 layer × 24 iterations, d = 768, 12 heads, "
        "multiplier 8, over a 16 × 16 grid of VQGAN codes, codebook 1024 + [MASK]; a dict with `model_state_dict`)"
    ),
    config_origin=(
        "configs/config.yaml (adaptive_mode) + configs/task/mim.yaml (n_embd 768, n_head 12, img_size 256, "
        "dropout 0.1, ImageNet-100) with the overrides of scripts/mim/eval_mim.sh (n_recur 24, multiplier 8), "
        "codebook 1024 of MaskGIT's VQGAN"
    ),
)

RELEASED: tuple[ReleasedFile, ...] = (SUDOKU, IMAGENET, MIM)


def released_file(checkpoint: str | Path) -> ReleasedFile | None:
    """The released file a checkpoint path names (by its file name, as published), or None."""
    name = Path(checkpoint).name
    for released in RELEASED:
        if name == released.filename or name in released.aliases:
            return released
    return None


def unavailable_message(released: ReleasedFile) -> str:
    """Why a released file that no head of this package can hold is refused."""
    return (
        f"{released.filename} is the authors' {released.description}; no head of energyformers holds it, so this "
        "checkpoint cannot be converted. Nothing was read or written. The released files of "
        f"{HUB_REPO} that convert: " + ", ".join(f.filename for f in RELEASED if f.source is not None)
    )


__all__ = [
    "AUTHORS_CONFIG_COMMIT",
    "AUTHORS_REPOSITORY",
    "HUB_REPO",
    "RELEASED",
    "ReleasedFile",
    "released_file",
    "unavailable_message",
]
