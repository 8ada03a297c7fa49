"""Hyper-SET's recurrent depth: time-invariant iterations, random-depth training, truncated backpropagation
through depth and adaptive halting (docs/hyperset.md)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import transformers
from fixtures import assert_close_to_scale, hyperset_config, labelled, perturb, rounding

from energyformers import HyperSetForImageClassification, HyperSetForTokenClassification, HyperSetModel
from energyformers.modeling.modeling_hyperset import (
    HyperSetAttention,
    random_draw_generator,
    sample_num_iterations,
    supervised_iterations,
)

# Roundings of one iteration of the tiny image config: its longest sum is over the 24 feed-forward units (17
# tokens, width 16), rounded up to 32. Comparisons across iterations multiply it by their number.
ITERATION = 32


def image_model(seed: int = 0, step_scale: float = 1.0, **overrides) -> HyperSetForImageClassification:
    """A tiny one-layer image classifier with non-zero (perturbed) step sizes, in eval mode."""
    torch.manual_seed(seed)
    model = perturb(
        HyperSetForImageClassification(hyperset_config("image", num_hidden_layers=1, **overrides))
    )
    with torch.no_grad():
        model.hyperset.step_sizes.proj.weight.mul_(step_scale)
    return model.eval()


def pixels(batch: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- time-invariant iterations


def _states_and_one_step(
    model: HyperSetForImageClassification,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The states x_0..x_T of a forward, and x_{t+1} recomputed by applying iteration 1's map to x_t (no graph:
    the tests read values only)."""
    backbone = model.hyperset
    with torch.no_grad():
        states = backbone(pixel_values=pixels(), output_hidden_states=True).hidden_states
        first_condition = backbone.step_sizes.iteration_conditions(1, states[0])[0]
        layer = backbone.layers[0]
        stepped = [layer(state, first_condition, state, backbone.step_sizes)[0] for state in states[:-1]]
    return list(states[1:]), stepped


def test_without_iteration_conditioning_every_iteration_applies_the_same_map():
    states, stepped = _states_and_one_step(image_model(step_scale=5.0))
    for t, (state, again) in enumerate(zip(states, stepped)):
        # the same map on the same state, once inside the forward and once here: one iteration's rounding
        assert_close_to_scale(again, state, rounding(torch.float32, ITERATION), f"iteration {t + 1}")


def test_sinusoidal_conditioning_applies_a_different_map_per_iteration():
    states, stepped = _states_and_one_step(image_model(step_scale=5.0, iteration_conditioning="sinusoidal"))
    # iteration 1 is iteration 1's map
    torch.testing.assert_close(stepped[0], states[0], msg=labelled("iteration 1"))
    # a liveness margin far above one iteration's rounding (about 1e-5 at states up to 4)
    gaps = [float((again - state).abs().max()) for again, state in zip(stepped[1:], states[1:])]
    assert min(gaps) > 1e-4, f"iterations 2.. applied iteration 1's map: max |Δ| per iteration {gaps}"


def test_no_conditioning_carries_one_condition_vector_instead_of_the_time_mlp():
    sinusoidal = HyperSetModel(hyperset_config("image", iteration_conditioning="sinusoidal"))
    none = HyperSetModel(hyperset_config("image"))
    time_mlp = sum(p.numel() for p in sinusoidal.step_sizes.time_mlp.parameters())
    assert not hasattr(none.step_sizes, "time_mlp") and none.step_sizes.condition.shape == (16,)
    assert none.num_parameters() == sinusoidal.num_parameters() - time_mlp + 16


def test_no_conditioning_is_the_identity_at_initialisation_for_any_depth():
    torch.manual_seed(0)
    model = HyperSetModel(hyperset_config("image")).eval()
    outputs = model(pixel_values=pixels(), num_iterations=40, output_hidden_states=True)
    torch.testing.assert_close(outputs.last_hidden_state, outputs.hidden_states[0])


