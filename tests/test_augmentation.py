"""Training recipes (`energyformers.training.augmentation`): kornia batch augmentation, soft targets, recipe
presets, weight EMA (with `Trainer`) and the warm-up / cosine / cooldown lr schedule."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fixtures import assert_differs, rounding
from safetensors.torch import load_file
from transformers import HfArgumentParser, Trainer, TrainerCallback, TrainingArguments

from energyformers.training.augmentation import (
    EMA_WEIGHTS_NAME,
    BatchAugmentation,
    EMACallback,
    ExponentialMovingAverage,
    recipe_lr_schedule,
    soft_target_cross_entropy,
)
from energyformers.training.recipes import RECIPES, TRAINING_KEYS, AugmentationArguments, split_recipe

NUM_LABELS = 10
MEAN = STD = (0.5, 0.5, 0.5)  # the CLI's image processor: pixel values in [-1, 1]


def make_batch(batch: int = 8, size: int = 16, dtype: torch.dtype = torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pixel_values = (torch.rand(batch, 3, size, size, generator=g) * 2 - 1).to(dtype)
    labels = torch.randint(0, NUM_LABELS, (batch,), generator=g)
    return pixel_values, labels


def build(**flags: Any) -> BatchAugmentation:
    return BatchAugmentation(AugmentationArguments(**flags), NUM_LABELS, MEAN, STD)


# One flag per augmentation, at a setting where it surely acts on every batch.
SINGLE_OPS = {
    "rand_augment": dict(rand_augment_ops=2, rand_augment_magnitude=9.0),
    "horizontal_flip": dict(horizontal_flip=1.0),
    "random_resized_crop": dict(random_resized_crop_scale=0.08),
    "random_erasing": dict(random_erasing=1.0),
    "mixup": dict(mixup_alpha=1.0),
    "cutmix": dict(cutmix_alpha=1.0),
}
FULL = dict(
    rand_augment_ops=2,
    horizontal_flip=0.5,
    random_resized_crop_scale=0.08,
    random_erasing=0.25,
    mixup_alpha=0.8,
    cutmix_alpha=1.0,
    label_smoothing=0.1,
)


# --------------------------------------------------------------------------- batch augmentation


def test_defaults_are_off_and_return_the_inputs_unchanged():
    aug = build()
    assert not AugmentationArguments().enabled
    pixel_values, labels = make_batch()
    out, targets = aug(pixel_values, labels)
    assert out is pixel_values and targets is labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("op", sorted(SINGLE_OPS))
def test_each_enabled_op_changes_the_batch_and_keeps_shape_dtype_device(op, dtype):
    pixel_values, labels = make_batch(dtype=dtype)
    torch.manual_seed(0)
    out, targets = build(**SINGLE_OPS[op])(pixel_values, labels)
    assert out.shape == pixel_values.shape and out.dtype == dtype and out.device == pixel_values.device
    assert targets.device == labels.device
    # a real change, not rounding: 1e-2 is above one bfloat16 ulp at 1 (2^-7), the coarsest dtype here, and far
    # below what an op does to an image in [-1, 1]
    moved = (out.float() - pixel_values.float()).abs().amax(dim=(1, 2, 3))
    assert (moved > 1e-2).sum() >= len(moved) // 2, (
        f"{op} left most images unchanged: max |Δ| per image {moved}"
    )
    # the ops run in float32 on values clamped to [0, 1]; a resample's convex combination may round past 1 by a
    # few float32 ulps, and the cast back to `dtype` by one of its ulps
    top, limit = out.float().abs().max().item(), 1.0 + rounding(torch.float32, 4) + rounding(dtype, 1)
    assert top <= limit, f"values left the normalised [-1, 1] range: max |x| = {top!r} > {limit!r}"


def test_horizontal_flip_is_a_mirror_and_erasing_fills_the_mean_colour():
    pixel_values, labels = make_batch()
    out, _ = build(horizontal_flip=1.0)(pixel_values, labels)
    # a permutation of the pixels after the un-normalise/normalise round trip, whose `+ mean` rounds by an ulp of
    # values up to 1 (the rest of the round trip is exact for mean = std = 0.5): 2 roundings of 1
    torch.testing.assert_close(out, pixel_values.flip(-1), atol=rounding(torch.float32, 2), rtol=0)
    torch.manual_seed(0)
    out, _ = build(random_erasing=1.0)(pixel_values, labels)
    erased = out != pixel_values
    assert erased.any(dim=(1, 2, 3)).all(), "p=1 erases a rectangle in every image"
    assert (out[erased] == 0.0).all(), "erased pixels are 0 after normalisation, the mean colour"


def test_label_smoothing_alone_gives_smoothed_one_hot_and_untouched_images():
    pixel_values, labels = make_batch()
    out, targets = build(label_smoothing=0.1)(pixel_values, labels)
    assert torch.equal(out, pixel_values)
    assert targets.shape == (len(labels), NUM_LABELS) and targets.dtype == torch.float32
    expected = F.one_hot(labels, NUM_LABELS).float() * 0.9 + 0.1 / NUM_LABELS
    torch.testing.assert_close(targets, expected)


def test_mixup_targets_mix_the_paired_labels_with_the_image_weights():
    pixel_values, labels = make_batch()
    labels = torch.arange(8)  # distinct labels: each row's two non-zero targets identify the pair
    torch.manual_seed(3)
    out, targets = build(mixup_alpha=1.0)(pixel_values, labels)
    torch.testing.assert_close(targets.sum(1), torch.ones(8))
    lam = targets[0, 0].item()
    assert 0.0 < lam < 1.0
    # timm's batch mode: image i is mixed with image B-1-i with one λ for the batch.
    # λ x + (1 − λ) x' in float32 with λ from the float64 draw, against the same with λ read back from the
    # float32 targets: the rounding of λ and of 1 − λ, two products and a sum, of pixels up to 1
    mixed = lam * pixel_values + (1 - lam) * pixel_values.flip(0)
    torch.testing.assert_close(out, mixed, atol=rounding(torch.float32, 6), rtol=0)
    for i in range(8):
        partner = 7 - i
        # the own label's weight is 1 × λ + 0 × (1 − λ), the same float32 value in every row: exact
        assert targets[i, i].item() == lam, (i, targets[i, i].item(), lam)
        # 1 − λ rounded to float32, against 1 − float32(λ) in float64: λ's rounding and the subtraction's
        assert targets[i, partner].item() == pytest.approx(1 - lam, abs=rounding(torch.float32, 2))
        assert targets[i].count_nonzero() == 2


def test_cutmix_target_weights_equal_the_pasted_areas():
    # Image i is constant (value i/10): the share of pixels still equal to it is the weight of label i.
    labels = torch.arange(8)
    pixel_values = (labels.float().view(8, 1, 1, 1) / 10).expand(8, 3, 16, 16).contiguous()
    torch.manual_seed(0)
    out, targets = build(cutmix_alpha=1.0, label_smoothing=0.1)(pixel_values, labels)
    torch.testing.assert_close(targets.sum(1), torch.ones(8))
    # the smoothed "off" value ε / n, mixed as λ off + (1 − λ) off in float32: its rounding, two products and a
    # sum, of 0.01
    off = 0.1 / NUM_LABELS
    floor = off - rounding(torch.float32, 4, off)
    lowest = targets.min().item()
    assert lowest >= floor, (
        f"label smoothing is applied before mixing (timm): min target {lowest!r} < {floor!r}"
    )
    mixed_rows = 0
    for i in range(8):
        own_share = (out[i, 0] == pixel_values[i, 0, 0, 0]).float().mean().item()
        lam = (targets[i, i].item() - 0.01) / 0.9  # undo the smoothing: on = 0.9 + 0.01, off = 0.01
        # λ read back from float32 targets 0.91 λ + 0.01 (1 − λ): the roundings of 0.91, 0.01, λ, two products and
        # a sum, of targets up to 1, divided by 0.9; own_share is exact (k / 256)
        assert lam == pytest.approx(own_share, abs=rounding(torch.float32, 8))
        others = [v for v in out[i, 0].unique().tolist() if v != pixel_values[i, 0, 0, 0].item()]
        for value in others:  # the pasted pixels come from the image whose label gets the rest of the weight
            partner = round(value * 10)
            share = (targets[i, partner].item() - 0.01) / 0.9  # as λ above: 8 roundings of 1
            assert share == pytest.approx(1 - own_share, abs=rounding(torch.float32, 8))
        mixed_rows += bool(others)
    assert mixed_rows >= 4


def test_mix_prob_zero_and_eval_mode_leave_the_batch_alone():
    pixel_values, labels = make_batch()
    out, targets = build(mixup_alpha=1.0, mix_prob=0.0)(pixel_values, labels)
    assert out is pixel_values and targets is labels
    aug = build(**FULL).eval()
    out, targets = aug(pixel_values, labels)
    assert out is pixel_values and targets is labels


def test_mixed_batches_return_soft_targets_every_time():
    """With mixing on, targets are (B, C) probabilities also for batches that mix_prob skipped."""
    aug = build(mixup_alpha=1.0, mix_prob=0.5)
    pixel_values, labels = make_batch()
    skipped = 0
    for seed in range(8):
        torch.manual_seed(seed)
        out, targets = aug(pixel_values, labels)
        assert targets.shape == (8, NUM_LABELS)
        torch.testing.assert_close(targets.sum(1), torch.ones(8))
        if torch.equal(out, pixel_values):
            skipped += 1
            torch.testing.assert_close(targets, F.one_hot(labels, NUM_LABELS).float())
    assert 0 < skipped < 8


def test_deterministic_under_manual_seed():
    aug = build(**FULL)
    pixel_values, labels = make_batch()
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        runs.append(aug(pixel_values, labels))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert_differs(runs[2][0], runs[0][0], "another seed's augmented images")


def test_grey_images_work_without_the_rgb_only_colour_op():
    aug = BatchAugmentation(AugmentationArguments(rand_augment_ops=15), NUM_LABELS, [0.5], [0.5])
    pixel_values = torch.rand(4, 1, 8, 8) * 2 - 1
    out, _ = aug(pixel_values, torch.arange(4))
    assert out.shape == pixel_values.shape


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_stay_on_the_device():
    pixel_values, labels = make_batch()
    torch.manual_seed(0)
    out, targets = build(**FULL)(pixel_values.cuda(), labels.cuda())
    assert out.is_cuda and targets.is_cuda and out.dtype == torch.float32


def test_recipe_augmentation_changes_cli_training_batches_but_not_the_saved_processor():
    """The CLI's image processor output through a full augmentation: batches change, the processor does not."""
    from transformers import ViTImageProcessorPil

    processor = ViTImageProcessorPil(size={"height": 16, "width": 16}, image_mean=MEAN, image_std=STD)
    before = processor.to_dict()
    images = [torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8).numpy() for _ in range(8)]
    pixel_values = processor(images, return_tensors="pt")["pixel_values"]
    aug = BatchAugmentation(
        AugmentationArguments(**FULL), NUM_LABELS, processor.image_mean, processor.image_std
    )
    torch.manual_seed(0)
    out, targets = aug(pixel_values, torch.arange(8))
    assert_differs(out, pixel_values, "augmented images")
    assert targets.shape == (8, NUM_LABELS), targets.shape
    assert processor.to_dict() == before


