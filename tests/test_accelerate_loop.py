"""`energyformers train-accelerate`: the plain Accelerate loop (no Trainer), in one process.

Resume: a run continued from its step-2 `save_state` checkpoint ends with the same weights as the
uninterrupted run, with augmentation drawing from torch's generator too; gradient accumulation (4 × 2) matches the unaccumulated batch of 8.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from fixtures import TINY_SPLITS, assert_close_to_scale, cli_config, labelled, rounding, run_stopped_runs
from safetensors.torch import load_file
from transformers import pipeline

from energyformers.training import accelerate_loop

COMMON = [
    "--dataset",
    "digits",
    *TINY_SPLITS,
    "--num_threads",
    "1",
    "--num_predictions",
    "0",
    "--warmup_ratio",
    "0",
]


def tiny(family: str = "hyperset") -> list[str]:
    return ["--config", *cli_config(family)]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_loop_writes_a_model_folder_that_pipeline_loads(tmp_path: Path) -> None:
    out = tmp_path / "acc"
    assert (
        accelerate_loop.main(
            [*COMMON, *tiny(), "--max_steps", "3", "--batch_size", "8", "--output_dir", str(out)]
        )
        == 0
    )
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
        "metrics.json",
        "training_curve.png",
        "README.md",
    } <= names
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"]["global_step"] == 3 and metrics["recipe"]["world_size"] == 1
    assert 0 <= metrics["test"]["accuracy"] <= 1 and "f1_macro" in metrics["test"]
    from PIL import Image

    assert pipeline("image-classification", model=str(out))(Image.new("L", (8, 8)))[0]["label"] in {
        str(i) for i in range(10)
    }


# augmentation that draws from torch's global generator in every step (RandAugment, mixup)
AUGMENTED = ["--rand_augment_ops", "2", "--mixup_alpha", "0.8"]


@pytest.mark.parametrize(
    ("extra", "resumed_at"),
    [([], 2), (AUGMENTED, 2), (AUGMENTED, 4)],
    ids=["plain", "augmented-mid-epoch", "augmented-epoch-start"],
)
def test_resume_from_saved_state_matches_the_uninterrupted_run(
    tmp_path: Path, extra: list[str], resumed_at: int
) -> None:
    """4 steps an epoch: step 2 is inside the first epoch, step 4 at the second one's start."""
    argv = [*COMMON, *tiny(), "--max_steps", "6", "--batch_size", "8", "--checkpointing_steps", "2", *extra]
    argv += ["--save_total_limit", "3"]  # keep step_2 (as Trainer, the loop keeps the last 2 by default)
    straight = tmp_path / "straight"
    assert accelerate_loop.main([*argv, "--output_dir", str(straight), "--keep_checkpoints"]) == 0
    # "Kill" after that step: a fresh run folder holding only that checkpoint of the first run.
    resumed = tmp_path / "resumed"
    work = tmp_path / "resumed.checkpoints"
    work.mkdir()
    name = f"step_{resumed_at}"
    shutil.copytree(tmp_path / "straight.checkpoints" / name, work / name)
    assert accelerate_loop.main([*argv, "--output_dir", str(resumed)]) == 2  # refuses without --resume
    assert accelerate_loop.main([*argv, "--output_dir", str(resumed), "--resume"]) == 0
    metrics = json.loads((resumed / "metrics.json").read_text())
    assert metrics["recipe"]["global_step"] == 6 and metrics["recipe"]["resumed_from"].endswith(name)
    a, b = weights(straight), weights(resumed)
    for key in a:
        # exact: the same seed, restored optimizer, scheduler and RNG state and data order, one thread: the same
        # float operations in the same order as the uninterrupted run; with augmentation, torch's generator must
        # stand where it stood in the uninterrupted run at every draw
        torch.testing.assert_close(b[key], a[key], atol=0, rtol=0, msg=labelled(key))


