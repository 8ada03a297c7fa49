"""The commands' `--help` texts: each option has one, and the `--attn_implementation` choices it states for each
model type are the ones the flag's check (`ATTN_IMPLEMENTATIONS`) accepts."""

from __future__ import annotations

import argparse
import re

import pytest

from energyformers.training import convert_cli, evaluate, export, predict, push, release, train
from energyformers.training import inspect as inspect_cli
from energyformers.training.arguments import ATTN_IMPLEMENTATIONS, build_parser

PARSERS = {
    "train": lambda: build_parser(train.PROG, ""),
    "predict": predict.build_parser,
    "evaluate": evaluate.build_parser,
    "inspect": inspect_cli.build_parser,
    "export": export.build_parser,
    "push": push.build_parser,
    "release": release.build_parser,
    "convert": convert_cli.build_parser,
}


def stated_implementations(help_text: str) -> dict[str, set[str]]:
    """`{model_type: {names}}` from a help text's "(type[, type]: name, name; ...)" part."""
    (inner,) = re.findall(r"\(([^()]*:[^()]*)\)", help_text)
    stated: dict[str, set[str]] = {}
    for group in inner.split(";"):
        types, names = group.split(":")
        for model_type in types.split(","):
            stated[model_type.strip()] = {name.strip() for name in names.split(",")}
    return stated


@pytest.mark.parametrize("command", ["train", "predict"])
def test_attn_implementation_help_states_what_the_check_accepts(command):
    (action,) = [a for a in PARSERS[command]()._actions if a.dest == "attn_implementation"]
    stated = stated_implementations(action.help)
    accepted = {model_type: set(names) for model_type, names in ATTN_IMPLEMENTATIONS.items()}
    assert stated == accepted, f"{command} --help states {stated}; the check accepts {accepted}"


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_option_has_a_help_text(command):
    missing = [
        action.option_strings[0]
        for action in PARSERS[command]()._actions
        if action.option_strings and not action.help
    ]
    assert not missing, f"{command}: no help text for {missing}"


def test_the_parsers_cover_the_argparse_commands():
    # a command left out here would go unchecked; `train-accelerate` shares train's parser
    assert isinstance(PARSERS["train"](), argparse.ArgumentParser)
    from energyformers.training.cli import COMMANDS

    assert set(COMMANDS) - {"train-accelerate"} <= set(PARSERS), sorted(set(COMMANDS) - set(PARSERS))
