"""benchmarks/hyperset_iterations.py marks the depths a model was trained at as `energyformers inspect` does (the
fixed T, or the range `iteration_sampling` drew from) and names the command that trained the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures import loaded_script

from energyformers import HyperSetConfig

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "hyperset_iterations.py"


@pytest.fixture(scope="module")
def script():
    with loaded_script(SCRIPT, "hyperset_iterations") as module:
        yield module


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (dict(num_iterations=4), (4, 4)),
        (dict(num_iterations=4, iteration_sampling="uniform", min_iterations=2, max_iterations=12), (2, 12)),
        (dict(num_iterations=4, iteration_sampling="uniform"), (2, 6)),  # default T ± T//2
        (dict(num_iterations=4, iteration_sampling="poisson-lognormal"), (1, 16)),  # default [1, 4T]
    ],
)
def test_trained_range_is_the_fixed_depth_or_the_sampled_range(script, fields, expected):
    got = script.trained_range(HyperSetConfig(**fields))
    assert tuple(got) == expected, f"{fields}: trained range {got}, expected {expected}"


def test_table_marks_t_at_fixed_depth_and_the_range_ends_at_sampled_depth(script):
    fixed = {t: script.depth_note(t, 4, 4, 4) for t in range(1, 9)}
    assert {t for t, note in fixed.items() if note} == {4} and fixed[4] == " (trained T)", fixed
    sampled = {t: script.depth_note(t, 4, 2, 12) for t in range(1, 14)}
    assert {t for t, note in sampled.items() if note} == {2, 4, 12}, sampled
    assert "trained max" in sampled[12] and "eval" in sampled[4] and "trained min" in sampled[2], sampled


def test_training_command_is_read_from_the_model_folder(script, tmp_path):
    assert script.training_command(tmp_path) is None  # a folder `energyformers train` did not write
    command = "energyformers train --model hyperset --dataset digits --output_dir runs/x"
    (tmp_path / "metrics.json").write_text(json.dumps({"recipe": {"command": command}}))
    assert script.training_command(tmp_path) == command
