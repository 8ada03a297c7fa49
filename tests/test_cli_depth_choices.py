"""The recurrent-depth flags with a fixed set of values (`--iteration_conditioning`, `--iteration_sampling`,
`--deep_supervision`, `--deep_supervision_weights`) offer exactly what the model configs accept: the table
`training/arguments.py` writes out (so that `train --help` need not import torch) against each family's `choices`."""

from __future__ import annotations

import pytest

from energyformers import HyperSetConfig, LoopedTransformerConfig
from energyformers.training.arguments import DEPTH_CHOICES, DEPTH_FIELDS, build_parser


def test_the_depth_flags_choices_are_the_configs():
    fields = {field for field in DEPTH_FIELDS if field in HyperSetConfig.choices}
    assert set(DEPTH_CHOICES) == fields, (sorted(DEPTH_CHOICES), sorted(fields))
    for field, values in DEPTH_CHOICES.items():
        assert values == HyperSetConfig.choices[field], (field, values, HyperSetConfig.choices[field])
        # the baseline takes the same values where it has the field (it has no iteration conditioning)
        baseline = LoopedTransformerConfig.choices.get(field, values)
        assert baseline == values, (field, baseline, values)


@pytest.mark.parametrize("field", sorted(DEPTH_CHOICES))
def test_the_parser_offers_the_configs_choices(field):
    parser = build_parser("energyformers train", "")
    (action,) = [action for action in parser._actions if action.dest == field]
    assert tuple(action.choices) == HyperSetConfig.choices[field], (field, action.choices)
