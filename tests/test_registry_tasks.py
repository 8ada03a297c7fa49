"""The pipeline task `energyformers.INPUT_TYPES` gives each head is one transformers builds for it.

The masked-image-modelling heads are the case that needs care: transformers has no pipeline for them, the package
registers `MaskedImageModelingPipeline` as "masked-image-modeling", and "fill-mask" (transformers' masked *language*
modelling task) must not reach a reader of the registry: `pipeline(task=...)`, the exported card, `predict`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures import run_at_once
from huggingface_hub import ModelCard
from PIL import Image

import energyformers
from energyformers import BASELINES, FAMILIES, task_of
from energyformers.training import predict
from energyformers.training.arguments import MIM_TASK
from energyformers.training.export import export_model_dir, inspect_model_dir

MIM_HEAD = "AutoModelForMaskedImageModeling"
MIM_MODELS = ("hyperset", "looped-transformer")
CODEBOOK, GRID = 8, 16  # a 4 × 4 grid of 2 × 2 patches of 8 × 8 grey images; [MASK] = 8
DECODE = {"mask_ratio": 0.5, "steps": 2, "seed": 3}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def build_mim_folder(path: Path, model_type: str) -> Path:
    """A tiny MIM run folder as `energyformers train --task mim` writes it: the head and its image tokenizer."""
    from energyformers.mim import PatchKMeansTokenizer

    size = dict(
        num_attention_heads=2, num_iterations=2, vocab_size=CODEBOOK + 1, max_position_embeddings=GRID
    )
    torch.manual_seed(0)
    if model_type == "hyperset":
        config = energyformers.HyperSetConfig.from_preset(
            "cli-mim", hidden_size=16, intermediate_size=16, time_embedding_dim=16, **size
        )
    else:
        config = energyformers.LoopedTransformerConfig.from_preset(
            "cli-mim", hidden_size=16, intermediate_size=32, **size
        )
    models = {**FAMILIES, **BASELINES}
    models[model_type].heads[MIM_HEAD](config).save_pretrained(path)
    centroids = torch.rand(CODEBOOK, 2 * 2, generator=torch.Generator().manual_seed(3))
    PatchKMeansTokenizer(centroids, patch_size=2, image_size=(8, 8), num_channels=1).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def mim_folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mim-task")
    return {model_type: build_mim_folder(root / model_type, model_type) for model_type in MIM_MODELS}


@pytest.fixture(scope="module")
def image_path(tmp_path_factory) -> Path:
    pixels = torch.rand(8, 8, generator=torch.Generator().manual_seed(1))
    path = tmp_path_factory.mktemp("image") / "digit.png"
    Image.fromarray((pixels * 255).round().to(torch.uint8).numpy(), mode="L").save(path)
    return path


def test_every_masked_image_modelling_head_has_the_package_pipeline_task():
    from transformers.pipelines import PIPELINE_REGISTRY

    # one name in the three places that say it: the registry, the registered pipeline, the training CLI's --task
    # (all `energyformers.tokenizer_fit.MIM_TASK`, tests/test_mim_names.py)
    assert MIM_TASK == "masked-image-modeling", MIM_TASK
    assert MIM_TASK in PIPELINE_REGISTRY.get_supported_tasks(), PIPELINE_REGISTRY.get_supported_tasks()
    for model_type, family in {**FAMILIES, **BASELINES}.items():
        if MIM_HEAD in family.heads:
            input_type = family.config_class.from_preset("cli-mim").input_type  # code ids: "sequence"
            assert task_of(input_type, MIM_HEAD) == MIM_TASK, (model_type, input_type)
    tasks = [task for kind in energyformers.INPUT_TYPES.values() for task in kind.tasks]
    assert "fill-mask" not in tasks, tasks


FRESH_CHILD = f"""
import json, sys
import energyformers, transformers
folder, image, decode = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
config = transformers.AutoConfig.from_pretrained(folder)
task = energyformers.task_of(config.input_type, "{MIM_HEAD}")
pipe = transformers.pipeline(task, model=folder)
out = pipe(image, **decode)
print(json.dumps({{"task": task, "class": type(pipe).__name__, "codes": out["codes"].tolist()}}))
"""


@pytest.fixture(scope="module")
def fresh_processes(mim_folders, image_path) -> dict[str, subprocess.CompletedProcess]:
    """`FRESH_CHILD` on each MIM folder, one fresh process per folder, the processes run at once."""
    commands = {
        model_type: dict(
            args=[sys.executable, "-c", FRESH_CHILD, str(folder), str(image_path), json.dumps(DECODE)],
            env=ENV,
        )
        for model_type, folder in mim_folders.items()
    }
    return run_at_once(commands, timeout=300)


@pytest.mark.parametrize("model_type", MIM_MODELS)
def test_pipeline_of_the_registry_task_reconstructs_in_a_fresh_process(
    fresh_processes, mim_folders, image_path, model_type
):
    """`import energyformers` (not `energyformers.pipelines`) is enough for `pipeline(task_of(...))`, as for
    transformers' own tasks; and it gives what `MaskedImageModelingPipeline` gives in this process."""
    from energyformers.pipelines import MaskedImageModelingPipeline

    folder = mim_folders[model_type]
    done = fresh_processes[model_type]
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["task"] == "masked-image-modeling", result["task"]
    assert result["class"] == "MaskedImageModelingPipeline", result["class"]
    # the same weights, image, mask and decoding seed: the same codes, bit for bit
    expected = MaskedImageModelingPipeline(model=str(folder))(str(image_path), **DECODE)["codes"].tolist()
    assert result["codes"] == expected, (result["codes"], expected)