# ---------------------------------------------------------------- the anchor energy


def test_anchor_adds_a_gradient_step_on_the_quadratic_input_energy():
    plain, anchored = image_model(step_scale=5.0), image_model(step_scale=5.0, input_anchor=0.5)
    backbone, layer = plain.hyperset, plain.hyperset.layers[0]
    states = anchored.hyperset(pixel_values=pixels(), output_hidden_states=True).hidden_states
    x0 = states[0]
    condition = backbone.step_sizes.iteration_conditions(1, x0)[0]
    for t in range(3):
        x = states[t]
        without = layer(x, condition, x, backbone.step_sizes)[0]
        # one iteration, plus the anchor's subtraction, product and sum written here in another order
        expected = without - 0.5 * (x - x0)
        assert_close_to_scale(
            states[t + 1], expected, rounding(torch.float32, ITERATION + 3), f"iteration {t + 1}"
        )


def test_anchor_keeps_the_identity_at_initialisation_and_bounds_long_runs():
    torch.manual_seed(0)
    fresh = HyperSetModel(hyperset_config("image", input_anchor=0.5)).eval()
    out = fresh(pixel_values=pixels(), output_hidden_states=True)
    torch.testing.assert_close(out.last_hidden_state, out.hidden_states[0])
    norms = {}
    for anchor in (0.0, 0.5):
        model = image_model(step_scale=20.0, input_anchor=anchor)
        with torch.no_grad():
            states = model.hyperset(pixel_values=pixels(), num_iterations=200, output_hidden_states=True)
        last = states.hidden_states[-11:]  # relative change over the last 10 of 200 iterations
        norms[anchor] = float(max((b - a).norm() / a.norm() for a, b in itertools.pairwise(last)))
    # with the anchor the iteration has settled; without it, it still moves (1e-3 is a convergence threshold on
    # the relative change per iteration, not a rounding bound)
    assert norms[0.5] < 1e-3 < norms[0.0], norms


# ---------------------------------------------------------------- random depth


@pytest.mark.parametrize(
    ("sampling", "extra", "low", "high"),
    [
        ("uniform", {}, 4, 12),
        ("uniform", {"min_iterations": 2, "max_iterations": 5}, 2, 5),
        ("poisson-lognormal", {}, 1, 32),
    ],
)
def test_sampled_depths_are_reproducible_and_inside_the_range(sampling, extra, low, high):
    config = hyperset_config("image", num_iterations=8, iteration_sampling=sampling, **extra)
    assert config.iteration_range == (low, high)
    depths = [sample_num_iterations(config, draw) for draw in range(400)]
    assert depths == [sample_num_iterations(config, draw) for draw in range(400)]
    assert low <= min(depths) and max(depths) <= high
    assert len(set(depths)) >= min(high - low + 1, 6)
    if sampling == "poisson-lognormal":
        assert 7.0 < sum(depths) / len(depths) < 9.0  # mean T (Geiping et al.)
    elif not extra:
        assert set(depths) == set(range(low, high + 1))


def test_poisson_lognormal_depths_have_mean_t():
    # a tighter check than the 7 < mean < 9 above, which an off-by-one depth (mean T − 1, clipped at 1) passes
    config = hyperset_config(
        "image", num_iterations=8, iteration_sampling="poisson-lognormal", max_iterations=10_000
    )  # a range so wide that clipping moves the mean by nothing measurable
    draws = 4000
    depths = torch.tensor(
        [sample_num_iterations(config, draw, seed=0) for draw in range(draws)], dtype=torch.float64
    )
    rate, sigma = config.num_iterations - 1, config.iteration_sampling_sigma
    # 5 standard errors of the mean: depth = 1 + Poisson(λ), λ lognormal with mean T − 1, so
    # Var(depth) = E[λ] + Var(λ) = (T − 1) + (T − 1)² (e^{σ²} − 1); seeded, so the draws are the same every run
    bound = 5 * math.sqrt((rate + rate**2 * math.expm1(sigma**2)) / draws)
    mean, target = depths.mean().item(), config.num_iterations
    assert abs(mean - target) < bound, f"mean depth {mean:.4f}, T = {target}, bound {bound:.3f}"


