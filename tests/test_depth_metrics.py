"""`evaluation.depth_metrics` with `call_arguments`: the extra forward arguments (`energyformers evaluate`'s depth
flags) reach every forward of every row, each row's `num_iterations` wins over theirs, the batch's labels are not
passed, and the model's train/eval mode is restored."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from energyformers.training.evaluation import depth_metrics

NUM_LABELS = 3


class RecordingModel(torch.nn.Module):
    """Predicts class `num_iterations % NUM_LABELS` for every example and records each call's arguments and mode."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, Any]] = []

    def forward(self, pixel_values: torch.Tensor, num_iterations: int, **extra: Any) -> SimpleNamespace:
        self.calls.append({"num_iterations": num_iterations, **extra, "training": self.training})
        logits = torch.zeros(len(pixel_values), NUM_LABELS)
        logits[:, num_iterations % NUM_LABELS] = 1.0
        return SimpleNamespace(logits=logits)


def loader() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    labels = torch.tensor([[1, 1, 2, 0], [1, 2, 1, 1]])  # class 1: 5 of 8, class 2: 2 of 8
    return [{"pixel_values": torch.randn(4, 2, generator=generator), "labels": row} for row in labels]


def test_call_arguments_reach_every_forward_and_each_rows_depth_wins():
    model = RecordingModel().train()
    call = {"halting_tolerance": 1e9, "halting_criterion": "state", "num_iterations": 7}
    got = depth_metrics(
        model, loader(), lambda x: x, "image-classification", [1, 2], "eval_", call_arguments=call
    )
    expected_calls = [
        {"num_iterations": t, "halting_tolerance": 1e9, "halting_criterion": "state", "training": False}
        for _ in range(2)  # batches
        for t in (1, 2)
    ]
    assert model.calls == expected_calls, model.calls
    # T=1 predicts class 1 (5 of 8 right), T=2 class 2 (2 of 8): each row scored at its own depth
    assert got == {"eval_accuracy_iterations_1": 5 / 8, "eval_accuracy_iterations_2": 2 / 8}, got
    assert model.training, "depth_metrics must restore the model's training mode"


def test_without_call_arguments_only_the_rows_depth_is_passed():
    model = RecordingModel().eval()
    depth_metrics(model, loader(), lambda x: x, "image-classification", [4], "eval_")
    assert model.calls == [{"num_iterations": 4, "training": False}] * 2, model.calls
    assert not model.training, "depth_metrics must leave an eval-mode model in eval mode"
