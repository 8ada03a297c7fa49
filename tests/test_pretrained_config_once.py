"""`train --from_pretrained` checks and reads the checkpoint's config once per run: every check and build step that
needs it (the flag checks before the data, the processor, the config built with the data's labels, the
masked-image-modelling config before and after the tokenizer) takes the one loaded for that run's arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import transformers
from test_mim_given_tokenizer import mim_folder

from energyformers import HyperSetConfig, HyperSetForImageClassification
from energyformers.training import setup
from energyformers.training.arguments import parse_arguments
from energyformers.training.processing import build_image_processor

SMALL = ["--max_steps", "1", "--max_train_samples", "8", "--max_eval_samples", "4", "--max_test_samples", "4"]


@pytest.fixture
def config_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each `AutoConfig.from_pretrained` source, in call order (the loader itself still runs)."""
    loads: list[str] = []
    load = transformers.AutoConfig.from_pretrained.__func__

    def counting(cls: Any, source: Any, *args: Any, **kwargs: Any) -> Any:
        loads.append(str(source))
        return load(cls, source, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", classmethod(counting))
    return loads


@pytest.fixture
def source_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each `check_pretrained_source` source (it reads the folder's config and weight headers), in call order."""
    checks: list[str] = []
    check = setup.check_pretrained_source

    def counting(source: str) -> None:
        checks.append(source)
        check(source)

    monkeypatch.setattr(setup, "check_pretrained_source", counting)
    return checks


def built(argv: list[str], tmp_path: Path) -> Any:
    from accelerate import PartialState

    args = parse_arguments([*argv, "--output_dir", str(tmp_path / "out"), *SMALL], "energyformers train", "")
    return setup.build(args, PartialState())


def test_an_image_classification_run_loads_the_checkpoint_config_once(config_loads, source_checks, tmp_path):
    folder = tmp_path / "model"
    config = HyperSetConfig.from_preset(
        "cli-image", image_size=16, patch_size=4, num_labels=10, hidden_size=32, num_attention_heads=4
    )
    HyperSetForImageClassification(config).save_pretrained(folder)
    build_image_processor(config).save_pretrained(folder)
    result = built(
        ["--dataset", "digits", "--from_pretrained", str(folder), "--attn_implementation", "eager"], tmp_path
    )
    assert result.model.config.model_type == "hyperset"
    assert config_loads.count(str(folder)) == 1, config_loads
    assert source_checks == [str(folder)], source_checks


def test_a_masked_image_modelling_run_loads_the_checkpoint_config_once(config_loads, source_checks, tmp_path):
    folder = mim_folder(tmp_path / "model")
    argv = [
        "--task",
        "mim",
        "--dataset",
        "digits",
        "--from_pretrained",
        str(folder),
        "--attn_implementation",
        "eager",
    ]
    result = built(argv, tmp_path)
    assert result.model.config.model_type == "hyperset"
    assert config_loads.count(str(folder)) == 1, config_loads
    assert source_checks == [str(folder)], source_checks
