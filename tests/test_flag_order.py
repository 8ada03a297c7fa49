"""Flag errors of `energyformers train` / `train-accelerate` come before the dataset loads (`setup.build`).

A check that needs no data runs before `setup.load_data` is called, with the message it gave when it ran after the
data loaded; what depends on the data (its input type, image size, vocabulary, labels) is still decided with it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import energyformers
from energyformers.training import accelerate_loop, setup, train
from energyformers.training.arguments import parse_arguments
from energyformers.training.cli import UsageError

MAIN = {"train": train.main, "train-accelerate": accelerate_loop.main}
# What every run here adds: small limits, so a run that does load the data builds quickly.
SMALL = ["--max_steps", "1", "--max_train_samples", "8", "--max_eval_samples", "4", "--max_test_samples", "4"]


class DataLoaded(Exception):
    """Raised by the stand-in loader: the data was asked for."""


@pytest.fixture
def no_data(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`setup.load_data` replaced by one that records the dataset asked for and raises `DataLoaded`."""
    asked: list[str] = []

    def refuse(name: str, **_: Any) -> None:
        asked.append(name)
        raise DataLoaded(name)

    monkeypatch.setattr(setup, "load_data", refuse)
    return asked


@pytest.fixture
def counted_data(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`setup.load_data` as it is, recording each dataset it loads."""
    asked: list[str] = []
    load = setup.load_data

    def counting(name: str, **kwargs: Any) -> Any:
        asked.append(name)
        return load(name, **kwargs)

    monkeypatch.setattr(setup, "load_data", counting)
    return asked


def run(command: str, argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    status = MAIN[command]([*argv, "--output_dir", str(tmp_path / "out"), *SMALL])
    return status, capsys.readouterr().err.strip()


# (flags, the start of the one-line message after "energyformers <command>: error: ") of flag errors that need no
# data; each message is the one `build` gave after loading the data.
EARLY = [
    (
        ["--config", "no_such_field=1"],
        "--config: unknown override no_such_field=1; not a field of HyperSetConfig",
    ),
    (
        ["--config", "hidden_size=-3"],
        "invalid --preset/--config for hyperset: HyperSetConfig: invalid hidden_size=-3; expected an integer >= 1.",
    ),
    (
        ["--config", "hidden_act=bogus"],
        "invalid --preset/--config for hyperset: HyperSetConfig: invalid hidden_act='bogus'; expected one of "
        "['relu', 'gelu'].",
    ),
    (
        ["--config", "num_labels=3"],
        "--config num_labels=3: the labels come from the dataset",
    ),
    (
        ["--preset", "no_such_preset"],
        "invalid --preset/--config for hyperset: HyperSetConfig: unknown preset name='no_such_preset'",
    ),
    (  # a traceback (status 1) once the data had loaded
        ["--model", "vit", "--preset", "cli-image"],
        "--preset cli-image: vit has no presets (ViTConfig is transformers' own config); size it with --config",
    ),
    (  # the CLI's width (128 for images and texts alike) against a --config head count
        ["--config", "num_attention_heads=5"],
        "invalid --preset/--config for hyperset: HyperSetConfig: invalid hidden_size=128; it must be divisible by "
        "num_attention_heads=5.",
    ),
    (
        ["--min_iterations", "9", "--max_iterations", "3", "--config", "iteration_sampling=uniform"],
        "invalid --min_iterations 9 and --max_iterations 3: HyperSetConfig: invalid min_iterations=9; it must not "
        "exceed max_iterations=3.",
    ),
    (  # the message names no field of the baseline's config; the refusal declares the one it refuses
        ["--model", "looped-transformer", "--config", "qkv_norm=shared"],
        "invalid --preset/--config for looped-transformer: LoopedTransformerConfig: invalid qkv_norm='shared'; a "
        "Hyper-SET option that the looped-Transformer baseline does not have",
    ),
    (
        ["--model", "vit", "--min_iterations", "2"],
        "--min_iterations 2: vit has no such setting (ViTConfig has no min_iterations field)",
    ),
    (
        ["--drop_path_rate", "0.1"],
        "--drop_path_rate 0.1: hyperset has no such setting (HyperSetConfig has no drop_path_rate field)",
    ),
    (
        ["--model", "vit", "--eval_iterations", "2"],
        "--eval_iterations 2: vit has no recurrent depth (no per-call num_iterations); drop the flag",
    ),
    (
        ["--model", "imixer", "--attn_implementation", "sdpa"],
        "--attn_implementation sdpa: imixer models take one of eager",
    ),
    (
        ["--deep_supervision", "all", "--label_smoothing", "0.1"],
        "--deep_supervision all: the batch augmentation / label smoothing of this run computes the training loss",
    ),
    (
        ["--task", "masked-image-modeling", "--deep_supervision", "all"],
        "--deep_supervision all: the masked-image-modelling heads take the loss at the last iteration only",
    ),
    (
        ["--task", "masked-image-modeling", "--config", "hidden_size=-1"],
        "invalid --preset/--config for hyperset masked image modelling: HyperSetConfig: invalid hidden_size=-1;",
    ),
    (
        ["--task", "masked-image-modeling", "--preset", "nope"],
        "invalid --preset/--config for hyperset masked image modelling: HyperSetConfig: unknown preset name='nope'",
    ),
    (
        ["--task", "masked-image-modeling", "--model", "imixer"],
        "--task masked-image-modeling: --model imixer has no masked-image-modelling head",
    ),
]


@pytest.mark.parametrize("flags, message", EARLY, ids=[" ".join(flags) for flags, _ in EARLY])
def test_a_flag_error_that_needs_no_data_comes_before_the_data_loads(
    flags, message, no_data, tmp_path, capsys
):
    status, err = run("train", ["--dataset", "digits", *flags], tmp_path, capsys)
    assert no_data == [], f"the dataset was loaded before the flag error; stderr:\n{err}"
    assert status == 2, f"status {status}, stderr:\n{err}"
    assert err.startswith(f"energyformers train: error: {message}"), err
    assert len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


# One of each kind for the Accelerate loop (it builds through the same `setup.build`).
ACCELERATE = [
    case
    for case in EARLY
    if case[0]
    in (
        ["--config", "hidden_size=-3"],
        ["--deep_supervision", "all", "--label_smoothing", "0.1"],
        ["--task", "masked-image-modeling", "--deep_supervision", "all"],
    )
]


@pytest.mark.parametrize("flags, message", ACCELERATE, ids=[" ".join(flags) for flags, _ in ACCELERATE])
def test_the_accelerate_loop_refuses_them_before_the_data_too(flags, message, no_data, tmp_path, capsys):
    assert len(ACCELERATE) == 3
    status, err = run("train-accelerate", ["--dataset", "digits", *flags], tmp_path, capsys)
    assert (no_data, status) == ([], 2), f"loaded {no_data}, status {status}, stderr:\n{err}"
    assert err.startswith(f"energyformers train-accelerate: error: {message}"), err
    assert len(err.splitlines()) == 1, err


def _saved_image_classifier(folder: Path) -> Path:
    from energyformers import HyperSetConfig, HyperSetForImageClassification
    from energyformers.training.processing import build_image_processor

    config = HyperSetConfig.from_preset(
        "cli-image", image_size=16, patch_size=4, num_labels=10, hidden_size=32, num_attention_heads=4
    )
    HyperSetForImageClassification(config).save_pretrained(folder)
    build_image_processor(config).save_pretrained(folder)
    return folder


def test_a_bad_config_over_a_checkpoint_comes_before_the_data_loads(no_data, tmp_path, capsys):
    folder = _saved_image_classifier(tmp_path / "model")
    capsys.readouterr()  # the save's progress bar
    for flags, message in (
        (
            ["--config", "hidden_act=bogus"],
            "invalid --config for hyperset: HyperSetConfig: invalid hidden_act=",
        ),
        (["--model", "imixer"], f"--model imixer but {str(folder)!r} is a 'hyperset' checkpoint"),
        (["--config", "no_such=1"], "--config: unknown override no_such=1; not a field of HyperSetConfig"),
    ):
        status, err = run(
            "train", ["--dataset", "digits", "--from_pretrained", str(folder), *flags], tmp_path, capsys
        )
        assert (no_data, status) == ([], 2), f"{flags}: loaded {no_data}, status {status}, stderr:\n{err}"
        assert err.startswith(f"energyformers train: error: {message}"), err


# Flags whose fault depends on the data: accepted before it loads, refused with the data's values after.
LATE = [
    (
        ["--config", "patch_size=3"],
        "invalid --preset/--config for hyperset: HyperSetConfig: invalid image_size=16; both sides must be "
        "divisible by patch_size=3.",
    ),
    (
        ["--config", "input_type=sequence"],
        "--config input_type='sequence' but 'digits' is a dataset for image-classification",
    ),
    (
        ["--config", "position_embedding_type=sincos-2d"],
        "invalid --preset/--config for hyperset: HyperSetConfig: invalid position_embedding_type='sincos-2d'; the "
        'row/column table is for input_type="sequence"',
    ),
    (
        ["--task", "masked-image-modeling", "--config", "max_position_embeddings=7"],
        "--config max_position_embeddings=7: the image tokenizer sets max_position_embeddings=64",
    ),
    (  # a cross-field rule refusing the image preset's min_iterations=2 (a text run's sets none): named by the
        # flag among the fields the rule reads, though the message starts with another field
        ["--max_iterations", "1"],
        "invalid --max_iterations 1: HyperSetConfig: invalid min_iterations=2; it must not exceed max_iterations=1.",
    ),
    (  # a preset made for Sudoku boards is not re-purposed as an image model
        ["--preset", "sudoku"],
        "--preset sudoku: a preset for sequence inputs, and --dataset digits (image-classification) has image "
        "inputs; use one of ['cifar10-small',",
    ),
]


@pytest.mark.parametrize("flags, message", LATE, ids=[" ".join(flags) for flags, _ in LATE])
def test_a_flag_error_that_depends_on_the_data_is_decided_with_it(
    flags, message, counted_data, tmp_path, capsys
):
    status, err = run("train", ["--dataset", "digits", *flags], tmp_path, capsys)
    assert (counted_data, status) == (["digits"], 2), (
        f"loaded {counted_data}, status {status}, stderr:\n{err}"
    )
    assert err.startswith(f"energyformers train: error: {message}"), err


# Flags that only some data allows: accepted before loading (no early refusal of a run that builds).
BUILDS = [
    ["--dataset", "sudoku", "--config", "position_embedding_type=sincos-2d"],
    ["--dataset", "digits", "--config", "image_size=30"],  # tiled by the patch the data sets (2)
    ["--dataset", "digits", "--config", "image_size=18", "patch_size=3"],
    [
        "--dataset",
        "rotten_tomatoes",
        "--config",
        "position_embedding_type=learned",
        "max_position_embeddings=64",
    ],
    ["--dataset", "digits", "--task", "masked-image-modeling", "--config", "hidden_size=64"],
    ["--dataset", "sudoku", "--preset", "sudoku", "--config", "hidden_size=24", "num_attention_heads=2"],
]


@pytest.mark.parametrize("argv", BUILDS, ids=[" ".join(a) for a in BUILDS])
def test_flags_the_data_allows_still_build(argv, counted_data, tmp_path):
    from accelerate import PartialState

    args = parse_arguments([*argv, "--output_dir", str(tmp_path / "out"), *SMALL], train.PROG, "test")
    built = setup.build(args, PartialState())
    assert counted_data == [argv[1]]
    assert built.model.config.model_type == "hyperset"


@pytest.mark.parametrize("dataset", ["digits", "sudoku", "rotten_tomatoes"])
def test_the_fields_the_data_sets_are_the_listed_ones(dataset):
    """`setup.DATA_FIELDS` lists every config field a classification run takes from its data: the config built
    from the data differs from the CLI's config of that input type only there (a field missing from the list would
    let a refusal that depends on the data be raised before it loads)."""
    from accelerate import PartialState

    args = parse_arguments(["--dataset", dataset, "--output_dir", "unused"], train.PROG, "test")
    data, _ = setup.load_and_check_data(args, PartialState())
    config, _ = setup.build_config_and_processor(args, data, PartialState())
    modality = config.input_type
    cli = {"input_type": modality, "vocab_size": 1, **setup.cli_preset("hyperset", modality)}
    bare = energyformers.HyperSetConfig(**cli)
    differing = {
        name
        for name in config.to_dict().keys() | bare.to_dict().keys()
        if config.to_dict().get(name) != bare.to_dict().get(name)
    }
    assert differing <= set(setup.DATA_FIELDS), (
        f"set from the data but not listed: {differing - set(setup.DATA_FIELDS)}"
    )


class OtherFileConfigError(ValueError):
    """A refusal as another configuration file's own `ConfigValueError` class words it: only `fields` in common."""

    def __init__(self, message: str, fields: tuple[str, ...]) -> None:
        super().__init__(message)
        self.fields = fields


