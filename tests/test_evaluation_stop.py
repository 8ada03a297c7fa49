"""A stop request (SIGTERM / Ctrl-C, `training.interrupt`) in the passes of an evaluation that Trainer's prediction
loop does not run: the accuracy at each depth (`evaluation.depth_metrics`) and the MaskGIT decoding metrics
(`evaluation.masked_image_metrics`) end at their next batch; and in the final evaluations after training, which
end the same way, leave the last step's checkpoint and resume to the uninterrupted run's folder, in both loops.

Real signals throughout (`os.kill` of the process itself, the handlers `StopRequest.installed` sets).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures import TINY_SPLITS, cli_config, labelled
from safetensors.torch import load_file

from energyformers.training.interrupt import EvaluationStopped, StopRequest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def tiny_classifier():
    from energyformers import HyperSetConfig, HyperSetForImageClassification

    torch.manual_seed(0)
    config = HyperSetConfig(
        image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_attention_heads=2,
        intermediate_size=32, time_embedding_dim=16, num_iterations=2, num_labels=3,
    )  # fmt: skip
    return HyperSetForImageClassification(config).eval()


def test_the_depth_pass_ends_at_its_next_batch() -> None:
    """SIGTERM during the first of 4 batches (3 depths each): the pass stops after that batch, the model's mode
    restored; without a stop request it runs every batch."""
    from energyformers.training.evaluation import depth_metrics

    model = tiny_classifier().train()
    generator = torch.Generator().manual_seed(0)
    batches = [
        {"pixel_values": torch.rand(2, 1, 8, 8, generator=generator), "labels": torch.tensor([0, 1])}
        for _ in range(4)
    ]
    forwards, signalled = [], []
    forward = model.forward

    def counting_forward(*args, **kwargs):
        forwards.append(kwargs["num_iterations"])
        if not signalled:
            signalled.append(os.kill(os.getpid(), signal.SIGTERM))
        return forward(*args, **kwargs)

    model.forward = counting_forward
    stop = StopRequest()
    with stop.installed(announce=False), pytest.raises(EvaluationStopped):
        depth_metrics(model, batches, lambda x: x, "image-classification", [1, 2, 4], "eval_", stop=stop)
    assert forwards == [1, 2, 4], f"depth forwards run {forwards}; expected the first batch's [1, 2, 4]"
    assert model.training and stop.signum == signal.SIGTERM

    forwards.clear()
    metrics = depth_metrics(
        model, batches, lambda x: x, "image-classification", [1, 2, 4], stop=StopRequest()
    )
    assert len(forwards) == 12 and sorted(metrics) == [f"accuracy_iterations_{t}" for t in (1, 2, 4)], (
        forwards,
        metrics,
    )


def test_the_decoding_metrics_end_at_their_next_batch() -> None:
    """SIGTERM during the first of 4 decoded batches: decoding stops after it, the model's mode restored."""
    from test_mim_metrics import tiny_mim

    from energyformers.mim import mask_codes
    from energyformers.training.evaluation import masked_image_metrics

    model, tokenizer, pixels = tiny_mim()
    model.train()
    codes = tokenizer.encode(pixels[:16])
    inputs, _ = mask_codes(codes, model.mask_token_id, 0.4, generator=torch.Generator().manual_seed(0))
    decoded = []
    decode = model.decode

    def counting_decode(batch, **kwargs):
        decoded.append(len(batch))
        if len(decoded) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return decode(batch, **kwargs)

    model.decode = counting_decode
    stop = StopRequest()
    with stop.installed(announce=False), pytest.raises(EvaluationStopped):
        masked_image_metrics(model, inputs, codes, pixels[:16], tokenizer, 2, batch_size=4, stop=stop)
    assert decoded == [4], f"batches decoded (their sizes) {decoded}; expected the first one, [4]"
    assert model.training


