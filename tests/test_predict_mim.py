"""`energyformers predict DIR IMAGE...` with a masked-image-modelling folder: it reconstructs through
`transformers.pipeline("masked-image-modeling", model=DIR)` and prints what that pipeline returns, writes its
reconstruction with `--output_dir`, and refuses the flags and inputs of the other kind of model (status 2, one line
naming the flag or input) before any work."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from test_cli_errors import ENV
from test_cli_errors import hyperset_folder as hyperset_folder  # a fixture, used by name
from test_registry_tasks import MIM_MODELS, build_mim_folder

from energyformers import mim
from energyformers.training import predict

METRICS = ("psnr", "ssim", "masked_accuracy", "tokenizer_psnr")
# Every decoding flag set away from its default, so a flag the CLI dropped would change the result.
FLAGS = {
    "mask_ratio": 0.5,
    "steps": 3,
    "schedule": "cosine",
    "temperature": 0.7,
    "randomize_temperature": 1.0,
    "seed": 3,
    "num_iterations": 3,
}


def as_argv(flags: dict) -> list[str]:
    return [str(x) for name, value in flags.items() for x in (f"--{name}", value)]


@pytest.fixture(scope="module")
def mim_folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("predict-mim")
    return {model_type: build_mim_folder(root / model_type, model_type) for model_type in MIM_MODELS}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    """Two image files: an 8 × 8 grey one (the tokenizer's geometry) and a 12 × 12 RGB one (converted and resized
    by the pipeline)."""
    root = tmp_path_factory.mktemp("images")
    generator = torch.Generator().manual_seed(1)
    grey = (torch.rand(8, 8, generator=generator) * 255).round().to(torch.uint8).numpy()
    rgb = (torch.rand(12, 12, 3, generator=generator) * 255).round().to(torch.uint8).numpy()
    paths = [root / "grey.png", root / "colour.png"]
    Image.fromarray(grey, mode="L").save(paths[0])
    Image.fromarray(rgb, mode="RGB").save(paths[1])
    return paths


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def same_metric(got: float | None, expected: float) -> bool:
    # the CLI prints the pipeline's own floats (JSON keeps a float's repr exactly); NaN is printed as null
    return got is None if math.isnan(expected) else got == expected


@pytest.mark.parametrize("model_type", MIM_MODELS)
def test_predict_prints_the_pipelines_metrics_and_writes_its_reconstruction(
    mim_folders, images, tmp_path, capsys, model_type
):
    folder = mim_folders[model_type]
    out_dir = tmp_path / "nested" / "out"  # created, parents too
    argv = [str(folder), *map(str, images), *as_argv(FLAGS), "--json", "--output_dir", str(out_dir)]
    assert predict.main(argv) == 0, capsys.readouterr().err
    printed = json_lines(capsys.readouterr().out)
    assert [p["input"] for p in printed] == [str(x) for x in images], printed

    # what a user gets from the registered pipeline with the same arguments
    pipe = transformers.pipeline("masked-image-modeling", model=str(folder))
    written = sorted(p.name for p in out_dir.iterdir())
    assert written == ["colour.reconstruction.png", "grey.reconstruction.png"], written  # no temporary left
    for path, line in zip(images, printed):
        expected = pipe(str(path), **FLAGS)
        for key in METRICS:
            assert same_metric(line[key], expected[key]), (path.name, key, line[key], expected[key])
        assert line["reconstruction"] == str(out_dir / f"{path.stem}.reconstruction.png"), line
        with Image.open(line["reconstruction"]) as png:
            assert png.mode == expected["reconstruction"].mode, (png.mode, expected["reconstruction"].mode)
            got, want = np.asarray(png), np.asarray(expected["reconstruction"])
        assert np.array_equal(got, want), (path.name, np.abs(got.astype(int) - want).max())
    # the pipeline's defaults give another result: the comparison above shows that the CLI passes the flags
    default = pipe(str(images[0]))["psnr"]
    assert default != printed[0]["psnr"], (default, printed[0]["psnr"])


def test_without_output_dir_predict_prints_one_line_per_image_and_writes_nothing(
    mim_folders, images, tmp_path, capsys, monkeypatch
):
    """No --output_dir: the metrics only (nothing written); the pipeline's defaults (mask_ratio 0.4, seed 0)."""
    folder = mim_folders["hyperset"]
    monkeypatch.chdir(tmp_path)
    assert predict.main([str(folder), str(images[0]), "--steps", "2"]) == 0, capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [], sorted(tmp_path.iterdir())
    (line,) = capsys.readouterr().out.strip().splitlines()
    source, numbers = line.split("\t")
    expected = transformers.pipeline("masked-image-modeling", model=str(folder))(str(images[0]), steps=2)
    assert source == str(images[0]), line
    shown = dict(item.split(" ") for item in numbers.split(", "))
    assert list(shown) == list(METRICS), line
    for key in METRICS:
        assert shown[key] == f"{expected[key]:.4f}", (key, shown[key], expected[key])
    # --json: the same metrics, and no reconstruction path
    assert predict.main([str(folder), str(images[0]), "--steps", "2", "--json"]) == 0
    (record,) = json_lines(capsys.readouterr().out)
    assert record["reconstruction"] is None and record["psnr"] == expected["psnr"], record


