"""`--resume` of a text run: the tokenizer trained again at the start must map words to the checkpoint's ids, and a
refusal over what no flag sets (the tokenizer, the data's labels) does not ask to resume with other values."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from energyformers.training import train
from energyformers.training.arguments import UsageError

WORDS = ["dull", "awful", "boring", "okay", "average", "fine", "superb", "lovely", "great", "grand"]
VOCAB = 50  # full on this corpus (checked): a changed tokenizer keeps the config's vocab_size


def stars_csv(folder: Path) -> Path:
    """120 texts of 3 classes, seeded."""
    rng = random.Random(0)
    rows = ["text,label"]
    for i in range(120):
        label = i % 3
        pool = WORDS[label * 3 : label * 3 + 4]
        rows.append(f"{' '.join(rng.choice(pool) for _ in range(5))},{label}")
    path = folder / "stars.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def common(dataset: Path) -> list[str]:
    return [
        "--model",
        "hyperset",
        "--dataset",
        str(dataset),
        "--vocab_size",
        str(VOCAB),
        "--config",
        "hidden_size=16",
        "num_attention_heads=4",
        "intermediate_size=24",
        "num_hidden_layers=1",
        "num_iterations=2",
        "time_embedding_dim=16",
    ]


def built_run(argv: list[str]):
    from accelerate import PartialState

    from energyformers.training.setup import build

    args = train.parse([*argv, "--output_dir", "unused", "--num_threads", "1"])
    return args, build(args, PartialState())


def pre_sep_tokenizer(dataset: Path) -> Tokenizer:
    """The tokenizer the CLI trained before [SEP] was a special token: every word piece one id lower."""
    texts = [line.rsplit(",", 1)[0] for line in dataset.read_text().splitlines()[1:]]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=VOCAB, special_tokens=["[PAD]", "[UNK]", "[CLS]"], min_frequency=2
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def interrupted(tmp_path: Path, argv: list[str]) -> tuple[Path, Path, dict]:
    """(output folder, its Trainer checkpoint with the run's tokenizer.json, the run record) of `argv`."""
    from energyformers.training.setup import RUN_ARGUMENTS_FILE, record_run_arguments

    args, built = built_run(argv)
    assert len(built.processor) == VOCAB, f"the corpus must fill --vocab_size {VOCAB}: {len(built.processor)}"
    work = tmp_path / "run.checkpoints"
    checkpoint = work / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    built.model.config.to_json_file(str(checkpoint / "config.json"))
    built.processor.save_pretrained(str(checkpoint))
    record_run_arguments(args, built, work)
    return tmp_path / "run", checkpoint, json.loads((work / RUN_ARGUMENTS_FILE).read_text())


def rewrite_record(checkpoint: Path, record: dict) -> None:
    from energyformers.training.setup import RUN_ARGUMENTS_FILE

    (checkpoint.parent / RUN_ARGUMENTS_FILE).write_text(json.dumps(record))


def resumed(argv: list[str], out: Path):
    """`(args, Built)` of `argv --resume` in `out`, as `train.run` has them before it checks the record."""
    from accelerate import PartialState

    from energyformers.training.setup import build

    args = train.parse([*argv, "--resume", "--output_dir", str(out), "--num_threads", "1"])
    return args, build(args, PartialState())


def test_resume_encodes_with_the_run_tokenizer_not_one_trained_again(tmp_path: Path) -> None:
    """A resume reads the tokenizer the run saved, whatever the package would train now."""
    from energyformers.training.setup import check_resume_arguments

    argv = common(stars_csv(tmp_path))
    out, checkpoint, _record = interrupted(tmp_path, argv)
    saved = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).get_vocab(with_added_tokens=True)
    for attempt in range(3):
        args, built = resumed(argv, out)
        moved = {
            t: (i, built.processor.get_vocab().get(t))
            for t, i in saved.items()
            if built.processor.get_vocab().get(t) != i
        }
        assert not moved, (
            f"resume {attempt}: (saved id, id now) of {len(moved)} tokens: {dict(list(moved.items())[:5])}"
        )
        check_resume_arguments(args, built, checkpoint.parent, checkpoint)


