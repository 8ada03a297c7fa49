"""`--config KEY=VALUE` (`train`, `train-accelerate`) and `Config.from_preset(name, **overrides)` check override
names with one function, the config class's own `_check_override_names`: the same names pass, and a refused one
reads the same (the closest names of a misspelling) in both, the CLI naming its flag where the API names its
method. The CLI's one rule of its own: the label keywords are the dataset's."""

from __future__ import annotations

from pathlib import Path

import pytest

import energyformers
from energyformers.training import accelerate_loop, setup, train
from energyformers.training.arguments import UsageError

QUICK = ["--max_steps", "1", "--max_train_samples", "16", "--max_eval_samples", "8", "--num_threads", "1"]
MAINS = {"train": train.main, "train-accelerate": accelerate_loop.main}


def refusal(capsys, loop: str, tmp_path: Path, *argv: str) -> str:
    """The one error line of `energyformers <loop> ... --config ...`, which must exit 2 and write nothing."""
    out = tmp_path / "out"
    code = MAINS[loop](["--dataset", "digits", "--output_dir", str(out), *QUICK, *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, (code, err)
    assert not out.exists() and not Path(f"{out}.checkpoints").exists(), sorted(tmp_path.iterdir())
    prefix = f"energyformers {loop}: error: "
    assert lines[0].startswith(prefix), lines
    return lines[0].removeprefix(prefix)


def from_preset_refusal(config_class: type, **overrides: object) -> str:
    """`from_preset`'s refusal of `overrides`, less the `<Class>.from_preset: ` it starts with."""
    with pytest.raises(ValueError) as raised:
        config_class.from_preset("cli-image", **overrides)
    message = str(raised.value)
    prefix = f"{config_class.__name__}.from_preset: "
    assert message.startswith(prefix), message
    return message.removeprefix(prefix)


@pytest.mark.parametrize("loop", sorted(MAINS))
@pytest.mark.parametrize("model", ["hyperset", "looped-transformer"])
def test_a_misspelt_name_reads_as_from_preset_words_it_with_the_same_closest_names(
    loop: str, model: str, tmp_path: Path, capsys
) -> None:
    expected = from_preset_refusal(setup.family(model).config_class, hiden_size=32)
    assert "closest names: ['hidden_size'" in expected, expected
    got = refusal(capsys, loop, tmp_path, "--model", model, "--config", "hiden_size=32")
    assert got == f"--config: {expected}", (got, expected)


def test_a_name_the_old_cli_check_took_is_refused_as_from_preset_refuses_it(tmp_path: Path, capsys) -> None:
    """`model_type` was taken by `--config` (the old check read every key of `PreTrainedConfig().to_dict()`) and
    then left unread; `from_preset` has always refused it. One check: both refuse it, in one wording."""
    expected = from_preset_refusal(energyformers.HyperSetConfig, model_type="hyperbf")
    got = refusal(capsys, "train", tmp_path, "--config", "model_type=hyperbf")
    assert got == f"--config: {expected}", (got, expected)


def test_a_transformers_keyword_from_preset_takes_is_taken_by_the_cli_too() -> None:
    """`problem_type` and `pad_token_id` are keywords `from_preset` takes; the old `--config` check refused
    `pad_token_id` (and `bos_token_id`, `torch_dtype`, `rope_scaling`, ...) as 'not fields of'."""
    for _, family in sorted(setup.model_registry().items()):
        overrides = {"problem_type": "single_label_classification", "pad_token_id": 0}
        setup.check_override_names(family.config_class, overrides)  # no UsageError
        if hasattr(family.config_class, "from_preset"):
            family.config_class.from_preset("cli-image", **overrides)


@pytest.mark.parametrize("name", ["num_labels", "id2label", "label2id"])
def test_a_label_keyword_in_config_is_refused_since_the_dataset_sets_the_labels(
    name: str, tmp_path: Path, capsys
) -> None:
    """Before, `id2label`/`label2id` passed the check and were replaced by the dataset's labels without a word."""
    value = {"num_labels": "3", "id2label": '{"0":"a"}', "label2id": '{"a":0}'}[name]
    got = refusal(capsys, "train", tmp_path, "--config", f"{name}={value}")
    assert got.startswith(f"--config {name}=") and "labels come from the dataset" in got, got
    assert f"drop {name}" in got, got


def test_a_config_class_without_its_own_check_gets_the_families_rule() -> None:
    """transformers' ViT (a CLI baseline) has no `_check_override_names`: the same rule, read off its signature."""
    from transformers import ViTConfig

    setup.check_override_names(ViTConfig, {"hidden_size": 64, "problem_type": "single_label_classification"})
    with pytest.raises(UsageError) as raised:
        setup.check_override_names(ViTConfig, {"hiden_size": 64})
    message = str(raised.value)
    assert message.startswith("--config: unknown override hiden_size=64; not a field of ViTConfig"), message
    assert "closest names: ['hidden_size'" in message, message