def refusing(err: Exception) -> Any:
    def make() -> Any:
        raise err

    return make


def test_a_trial_refusal_is_judged_by_the_fields_it_declares_not_by_its_words():
    """`_trial_configs` raises a refusal before the data loads only when every trial declares the fields it involves
    and none of them is one the data sets; what the message happens to mention does not count."""
    unknown = {"image_size", "patch_size", "vocab_size"}
    what = "--preset/--config for fake"
    # involves hidden_size alone, mentions the data's image_size in passing: certain to recur, raised now
    passing = "FakeConfig: invalid hidden_size=7; too narrow for any image_size."
    with pytest.raises(UsageError, match=re.escape(f"invalid {what}: {passing}")):
        setup._trial_configs(
            [refusing(OtherFileConfigError(passing, ("hidden_size",)))] * 2, unknown, {}, what
        )
    # involves patch_size, which the data sets, though the words name no field: left to the build after loading
    unnamed = "FakeConfig: invalid tiling; the patches do not tile the image."
    declared = OtherFileConfigError(unnamed, ("hidden_size", "patch_size"))
    assert setup._trial_configs([refusing(declared)], unknown, {}, what) == []
    # a refusal that declares nothing (transformers' own configs) is not judged by its words either
    bare = ValueError("FakeConfig: invalid hidden_size=7; expected an integer >= 8.")
    assert setup._trial_configs([refusing(bare)], unknown, {}, what) == []
    # one trial declaring nothing leaves the refusal to the build, whatever the others declare
    same = OtherFileConfigError(bare.args[0], ("hidden_size",))
    assert setup._trial_configs([refusing(same), refusing(bare)], unknown, {}, what) == []
    # one trial that builds leaves it too: the data may have that trial's input type
    assert setup._trial_configs([refusing(same), lambda: "built"], unknown, {}, what) == ["built"]
