"""Deep supervision over iterations (docs/hyperset.md): the head of Hyper-SET and of the looped baseline
applied after several iterations in training, the loss the weighted mean of their losses."""

from __future__ import annotations

import re

import pytest
import torch
from fixtures import hyperset_config, perturb, rounding

from energyformers import (
    HyperSetConfig,
    HyperSetForImageClassification,
    HyperSetForSequenceClassification,
    HyperSetForTokenClassification,
    LoopedTransformerConfig,
    LoopedTransformerForImageClassification,
    LoopedTransformerForSequenceClassification,
    LoopedTransformerForTokenClassification,
)
from energyformers.modeling.modeling_hyperset import (
    sample_num_iterations,
    supervised_iterations,
    supervision_weights,
)
from energyformers.training.setup import enable_activation_checkpointing

BATCH, LENGTH = 4, 7
# float32 losses of order 1 summed over a handful of iterations in another order than the hand computation (at
# most 5 supervised iterations, each a mean over at most 4 × 7 tokens in pairwise order): 16 roundings of the
# largest term, which callers multiply by max(1, scale).
TOLERANCE = rounding(torch.float32, 16)

HEADS = {
    "hyperset-image": (HyperSetForImageClassification, "image"),
    "hyperset-sequence": (HyperSetForSequenceClassification, "sequence"),
    "hyperset-token": (HyperSetForTokenClassification, "sequence"),
    "looped-image": (LoopedTransformerForImageClassification, "image"),
    "looped-sequence": (LoopedTransformerForSequenceClassification, "sequence"),
    "looped-token": (LoopedTransformerForTokenClassification, "sequence"),
}


def config_for(model_class: type, input_type: str, **overrides) -> HyperSetConfig | LoopedTransformerConfig:
    """The suite's tiny config (L = 2, T = 3, d = 16), mean pooling so padding matters for the pooled heads."""
    config = hyperset_config(input_type, pooling="mean")
    if model_class.__name__.startswith("Looped"):
        return LoopedTransformerConfig.from_hyperset(config, **overrides)
    return hyperset_config(input_type, pooling="mean", **overrides)


def build(name: str, seed: int = 0, **overrides):
    """A head with every parameter moved off its initial value (Hyper-SET's zero step sizes would make every
    iteration the identity), in training mode."""
    model_class, input_type = HEADS[name]
    torch.manual_seed(seed)
    return perturb(model_class(config_for(model_class, input_type, **overrides)), seed=seed + 1).train()