# Run as a script, one stopped run after the other in one process (each a fresh process's worth of imports
# otherwise): argv[1], a JSON list of [during, argv]; SIGTERM (a real signal) while step 2 trains ("training"; step 2
# ends at an evaluation step) or at the first batch of its evaluation ("evaluation"); argv[2] gets each run's exit
# status and the number of evaluation batches it ran. Each run's output follows a line `===== <index>` on stderr.
STOP_AROUND_AN_EVALUATION = """
import json, os, signal, sys
from energyformers.training import accelerate_loop

train_steps, eval_batches, during = [], [], [None]
train_step, sample_losses = accelerate_loop.train_step, accelerate_loop.sample_losses

def counting_train_step(*args, **kwargs):
    train_steps.append(1)
    if during[0] == "training" and len(train_steps) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    return train_step(*args, **kwargs)

def counting_sample_losses(*args, **kwargs):  # once per evaluation batch
    eval_batches.append(1)
    if during[0] == "evaluation" and len(eval_batches) == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return sample_losses(*args, **kwargs)

accelerate_loop.train_step, accelerate_loop.sample_losses = counting_train_step, counting_sample_losses
records = []
for index, (name, argv) in enumerate(json.loads(sys.argv[1])):
    train_steps.clear(), eval_batches.clear()
    during[0] = name
    print(f"===== {index}", file=sys.stderr, flush=True)
    status = accelerate_loop.main(argv)
    sys.stderr.flush()
    records.append({"status": status, "eval_batches": len(eval_batches)})
open(sys.argv[2], "w").write(json.dumps(records))
"""


