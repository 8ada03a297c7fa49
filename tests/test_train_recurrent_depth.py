"""Recurrent-depth flags of both training loops:

* `--iteration_conditioning`, `--iteration_sampling`, `--min_iterations`, `--max_iterations` and
  `--backprop_iterations` reach the saved `config.json` in `energyformers train` and `train-accelerate`;
* bad values (and the flags on families without recurrent depth) fail before training with an error naming the
  flag and leave no output folder;
* the sampled depth of every step is the same on both ranks of a real 2-process (torchrun) run;
* a resumed run continues the sequence of sampled depths where the interrupted one stopped.

The depth a training forward ran is measured, not read from the config: a global forward pre-hook counts the
calls of the weight-tied layer between two calls of the backbone.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fixtures import cli_config, run_launcher

import energyformers
from energyformers import HyperSetConfig
from energyformers.modeling.modeling_hyperset import HyperSetLayer, HyperSetModel, sample_num_iterations
from energyformers.training import accelerate_loop, train

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
TINY = cli_config("hyperset")  # num_iterations=2, one layer
LOOPED_TINY_FLAGS = ["hidden_size=16", "num_attention_heads=4", "intermediate_size=24", "num_iterations=2"]
SUBSET = ["--max_train_samples", "32", "--max_eval_samples", "8", "--max_test_samples", "8"]
LOOPS = {"train": train.main, "train-accelerate": accelerate_loop.main}
# uniform depth in 1..6 around T = 2: the draws of the first steps differ (asserted where it matters)
SAMPLING = ["--iteration_sampling", "uniform", "--min_iterations", "1", "--max_iterations", "6"]


def run_seed(out: Path) -> int:
    """The `--seed` a finished run folder records: the seed of its depth draws."""
    return json.loads((out / "metrics.json").read_text())["arguments"]["run"]["seed"]


def loop_argv(loop: str, *argv: object, config: list[str] = TINY) -> list[str]:
    """Digits subset, a tiny model, no predictions; `train` also without progress bars."""
    quick = [
        "--dataset",
        "digits",
        "--config",
        *config,
        *SUBSET,
        "--num_predictions",
        "0",
        "--num_threads",
        "1",
    ]
    return [*quick, *(["--disable_tqdm"] if loop == "train" else []), *[str(a) for a in argv]]


class DepthRecorder:
    """Global forward pre-hook: the depth of every training forward of a Hyper-SET backbone in this process."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []  # per training forward: [calls of the weight-tied layers, layers]

    def __call__(self, module: torch.nn.Module, args: tuple) -> None:
        if not module.training:
            return
        if isinstance(module, HyperSetModel):
            self.calls.append([0, module.config.num_hidden_layers])
        elif isinstance(module, HyperSetLayer) and self.calls:
            self.calls[-1][0] += 1

    @property
    def depths(self) -> list[int]:
        return [calls // layers for calls, layers in self.calls]


@pytest.fixture
def recorder() -> Iterator[DepthRecorder]:
    hook = DepthRecorder()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    yield hook
    handle.remove()


# ---------------------------------------------------------------------------- flags → config.json


@pytest.mark.parametrize("loop", LOOPS)
def test_depth_flags_reach_the_saved_config(loop: str, tmp_path: Path, recorder: DepthRecorder) -> None:
    out = tmp_path / "model"
    flags = {
        "iteration_conditioning": "sinusoidal",
        "iteration_sampling": "uniform",
        "min_iterations": 1,
        "max_iterations": 3,
        "backprop_iterations": 2,
    }
    argv = [x for name, value in flags.items() for x in (f"--{name}", value)]
    assert LOOPS[loop](loop_argv(loop, "--max_steps", "2", "--output_dir", out, *argv)) == 0
    config = json.loads((out / "config.json").read_text())
    assert {name: config[name] for name in flags} == flags
    assert json.loads((out / "metrics.json").read_text())["recipe"]["depth_flags"] == flags
    assert len(recorder.depths) == 2 and all(1 <= d <= 3 for d in recorder.depths)  # sampled, 2 forwards


@pytest.mark.parametrize("loop", LOOPS)
def test_depth_flags_default_to_the_config(loop: str, tmp_path: Path) -> None:
    out = tmp_path / "model"
    assert LOOPS[loop](loop_argv(loop, "--max_steps", "1", "--output_dir", out)) == 0
    config = json.loads((out / "config.json").read_text())
    defaults = HyperSetConfig.preset_fields("cli-image")  # the CLI's from-scratch digits model
    assert config["iteration_conditioning"] == "none"
    assert config["iteration_sampling"] == defaults["iteration_sampling"] == "uniform"
    assert (config["min_iterations"], config["max_iterations"]) == (2, 12)
    assert config["input_anchor"] == defaults["input_anchor"] == 0.5
    assert config["backprop_iterations"] is None


# ---------------------------------------------------------------------------- bad values

BAD = [
    pytest.param(["--iteration_sampling", "bogus"], "--iteration_sampling", id="unknown-sampling"),
    pytest.param(
        ["--iteration_conditioning", "learned"], "--iteration_conditioning", id="unknown-conditioning"
    ),
    pytest.param(["--backprop_iterations", "5"], "--backprop_iterations", id="backprop-above-T"),
    pytest.param(["--backprop_iterations", "0"], "--backprop_iterations", id="backprop-zero"),
    pytest.param(
        ["--iteration_sampling", "uniform", "--min_iterations", "4", "--max_iterations", "2"],
        "--min_iterations",
        id="min-above-max",
    ),
    pytest.param(["--max_iterations", "two"], "--max_iterations", id="not-an-integer"),
    pytest.param(
        [
            "--iteration_sampling",
            "fixed",
            "--config",
            *TINY,
            "iteration_sampling=uniform",
        ],  # last --config wins
        "--iteration_sampling",
        id="disagrees-with-config",
    ),
    pytest.param(
        ["--model", "imixer", "--iteration_sampling", "uniform"], "--iteration_sampling", id="imixer"
    ),
    pytest.param(["--model", "hyperbf", "--backprop_iterations", "1"], "--backprop_iterations", id="hyperbf"),
]
if "looped-transformer" in getattr(energyformers, "BASELINES", {}):
    BAD.append(
        pytest.param(
            ["--model", "looped-transformer", "--iteration_conditioning", "none"],
            "--iteration_conditioning",
            id="baseline-has-no-conditioning",
        )
    )
CONFIGS = {
    "imixer": cli_config("imixer"),
    "hyperbf": cli_config("hyperbf"),
    "looped-transformer": LOOPED_TINY_FLAGS,
}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(("extra", "flag"), BAD)
def test_bad_depth_flags_fail_before_training(
    loop: str, extra: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "model"
    model = extra[extra.index("--model") + 1] if "--model" in extra else "hyperset"
    argv = loop_argv(loop, "--max_steps", "1", "--output_dir", out, *extra, config=CONFIGS.get(model, TINY))
    try:
        rc = LOOPS[loop](argv)
    except SystemExit as exit_:  # argparse's own type errors
        rc = exit_.code
    assert rc != 0
    assert flag in capsys.readouterr().err
    assert not out.exists() and not out.with_name("model.checkpoints").exists()


# ---------------------------------------------------------------------------- resume


def _checkpoint_dirs(work_dir: Path, loop: str) -> dict[int, Path]:
    prefix = "checkpoint-" if loop == "train" else "step_"
    return {int(p.name.removeprefix(prefix)): p for p in work_dir.glob(f"{prefix}*")}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    ("accumulation", "saved", "forwards", "done"),
    [
        # 32 examples, batch 4 = 8 micro-batches an epoch; 2 per step: 4 optimizer steps = 8 forwards = one epoch
        pytest.param(2, 2, 8, 4, id="whole-windows"),
        # 3 per step: an epoch is 3 + 3 + 2 forwards (its last step takes the leftover 2), so step 3 ends the
        # epoch after 8 forwards, not 9, and step 4 adds 3
        pytest.param(3, 3, 11, 8, id="epoch-ends-in-a-partial-window"),
    ],
)
def test_resume_continues_the_sampled_depths(
    loop: str,
    accumulation: int,
    saved: int,
    forwards: int,
    done: int,
    tmp_path: Path,
    recorder: DepthRecorder,
) -> None:
    out = tmp_path / "model"
    work_dir = out.with_name("model.checkpoints")
    save = ["--checkpointing_steps", str(saved)]
    if loop == "train":
        save = ["--save_strategy", "steps", "--save_steps", str(saved), "--eval_strategy", "no"]
    argv = loop_argv(
        loop, "--max_steps", "4", "--batch_size", "4", "--gradient_accumulation_steps", str(accumulation),
        "--keep_checkpoints", "--output_dir", out, *SAMPLING, *save,
    )  # fmt: skip
    assert LOOPS[loop](argv) == 0
    uninterrupted = recorder.depths
    config, seed = HyperSetConfig.from_pretrained(out), run_seed(out)
    assert uninterrupted == [sample_num_iterations(config, i, seed) for i in range(forwards)], uninterrupted
    assert uninterrupted[done:] != uninterrupted[: forwards - done]  # a restart from draw 0 would be visible
    assert uninterrupted[done:] != uninterrupted[done + 1 :][: forwards - done]  # so would a shift by one

    # pretend the run died after step `saved`: drop the later checkpoints and the finished folder, then --resume
    checkpoints = _checkpoint_dirs(work_dir, loop)
    assert saved in checkpoints, sorted(checkpoints)
    for step, path in checkpoints.items():
        if step > saved:
            shutil.rmtree(path)
    shutil.rmtree(out)
    assert LOOPS[loop]([*argv, "--resume"]) == 0
    resumed = recorder.depths[forwards:]
    assert resumed == uninterrupted[done:], (resumed, uninterrupted)  # the later steps ran the same depths


# ---------------------------------------------------------------------------- two processes

TRAINER_SCRIPT = """
import json, sys, torch
from transformers import TrainerCallback
from energyformers.modeling.modeling_hyperset import HyperSetLayer, HyperSetModel
from energyformers.training import train

calls = []  # per training forward of the backbone: calls of the weight-tied layer

def count(module, args):
    if module.training and isinstance(module, HyperSetModel):
        calls.append(0)
    elif module.training and isinstance(module, HyperSetLayer):
        calls[-1] += 1

torch.nn.modules.module.register_module_forward_pre_hook(count)

class Dump(TrainerCallback):
    def on_train_end(self, args, state, control, model=None, **kwargs):
        record = {"depths": calls, "steps": state.global_step, "draws": model.base_model.iteration_draws}
        with open(f"{OUT}/rank{args.process_index}.json", "w") as f:
            json.dump(record, f)

sys.exit(train.main(sys.argv[1:], callbacks=[Dump()]))
"""


@pytest.mark.skipif(
    shutil.which("torchrun", path=str(BIN)) is None, reason="torchrun not installed in the venv"
)
def test_sampled_depth_is_identical_on_both_ranks_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "run_trainer.py"
    script.write_text(TRAINER_SCRIPT.replace("{OUT}", str(tmp_path)))
    out = tmp_path / "model"
    # torchrun as a module of this interpreter: the console script's shebang may name another environment's python
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
        *loop_argv("train", "--batch_size", 4, "--max_steps", 8, "--eval_strategy", "no", "--output_dir", out),
        *SAMPLING,
    ]  # fmt: skip
    proc = run_launcher(argv, tmp_path, ENV)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    config = HyperSetConfig.from_pretrained(out)
    layers = config.num_hidden_layers
    depths = [[calls // layers for calls in rank["depths"]] for rank in ranks]
    assert ranks[0]["steps"] == 8 and len(depths[0]) == 8 and ranks[0]["draws"] == ranks[1]["draws"] == 8
    assert depths[0] == depths[1]  # same depth at every step on both ranks
    assert len(set(depths[0])) > 1  # and the depth does vary from step to step
    assert depths[0] == [sample_num_iterations(config, i, run_seed(out)) for i in range(8)]
