"""Metrics of both training loops: accuracy and macro-F1 (classification), blank-cell and board accuracy (Sudoku),
masked-token accuracy and reconstruction PSNR/SSIM after MaskGIT decoding (masked image modelling).

The `evaluate` metric scripts are loaded from this package's `metrics/` folder by path, so evaluation works
offline and never reaches the Hub.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .arguments import MIM_TASK
from .interrupt import StopRequest

METRICS_DIR = Path(__file__).parent / "metrics"


@functools.cache
def metric(name: str) -> Any:
    """The `evaluate` metric `name` (accuracy, f1) from the bundled script."""
    import evaluate  # loaded by local path: works offline, never reaches the Hub

    return evaluate.load(str(METRICS_DIR / name / f"{name}.py"))


def load_metrics() -> None:
    """Load every metric script now (evaluate copies them into its module cache: do it once per machine)."""
    metric("accuracy"), metric("f1")


def task_metrics(task: str, predictions: Any, references: Any) -> dict[str, float]:
    """The metrics of `task` from predicted and true class ids (numpy), shared by both training loops.

    Classification: `accuracy` and `f1_macro`. Masked image modelling: `masked_token_accuracy`, the fraction of
    masked codes whose argmax prediction (one forward pass) is the true code. Token classification (Sudoku: labels −100 on given cells):
    `blank_cell_accuracy`, the fraction of labelled (blank) cells predicted right, and `board_accuracy`, the
    fraction of sequences (boards) with every labelled cell right.
    """
    predictions, references = np.asarray(predictions), np.asarray(references)
    if task == MIM_TASK:  # labels: the true code at the masked positions, −100 elsewhere
        masked = references != -100
        hits = (predictions == references) & masked
        return {"masked_token_accuracy": float(hits.sum() / max(int(masked.sum()), 1))}
    if task == "token-classification":
        labelled = references != -100
        hits = (predictions == references) & labelled
        return {
            "blank_cell_accuracy": float(hits.sum() / max(int(labelled.sum()), 1)),
            "board_accuracy": float((hits.sum(1) == labelled.sum(1)).mean()),
        }
    if predictions.ndim > 1:
        predictions = predictions.argmax(-1)
    f1 = metric("f1").compute(predictions=predictions, references=references, average="macro")
    return {
        "accuracy": metric("accuracy").compute(predictions=predictions, references=references)["accuracy"],
        "f1_macro": f1["f1"],
    }


@dataclass(frozen=True)
class TrainerMetrics:
    """`Trainer`'s `compute_metrics` for `task`: `task_metrics` on the predicted class ids that `argmax_logits`
    kept. The one definition `energyformers train` and `energyformers evaluate` both hand to Trainer, so a split
    scored by either reads the same."""

    task: str

    def __call__(self, eval_pred: Any) -> dict[str, float]:
        return task_metrics(self.task, first_output(eval_pred.predictions), eval_pred.label_ids)


def first_output(outputs: Any) -> Any:
    """The logits of what Trainer collected: the outputs themselves, as the package's configs name every other
    output field in `keys_to_ignore_at_inference`, or the first of a tuple, which a model whose config lacks that
    list gives (a folder exported with older remote code, loaded with `trust_remote_code=True`)."""
    return outputs[0] if isinstance(outputs, tuple) else outputs


def argmax_logits(logits: Any, labels: Any) -> Any:
    """Trainer's `preprocess_logits_for_metrics`: keep only the predicted ids of each batch instead of all logits
    (memory on 10k-example test sets)."""
    return first_output(logits).argmax(-1)


def has_recurrent_depth(model: Any) -> bool:
    """Whether `model` (a model or its backbone, or a backbone class) has recurrent depth: a backbone with the
    depth schedule of `RecurrentDepthMixin` (Hyper-SET, the looped Transformer), whose calls take
    `num_iterations`. Judged by the mixin's public `iteration_draws`, not by `isinstance`: a model loaded with
    `trust_remote_code=True` runs its folder's own copy of the modeling code (`energyformers export`), whose
    mixin is another class than the package's."""
    backbone = model if isinstance(model, type) else getattr(model, "base_model", model)
    return hasattr(backbone, "iteration_draws")


