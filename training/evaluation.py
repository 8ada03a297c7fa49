"""Metrics of both training loops: accuracy and macro-F1 (classification), blank-cell and board accuracy (Sudoku).

The `evaluate` metric scripts are loaded from this package's `metrics/` folder by path, so evaluation works
offline and never reaches the Hub.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

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

    Classification: `accuracy` and `f1_macro`. Token classification (Sudoku: labels −100 on given cells):
    `blank_cell_accuracy`, the fraction of labelled (blank) cells predicted right, and `board_accuracy`, the
    fraction of sequences (boards) with every labelled cell right.
    """
    predictions, references = np.asarray(predictions), np.asarray(references)
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


def eval_depths(model: Any, requested: list[int] | None) -> list[int]:
    """The iteration counts the training loops evaluate the head at besides its own (`depth_metrics`): the
    requested ones, else T/2, T and 2T of the model's `num_iterations`; none for a model without recurrent depth
    (a backbone other than `RecurrentDepthMixin`'s, which has no per-call `num_iterations`)."""
    from ..modeling.modeling_hyperset import RecurrentDepthMixin

    if not isinstance(getattr(model, "base_model", model), RecurrentDepthMixin):
        return []
    if requested:
        return sorted(set(requested))
    trained = model.config.num_iterations
    return sorted({max(1, trained // 2), trained, 2 * trained})


def depth_metrics(
    model: Any, loader: Any, gather: Any, task: str, depths: list[int], prefix: str = ""
) -> dict[str, float]:
    """`<prefix><primary metric>_iterations_<t>` for each t of `depths`: the split of `loader` classified with
    `num_iterations=t` (eval mode, no gradient), predictions gathered across processes by `gather`
    (`accelerator.gather_for_metrics`). Logged at every evaluation, they show a plateau in depth and its end."""
    import torch

    name = primary_metric(task)
    was_training = model.training
    model.eval()
    predictions: dict[int, list[Any]] = {t: [] for t in depths}
    references = []
    with torch.no_grad():
        for batch in loader:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            references.append(gather(batch["labels"]).cpu().numpy())
            for t in depths:
                logits = model(**inputs, num_iterations=t).logits
                predictions[t].append(gather(logits.argmax(-1)).cpu().numpy())
    model.train(was_training)
    truth = _stack(references, fill=-100)
    return {
        f"{prefix}{name}_iterations_{t}": task_metrics(task, _stack(predictions[t], fill=0), truth)[name]
        for t in depths
    }


def _stack(arrays: list[np.ndarray], fill: int) -> np.ndarray:
    """Batches of (B,) or (B, N) class ids as one array; token batches of different lengths padded with `fill`
    (−100 in the references: padding is never scored)."""
    if arrays and arrays[0].ndim == 2:
        width = max(a.shape[1] for a in arrays)
        arrays = [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill) for a in arrays]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def primary_metric(task: str) -> str:
    """The accuracy-like metric plotted next to the loss curve."""
    return "blank_cell_accuracy" if task == "token-classification" else "accuracy"


def summary(task: str, metrics: dict[str, float]) -> str:
    """The one-line result printed at the end of both loops."""
    if task == "token-classification":
        return (
            f"board accuracy {metrics['board_accuracy']:.4f}  "
            f"blank-cell accuracy {metrics['blank_cell_accuracy']:.4f}"
        )
    return f"accuracy {metrics['accuracy']:.4f}  macro-F1 {metrics['f1_macro']:.4f}"


__all__ = [
    "METRICS_DIR",
    "depth_metrics",
    "eval_depths",
    "load_metrics",
    "metric",
    "primary_metric",
    "summary",
    "task_metrics",
]
