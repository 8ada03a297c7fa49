"""Gradient accumulation is exact for every head: with `num_items_in_batch` (what `Trainer` passes, the labels ≠ −100
of the whole accumulation window) a head's loss is its sum divided by that count, so B/2 × GA 2 gives the loss and
update of the batch of B, for token and masked-image-modelling losses too, deep supervision, supervision steps and
the halting head included. Without it the loss is unchanged (a bit-identical mean). A recurrent-depth head trained
without labels warns that its iteration-wise losses are missing (Trainer's label smoothing takes the labels)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fixtures import (
    HEADS,
    Case,
    Records,
    assert_close_to_scale,
    cli_config,
    looped_transformer_config,
    perturb,
    rounding,
)
from safetensors.torch import load_file
from transformers import Trainer, TrainingArguments, default_data_collator

from energyformers import (
    LoopedTransformerForImageClassification,
    LoopedTransformerForMaskedImageModeling,
    LoopedTransformerForTokenClassification,
)
from energyformers.modeling import modeling_hyperset
from energyformers.modeling.modeling_hyperset import RecurrentDepthHeadMixin
from energyformers.training import accelerate_loop, train

# the looped baseline's heads, with the Hyper-SET case whose inputs they take
LOOPED = {
    LoopedTransformerForImageClassification: Case("hyperset", "AutoModelForImageClassification", "image"),
    LoopedTransformerForTokenClassification: Case("hyperset", "AutoModelForTokenClassification", "sequence"),
    LoopedTransformerForMaskedImageModeling: Case("hyperset", "AutoModelForMaskedImageModeling", "sequence"),
}
# the iteration-wise losses, on the heads whose config has them (masked image modelling reads the last iteration)
ITERATION_WISE = dict(deep_supervision="all", supervision_steps=2, halting_head=True)


def recurrent(model_class: type) -> bool:
    return issubclass(model_class, RecurrentDepthHeadMixin)


def build(case: Case | type, **overrides: object) -> torch.nn.Module:
    """A tiny head in training mode, perturbed so its iterations differ; iteration-wise losses where it has them."""
    model_class = case if isinstance(case, type) else case.model_class
    if recurrent(model_class):
        overrides = {**ITERATION_WISE, **overrides}
    torch.manual_seed(0)
    if isinstance(case, type):
        model = case(looped_transformer_config(LOOPED[case].input_type, **overrides))
    else:
        model = case.model_class(case.config(**overrides))
    return perturb(model).train()


def batch(case: Case | type, problem_type: str = "single_label_classification") -> dict[str, torch.Tensor]:
    """Four samples; per-token labels with a different number of −100 in each row."""
    case = LOOPED.get(case, case)
    tiny = case.tiny
    inputs = case.inputs(labels=True)
    inputs = {
        k: torch.cat([v, v.flip(0)])[:4] for k, v in inputs.items()
    }  # 4 rows from the 2-3 of the fixture
    labels = inputs["labels"]
    if labels.dim() == 2:
        for row in range(4):
            labels[row, : row + 1] = -100
    elif problem_type == "regression":
        inputs["labels"] = torch.linspace(-1, 1, 4)
    elif problem_type == "multi_label_classification":
        inputs["labels"] = (torch.arange(4 * tiny.labels).view(4, tiny.labels) % 3 == 0).float()
    return inputs


def count(labels: torch.Tensor) -> torch.Tensor:
    return (labels != -100).sum()


HEAD_CASES = [*HEADS, *LOOPED]
PROBLEMS = [(case, "single_label_classification") for case in HEAD_CASES] + [
    (case, problem)
    for case in HEADS
    if case.auto_name == "AutoModelForImageClassification" and case.family in ("imixer", "hyperbf")
    for problem in ("regression", "multi_label_classification")
]


def ids(value: object) -> str:
    return value.__name__ if isinstance(value, type) else str(value)


@pytest.mark.parametrize(("case", "problem_type"), PROBLEMS, ids=ids)
def test_micro_batches_normalised_by_the_window_count_add_up_to_the_batch(case, problem_type):
    overrides = {} if problem_type == "single_label_classification" else {"problem_type": problem_type}
    if problem_type == "regression":
        overrides["num_labels"] = 1
    model = build(case, **overrides)
    if case in HEADS and case.family == "imixer":
        # in training each forward moves the spectral norm's power iteration (`spectral_norm_schedule`): a batch's
        # loss would depend on the calls before it
        model.eval()
    assert model.accepts_loss_kwargs is True
    inputs = batch(case, problem_type)
    total = count(inputs["labels"])
    full = model(**inputs, num_items_in_batch=total).loss
    halves = [{k: v[rows] for k, v in inputs.items()} for rows in (slice(0, 1), slice(1, 4))]
    split = sum(model(**half, num_items_in_batch=total).loss for half in halves)
    # a sum of ≤ 4·16 float32 terms (samples × tokens) in two orders, per supervised iteration and step: 256
    # roundings of the loss's size
    assert split.item() == pytest.approx(full.item(), rel=rounding(torch.float32, 256)), (split, full)
    mean = model(**inputs).loss
    per_token_halting = recurrent(type(model)) and inputs["labels"].dim() == 2
    if not per_token_halting:  # there a sample's halting loss weighs its supervised tokens (`_halting_step`)
        assert full.item() == pytest.approx(mean.item(), rel=rounding(torch.float32, 256)), (full, mean)


@pytest.mark.parametrize("case", [c for c in HEADS if c.family == "hyperset"] + list(LOOPED), ids=ids)
def test_without_num_items_the_loss_is_the_plain_mean_bit_for_bit(case):
    """The default path is what it was: transformers' loss (a mean) of the returned logits, the masked
    cross-entropy's sum over the counted positions; and passing the count gives it again, to rounding."""
    model = build(case, deep_supervision="last", supervision_steps=1, halting_head=False)
    inputs = batch(case)
    out = model(**inputs)
    labels = inputs["labels"]
    logits = out.logits.float().reshape(-1, out.logits.shape[-1])
    if "MaskedImageModeling" in type(model).__name__:
        expected = F.cross_entropy(logits, labels.flatten(), reduction="none").sum() / count(labels)
    else:
        expected = F.cross_entropy(logits, labels.flatten())
    assert torch.equal(out.loss, expected), (out.loss, expected)
    counted = model(**inputs, num_items_in_batch=count(labels)).loss
    assert counted.item() == pytest.approx(expected.item(), rel=rounding(torch.float32, 64))


