"""`train --from_pretrained` reads the checkpoint's config once per run: every check and build step that needs it
(the flag checks before the data, the processor, the config built with the data's labels, the masked-image-modelling
config before and after the tokenizer) takes the one loaded for that run's arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from energyformers import HyperSetConfig, HyperSetForImageClassification, HyperSetForMaskedImageModeling
from energyformers.mim import PatchKMeansTokenizer
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


def built(argv: list[str], tmp_path: Path) -> Any:
    from accelerate import PartialState

    args = parse_arguments([*argv, "--output_dir", str(tmp_path / "out"), *SMALL], "energyformers train", "")
    return setup.build(args, PartialState())


def test_an_image_classification_run_loads_the_checkpoint_config_once(config_loads, tmp_path):
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


def test_a_masked_image_modelling_run_loads_the_checkpoint_config_once(config_loads, tmp_path):
    folder = tmp_path / "model"
    torch.manual_seed(0)
    config = HyperSetConfig.from_preset(
        "mim-1-12-d", hidden_size=16, num_attention_heads=4, intermediate_size=16, time_embedding_dim=16,
        num_iterations=2, vocab_size=17, max_position_embeddings=64,
    )  # fmt: skip
    HyperSetForMaskedImageModeling(config).save_pretrained(folder)
    centroids = torch.rand(16, 4, generator=torch.Generator().manual_seed(0))
    PatchKMeansTokenizer(centroids, 2, (16, 16), 1).save_pretrained(folder)
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