def test_training_forwards_draw_the_same_depth_sequence_in_every_process():
    """Two replicas (as on two ranks) count their forwards and so run the same depth at every step."""
    config = hyperset_config("image", num_iterations=4, iteration_sampling="uniform", min_iterations=1)
    replicas = [HyperSetForImageClassification(config).train() for _ in range(2)]
    seen = [[], []]
    for rank, model in enumerate(replicas):
        model.hyperset.layers[0].register_forward_hook(lambda *_, r=rank: seen[r].append(1))
        depths = []
        for _ in range(12):
            before = len(seen[rank])
            model(pixel_values=pixels(seed=rank))  # different data per rank, same depth
            depths.append(len(seen[rank]) - before)
        seen[rank] = depths
    assert seen[0] == seen[1] == [sample_num_iterations(config, draw) for draw in range(12)]
    assert len(set(seen[0])) > 1
    replicas[0].eval()(pixel_values=pixels())  # eval: the configured depth, no draw
    assert replicas[0].hyperset.iteration_draws == 12


RANDOM_DEPTH = hyperset_config("image", num_iterations=4, iteration_sampling="uniform", min_iterations=1)


def _depths_after_set_seed(seed: int, forwards: int = 12) -> list[int]:
    """The depths of `forwards` training forwards of a model built after `transformers.set_seed(seed)`, as a
    training loop seeds a run."""
    transformers.set_seed(seed)
    model = HyperSetForImageClassification(RANDOM_DEPTH).train()
    calls: list[int] = []
    model.hyperset.layers[0].register_forward_hook(lambda *_: calls.append(1))
    depths = []
    for _ in range(forwards):
        before = len(calls)
        model(pixel_values=pixels())
        depths.append(len(calls) - before)
    return depths


def test_the_run_seed_seeds_the_depth_draws():
    """A sweep over seeds trains at other depths per seed, and a rerun with one seed at the same depths."""
    by_seed = {seed: _depths_after_set_seed(seed) for seed in (0, 1, 2)}
    assert _depths_after_set_seed(1) == by_seed[1], by_seed
    assert len({tuple(depths) for depths in by_seed.values()}) == 3, by_seed
    for seed, depths in by_seed.items():
        assert depths == [sample_num_iterations(RANDOM_DEPTH, draw, seed=seed) for draw in range(12)], seed


def test_the_run_seed_seeds_the_random_deep_supervision_subsets():
    config = hyperset_config("image", deep_supervision="random", deep_supervision_samples=3)
    by_seed = {}
    for seed in (0, 1, 2, 1):
        transformers.set_seed(seed)
        subsets = [supervised_iterations(config, 10, draw) for draw in range(12)]
        assert by_seed.setdefault(seed, subsets) == subsets, (seed, by_seed[seed], subsets)
        assert subsets == [supervised_iterations(config, 10, draw, seed=seed) for draw in range(12)], seed
    assert len({str(subsets) for subsets in by_seed.values()}) == 3, by_seed


def test_the_depth_and_the_subset_of_a_forward_draw_from_different_seeds():
    """torch's CPU generator keeps the low 32 bits of a seed: those differ between the two streams of a forward."""
    for seed in (0, 42, 2**64 - 1):
        low = [
            {random_draw_generator(stream, draw, seed).initial_seed() % 2**32 for draw in range(200)}
            for stream in (0, 1)
        ]
        assert len(low[0]) == len(low[1]) == 200 and not low[0] & low[1], (seed, sorted(low[0] & low[1]))


# ---------------------------------------------------------------- truncated backpropagation through depth


