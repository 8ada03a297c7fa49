"""`energyformers inspect`: the PNGs and JSON of each family's demo model (short CI variant: tiny models trained
for two steps on digits), and the Hopfield energy landscapes of `energyformers.energy`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import TINY_SPLITS, cli_config, rounding
from PIL import Image

from energyformers import HyperSetConfig, HyperSetForSequenceClassification
from energyformers.energy import hopfield_energy
from energyformers.training import cli, train
from energyformers.training.inspect import LANDSCAPE_PATTERNS, InspectError, energy_landscape, run_log_history
from energyformers.training.processing import train_tokenizer

FIGURES = {
    # the demo run logged Hyper-SET's accuracy at T/2, T and 2T (the default --eval_iterations): its training curve
    "hyperset": [
        "hyperset_energy.png",
        "hyperset_geometry.png",
        "accuracy_vs_iterations.png",
        "training_curve_by_iterations.png",
    ],
    "imixer": ["imixer_residuals.png", "accuracy_vs_iterations.png"],
    "hyperbf": ["hyperbf_sigmas.png"],
}
QUICK = ["--max_steps", "2", "--per_device_train_batch_size", "8", "--num_threads", "1", "--disable_tqdm"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):
    """family → folder of a tiny model trained for two steps on digits with `energyformers train`; lazily, once."""
    root = tmp_path_factory.mktemp("inspect_demo")
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            out = root / family
            args = [
                "--model",
                family,
                "--dataset",
                "digits",
                "--output_dir",
                out,
                "--config",
                *cli_config(family),
            ]
            assert train.main([str(a) for a in [*args, *QUICK, *TINY_SPLITS, "--num_predictions", "0"]]) == 0
            cache[family] = out
        return cache[family]

    return get


def inspect(*argv: object) -> int:
    """Through the `energyformers` entry point, so the command's registration is exercised too."""
    return cli.main(["inspect", *map(str, argv)])


def assert_png(path: Path) -> None:
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width >= 400 and image.height >= 250
        assert len(np.unique(np.asarray(image.convert("L")))) > 20  # drawn on, not blank


def finite(values: object) -> bool:
    flat = np.asarray(values, dtype=float)
    return bool(np.isfinite(flat).all())


@pytest.mark.parametrize("family", sorted(FIGURES))
def test_inspect_on_each_familys_demo_model_writes_its_pngs_and_json(demo, family, tmp_path):
    out = tmp_path / "inspect"
    assert inspect(demo(family), "--dataset", "digits", "--max_samples", "24", "--max_iterations", "3",
                   "--output_dir", out, "--num_threads", "1") == 0  # fmt: skip
    report = json.loads((out / "inspect.json").read_text())
    assert report["figures"] == FIGURES[family] and report["model_type"] == family
    for name in FIGURES[family]:
        assert_png(out / name)
    section = report[family]
    if family == "hyperset":
        assert section["trained_iterations"] == 2 and section["iterations"] == [0, 1, 2, 3]
        layer = section["layers"][0]
        assert len(layer["attention_energy"]) == len(layer["feedforward_energy"]) == 4
        assert (
            np.shape(layer["effective_rank"]) == np.shape(layer["average_angle"]) == (4, 4)
        )  # (T + 1, heads)
        assert finite(layer["attention_energy"]) and finite(layer["effective_rank"])
        curve = report["training_curve"]  # the two-step demo run: its final evaluation at T/2, T and 2T
        assert sorted(curve["eval_by_iterations"], key=int) == ["1", "2", "4"], curve
        assert curve["num_classes"] == 10 and curve["metric"] == "accuracy"
    elif family == "imixer":
        assert section["trained_steps"] == 1 and section["steps_run"] == 3
        residuals = np.asarray(section["relative_residuals"], dtype=float)  # (blocks, steps)
        assert residuals.shape == (1, 3) and (residuals > 0).all()
    else:
        assert np.shape(section["attention_sigmas"]) == (1, 2) and finite(section["feedforward_sigmas"])
        assert 0 <= report["accuracy"]["accuracy"] <= 1
    if family != "hyperbf":
        curve = report["accuracy_vs_iterations"]
        assert curve["iterations"] == [1, 2, 3] and curve["trained"] in (1, 2) and curve["num_samples"] == 24
        assert all(0 <= value <= 1 for value in curve["accuracy"])


def test_inspect_takes_image_files_and_texts(demo, tmp_path):
    images = []
    for index in range(2):
        path = tmp_path / f"digit{index}.png"
        Image.fromarray((np.random.default_rng(index).random((8, 8)) * 255).astype(np.uint8)).save(path)
        images.append(path)
    assert inspect(demo("hyperset"), *images, "--output_dir", tmp_path / "images") == 0
    report = json.loads((tmp_path / "images" / "inspect.json").read_text())
    assert report["num_inputs"] == 2 and "accuracy_vs_iterations" not in report
    assert report["figures"] == [
        "hyperset_energy.png",
        "hyperset_geometry.png",
        "training_curve_by_iterations.png",
    ]
    # a text model: padding (different lengths) goes through the tokenizer saved with it
    texts = ["a gripping funny film", "two hours", "never again", "funny and gripping film"] * 5
    tokenizer = train_tokenizer(texts, vocab_size=40, max_length=16)
    config = HyperSetConfig(input_type="sequence", vocab_size=len(tokenizer), max_position_embeddings=16,
                            hidden_size=16, num_attention_heads=2, intermediate_size=8, num_iterations=2)  # fmt: skip
    folder = tmp_path / "text-model"
    HyperSetForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert (
        inspect(folder, "a gripping film", "two hours never again", "--output_dir", tmp_path / "texts") == 0
    )
    report = json.loads((tmp_path / "texts" / "inspect.json").read_text())
    assert report["hyperset"]["iterations"] == [0, 1, 2, 3, 4] and finite(
        report["hyperset"]["layers"][0]["feedforward_energy"]
    )