# --------------------------------------------------------------------------- flags and recipes

BAD_FLAGS = [
    ("rand_augment_ops", -1),
    ("rand_augment_ops", 16),
    ("rand_augment_ops", 2.5),
    ("rand_augment_magnitude", 0.0),
    ("rand_augment_magnitude", 10.0),
    ("mixup_alpha", -0.1),
    ("cutmix_alpha", float("nan")),
    ("mix_prob", 1.5),
    ("random_erasing", -0.25),
    ("horizontal_flip", 2.0),
    ("label_smoothing", 1.0),
    ("random_resized_crop_scale", 0.0),
    ("random_resized_crop_scale", 1.2),
]


@pytest.mark.parametrize(("flag", "value"), BAD_FLAGS)
def test_bad_flag_values_raise_naming_the_flag_and_value(flag, value):
    with pytest.raises(ValueError, match=rf"--{flag} {re.escape(repr(value))}: expected"):
        AugmentationArguments(**{flag: value})


def test_flags_parse_with_hf_argument_parser_and_have_help():
    parser = HfArgumentParser(AugmentationArguments)
    (args,) = parser.parse_args_into_dataclasses(
        args=["--rand_augment_ops", "2", "--mixup_alpha", "0.8", "--random_resized_crop_scale", "0.08"]
    )
    assert (args.rand_augment_ops, args.mixup_alpha, args.random_resized_crop_scale) == (2, 0.8, 0.08)
    assert parser.parse_args_into_dataclasses(args=[])[0] == AugmentationArguments()
    assert all(f.metadata.get("help") for f in dataclasses.fields(AugmentationArguments))
    with pytest.raises(ValueError, match=r"--label_smoothing 1\.5"):
        parser.parse_args_into_dataclasses(args=["--label_smoothing", "1.5"])