# One process runs the stopped runs of every test below, one after the other (each a fresh process's worth of
# imports otherwise). argv[1]: a JSON list of [during, loop, argv] and argv[2]: a file for each run's exit status
# and the number of the counted forwards it ran. During "depths" SIGTERM comes at the first forward of the depth
# pass of the step-2 evaluation (the only forwards with `num_iterations`); during "final", at the first evaluation
# forward after training (eval strategy "no"). Each run's output follows a line `===== <during> <loop>` on stderr.
STOP_IN_AN_EVALUATION = """
import functools, json, os, signal, sys
from energyformers import HyperSetForImageClassification
from energyformers.training import accelerate_loop, train

seen, trained, during = [], [], [None]
forward = HyperSetForImageClassification.forward

@functools.wraps(forward)  # its signature: Trainer passes what forward takes
def counting_forward(self, *args, **kwargs):
    trained.append(self.training)  # an eval-mode forward before training is the setup's
    final = during[0] == "final" and not self.training and any(trained)
    if final or (during[0] == "depths" and "num_iterations" in kwargs):
        seen.append(1)
        if len(seen) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal
    return forward(self, *args, **kwargs)

HyperSetForImageClassification.forward = counting_forward
results = []
for name, loop, argv in json.loads(sys.argv[1]):
    seen.clear(), trained.clear()
    during[0] = name
    print(f"===== {name} {loop}", file=sys.stderr, flush=True)
    main = {"train": train.main, "train-accelerate": accelerate_loop.main}[loop]
    results.append({"status": main(argv), "forwards": len(seen)})
    sys.stderr.flush()
open(sys.argv[2], "w").write(json.dumps(results))
"""


LOOPS = ["train", "train-accelerate"]
COMMON = [
    "--dataset", "digits", "--config", *cli_config("hyperset"), *TINY_SPLITS, "--batch_size", "8",
    "--per_device_eval_batch_size", "4", "--num_predictions", "0", "--num_threads", "1", "--disable_tqdm",
]  # fmt: skip
# the depth-pass test's run: an evaluation every 2 steps of 6
DEPTHS = [*COMMON, "--max_steps", "6", "--eval_strategy", "steps", "--eval_steps", "2", "--save_steps", "4"]
# the final-evaluation test's run: 4 steps, no evaluation or save before the end
FINAL = [*COMMON, "--max_steps", "4", "--eval_strategy", "no", "--save_strategy", "no"]
FINAL += ["--logging_steps", "1"]


@dataclasses.dataclass
class Stopped:
    """One stopped run of `STOP_IN_AN_EVALUATION`: its exit status, its part of the process's stderr, the counted
    forwards it ran and its output folder."""

    status: int
    stderr: str
    forwards: int
    out: Path


@pytest.fixture(scope="module")
def stopped_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Stopped]:
    """(during, loop) -> the stopped run, for "depths" and "final" in both loops, all in one process. Each run is
    one test's: the final-evaluation test resumes its run in place."""
    root = tmp_path_factory.mktemp("stopped")
    runs = {}
    for during, argv in (("depths", DEPTHS), ("final", FINAL)):
        for loop in LOOPS:
            runs[during, loop] = [*argv, "--output_dir", str(root / during / loop / "run")]
    script, seen = root / "stop.py", root / "seen.json"
    script.write_text(STOP_IN_AN_EVALUATION)
    plan = json.dumps([[during, loop, argv] for (during, loop), argv in runs.items()])
    proc = subprocess.run(
        [sys.executable, str(script), plan, str(seen)], capture_output=True, text=True, env=ENV, timeout=900
    )
    assert proc.returncode == 0 and seen.is_file(), (proc.returncode, proc.stderr[-3000:])
    results = json.loads(seen.read_text())
    parts = re.split(r"^===== (\S+) (\S+)\n", proc.stderr, flags=re.M)[1:]
    stderr = {(parts[i], parts[i + 1]): parts[i + 2] for i in range(0, len(parts), 3)}
    assert list(stderr) == list(runs), (list(stderr), proc.stderr[-3000:])
    return {
        key: Stopped(result["status"], stderr[key], result["forwards"], root / key[0] / key[1] / "run")
        for key, result in zip(runs, results, strict=True)
    }


def measured(metrics: dict) -> dict:
    """The metrics of a split without its timings."""
    return {k: v for k, v in metrics.items() if "runtime" not in k and "per_second" not in k}


