"""`--adam_beta1/--adam_beta2` and `--torch_compile` in both training loops (the paper's Sudoku recipe:
AdamW β = (0, 0.95), `torch.compile`): the values reach the optimizer the loop actually steps, compile reaches
the model, bad betas fail before anything is written.

`torch.compile` is wrapped by a spy that records the call and compiles with the `eager` backend: Dynamo still
traces the model, but no Inductor code generation (minutes on CPU) runs in CI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate.state import AcceleratorState
from fixtures import cli_config
from transformers import TrainerCallback

from energyformers.training import accelerate_loop, train
from energyformers.training.arguments import parse_arguments

COMMON = [
    "--dataset", "digits", "--max_train_samples", "32", "--max_eval_samples", "16", "--max_test_samples", "16",
    "--max_steps", "2", "--batch_size", "8", "--num_threads", "1", "--num_predictions", "0",
    "--config", *cli_config("hyperset"),
]  # fmt: skip
BETAS = ["--adam_beta1", "0", "--adam_beta2", "0.95"]
# the compiled runs' depth pass at one depth (T) instead of the default T/2, T, 2T: each depth is another compile
# (tens of seconds on 2 cores), and one is enough to run that pass through the compiled model
ONE_DEPTH = ["--eval_iterations", "2"]


class OptimizerSpy(TrainerCallback):
    """Records the betas of every parameter group of the optimizer Trainer steps."""

    def __init__(self) -> None:
        self.betas: list[tuple[float, float]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        self.betas += [tuple(group["betas"]) for group in optimizer.param_groups]


@pytest.fixture
def compile_spy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Replace `torch.compile` with a recorder that compiles with `aot_eager`; yields the recorded targets.

    `aot_eager` rather than the cheaper `eager` backend: torch 2.13's `eager` backend cannot run the backward of
    a `nested_compile_region` (Hyper-SET's layer step) — "fake_mode should be enabled for HOPs" — while
    `aot_eager` and `inductor` (the Trainer's default) can.

    `TrainingArguments(torch_compile=True)` exports `ACCELERATE_DYNAMO_*` into `os.environ` and Trainer's
    `Accelerator` keeps its Dynamo plugin in the process-wide `AcceleratorState`, which would make every later
    `Accelerator` in this process compile too: both are reset before and after.
    """
    saved = {k: v for k, v in os.environ.items() if k.startswith("ACCELERATE_DYNAMO")}
    calls: list[Any] = []
    original = torch.compile

    def spy(target: Any = None, **kwargs: Any) -> Any:
        calls.append(target)
        return original(target, **{**kwargs, "backend": "aot_eager"})

    monkeypatch.setattr(torch, "compile", spy)
    torch._dynamo.reset()
    AcceleratorState._reset_state()
    yield calls
    torch._dynamo.reset()
    AcceleratorState._reset_state()
    for key in [k for k in os.environ if k.startswith("ACCELERATE_DYNAMO")]:
        del os.environ[key]
    os.environ.update(saved)


def test_trainer_adam_betas_reach_the_optimizer(tmp_path: Path) -> None:
    spy = OptimizerSpy()
    assert train.main([*COMMON, *BETAS, "--output_dir", str(tmp_path / "out")], callbacks=[spy]) == 0
    assert len(spy.betas) >= 2 and set(spy.betas) == {(0.0, 0.95)}
    recipe = json.loads((tmp_path / "out" / "metrics.json").read_text())["recipe"]
    assert recipe["adam_betas"] == [0.0, 0.95] and recipe["torch_compile"] is False


def test_trainer_default_betas_are_adamw_defaults() -> None:
    for prog in (train.PROG, accelerate_loop.PROG):  # one set of flags: the same defaults in both loops
        run = parse_arguments(["--output_dir", "unused"], prog, "").run
        assert (run.adam_beta1, run.adam_beta2, run.torch_compile) == (0.9, 0.999, False)


def test_accelerate_adam_betas_reach_the_optimizer(tmp_path: Path) -> None:
    seen: list[tuple[float, float]] = []

    def on_train_end(model: torch.nn.Module, accelerator: Any) -> None:
        (optimizer,) = accelerator._optimizers
        seen.extend(tuple(group["betas"]) for group in optimizer.param_groups)

    argv = [*COMMON, *BETAS, "--warmup_ratio", "0", "--output_dir", str(tmp_path / "out")]
    assert accelerate_loop.main(argv, on_train_end=on_train_end) == 0
    assert len(seen) == 2 and set(seen) == {(0.0, 0.95)}  # decay and no-decay groups
    recipe = json.loads((tmp_path / "out" / "metrics.json").read_text())["recipe"]
    assert recipe["adam_betas"] == [0.0, 0.95] and recipe["torch_compile"] is False


def test_trainer_torch_compile_compiles_the_model(tmp_path: Path, compile_spy: list[Any]) -> None:
    spy = OptimizerSpy()
    out = tmp_path / "out"
    argv = [*COMMON, *BETAS, *ONE_DEPTH, "--torch_compile", "--output_dir", str(out)]
    assert train.main(argv, callbacks=[spy]) == 0
    assert compile_spy, "Trainer did not call torch.compile"
    assert set(spy.betas) == {(0.0, 0.95)}
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"]["torch_compile"] is True
    assert "accuracy_iterations_2" in metrics["eval"], metrics["eval"]  # the depth pass ran
    assert "_orig_mod" not in (out / "config.json").read_text()
    from safetensors.torch import load_file

    assert not any(key.startswith("_orig_mod") for key in load_file(out / "model.safetensors"))


def test_accelerate_torch_compile_compiles_the_model(tmp_path: Path, compile_spy: list[Any]) -> None:
    compiled: list[bool] = []

    def on_train_end(model: torch.nn.Module, accelerator: Any) -> None:
        compiled.append(getattr(model, "_compiled_call_impl", None) is not None)

    out = tmp_path / "out"
    argv = [*COMMON, *BETAS, *ONE_DEPTH, "--torch_compile", "--warmup_ratio", "0", "--output_dir", str(out)]
    assert accelerate_loop.main(argv, on_train_end=on_train_end) == 0
    assert compile_spy and compiled == [True]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"]["torch_compile"] is True
    assert "accuracy_iterations_2" in metrics["eval"], metrics["eval"]  # the depth pass ran
    from safetensors.torch import load_file

    assert not any(key.startswith("_orig_mod") for key in load_file(out / "model.safetensors"))


@pytest.mark.parametrize("loop", ["train", "train-accelerate"])
@pytest.mark.parametrize("flag, value", [("--adam_beta1", "1.0"), ("--adam_beta2", "-0.1")])
def test_bad_betas_fail_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture, loop: str, flag: str, value: str
) -> None:
    main = train.main if loop == "train" else accelerate_loop.main
    out = tmp_path / "out"
    assert main([*COMMON, flag, value, "--output_dir", str(out)]) == 2
    assert f"{flag} {float(value)}: expected 0 <= value < 1" in capsys.readouterr().err
    assert not out.exists() and not out.with_name("out.checkpoints").exists()