def test_bad_inputs_raise_before_any_work():
    aug = build(mixup_alpha=1.0)
    pixel_values, labels = make_batch()
    with pytest.raises(ValueError, match="labels: expected integer class ids"):
        aug(pixel_values, labels.float())
    with pytest.raises(ValueError, match="4 channels"):
        aug(torch.zeros(8, 4, 16, 16), labels)
    with pytest.raises(ValueError, match=r"class ids in \[0, 10\)"):
        aug(pixel_values, labels + 10)
    with pytest.raises(ValueError, match="num_labels=1"):
        BatchAugmentation(AugmentationArguments(), 1, MEAN, STD)
    with pytest.raises(ValueError, match="image_std"):
        BatchAugmentation(AugmentationArguments(), NUM_LABELS, MEAN, (0.5, 0.0, 0.5))


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_splits_into_valid_flags_and_training_keys(name):
    aug_kwargs, training_kwargs = split_recipe(name)
    AugmentationArguments(**aug_kwargs)
    assert set(training_kwargs) <= set(TRAINING_KEYS)
    assert {**aug_kwargs, **training_kwargs} == RECIPES[name]


def test_unknown_recipe_names_fail():
    # the citations and values of RECIPES are checked in tests/test_recipes.py
    with pytest.raises(ValueError, match="--recipe 'swin': unknown recipe"):
        split_recipe("swin")


