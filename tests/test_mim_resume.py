"""A resumed masked-image-modelling run equals an uninterrupted one, in both training loops: the training masks
(`data.MaskedCodesCollator`) continue where the interrupted run stopped, like the data order and the RNG states.

The runs cross an epoch boundary with a partial accumulation window at the epoch's end (48 training grids in
batches of 16 with 2 batches per optimizer step: 3 batches, 2 optimizer steps an epoch), so the resumed position in
the mask stream must count the batches of whole epochs, not optimizer steps × accumulation. The same holds with
DataLoader workers (`--dataloader_num_workers` 2): each worker numbers the batches it collates, so the masks equal
those of a run without workers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import skip_first_batches
from fixtures import assert_same_saved_weights
from test_train_cli import KILL_AFTER_FIRST_SAVE

from energyformers.training import accelerate_loop, train
from energyformers.training.data import MaskedCodesCollator

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# the `cli-mim` preset shrunk to width 32, one layer iterated twice (as tests/test_mim_training.py)
COMMON = [
    "--task", "mim", "--dataset", "digits", "--model", "hyperset",
    "--config", "hidden_size=32", "num_attention_heads=4", "intermediate_size=32", "time_embedding_dim=32",
    "num_iterations=2",
    "--max_train_samples", "48", "--max_eval_samples", "8", "--max_test_samples", "8",
    "--codebook_size", "16", "--tokenizer_fit_samples", "48", "--decode_steps", "1", "--decode_samples", "4",
    "--batch_size", "16", "--gradient_accumulation_steps", "2", "--max_steps", "5",
    "--eval_strategy", "no", "--num_threads", "1", "--num_predictions", "1", "--warmup_ratio", "0",
    "--disable_tqdm",
]  # fmt: skip


def test_trainer_run_killed_after_a_save_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    common = [*COMMON, "--save_strategy", "steps", "--save_steps", "2"]
    straight = tmp_path / "straight"
    assert train.main([*common, "--output_dir", str(straight)]) == 0

    out = tmp_path / "interrupted"
    script = tmp_path / "kill.py"
    script.write_text(KILL_AFTER_FIRST_SAVE)
    argv = [sys.executable, str(script), *common, "--output_dir", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 128 + 15, proc.stderr[-3000:]
    checkpoints = sorted(p.name for p in out.with_name("interrupted.checkpoints").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-2", "checkpoint-3"], (
        checkpoints
    )  # periodic save, then the SIGTERM save

    # step 3 is in the second epoch, one optimizer step (2 batches) into it
    assert train.main([*common, "--output_dir", str(out), "--resume"]) == 0
    recipe = json.loads((out / "metrics.json").read_text())["recipe"]
    assert recipe["global_step"] == 5 and recipe["resumed_from"].endswith("checkpoint-3"), recipe
    assert_same_saved_weights(straight, out)


def test_accelerate_run_resumed_from_a_checkpoint_gives_the_uninterrupted_weights(tmp_path: Path) -> None:
    argv = [*COMMON, "--checkpointing_steps", "3", "--save_total_limit", "3"]
    straight = tmp_path / "straight"
    assert accelerate_loop.main([*argv, "--output_dir", str(straight), "--keep_checkpoints"]) == 0
    # "Kill" after step 3 (one optimizer step into the second epoch): a fresh run folder holding only that checkpoint
    resumed = tmp_path / "resumed"
    work = tmp_path / "resumed.checkpoints"
    work.mkdir()
    shutil.copytree(tmp_path / "straight.checkpoints" / "step_3", work / "step_3")
    assert accelerate_loop.main([*argv, "--output_dir", str(resumed), "--resume"]) == 0
    recipe = json.loads((resumed / "metrics.json").read_text())["recipe"]
    assert recipe["global_step"] == 5 and recipe["resumed_from"].endswith("step_3"), recipe
    assert_same_saved_weights(straight, resumed)


WORKERS = ["--dataloader_num_workers", "2"]


def epoch_loader(num_workers: int, epoch: int, **loader_kwargs: Any) -> torch.utils.data.DataLoader:
    """A shuffled loader of 20 distinct grids (the order shows in the masked output) in batches of 4, 5 an epoch;
    the epoch's order comes from its own seeded generator, as a seedable sampler's does."""
    return torch.utils.data.DataLoader(
        [{"codes": torch.arange(16) + i} for i in range(20)],
        batch_size=4,
        shuffle=True,
        collate_fn=MaskedCodesCollator(99, (0.0, 0.5), seed=3),
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(epoch),
        **loader_kwargs,
    )


def epoch_masks(num_workers: int, epoch: int, step: int, skip: int = 0) -> list[torch.Tensor]:
    """The masked grids of one epoch of `epoch_loader` as the training loops take it, at 2 batches an optimizer
    step (3 steps an epoch): `skip` batches skipped by accelerate's `skip_first_batches` on a resume, and
    `continue_after(step)` before the iterator starts."""
    loader = epoch_loader(num_workers, epoch)
    batches = skip_first_batches(loader, skip) if skip else loader
    loader.collate_fn.continue_after(step, batches_per_epoch=len(loader), gradient_accumulation_steps=2)
    return [batch["input_ids"] for batch in batches]


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # on a 2-core machine
@pytest.mark.parametrize("num_workers", [2, 3])
def test_masks_with_dataloader_workers_equal_the_masks_without_batch_for_batch(num_workers: int) -> None:
    # epoch 0 (steps 0-2), epoch 1 (steps 3-5), and epoch 1 resumed at step 4 (its first 2 batches skipped); 3
    # workers do not divide the 5 batches of an epoch, nor the 3 left after the skip
    for epoch, step, skip in ((0, 0, 0), (1, 3, 0), (1, 4, 2)):
        alone = epoch_masks(0, epoch, step, skip)
        with_workers = epoch_masks(num_workers, epoch, step, skip)
        assert len(with_workers) == len(alone) == 5 - skip, (len(with_workers), len(alone))
        for k, (a, b) in enumerate(zip(alone, with_workers, strict=True)):
            assert torch.equal(a, b), (
                f"epoch {epoch} from step {step}, batch {k}: {b.tolist()} != {a.tolist()}"
            )
    straight = epoch_masks(0, 1, 3)
    resumed = epoch_masks(num_workers, 1, 4, skip=2)
    assert all(torch.equal(a, b) for a, b in zip(straight[2:], resumed, strict=True)), (
        "resumed ≠ uninterrupted"
    )
    seen = [tuple(m.flatten().tolist()) for m in epoch_masks(num_workers, 0, 0) + straight]
    assert len(set(seen)) == len(seen) == 10, "a batch repeats another's masks"


@pytest.mark.parametrize(
    ("loader_kwargs", "message"),
    [({"persistent_workers": True}, "persistent_workers=True"), ({"in_order": False}, "in_order=False")],
)
def test_loaders_whose_workers_cannot_number_their_batches_are_refused(
    loader_kwargs: dict, message: str
) -> None:
    # a persistent worker keeps the copy of the collator it took at the first epoch; with in_order=False a batch
    # goes to whichever worker has room: in both, a worker cannot tell which batch it collates
    collate = MaskedCodesCollator(99, (0.0, 0.5), seed=3)
    with pytest.raises(ValueError, match=message):
        collate.check_loader(epoch_loader(2, 0, **loader_kwargs))
    collate.check_loader(epoch_loader(2, 0))
    if "in_order" in loader_kwargs:  # without workers any loader is fine
        collate.check_loader(epoch_loader(0, 0, **loader_kwargs))

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([{"codes": torch.arange(16)}] * 4)

    with pytest.raises(ValueError, match=r"dataset=Stream \(an IterableDataset\)"):
        collate.check_loader(torch.utils.data.DataLoader(Stream(), batch_size=2, num_workers=2))


# both loops: (main, checkpoint flags, the folder of the step-3 checkpoint)
LOOPS = {
    "accelerate": (accelerate_loop.main, ["--checkpointing_steps", "3", "--save_total_limit", "3"], "step_3"),
    "trainer": (train.main, ["--save_strategy", "steps", "--save_steps", "3"], "checkpoint-3"),
}


@pytest.mark.parametrize("loop", LOOPS)
def test_a_run_with_dataloader_workers_resumes_to_the_weights_without_workers(
    tmp_path: Path, loop: str
) -> None:
    """The Trainer's is the short variant of the next test: the resume starts from a copy of the uninterrupted
    run's checkpoint."""
    main, flags, checkpoint = LOOPS[loop]
    argv = [*COMMON, *flags]
    alone = tmp_path / "alone"
    assert main([*argv, "--output_dir", str(alone)]) == 0
    straight = tmp_path / "straight"
    assert main([*argv, *WORKERS, "--output_dir", str(straight), "--keep_checkpoints"]) == 0
    assert_same_saved_weights(alone, straight)  # the same masks batch for batch, with or without workers
    resumed = tmp_path / "resumed"
    work = tmp_path / "resumed.checkpoints"
    work.mkdir()
    shutil.copytree(tmp_path / "straight.checkpoints" / checkpoint, work / checkpoint)
    assert main([*argv, *WORKERS, "--output_dir", str(resumed), "--resume"]) == 0
    recipe = json.loads((resumed / "metrics.json").read_text())["recipe"]
    assert recipe["global_step"] == 5 and recipe["resumed_from"].endswith(checkpoint), recipe
    assert_same_saved_weights(straight, resumed)


