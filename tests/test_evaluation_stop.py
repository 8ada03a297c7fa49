"""A stop request (SIGTERM / Ctrl-C, `training.interrupt`) in the passes of an evaluation that Trainer's prediction
loop does not run: the accuracy at each depth (`evaluation.depth_metrics`) and the MaskGIT decoding metrics
(`evaluation.masked_image_metrics`) end at their next batch; and in the final evaluations after training, which
end the same way, leave the last step's checkpoint and resume to the uninterrupted run's folder, in both loops.

Real signals throughout (`os.kill` of the process itself, the handlers `StopRequest.installed` sets).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures import cli_config, labelled
from safetensors.torch import load_file

from energyformers.training.interrupt import EvaluationStopped, StopRequest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
SUBSET = ["--max_train_samples", "32", "--max_eval_samples", "16", "--max_test_samples", "16"]


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


# argv[1]: "depths", SIGTERM at the first forward of the depth pass of the step-2 evaluation (the only forwards
# with `num_iterations`), or "final", at the first evaluation forward after training (eval strategy "no");
# argv[2]: the loop; argv[3]: a file for the number of those forwards run
STOP_IN_AN_EVALUATION = """
import functools, json, os, signal, sys
from energyformers import HyperSetForImageClassification
from energyformers.training import accelerate_loop, train

seen, trained = [], []
forward = HyperSetForImageClassification.forward

@functools.wraps(forward)  # its signature: Trainer passes what forward takes
def counting_forward(self, *args, **kwargs):
    trained.append(self.training)  # an eval-mode forward before training is the setup's
    final = sys.argv[1] == "final" and not self.training and any(trained)
    if final or (sys.argv[1] == "depths" and "num_iterations" in kwargs):
        seen.append(1)
        if len(seen) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal
    return forward(self, *args, **kwargs)

HyperSetForImageClassification.forward = counting_forward
main = {"train": train.main, "train-accelerate": accelerate_loop.main}[sys.argv[2]]
status = main(sys.argv[4:])
open(sys.argv[3], "w").write(json.dumps(len(seen)))
sys.exit(status)
"""


def stopped_run(
    tmp_path: Path, during: str, loop: str, argv: list[str]
) -> tuple[subprocess.CompletedProcess, int]:
    """Run `loop` on `argv` with the signal of `STOP_IN_AN_EVALUATION`; its process and the forwards counted."""
    script, seen = tmp_path / "stop.py", tmp_path / "seen.json"
    script.write_text(STOP_IN_AN_EVALUATION)
    command = [sys.executable, str(script), during, loop, str(seen), *argv]
    proc = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    return proc, json.loads(seen.read_text()) if seen.is_file() else -1


LOOPS = ["train", "train-accelerate"]


def measured(metrics: dict) -> dict:
    """The metrics of a split without its timings."""
    return {k: v for k, v in metrics.items() if "runtime" not in k and "per_second" not in k}


@pytest.mark.parametrize("loop", LOOPS)
def test_a_stop_in_the_depth_pass_of_an_evaluation_during_training_ends_it(tmp_path: Path, loop: str) -> None:
    """The depth pass (3 depths a batch, 4 batches) ends after the batch the signal came in; the run stops at the
    step it evaluated, with none of that evaluation's metrics logged (Trainer's pass had finished)."""
    out = tmp_path / "run"
    argv = ["--dataset", "digits", "--config", *cli_config("hyperset"), *SUBSET, "--max_steps", "6"]
    argv += ["--eval_strategy", "steps", "--eval_steps", "2", "--save_steps", "4", "--batch_size", "8"]
    argv += ["--per_device_eval_batch_size", "4", "--num_predictions", "0", "--num_threads", "1"]
    argv += ["--disable_tqdm", "--output_dir", str(out)]
    proc, forwards = stopped_run(tmp_path, "depths", loop, argv)
    assert proc.returncode == 128 + 15, proc.stderr[-3000:]
    assert "stopped by SIGTERM at step 2" in proc.stderr, proc.stderr[-3000:]
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
    tmp_path: Path, loop: str
) -> None:
    """After the last step (4), SIGTERM at the first batch of the validation evaluation: it ends at its next
    batch, the command exits 143 saying so, the last step is checkpointed (with `--save_strategy no` too) and no
    model folder is written; `--resume` runs only the final evaluations and writes the folder the uninterrupted
    run writes: the same weights and metrics."""
    argv = ["--dataset", "digits", "--config", *cli_config("hyperset"), *SUBSET, "--max_steps", "4"]
    argv += ["--eval_strategy", "no", "--save_strategy", "no", "--batch_size", "8"]
    argv += ["--per_device_eval_batch_size", "4", "--num_predictions", "0", "--num_threads", "1"]
    argv += ["--logging_steps", "1", "--disable_tqdm"]
    out = tmp_path / "run"
    proc, forwards = stopped_run(tmp_path, "final", loop, [*argv, "--output_dir", str(out)])
    assert proc.returncode == 128 + 15, (proc.returncode, proc.stderr[-3000:])
    assert "stopped by SIGTERM in the final evaluation after the last step (4)" in proc.stderr, proc.stderr[
        -3000:
    ]
    assert "--resume" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
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