# --------------------------------------------------------------------------- loss


def test_soft_target_cross_entropy_matches_torch_for_hard_and_smoothed_targets():
    torch.manual_seed(0)
    logits = torch.randn(6, NUM_LABELS, dtype=torch.bfloat16)
    labels = torch.randint(0, NUM_LABELS, (6,))
    reference = F.cross_entropy(logits.float(), labels)
    torch.testing.assert_close(soft_target_cross_entropy(logits, labels), reference)
    one_hot = F.one_hot(labels, NUM_LABELS).float()
    torch.testing.assert_close(soft_target_cross_entropy(logits, one_hot), reference)
    _, smoothed = build(label_smoothing=0.1)(torch.zeros(6, 3, 4, 4), labels)
    torch.testing.assert_close(
        soft_target_cross_entropy(logits, smoothed),
        F.cross_entropy(logits.float(), labels, label_smoothing=0.1),
    )
    with pytest.raises(ValueError, match="soft targets must match"):
        soft_target_cross_entropy(logits, one_hot[:, :5])


# --------------------------------------------------------------------------- EMA


def test_exponential_moving_average_follows_the_formula_and_swaps_back():
    model = torch.nn.Linear(3, 2)
    ema = ExponentialMovingAverage(model, decay=0.9)
    expected = model.weight.detach().clone()
    ema.update(model)  # first update copies
    for _ in range(3):
        with torch.no_grad():
            model.weight.add_(1.0)
        ema.update(model)
        expected = 0.9 * expected + 0.1 * model.weight.detach()
    live = model.weight.detach().clone()
    with ema.averaged_weights(model):
        torch.testing.assert_close(model.weight.detach(), expected)
    assert torch.equal(model.weight.detach(), live)
    state = ema.state_dict()
    other = ExponentialMovingAverage(torch.nn.Linear(3, 2), decay=0.9)
    other.load_state_dict(state)
    torch.testing.assert_close(other.averaged.module.weight, expected)
    assert int(other.averaged.n_averaged) == 4
    with pytest.raises(ValueError, match=r"ema_decay=1\.0"):
        ExponentialMovingAverage(model, decay=1.0)


