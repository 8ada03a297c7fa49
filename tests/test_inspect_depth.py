"""`energyformers inspect` and the depths a model was trained at: a sampled depth (`iteration_sampling`) trains every
depth of its range, so the figures shade that range and call only the depths past its largest "beyond";
`inspect.json` records the range (`trained_depths`). The figures' text is read from the matplotlib figure as it is
saved (no pixels).

The models are tiny and untrained (a digits label set, 8 × 8 RGB images): what is tested is which depths count as
trained, not an accuracy.
"""

from __future__ import annotations

import json
import math

import matplotlib.figure
import pytest
import torch
from fixtures import saved_digits_classifier

from energyformers import (
    HyperSetConfig,
    LoopedTransformerConfig,
)
from energyformers.training import cli
from energyformers.training.inspect import (
    BEYOND,
    INTERMEDIATE,
    TRAINED,
    default_deepest,
    depth_regime,
    trained_depths,
    training_curve,
)


def regimes(trained: dict, deepest: int) -> dict[int, str]:
    return {depth: depth_regime(depth, trained) for depth in range(deepest + 1)}


# ------------------------------------------------------------------------------ the decision


def test_a_uniform_sampled_model_counts_its_whole_sampled_range_as_trained():
    # the audited demo model: T = 4, drawn uniformly from [2, 12] in training
    config = HyperSetConfig(
        num_iterations=4, iteration_sampling="uniform", min_iterations=2, max_iterations=12
    )
    trained = trained_depths(config, "num_iterations")
    assert trained == {"argument": "num_iterations", "iteration_sampling": "uniform", "default": 4, "min": 2,
                       "max": 12}, trained  # fmt: skip
    expected = (
        {0: INTERMEDIATE, 1: INTERMEDIATE} | dict.fromkeys(range(2, 13), TRAINED) | {13: BEYOND, 16: BEYOND}
    )
    got = regimes(trained, 16)
    assert all(got[d] == r for d, r in expected.items()), got
    assert default_deepest(trained) == 16, default_deepest(trained)  # 4 past the largest trained depth


def test_the_sampled_range_defaults_are_the_configs():
    # uniform without bounds: T ± T//2; poisson-lognormal: clipped to [1, 4T]
    uniform = trained_depths(HyperSetConfig(num_iterations=6, iteration_sampling="uniform"), "num_iterations")
    assert (uniform["min"], uniform["max"]) == (3, 9), uniform
    poisson = trained_depths(
        LoopedTransformerConfig(num_iterations=4, iteration_sampling="poisson-lognormal"), "num_iterations"
    )
    assert (poisson["min"], poisson["max"], poisson["iteration_sampling"]) == (1, 16, "poisson-lognormal"), (
        poisson
    )
    assert regimes(poisson, 17)[1] == TRAINED and regimes(poisson, 17)[17] == BEYOND, regimes(poisson, 17)


def test_a_fixed_depth_model_is_trained_at_T_alone_and_beyond_it_past_T():
    # min/max_iterations are ignored at fixed depth: only T ended a training forward
    config = HyperSetConfig(num_iterations=4, min_iterations=2, max_iterations=12)
    trained = trained_depths(config, "num_iterations")
    assert (trained["iteration_sampling"], trained["min"], trained["max"]) == ("fixed", 4, 4), trained
    assert regimes(trained, 8) == {0: INTERMEDIATE, 1: INTERMEDIATE, 2: INTERMEDIATE, 3: INTERMEDIATE, 4: TRAINED,
                                   5: BEYOND, 6: BEYOND, 7: BEYOND, 8: BEYOND}  # fmt: skip
    assert default_deepest(trained) == 8, default_deepest(trained)  # 2T, as before sampled depth was read


# ------------------------------------------------------------------------------ inspect.json


def inspect(*argv: object) -> int:
    return cli.main(["inspect", *map(str, argv)])


@pytest.mark.parametrize(
    ("family", "sampling", "expected_range", "expected_depths"),
    [
        # T = 2 drawn from [2, 4]: the default curve runs 2 past 4
        ("hyperset", dict(iteration_sampling="uniform", min_iterations=2, max_iterations=4), (2, 4), 6),
        ("hyperset", dict(iteration_sampling="fixed"), (2, 2), 4),
        ("looped", dict(iteration_sampling="uniform", min_iterations=1, max_iterations=3), (1, 3), 5),
    ],
)
def test_inspect_json_records_the_trained_depth_range(
    tmp_path, family, sampling, expected_range, expected_depths
):
    torch.manual_seed(0)
    folder = saved_digits_classifier(family, tmp_path / "model", **sampling)
    out = tmp_path / "out"
    argv = [folder, "--dataset", "digits", "--max_samples", "8", "--output_dir", out, "--num_threads", "1"]
    assert inspect(*argv) == 0
    report = json.loads((out / "inspect.json").read_text())
    record = report.get("trained_depths")
    assert record == {
        "argument": "num_iterations",
        "iteration_sampling": sampling["iteration_sampling"],
        "default": 2,
        "min": expected_range[0],
        "max": expected_range[1],
    }, record
    curve = report["accuracy_vs_iterations"]
    assert curve["iterations"] == list(range(1, expected_depths + 1)), curve["iterations"]
    if family == "hyperset":  # the energies run as deep as the accuracy curve
        assert report["hyperset"]["iterations"] == list(range(expected_depths + 1)), report["hyperset"]


# ------------------------------------------------------------------------------ the training curve's text


@pytest.fixture
def saved_figures(monkeypatch: pytest.MonkeyPatch) -> list[matplotlib.figure.Figure]:
    """Every figure saved while the test runs (drawn, before `inspect` closes it)."""
    figures: list[matplotlib.figure.Figure] = []
    save = matplotlib.figure.Figure.savefig

    def record(self: matplotlib.figure.Figure, *args: object, **kwargs: object) -> None:
        figures.append(self)
        save(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    return figures


def nine_class_history() -> list[dict]:
    """A 9-class run whose first losses sit far above 1.5 × ln 9 (so the loss axis is clipped), evaluated at
    t = 2, 4, 8 and 16."""
    history: list[dict] = []
    for step in range(10, 201, 10):
        history.append({"loss": 6.0 * math.exp(-step / 40) + 0.5, "step": step})
        if step % 50 == 0:
            history.append(
                {f"eval_accuracy_iterations_{t}": 0.1 + step / 400 for t in (2, 4, 8, 16)} | {"step": step}
            )
    return history


def test_the_clip_note_is_in_the_loss_panels_title_and_only_depths_past_the_range_are_beyond(
    tmp_path, saved_figures
):
    config = HyperSetConfig(input_type="sequence", vocab_size=10, max_position_embeddings=81, num_labels=9,
                            num_iterations=4, iteration_sampling="uniform", min_iterations=2, max_iterations=12)  # fmt: skip
    training_curve(
        nine_class_history(), "metrics.json", config, "token-classification", tmp_path / "curve.png"
    )
    (figure,) = saved_figures
    left, right = figure.axes[:2]
    # the note cannot sit under the legend: it is in the title, and no text inside the axes carries it
    assert "clipped at 1.5" in left.get_title(), left.get_title()
    inside = [text.get_text() for ax in figure.axes for text in ax.texts]
    assert not any("clipped" in text for text in inside), inside
    labels = [line.get_label() for line in right.get_lines() if line.get_label().startswith("t = ")]
    # 2, 4 and 8 were trained depths of this model ([2, 12]); 16 is past them
    assert labels == ["t = 2 (0.5T)", "t = 4 (T)", "t = 8 (2T)", "t = 16 (4T, beyond training)"], labels
