"""`energyformers convert --image-mean/--image-std`: a non-finite mean or a std that is not a finite value > 0
would give a processor that turns every image into NaN or inf; they are refused as usage errors before the
checkpoint is read, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_convert import TINY_IMIXER

from energyformers.training import cli
from energyformers.training.convert import SOURCES


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """A seeded official iMixer state_dict (bare safetensors) and its constructor kwargs (JSON)."""
    family = SOURCES["imixer"]
    kwargs = family.normalise_kwargs(dict(TINY_IMIXER))
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, (shape, _) in family.layout(kwargs).items():
        value = 0.3 * torch.randn(shape, generator=generator)
        state[key] = value / value.norm() if key.endswith(("weight_u", "weight_v")) else value
    config = tmp_path / "kwargs.json"
    config.write_text(json.dumps(TINY_IMIXER))
    weights = tmp_path / "imixer.safetensors"
    save_file(state, str(weights))
    return weights, config


def convert(weights: Path, config: Path, output: Path, *flags: str) -> int:
    return cli.main(
        [
            "convert",
            "--source",
            "imixer",
            str(weights),
            "--official-config",
            str(config),
            "--output_dir",
            str(output),
            *flags,
        ]
    )


@pytest.mark.parametrize(
    ("flag", "values", "allowed"),
    [
        ("--image-std", ["0", "0", "0"], "finite values > 0"),
        ("--image-std", ["0.5", "-0.5", "0.5"], "finite values > 0"),
        ("--image-std", ["nan", "0.5", "0.5"], "finite values > 0"),
        ("--image-std", ["inf", "inf", "inf"], "finite values > 0"),
        ("--image-mean", ["nan", "nan", "nan"], "finite values"),
        (
            "--image-mean",
            ["0.5", "1e999", "0.5"],
            "finite values",
        ),  # overflows to inf ("-inf" reads as a flag)
    ],
)
def test_bad_normalization_is_refused_before_any_work(
    checkpoint: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    values: list[str],
    allowed: str,
) -> None:
    weights, config = checkpoint
    output = tmp_path / "out"
    before = sorted(tmp_path.iterdir())
    status = convert(weights, config, output, flag, *values)
    err = capsys.readouterr().err
    shown = " ".join(str(float(v)) for v in values)
    assert status == 2, f"{flag} {values}: exit status {status}, expected 2 (usage error); stderr: {err!r}"
    assert err.strip().splitlines() == [
        f"energyformers convert: error: {flag} {shown}: expected 3 {allowed}"
    ], err
    assert sorted(tmp_path.iterdir()) == before, "a refused conversion wrote files"


def test_good_normalization_is_written_to_the_processor(
    checkpoint: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check lets finite values (a negative mean included) through, into preprocessor_config.json."""
    weights, config = checkpoint
    output = tmp_path / "out"
    mean, std = [-0.25, 0.0, 0.5], [0.25, 1.0, 2.0]
    status = convert(weights, config, output, "--image-mean", *map(str, mean), "--image-std", *map(str, std))
    assert status == 0, capsys.readouterr().err
    saved = json.loads((output / "preprocessor_config.json").read_text())
    assert (saved["image_mean"], saved["image_std"]) == (mean, std), saved