# ------------------------------------------------------------------------------------------- Trainer, in process


def sudoku_like(samples: int, mim: bool) -> list[dict[str, torch.Tensor]]:
    """Rows of 16 tokens, 3 to 13 of them supervised: different counts per row, as Sudoku blanks and MIM masks."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(samples):
        ids = torch.randint(0, 19, (16,), generator=g)
        labels = torch.randint(0, 4, (16,), generator=g)
        labels[3 + (5 * i) % 11 :] = -100
        if mim:
            ids[labels != -100] = 19  # [MASK]
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def trainer_update(model: torch.nn.Module, rows: list, batch_size: int, steps: int, tmp: Path) -> dict:
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    args = TrainingArguments(
        output_dir=str(tmp), per_device_train_batch_size=batch_size, gradient_accumulation_steps=steps,
        max_steps=1, learning_rate=0.1, optim="sgd", max_grad_norm=0.0, weight_decay=0.0, report_to=[],
        lr_scheduler_type="constant", save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=default_data_collator)
    assert trainer.model_accepts_loss_kwargs
    trainer.train()
    return {k: start[k] - v.detach() for k, v in model.named_parameters()}


@pytest.mark.parametrize("head", ["AutoModelForTokenClassification", "AutoModelForMaskedImageModeling"])
def test_trainer_accumulation_gives_the_update_of_the_full_batch(tmp_path, head):
    case = Case("hyperset", head, "sequence")
    rows = sudoku_like(8, mim="Masked" in head)
    full = trainer_update(build(case), rows, 8, 1, tmp_path / "full")
    accumulated = trainer_update(build(case), rows, 4, 2, tmp_path / "acc")
    num = sum((full[k] - accumulated[k]).pow(2).sum() for k in full).sqrt()
    den = sum(full[k].pow(2).sum() for k in full).sqrt()
    # one SGD step from gradients summed over 8 rows in two orders; the mean of micro-batch means is ~1e-2 off
    assert num / den < rounding(torch.float32, 2048), (num / den).item()


# ------------------------------------------------------------------------------------------------- the CLI loops

LOOPS = {"train": train.main, "train-accelerate": accelerate_loop.main}


class SGDInAdamsPlace(torch.optim.SGD):
    """Plain SGD built where both loops build `torch.optim.AdamW` (by that name, when the run starts): its step is
    lr × the gradient, so the weights show the accumulated gradient's scale, which Adam's first step (about lr × its
    sign) hides. Adam's settings are ignored."""

    def __init__(self, params: object, lr: float = 1e-3, **adam_settings: object) -> None:
        super().__init__(params, lr=lr)


