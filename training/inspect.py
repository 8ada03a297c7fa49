"""`energyformers inspect MODEL_DIR [INPUTS...] --output_dir DIR`: pictures (PNG) and numbers (JSON) of the dynamics.

    energyformers inspect runs/demo-hyperset --dataset digits --output_dir runs/demo-hyperset/inspect
    energyformers inspect runs/demo-imixer img1.png img2.png --output_dir out
    energyformers inspect --landscape --output_dir out          # Hopfield energy landscapes only

What a model's family draws (all on the INPUTS, or on `--max_samples` examples of `--dataset`):

* Hyper-SET: E_ATTN and E_FF per iteration up to `--max_iterations` (default the largest trained depth plus T),
  the depths run in training shaded (up to T at fixed depth, the sampled range darker with `iteration_sampling`),
  the effective rank and the mean pairwise angle of every head (`hyperset_energy.png`, `hyperset_geometry.png`).
* iMixer: the fixed-point residual of every block at every solver step, past the trained number of steps
  (`imixer_residuals.png`).
* HyperBF: the kernel widths σ of every layer, per attention head and for the feedforward RBF unit
  (`hyperbf_sigmas.png`).
* Masked image modelling (`HyperSetForMaskedImageModeling` or the looped Transformer's
  `LoopedTransformerForMaskedImageModeling`, with the image tokenizer saved in its folder): the
  decode sequence of the first INPUT image, `--mask_ratio` of its codes masked, then the grid after each of
  `--steps` MaskGIT steps decoded to pixels, masked codes drawn grey (`mim_decode_sequence.png`).
* With a labelled `--dataset` (checked against the model's labels as `evaluate` checks it, before the model
  loads): accuracy against the number of iterations (Hyper-SET, the looped-Transformer baseline: its classifiers
  draw this alone) or fixed-point steps (iMixer), `accuracy_vs_iterations.png`; HyperBF (no iterations) reports its
  accuracy in the JSON. The per-iteration figures run at fixed depth: a saved `halting_tolerance` is off here (the
  JSON's `halting_tolerance` records it).
* A run folder whose log history (`metrics.json`, else `trainer_state.json`) holds per-iteration eval accuracy
  (`eval_<metric>_iterations_<t>`, `energyformers train --eval_iterations`): the training curve,
  `training_curve_by_iterations.png`: the training loss against the step with the chance loss ln(C) of a
  classifier, and the eval accuracy against the step at each logged iteration count t (T/2, T, 2T, ...), the
  plateau exit step (`evaluation.plateau_exit_step`) marked. Such a folder needs no INPUTS or `--dataset`.
* `--landscape`: contour plots of the modern Hopfield energy (`energyformers.energy`) of a few stored 2-D
  patterns at three inverse temperatures, with gradient-descent trajectories drawn on them
  (`energy_landscape.png`).

Everything plotted is also in `inspect.json`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from .cli import CommandParser, UsageError, check_model_source, check_output_folder, run_command
from .evaluate import FAMILY_DEPTH_ARGUMENTS, SPLITS, load_config
from .interrupt import (
    deferring_stops,
    locked_output_dir,
    restore_interrupted_publish,
    staging_folder,
)
from .predict import (
    MIM_RANGES,
    MIM_SCHEDULES,
    cannot_load,
    check_inputs,
    check_local_model_folder,
    check_ranges,
    check_readable_images,
    input_kind,
    load_processor_or_refuse,
    masked_image_modeling_head,
    refuse_mim_flags,
)
from .weights import load_or_refuse, read_json_object

if TYPE_CHECKING:  # torch is imported where it is used, so `inspect --help` does not pay for it
    import torch


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# the stored patterns of the landscape figure: 2-D, equal norms (every pattern a fixed point at high β), uneven
# angles (so the low-β average and the high-β separation both show)
LANDSCAPE_PATTERNS: tuple[tuple[float, float], ...] = tuple(
    (1.8 * math.cos(math.radians(angle)), 1.8 * math.sin(math.radians(angle)))
    for angle in (15, 95, 170, 230, 300)
)
LANDSCAPE_BETAS: tuple[float, ...] = (0.5, 2.0, 8.0)
# Each model_type's name in figure titles.
FAMILY_TITLES = {
    "hyperset": "Hyper-SET",
    "imixer": "iMixer",
    "hyperbf": "HyperBF",
    "looped-transformer": "looped Transformer",
}
# The decode-sequence flags (masked-image-modelling models only) and their values when not given; not given, they
# can be refused for a classifier, as `predict` refuses them.
MIM_DEFAULTS: dict[str, Any] = {"mask_ratio": 0.4, "steps": 8, "schedule": "arccos", "seed": 0}
# The model_types inspect reads from a local folder: the families, and the looped Transformer baseline (its
# masked-image-modelling head's decode sequence; its classifiers' accuracy against the iterations, with --dataset).
MODEL_TYPES = ("hyperset", "imixer", "hyperbf", "looped-transformer")
INSPECT_JSON = "inspect.json"  # the report: everything drawn, as numbers
# The looped Transformer's classifiers have no dynamics diagnostics of their own (no energies, no residuals): what
# inspect draws of them is the accuracy against the iterations, which needs a labelled dataset.
LOOPED_NEEDS_A_DATASET = (
    "{model_dir} holds a 'looped-transformer' model ({architecture}), a classifier with no energies or residuals "
    "to draw: inspect draws the baselines' masked-image-modelling heads (their decode sequence) and, with a "
    "labelled --dataset, their classifiers' accuracy against the number of iterations; give --dataset"
)
# What the per-iteration figures run with: every sample every iteration, whatever halting the saved config sets.
FIXED_DEPTH = (
    "halting_tolerance={value} of the saved config is off here (None): the per-iteration curves run every sample "
    "through every iteration (fixed depth); `predict --halting_tolerance` runs the model with halting"
)
GIVE_INPUTS = (
    "give INPUTS (image paths or texts) or a labelled --dataset to run the model on (a run folder whose log history "
    "holds per-iteration eval accuracy, `train --eval_iterations`, needs neither: its training curve is drawn)"
)


def mim_needs_an_image(model_dir: str) -> str:
    """The message for a masked-image-modelling folder inspected without an image input."""
    return (
        f"{model_dir} is a masked-image-modelling model: give an image path as INPUTS (its decode sequence is "
        "drawn); --dataset is not read for it"
    )


class InspectError(UsageError):
    """A usage or input problem, reported as `energyformers inspect: error: ...` (exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    """The `energyformers inspect` argument parser."""
    p = CommandParser(prog="energyformers inspect", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "model_dir", nargs="?", help="a folder written by `energyformers train` (optional with --landscape)"
    )
    p.add_argument("inputs", nargs="*", help="image paths (image models) or texts (text models) to inspect")
    p.add_argument(
        "--output_dir",
        required=True,
        help="where the PNGs and inspect.json are written: a new or empty folder, or the model folder itself",
    )
    p.add_argument(
        "--overwrite_output_dir",
        action="store_true",
        help="write into a non-empty --output_dir (files of the same names are replaced, others kept)",
    )
    p.add_argument(
        "--dataset", help="a built-in or local labelled dataset (`energyformers train --dataset` names)"
    )
    p.add_argument(
        "--split",
        choices=SPLITS,
        help="its split (default: test, or validation where the dataset's test split is unlabelled); an "
        "unlabelled one (all labels -1) is refused, as by `energyformers evaluate`",
    )
    p.add_argument("--max_samples", type=int, default=256, help="examples of --dataset used (default 256)")
    p.add_argument(
        "--max_iterations",
        type=int,
        help="deepest iteration count shown (default: the largest trained depth plus the configured one, i.e. "
        "twice the trained iterations / fixed-point steps at fixed depth)",
    )
    p.add_argument(
        "--batch_size", type=int, default=64, help="examples of --dataset per forward pass (default 64)"
    )
    p.add_argument("--landscape", action="store_true", help="also draw the Hopfield energy landscapes")
    p.add_argument("--num_threads", type=int, help="torch CPU threads")
    mim = p.add_argument_group("masked image modelling (a *ForMaskedImageModeling folder with its tokenizer)")
    mim.add_argument("--mask_ratio", type=float, help="share of codes masked, in [0, 1] (default 0.4)")
    mim.add_argument("--steps", type=int, help="MaskGIT decoding steps drawn (>= 1; default 8)")
    mim.add_argument("--schedule", choices=MIM_SCHEDULES, help="MaskGIT schedule (default arccos)")
    mim.add_argument("--seed", type=int, help="seed of the masking and the decoding (>= 0; default 0)")
    return p


# ----------------------------------------------------------------------------- energy landscape


def energy_landscape(
    patterns: torch.Tensor | None = None,
    betas: tuple[float, ...] = LANDSCAPE_BETAS,
    num_starts: int = 10,
    step_size: float = 0.3,
    max_steps: int = 400,
    extent: float = 3.0,
    resolution: int = 121,
    seed: int = 0,
) -> dict[str, Any]:
    """The modern Hopfield energy of 2-D stored `patterns` `(P, 2)` on a grid, and descent trajectories, per β.

    Trajectories start at `num_starts` points on a circle of radius 0.9·extent (angles jittered by `seed`) and run
    `energyformers.energy.minimize_energy` with `step_size` (monotone for any step <= 2). Returns plain tensors:
    grid `(resolution,)`, energies `(len(betas), resolution, resolution)` (rows: y), trajectories
    `[(steps + 1, num_starts, 2)]` per β, and the end points' distance to the nearest pattern `(len(betas), num_starts)`.
    """
    import torch

    from energyformers.energy import hopfield_energy, minimize_energy

    stored = torch.tensor(LANDSCAPE_PATTERNS if patterns is None else patterns, dtype=torch.float64)
    if stored.ndim != 2 or stored.shape[1] != 2:
        raise ValueError(f"patterns must have shape (num_patterns, 2); got {tuple(stored.shape)}.")
    grid = torch.linspace(-extent, extent, resolution, dtype=torch.float64)
    gy, gx = torch.meshgrid(grid, grid, indexing="ij")
    points = torch.stack([gx, gy], -1).reshape(-1, 1, 2)  # (R², 1, 2): one state per grid point
    generator = torch.Generator().manual_seed(seed)
    angles = (torch.arange(num_starts) + 0.5 * torch.rand(num_starts, generator=generator)) * (
        2 * math.pi / num_starts
    )
    # (S, 1, 2)
    starts = 0.9 * extent * torch.stack([angles.cos(), angles.sin()], -1).to(torch.float64)[:, None]
    energies, trajectories, distances, minima = [], [], [], []
    for beta in betas:
        energy = hopfield_energy(points, stored.expand(points.shape[0], -1, -1), beta)
        energies.append(energy.reshape(resolution, resolution))  # (R²,) → (R, R): rows y, columns x
        result = minimize_energy(
            lambda xi, beta=beta: hopfield_energy(xi, stored.expand(xi.shape[0], -1, -1), beta),
            starts,
            step_size=step_size,
            max_steps=max_steps,
            tolerance=1e-9,
        )
        path = result.trajectory[:, :, 0]  # (steps + 1, S, 2)
        trajectories.append(path)
        distances.append(torch.cdist(path[-1], stored).amin(-1))
        minima.append(_distinct(path[-1]))
    return {
        "patterns": stored,
        "betas": list(betas),
        "grid": grid,
        "energies": torch.stack(energies),
        "trajectories": trajectories,
        "end_distance_to_nearest_pattern": torch.stack(distances),
        "end_points": minima,
        "step_size": step_size,
    }


def _distinct(points: torch.Tensor, tolerance: float = 1e-2) -> torch.Tensor:
    """The points `(S, 2)` with near-duplicates (closer than `tolerance` to an earlier one) removed."""
    import torch

    kept: list[torch.Tensor] = []
    for point in points:
        if all((point - other).norm() >= tolerance for other in kept):
            kept.append(point)
    return torch.stack(kept)


def plot_landscape(result: dict[str, Any], path: Path) -> None:
    """Draw the energy landscape of each β with its descent trajectories into `path`."""
    plt = _pyplot()
    betas = result["betas"]
    fig, axes = plt.subplots(1, len(betas), figsize=(4.6 * len(betas), 4.9), squeeze=False)
    grid, patterns = result["grid"].numpy(), result["patterns"].numpy()
    panels = zip(axes[0], betas, result["energies"], result["trajectories"], result["end_points"])
    for ax, beta, energy, path_, ends in panels:
        filled = ax.contourf(grid, grid, energy.numpy(), levels=30, cmap="viridis")
        ax.contour(grid, grid, energy.numpy(), levels=15, colors="white", linewidths=0.4, alpha=0.5)
        colorbar = fig.colorbar(filled, ax=ax, shrink=0.85)
        colorbar.set_label("energy E(ξ)")
        ax.plot(patterns[:, 0], patterns[:, 1], "*", color="white", ms=15, mec="black", mew=0.8)
        for s in range(path_.shape[1]):
            line = path_[:, s].numpy()
            ax.plot(line[:, 0], line[:, 1], color="tab:orange", lw=1.3)
            ax.plot(line[0, 0], line[0, 1], "o", color="tab:orange", ms=4)
            ax.plot(line[-1, 0], line[-1, 1], "X", color="red", ms=6, mec="white", mew=0.5, zorder=5)
        ax.set_title(f"β = {beta:g}: {len(ends)} distinct end point{'s' if len(ends) > 1 else ''}")
        ax.set_xlabel("ξ₁")
        ax.set_ylabel("ξ₂")
        ax.set_aspect("equal")
    handles = [
        plt.Line2D([], [], marker="*", ls="", color="white", mec="black", ms=13, label="stored patterns x_j"),
        plt.Line2D([], [], marker="o", color="tab:orange", ms=5, label="descent trajectory (start ●)"),
        plt.Line2D([], [], marker="X", ls="", color="red", ms=7, label="end point"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(
        "Modern Hopfield energy E(ξ) = −β⁻¹ log Σ_j exp(β x_j·ξ) + ½‖ξ‖² + const, "
        f"gradient descent (step {result['step_size']:g})"
    )
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def landscape_json(result: dict[str, Any]) -> dict[str, Any]:
    """The landscape result as JSON-ready lists (rounded), for inspect.json."""
    return {
        "patterns": result["patterns"].tolist(),
        "betas": result["betas"],
        "step_size": result["step_size"],
        # [β][start][step]
        "trajectories": [_rounded(path.transpose(0, 1)) for path in result["trajectories"]],
        "end_distance_to_nearest_pattern": result["end_distance_to_nearest_pattern"].tolist(),
        "distinct_end_points": [points.tolist() for points in result["end_points"]],
        "energy_range": [[float(e.min()), float(e.max())] for e in result["energies"]],
    }


# ----------------------------------------------------------------------------- model, inputs, data


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _rounded(tensor: torch.Tensor, digits: int = 6) -> Any:
    """Nested lists with floats rounded (NaN → None: JSON has no NaN)."""
    values = tensor.detach().double().cpu().tolist()

    def clean(value: Any) -> Any:
        if isinstance(value, list):
            return [clean(v) for v in value]
        return None if not math.isfinite(value) else round(value, digits)

    return clean(values)


def load_model(model_dir: str) -> tuple[Any, str, float | None]:
    """The saved model (its head, else the backbone) in eval mode, its family's model_type, and the
    halting_tolerance its config saved (set to None here: the per-iteration diagnostics run at fixed depth)."""
    from energyformers import BASELINES, FAMILIES

    config = load_config(model_dir, InspectError)
    architecture = (config.architectures or [None])[0]
    family = FAMILIES.get(config.model_type)
    if family is None:  # Table 2's looped Transformer: its decode sequence, or its accuracy against depth
        family = BASELINES.get(config.model_type)
    if family is None:
        raise InspectError(
            f"{model_dir} holds a {config.model_type!r} model ({architecture}); inspect draws {sorted(FAMILIES)} "
            f"(energyformers families) and the {sorted(BASELINES)} baseline"
        )
    model_class = next(
        (h for h in family.heads.values() if h.__name__ == architecture), family.heads["AutoModel"]
    )
    model = load_or_refuse(
        model_class, model_dir, error=InspectError, message=lambda err: cannot_load(model_dir, err)
    ).eval()
    halting_tolerance = getattr(model.config, "halting_tolerance", None)
    if halting_tolerance is not None:  # per-iteration diagnostics need every sample to run every iteration
        model.config.halting_tolerance = None
    return model, config.model_type, halting_tolerance


def encode(model_dir: str, input_type: str, items: list[Any], processor: Any) -> dict[str, torch.Tensor]:
    """Images (paths or PIL) or texts → model inputs through `processor`, the one saved with the model
    (`load_processor_or_refuse`)."""
    from .processing import to_rgb

    if input_type == "image":
        from PIL import Image

        images = []
        for item in items:
            if isinstance(item, (str, Path)):
                if not Path(item).is_file():
                    raise InspectError(f"{model_dir} inspects images; no such file: {item}")
                check_readable_images([str(item)])
                item = Image.open(item)
            images.append(to_rgb(item))
        return {"pixel_values": processor(images, return_tensors="pt")["pixel_values"]}
    return encode_texts(processor, list(items))


def encode_texts(tokenizer: Any, texts: list[str], pairs: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Texts (with `pairs`, the second text of each sentence pair) → one batch of `input_ids` (and
    `attention_mask`). Each text is tokenized as predict's pipelines tokenize it (alone, truncated to the model's
    length); texts of different lengths are padded with the tokenizer's padding token. A tokenizer without one (the
    Sudoku grids' WordLevel tokenizer: every puzzle is 81 cells) batches texts of one length only: an
    `InspectError` names two lengths otherwise."""
    import torch

    if tokenizer.pad_token is not None:
        encoded = tokenizer(texts, pairs, padding=True, truncation=True, return_tensors="pt")
        return {key: encoded[key] for key in ("input_ids", "attention_mask") if key in encoded}
    encoded = [tokenizer(text, truncation=True) for text in texts]
    lengths = [len(item["input_ids"]) for item in encoded]
    if len(set(lengths)) > 1:
        other = next(i for i, n in enumerate(lengths) if n != lengths[0])
        raise InspectError(
            f"{texts[0]!r} is {lengths[0]} tokens and {texts[other]!r} is {lengths[other]}, and the model's "
            "tokenizer has no padding token to batch them; inspect texts of one length together"
        )
    keys = [key for key in ("input_ids", "attention_mask") if key in encoded[0]]
    return {key: torch.tensor([item[key] for item in encoded]) for key in keys}


def dataset_batches(
    model_dir: str,
    config: Any,
    name: str,
    split: str | None,
    max_samples: int,
    batch_size: int,
    processor: Any,
) -> tuple[str, list[tuple[dict[str, torch.Tensor], torch.Tensor]]]:
    """The split read and the (inputs, labels) batches of its first `max_samples` examples, of the dataset `name`,
    encoded by `processor` (`encode`). `split` is `--split` (None: not given), chosen as `energyformers evaluate`
    chooses it (`evaluate.scored_split`: an unlabelled split is refused, or, not given, gives way to validation).

    Loaded with `energyformers.training.data.load_data` (normalised columns: image/text/input_ids + label(s)), and
    refused unless the model predicts its labels (`evaluate.check_dataset_fits`, evaluate's own check).
    """
    import torch

    from .data import (
        BUILTIN_DATASETS,
        DataError,
        decode_lazily,
        input_type_of,
        is_token_classification,
        load_data,
    )
    from .evaluate import check_dataset_fits, model_labels, scored_split
    from .processing import clipped_image_modes, clipped_modes_warning, pair_separator_refusal

    input_type = getattr(config, "input_type", "image")
    try:
        # integer labels mapped onto the model's own, as `energyformers evaluate` maps them
        data = load_data(name, class_names=model_labels(config))
    except DataError as err:
        raise InspectError(str(err)) from None
    if input_type_of(data) != input_type:
        raise InspectError(
            f"--dataset {name} holds {input_type_of(data)} inputs; this model takes {input_type} inputs"
        )
    split = scored_split(split, name, data)
    check_dataset_fits(model_dir, config, name, data)
    refusal = pair_separator_refusal(data, processor, model_dir)
    if refusal:
        raise InspectError(refusal)
    rows = data[split].select(range(min(max_samples, len(data[split]))))
    if input_type == "image" and name not in BUILTIN_DATASETS:  # the built-ins are 8-bit
        clipped = clipped_modes_warning(clipped_image_modes(rows))
        if clipped:
            print(f"warning: {clipped}", file=sys.stderr, flush=True)
    rows = decode_lazily(rows, None, split)  # a file that cannot be decoded is named
    per_token = is_token_classification(data)
    label_column = "labels" if per_token else "label"
    batches = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        if per_token:  # grid cells are already the token ids
            inputs = {"input_ids": torch.tensor(chunk["input_ids"])}
        elif "text_pair" in chunk:  # sentence pairs, encoded together as training encoded them
            inputs = encode_texts(processor, chunk["text"], chunk["text_pair"])
        else:
            inputs = encode(
                model_dir, input_type, chunk["image" if input_type == "image" else "text"], processor
            )
        batches.append((inputs, torch.tensor(chunk[label_column])))
    return split, batches


def accuracy(model: Any, batches: list[tuple[dict[str, torch.Tensor], torch.Tensor]], **call: Any) -> float:
    """Fraction of correct predictions (per token where labels are >= 0 for token classification)."""
    import torch

    from ..center_cache import centers_scope

    correct = total = 0
    # HyperBF computes what its centers give once for all the batches, not at every one
    with torch.no_grad(), centers_scope(model):
        for inputs, labels in batches:
            predictions = model(**inputs, **call).logits.argmax(-1)
            counted = labels >= 0
            correct += int((predictions[counted] == labels[counted]).sum())
            total += int(counted.sum())
    return correct / max(total, 1)


# ----------------------------------------------------------------------------- per family


# What one depth is to a model, by the depths its training forwards ran (`depth_regime`)
INTERMEDIATE, TRAINED, BEYOND = "intermediate", "trained", "beyond"


def trained_depths(config: Any, argument: str) -> dict[str, Any]:
    """The depths a model was trained at, as `inspect.json` records them (`trained_depths`): the depth `argument`
    (`num_iterations`, `fixed_point_iterations`), its config value (`default`, the depth of eval mode), the
    `iteration_sampling` of training and the smallest and largest depth a training forward ran (`min`, `max`):
    the config value at fixed depth, the sampled range (`min_iterations`/`max_iterations` or their defaults,
    `config.iteration_range`) when the depth was drawn per forward."""
    default = int(getattr(config, argument))
    sampling = getattr(config, "iteration_sampling", "fixed") if argument == "num_iterations" else "fixed"
    low, high = (default, default) if sampling == "fixed" else config.iteration_range
    return {"argument": argument, "iteration_sampling": sampling, "default": default, "min": low, "max": high}


def depth_regime(depth: int, trained: dict[str, Any]) -> str:
    """What `depth` is to a model trained at the depths `trained` (`trained_depths`): `TRAINED` (a depth a training
    forward ended at, `min` ≤ depth ≤ `max`), `INTERMEDIATE` (below `min`: run inside every training forward, never
    its output) or `BEYOND` (past `max`: never run in training, extrapolation)."""
    if depth > trained["max"]:
        return BEYOND
    return TRAINED if depth >= trained["min"] else INTERMEDIATE


def default_deepest(trained: dict[str, Any]) -> int:
    """The deepest depth shown without `--max_iterations`: the config's depth past the largest trained depth (2T at
    fixed depth), at least 2, so every plot reaches beyond what training ran."""
    return max(trained["max"] + trained["default"], 2)


def _shade_trained(ax: Any, trained: dict[str, Any], deepest: int) -> None:
    """Shade the depths run in training (up to the largest trained depth, `trained_depths`), the trained depths
    darker when sampled, mark the largest, label what lies beyond it; integer ticks on x."""
    from matplotlib.ticker import MaxNLocator

    low, high = trained["min"], trained["max"]
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.axvspan(0, high, color="tab:green", alpha=0.08, lw=0)
    if low == high:
        ax.axvline(high, color="tab:green", ls="--", lw=1, label=f"trained depth ({high})")
    else:  # every depth in [low, high] ended some training forwards
        # two short lines: the geometry figure's legend sits in a narrow margin right of the axes
        label = f"trained depths {low}–{high}\n({trained['iteration_sampling']}; T = {trained['default']})"
        ax.axvspan(low, high, color="tab:green", alpha=0.12, lw=0, label=label)
        ax.axvline(high, color="tab:green", ls="--", lw=1)
    if deepest > high:
        ax.text(
            high, 1.0, " beyond →", transform=ax.get_xaxis_transform(), va="top", fontsize=8, color="gray"
        )


def inspect_hyperset(
    model: Any, inputs: dict[str, torch.Tensor], deepest: int, output_dir: Path
) -> dict[str, Any]:
    """Hyper-SET's energies, effective rank and token angles over `deepest` iterations; figures into `output_dir`."""
    import torch

    config = model.config
    argument = FAMILY_DEPTH_ARGUMENTS["hyperset"]
    trained = trained_depths(config, argument)
    with torch.no_grad():
        energies = model(**inputs, **{argument: deepest}, output_energies=True).energies
    steps = list(range(deepest + 1))
    mean = {
        name: getattr(energies, name).float().mean(0) for name in ("attention_energy", "feedforward_energy")
    }
    # (L, T + 1, H)
    rank, angle = energies.effective_rank.float().mean(0), energies.average_angle.float().mean(0)
    layers = rank.shape[0]
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (name, label) in zip(axes, (("attention_energy", "E_ATTN"), ("feedforward_energy", "E_FF"))):
        for layer in range(layers):
            ax.plot(
                steps, mean[name][layer].numpy(), "o-", ms=3, label=f"layer {layer}" if layers > 1 else label
            )
        _shade_trained(ax, trained, deepest)
        ax.set_xlabel("iteration t (0 = input of the layer)")
        ax.set_ylabel(f"{label} (mean over {len(next(iter(inputs.values())))} inputs)")
        ax.set_title(f"{label} per iteration")
        ax.ticklabel_format(axis="y", useOffset=False)  # absolute energies, not offsets from a constant
        ax.legend(loc="best", fontsize=8)
    fig.suptitle("Hyper-SET: energies along the iterations (shaded: depths run in training)")
    fig.tight_layout()
    fig.savefig(output_dir / "hyperset_energy.png", dpi=100)
    plt.close(fig)

    shown = min(layers, 4)
    fig, axes = plt.subplots(shown, 2, figsize=(11, 3.4 * shown), squeeze=False)
    heads = rank.shape[-1]
    for layer in range(shown):
        for column, (values, label) in enumerate(
            ((rank, "effective rank"), (angle, "mean pairwise angle (°)"))
        ):
            ax = axes[layer, column]
            for head in range(heads):
                ax.plot(steps, values[layer, :, head].numpy(), lw=1.2, label=f"head {head}")
            _shade_trained(ax, trained, deepest)
            ax.set_xlabel("iteration t")
            ax.set_ylabel(label)
            ax.set_title(f"{label} per head" + (f", layer {layer}" if layers > 1 else ""))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
    fig.suptitle("Hyper-SET: token geometry per head (rank of n(W_hᵀX), angle between tokens)")
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    fig.savefig(output_dir / "hyperset_geometry.png", dpi=100)
    plt.close(fig)
    return {
        "trained_iterations": trained["default"],
        "iterations": steps,
        "layers": [
            {
                "attention_energy": _rounded(mean["attention_energy"][layer]),
                "feedforward_energy": _rounded(mean["feedforward_energy"][layer]),
                "effective_rank": _rounded(rank[layer]),  # [t][head]
                "average_angle": _rounded(angle[layer]),  # [t][head], degrees
            }
            for layer in range(layers)
        ],
        "figures": ["hyperset_energy.png", "hyperset_geometry.png"],
    }


def inspect_imixer(
    model: Any, inputs: dict[str, torch.Tensor], deepest: int, output_dir: Path
) -> dict[str, Any]:
    """iMixer's fixed-point residuals over `deepest` solver steps; figures into `output_dir`. An `InspectError` for an
    iMixer without a fixed-point block (fixed_point_iterations=0)."""
    import torch

    argument = FAMILY_DEPTH_ARGUMENTS["imixer"]
    if getattr(model.config, argument) == 0:
        raise InspectError(f"this iMixer has {argument}=0 (no fixed-point block): nothing to inspect")
    trained = trained_depths(model.config, argument)
    with torch.no_grad():
        outputs = model(**inputs, **{argument: deepest}, output_fixed_point_residuals=True)
    diagnostics = getattr(outputs, "fixed_point_residuals", None)
    if diagnostics is None:
        raise InspectError(
            "this iMixer returned no fixed_point_residuals (output_fixed_point_residuals=True)"
        )
    # read what this version of the diagnostics offers (fields may be added or missing)
    fields = {
        name: value
        for name in getattr(diagnostics, "__dataclass_fields__", {})
        if isinstance(value := getattr(diagnostics, name, None), torch.Tensor)
    }
    labels = {
        "relative_residuals": r"$\|x_a - x_{a-1}\| \;/\; \|x_{a-1}\|$",
        "residuals": r"$\|x_a - x_{a-1}\| \;/\; \sqrt{D \cdot D_S}$ (paper)",
    }
    curves = [(name, label) for name, label in labels.items() if name in fields]
    if not curves:
        raise InspectError(f"the iMixer diagnostics carry no residual curves; fields: {sorted(fields)}")
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(5.6 * len(curves), 4), squeeze=False)
    for ax, (name, label) in zip(axes[0], curves):
        values = fields[name].float()  # (L, steps)
        for block in range(values.shape[0]):
            steps = range(1, values.shape[1] + 1)
            ax.semilogy(steps, values[block].clamp_min(1e-12).numpy(), "o-", ms=3, label=f"block {block}")
        _shade_trained(ax, trained, deepest)
        ax.set_xlim(0.5, max(deepest, 1) + 0.5)
        ax.set_xlabel("fixed-point step a")
        ax.set_ylabel(label)
        ax.set_title(name.replace("_", " ") + " per block")
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(
        r"iMixer: fixed-point residuals of $x_a = x_0 + F(x_{a-1})$ per block (shaded: trained steps)"
    )
    fig.tight_layout()
    fig.savefig(output_dir / "imixer_residuals.png", dpi=100)
    plt.close(fig)
    numbers = {name: _rounded(value) for name, value in fields.items()}
    return {
        "trained_steps": trained["default"],
        "steps_run": deepest,
        **numbers,
        "figures": ["imixer_residuals.png"],
    }


def inspect_hyperbf(model: Any, inputs: dict[str, torch.Tensor], output_dir: Path) -> dict[str, Any]:
    """HyperBF's RBF widths per layer (attention heads, feedforward centers); figures into `output_dir`."""
    import torch

    with torch.no_grad():
        outputs = model(**inputs, output_rbf_diagnostics=True)
    diagnostics = outputs.rbf_diagnostics
    attention = diagnostics.attention_sigmas.float()  # (L, H)
    feedforward = diagnostics.feedforward_sigmas.float()  # (L, 1 | K)
    layers = attention.shape[0]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for head in range(attention.shape[1]):
        ax.plot(
            range(layers),
            attention[:, head].numpy(),
            "o-",
            ms=5,
            lw=1,
            alpha=0.8,
            label=f"attention head {head}",
        )
    if feedforward.shape[1] == 1:
        ax.plot(
            range(layers), feedforward[:, 0].numpy(), "s-", color="black", ms=6, lw=2, label="feedforward σ"
        )
    else:  # one width per center: median and the full range
        ax.fill_between(range(layers), feedforward.amin(1).numpy(), feedforward.amax(1).numpy(), color="gray",
                        alpha=0.25, label="feedforward σ (range over centers)")  # fmt: skip
        ax.plot(
            range(layers),
            feedforward.median(1).values.numpy(),
            "s-",
            color="black",
            label="feedforward σ (median)",
        )
    ax.set_xticks(range(layers))
    ax.set_xlabel("layer")
    ax.set_ylabel("kernel width σ")
    ax.set_title("HyperBF: Gaussian kernel widths σ per layer\nattention heads vs the feedforward RBF unit")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(output_dir / "hyperbf_sigmas.png", dpi=100)
    plt.close(fig)
    result = {
        "attention_sigmas": _rounded(attention),  # [layer][head]
        "feedforward_sigmas": _rounded(feedforward),  # [layer][1 or center]
        "figures": ["hyperbf_sigmas.png"],
    }
    weights = getattr(diagnostics, "center_weights", None)
    if isinstance(weights, torch.Tensor):  # (B, L, N, K): how much each center is used, per layer
        result["mean_center_weights"] = _rounded(weights.float().mean((0, 2)))
    return result


# Each family's dynamics section on the inputs (`_family_section`): `inspect_<family>(model, inputs, deepest,
# output_dir)` for a family with a depth argument (`FAMILY_DEPTH_ARGUMENTS`), HyperBF's without `deepest`; None for
# the looped Transformer's classifiers, which draw the accuracy against the iterations alone.
FAMILY_SECTIONS: dict[str, Callable[..., dict[str, Any]] | None] = {
    "hyperset": inspect_hyperset,
    "imixer": inspect_imixer,
    "hyperbf": inspect_hyperbf,
    "looped-transformer": None,
}
# What each depth argument counts: the x axis of the accuracy figure.
DEPTH_AXES = {"num_iterations": "iterations per layer T", "fixed_point_iterations": "fixed-point steps n"}


def plot_accuracy(
    depths: list[int],
    accuracies: list[float],
    trained: dict[str, Any],
    what: str,
    title: str,
    path: Path,
    chance: float,
    metric: str = "accuracy",
) -> None:
    """Accuracy (`metric`, as the JSON names it) against depth, the depths run in training shaded
    (`trained_depths`) and chance drawn, into `path`."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(depths, accuracies, "o-", label=metric.replace("_", " "))
    ax.axhline(chance, color="gray", ls=":", lw=1, label=f"chance ({chance:.2f})")
    _shade_trained(ax, trained, max(depths))
    ax.set_xlabel(what)
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- training curve

TRAINING_CURVE = "training_curve_by_iterations.png"
SMOOTHING_LOGS = 5  # the moving average drawn over the logged training losses, in logs
# the per-iteration accuracy the training loops log at every evaluation (`evaluation.depth_metrics`)
DEPTH_KEY = re.compile(r"^eval_(?P<metric>.+)_iterations_(?P<t>[0-9]+)$")


LOG_HISTORY_REMEDY = (
    "it is the run's record (`energyformers train` writes metrics.json, Trainer trainer_state.json): restore it, "
    "or delete it to inspect the folder without its training curve"
)


def run_log_history(model_dir: str | Path) -> tuple[list[dict[str, Any]], str] | None:
    """The log history of a run folder and the file it came from: `metrics.json` (written by both training
    loops), else `trainer_state.json` (Trainer's); None if the folder has neither."""
    for name in ("metrics.json", "trainer_state.json"):
        path = Path(model_dir) / name
        if not path.is_file():
            continue
        try:
            record = read_json_object(path, remedy=LOG_HISTORY_REMEDY)
        except ValueError as err:
            raise InspectError(str(err)) from None
        history = record.get("log_history")
        if isinstance(history, list):
            return [entry for entry in history if isinstance(entry, dict)], name
    return None


def eval_depth_curves(
    log_history: list[dict[str, Any]],
) -> tuple[str | None, dict[int, list[tuple[int, float]]]]:
    """The logged metric's name and, per iteration count t, its (step, value) evaluations sorted by step (a step
    evaluated twice, as Trainer's final evaluation repeats the last one, keeps its last value)."""
    metric, curves = None, {}
    for entry in log_history:
        if "step" not in entry:
            continue
        for key, value in entry.items():
            match = DEPTH_KEY.match(key)
            if match is None or not isinstance(value, (int, float)):
                continue
            if metric is None:
                metric = match["metric"]
            if match["metric"] == metric:
                curves.setdefault(int(match["t"]), {})[int(entry["step"])] = float(value)
    return metric, {t: sorted(points.items()) for t, points in sorted(curves.items())}


def moving_average(values: list[float], window: int) -> list[float]:
    """The trailing mean over up to `window` values (fewer at the start), so it never looks ahead of a step."""
    return [
        sum(values[max(0, i + 1 - window) : i + 1]) / (i + 1 - max(0, i + 1 - window))
        for i in range(len(values))
    ]


def classes_of(config: Any, task: str | None) -> int | None:
    """C of a single-label classifier trained with cross-entropy (its loss has the chance level ln C), else None."""
    from .arguments import MIM_TASK

    num_labels = getattr(config, "num_labels", 0)
    single_label = getattr(config, "problem_type", None) in (None, "single_label_classification")
    architecture = (getattr(config, "architectures", None) or [""])[0]
    classifier = "Classification" in architecture if task is None else task != MIM_TASK
    return num_labels if classifier and single_label and num_labels >= 2 else None


def training_curve(
    log_history: list[dict[str, Any]], source: str, config: Any, task: str | None, path: Path
) -> dict[str, Any]:
    """Draw the training loss and the per-iteration eval accuracy against the step (`path`); returns the numbers,
    the chance loss and the plateau exit step (`evaluation.plateau_exit_step`)."""
    from .evaluation import (
        PLATEAU_CONSECUTIVE,
        PLATEAU_MARGIN,
        chance_loss,
        plateau_exit_definition,
        plateau_exit_step,
        training_losses,
    )

    losses = training_losses(log_history)
    metric, curves = eval_depth_curves(log_history)
    steps, values = [s for s, _ in losses], [v for _, v in losses]
    gaps = sorted(b - a for a, b in itertools.pairwise(steps))
    # the logging interval (the median gap between logs)
    logging_window = gaps[len(gaps) // 2] if gaps else None
    smoothed = moving_average(values, SMOOTHING_LOGS)
    classes = classes_of(config, task)
    chance = chance_loss(classes) if classes else None
    exit_step = plateau_exit_step(log_history, classes) if classes else None
    trained = getattr(config, "num_iterations", None)
    depths = trained_depths(config, "num_iterations") if trained else None

    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.3))
    if losses:
        window = f"mean over {logging_window} steps" if logging_window else "one log"
        left.plot(steps, values, ".", ms=3, color="tab:blue", alpha=0.45, label=f"logged ({window})")
        left.plot(
            steps, smoothed, "-", color="tab:blue", lw=1.6, label=f"trailing mean of {SMOOTHING_LOGS} logs"
        )
    else:
        left.text(0.5, 0.5, "no training loss logged", transform=left.transAxes, ha="center", color="gray")
    if chance is not None:
        left.axhline(chance, color="gray", ls=":", lw=1, label=f"chance ln {classes} = {chance:.3f}")
        left.axhline(chance - PLATEAU_MARGIN, color="gray", ls="--", lw=0.7, alpha=0.6,
                     label=f"exit threshold (chance − {PLATEAU_MARGIN:g})")  # fmt: skip
    left.set_title("training loss")
    if chance is not None and values and max(values) > 1.5 * chance:
        # the first logs of a wide init sit far above chance; clipped, the plateau and its end stay readable. The
        # note goes in the title, where the legend (placed "best" inside the axes) cannot cover it
        left.set_ylim(min(min(values), chance - PLATEAU_MARGIN) - 0.05 * chance, 1.5 * chance)
        left.set_title("training loss (y clipped at 1.5 × chance)")
    left.set_xlabel("optimizer step")
    left.set_ylabel("training loss (nats)")
    pretty = (metric or "accuracy").replace("_", " ")
    for t, points in curves.items():
        label = f"t = {t}"
        if trained:
            label += " (T" if t == trained else f" ({t / trained:g}T"
            # with sampled depth, T is one of the trained depths, not the only one: only past them is new
            label += ", beyond training)" if depth_regime(t, depths) == BEYOND else ")"
        right.plot([s for s, _ in points], [v for _, v in points], "o-", ms=3, lw=1.2, label=label,
                   color="black" if t == trained else None)  # fmt: skip
    if classes:
        right.axhline(1 / classes, color="gray", ls=":", lw=1, label=f"chance 1/{classes}")
    right.set_ylim(-0.02, 1.02)
    right.set_xlabel("optimizer step")
    right.set_ylabel(f"eval {pretty}")
    right.set_title(f"eval {pretty} at each iteration count t")
    for ax in (left, right):
        if exit_step is not None:
            ax.axvline(exit_step, color="tab:red", ls="--", lw=1, label=f"plateau exit (step {exit_step})")
        ax.legend(loc="best", fontsize=8)
    note = f"plateau exit: step {exit_step}" if exit_step is not None else "plateau exit: none"
    if chance is None:
        note = "no chance level (not a single-label classifier)"
    fig.suptitle(f"Training curve ({source}); {note}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

    notes = []
    if getattr(config, "halting_head", False):
        notes.append(
            "the training loss includes the halting head's BCE term (halting_loss_weight × BCE): the chance line "
            "is that of its cross-entropy part"
        )
    return {
        "source": source,
        "loss": {"steps": steps, "values": _rounded_list(values)},
        "logging_window_steps": logging_window,
        "smoothed_loss": {
            "window_logs": SMOOTHING_LOGS,
            "kind": "trailing mean",
            "values": _rounded_list(smoothed),
        },
        "num_classes": classes,
        "chance_loss": chance,
        "metric": metric,
        "trained_iterations": trained,
        "eval_by_iterations": {
            str(t): {"steps": [s for s, _ in points], "values": _rounded_list([v for _, v in points])}
            for t, points in curves.items()
        },
        "plateau_exit": {
            "step": exit_step,
            "at_first_log": exit_step is not None and bool(steps) and exit_step == steps[0],
            "margin_nats": PLATEAU_MARGIN,
            "consecutive_logs": PLATEAU_CONSECUTIVE,
            "definition": plateau_exit_definition(),
        },
        "notes": notes,
    }


def _rounded_list(values: list[float], digits: int = 6) -> list[float | None]:
    return [round(v, digits) if math.isfinite(v) else None for v in values]


def add_training_curve(report: dict[str, Any], model_dir: str, config: Any, output_dir: Path) -> None:
    """Add the training curve (figure and `training_curve` numbers) to `report` if the folder's log history holds
    per-iteration eval accuracy."""
    found = run_log_history(model_dir)
    if found is None or not eval_depth_curves(found[0])[1]:
        return
    history, source = found
    task = None
    if source == "metrics.json":
        record = read_json_object(Path(model_dir) / source)
        task = record.get("task") if isinstance(record.get("task"), str) else None
    report["training_curve"] = training_curve(history, source, config, task, output_dir / TRAINING_CURVE)
    report["figures"].append(TRAINING_CURVE)


# ----------------------------------------------------------------------------- masked image modelling

MASKED_GREY = 0.5  # the pixel value drawn where a code is still [MASK]


def decode_sequence(
    model: Any, tokenizer: Any, image: Any, mask_ratio: float, steps: int, schedule: str, seed: int
) -> dict[str, Any]:
    """The frames of a MaskGIT decode sequence: the input as tokenized, then the grid before the first step and
    after each of `steps` steps decoded to pixels, with the still-masked codes' pixels set to `MASKED_GREY`.

    Returns `frames` `(steps + 2, C, H, W)`, `titles`, `masked` (codes still masked in each frame after the
    first) and the pipeline's result (`result`)."""
    import torch

    from energyformers.pipelines import MaskedImageModelingPipeline

    pipe = MaskedImageModelingPipeline(model=model, vq_tokenizer=tokenizer)
    result = pipe(image, mask_ratio=mask_ratio, steps=steps, schedule=schedule, seed=seed)
    sequences = result["decoding"].sequences[:, 0].cpu()  # (S + 1, N)
    mask_id = model.mask_token_id
    truth = result["true_codes"]
    frames = [result["input_pixel_values"]]
    channels, height, width = frames[0].shape
    rows = math.isqrt(len(truth))
    cell_h, cell_w = height // rows, width // (len(truth) // rows)
    for grid in sequences:
        hidden = grid == mask_id
        # masked positions are decoded as their true code and then greyed out: only their place is shown
        pixels = tokenizer.decode(torch.where(hidden, truth, grid)[None]).cpu().float()[0]
        # (N,) → (rows, columns) token grid → (rows·cell_h, columns·cell_w) pixels
        cover = hidden.view(rows, -1).repeat_interleave(cell_h, 0).repeat_interleave(cell_w, 1)
        frames.append(pixels.masked_fill(cover[None].expand(channels, -1, -1), MASKED_GREY))
    titles = ["input", f"masked {mask_ratio:.0%}"] + [f"step {step}" for step in range(1, len(sequences))]
    masked = [int((grid == mask_id).sum()) for grid in sequences]
    return {"frames": torch.stack(frames), "titles": titles, "masked": masked, "result": result}


def plot_decode_sequence(sequence: dict[str, Any], path: Path, title: str) -> int:
    """One panel per frame in a grid of at most 6 columns; returns the number of panels drawn."""
    plt = _pyplot()
    frames, titles = sequence["frames"], sequence["titles"]
    columns = min(6, len(frames))
    rows = math.ceil(len(frames) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(1.9 * columns, 2.1 * rows + 0.4), squeeze=False)
    drawn = 0
    for index, ax in enumerate(axes.flat):
        ax.axis("off")
        if index >= len(frames):
            continue
        image = frames[index].clamp(0, 1).permute(1, 2, 0).numpy()  # (C, H, W) → (H, W, C) for imshow
        ax.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray", vmin=0, vmax=1)
        ax.set_title(titles[index], fontsize=9)
        drawn += 1
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


def inspect_mim(
    model: Any,
    tokenizer: Any,
    model_dir: str,
    images: list[str],
    args: argparse.Namespace,
    output_dir: Path | None = None,
) -> dict[str, Any]:
    """The decode sequence of the first image (`mim_decode_sequence.png`, in `output_dir`, else `args.output_dir`)
    and its numbers; `tokenizer`: the model's image tokenizer (`load_processor_or_refuse`)."""
    if not Path(images[0]).is_file():
        raise InspectError(f"{model_dir} inspects images; no such file: {images[0]}")
    try:
        sequence = decode_sequence(
            model, tokenizer, images[0], args.mask_ratio, args.steps, args.schedule, args.seed
        )
    except ValueError as err:  # a bad --mask_ratio / --schedule, named by the pipeline or the model
        raise InspectError(str(err)) from None
    result = sequence["result"]
    panels = plot_decode_sequence(
        sequence,
        Path(args.output_dir if output_dir is None else output_dir) / "mim_decode_sequence.png",
        f"MaskGIT decoding, {args.steps} steps ({args.schedule}), seed {args.seed}: PSNR {result['psnr']:.2f} dB "
        f"(tokenizer bound {result['tokenizer_psnr']:.2f})",
    )
    return {
        "figures": ["mim_decode_sequence.png"],
        "image": str(images[0]),
        "panels": panels,
        "titles": sequence["titles"],
        "masked_per_step": sequence["masked"],
        "steps": args.steps,
        "schedule": args.schedule,
        "mask_ratio": args.mask_ratio,
        "seed": args.seed,
        "psnr": result["psnr"],
        "ssim": result["ssim"],
        "tokenizer_psnr": result["tokenizer_psnr"],
        "masked_accuracy": result["masked_accuracy"],
    }


# ----------------------------------------------------------------------------- command


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Write the figures and `inspect.json` into `args.output_dir`; returns the JSON's content.

    Drawn into a staging folder beside it (`interrupt.staging_folder`) and moved into place at the end
    (`move_report`): a folder that holds a report (the model folder, as `release` inspects it) keeps the old one
    whole until the new one is complete, whenever the command is stopped. The folder's lock (`locked_output_dir`,
    as `train`, `export` and `convert` hold theirs) is held throughout: two commands writing one folder would mix
    their figures under one inspect.json, and a run training into it would replace it."""
    output_dir = Path(args.output_dir)
    with locked_output_dir(args.output_dir, flag="--output_dir"):
        # a folder a killed train, export or conversion had moved aside comes back (else its copy, hidden beside the
        # report written here, would be taken for one the folder replaced and removed by the next of them), and the
        # folder is checked as the repair left it
        restore_interrupted_publish(output_dir.expanduser())
        check_report_folder(args)
        with staging_folder(output_dir) as staging:
            report = draw_report(args, staging)
            move_report(report, staging, output_dir)
    return report


def move_report(report: dict[str, Any], staging: Path, output_dir: Path) -> None:
    """Move the report drawn in `staging` into `output_dir`: the old `inspect.json` goes first and the new one comes
    last, so the figures in between are never read as the other report's (`export` takes the figures inspect.json
    lists). A SIGTERM or Ctrl-C in between takes effect once all are moved (`deferring_stops`)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    with deferring_stops():
        (output_dir / INSPECT_JSON).unlink(missing_ok=True)
        for name in report["figures"]:
            os.replace(staging / name, output_dir / name)
        os.replace(staging / INSPECT_JSON, output_dir / INSPECT_JSON)


def draw_report(args: argparse.Namespace, output_dir: Path) -> dict[str, Any]:
    """Write the figures and `inspect.json` into `output_dir`; returns the JSON's content."""
    report: dict[str, Any] = {"figures": []}
    if args.model_dir is not None and not args.inputs and not args.dataset:
        _curve_only_report(args, report, output_dir)
    elif args.model_dir is not None:
        loaded = _load_for_inspection(args)
        # Hyper-SET's or the looped Transformer's masked-image-modelling head
        if type(loaded.model).__name__.endswith("ForMaskedImageModeling"):
            _mim_report(args, loaded, report, output_dir)
            _write_report(report, output_dir)
            return report
        _model_report(args, loaded, report, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if args.landscape:
        result = energy_landscape()
        plot_landscape(result, output_dir / "energy_landscape.png")
        report["landscape"] = landscape_json(result)
        report["figures"].append("energy_landscape.png")
    _write_report(report, output_dir)
    return report


def _curve_only_report(args: argparse.Namespace, report: dict[str, Any], output_dir: Path) -> None:
    """A run folder inspected without INPUTS or --dataset: its training curve alone, from the log history and the
    config (no model runs); `GIVE_INPUTS` when its log holds no per-iteration eval accuracy."""
    found = run_log_history(args.model_dir) if Path(args.model_dir).is_dir() else None
    if found is None or not eval_depth_curves(found[0])[1]:
        raise InspectError(GIVE_INPUTS)
    config = load_config(args.model_dir, InspectError)
    output_dir.mkdir(parents=True, exist_ok=True)
    report.update(
        model_dir=str(args.model_dir),
        model_type=config.model_type,
        architecture=(config.architectures or [None])[0],
    )
    add_training_curve(report, args.model_dir, config, output_dir)


class _Loaded(NamedTuple):
    """What `_load_for_inspection` loads: the model, its family's model_type, the halting_tolerance its config saved
    (`load_model`), its processor, and the --dataset batches (empty without one) of `split`."""

    model: Any
    family: str
    saved_halting: float | None
    processor: Any
    batches: list[tuple[dict[str, torch.Tensor], torch.Tensor]]
    split: str | None


def _load_for_inspection(args: argparse.Namespace) -> _Loaded:
    """The config checked against the flags and inputs (again for a Hub model: a local folder's were checked in
    `parse`), then the processor, the --dataset batches (checked against the model's labels) and last the model:
    a broken file or a dataset of other labels is refused before any weights load or the output folder is made."""
    config = load_config(args.model_dir, InspectError)
    architectures = getattr(config, "architectures", None)
    mim = masked_image_modeling_head(architectures) is not None
    if not mim:
        architecture = (architectures or ["?"])[0]
        refuse_mim_flags(args.mim_flags, args.model_dir, architecture, "inspect draws its dynamics")
        if args.inputs:
            check_inputs(args.model_dir, input_kind(config.to_dict(), None), args.inputs)
        check_classifier_kind(args, config.to_dict())
    elif args.dataset or not args.inputs:
        raise InspectError(mim_needs_an_image(args.model_dir))
    # the processor: an image processor, a tokenizer or a masked-image-modelling head's image tokenizer; a Sudoku
    # dataset's cells are already the ids, so without puzzles given no tokenizer is read (as in evaluate)
    cells = not args.inputs and any(name.endswith("ForTokenClassification") for name in architectures or ())
    processor = None if cells else load_processor_or_refuse(args.model_dir, config.to_dict(), mim=mim)
    batches: list[tuple[dict[str, torch.Tensor], torch.Tensor]] = []
    split = None
    if args.dataset:
        split, batches = dataset_batches(
            args.model_dir, config, args.dataset, args.split, args.max_samples, args.batch_size, processor
        )
    model, family, saved_halting = load_model(args.model_dir)
    return _Loaded(model, family, saved_halting, processor, batches, split)


def _mim_report(args: argparse.Namespace, loaded: _Loaded, report: dict[str, Any], output_dir: Path) -> None:
    """A masked-image-modelling model's decode sequence of the first INPUT image (`inspect_mim`) and its training
    curve."""
    if args.dataset or not args.inputs:
        raise InspectError(mim_needs_an_image(args.model_dir))
    output_dir.mkdir(parents=True, exist_ok=True)
    section = inspect_mim(loaded.model, loaded.processor, args.model_dir, args.inputs, args, output_dir)
    report["figures"] += section.pop("figures")
    report.update(
        model_dir=str(args.model_dir), model_type=loaded.family, architecture=type(loaded.model).__name__
    )
    report["mim"] = section
    add_training_curve(report, args.model_dir, loaded.model.config, output_dir)


def _model_report(
    args: argparse.Namespace, loaded: _Loaded, report: dict[str, Any], output_dir: Path
) -> None:
    """A classifier's or backbone's report: what it ran on, its family's dynamics (`_family_section`), the accuracy
    with --dataset (`_accuracy_section`) and the training curve."""
    model, family = loaded.model, loaded.family
    if args.inputs:
        inputs = encode(args.model_dir, model.config.input_type, args.inputs, loaded.processor)
    else:
        inputs = loaded.batches[0][0]
    output_dir.mkdir(parents=True, exist_ok=True)
    report.update(
        model_dir=str(args.model_dir),
        model_type=family,
        architecture=type(model).__name__,
        inputs=f"{len(args.inputs)} given inputs"
        if args.inputs
        else f"{args.dataset} ({loaded.split}, first batch)",
        num_inputs=len(next(iter(inputs.values()))),
    )
    if loaded.saved_halting is not None:
        report["halting_tolerance"] = {
            "saved": loaded.saved_halting,
            "used": None,
            "note": FIXED_DEPTH.format(value=loaded.saved_halting),
        }
    trained, deepest = _family_section(args, model, family, inputs, report, output_dir)
    if loaded.batches:
        _accuracy_section(args, loaded, trained, deepest, report, output_dir)
    add_training_curve(report, args.model_dir, model.config, output_dir)


def _family_section(
    args: argparse.Namespace,
    model: Any,
    family: str,
    inputs: dict[str, torch.Tensor],
    report: dict[str, Any],
    output_dir: Path,
) -> tuple[dict[str, Any] | None, int | None]:
    """The family's dynamics (`FAMILY_SECTIONS`) on `inputs` into `report`, up to `--max_iterations` (default:
    `default_deepest`) where the family has a depth argument (`FAMILY_DEPTH_ARGUMENTS`, its `trained_depths`
    recorded). Returns (the trained depths, the deepest depth run), (None, None) for a family of fixed depth."""
    argument = FAMILY_DEPTH_ARGUMENTS[family]
    draw = FAMILY_SECTIONS[family]
    trained = deepest = None
    if argument is None:
        section = draw(model, inputs, output_dir)
    else:
        trained = trained_depths(model.config, argument)
        deepest = args.max_iterations or default_deepest(trained)
        section = {} if draw is None else draw(model, inputs, deepest, output_dir)
        report["trained_depths"] = trained
    if section:
        report["figures"] += section.pop("figures")
        report[family] = section
    return trained, deepest


def _accuracy_section(
    args: argparse.Namespace,
    loaded: _Loaded,
    trained: dict[str, Any] | None,
    deepest: int | None,
    report: dict[str, Any],
    output_dir: Path,
) -> None:
    """The model's accuracy on the --dataset batches into `report`: at each depth 1 ... `deepest` of its family's
    depth argument (`accuracy_vs_iterations`, and its figure), else once (`accuracy`: a family of fixed depth)."""
    from .evaluation import primary_metric
    from .predict import task_for

    model, family, batches = loaded.model, loaded.family, loaded.batches
    argument = FAMILY_DEPTH_ARGUMENTS[family]
    samples = sum(len(labels) for _, labels in batches)
    # a Sudoku model's labels are its blank cells' (givens are -100): its accuracy is evaluate's
    # blank_cell_accuracy, and named so
    metric = primary_metric(task_for(model.config))
    entry: dict[str, Any] = {
        "dataset": args.dataset,
        "split": loaded.split,
        "num_samples": samples,
        "metric": metric,
    }
    if argument is None:
        entry[metric] = accuracy(model, batches)
        report["accuracy"] = entry
        return
    depths = list(range(1, deepest + 1))
    accuracies = [accuracy(model, batches, **{argument: depth}) for depth in depths]
    entry.update(iterations=depths, trained=trained["default"], argument=argument)
    entry[metric] = accuracies
    what = DEPTH_AXES[argument]
    plot_accuracy(
        depths,
        accuracies,
        trained,
        what,
        f"{FAMILY_TITLES[family]}: {metric.replace('_', ' ')} vs {what.rsplit(' ', 1)[0]}\n"
        f"({shown_dataset(args.dataset)}, {loaded.split} split, {samples} samples)",
        output_dir / "accuracy_vs_iterations.png",
        chance=1 / max(model.config.num_labels, 1),
        metric=metric,
    )
    report["figures"].append("accuracy_vs_iterations.png")
    report["accuracy_vs_iterations"] = entry


def shown_dataset(dataset: str) -> str:
    """How a figure names `--dataset`: a local path by its name (`export.local_name`), as an exported copy of the
    report names it, since the figure is exported as drawn; a built-in or Hub name as given."""
    from .export import is_local_path, local_name

    return local_name(dataset) if is_local_path(dataset) else dataset


def _write_report(report: dict[str, Any], output_dir: Path) -> None:
    """`inspect.json`: everything plotted, as numbers."""
    (output_dir / INSPECT_JSON).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse and check what needs no model: the numbers, the model folder (its config, weights and image tokenizer),
    the inputs and the flags for its kind, and the output folder."""
    args = build_parser().parse_args(argv)
    check_numbers(args)
    if args.model_dir is None and not args.landscape:
        raise InspectError("give a MODEL_DIR, or --landscape for the Hopfield energy landscapes alone")
    # a file there is refused first, before the model folder is read
    check_output_folder(args.output_dir, "--output_dir", None)
    # the decode-sequence flags given (refused for a classifier, here for a local folder, after loading for a Hub
    # model); then their defaults
    args.mim_flags = [f"--{name}" for name in MIM_DEFAULTS if getattr(args, name) is not None]
    folder = check_model_source(args.model_dir, "model folder") if args.model_dir is not None else None
    if folder is not None:
        check_local_model(args, folder)
    # what a train, export or conversion killed inside `publish` left beside the folder is repaired first (`run`,
    # under the folder's lock)
    check_report_folder(args, repair_first=True)
    for name, value in MIM_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def check_report_folder(args: argparse.Namespace, *, repair_first: bool = False) -> None:
    """--output_dir new or empty, as `train` and `export` want theirs, unless --overwrite_output_dir
    (`repair_first`: as `check_output_folder`'s); the model folder itself may be written into (its figures and
    inspect.json go with it into `export`'s model card)."""
    model_folder = Path(args.model_dir).expanduser() if args.model_dir is not None else None
    check_output_folder(
        args.output_dir,
        "--output_dir",
        "--overwrite_output_dir",
        overwrite=args.overwrite_output_dir,
        allowed=model_folder if model_folder is not None and model_folder.is_dir() else None,
        repair_first=repair_first,
    )


def check_numbers(args: argparse.Namespace) -> None:
    """The numeric flags are in range: a `UsageError` naming the first one out of it, worded as predict's."""
    counts = ("max_samples", "batch_size", "max_iterations", "num_threads")
    given = {name: getattr(args, name) for name in counts if getattr(args, name) is not None}
    check_ranges(given, {name: (lambda v: v >= 1, "an integer >= 1") for name in counts})
    mim = {name: getattr(args, name) for name in MIM_DEFAULTS if getattr(args, name) is not None}
    check_ranges(mim, MIM_RANGES)


def check_local_model(args: argparse.Namespace, folder: Path) -> None:
    """A local model folder, before torch loads (predict's checks, `check_local_model_folder`): its config names a
    model inspect draws, its weights are readable, the flags fit its kind (the decode-sequence flags only for a
    masked-image-modelling model, which needs its image tokenizer and an image), and every input is what it takes;
    without inputs or --dataset, a run log holding per-iteration eval accuracy to draw."""

    def check_flags(architecture: str | None, first: str) -> None:
        if architecture is None:
            refuse_mim_flags(args.mim_flags, args.model_dir, first, "inspect draws its dynamics")
        elif args.dataset or not args.inputs:
            raise InspectError(mim_needs_an_image(args.model_dir))

    config, architecture = check_local_model_folder(
        folder, args.model_dir, MODEL_TYPES, check_flags=check_flags, inputs=args.inputs
    )
    if architecture is None:
        check_classifier_kind(args, config)
    if architecture is None and not args.inputs and not args.dataset:
        found = run_log_history(folder)
        if found is None or not eval_depth_curves(found[0])[1]:
            raise InspectError(GIVE_INPUTS)


def check_classifier_kind(args: argparse.Namespace, config: dict[str, Any]) -> None:
    """What a model that is no masked-image-modelling head (its config as JSON) draws against the flags: an accuracy
    curve (`--dataset`) needs a classification head; a looped-Transformer classifier draws only that curve."""
    architecture = str((config.get("architectures") or ["?"])[0])
    if args.dataset and "For" not in architecture:
        raise InspectError(
            f"{args.model_dir} is a bare backbone ({architecture}): accuracy needs a classification head; pass "
            "INPUTS instead of --dataset"
        )
    if config.get("model_type") == "looped-transformer" and args.inputs and not args.dataset:
        raise InspectError(LOOPED_NEEDS_A_DATASET.format(model_dir=args.model_dir, architecture=architecture))


def execute(args: argparse.Namespace) -> int:
    """Draw the figures (`run`) and print the paths written."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # `run_command` restores the caller's logging afterwards
    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar among the paths printed
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # nor the dataset builders' (as evaluate)
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    report = run(args)
    for name in report["figures"]:
        print(Path(args.output_dir) / name)
    print(Path(args.output_dir) / INSPECT_JSON)
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point of `energyformers inspect`; returns the exit status."""
    return run_command("inspect", parse, execute, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
