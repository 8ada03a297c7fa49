"""`energyformers inspect` of a Hub repo whose config cannot load: one error line (status 2), in the words predict
and evaluate use for the same repo (`predict.cannot_load`), however many lines transformers' own message has."""

from __future__ import annotations

import pytest
import transformers
from huggingface_hub import constants

from energyformers.training import cli
from energyformers.training.predict import cannot_load

REPO = "org/unserved"
# transformers' messages run over several lines (what was not found, then advice on tokens and folders)
FAILURES = {
    "not-served": OSError(
        f"{REPO} is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'"
        "\nIf this is a private repository, make sure to pass a token having permission to this repo"
    ),
    "invalid-config": ValueError("invalid image_size=8;\n  both sides must be divisible by patch_size=3"),
}


@pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
def test_a_config_that_cannot_load_is_one_line_in_predicts_words(monkeypatch, tmp_path, capsys, failure):
    def refuse(*args, **kwargs):
        raise failure

    # the repo id passes the argument checks as one the Hub may serve; its config then fails to load
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", refuse)
    output = tmp_path / "out"
    code = cli.main(["inspect", REPO, "image.png", "--output_dir", str(output)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.splitlines() == [f"energyformers inspect: error: {cannot_load(REPO, failure)}"], err
    assert "\n" not in cannot_load(REPO, failure)
    assert not output.exists()