# the model's own loss with every iteration supervised (`num_items_in_batch`), and label smoothing (the CLI's
# `TrainingLoss`, which takes the last logits only: deep supervision stays at its default there)
LOSSES = {
    "deep-supervision": ['deep_supervision="all"'],
    "label-smoothing": ["--label_smoothing_factor", "0.1"],
}


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_cli_accumulation_on_sudoku_matches_the_full_batch(tmp_path, monkeypatch, loop, loss):
    """4 × GA 2 gives the train_loss and the SGD update of the batch of 8."""
    monkeypatch.setattr(torch.optim, "AdamW", SGDInAdamsPlace)
    common = ["--model", "hyperset", "--dataset", "sudoku", "--config", *cli_config("hyperset")]
    common += [*LOSSES[loss], "--max_train_samples", "8", "--max_eval_samples", "4"]
    common += ["--max_test_samples", "4", "--max_steps", "1", "--warmup_steps", "0", "--num_threads", "1"]
    common += ["--disable_tqdm", "--eval_strategy", "no", "--save_strategy", "no", "--num_predictions", "0"]
    # lr 1: the update is the gradient itself, far above the weights' rounding, so a factor in it shows
    common += ["--max_grad_norm", "0", "--iteration_sampling", "fixed", "--learning_rate", "1"]
    sizes = {"full": ["--per_device_train_batch_size", "8"]}
    sizes["acc"] = ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"]
    for name, size in sizes.items():
        assert LOOPS[loop]([*common, *size, "--output_dir", str(tmp_path / name)]) == 0
    losses = [
        json.loads((tmp_path / name / "metrics.json").read_text())["train"]["train_loss"] for name in sizes
    ]
    # the same sums over the 8 boards' cells in another order (a few hundred terms, losses of order 1)
    assert losses[1] == pytest.approx(losses[0], rel=rounding(torch.float32, 1024)), losses
    a, b = (load_file(tmp_path / name / "model.safetensors") for name in sizes)
    for key in a:
        # one SGD step from gradients summed over the batch in two orders: rounding of the weights' scale
        assert_close_to_scale(b[key], a[key], rounding(torch.float32, 256), key)


# ------------------------------------------------------------------------------------------------------ warning


@pytest.fixture
def warnings_seen():
    """What Hyper-SET's logger says about missing labels, each message fresh for `warning_once`."""
    # transformers' `warning_once` remembers every message of the process (an lru_cache): forgotten here and after
    logging.Logger.warning_once.cache_clear()
    records = Records()
    modeling_hyperset.logger.addHandler(records)
    try:
        yield lambda: [m for m in records.messages if "without labels" in m]
    finally:
        modeling_hyperset.logger.removeHandler(records)
        logging.Logger.warning_once.cache_clear()


@pytest.mark.parametrize(
    ("overrides", "mode", "warns"),
    [
        (ITERATION_WISE, "train", True),
        (dict(deep_supervision="all"), "train", True),
        (ITERATION_WISE, "eval", False),
        (dict(deep_supervision="last", supervision_steps=1, halting_head=False), "train", False),
    ],
    ids=["all-train", "deep-supervision-train", "eval", "default-train"],
)
def test_training_without_labels_warns_once_that_the_iteration_losses_are_missing(
    warnings_seen, overrides, mode, warns
):
    case = Case("hyperset", "AutoModelForImageClassification", "image")
    model = build(case, **overrides).train(mode == "train")
    inputs = {k: v for k, v in batch(case).items() if k != "labels"}
    model(**inputs)
    model(**inputs)
    seen = warnings_seen()
    assert len(seen) == (1 if warns else 0), seen
    if warns:
        assert "label_smoothing_factor" in seen[0] and "compute_loss_func" in seen[0], seen[0]
        assert "deep_supervision='all'" in seen[0], seen[0]