def test_pipeline_builds_the_registry_task_here_and_fill_mask_cannot(mim_folders, image_path):
    import transformers

    folder = mim_folders["hyperset"]
    pipe = transformers.pipeline(task_of("sequence", MIM_HEAD), model=str(folder))
    out = pipe(str(image_path), **DECODE)
    assert out["reconstruction"].size == (8, 8) and int(out["masked"].sum()) == GRID // 2, out["masked"]
    # what the old table named: transformers' masked-LM task, which cannot load a masked-image-modelling head
    with pytest.raises(ValueError, match="AutoModelForMaskedLM"):
        transformers.pipeline("fill-mask", model=str(folder))


@pytest.mark.parametrize("model_type", MIM_MODELS)
def test_export_of_a_mim_folder_names_no_fill_mask(mim_folders, tmp_path, model_type):
    folder = mim_folders[model_type]
    assert inspect_model_dir(folder)["task"] == "masked-image-modeling"
    out = export_model_dir(folder, tmp_path / "export", repo_id=f"org/{model_type}-mim")
    card = ModelCard.load(out / "README.md")
    # the Hub's pipeline_tag must be a task the Hub lists; the package's task name is a tag
    assert card.data.pipeline_tag == "image-to-image", card.data.pipeline_tag
    assert "masked-image-modeling" in card.data.tags, card.data.tags
    texts = {p.name: p.read_text() for p in out.rglob("*") if p.suffix in (".md", ".json")}
    assert not [name for name, text in texts.items() if "fill-mask" in text], sorted(texts)


@pytest.mark.parametrize("model_type", MIM_MODELS)
def test_predict_reconstructs_with_a_mim_folder_through_the_registry_task(
    mim_folders, image_path, model_type, capsys
):
    """`predict` on a MIM folder runs the pipeline of the registry's task (tests/test_predict_mim.py: the rest)."""
    import transformers

    folder = str(mim_folders[model_type])
    flags = [str(x) for name, value in DECODE.items() for x in (f"--{name}", value)]
    assert predict.main([folder, str(image_path), *flags, "--json"]) == 0, capsys.readouterr().err
    record = json.loads(capsys.readouterr().out)
    expected = transformers.pipeline(task_of("sequence", MIM_HEAD), model=folder)(str(image_path), **DECODE)
    assert (record["psnr"], record["ssim"]) == (expected["psnr"], expected["ssim"]), (record, expected)
    # a text is not an image file: one line, status 2
    capsys.readouterr()  # the pipeline built above reports its loading
    assert predict.main([folder, "a text"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "masked-image-modelling model" in err and "not an image file" in err, err
