"""Tables written out twice on purpose, kept equal: the command line's copies (read while the arguments are parsed,
before torch loads) against what the models declare and the configs' choices. Each test fails when one side changes
alone. The modeling files read the names of a config choice from the config class (`Config.choices`) and keep no
copy; what stays to check there is that they implement every name, and that Hyper-SET's table of φ and φ' (code, so
written in the modeling file) is keyed by the names the config accepts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fixtures import hyperset_config, imixer_config

import energyformers
from energyformers import HyperSetConfig, HyperSetModel, IMixerConfig, IMixerModel, kernels
from energyformers.configuration.configuration_hyperset import FEATURE_MAPS
from energyformers.configuration.configuration_imixer import ACTIVATION_MAX_SLOPES
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


@pytest.mark.parametrize("field", ["iteration_sampling", "deep_supervision"])
def test_the_cli_depth_choices_are_the_configs_choices(field: str) -> None:
    """The command line's copy (read before torch loads) against `HyperSetConfig.choices`. The modeling file keeps no
    copy of its own (it reads the config's), so the tests below check that it implements every name instead."""
    config_choices = HyperSetConfig.choices[field]
    cli_choices = next(f for f in dataclasses.fields(ModelArguments) if f.name == field).metadata["choices"]
    assert tuple(cli_choices) == tuple(config_choices), (field, cli_choices, config_choices)


@pytest.mark.parametrize("mode", HyperSetConfig.choices["iteration_sampling"])
def test_every_iteration_sampling_of_the_config_has_a_depth_sampler(mode: str) -> None:
    config = hyperset_config(
        "image", iteration_sampling=mode, num_iterations=4, min_iterations=2, max_iterations=6
    )
    depth = modeling_hyperset.sample_num_iterations(config, draw=3)
    assert 2 <= depth <= 6, f"iteration_sampling={mode!r}: depth {depth} outside [2, 6]"


@pytest.mark.parametrize("mode", HyperSetConfig.choices["deep_supervision"])
def test_every_deep_supervision_of_the_config_has_an_iteration_subset(mode: str) -> None:
    config = hyperset_config("image", deep_supervision=mode)
    iterations = modeling_hyperset.supervised_iterations(config, 5, draw=0)
    assert iterations[-1] == 5 and iterations == sorted(set(iterations)), f"{mode!r}: {iterations}"


@pytest.mark.parametrize("criterion", HyperSetConfig.choices["halting_criterion"])
def test_every_halting_criterion_of_the_config_has_a_change_measure(criterion: str) -> None:
    torch.manual_seed(0)
    model = HyperSetModel(hyperset_config("image", num_iterations=3)).eval()
    pixels = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        outputs = model(pixel_values=pixels, halting_tolerance=1e-3, halting_criterion=criterion)
    assert torch.isfinite(outputs.last_hidden_state).all(), criterion


def test_the_feature_map_table_is_keyed_by_the_configs_names() -> None:
    """`FEATURE_MAP_FUNCTIONS`, which the models index by `config.feature_map`, holds each φ and φ' keyed in the
    order of the configuration's `FEATURE_MAPS`, the one list of names `feature_map` accepts."""
    keys = tuple(modeling_hyperset.FEATURE_MAP_FUNCTIONS)
    assert keys == FEATURE_MAPS, (keys, FEATURE_MAPS)


@pytest.mark.parametrize("name", IMixerConfig.choices["token_mixing_activation"])
def test_each_token_mixing_activation_has_the_largest_slope_the_config_states(name: str) -> None:
    """The model builds its token-mixing activation from the config's name alone; the config's slope table (a
    factor of the Lipschitz bound that F's spectral caps promise) must be that function's largest slope."""
    model = IMixerModel(imixer_config("image", token_mixing_activation=name, fixed_point_iterations=1))
    activation = model.layers[0].token_mixing.activation
    # float64 slopes on a 1e-4 grid over [-8, 8], where each of these activations peaks (GELU at √2, SiLU near 2.4,
    # ReLU and tanh on or at 0): the grid's maximum is within step² · max|f'''| / 2 ≈ 1e-8 of the peak, so 1e-6
    # separates the stated slope from a wrong one
    x = torch.arange(-8, 8, 1e-4, dtype=torch.float64).requires_grad_(True)
    (slope,) = torch.autograd.grad(activation(x).sum(), x)
    measured, stated = float(slope.max()), ACTIVATION_MAX_SLOPES[name]
    assert abs(measured - stated) < 1e-6, f"{name}: largest slope {measured!r}, the config states {stated!r}"
