"""`--full_determinism` (TrainingArguments' flag of that name) in both training loops.

`transformers.enable_full_determinism(--seed)` replaces `set_seed` before the model is built: the initial weights
are those of a run without the flag, torch's deterministic algorithms are on during the run (and off again after
the command, run in-process), two runs write byte-identical weights, and metrics.json records the flag. Every
model class trains a step with the mode on (on CPU an op without a deterministic algorithm would raise).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import PartialState
from fixtures import ALL, TINY_DIGITS_RUN, cases, cli_config
from transformers import TrainerCallback

import energyformers
from energyformers.training import accelerate_loop, train
from energyformers.training.setup import build

# the tiny Hyper-SET run that the tests of the flag train
HYPERSET_RUN = [*TINY_DIGITS_RUN, "--config", *cli_config("hyperset")]

# the heads whose training step runs Hyper-SET's Triton kernels in the interpreter (the same kernels in the others)
TRITON_HEADS = ("AutoModelForImageClassification", "AutoModelForTokenClassification")


def deterministic_mode() -> tuple[bool, bool, bool]:
    """(torch's deterministic algorithms on, cuDNN deterministic, cuDNN benchmark)."""
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )


class SeenModes(TrainerCallback):
    """The mode at the start of training and after each optimizer step, and the TrainingArguments' flag."""

    def __init__(self) -> None:
        self.modes: list[tuple[bool, bool, bool]] = []
        self.full_determinism: bool | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.modes.append(deterministic_mode())
        self.full_determinism = args.full_determinism

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.modes.append(deterministic_mode())


def recorded_flag(out: Path) -> Any:
    return json.loads((out / "metrics.json").read_text())["arguments"]["run"]["full_determinism"]


def assert_mode_put_back(before: tuple[bool, bool, bool]) -> None:
    after = deterministic_mode()
    assert after == before, f"after the command: {after}, before it: {before}"
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ, os.environ.get("CUBLAS_WORKSPACE_CONFIG")


@pytest.fixture(autouse=True)
def _no_determinism_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs start without the variables `enable_full_determinism` sets (monkeypatch removes any it leaves)."""
    for name in ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "FLASH_ATTENTION_DETERMINISTIC"):
        monkeypatch.delenv(name, raising=False)


def test_trainer_runs_are_byte_identical_with_the_mode_on(tmp_path: Path) -> None:
    before = deterministic_mode()
    folders, seen = [], []
    for name in ("a", "b"):
        out, modes = tmp_path / name, SeenModes()
        argv = [*HYPERSET_RUN, "--full_determinism", "--output_dir", str(out)]
        assert train.main(argv, callbacks=[modes]) == 0
        assert_mode_put_back(before)
        folders.append(out)
        seen.append(modes.modes)
        assert modes.full_determinism is True  # Trainer was given the flag (and seeds with it in train())
    for modes in seen:
        # begin + 3 steps, each with deterministic algorithms, cuDNN deterministic and not benchmarking
        assert modes == [(True, True, False)] * 4, modes
    first, second = ((f / "model.safetensors").read_bytes() for f in folders)
    assert first == second, "two --full_determinism runs wrote different model.safetensors"
    assert [recorded_flag(f) for f in folders] == [True, True]


def test_accelerate_runs_are_byte_identical_with_the_mode_on(tmp_path: Path) -> None:
    before = deterministic_mode()
    folders, seen = [], []
    for name in ("a", "b"):
        out = tmp_path / name
        argv = [*HYPERSET_RUN, "--full_determinism", "--output_dir", str(out)]
        status = accelerate_loop.main(
            argv, on_train_end=lambda model, accelerator: seen.append(deterministic_mode())
        )
        assert status == 0
        assert_mode_put_back(before)
        folders.append(out)
    assert seen == [(True, True, False)] * 2, seen
    first, second = ((f / "model.safetensors").read_bytes() for f in folders)
    assert first == second, "two --full_determinism runs wrote different model.safetensors"
    assert [recorded_flag(f) for f in folders] == [True, True]


def test_the_flag_is_recorded_off_by_default(tmp_path: Path) -> None:
    seen: list[tuple[bool, bool, bool]] = []
    out = tmp_path / "plain"
    argv = [*HYPERSET_RUN, "--max_steps", "1", "--output_dir", str(out)]
    assert (
        accelerate_loop.main(argv, on_train_end=lambda model, accelerator: seen.append(deterministic_mode()))
        == 0
    )
    assert seen[0][0] is False, seen
    assert recorded_flag(out) is False


@pytest.mark.parametrize(
    ("family", "task"),
    [*((family, []) for family in sorted(energyformers.FAMILIES)), ("hyperset", ["--task", "mim"])],
    ids=[*sorted(energyformers.FAMILIES), "hyperset-mim"],
)
def test_initial_weights_do_not_change_and_the_mode_is_on_when_the_model_is_built(
    family: str, task: list[str], tmp_path: Path
) -> None:
    """The model `build` returns, with and without the flag: bitwise equal (deterministic mode's filling of
    uninitialised memory would show here as NaN in a tensor the initialisation skipped); with the flag the mode is
    already on once it is built, before Trainer or the Accelerate loop seeds again."""
    before = deterministic_mode()
    argv = [
        *TINY_DIGITS_RUN,
        *task,
        "--model",
        family,
        "--config",
        *cli_config(family),
        "--output_dir",
        str(tmp_path / "out"),
    ]
    try:
        plain = build(train.parse(argv), PartialState()).model.state_dict()
        assert deterministic_mode()[0] is False
        built = build(train.parse([*argv, "--full_determinism"]), PartialState())
        mode = deterministic_mode()
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1:]
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    assert mode == (True, True, False), mode
    deterministic = built.model.state_dict()
    assert plain.keys() == deterministic.keys()
    differing = [name for name in plain if not torch.equal(plain[name], deterministic[name])]
    assert not differing, f"initial tensors that differ with --full_determinism: {differing}"


@cases([case for case in ALL if not case.is_base])
@pytest.mark.parametrize("attention", ["eager", "sdpa", "triton"])
def test_a_training_step_runs_under_deterministic_algorithms(case: Any, attention: str) -> None:
    """Forward, backward and an evaluation forward of every head with torch's deterministic algorithms on (CPU;
    Hyper-SET's Triton kernels in Triton's interpreter): an op our models use that has no deterministic algorithm
    raises here."""
    if attention == "triton" and (
        importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1"
    ):
        pytest.skip("Triton on CPU tensors needs Triton installed and TRITON_INTERPRET=1 (tests/conftest.py)")
    if attention == "triton" and case.auto_name not in TRITON_HEADS:
        pytest.skip("the interpreted kernels are slow: one head without a padding mask, one with")
    try:
        model = case.build(attn_implementation=attention)
    except ValueError as err:  # a family without that attention implementation (iMixer has no attention)
        assert "attn_implementation" in str(err), err
        pytest.skip(f"{case.model_class.__name__} has no {attention} attention")
    inputs = case.inputs(labels=True)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        model.train()
        model(**inputs).loss.backward()
        model.eval()
        with torch.no_grad():
            logits = model(**inputs).logits
    finally:
        torch.use_deterministic_algorithms(before)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads), case
    assert torch.isfinite(logits).all(), case