# evaluations every 2 steps of 6: a stop at step 2, in its training or in its evaluation
STOP_ARGV = [*COMMON, *tiny(), "--max_steps", "6", "--batch_size", "8", "--per_device_eval_batch_size", "4"]
STOP_ARGV += ["--eval_strategy", "steps", "--eval_steps", "2", "--save_steps", "4", "--disable_tqdm"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output folder of the uninterrupted run of `STOP_ARGV`, which both stops resume to: trained once."""
    out = tmp_path_factory.mktemp("uninterrupted") / "straight"
    assert accelerate_loop.main([*STOP_ARGV, "--output_dir", str(out)]) == 0
    return out


STOPS = ["training", "evaluation"]


@pytest.fixture(scope="module")
def stopped_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, str, Path]]:
    """during -> (the record, the part of stderr and the output folder of its stopped run of `STOP_ARGV`), both
    runs in one process. Each run is one test's: the test resumes it in place."""
    root = tmp_path_factory.mktemp("stopped")
    outs = {during: root / during / "run" for during in STOPS}
    plan = [[during, [*STOP_ARGV, "--output_dir", str(outs[during])]] for during in STOPS]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    runs = run_stopped_runs(STOP_AROUND_AN_EVALUATION, plan, root, env, timeout=600)
    return {
        during: (record, stderr, outs[during]) for during, (record, stderr) in zip(STOPS, runs, strict=True)
    }


@pytest.mark.parametrize(("during", "batches"), [("training", 0), ("evaluation", 1)])
def test_a_stop_at_an_evaluation_step_does_not_wait_for_the_evaluation(
    stopped_runs: dict[str, tuple[dict, str, Path]], uninterrupted: Path, during: str, batches: int
) -> None:
    """As in `train`: the evaluation after the stop step does not start, one in progress ends at its next batch
    (of 4), unlogged; the step just trained is checkpointed and the run resumes from it."""
    argv = list(STOP_ARGV)
    recorded, stderr, out = stopped_runs[during]
    assert recorded["status"] == 128 + 15, stderr[-3000:]
    assert "stopped by SIGTERM at step 2" in stderr and "--resume" in stderr, stderr[-3000:]
    assert recorded["eval_batches"] == batches, (
        f"evaluation batches run: {recorded['eval_batches']}, expected {batches}"
    )
    work = out.with_name("run.checkpoints")
    assert sorted(p.name for p in work.glob("step_*")) == ["step_2"], sorted(p.name for p in work.iterdir())
    history = json.loads((work / "step_2" / accelerate_loop.STATE_FILE).read_text())["history"]
    assert not [entry for entry in history if any(key.startswith("eval_") for key in entry)], history

    assert accelerate_loop.main([*argv, "--output_dir", str(out), "--resume"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"]["resumed_from"].endswith("step_2"), metrics["recipe"]
    a, b = weights(uninterrupted), weights(out)
    for key in a:  # exact, as after a stop between evaluations (`test_resume_from_saved_state_...`)
        torch.testing.assert_close(b[key], a[key], atol=0, rtol=0, msg=labelled(key))


@pytest.mark.parametrize(
    ("during", "max_steps", "where"),
    [
        ("a save step", 4, "at step 2"),
        ("the final evaluation", 2, "in the final evaluation after the last step (2)"),
    ],
    ids=["save-step", "final-evaluation"],
)
def test_a_stop_right_after_a_checkpoint_does_not_save_it_again(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    during: str,
    max_steps: int,
    where: str,
) -> None:
    """The stop's checkpoint is the slowest thing a stop does, inside a preemption's grace period: a stop in step 2
    of `--save_steps 2`, or in the final evaluation (the last step saved before it), saves that step once. In this
    process: SIGTERM to itself, with a handler of the test's below the loop's, which only a loop that left its own
    uninstalled would reach."""
    argv = [*COMMON, *tiny(), "--max_steps", str(max_steps), "--batch_size", "8"]
    argv += ["--per_device_eval_batch_size", "4", "--eval_strategy", "no", "--save_strategy", "steps"]
    argv += ["--save_steps", "2", "--disable_tqdm"]
    train_steps, eval_batches, saves, unhandled = [], [], [], []
    train_step, sample_losses = accelerate_loop.train_step, accelerate_loop.sample_losses
    save_checkpoint = accelerate_loop.save_checkpoint

    def counting_train_step(*args, **kwargs):
        train_steps.append(1)
        if during == "a save step" and len(train_steps) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return train_step(*args, **kwargs)

    def counting_sample_losses(*args, **kwargs):  # once per evaluation batch
        eval_batches.append(1)
        if during == "the final evaluation" and len(eval_batches) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return sample_losses(*args, **kwargs)

    def counting_save_checkpoint(parts, state):
        saves.append(state.step)
        return save_checkpoint(parts, state)

    monkeypatch.setattr(accelerate_loop, "train_step", counting_train_step)
    monkeypatch.setattr(accelerate_loop, "sample_losses", counting_sample_losses)
    monkeypatch.setattr(accelerate_loop, "save_checkpoint", counting_save_checkpoint)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: unhandled.append(signum))
    try:
        status = accelerate_loop.main([*argv, "--output_dir", str(tmp_path / "run")])
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = capsys.readouterr().err
    assert status == 128 + 15 and not unhandled, (status, unhandled, err[-3000:])
    assert f"stopped by SIGTERM {where}" in err, err[-3000:]
    assert saves == [2], f"checkpoints saved at steps {saves}, expected [2]"


def test_gradient_accumulation_matches_the_full_batch(tmp_path: Path) -> None:
    # a fixed depth: with random depth each micro-batch would draw its own (the default draws per forward)
    base = [*COMMON, *tiny(), "--max_steps", "3", "--iteration_sampling", "fixed"]
    assert accelerate_loop.main([*base, "--batch_size", "8", "--output_dir", str(tmp_path / "full")]) == 0
    acc = ["--batch_size", "4", "--gradient_accumulation_steps", "2", "--output_dir", str(tmp_path / "acc")]
    assert accelerate_loop.main([*base, *acc]) == 0
    a, b = weights(tmp_path / "full"), weights(tmp_path / "acc")
    for key in a:
        # 3 Adam steps from a gradient whose batch mean is summed as 8 or as 2 × 4 samples: the weights' own
        # roundings plus the update's, which Adam passes on relative to lr < 1; 64 roundings of the weights' scale
        assert_close_to_scale(b[key], a[key], rounding(torch.float32, 64), key)
    losses = [
        json.loads((tmp_path / d / "metrics.json").read_text())["train"]["train_loss"]
        for d in ("full", "acc")
    ]
    # the mean of 3 float32 losses over the same samples summed in another order, after weights that differ
    # by rounding (above): 64 roundings, relative
    assert losses[1] == pytest.approx(losses[0], rel=rounding(torch.float32, 64))


def test_fp16_on_cpu_is_refused_before_training(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("fp16 is allowed on GPUs")
    assert (
        accelerate_loop.main([*COMMON, "--mixed_precision", "fp16", "--output_dir", str(tmp_path / "x")]) == 2
    )
    assert "fp16 needs a GPU" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_both_loops_announce_a_run_alike(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """One banner (`setup.announce_run`): the same line naming the model, its parameter count, the splits and the
    processes, then the same warnings, from the Accelerate loop and from Trainer's."""
    from energyformers.training import train

    argv = [*COMMON, *tiny(), "--max_steps", "1", "--batch_size", "8", "--disable_tqdm"]
    seen = {}
    for name, main in (("accelerate", accelerate_loop.main), ("trainer", train.main)):
        capsys.readouterr()
        assert main([*argv, "--output_dir", str(tmp_path / name)]) == 0
        out, err = capsys.readouterr()
        banner = [line for line in out.splitlines() if " parameters; digits: " in line]
        warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
        seen[name] = (banner, warnings)
    banner, warnings = seen["accelerate"]
    assert len(banner) == 1 and banner[0].endswith("; 1 process(es)"), seen
    assert banner[0].startswith("hyperset HyperSetForImageClassification: "), seen
    assert warnings, seen  # 16 validation / test examples: the small-split warnings
    assert seen["trainer"] == seen["accelerate"], seen


# ------------------------------------------------------------------ RNG states of a resume


def draws() -> tuple:
    """One draw of each global generator `rng_states` reads on a CPU machine."""
    import random

    import numpy as np

    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


class StandInDevice:
    """An accelerator's generator module as Trainer uses it (`get_rng_state_all` / `set_rng_state_all`): one
    counter per device, which a draw advances."""

    def __init__(self) -> None:
        self.states = [torch.tensor([0]), torch.tensor([7])]
        self.set_to: list | None = None

    def get_rng_state_all(self) -> list:
        return [state.clone() for state in self.states]

    def set_rng_state_all(self, states: list) -> None:
        self.set_to = states
        self.states = [state.clone() for state in states]


def test_rng_states_round_trip_with_every_accelerator_generator_and_tolerate_old_records(monkeypatch):
    """The states read are set back exactly: Python's, numpy's, torch's CPU generator, and an accelerator's (here a
    stand-in for an NPU, one of the devices Trainer saves); a record without a key (an older checkpoint's, or one
    made where that device was absent) leaves that generator as it is."""
    npu = StandInDevice()
    monkeypatch.setattr(accelerate_loop, "device_generators", lambda: {"npu": npu})
    states = accelerate_loop.rng_states()
    assert set(states) == {"random", "numpy", "torch", "npu"}, sorted(states)
    first = draws()
    npu.states = [state + 1 for state in npu.states]  # the device's generator advances too
    accelerate_loop.set_rng_states(states)
    assert draws() == first, "the CPU generators did not return to the saved states"
    assert [int(s) for s in npu.states] == [0, 7], npu.states
    npu.set_to = None
    older = {key: value for key, value in states.items() if key != "npu"}
    accelerate_loop.set_rng_states(older)
    assert npu.set_to is None and draws() == first, npu.set_to


def test_the_accelerator_generators_are_those_trainer_saves():
    """`device_generators` knows the accelerators whose generators the installed transformers' Trainer saves
    (`_save_rng_state`'s keys beyond Python's, numpy's and the CPU's)."""
    import inspect
    import re

    from transformers import Trainer

    saved = set(re.findall(r'rng_states\["(\w+)"\]', inspect.getsource(Trainer._save_rng_state)))
    assert saved - {"python", "numpy", "cpu"} == set(accelerate_loop.DEVICE_GENERATORS), sorted(saved)


def test_both_loops_record_no_token(tmp_path: Path) -> None:
    """`--hub_token` (whole and abbreviated, `--flag VALUE` and `--flag=VALUE`) is in no file either loop writes,
    the work folder's kept too (metrics.json and the card record the command; `push` uploads them): the command
    shows it as transformers' `TrainingArguments.to_dict` does."""
    from energyformers.training import train
    from energyformers.training.arguments import REDACTED, work_folder
    from energyformers.training.setup import RUN_ARGUMENTS_FILE

    secrets = ["hf_SECRETseparate", "hf_SECRETequals"]
    argv = [*COMMON, *tiny(), "--max_steps", "1", "--batch_size", "8", "--disable_tqdm", "--keep_checkpoints"]
    argv += ["--save_steps", "1", "--hub_token", secrets[0], f"--hub-tok={secrets[1]}"]
    for name, main in (("accelerate", accelerate_loop.main), ("trainer", train.main)):
        out = tmp_path / name
        assert main([*argv, "--output_dir", str(out)]) == 0, name
        files = [p for folder in (out, work_folder(out)) for p in folder.rglob("*") if p.is_file()]
        assert work_folder(out) / RUN_ARGUMENTS_FILE in files, files  # the run record (its argv) was checked
        leaks = [str(p) for p in files for secret in secrets if secret.encode() in p.read_bytes()]
        assert leaks == [], leaks
        command = json.loads((out / "metrics.json").read_text())["recipe"]["command"]
        assert f"--hub_token '{REDACTED}' '--hub-tok={REDACTED}'" in command, command