class Regression(torch.nn.Module):
    """y = w·x; in eval it records the weights it was evaluated with."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1, bias=False)
        torch.nn.init.constant_(self.linear.weight, 0.0)
        self.eval_weights: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if not self.training:
            self.eval_weights.append(self.linear.weight.detach().clone())
        prediction = self.linear(x).squeeze(-1)
        return {"loss": F.mse_loss(prediction, labels), "logits": prediction}


class LiveWeights(TrainerCallback):
    """Registered before EMACallback: sees the weights right after each optimizer step."""

    def __init__(self) -> None:
        self.after_step: list[torch.Tensor] = []

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.after_step.append(model.linear.weight.detach().clone())


def regression_data(n: int = 16) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g)
    y = x @ torch.tensor([2.0, -1.0])
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def train_regression(tmp_path: Path, callbacks: list, resume: str | None = None) -> Regression:
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=4,
        learning_rate=0.1,
        lr_scheduler_type="constant",
        optim="sgd",
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    model = Regression()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=regression_data(),
        eval_dataset=regression_data(4),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=resume)
    return model


def test_ema_callback_evaluates_and_saves_the_average_without_changing_training(tmp_path):
    decay = 0.5
    spy = LiveWeights()
    model = train_regression(tmp_path / "ema", [spy, EMACallback(decay, use_averaged_at_end=False)])
    plain = train_regression(tmp_path / "plain", [])
    # Training itself is untouched by the swaps: the live weights end where a run without EMA ends.
    torch.testing.assert_close(model.linear.weight, plain.linear.weight, rtol=0, atol=0)
    averages, average = [], None
    for weight in spy.after_step:
        average = weight if average is None else decay * average + (1 - decay) * weight
        averages.append(average)
    # Evaluations at steps 2 and 4 ran on the averages (4 eval examples, one batch each).
    assert len(model.eval_weights) == 2
    torch.testing.assert_close(model.eval_weights[0], averages[1])
    torch.testing.assert_close(model.eval_weights[1], averages[3])
    # The checkpoint holds the live weights (for resuming) and the average beside them.
    checkpoint = tmp_path / "ema" / "checkpoint-2"
    live = load_file(str(checkpoint / "model.safetensors"))["linear.weight"]
    torch.testing.assert_close(live, spy.after_step[1])
    torch.testing.assert_close(load_file(str(checkpoint / EMA_WEIGHTS_NAME))["linear.weight"], averages[1])
    # Resuming from step 2 restores the average, so it ends where the uninterrupted run's does.
    ending = EMACallback(decay)
    resumed = train_regression(tmp_path / "ema", [ending], resume=str(checkpoint))
    torch.testing.assert_close(resumed.linear.weight.detach(), averages[3])
    assert int(ending.ema.averaged.n_averaged) == 4


# --------------------------------------------------------------------------- lr schedule


def test_recipe_lr_schedule_warms_up_from_the_floor_decays_by_cosine_and_cools_down():
    base, floor, start = 1e-3, 1e-5, 1e-6
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=base)
    scheduler = recipe_lr_schedule(optimizer, 110, 10, 20, base_lr=base, min_lr=floor, warmup_lr=start)
    lrs = []
    for _ in range(110):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # the schedule's Python floats against the same formulas written here in another order: a cosine, a few
    # products and sums, relative to the rate itself (abs=0: approx would add an absolute 1e-12 otherwise)
    rel = rounding(torch.float64, 8)
    assert lrs[0] == pytest.approx(start, rel=rel, abs=0)
    assert lrs[5] == pytest.approx(start + (base - start) / 2, rel=rel, abs=0)
    assert lrs[10] == pytest.approx(base, rel=rel, abs=0)
    # the cosine's midpoint: 80 decay steps
    assert lrs[10 + 40] == pytest.approx(floor + (base - floor) / 2, rel=rel, abs=0)
    assert lrs[89] == pytest.approx(
        floor + 0.5 * (base - floor) * (1 + math.cos(math.pi * 79 / 80)), rel=rel, abs=0
    )
    assert lrs[90:] == pytest.approx([floor] * 20, rel=rel, abs=0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    with pytest.raises(ValueError, match=r"warm-up \+ cooldown"):
        recipe_lr_schedule(optimizer, 10, 8, 8, base_lr=base, min_lr=floor, warmup_lr=start)
    with pytest.raises(ValueError, match="min_lr"):
        recipe_lr_schedule(optimizer, 10, 0, 0, base_lr=base, min_lr=2 * base, warmup_lr=start)
