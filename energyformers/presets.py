# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""Named configurations of each family: `<Arch>Config.from_preset(name, **overrides)` reads them here.

They live in the package, not in the configuration files, because those files are also the Hub's remote code
(`energyformers export`): a repository loaded with `trust_remote_code=True` carries one config, never the table of
paper settings, so its `from_preset` says that the presets need the package. One table per `model_type`; the
looped-Transformer baseline takes Hyper-SET's rows (`LoopedTransformerConfig.preset_fields`).
"""

from __future__ import annotations

from typing import Any

# Rows of the paper's Table 1 / poster (image 224, M = d, L = 1, T = 12) and its Sudoku model. They reproduce the
# paper's parameter counts with iteration_conditioning="sinusoidal" (the paper counts the authors' time MLP); the
# default "none" has fewer (docs/hyperset.md gives both). Asserted in tests/test_modeling_hyperset.py.
HYPERSET_PRESETS: dict[str, dict[str, Any]] = {
    "cifar10-small": dict(hidden_size=384, num_attention_heads=6, intermediate_size=384, num_labels=10),
    "cifar10-small-scaleup": dict(
        hidden_size=512, num_attention_heads=8, intermediate_size=512, num_labels=10
    ),
    "imagenet1k-640": dict(
        hidden_size=640, num_attention_heads=10, intermediate_size=640, patch_size=14, num_labels=1000
    ),
    # 9×9 grid as 81 tokens (0 = blank), one of 9 digits per cell; the paper conditions step sizes on
    # the puzzle itself and uses learned positions for the fixed layout; T = 24 (Table 4).
    "sudoku": dict(
        input_type="sequence",
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        num_iterations=24,  # paper Table 4
        qkv_norm="shared",
        step_size_condition="input",
        step_size_norm="none",  # the authors' Sudoku model: time MLP and step-size input without RMSNorms
        classifier_norm="rmsnorm",  # and an RMSNorm + bias-free Linear head
        classifier_bias=False,
        vocab_size=10,
        max_position_embeddings=81,
        position_embedding_type="learned",
        num_labels=9,
    ),
}
# The authors' released models (CIFAR-10, ImageNet-1k, Sudoku), exactly their structure: what `energyformers
# convert` builds from their checkpoints. It adds to the rows above the iteration-conditioned time MLP of their
# code and, in the image models, their GELU feedforward. The rows above keep this package's choices: time-invariant
# step sizes (docs/hyperset.md, "Recurrent depth") and ReLU, the exact gradient of the paper's feedforward energy.
HYPERSET_PRESETS.update(
    {
        f"{name}-authors": {**HYPERSET_PRESETS[name], "iteration_conditioning": "sinusoidal", **structure}
        for name, structure in (
            ("cifar10-small", {"hidden_act": "gelu"}),
            ("cifar10-small-scaleup", {"hidden_act": "gelu"}),
            ("imagenet1k-640", {"hidden_act": "gelu"}),
            ("sudoku", {}),  # its ReLU feedforward, shared q/k/v norm and RMSNorm head are in the row above
        )
    }
)
# Masked image modelling (paper §5.3, Table 9 structure, Table 2 rows; `HyperSetForMaskedImageModeling`): a 16 × 16
# grid of VQGAN codes, codebook 1024 + [MASK]; fixed 2-D sin-cos positions; step sizes conditioned on x₀ through
# GELU(RMSNorm(c + x₀)); one RMSNorm shared by q, k, v; ReLU feedforward; RMSNorm → Linear(d, 1024) head with bias.
# One change from the paper: c is one learned vector (iteration_conditioning="none", time-invariant step sizes that
# extrapolate in depth), not its sinusoid(t) of width d with no MLP after it (Table 9: "time-embedding frequency 768
# with no MLP"; iteration_conditioning="sinusoidal-no-mlp", which `energyformers convert` sets for the authors'
# checkpoint and time_embedding_dim = d below keeps valid as an override). The paper's counts (Table 2: 3.94 M and
# 8.07 M) hold exactly with "sinusoidal-no-mlp"; "none" adds c's d weights. Both asserted in tests/test_mim.py.
_MIM = dict(
    input_type="sequence",
    hidden_size=768,
    num_attention_heads=12,
    num_hidden_layers=1,
    vocab_size=1025,
    max_position_embeddings=256,
    position_embedding_type="sincos-2d",
    qkv_norm="shared",
    step_size_condition="input",
    iteration_conditioning="none",
    time_embedding_dim=768,
    step_size_norm="rmsnorm-sum",
    hidden_act="relu",
    classifier_norm="rmsnorm",
    classifier_bias=True,
)
HYPERSET_PRESETS.update(
    {
        "mim-1-12-d": dict(**_MIM, intermediate_size=768, num_iterations=12),  # Table 9 / Table 2, 3.94 M
        # Table 2's "Ours 1 / 24 / 8d" (8.07 M), the structure of the authors' released MIM checkpoint
        "mim-1-24-8d": dict(**_MIM, intermediate_size=8 * 768, num_iterations=24),
    }
)
# The small masked-image-modelling model `energyformers train --task masked-image-modeling` builds from scratch: the
# paper's MIM structure (the rows above) at width 128, T = 12 as Table 2; the tokenizer sets vocabulary and grid.
# As in `cli-image`, the anchor energy and random depth keep the accuracy flat past the trained T, where fixed-depth
# training falls (docs/mim.md, "Measured"); here the depth is uniform in [T/2, 3T/2] (the default range), mean T: the
# training compute of a fixed T.
HYPERSET_PRESETS["cli-mim"] = dict(
    **{**_MIM, "hidden_size": 128, "num_attention_heads": 4, "time_embedding_dim": 128},
    intermediate_size=128,
    num_iterations=12,
    input_anchor=0.5,
    iteration_sampling="uniform",
)
# The small models `energyformers train` builds from scratch (the dataset sets image geometry or vocabulary).
# Images: digits at 16×16, patch 2, 12 epochs at lr 3e-3; mean pooling because with CLS pooling the CLS token stays
# constant early on (the step sizes start at zero); the anchor energy and random depth in [2, 12] are what lets
# test-time depth extrapolate (measured in docs/benchmarks.md, "Recurrent depth: what makes Hyper-SET extrapolate").
# The depth range is not centred on T = 4: the mean training depth is 7, so a training step costs about 1.75× a step at
# T (3× at depth 12) while eval runs T; size training time from the training step, not from eval throughput.
HYPERSET_PRESETS.update(
    {
        "cli-image": dict(
            hidden_size=128,
            num_attention_heads=4,
            intermediate_size=128,
            num_iterations=4,
            time_embedding_dim=64,
            pooling="mean",
            input_anchor=0.5,
            iteration_sampling="uniform",
            min_iterations=2,
            max_iterations=12,
        ),
        "cli-sequence": dict(
            input_type="sequence",
            hidden_size=128,
            num_attention_heads=4,
            intermediate_size=256,
            num_iterations=4,
            time_embedding_dim=64,
            pooling="mean",
        ),
    }
)


# MLP-Mixer S/B/L (Tolstikhin et al., Table 1: width, depth) at patch 16 and 32, with the iMixer
# paper's best setting h_r = 2, n = 2 (Ota & Taki, CIFAR-10 at 224², 10 classes). Parameter counts
# they must reproduce are asserted in tests/test_modeling_imixer.py.
_MIXER_SIZES = {"s": (512, 8), "b": (768, 12), "l": (1024, 24)}
IMIXER_PRESETS: dict[str, dict[str, Any]] = {
    f"{size}{patch}": dict(
        hidden_size=width,
        num_hidden_layers=depth,
        patch_size=patch,
        image_size=224,
        hidden_ratio=2.0,
        fixed_point_iterations=2,
        num_labels=10,
    )
    for size, (width, depth) in _MIXER_SIZES.items()
    for patch in (16, 32)
}
# The paper's Table 2 axes that its text fixes: h_r = 1 next to the best h_r = 2, and n = 0, the
# vanilla MLP-Mixer of the same dimensions (its baseline row). Only settings whose parameter counts the paper
# states are named here; accuracies are the paper's, not reproduced.
_MIXER_NAMES = tuple(IMIXER_PRESETS)
for _name in _MIXER_NAMES:
    IMIXER_PRESETS[f"{_name}-hr1"] = {**IMIXER_PRESETS[_name], "hidden_ratio": 1.0}
    IMIXER_PRESETS[f"{_name}-mixer"] = {**IMIXER_PRESETS[_name], "fixed_point_iterations": 0}
del _name
# The small models `energyformers train` builds from scratch (the dataset sets image geometry or sequence length):
# digits at 16×16 with 12 epochs (measured accuracy: docs/benchmarks.md).
IMIXER_PRESETS["cli-image"] = dict(
    hidden_size=128, num_hidden_layers=4, hidden_ratio=2.0, fixed_point_iterations=2
)
IMIXER_PRESETS["cli-sequence"] = dict(
    input_type="sequence", hidden_size=128, num_hidden_layers=2, hidden_ratio=2.0, fixed_point_iterations=2
)


# The memo's experiments use 4 heads and 4 blocks at width 768 on 32×32 images with 4×4 patches
# (CBMM memo 143, CIFAR / Tiny-ImageNet experiments); `tiny` is for tests, `digits` for 8×8 grey UCI digits on CPU.
# `digits` keeps one input channel, the data's own (the parameter counts and timings recorded for it are of this
# model): it takes 1-channel `pixel_values`. transformers' image pipelines and the package's image processor convert
# every image to RGB, so a model served that way is built with `from_preset("digits", num_channels=3)`, as
# `energyformers train --preset digits` does.
_MEMO = dict(hidden_size=768, num_attention_heads=4, num_hidden_layers=4, patch_size=4, image_size=32)
HYPERBF_PRESETS: dict[str, dict[str, Any]] = {
    "cifar": dict(**_MEMO, num_labels=10),
    "cifar100": dict(**_MEMO, num_labels=100),
    "tiny": dict(
        hidden_size=32, num_attention_heads=2, num_hidden_layers=2, patch_size=2, image_size=8, num_labels=10
    ),
    "digits": dict(
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        patch_size=2,
        image_size=8,
        num_channels=1,
        num_labels=10,
    ),
}
# The small models `energyformers train` builds from scratch (the dataset sets image geometry or sequence length):
# images use the `digits` architecture at the CLI's 16×16 geometry (measured accuracy: docs/benchmarks.md).
HYPERBF_PRESETS["cli-image"] = {
    k: HYPERBF_PRESETS["digits"][k] for k in ("hidden_size", "num_attention_heads", "num_hidden_layers")
}
HYPERBF_PRESETS["cli-sequence"] = dict(
    input_type="sequence", hidden_size=128, num_attention_heads=4, num_hidden_layers=2
)


# The looped-Transformer baseline's own rows (it otherwise takes Hyper-SET's; `LoopedTransformerConfig.preset_fields`
# reads this table first; not in `PRESETS`, which lists the exported families).
# Table 2's "Transformer 1 / 12 / 4d" (8.85 M): one pre-norm layer × 12 iterations, d = 768, GELU MLP 4d, codebook
# 1024 + [MASK], RMSNorm → Linear(d, 1024) head with bias (`LoopedTransformerForMaskedImageModeling`). The count
# fixes the positions: with Hyper-SET's fixed sin-cos table the model has 8,654,848 parameters (8.65 M); a learned
# table of 256 × 768 adds 196,608, giving 8,851,456 = Table 2's 8.85 M (MaskGIT's transformer learns its
# positions too). Asserted in tests/test_mim.py. `cli-mim`: the CLI's small baseline beside Hyper-SET's `cli-mim`
# (same width, heads, T, depth sampling and head), with the MLP of width 4d.
_MIM_BASELINE = dict(
    input_type="sequence",
    hidden_size=768,
    num_attention_heads=12,
    num_hidden_layers=1,
    num_iterations=12,
    intermediate_size=4 * 768,
    hidden_act="gelu",
    vocab_size=1025,
    max_position_embeddings=256,
    position_embedding_type="learned",
    classifier_norm="rmsnorm",
    classifier_bias=True,
)
LOOPED_TRANSFORMER_PRESETS: dict[str, dict[str, Any]] = {
    "mim-1-12-4d": _MIM_BASELINE,
    "cli-mim": {
        **_MIM_BASELINE,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "intermediate_size": 512,
        "iteration_sampling": "uniform",
    },
}


# Where each row comes from, one entry per preset of every table above: the paper table or section it reproduces,
# the authors' released model it is, or "ours: <why>" for a setting no paper gives (the CLI's small from-scratch
# models, a test size). tests/test_presets.py checks that every row has one and is listed in its family's doc.
_HYPERSET_IMAGE = "Hyper-SET paper, Table 1 / poster: image classification at 224², L = 1, M = d, T = 12"
_CLI = (
    "ours: the small model `energyformers train` builds from scratch; its accuracy is in docs/benchmarks.md"
)
PRESET_SOURCES: dict[str, dict[str, str]] = {
    "hyperset": {
        "cifar10-small": _HYPERSET_IMAGE,
        "cifar10-small-scaleup": _HYPERSET_IMAGE,
        "imagenet1k-640": _HYPERSET_IMAGE,
        "sudoku": "Hyper-SET paper, Table 4 (T = 24); the structure of the authors' Sudoku model less their "
        "time MLP (iteration_conditioning='none'; `sudoku-authors` has it)",
        **{
            f"{name}-authors": f"the authors' released checkpoint (energyformers convert --source {source})"
            for name, source in (
                ("cifar10-small", "hyperset-ic"),
                ("cifar10-small-scaleup", "hyperset-ic"),
                ("imagenet1k-640", "hyperset-ic"),
                ("sudoku", "hyperset-sudoku"),
            )
        },
        "mim-1-12-d": "Hyper-SET paper, Table 9 structure, Table 2 row 'Ours 1 / 12 / d' (3.94 M)",
        "mim-1-24-8d": "Hyper-SET paper, Table 2 row 'Ours 1 / 24 / 8d' (8.07 M), the authors' released checkpoint",
        "cli-mim": "ours: the small masked-image-modelling model `energyformers train --task mim` builds",
        "cli-image": _CLI,
        "cli-sequence": _CLI,
    },
    "imixer": {
        **{
            name: "MLP-Mixer sizes (Tolstikhin et al., Table 1) with iMixer's best h_r = 2, n = 2 (Ota & Taki, "
            "Table 2)"
            for name in _MIXER_NAMES
        },
        **{f"{name}-hr1": "iMixer paper, Table 2: h_r = 1" for name in _MIXER_NAMES},
        **{
            f"{name}-mixer": "iMixer paper, Table 2: n = 0, its MLP-Mixer baseline row"
            for name in _MIXER_NAMES
        },
        "cli-image": _CLI,
        "cli-sequence": _CLI,
    },
    "hyperbf": {
        "cifar": "CBMM memo 143, CIFAR-10 experiments: D = 768, 4 heads, 4 blocks, patch 4, 32²",
        "cifar100": "CBMM memo 143, CIFAR-100 experiments: the `cifar` setting with 100 labels",
        "tiny": "ours: the smallest valid model, for tests",
        "digits": "ours: a model that trains in minutes on 8×8 grey UCI digits on a CPU; grey input "
        "(num_channels=1, 1-channel pixel_values): for pipeline() and the image processor, which give RGB, "
        "build it with num_channels=3",
        "cli-image": _CLI,
        "cli-sequence": _CLI,
    },
    "looped-transformer": {
        "mim-1-12-4d": "Hyper-SET paper, Table 2 row 'Transformer 1 / 12 / 4d' (8.85 M)",
        "cli-mim": "ours: the CLI's small baseline beside Hyper-SET's `cli-mim`",
    },
}


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "hyperset": HYPERSET_PRESETS,
    "imixer": IMIXER_PRESETS,
    "hyperbf": HYPERBF_PRESETS,
}


def preset_fields(config_class: type, name: str) -> dict[str, Any]:
    """The fields preset `name` of `config_class`'s family sets, as a new dict (the caller may change it).

    Raises ValueError naming the class, the name and the presets the family has.
    """
    model_type = getattr(config_class, "model_type", None)
    if model_type not in PRESETS:
        raise ValueError(
            f"{config_class.__name__}: model_type={model_type!r} has no presets; families with presets: "
            f"{sorted(PRESETS)}."
        )
    table = PRESETS[model_type]
    if name not in table:
        raise ValueError(
            f"{config_class.__name__}: unknown preset name={name!r}; expected one of {sorted(table)}."
        )
    return dict(table[name])


__all__ = [
    "HYPERBF_PRESETS",
    "HYPERSET_PRESETS",
    "IMIXER_PRESETS",
    "LOOPED_TRANSFORMER_PRESETS",
    "PRESETS",
    "PRESET_SOURCES",
    "preset_fields",
]
