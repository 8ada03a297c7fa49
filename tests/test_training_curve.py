"""The training curve a run folder carries (`run_folder.plot_training_curve`): its legend covers none of the plotted
lines, whichever corner they reach."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib
import numpy as np
import pytest

from energyformers.training.run_folder import plot_training_curve

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def demo_like_history(steps: int = 300, every: int = 25) -> list[dict[str, float]]:
    """A digits run's shape: the losses fall from ~2.3, the accuracy rises to ~0.95 (top right of its axis)."""
    history = [{"step": s, "loss": 2.3 * np.exp(-s / 60) + 0.15} for s in range(10, steps + 1, 10)]
    for s in range(every, steps + 1, every):
        history.append(
            {
                "step": s,
                "eval_loss": 2.3 * np.exp(-s / 70) + 0.2,
                "eval_accuracy": 0.95 - 0.85 * np.exp(-s / 50),
            }
        )
    return history


def points_along(line: matplotlib.lines.Line2D, per_segment: int = 20) -> np.ndarray:
    """Display coordinates of a line's markers and of points along each of its segments."""
    xy = line.get_transform().transform(np.column_stack(line.get_data()).astype(float))
    t = np.linspace(0, 1, per_segment)[:, None]
    return np.concatenate([xy, *(a + t * (b - a) for a, b in itertools.pairwise(xy))])


def test_the_legend_covers_no_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to measure it
    path = tmp_path / "training_curve.png"
    plot_training_curve(demo_like_history(), path, "hyperset on digits")
    assert path.is_file()
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    labels = sorted(text.get_text() for legend in legends for text in legend.get_texts())
    assert labels == ["eval accuracy", "eval loss", "train loss"], labels
    whole = fig.bbox
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and whole.y0 <= box.y0 and box.y1 <= whole.y1, (
            f"legend {box} outside the figure {whole}"
        )
        for ax in fig.axes:
            for line in ax.get_lines():
                xy = points_along(line)
                covered = [
                    (round(float(x), 1), round(float(y), 1))
                    for x, y in xy
                    if box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1
                ]
                assert not covered, (
                    f"the legend {box} covers {len(covered)} points of {line.get_label()!r}, e.g. {covered[:3]}"
                )
    monkeypatch.undo()
    plt.close(fig)  # the close the function made was patched out: release the figure
