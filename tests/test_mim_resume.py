"""A resumed masked-image-modelling run equals an uninterrupted one, in both training loops: the training masks
(`data.MaskedCodesCollator`) continue where the interrupted run stopped, like the data order and the RNG states.

The runs cross an epoch boundary with a partial accumulation window at the epoch's end (48 training grids in
batches of 16 with 2 batches per optimizer step: 3 batches, 2 optimizer steps an epoch), so the resumed position in
the mask stream must count the batches of whole epochs, not optimizer steps × accumulation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from test_train_cli import KILL_AFTER_FIRST_SAVE

from energyformers.training import accelerate_loop, train

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


def assert_same_weights(straight: Path, resumed: Path) -> None:
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for key in (
        a
    ):  # same seed, restored optimizer/scheduler/RNG state, data order and masks: equal to float rounding
        torch.testing.assert_close(b[key], a[key], atol=1e-6, rtol=1e-5, msg=lambda m, key=key: f"{key}: {m}")


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
    assert_same_weights(straight, out)


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
    assert_same_weights(straight, resumed)