def test_resume_of_a_run_recorded_before_reads_its_checkpoint_tokenizer(tmp_path: Path) -> None:
    """A run recorded before the work folder held its tokenizer, whose tokenizer predates [SEP]: as large (the
    config matches) but every word has another id. The Trainer checkpoint's tokenizer.json is the one used."""
    from energyformers.training.setup import check_resume_arguments

    dataset = stars_csv(tmp_path)
    argv = common(dataset)
    out, checkpoint, record = interrupted(tmp_path, argv)
    old = pre_sep_tokenizer(dataset)
    assert old.get_vocab_size() == VOCAB and old.token_to_id("[SEP]") is None, old.get_vocab_size()
    old.save(str(checkpoint / "tokenizer.json"))
    (checkpoint.parent / "tokenizer.json").unlink(missing_ok=True)
    record["built"].pop("tokenizer_vocabulary", None)
    rewrite_record(checkpoint, record)
    args, built = resumed(argv, out)
    ids = built.processor("okay great")["input_ids"]
    assert ids == old.encode("okay great").ids and built.processor.sep_token is None, (
        ids,
        old.encode("okay great"),
    )
    check_resume_arguments(args, built, checkpoint.parent, checkpoint)


def test_resume_refuses_when_the_run_tokenizer_is_gone(tmp_path: Path, capsys) -> None:
    """No tokenizer file left (an Accelerate step_N holds none): the one trained again differs from the recorded
    fingerprint (recorded by a version that numbered the words otherwise). Refused before training, one line,
    exit 2, nothing written."""
    from energyformers.training.setup import vocabulary_fingerprint

    dataset = stars_csv(tmp_path)
    argv = common(dataset)
    out, checkpoint, record = interrupted(tmp_path, argv)
    record["built"]["tokenizer_vocabulary"] = vocabulary_fingerprint(pre_sep_tokenizer(dataset))
    rewrite_record(checkpoint, record)
    (checkpoint.parent / "tokenizer.json").unlink(missing_ok=True)
    (checkpoint / "tokenizer.json").unlink()
    before = sorted(p.name for p in checkpoint.parent.rglob("*"))
    assert (
        train.main([*argv, "--max_steps", "4", "--resume", "--output_dir", str(out), "--num_threads", "1"])
        == 2
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("energyformers train:")]
    assert len(err) == 1 and err[0].startswith("energyformers train: error: --resume: "), err
    assert "tokenizer trained again maps words to other ids" in err[0], err
    assert "train in another --output_dir" in err[0] and "resume with those values" not in err[0], err
    assert sorted(p.name for p in checkpoint.parent.rglob("*")) == before and not out.exists()


def test_resume_refusal_over_the_data_labels_does_not_ask_for_values_no_flag_sets(tmp_path: Path) -> None:
    """Labels 1..3 recorded by a version that made max+1 classes: id2label differs, and no flag sets it."""
    from energyformers.training.setup import check_resume_arguments

    argv = common(stars_csv(tmp_path))
    _out, checkpoint, record = interrupted(tmp_path, argv)
    config = record["built"]["config"]
    config["id2label"] = {str(i): str(i) for i in range(4)}
    config["label2id"] = {str(i): i for i in range(4)}
    rewrite_record(checkpoint, record)
    with pytest.raises(UsageError) as caught:
        check_resume_arguments(*built_run(argv), checkpoint.parent, checkpoint)
    message = str(caught.value)
    assert 'config id2label={"0": "0", "1": "1", "2": "2", "3": "3"}' in message, message
    assert "resume with those values" not in message and "train in another --output_dir" in message, message


def test_resume_with_another_vocab_size_names_the_flag(tmp_path: Path) -> None:
    """--vocab_size is a flag: a resume that changes it is told the recorded value."""
    from energyformers.training.setup import check_resume_arguments

    dataset = stars_csv(tmp_path)
    _out, checkpoint, _record = interrupted(tmp_path, common(dataset))
    changed = common(dataset)
    changed[changed.index("--vocab_size") + 1] = "30"
    with pytest.raises(UsageError) as caught:
        check_resume_arguments(*built_run(changed), checkpoint.parent, checkpoint)
    message = str(caught.value)
    assert "has --vocab_size 30" in message and f"trained with --vocab_size {VOCAB}" in message, message
    assert "resume with those values" in message, message
