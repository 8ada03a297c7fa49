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


__all__ = ["METRICS_DIR", "load_metrics", "metric", "primary_metric", "summary", "task_metrics"]