def test_mask_ratio_0_prints_null_masked_accuracy(mim_folders, images, capsys):
    """Nothing masked: no masked position to score (the pipeline's NaN), printed as JSON null, not NaN."""
    argv = [str(mim_folders["hyperset"]), str(images[0]), "--mask_ratio", "0", "--steps", "1", "--json"]
    assert predict.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "NaN" not in out, out
    (record,) = json_lines(out)
    assert record["masked_accuracy"] is None and record["psnr"] == record["tokenizer_psnr"], record


def test_a_failed_write_leaves_no_half_written_file(mim_folders, images, tmp_path, capsys, monkeypatch):
    """The PNG goes to a temporary name and is renamed: a write that fails part-way leaves the finished images and
    nothing else."""
    save = Image.Image.save
    calls = []

    def failing_save(self, fp, *args, **kwargs):
        calls.append(fp)
        if len(calls) == 2:  # the second image: some bytes reach the disk, then the disk fails
            Path(fp).write_bytes(b"\x89PNG\r\n")
            raise OSError(28, "No space left on device")
        return save(self, fp, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", failing_save)
    out_dir = tmp_path / "out"
    argv = [str(mim_folders["hyperset"]), *map(str, images), "--steps", "1", "--output_dir", str(out_dir)]
    assert predict.main(argv) == 1  # a failure of the work, not of the arguments
    assert "no space left on device" in capsys.readouterr().err.lower()
    assert sorted(p.name for p in out_dir.iterdir()) == ["grey.reconstruction.png"], sorted(out_dir.iterdir())
    with Image.open(out_dir / "grey.reconstruction.png") as png:
        assert png.size == (8, 8), png.size


def refusals(tmp: Path, mim: Path, classifier: Path, image: Path) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (argv, fragments of the one error line)."""
    bare = tmp / "no-tokenizer"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((mim / name).read_bytes())
    a_file = tmp / "a-file"
    a_file.write_text("not a folder")
    not_an_image = tmp / "notes.png"
    not_an_image.write_text("hello")
    twin = tmp / "twin"
    twin.mkdir()
    (twin / image.name).write_bytes(image.read_bytes())
    # the folder's model (8 codes on a 4 × 4 grid) with a tokenizer of another grid, and one of another codebook:
    # refused from the two config files, before the weights load
    from energyformers.mim import PatchKMeansTokenizer

    other_grid, other_codebook = tmp / "other-grid", tmp / "other-codebook"
    generator = torch.Generator().manual_seed(0)
    for folder, tokenizer in (
        (other_grid, PatchKMeansTokenizer(torch.rand(8, 4, generator=generator), 2, (16, 16), 1)),
        (other_codebook, PatchKMeansTokenizer(torch.rand(5, 4, generator=generator), 2, (8, 8), 1)),
    ):
        folder.mkdir()
        for name in ("config.json", "model.safetensors"):
            (folder / name).write_bytes((mim / name).read_bytes())
        tokenizer.save_pretrained(folder)
    listed = tmp / "tokenizer-a-list"  # valid JSON of the wrong shape: refused as export and mim refuse it
    listed.mkdir()
    for name in ("config.json", "model.safetensors"):
        (listed / name).write_bytes((mim / name).read_bytes())
    (listed / "vq_tokenizer_config.json").write_text("[]")
    mim_kind, classifier_kind = "masked-image-modelling model (", "not a masked-image-modelling model ("
    return {
        "top_k on MIM": ([str(mim), str(image), "--top_k", "2"], ["--top_k", mim_kind]),
        "search on MIM": (
            [str(mim), str(image), "--search_trajectories", "2"],
            ["--search_trajectories", mim_kind],
        ),
        "halting on MIM": (
            [str(mim), str(image), "--halting_tolerance", "0.001"],
            ["--halting_tolerance", mim_kind],
        ),
        "solver on MIM": (
            [str(mim), str(image), "--fixed_point_iterations", "2"],
            ["--fixed_point_iterations"],
        ),
        "stdin on MIM": ([str(mim), "-"], ["'-'", mim_kind, "image files"]),
        "text on MIM": ([str(mim), "a gripping film"], ["'a gripping film'", "not an image file"]),
        "missing image": ([str(mim), str(tmp / "nowhere.png")], ["nowhere.png", "no such file"]),
        "unreadable image": ([str(mim), str(not_an_image)], [str(not_an_image), "not a readable image"]),
        "no tokenizer": (
            [str(bare), str(image)],
            [
                "no image tokenizer",
                "vq_tokenizer_config.json",
                "--task",
                "8 codes on a 4 × 4 grid",
                "must match",
            ],
        ),
        "tokenizer settings a list": (
            [str(listed), str(image)],
            [
                f"{listed / 'vq_tokenizer_config.json'}: holds a JSON list, not an object",
                "save the image tokenizer again",
            ],
        ),
        "tokenizer of another grid": (
            [str(other_grid), str(image)],
            [str(other_grid), "grid is 8 × 8 = 64 codes", "max_position_embeddings=16", "4 × 4 grid"],
        ),
        "tokenizer of another codebook": (
            [str(other_codebook), str(image)],
            [str(other_codebook), "codebook_size=5", "predicts 8 codes"],
        ),
        "mask_ratio above 1": ([str(mim), str(image), "--mask_ratio", "1.5"], ["--mask_ratio 1.5", "[0, 1]"]),
        "mask_ratio below 0": (
            [str(mim), str(image), "--mask_ratio", "-0.1"],
            ["--mask_ratio -0.1", "[0, 1]"],
        ),
        "mask_ratio nan": ([str(mim), str(image), "--mask_ratio", "nan"], ["--mask_ratio nan"]),
        "steps 0": ([str(mim), str(image), "--steps", "0"], ["--steps 0", ">= 1"]),
        "temperature 0": ([str(mim), str(image), "--temperature", "0"], ["--temperature 0.0", "> 0"]),
        "negative noise": (
            [str(mim), str(image), "--randomize_temperature", "-1"],
            ["--randomize_temperature -1"],
        ),
        "negative seed": ([str(mim), str(image), "--seed", "-1"], ["--seed -1"]),
        "output_dir a file": (
            [str(mim), str(image), "--output_dir", str(a_file)],
            [f"--output_dir {a_file}", "file"],
        ),
        "one stem twice": (
            [str(mim), str(image), str(twin / image.name), "--output_dir", str(tmp / "never")],
            ["--output_dir", f"{image.stem}.reconstruction.png"],
        ),
        "mask_ratio on a classifier": (
            [str(classifier), str(image), "--mask_ratio", "0.4"],
            ["--mask_ratio", classifier_kind + "HyperSetForImageClassification)"],
        ),
        "steps on a classifier": (
            [str(classifier), str(image), "--steps", "8"],
            ["--steps", classifier_kind],
        ),
        "output_dir on a classifier": (
            [str(classifier), str(image), "--output_dir", str(tmp / "never")],
            ["--output_dir", classifier_kind],
        ),
        "lpips_weights on a classifier": (
            [str(classifier), str(image), "--lpips_weights", str(a_file)],
            ["--lpips_weights", classifier_kind],
        ),
        "lpips_weights missing": (
            [str(mim), str(image), "--lpips_weights", str(tmp / "absent" / "alexnet-owt-7be5be79.pth")],
            [f"--lpips_weights {tmp / 'absent' / 'alexnet-owt-7be5be79.pth'}: no such file"],
        ),
        "lpips_weights misnamed": (
            [str(mim), str(image), "--lpips_weights", str(a_file), "--output_dir", str(tmp / "never")],
            [f"--lpips_weights {a_file}: the backbone is known by torchvision's file name"],
        ),
    }


def test_flags_and_inputs_of_the_other_kind_of_model_are_refused_in_one_line(
    mim_folders, hyperset_folder, images, tmp_path, capsys
):
    classifier, _ = hyperset_folder
    cases = refusals(tmp_path, mim_folders["hyperset"], classifier, images[0])
    for name, (argv, fragments) in cases.items():
        assert predict.main(argv) == 2, (name, capsys.readouterr())
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("energyformers predict: error: "), (name, captured.err)
        assert all(fragment in lines[0] for fragment in fragments), (name, fragments, lines[0])
        assert captured.out == "", (name, captured.out)
    assert not (tmp_path / "never").exists(), "a refused command created its --output_dir"


def test_python_m_energyformers_predict_reconstructs(mim_folders, images, tmp_path):
    folder = mim_folders["looped-transformer"]
    flags = {"mask_ratio": 0.5, "steps": 2, "seed": 1}
    command = [sys.executable, "-m", "energyformers", "predict", str(folder), str(images[1]), *as_argv(flags)]
    command += ["--json", "--output_dir", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = json_lines(done.stdout)
    expected = transformers.pipeline("masked-image-modeling", model=str(folder))(str(images[1]), **flags)
    assert [record[key] for key in METRICS] == [expected[key] for key in METRICS], (record, expected)
    assert os.path.isfile(record["reconstruction"]), record


def test_predicts_fixed_names_are_the_packages():
    """Names `predict` keeps without importing torch, equal to the package's own."""
    from energyformers.modeling.modeling_hyperset import MASKGIT_SCHEDULES

    assert sorted(predict.MIM_SCHEDULES) == sorted(MASKGIT_SCHEDULES), (
        predict.MIM_SCHEDULES,
        MASKGIT_SCHEDULES,
    )


def _package_choices(name: str) -> tuple[str, ...]:
    """The package's own values that `predict` copies as `name` (its `--help` imports no torch)."""
    from energyformers.configuration.configuration_hyperset import HyperSetConfig
    from energyformers.configuration.configuration_imixer import IMixerConfig
    from energyformers.modeling.modeling_hyperset import SEARCH_SELECTORS

    return {
        "HALTING_CRITERIA": tuple(HyperSetConfig.choices["halting_criterion"]),
        "SEARCH_SELECTORS": tuple(SEARCH_SELECTORS),
        "FIXED_POINT_SOLVERS": tuple(IMixerConfig.choices["fixed_point_solver"]),
    }[name]


@pytest.mark.parametrize("name", ["HALTING_CRITERIA", "SEARCH_SELECTORS", "FIXED_POINT_SOLVERS"])
def test_predicts_flag_choices_are_the_packages(name):
    """The choices of --halting_criterion, --search_selector and --fixed_point_solver, kept by `predict` without
    importing torch, are the values the config / the search accept, in their order (the order `--help` lists)."""
    assert tuple(getattr(predict, name)) == _package_choices(name), (
        getattr(predict, name),
        _package_choices(name),
    )


# why torchvision (LPIPS's backbone) cannot import here, or None
TORCHVISION_PROBLEM = mim._torchvision_problem()


@pytest.mark.skipif(TORCHVISION_PROBLEM is None, reason="torchvision imports here: LPIPS is computed instead")
def test_lpips_weights_without_torchvision_is_refused_before_any_work(mim_folders, images, tmp_path, capsys):
    weights = tmp_path / "alexnet-owt-7be5be79.pth"
    torch.save({}, weights)
    argv = [str(mim_folders["hyperset"]), str(images[0]), "--lpips_weights", str(weights)]
    assert predict.main([*argv, "--output_dir", str(tmp_path / "never")]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"energyformers predict: error: --lpips_weights {weights}: "), captured.err
    assert "torchvision" in captured.err and captured.out == "", captured
    assert not (tmp_path / "never").exists()


@pytest.mark.skipif(TORCHVISION_PROBLEM is not None, reason=f"LPIPS needs torchvision: {TORCHVISION_PROBLEM}")
def test_lpips_weights_adds_the_pipelines_lpips(mim_folders, images, tmp_path, capsys):
    import torchvision

    from energyformers.pipelines import MaskedImageModelingPipeline

    torch.manual_seed(0)
    weights = tmp_path / "alexnet-owt-7be5be79.pth"
    torch.save(torchvision.models.alexnet().state_dict(), weights)
    folder = mim_folders["hyperset"]
    argv = [str(folder), str(images[0]), *as_argv(FLAGS), "--json", "--lpips_weights", str(weights)]
    assert predict.main(argv) == 0, capsys.readouterr().err
    (printed,) = json_lines(capsys.readouterr().out)
    call = {name: value for name, value in FLAGS.items()}
    expected = MaskedImageModelingPipeline(model=str(folder), lpips_weights=weights)(str(images[0]), **call)
    for key in ("lpips", "tokenizer_lpips"):
        assert same_metric(printed[key], expected[key]), (key, printed[key], expected[key])