@pytest.mark.parametrize("loop", LOOPS)
def test_a_stop_in_the_depth_pass_of_an_evaluation_during_training_ends_it(
    stopped_runs: dict[tuple[str, str], Stopped], loop: str
) -> None:
    """The depth pass (3 depths a batch, 4 batches) ends after the batch the signal came in; the run stops at the
    step it evaluated, with none of that evaluation's metrics logged (Trainer's pass had finished)."""
    run = stopped_runs["depths", loop]
    out, forwards = run.out, run.forwards
    assert run.status == 128 + 15, run.stderr[-3000:]
    assert "stopped by SIGTERM at step 2" in run.stderr, run.stderr[-3000:]
    assert forwards == 3, f"depth-pass forwards run: {forwards}; expected 3 (one batch at T/2, T, 2T)"
    work = out.with_name("run.checkpoints")
    if loop == "train":
        history = json.loads((work / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    else:
        history = json.loads((work / "step_2" / "loop_state.json").read_text())["history"]
    logged = [entry for entry in history if any(key.startswith("eval_") for key in entry)]
    assert not logged, logged


@pytest.mark.parametrize("loop", LOOPS)
def test_a_stop_in_the_final_evaluation_resumes_to_the_uninterrupted_folder(
    tmp_path: Path, stopped_runs: dict[tuple[str, str], Stopped], loop: str
) -> None:
    """After the last step (4), SIGTERM at the first batch of the validation evaluation: it ends at its next
    batch, the command exits 143 saying so, the last step is checkpointed (with `--save_strategy no` too) and no
    model folder is written; `--resume` runs only the final evaluations and writes the folder the uninterrupted
    run writes: the same weights and metrics."""
    argv = FINAL
    run = stopped_runs["final", loop]
    out, forwards = run.out, run.forwards
    assert run.status == 128 + 15, (run.status, run.stderr[-3000:])
    assert "stopped by SIGTERM in the final evaluation after the last step (4)" in run.stderr, run.stderr[
        -3000:
    ]
    assert "--resume" in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert forwards == 1, f"evaluation forwards run: {forwards}; expected 1 (the batch the signal came in)"
    assert not out.exists()
    work = out.with_name("run.checkpoints")
    pattern = "checkpoint-*" if loop == "train" else "step_*"
    assert [p.name for p in work.glob(pattern)] == ["checkpoint-4" if loop == "train" else "step_4"]

    from energyformers.training import accelerate_loop, train

    main = {"train": train.main, "train-accelerate": accelerate_loop.main}[loop]
    assert main([*argv, "--output_dir", str(out), "--resume"]) == 0
    assert main([*argv, "--output_dir", str(tmp_path / "straight")]) == 0
    resumed = json.loads((out / "metrics.json").read_text())
    straight = json.loads((tmp_path / "straight" / "metrics.json").read_text())
    assert resumed["recipe"]["global_step"] == 4 and resumed["recipe"]["resumed_from"], resumed["recipe"]
    # the same weights evaluated on the same data in the same order, one thread: the same numbers exactly
    for split in ("eval", "test"):
        a, b = (measured(metrics[split]) for metrics in (resumed, straight))
        assert a == b and "loss" in a, (split, a, b)
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(out / "model.safetensors")
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=0, rtol=0, msg=labelled(key))


# 6 steps of 4 a epoch: the last step ends mid-epoch; a checkpoint every 3 steps, so one at the last step. The EMA
# makes a step run after the last one change the saved weights (the learning rate there is 0).
MID_EPOCH = [*COMMON, "--max_steps", "6", "--eval_strategy", "no", "--save_strategy", "steps"]
MID_EPOCH += ["--save_steps", "3", "--ema_decay", "0.5"]


@pytest.mark.parametrize("loop", LOOPS)
def test_a_resume_from_the_last_step_mid_epoch_trains_no_step(tmp_path: Path, loop: str) -> None:
    """`--resume` from the checkpoint of the last step (what a stop in the final evaluations, or after them,
    leaves; here the uninterrupted run's, kept with `--keep_checkpoints`) when that step ends mid-epoch: no step
    is trained, and the folder holds the uninterrupted run's weights and metrics at global step 6 of 6."""
    import shutil

    from energyformers.training import accelerate_loop, train

    main = {"train": train.main, "train-accelerate": accelerate_loop.main}[loop]
    straight = tmp_path / "straight"
    assert main([*MID_EPOCH, "--output_dir", str(straight), "--keep_checkpoints"]) == 0
    last = "checkpoint-6" if loop == "train" else "step_6"
    out, work = tmp_path / "resumed", tmp_path / "resumed.checkpoints"
    work.mkdir()
    shutil.copytree(tmp_path / "straight.checkpoints" / last, work / last)
    for record in (tmp_path / "straight.checkpoints").glob("*.json"):
        shutil.copy(record, work)
    assert main([*MID_EPOCH, "--output_dir", str(out), "--resume"]) == 0
    resumed = json.loads((out / "metrics.json").read_text())
    first = json.loads((straight / "metrics.json").read_text())
    recipe = resumed["recipe"]
    assert recipe["global_step"] == 6 and recipe["resumed_from"].endswith(last), recipe
    saved = resumed["saved_weights"], first["saved_weights"]
    assert saved[0] == saved[1], saved
    for split in ("eval", "test"):
        a, b = (measured(metrics[split]) for metrics in (resumed, first))
        assert a == b and "loss" in a, (split, a, b)
    a, b = load_file(straight / "model.safetensors"), load_file(out / "model.safetensors")
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=0, rtol=0, msg=labelled(key))
