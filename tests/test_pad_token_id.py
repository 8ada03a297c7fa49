"""`pad_token_id` is a declared config field, as BERT's: unset (None) unless given, checked, saved and loaded;
`energyformers train` writes its tokenizer's, and a `Trainer` given the package's tokenizer and a config holding its
pad id has nothing to align (transformers logs a notice when it aligns one)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from fixtures import BASELINE_TINY, TINY, TINY_SPLITS, Records, cli_config, require_dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

import energyformers
from energyformers.training import train
from energyformers.training.processing import train_tokenizer

CONFIGS = {**TINY, **BASELINE_TINY}
NOTICE = "The tokenizer has new PAD/BOS/EOS tokens"


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_pad_token_id_is_unset_unless_given_and_survives_a_round_trip(family, tmp_path):
    make = CONFIGS[family].config
    image, sequence, given = make("image"), make("sequence"), make("sequence", pad_token_id=3)
    got = (image.pad_token_id, sequence.pad_token_id, given.pad_token_id)
    assert got == (None, None, 3), f"{family}: (image, sequence, given 3) pad_token_id = {got}"
    for config in (image, sequence, given):
        config.save_pretrained(tmp_path / "config")
        saved = json.loads((tmp_path / "config" / "config.json").read_text())
        loaded = type(config).from_pretrained(tmp_path / "config")
        assert saved["pad_token_id"] == loaded.pad_token_id == config.pad_token_id, (
            family,
            config.input_type,
            saved.get("pad_token_id", "absent"),
            loaded.pad_token_id,
        )
        assert type(config).from_dict(config.to_dict()).to_dict() == config.to_dict()
    assert make("sequence", pad_token_id=np.int64(2)).to_dict()["pad_token_id"].__class__ is int


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("value", [-1, 1.5, "0", True])
def test_a_pad_token_id_that_is_no_token_id_is_refused_naming_it(family, value):
    with pytest.raises(
        ValueError, match=rf"invalid pad_token_id={value!r}; expected None or an integer >= 0"
    ):
        CONFIGS[family].config("sequence", pad_token_id=value)


def test_the_looped_baseline_takes_hyperset_s_pad_token_id():
    hyperset = TINY["hyperset"].config("sequence", pad_token_id=5)
    assert energyformers.LoopedTransformerConfig.from_hyperset(hyperset).pad_token_id == 5


def trainer_notices(model, tokenizer, tmp_path: Path) -> list[str]:
    """The messages transformers' Trainer logs while aligning the model's special tokens with `tokenizer` (in
    `train`, before the first step): one step on two tokenized texts."""
    texts = tokenizer(["a good film", "a bad film"], truncation=True, max_length=8)
    examples = [{"input_ids": ids, "labels": label} for ids, label in zip(texts["input_ids"], (0, 1))]
    arguments = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    records = Records()
    # transformers' loggers do not propagate to caplog
    logger = logging.getLogger("transformers.trainer_utils")
    logger.addHandler(records)
    try:
        Trainer(model=model, args=arguments, train_dataset=examples, processing_class=tokenizer).train()
    finally:
        logger.removeHandler(records)
    return [message for message in records.messages if NOTICE in message]


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_trainer_aligns_an_unset_pad_token_id_and_has_nothing_to_align_when_it_is_given(family, tmp_path):
    tokenizer = train_tokenizer(["a good film", "a bad film", "good", "bad"] * 5, vocab_size=50, max_length=8)
    sizes = dict(vocab_size=len(tokenizer), max_position_embeddings=8, num_labels=2)
    given = CONFIGS[family].config("sequence", pad_token_id=tokenizer.pad_token_id, **sizes)
    assert (
        trainer_notices(AutoModelForSequenceClassification.from_config(given), tokenizer, tmp_path) == []
    ), family
    # unset, Trainer takes the tokenizer's and logs it: the field is there for transformers' tools to set
    model = AutoModelForSequenceClassification.from_config(CONFIGS[family].config("sequence", **sizes))
    notices = trainer_notices(model, tokenizer, tmp_path)
    assert len(notices) == 1 and model.config.pad_token_id == tokenizer.pad_token_id, (
        family,
        notices,
        model.config.pad_token_id,
    )


def test_a_cli_text_run_saves_its_tokenizer_s_pad_token_id(tmp_path):
    require_dataset("rotten_tomatoes")
    out = tmp_path / "run"
    quick = ["--max_steps", "1", "--per_device_train_batch_size", "8", "--num_threads", "1", "--disable_tqdm"]
    argv = ["--model", "imixer", "--dataset", "rotten_tomatoes", "--output_dir", out, "--config"]
    argv += [*cli_config("imixer"), *quick, *TINY_SPLITS, "--vocab_size", "300", "--max_length", "32"]
    assert train.main([str(a) for a in argv]) == 0
    config = json.loads((out / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.pad_token_id is not None
    assert config["pad_token_id"] == tokenizer.pad_token_id, (
        config.get("pad_token_id"),
        tokenizer.pad_token_id,
    )