def eval_depths(model: Any, requested: list[int] | None) -> list[int]:
    """The iteration counts the training loops evaluate the head at besides its own (`depth_metrics`): the
    requested ones, else T/2, T and 2T of the model's `num_iterations`; none for a model without recurrent depth
    (`has_recurrent_depth`: no per-call `num_iterations`)."""
    if not has_recurrent_depth(model):
        return []
    if requested:
        return sorted(set(requested))
    return default_eval_depths(model.config.num_iterations)


def default_eval_depths(trained: int) -> list[int]:
    """`eval_depths` of a model trained at `trained` iterations when none are requested: T/2, T and 2T.
    (`arguments.validate_best_model` also reads it, to check a per-depth `--metric_for_best_model` while
    parsing when T is known there.)"""
    return sorted({max(1, trained // 2), trained, 2 * trained})


def depth_metrics(
    model: Any,
    loader: Any,
    gather: Any,
    task: str,
    depths: list[int],
    prefix: str = "",
    call_arguments: Mapping[str, Any] | None = None,
    stop: StopRequest | None = None,
) -> dict[str, float]:
    """`<prefix><primary metric>_iterations_<t>` for each t of `depths`: the split of `loader` classified with
    `num_iterations=t` (eval mode, no gradient), predictions gathered across processes by `gather`
    (`accelerator.gather_for_metrics`). Logged at every evaluation, they show a plateau in depth and its end.
    `call_arguments` (`energyformers evaluate`'s depth flags, as `trainer.DepthTrainer` adds them) are added to
    every forward; each row's `num_iterations=t` overrides theirs. With `stop` (a training run's), the pass
    ends at its next batch once a stop is agreed (`StopRequest.evaluation_check`: `EvaluationStopped`)."""
    import torch

    name = primary_metric(task)
    was_training = model.training
    model.eval()
    predictions: dict[int, list[Any]] = {t: [] for t in depths}
    references = []
    check = stop.evaluation_check(next(model.parameters()).device) if stop is not None else None
    try:
        with torch.no_grad():
            for batch in loader:
                inputs = {k: v for k, v in batch.items() if k != "labels"}
                references.append(gather(batch["labels"]).cpu().numpy())
                for t in depths:
                    logits = model(**{**inputs, **(call_arguments or {}), "num_iterations": t}).logits
                    predictions[t].append(gather(logits.argmax(-1)).cpu().numpy())
                if check is not None:
                    check.batch_done()
    finally:
        model.train(was_training)
    truth = _stack(references, fill=-100)
    return {
        f"{prefix}{name}_iterations_{t}": task_metrics(task, _stack(predictions[t], fill=0), truth)[name]
        for t in depths
    }


# The plateau exit of a classification run: the loss must sit clearly below the chance loss ln(C), by more than
# the few hundredths of a nat a logged window mean moves on the plateau, and stay there for two successive logs,
# so one lucky window does not count as the exit.
PLATEAU_MARGIN = 0.05
PLATEAU_CONSECUTIVE = 2


def chance_loss(num_classes: int) -> float:
    """ln(C): the cross-entropy of the uniform prediction over `num_classes` C classes, where a classifier that has
    learned nothing but the (balanced) class frequencies sits (Sudoku: ln 9 ≈ 2.197 nats)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2; got {num_classes!r}.")
    return math.log(num_classes)


def training_losses(log_history: Iterable[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(step, loss) of every logged training loss of a log history (Trainer's `log_history`, the accelerate loop's
    history, `metrics.json["log_history"]`: entries with `step` and `loss`), sorted by step; a step logged twice
    (a resumed run) keeps its last entry; non-finite losses are dropped."""
    losses: dict[int, float] = {}
    for entry in log_history:
        if "loss" in entry and "step" in entry and math.isfinite(float(entry["loss"])):
            losses[int(entry["step"])] = float(entry["loss"])
    return sorted(losses.items())


def plateau_exit_step(
    log_history: Iterable[Mapping[str, Any]],
    num_classes: int,
    margin: float = PLATEAU_MARGIN,
    consecutive: int = PLATEAU_CONSECUTIVE,
) -> int | None:
    """The step at which a classification run leaves the chance plateau, or None if it never does.

    Definition: the first logged optimizer step whose logged training loss (each log is the mean over its logging
    window) is below ln(`num_classes`) − `margin` nats and the `consecutive` − 1 logs after it are too. The loss
    must be a cross-entropy over `num_classes` classes (with deep supervision: the mean of such losses). A run
    already below at its first log gets its first logged step (it left the plateau at or before it); with fewer
    than `consecutive` logs left below the threshold at the end of the run, the trailing ones count (a run may end
    just after leaving the plateau).
    """
    if (
        isinstance(margin, bool)
        or not isinstance(margin, (int, float))
        or not math.isfinite(margin)
        or margin < 0
    ):
        raise ValueError(f"margin must be a finite number >= 0 (nats); got {margin!r}.")
    if isinstance(consecutive, bool) or not isinstance(consecutive, int) or consecutive < 1:
        raise ValueError(f"consecutive must be an integer >= 1; got {consecutive!r}.")
    threshold = chance_loss(num_classes) - margin
    losses = training_losses(log_history)
    for index, (step, _) in enumerate(losses):
        window = losses[index : index + consecutive]
        if all(loss < threshold for _, loss in window):
            return step
    return None


def plateau_exit_definition(margin: float = PLATEAU_MARGIN, consecutive: int = PLATEAU_CONSECUTIVE) -> str:
    """`plateau_exit_step`'s definition in one sentence, for result files."""
    return (
        f"the first logged step whose training loss (mean over its logging window) is below ln(C) - {margin:g} "
        f"nats, C the number of classes, and stays below for {consecutive} successive logs "
        "(energyformers.training.evaluation.plateau_exit_step)"
    )


def _stack(arrays: list[np.ndarray], fill: int) -> np.ndarray:
    """Batches of (B,) or (B, N) class ids as one array; token batches of different lengths padded with `fill`
    (−100 in the references: padding is never scored)."""
    if arrays and arrays[0].ndim == 2:
        width = max(a.shape[1] for a in arrays)
        arrays = [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill) for a in arrays]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def primary_metric(task: str) -> str:
    """The accuracy-like metric plotted next to the loss curve."""
    if task == MIM_TASK:
        return "masked_token_accuracy"
    return "blank_cell_accuracy" if task == "token-classification" else "accuracy"


def summary(task: str, metrics: dict[str, float]) -> str:
    """The one-line result printed at the end of both loops."""
    if task == MIM_TASK:
        line = f"masked-token accuracy {metrics['masked_token_accuracy']:.4f}"
        if "psnr" in metrics:
            line += (
                f"  decoded {metrics['decoded_token_accuracy']:.4f}  PSNR {metrics['psnr']:.2f} dB (tokenizer "
                f"bound {metrics['tokenizer_psnr']:.2f})  SSIM {metrics['ssim']:.3f}"
            )
        return line
    if task == "token-classification":
        return (
            f"board accuracy {metrics['board_accuracy']:.4f}  "
            f"blank-cell accuracy {metrics['blank_cell_accuracy']:.4f}"
        )
    return f"accuracy {metrics['accuracy']:.4f}  macro-F1 {metrics['f1_macro']:.4f}"


def masked_image_metrics(
    model: Any,
    inputs: Any,
    codes: Any,
    pixels: Any,
    tokenizer: Any,
    steps: int,
    seed: int = 0,
    batch_size: int = 256,
    num_iterations: int | None = None,
    lpips_weights: str | None = None,
    fid_weights: str | None = None,
    stop: StopRequest | None = None,
) -> dict[str, float]:
    """Reconstruction of masked code grids by MaskGIT decoding (`model.decode`, arccos schedule, seeded), as the
    paper measures its masked-image-modelling models.

    `inputs` `(B, N)` the grids with [MASK]s, `codes` the true grids, `pixels` `(B, C, H, W)` the images in [0, 1].
    Returns `decoded_token_accuracy` (decoded code = true code, over the masked positions), `psnr` and `ssim` of
    the decoded grids turned to pixels by `tokenizer` against the images, and `tokenizer_psnr` / `tokenizer_ssim`,
    those of the true codes: the tokenizer's own bound, which no decoding exceeds for a nearest-centroid
    tokenizer. With `lpips_weights` / `fid_weights` (local files, `energyformers.mim.PerceptualMetrics`) also
    `lpips` / `fid` and their `tokenizer_` bounds. Runs the model in eval mode, restoring its mode afterwards.
    With `stop` (a training run's), the decoding ends at its next batch once a stop is agreed (every rank decodes
    the same batches: `StopRequest.evaluation_check`, `EvaluationStopped`).
    """
    import torch

    from energyformers.mim import reconstruction_metrics

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(seed)  # one stream over the batches: deterministic
    decoded = []
    check = stop.evaluation_check(device) if stop is not None else None
    try:
        for batch in inputs.split(batch_size):
            out = model.decode(
                batch.to(device), steps=steps, generator=generator, num_iterations=num_iterations
            )
            decoded.append(out.codes.cpu())
            if check is not None:
                check.batch_done()
    finally:
        model.train(was_training)
    decoded = torch.cat(decoded)
    masked = inputs == model.mask_token_id
    perceptual = {"lpips_weights": lpips_weights, "fid_weights": fid_weights}
    ours = reconstruction_metrics(tokenizer.decode(decoded), pixels, **perceptual)
    bound = reconstruction_metrics(tokenizer.decode(codes), pixels, **perceptual)
    metrics = {
        "decoded_token_accuracy": float((decoded == codes)[masked].float().mean()) if masked.any() else 1.0
    }
    for name in ("psnr", "ssim", "lpips", "fid"):
        if name in ours:
            metrics[name] = ours[name]
    for name in ("psnr", "ssim", "lpips", "fid"):
        if name in bound:
            metrics[f"tokenizer_{name}"] = bound[name]
    return metrics


@dataclass
class MaskedImageEvaluation:
    """The reconstruction metrics of a masked-image-modelling run (`masked_image_metrics`) on the first `samples`
    images of a split of `data` (a `data.MaskedImageData`), with its fixed masks: `(model, split) -> metrics`;
    LPIPS / FID too where `lpips_weights` / `fid_weights` name local files; `stop`: `masked_image_metrics`'s."""

    data: Any
    steps: int
    samples: int
    seed: int = 0
    lpips_weights: str | None = None
    fid_weights: str | None = None

    def __call__(
        self, model: Any, split: str, num_iterations: int | None = None, stop: StopRequest | None = None
    ) -> dict[str, float]:
        n = min(self.samples, len(self.data.codes[split]))
        return masked_image_metrics(
            model,
            self.data.eval_inputs[split][:n],
            self.data.codes[split][:n],
            self.data.pixels[split][:n],
            self.data.tokenizer,
            self.steps,
            self.seed,
            num_iterations=num_iterations,
            lpips_weights=self.lpips_weights,
            fid_weights=self.fid_weights,
            stop=stop,
        )


def print_masked_image_predictions(folder: Any, data: Any, count: int, steps: int = 8) -> None:
    """Reload a masked-image-modelling run folder from the folder alone (`AutoModelForMaskedImageModeling` and the
    VQ tokenizer saved beside it) and decode the first `count` test grids with their fixed masks: per grid, the
    masked codes decoded right and the PSNR of the reconstruction against the tokenized image."""
    import torch
    import transformers

    from energyformers.mim import PatchKMeansTokenizer, reconstruction_metrics

    model = transformers.AutoModelForMaskedImageModeling.from_pretrained(folder).eval()
    tokenizer = PatchKMeansTokenizer.from_pretrained(folder)
    test = data["test"][: min(count, len(data["test"]))]
    inputs, labels = torch.as_tensor(test["input_ids"]), torch.as_tensor(test["labels"])
    codes = torch.where(labels == -100, inputs, labels)
    decoded = model.decode(inputs, steps=steps, seed=0).codes
    print(f"MaskGIT decoding ({steps} steps) of masked test grids by the reloaded {Path(folder).name}:")
    for i in range(len(inputs)):
        masked = labels[i] != -100
        right = int((decoded[i] == codes[i])[masked].sum())
        psnr = reconstruction_metrics(
            tokenizer.decode(decoded[i : i + 1]), tokenizer.decode(codes[i : i + 1])
        )
        print(
            f"  test[{i}]  masked codes right: {right}/{int(masked.sum())}  PSNR vs the tokenized image "
            f"{psnr['psnr']:.2f} dB"
        )


__all__ = [
    "METRICS_DIR",
    "PLATEAU_CONSECUTIVE",
    "PLATEAU_MARGIN",
    "MaskedImageEvaluation",
    "TrainerMetrics",
    "argmax_logits",
    "chance_loss",
    "default_eval_depths",
    "depth_metrics",
    "eval_depths",
    "first_output",
    "has_recurrent_depth",
    "load_metrics",
    "masked_image_metrics",
    "metric",
    "plateau_exit_definition",
    "plateau_exit_step",
    "primary_metric",
    "print_masked_image_predictions",
    "summary",
    "task_metrics",
    "training_losses",
]