def test_truncated_backprop_equals_detaching_the_state_before_the_last_k_iterations():
    model, inputs = image_model(step_scale=3.0, num_iterations=5), pixels()
    labels = torch.tensor([0, 1, 2, 3])
    model.train()
    model(pixel_values=inputs, labels=labels, backprop_iterations=2).loss.backward()
    truncated = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    backbone = model.hyperset  # the same computation by hand: 3 iterations without gradient, then 2 with
    hidden, _ = backbone.embeddings(pixel_values=inputs)
    conditions = backbone.step_sizes.iteration_conditions(5, hidden)
    with torch.no_grad():
        for t in range(3):
            hidden = backbone.layers[0](hidden, conditions[t], hidden, backbone.step_sizes)[0]
    for t in range(3, 5):
        hidden = backbone.layers[0](hidden, conditions[t], hidden, backbone.step_sizes)[0]
    logits = model.classifier(model.layernorm(hidden[:, 0]))
    torch.nn.functional.cross_entropy(logits, labels).backward()
    by_hand = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    assert truncated.keys() == by_hand.keys()
    for name in truncated:
        torch.testing.assert_close(truncated[name], by_hand[name], msg=labelled(name))
    # the embeddings feed the graph only through the first T − k iterations: no gradient reaches them
    assert not any(name.startswith("hyperset.embeddings.") for name in truncated)


def _saved_bytes(model: HyperSetForImageClassification, num_iterations: int, backprop_iterations: int) -> int:
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(
            pixel_values=pixels(), num_iterations=num_iterations, backprop_iterations=backprop_iterations
        ).logits.sum().backward()
    return total


def test_backward_memory_does_not_grow_with_depth_beyond_k():
    model = image_model(step_scale=3.0).train()
    short, long = _saved_bytes(model, 4, 2), _saved_bytes(model, 16, 2)
    assert short == long
    assert _saved_bytes(model, 16, 16) > 4 * long  # without truncation it grows with T


# ---------------------------------------------------------------- adaptive halting


class _CountAttentionRows:
    """Counts the samples (batch rows) every attention call processes."""

    def __init__(self) -> None:
        self.rows = 0

    def __enter__(self) -> _CountAttentionRows:
        original = HyperSetAttention.forward

        def counted(module, hidden_states, *args, **kwargs):
            self.rows += hidden_states.shape[0]
            return original(module, hidden_states, *args, **kwargs)

        self._original, HyperSetAttention.forward = original, counted
        return self

    def __exit__(self, *exc) -> None:
        HyperSetAttention.forward = self._original


@pytest.mark.parametrize(
    ("criterion", "tolerance", "anchor"), [("state", 0.05, 0.0), ("energy", 1e-3, 0.0), ("state", 0.02, 0.3)]
)
def test_halted_samples_equal_running_alone_with_their_depth_and_are_not_recomputed(
    criterion, tolerance, anchor
):
    model, inputs = image_model(step_scale=20.0, input_anchor=anchor), pixels(batch=6)
    with torch.no_grad(), _CountAttentionRows() as counter:
        out = model(
            pixel_values=inputs, num_iterations=40, halting_tolerance=tolerance, halting_criterion=criterion
        )
    used = out.iterations_used
    assert used.shape == (6,) and used.dtype == torch.long
    assert len(set(used.tolist())) > 1 and used.max() <= 40  # samples of one batch halt at different depths
    assert counter.rows == int(used.sum())  # each iteration ran only the samples still iterating
    with torch.no_grad():
        for i in range(6):
            alone = model(pixel_values=inputs[i : i + 1], num_iterations=int(used[i])).logits
            # the same iterations in a batch of 6 and of 1 (BLAS may block the sums differently): each
            # iteration's rounding, over the sample's depth
            bound = rounding(torch.float32, ITERATION * int(used[i]))
            assert_close_to_scale(
                out.logits[i : i + 1], alone, bound, f"sample {i}, {int(used[i])} iterations"
            )