def inputs_of(name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch with labels; sequences with padding at the end of two samples (labels −100 on padded tokens)."""
    _, input_type = HEADS[name]
    generator = torch.Generator().manual_seed(seed)
    if input_type == "image":
        return {
            "pixel_values": torch.randn(BATCH, 1, 8, 8, generator=generator),
            "labels": torch.randint(0, 4, (BATCH,), generator=generator),
        }
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[0, 5:], mask[1, 3:] = 0, 0
    batch = {
        "input_ids": torch.randint(1, 20, (BATCH, LENGTH), generator=generator),
        "attention_mask": mask,
    }
    if name.endswith("token"):
        labels = torch.randint(0, 4, (BATCH, LENGTH), generator=generator)
        batch["labels"] = labels.masked_fill(mask == 0, -100)
    else:
        batch["labels"] = torch.randint(0, 4, (BATCH,), generator=generator)
    return batch


def backbone_of(model):
    return getattr(model, model.base_model_prefix)


def loss_by_hand(model, batch: dict, num_iterations: int, iterations: list[int], weights: list[float]):
    """Σ w_t ℓ_t from the states of `output_hidden_states` (the last layer's iterations), head applied by hand."""
    backbone = backbone_of(model)
    labels = batch["labels"]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        states = backbone(**inputs, num_iterations=num_iterations, output_hidden_states=True).hidden_states
    layers = len(backbone.layers)
    assert len(states) == 1 + layers * num_iterations
    keep = None if "attention_mask" not in batch else batch["attention_mask"].bool()
    total = torch.zeros(())
    for t, weight in zip(iterations, weights):
        state = states[(layers - 1) * num_iterations + t]
        features = state if model._per_token else backbone._pool(state, keep)
        logits = model.classifier(model.layernorm(features))
        arguments = (logits, labels) if model._per_token else (labels, logits)
        total = total + weight * model.loss_function(*arguments, model.config).detach()
    return total


def assert_loss_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    bound = TOLERANCE * max(1.0, expected.abs().item())
    difference = (actual.detach() - expected).abs().item()
    assert difference <= bound, (
        f"{what}: loss {actual.item():.9g} vs {expected.item():.9g} (|Δ| {difference:.3g})"
    )


# ---------------------------------------------------------------- which iterations, which weights


def test_supervised_iterations_of_each_mode():
    config = hyperset_config("image", num_iterations=5)
    assert supervised_iterations(config, 5) == [5]
    config.deep_supervision = "all"
    assert supervised_iterations(config, 5) == [1, 2, 3, 4, 5]
    config.deep_supervision = "every"
    config.deep_supervision_interval = 2
    assert supervised_iterations(config, 5) == [1, 3, 5]
    config.deep_supervision_interval = 3
    assert supervised_iterations(config, 5) == [2, 5]
    assert supervised_iterations(config, 2) == [2]  # counted back from the T of the call


def test_random_subset_is_seeded_by_the_draw_and_always_holds_the_last_iteration():
    config = hyperset_config("image", deep_supervision="random", deep_supervision_samples=3)
    subsets = [supervised_iterations(config, 10, draw) for draw in range(20)]
    for draw, subset in enumerate(subsets):
        assert subset == supervised_iterations(config, 10, draw), f"draw {draw} is not reproducible"
        assert len(subset) == 3 and subset == sorted(set(subset)) and subset[-1] == 10, subset
        assert all(1 <= t <= 10 for t in subset), subset
    assert len({tuple(s) for s in subsets}) > 5, f"20 draws gave only {set(map(tuple, subsets))}"
    assert supervised_iterations(config, 2, 0) == [1, 2]  # n is capped at the T of the call
    with pytest.raises(ValueError, match="draw"):
        supervised_iterations(config, 10)


def test_weights_uniform_and_linear():
    config = hyperset_config("image")
    # exact: each weight is one division of an integer by the (exact) integer total, as written here
    assert supervision_weights(config, [1, 3, 5]) == [1 / 3] * 3
    config.deep_supervision_weights = "linear"
    assert supervision_weights(config, [1, 3, 5]) == [1 / 9, 3 / 9, 5 / 9]


# ---------------------------------------------------------------- the loss of the heads


@pytest.mark.parametrize("name", HEADS)
def test_last_is_exactly_the_loss_of_the_returned_logits(name):
    model, batch = build(name), inputs_of(name)
    output = model(**batch)
    arguments = (output.logits, batch["labels"]) if model._per_token else (batch["labels"], output.logits)
    expected = model.loss_function(*arguments, model.config)
    assert torch.equal(output.loss, expected), f"{output.loss.item()!r} != {expected.item()!r}"
    assert output.hidden_states is None


@pytest.mark.parametrize("name", HEADS)
@pytest.mark.parametrize("weights", ["uniform", "linear"])
def test_all_is_the_weighted_mean_over_every_iteration(name, weights):
    model = build(name, deep_supervision="all", deep_supervision_weights=weights)
    batch = inputs_of(name)
    output = model(**batch)
    iterations = [1, 2, 3]
    expected = loss_by_hand(model, batch, 3, iterations, supervision_weights(model.config, iterations))
    assert_loss_close(output.loss, expected, f"{name} all/{weights}")
    last = loss_by_hand(model, batch, 3, [3], [1.0])
    # the perturbed tiny models move little per iteration: distinct from the last-only loss by 4× the tolerance
    gap = abs(output.loss.item() - last.item())
    assert gap > 4 * TOLERANCE * max(1.0, last.abs().item()), (
        f"the earlier iterations changed nothing ({gap:.3g})"
    )
    # the returned logits stay the last iteration's, and the states were not asked for
    plain = build(name)
    torch.testing.assert_close(output.logits, plain(**batch).logits, rtol=0, atol=0)
    assert output.hidden_states is None


def test_all_equals_the_mean_over_runs_of_depth_t_for_one_time_invariant_layer():
    """With one layer and no iteration conditioning, the state after iteration t of a T-iteration run is the
    output of a run with num_iterations=t: the loss is the mean of those runs' losses."""
    name = "hyperset-token"
    model = build(name, num_hidden_layers=1, num_iterations=4, deep_supervision="all")
    batch = inputs_of(name)
    loss = model(**batch).loss
    with torch.no_grad():
        expected = torch.stack([model.eval()(**batch, num_iterations=t).loss for t in (1, 2, 3, 4)]).mean()
    assert_loss_close(loss, expected, "mean over depths 1..4")


@pytest.mark.parametrize("name", ["hyperset-sequence", "looped-token"])
def test_every_k_supervises_the_iterations_counted_back_from_the_last(name):
    model = build(name, num_iterations=5, deep_supervision="every", deep_supervision_interval=2)
    batch = inputs_of(name)
    expected = loss_by_hand(model, batch, 5, [1, 3, 5], [1 / 3] * 3)
    assert_loss_close(model(**batch).loss, expected, f"{name} every 2")


@pytest.mark.parametrize("name", ["hyperset-image", "looped-sequence"])
def test_random_subset_uses_one_draw_per_forward(name):
    model = build(name, num_iterations=6, deep_supervision="random", deep_supervision_samples=3)
    backbone, batch = backbone_of(model), inputs_of(name)
    for step in range(3):
        draw = backbone.iteration_draws
        assert draw == step
        iterations = supervised_iterations(model.config, 6, draw)
        expected = loss_by_hand(model, batch, 6, iterations, [1 / 3] * 3)
        assert_loss_close(model(**batch).loss, expected, f"{name} random, draw {draw} {iterations}")
    model(**batch, num_iterations=4)  # a per-call T draws no depth; the subset still takes one draw
    assert backbone.iteration_draws == 4
    model.eval()(**batch)  # eval draws nothing
    assert backbone.iteration_draws == 4


def test_random_depth_supervises_iterations_of_the_drawn_depth():
    name = "looped-image"
    model = build(
        name, iteration_sampling="uniform", min_iterations=2, max_iterations=6, deep_supervision="all"
    )
    batch = inputs_of(name)
    for draw in range(4):
        depth = sample_num_iterations(model.config, draw)
        expected = loss_by_hand(model, batch, depth, list(range(1, depth + 1)), [1 / depth] * depth)
        assert_loss_close(model(**batch).loss, expected, f"draw {draw}, T = {depth}")


@pytest.mark.parametrize("name", ["hyperset-token", "looped-image"])
def test_eval_mode_reports_the_last_iterations_loss(name):
    model, batch = build(name, deep_supervision="all").eval(), inputs_of(name)
    output = model(**batch)
    arguments = (output.logits, batch["labels"]) if model._per_token else (batch["labels"], output.logits)
    assert torch.equal(output.loss, model.loss_function(*arguments, model.config))


@pytest.mark.parametrize("name", ["hyperset-image", "looped-token"])
def test_requested_hidden_states_are_returned_under_deep_supervision(name):
    model, batch = build(name, deep_supervision="all"), inputs_of(name)
    output = model(**batch, output_hidden_states=True)
    assert output.hidden_states is not None and len(output.hidden_states) == 1 + 2 * 3


# ---------------------------------------------------------------- gradients


def trunk_and_head_gradients(model, batch: dict) -> tuple[dict, dict]:
    model.zero_grad()
    model(**batch).loss.backward()
    prefix = model.base_model_prefix + "."
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return (
        {n: g for n, g in grads.items() if n.startswith(prefix)},
        {n: g for n, g in grads.items() if not n.startswith(prefix)},
    )


def gap(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual − expected| in units of the rounding bound `TOLERANCE × max(1, max |expected|)`."""
    bound = TOLERANCE * max(1.0, expected.abs().max().item())
    return (actual - expected).abs().max().item() / bound


@pytest.mark.parametrize("name", ["hyperset-token", "looped-sequence"])
def test_early_iterations_train_the_trunk_unless_truncated(name):
    """T = 4, one layer. Under "all" the losses of iterations 1..3 add trunk gradient; with backprop_iterations=1
    they run without gradient, so the trunk's gradient is exactly w_4 = 1/4 times that of "last" (scaling by a
    power of two is exact), while the head still learns from every iteration."""
    batch = inputs_of(name)
    common = dict(num_hidden_layers=1, num_iterations=4)
    trunk_last, head_last = trunk_and_head_gradients(build(name, **common), batch)
    trunk_all, _ = trunk_and_head_gradients(build(name, deep_supervision="all", **common), batch)
    # the early iterations' gradient shows as a difference beyond the rounding bound of the comparisons below
    gaps = {n: gap(trunk_all[n], trunk_last[n] / 4) for n in trunk_last}
    assert any(g > 1 for g in gaps.values()), (
        f"early iterations gave the trunk no gradient: |Δ| / bound {gaps}"
    )

    truncated = dict(backprop_iterations=1, **common)
    trunk_last, head_last = trunk_and_head_gradients(build(name, **truncated), batch)
    trunk_all, head_all = trunk_and_head_gradients(build(name, deep_supervision="all", **truncated), batch)
    assert trunk_all.keys() == trunk_last.keys()
    for n in trunk_last:
        torch.testing.assert_close(
            trunk_all[n], trunk_last[n] / 4, rtol=0, atol=0, msg=lambda m, n=n: f"{n}: {m}"
        )
    moved = {n: gap(head_all[n], head_last[n] / 4) for n in head_last}
    assert any(g > 1 for g in moved.values()), (
        f"the head learned nothing from the early losses: |Δ| / bound {moved}"
    )


@pytest.mark.parametrize("name", ["hyperset-image", "looped-token"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(name):
    batch = inputs_of(name)
    plain = build(name, deep_supervision="all")
    checkpointed = build(name, deep_supervision="all")
    enable_activation_checkpointing(checkpointed)
    assert_loss_close(checkpointed(**batch).loss, plain(**batch).loss.detach(), "checkpointed loss")
    expected, actual = trunk_and_head_gradients(plain, batch), trunk_and_head_gradients(checkpointed, batch)
    for part_expected, part_actual in zip(expected, actual):
        assert part_expected.keys() == part_actual.keys()
        for n, grad in part_expected.items():
            # recomputation repeats the same float32 operations: equal up to a few ulps of the gradient's scale
            bound = TOLERANCE * max(1.0, grad.abs().max().item())
            torch.testing.assert_close(
                part_actual[n], grad, rtol=0, atol=bound, msg=lambda m, n=n: f"{n}: {m}"
            )


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("config_class", [HyperSetConfig, LoopedTransformerConfig])
@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("deep_supervision", "first", "expected one of ['last', 'all', 'every', 'random']"),
        ("deep_supervision_weights", "exponential", "expected one of ['uniform', 'linear']"),
        ("deep_supervision_interval", 0, "expected an integer >= 1"),
        ("deep_supervision_samples", 1.5, "expected an integer >= 1"),
    ],
)
def test_bad_values_are_clear_errors(config_class, field, value, allowed):
    message = f"{config_class.__name__}: invalid {field}={value!r}; {allowed}"
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        config_class(**{field: value})


def test_old_configs_without_the_fields_read_as_last():
    record = HyperSetConfig(num_iterations=4).to_dict()
    for key in ("deep_supervision", "deep_supervision_interval", "deep_supervision_samples"):
        record.pop(key)
    record.pop("deep_supervision_weights")
    config = HyperSetConfig.from_dict(record)
    assert config.deep_supervision == "last" and config.deep_supervision_weights == "uniform"
    looped = LoopedTransformerConfig.from_hyperset(HyperSetConfig(deep_supervision="every"))
    assert looped.deep_supervision == "every"  # the baseline of a config supervises as it does