@pytest.mark.slow
def test_trainer_run_with_dataloader_workers_killed_after_a_save_resumes_to_the_weights_without_workers(
    tmp_path: Path,
) -> None:
    common = [*COMMON, "--save_strategy", "steps", "--save_steps", "2"]
    alone = tmp_path / "alone"
    assert train.main([*common, "--output_dir", str(alone)]) == 0
    straight = tmp_path / "straight"
    assert train.main([*common, *WORKERS, "--output_dir", str(straight)]) == 0
    assert_same_saved_weights(alone, straight)  # the same masks batch for batch, with or without workers

    out = tmp_path / "interrupted"
    script = tmp_path / "kill.py"
    script.write_text(KILL_AFTER_FIRST_SAVE)
    argv = [sys.executable, str(script), *common, *WORKERS, "--output_dir", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 128 + 15, proc.stderr[-3000:]
    checkpoints = sorted(p.name for p in out.with_name("interrupted.checkpoints").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-2", "checkpoint-3"], checkpoints
    # step 3: one optimizer step (2 of the 3 batches) into the second epoch, which the workers start at batch 5
    assert train.main([*common, *WORKERS, "--output_dir", str(out), "--resume"]) == 0
    recipe = json.loads((out / "metrics.json").read_text())["recipe"]
    assert recipe["global_step"] == 5 and recipe["resumed_from"].endswith("checkpoint-3"), recipe
    assert_same_saved_weights(straight, out)