def constant_step_model(alpha: float, gamma: float, anchor: float = 0.0) -> HyperSetForImageClassification:
    """A tiny one-layer image classifier whose step sizes are the constants α, γ at every token and channel (the
    step-size projection's weight zeroed, its bias set): γ < 0 climbs the feedforward energy, γ, α > 0 descend."""
    torch.manual_seed(0)
    model = perturb(
        HyperSetForImageClassification(hyperset_config("image", num_hidden_layers=1, input_anchor=anchor))
    )
    with torch.no_grad():
        projection = model.hyperset.step_sizes.proj
        width = projection.bias.numel() // 2
        projection.weight.zero_()
        projection.bias[:width] = alpha
        projection.bias[width:] = gamma
    return model.eval()


def _relative_energy_changes(
    model: HyperSetForImageClassification, inputs: torch.Tensor, depth: int
) -> torch.Tensor:
    """(E_t − E_{t−1}) / |E_{t−1}| of E = E_ATTN + E_FF for t = 1..depth, `(batch, depth)`, from a fixed-depth run."""
    with torch.no_grad():
        energies = model(pixel_values=inputs, num_iterations=depth, output_energies=True).energies
    total = (energies.attention_energy + energies.feedforward_energy)[:, 0]  # (B, T + 1), the one layer
    return (total[:, 1:] - total[:, :-1]) / total[:, :-1].abs()


# ε of the two energy-halting tests; the fixtures keep every |relative change| at least 10 % away from it, so float32
# rounding of the energies (relative ~1e-7 at |E| ~ 500) cannot move a sample across the threshold.
ENERGY_TOLERANCE = 1.3e-3


def test_energy_halting_keeps_iterating_while_the_energy_rises():
    """A rising energy is a change, not convergence: with γ < 0 every update climbs the energy by more than ε and
    every sample runs the maximum depth (a test of the decrease alone would stop each after one iteration)."""
    model, inputs, depth = constant_step_model(alpha=0.0, gamma=-1.0), pixels(), 12
    changes = _relative_energy_changes(model, inputs, depth)
    assert (changes > 1.1 * ENERGY_TOLERANCE).all(), (
        f"fixture: the energy must rise by > ε each step: {changes}"
    )
    with torch.no_grad():
        out = model(
            pixel_values=inputs,
            num_iterations=depth,
            halting_tolerance=ENERGY_TOLERANCE,
            halting_criterion="energy",
        )
    assert out.iterations_used.tolist() == [depth] * 4, out.iterations_used.tolist()


def test_energy_halting_stops_a_converging_sample_at_the_first_change_below_tolerance():
    """Descending steps with an anchor converge: the energy's relative change shrinks geometrically, and each sample
    stops after the first iteration whose |E_t − E_{t−1}| / |E_{t−1}| is below ε, well before the maximum."""
    model, inputs, depth = constant_step_model(alpha=0.2, gamma=0.2, anchor=0.5), pixels(), 12
    sizes = _relative_energy_changes(model, inputs, depth).abs()
    assert ((sizes < 0.9 * ENERGY_TOLERANCE) | (sizes > 1.1 * ENERGY_TOLERANCE)).all(), f"fixture: {sizes}"
    below = sizes < ENERGY_TOLERANCE
    assert below.any(dim=1).all(), f"fixture: every sample must converge within {depth} iterations: {sizes}"
    expected = (below.int().argmax(dim=1) + 1).tolist()  # the first t whose change is below ε
    with torch.no_grad():
        out = model(
            pixel_values=inputs,
            num_iterations=depth,
            halting_tolerance=ENERGY_TOLERANCE,
            halting_criterion="energy",
        )
    assert out.iterations_used.tolist() == expected, (out.iterations_used.tolist(), expected, sizes)
    assert max(expected) < depth, expected


