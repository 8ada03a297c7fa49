"""`train_tokenizer` gives the same WordPiece tokenizer, ids included, in every process.

The `tokenizers` trainer breaks ties between equally frequent pairs in an order that its randomly seeded hash maps
set anew in each process; `train_tokenizer` fixes that order and numbers the vocabulary canonically, so two text
runs with the same seed train the same model.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures import cli_config, require_dataset
from tokenizers import decoders, models, trainers
from transformers import AutoTokenizer

from energyformers.training.processing import (
    SPECIAL_TOKENS,
    bert_tokenizer,
    canonical_wordpiece,
    train_tokenizer,
)

VOCAB_SIZE = 120
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def corpus(count: int = 300) -> list[str]:
    """`count` seeded sentences of made-up words: many pairs of tokens are equally frequent, so the trainer's
    tie-breaking decides ids and tokens. Some words share overlapping pairs of the same count ("xbcd", "ybcd":
    "##b"+"##c" and "##c"+"##d" tie)."""
    rng = random.Random(0)
    syllables = [
        "ka",
        "ro",
        "mi",
        "tan",
        "preg",
        "nant",
        "lo",
        "ver",
        "is",
        "ut",
        "ba",
        "che",
        "qu",
        "en",
        "st",
    ]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(120)]
    texts = [" ".join(rng.choices(words, k=rng.randint(4, 12))).capitalize() + "." for _ in range(count)]
    return [*texts, "xbcd ybcd zbcd", "xbcd ybcd zbcd"]


SENTENCES = [
    "Kamiro tanpreg nant, lover!",
    "QUENST ba-che 42 times",
    "unseen letters: ñ ψ 漢字",
    "a" * 150,  # longer than max_input_chars_per_word: one [UNK]
    "xbcd wbcd bcd",
]


def test_the_same_texts_give_the_same_vocabulary_in_separate_processes(tmp_path: Path) -> None:
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps(corpus()))
    code = textwrap.dedent(
        f"""
        import json, sys
        from energyformers.training.processing import train_tokenizer
        texts = json.loads(open(sys.argv[1]).read())
        print(train_tokenizer(texts, vocab_size={VOCAB_SIZE}, max_length=32).backend_tokenizer.to_str())
        """
    )
    # each child's hash maps are seeded anew: the case the trainer alone gets wrong
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(texts)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for _ in range(3)
    ]
    outputs = [proc.communicate(timeout=240) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-2000:]
    vocabs = [json.loads(out)["model"]["vocab"] for out, _ in outputs]
    for index, vocab in enumerate(vocabs[1:], start=1):
        moved = {token: (vocabs[0].get(token), vocab.get(token)) for token in vocabs[0].keys() | vocab.keys()}
        moved = {token: ids for token, ids in moved.items() if ids[0] != ids[1]}
        assert not moved, f"process {index} numbers {len(moved)} tokens otherwise than process 0: {moved}"
    assert [out for out, _ in outputs[1:]] == [outputs[0][0]] * 2, "same vocabulary, other tokenizer.json"


def plainly_trained(texts: list[str]):
    """The tokenizer as the `tokenizers` trainer alone leaves it: ids in the order it found the tokens in."""
    tokenizer = bert_tokenizer(models.WordPiece(unk_token="[UNK]"), decoders.WordPiece())
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, min_frequency=2)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def test_canonical_ids_change_the_ids_only() -> None:
    trained = plainly_trained(corpus())
    canonical = canonical_wordpiece(trained)
    vocab = canonical.get_vocab(with_added_tokens=False)
    assert vocab.keys() == trained.get_vocab(with_added_tokens=False).keys()
    by_id = sorted(vocab, key=vocab.__getitem__)
    assert by_id == SPECIAL_TOKENS + sorted(by_id[len(SPECIAL_TOKENS) :]), by_id[:20]
    assert sorted(vocab.values()) == list(range(len(vocab))), "ids are not 0..len-1"
    assert [t.content for t in canonical.get_added_tokens_decoder().values()] == SPECIAL_TOKENS
    for key in ("unk_token", "continuing_subword_prefix", "max_input_chars_per_word"):
        assert getattr(canonical.model, key) == getattr(trained.model, key), key
    for sentence in SENTENCES + corpus()[:20]:
        before, after = trained.encode(sentence), canonical.encode(sentence)
        assert after.tokens == before.tokens, sentence
        assert after.ids == [vocab[token] for token in before.tokens], sentence
        assert after.offsets == before.offsets, sentence
    assert canonical.encode("a" * 150).tokens == ["[UNK]"]


def test_sentence_pairs_and_special_ids_with_canonical_ids(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(corpus(), vocab_size=VOCAB_SIZE, max_length=64)
    ids = [tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id]
    assert ids == [0, 1, 2, 3], dict(zip(SPECIAL_TOKENS, ids, strict=True))
    first, second = SENTENCES[0], SENTENCES[1]
    single = [tokenizer(text)["input_ids"] for text in (first, second)]
    pair = tokenizer(first, second)
    assert single[0][0] == 2 and single[1][0] == 2, single
    assert pair["input_ids"] == single[0] + [3] + single[1][1:] + [3], pair["input_ids"]
    assert "token_type_ids" not in pair
    assert tokenizer.decode(pair["input_ids"], skip_special_tokens=True) == tokenizer.decode(
        single[0] + single[1], skip_special_tokens=True
    )
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(first, second)["input_ids"] == pair["input_ids"]


def test_two_text_runs_with_the_same_seed_save_the_same_model(tmp_path: Path) -> None:
    require_dataset("rotten_tomatoes")
    from energyformers.training import train

    argv = ["--model", "hyperset", "--dataset", "rotten_tomatoes", "--config", *cli_config("hyperset")]
    argv += ["--max_steps", "2", "--per_device_train_batch_size", "8", "--num_threads", "1", "--disable_tqdm"]
    argv += ["--max_train_samples", "64", "--max_eval_samples", "8", "--max_test_samples", "8"]
    argv += ["--vocab_size", "200", "--max_length", "32", "--seed", "3"]
    for run in ("a", "b"):  # in one process: each training of the tokenizer seeds new hash maps
        assert train.main([*argv, "--output_dir", str(tmp_path / run)]) == 0
    for name in ("tokenizer.json", "model.safetensors"):
        a, b = ((tmp_path / run / name).read_bytes() for run in ("a", "b"))
        assert a == b, f"{name} differs between two runs with the same seed"


@pytest.mark.parametrize("vocab_size", [60, VOCAB_SIZE])  # 48 characters and special tokens, then merges
def test_the_same_texts_give_the_same_vocabulary_in_one_process(vocab_size: int) -> None:
    texts = corpus()
    vocabs = [train_tokenizer(texts, vocab_size=vocab_size).get_vocab() for _ in range(3)]
    assert vocabs[1] == vocabs[0] and vocabs[2] == vocabs[0]
    assert len(vocabs[0]) == vocab_size
