"""Tables written out twice on purpose, kept equal: the command line's copies (read while the arguments are parsed,
before torch loads) against what the models declare, and Hyper-SET's modeling tuples against its config's choices.
Each test fails when one side changes alone."""

from __future__ import annotations

import dataclasses

import pytest

import energyformers
from energyformers import kernels
from energyformers.configuration import configuration_hyperset
from energyformers.modeling import modeling_hyperset
from energyformers.training.arguments import ATTN_IMPLEMENTATIONS, ModelArguments


@pytest.mark.parametrize("family", sorted({**energyformers.FAMILIES, **energyformers.BASELINES}))
def test_the_cli_attention_table_is_what_each_model_class_declares(family: str) -> None:
    """`ATTN_IMPLEMENTATIONS[family]` against `<Family>PreTrainedModel.attn_implementations` (what
    `attn_implementation=` takes; Hyper-SET's is its registry, read after `energyformers` registered "triton")."""
    heads = {**energyformers.FAMILIES, **energyformers.BASELINES}[family].heads
    declared = {name for head in heads.values() for name in head.attn_implementations}
    if family == "hyperset" and not kernels.TRITON_INSTALLED:
        # listed by the CLI wherever it runs: without Triton the model names what "triton" needs
        declared.add("triton")
    listed = set(ATTN_IMPLEMENTATIONS.get(family, ()))
    assert listed == declared, (
        f"{family}: the CLI lists {sorted(listed)}, the model classes take {sorted(declared)}"
    )


@pytest.mark.parametrize(
    ("field", "modeling_names"),
    [
        ("iteration_sampling", modeling_hyperset.ITERATION_SAMPLING),
        ("deep_supervision", modeling_hyperset.DEEP_SUPERVISION),
    ],
)
def test_hyperset_modeling_tuples_and_the_cli_choices_are_the_configs_choices(
    field: str, modeling_names: tuple[str, ...]
) -> None:
    config_choices = configuration_hyperset._CHOICES[field]
    cli_choices = next(f for f in dataclasses.fields(ModelArguments) if f.name == field).metadata["choices"]
    assert tuple(modeling_names) == tuple(config_choices), (field, modeling_names, config_choices)
    assert tuple(cli_choices) == tuple(config_choices), (field, cli_choices, config_choices)