def test_halting_respects_padding_and_reaches_the_token_head():
    torch.manual_seed(0)
    config = hyperset_config("sequence", num_hidden_layers=1)
    model = perturb(HyperSetForTokenClassification(config)).eval()
    ids = torch.randint(0, 20, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    out = model(input_ids=ids, attention_mask=mask, num_iterations=30, halting_tolerance=1e-3)
    trimmed = model(input_ids=ids[:1, :4], num_iterations=int(out.iterations_used[0]))
    # the same iterations with and without padding in the batch: each iteration's rounding (the sequence config's
    # longest sum is over 24 feed-forward units, as the image config's), over the sample's depth
    depth = int(out.iterations_used[0])
    bound = rounding(torch.float32, ITERATION * depth)
    assert_close_to_scale(
        out.logits[0, :4], trimmed.logits[0], bound, f"padded vs trimmed, {depth} iterations"
    )


def test_halting_is_off_in_training_and_under_compile():
    model, inputs = image_model(step_scale=20.0), pixels()
    assert model.train()(pixel_values=inputs, halting_tolerance=0.5).iterations_used is None
    fixed_depth = model.eval()(pixel_values=inputs).logits  # T = 3
    model.config.halting_tolerance = 0.5  # in eager mode every sample now halts after one iteration
    assert model(pixel_values=inputs).iterations_used.tolist() == [1, 1, 1, 1]
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(pixel_values=inputs)
    assert compiled.iterations_used is None  # the fixed-T path: one graph, no data-dependent exit
    torch.testing.assert_close(compiled.logits, fixed_depth)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        (dict(halting_tolerance=0.0), "halting_tolerance"),
        (dict(halting_tolerance=-1e-3), "halting_tolerance"),
        (dict(backprop_iterations=7), "backprop_iterations"),  # > L·T = 2 × 3
        (dict(backprop_iterations=0), "backprop_iterations"),
        (dict(iteration_sampling="geometric"), "iteration_sampling"),
        (dict(iteration_conditioning="learned"), "iteration_conditioning"),
        (dict(halting_criterion="loss"), "halting_criterion"),
        (dict(iteration_sampling="uniform", min_iterations=5, max_iterations=4), "min_iterations"),
        (dict(iteration_sampling_sigma=0.0), "iteration_sampling_sigma"),
    ],
)
def test_bad_recurrent_depth_settings_fail_in_the_config(overrides, name):
    with pytest.raises(ValueError, match=name):
        hyperset_config("image", **overrides)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(halting_tolerance=0.0), "halting_tolerance"),
        (dict(halting_criterion="loss"), "halting_criterion"),
        (dict(backprop_iterations=5, num_iterations=4), "backprop_iterations"),
        (dict(num_iterations=0), "num_iterations"),
        (dict(halting_tolerance=0.1, output_hidden_states=True), "halting_tolerance"),
    ],
)
def test_bad_recurrent_depth_arguments_fail_before_any_work(kwargs, name):
    model = image_model()
    with pytest.raises(ValueError, match=name):
        model(pixel_values=pixels(), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "first"),
    [
        (dict(backprop_iterations=99, halting_tolerance=1e-3, output_attentions=True), "backprop_iterations"),
        (dict(backprop_iterations=-1, halting_tolerance=-5.0), "backprop_iterations"),
        (dict(backprop_iterations=99, halting_criterion="loss"), "backprop_iterations"),
        (dict(num_iterations=0, backprop_iterations=99, halting_tolerance=-5.0), "num_iterations"),
    ],
)
def test_a_call_with_several_bad_arguments_names_the_iteration_counts_first(kwargs, first):
    """Order: num_iterations, backprop_iterations, then halting and its clash with the output flags."""
    with pytest.raises(ValueError) as caught:
        image_model()(pixel_values=pixels(), **kwargs)
    assert str(caught.value).startswith(f"{first} must"), f"{kwargs}: {caught.value}"
