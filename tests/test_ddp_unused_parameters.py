"""The Trainer CLI wraps the model in DDP with `find_unused_parameters=False` (no extra graph walk per step, no
"did not find any unused parameters" warning on every rank), as the Accelerate loop does: right only while every
parameter of every model the CLI builds gets a gradient from a training step. Checked here for each family and the
options that add parameters or skip computation (halting head, deep supervision, random and truncated depth).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate import PartialState

from energyformers.training import train
from energyformers.training.optimization import TrainingLoss
from energyformers.training.setup import build

SUBSET = ["--max_train_samples", "16", "--max_eval_samples", "8", "--max_test_samples", "8"]
CASES = {
    "hyperset": [],
    "hyperset-halting-head": ["--halting_head"],
    "hyperset-deep-supervision-all": ["--deep_supervision", "all"],
    "hyperset-deep-supervision-random": ["--deep_supervision", "random"],
    "hyperset-sinusoidal-conditioning": ["--iteration_conditioning", "sinusoidal"],
    "hyperset-poisson-depth": ["--iteration_sampling", "poisson-lognormal"],
    "hyperset-truncated-backprop": ["--config", "backprop_iterations=1"],
    "imixer": ["--model", "imixer"],
    "hyperbf": ["--model", "hyperbf"],
    "looped-transformer": ["--model", "looped-transformer"],
    "looped-transformer-halting-head": ["--model", "looped-transformer", "--halting_head"],
    "vit": ["--model", "vit"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_parameter_gets_a_gradient(case: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    args = train.parse(["--dataset", "digits", *SUBSET, "--output_dir", str(tmp_path / "out"), *CASES[case]])
    built = build(args, PartialState())
    model, loss_fn = built.model, TrainingLoss(args, built)
    model.train()
    batch = built.collator([built.data["train"][i] for i in range(8)])
    # several steps: random depth and random deep supervision draw anew at every forward
    for draw in range(3):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)[0] if loss_fn.active else model(**batch).loss
        loss.backward()
        unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        assert unused == [], f"{case}, forward {draw}: no gradient for {unused}"


def test_trainer_does_not_search_for_unused_parameters(tmp_path: Path) -> None:
    args = train.parse(["--dataset", "digits", *SUBSET, "--output_dir", str(tmp_path / "out")])
    ta = train.training_arguments(args, tmp_path / "out.checkpoints")
    assert ta.ddp_find_unused_parameters is False, ta.ddp_find_unused_parameters