def test_bad_invocations_fail_with_a_message_and_write_nothing(demo, tmp_path, capsys):
    assert inspect("--output_dir", tmp_path / "a") == 2
    assert "give a MODEL_DIR, or --landscape" in capsys.readouterr().err
    assert inspect(demo("hyperbf"), "--output_dir", tmp_path / "b") == 2
    assert "give INPUTS (image paths or texts) or a labelled --dataset" in capsys.readouterr().err
    assert inspect(tmp_path / "missing", "x.png", "--output_dir", tmp_path / "c") == 2
    assert "the folder does not exist" in capsys.readouterr().err  # named before anything loads
    assert inspect(demo("hyperbf"), tmp_path / "nothing.png", "--output_dir", tmp_path / "d") == 2
    assert "no such file" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in "abcd")


def test_landscape_trajectories_end_in_stored_patterns_at_high_beta():
    result = energy_landscape(betas=(0.5, 8.0), num_starts=12)
    patterns = torch.tensor(LANDSCAPE_PATTERNS, dtype=torch.float64)
    low, high = result["end_distance_to_nearest_pattern"]
    # a convergence threshold, not rounding: the descent's fixed number of steps ends within about 1e-5 of a
    # pattern at high β, and 1e-3 is far below the patterns' spacing
    assert (high < 1e-3).all(), f"high-β end points are {high.max():.2e} from the nearest pattern"
    assert (
        len(torch.unique(torch.cdist(result["trajectories"][1][-1], patterns).argmin(-1))) >= 3
    )  # several basins
    # at low β the patterns merge: one minimum (the metastable average), far from every pattern
    assert len(result["end_points"][0]) == 1 and (low > 0.5).all()
    # every stored pattern is a local minimum at high β: lower than a ring of points around it
    angles = torch.arange(8, dtype=torch.float64) * math.pi / 4
    ring = 0.15 * torch.stack([angles.cos(), angles.sin()], -1)  # (8, 2)
    for pattern in patterns:
        points = torch.cat([pattern[None], pattern + ring])[:, None]  # (9, 1, 2)
        energy = hopfield_energy(points, patterns.expand(9, -1, -1), 8.0)
        assert (energy[1:] > energy[0]).all()
    # the energy never increases along a trajectory (step 0.3, below the bound 2)
    path = result["trajectories"][1]  # (steps + 1, starts, 2)
    steps, starts = path.shape[:2]
    energies = hopfield_energy(path.reshape(-1, 1, 2), patterns.expand(steps * starts, -1, -1), 8.0)
    # near the minima successive energies agree to rounding: each float64 energy of a 2-D point is 5 dot products
    # of length 2, a logsumexp over 5 patterns and a squared norm (about a dozen roundings); 32 for the difference
    # of two, in ulps of the largest |E|
    rises = energies.view(steps, starts).diff(dim=0)
    bound = rounding(torch.float64, 32, energies.abs().max().item())
    assert (rises <= bound).all(), f"the energy rose by {rises.max().item():.3g} > {bound:.3g}"


def test_landscape_command_writes_the_figure_and_numbers(tmp_path):
    assert inspect("--landscape", "--output_dir", tmp_path) == 0
    assert_png(tmp_path / "energy_landscape.png")
    report = json.loads((tmp_path / "inspect.json").read_text())["landscape"]
    assert report["betas"] == [0.5, 2.0, 8.0] and len(report["trajectories"]) == 3
    assert max(report["end_distance_to_nearest_pattern"][-1]) < 1e-3  # convergence, as in the test above


def test_a_truncated_model_and_an_output_file_are_one_line_errors(demo, tmp_path, capsys):
    """Each names the path; nothing is drawn and no traceback is printed."""
    import shutil

    source = demo("hyperset")
    capsys.readouterr()  # the demo model's training output
    folder = tmp_path / "truncated"
    shutil.copytree(source, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    image = tmp_path / "x.png"
    Image.new("L", (8, 8)).save(image)
    assert inspect(folder, image, "--output_dir", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "truncated" in err, err
    assert f"{folder}: {weights.name} cannot be read" in err and err.count(str(folder)) == 1, err
    assert not (tmp_path / "out").exists()

    taken = tmp_path / "report.txt"
    taken.write_text("mine")
    assert inspect(source, image, "--output_dir", taken) == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"energyformers inspect: error: --output_dir {taken}: is a file, not a folder; name a folder to write into"
    ), err
    assert taken.read_text() == "mine"


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("metrics.json", "[]", "metrics.json: holds a JSON list, not an object"),
        ("metrics.json", "{", "metrics.json: not valid JSON"),
        ("trainer_state.json", '"x"', "trainer_state.json: holds a JSON str, not an object"),
    ],
)
def test_a_log_history_file_of_the_wrong_shape_is_refused_in_the_shared_words(tmp_path, name, text, expected):
    """A run's record that is not a JSON object is refused as export refuses it, with what to do about it."""
    (tmp_path / name).write_text(text)
    with pytest.raises(InspectError) as caught:
        run_log_history(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / name}: ") and expected in message, message
    assert message.endswith("delete it to inspect the folder without its training curve."), message


def test_a_log_history_file_without_log_history_falls_through_to_the_next(tmp_path):
    (tmp_path / "metrics.json").write_text('{"model": "hyperset"}')
    assert run_log_history(tmp_path) is None
    (tmp_path / "trainer_state.json").write_text('{"log_history": [{"step": 1}, 3]}')
    assert run_log_history(tmp_path) == ([{"step": 1}], "trainer_state.json")
