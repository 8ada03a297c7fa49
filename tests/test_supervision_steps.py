"""Supervision steps with a detached carry and the learned halting head (docs/hyperset.md): S outer steps of T
iterations, the state carried between steps without gradient, a loss per step averaged over steps, and a halting
classifier that stops a sample's steps at inference."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from fixtures import assert_differs
from test_deep_supervision import HEADS, TOLERANCE, assert_loss_close, backbone_of, build, gap, inputs_of
from test_sudoku_cli import REDUCED
from test_sudoku_cli import small_generated as small_generated  # a fixture, used by name

from energyformers import HyperSetConfig, LoopedTransformerConfig
from energyformers.modeling import modeling_hyperset

T = 3  # the tiny configs' num_iterations (tests/fixtures.py)


def backbone_inputs(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k != "labels"}


def head_of(model, state: torch.Tensor, batch: dict) -> torch.Tensor:
    """The head's logits on a backbone state, as `classify` applies it."""
    backbone = backbone_of(model)
    mask = batch.get("attention_mask")
    features = state if model._per_token else backbone._pool(state, None if mask is None else mask.bool())
    return model.classifier(model.layernorm(features))


def loss_of(model, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return modeling_hyperset.head_loss(model, logits, labels, None, model._per_token)


def steps_by_hand(model, batch: dict, steps: int, detach: bool = True) -> tuple[list, list]:
    """(states, logits) after each of `steps` outer steps, by explicit backbone calls with `initial_state`."""
    backbone, inputs = backbone_of(model), backbone_inputs(batch)
    states, logits, carry = [], [], None
    for _ in range(steps):
        extra = {} if carry is None else {"initial_state": carry.detach() if detach else carry}
        state = backbone(**inputs, **extra, num_iterations=T).last_hidden_state
        states.append(state)
        logits.append(head_of(model, state, batch))
        carry = state
    return states, logits


# ---------------------------------------------------------------- S = 1 is the model as it was


@pytest.mark.parametrize("name", HEADS)
def test_one_step_is_one_forward_exactly(name):
    """S = 1 (the default): the logits of one backbone call of T iterations and their loss, bit for bit."""
    model, batch = build(name), inputs_of(name)
    assert model.config.supervision_steps == 1 and not model.config.halting_head
    output = model(**batch)
    _, (logits,) = steps_by_hand(model, batch, 1)
    assert torch.equal(output.logits, logits), (
        f"{name}: logits differ by {(output.logits - logits).abs().max()}"
    )
    expected = loss_of(model, logits, batch["labels"])
    assert torch.equal(output.loss, expected), f"{name}: loss {output.loss.item()!r} != {expected.item()!r}"
    assert output.supervision_steps_used is None and output.halting_probabilities is None


# ---------------------------------------------------------------- S > 1: the carry and the loss


@pytest.mark.parametrize("name", HEADS)
def test_two_steps_average_the_losses_of_a_detached_carry(name):
    model, batch = build(name, supervision_steps=2), inputs_of(name)
    output = model(**batch)
    _, logits = steps_by_hand(model, batch, 2)
    expected = torch.stack([loss_of(model, x, batch["labels"]) for x in logits]).mean()
    assert_loss_close(output.loss, expected.detach(), f"{name} S = 2")
    torch.testing.assert_close(output.logits, logits[1], rtol=0, atol=0)
    assert output.supervision_steps_used.tolist() == [2] * len(output.logits)


@pytest.mark.parametrize("name", ["hyperset-token", "looped-image"])
def test_no_gradient_flows_from_step_two_into_step_one(name):
    """The gradient of the S = 2 loss is ½∇ℓ₁ + ½∇ℓ₂ with step 2 started from a detached state; started from the
    attached state (the control) it differs, so the comparison sees a gradient crossing the steps."""
    batch = inputs_of(name)
    model = build(name, supervision_steps=2)
    model.zero_grad()
    model(**batch).loss.backward()
    actual = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    def by_hand(detach: bool) -> dict:
        model.zero_grad()
        _, logits = steps_by_hand(model, batch, 2, detach=detach)
        loss = (loss_of(model, logits[0], batch["labels"]) + loss_of(model, logits[1], batch["labels"])) / 2
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    detached, attached = by_hand(True), by_hand(False)
    assert actual.keys() == detached.keys()
    for n, grad in detached.items():
        # the same float32 operations in the same order, up to the mean's summation: a few ulps of the scale
        bound = TOLERANCE * max(1.0, grad.abs().max().item())
        torch.testing.assert_close(actual[n], grad, rtol=0, atol=bound, msg=lambda m, n=n: f"{n}: {m}")
    # the control differs from the detached gradient by more than the rounding bound used above
    gaps = {n: gap(attached[n], detached[n]) for n in detached}
    assert any(g > 1 for g in gaps.values()), (
        f"the control (no detach) gave the same gradients: the test cannot see a crossing gradient: {gaps}"
    )


@pytest.mark.parametrize("name", ["hyperset-sequence", "looped-token"])
def test_eval_runs_s_times_t_iterations(name):
    model, batch = build(name, supervision_steps=3).eval(), inputs_of(name)
    output = model(**batch)
    _, logits = steps_by_hand(model, batch, 3)
    torch.testing.assert_close(output.logits, logits[2], rtol=0, atol=0)
    # eval reports the loss of the returned logits
    assert torch.equal(output.loss, loss_of(model, output.logits, batch["labels"]))
    assert output.supervision_steps_used.tolist() == [3] * len(output.logits)
    states = model(**backbone_inputs(batch), output_hidden_states=True).hidden_states
    layers = len(backbone_of(model).layers)
    assert len(states) == 1 + 3 * layers * T, f"{len(states)} states for S = 3, L = {layers}, T = {T}"


def test_one_depth_draw_per_forward_serves_every_step():
    """Random depth: one T per forward for all S steps, one draw per forward (resumed runs count steps)."""
    name = "hyperset-token"
    model = build(name, supervision_steps=2, iteration_sampling="uniform", min_iterations=1, max_iterations=5)
    backbone, batch = backbone_of(model), inputs_of(name)
    depths = []
    original = backbone.forward

    def recording(*args, **kwargs):
        depths.append(kwargs["num_iterations"])
        return original(*args, **kwargs)

    backbone.forward = recording
    for step in range(4):
        model(**batch)
        assert backbone.iteration_draws == step + 1
    assert depths[0::2] == depths[1::2], f"the two steps of a forward ran different depths: {depths}"
    assert len(set(depths)) > 1, f"4 draws gave one depth {depths}: the test would not see a per-step draw"


def test_random_subsets_differ_per_step_from_one_draw():
    """deep_supervision="random" inside the steps: step s of forward n draws index n·S + s (no two share one)."""
    name = "hyperset-image"
    model = build(
        name, supervision_steps=2, num_iterations=6, deep_supervision="random", deep_supervision_samples=2
    )
    batch = inputs_of(name)
    from energyformers.modeling.modeling_hyperset import supervised_iterations

    output = model(**batch, num_iterations=6)
    backbone = backbone_of(model)
    assert backbone.iteration_draws == 1
    states = []
    carry = None
    for _ in range(2):
        extra = {} if carry is None else {"initial_state": carry.detach()}
        result = backbone(**backbone_inputs(batch), **extra, num_iterations=6, output_hidden_states=True)
        states.append(result.hidden_states)
        carry = result.last_hidden_state
    layers, losses = len(backbone.layers), []
    for step in range(2):
        chosen = supervised_iterations(model.config, 6, 0 * 2 + step)
        step_losses = [
            loss_of(model, head_of(model, states[step][(layers - 1) * 6 + t], batch), batch["labels"])
            for t in chosen
        ]
        losses.append(torch.stack(step_losses).mean())
    assert_loss_close(output.loss, torch.stack(losses).mean().detach(), "random subsets per step")


# ---------------------------------------------------------------- initial_state


@pytest.mark.parametrize("name", ["hyperset-sequence", "looped-image"])
def test_initial_state_equal_to_the_embedding_output_changes_nothing(name):
    model, batch = build(name).eval(), inputs_of(name)
    backbone, inputs = backbone_of(model), backbone_inputs(batch)
    embedded, _ = backbone.embeddings(
        **{k: v for k, v in inputs.items() if k in ("pixel_values", "input_ids", "attention_mask")}
    )
    plain = backbone(**inputs).last_hidden_state
    started = backbone(**inputs, initial_state=embedded).last_hidden_state
    assert torch.equal(plain, started)
    moved = backbone(**inputs, initial_state=embedded + 1).last_hidden_state
    assert_differs(moved, plain, "initial_state=embedded + 1 (ignored?)")
    with pytest.raises(ValueError, match=re.escape(f"{tuple(embedded.shape)}; got (2, 3)")):
        backbone(**inputs, initial_state=torch.zeros(2, 3))


def test_initial_state_keeps_the_embedded_input_as_the_anchor():
    """Hyper-SET with an input anchor: from initial_state x_s the first iteration pulls towards the embedding
    output x₀ (the input), not towards x_s: one iteration from x_s differs from one from x_s with anchor x_s."""
    name = "hyperset-sequence"
    model = build(name, input_anchor=0.5, num_hidden_layers=1).eval()
    backbone, inputs = backbone_of(model), backbone_inputs(inputs_of(name))
    embedded, keep = backbone.embeddings(
        input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
    )
    start = embedded + 0.3 * torch.randn_like(embedded)
    got = backbone(**inputs, initial_state=start, num_iterations=1).last_hidden_state
    layer = backbone.layers[0]
    conditions = backbone.step_sizes.iteration_conditions(1, embedded)
    source = embedded if model.config.step_size_condition == "input" else start
    expected, _ = layer(start, conditions[0], source, backbone.step_sizes, keep, embedded)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# ---------------------------------------------------------------- the halting head


def test_halting_targets():
    class Head:
        _per_token = True
        config = HyperSetConfig(num_labels=3)

    logits = torch.tensor(
        [[[5.0, 0, 0], [0, 5.0, 0]], [[5.0, 0, 0], [0, 0, 5.0]], [[0, 5.0, 0], [0, 5.0, 0]]]
    )
    labels = torch.tensor([[0, 1], [0, 1], [-100, -100]])
    assert modeling_hyperset.halting_targets(Head, logits, labels).tolist() == [
        1.0,
        0.0,
        1.0,
    ]  # no supervised token: right
    labels = torch.tensor([[0, -100], [0, -100], [1, -100]])
    assert modeling_hyperset.halting_targets(Head, logits, labels).tolist() == [
        1.0,
        1.0,
        1.0,
    ]  # unsupervised tokens do not count

    Head._per_token = False
    pooled = torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 2.0]])
    assert modeling_hyperset.halting_targets(Head, pooled, torch.tensor([0, 1])).tolist() == [1.0, 0.0]
    multi = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    assert modeling_hyperset.halting_targets(
        Head, torch.tensor([[3.0, -1, 2], [3.0, -1, -2]]), multi
    ).tolist() == [1.0, 0.0]
    Head.config = HyperSetConfig(num_labels=1)
    with pytest.raises(ValueError, match="regression"):
        modeling_hyperset.halting_targets(Head, pooled[:, :1], torch.tensor([0.5, 1.0]))


@pytest.mark.parametrize("name", HEADS)
def test_halting_head_adds_its_weighted_bce_to_the_training_loss(name):
    model, batch = (
        build(name, supervision_steps=2, halting_head=True, halting_loss_weight=0.25),
        inputs_of(name),
    )
    output = model(**batch)
    states, logits = steps_by_hand(model, batch, 2)
    backbone, mask = backbone_of(model), batch.get("attention_mask")
    task, bce = [], []
    for state, step_logits in zip(states, logits):
        task.append(loss_of(model, step_logits, batch["labels"]))
        pooled = backbone._pool(state, None if mask is None else mask.bool())
        halting_logit = model.halting_classifier(model.layernorm(pooled)).squeeze(-1)
        target = modeling_hyperset.halting_targets(model, step_logits, batch["labels"])
        bce.append(F.binary_cross_entropy_with_logits(halting_logit, target))
    expected = torch.stack(task).mean() + 0.25 * torch.stack(bce).mean()
    assert_loss_close(output.loss, expected.detach(), f"{name} with halting BCE")
    assert output.halting_probabilities.shape == (len(output.logits), 2)
    output.loss.backward()
    grad = model.halting_classifier.weight.grad
    assert grad is not None and grad.abs().sum() > 0, "the halting head got no gradient"


def test_halting_head_learns_its_target():
    """A few steps of SGD on the BCE alone (task loss weighted out by a frozen trunk) lower it: the head trains."""
    name = "hyperset-image"
    model, batch = build(name, halting_head=True, halting_loss_weight=1.0), inputs_of(name)
    optimizer = torch.optim.SGD(model.halting_classifier.parameters(), lr=0.5)

    def bce() -> float:
        with torch.no_grad():
            state = backbone_of(model)(pixel_values=batch["pixel_values"]).pooler_output
            logits = model.classifier(model.layernorm(state))
            halting_logit = model.halting_classifier(model.layernorm(state)).squeeze(-1)
            target = modeling_hyperset.halting_targets(model, logits, batch["labels"])
            return F.binary_cross_entropy_with_logits(halting_logit, target).item()

    before = bce()
    for _ in range(20):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    after = bce()
    assert after < before - 0.05, f"BCE {before:.4f} → {after:.4f}"


@pytest.mark.parametrize("name", ["hyperset-token", "looped-sequence"])
def test_inference_stops_when_the_halting_head_says_so(name):
    model, batch = build(name, supervision_steps=3, halting_head=True).eval(), inputs_of(name)
    _, logits = steps_by_hand(model, batch, 3)
    with torch.no_grad():
        model.halting_classifier.weight.zero_()
        model.halting_classifier.bias.fill_(20.0)  # p ≈ 1: stop after the first step
    output = model(**batch)
    assert output.supervision_steps_used.tolist() == [1] * len(logits[0])
    torch.testing.assert_close(output.logits, logits[0], rtol=0, atol=0)
    assert torch.isnan(output.halting_probabilities[:, 1:]).all()

    with torch.no_grad():
        model.halting_classifier.bias.fill_(-20.0)  # p ≈ 0: run every step
    output = model(**batch)
    assert output.supervision_steps_used.tolist() == [3] * len(logits[0])
    torch.testing.assert_close(output.logits, logits[2], rtol=0, atol=0)

    with torch.no_grad():
        model.halting_classifier.bias.fill_(1.0)  # p ≈ 0.73: stops at 0.5, not at a threshold of 0.9
    assert model(**batch).supervision_steps_used.tolist() == [1] * len(logits[0])
    assert model(**batch, halting_threshold=0.9).supervision_steps_used.tolist() == [3] * len(logits[0])


def test_halting_stops_samples_separately_and_they_leave_the_batch():
    """The halting logit reads one channel of the normed pooled state: samples whose value is above the
    threshold stop after step 1 and keep step 1's logits; the others run on, in a smaller batch."""
    name = "hyperset-image"
    model, batch = build(name, supervision_steps=2, halting_head=True).eval(), inputs_of(name)
    states, logits = steps_by_hand(model, batch, 2)
    with torch.no_grad():
        normed = model.layernorm(backbone_of(model)._pool(states[0], None))
        channel = normed[:, 0]
        cut = channel.median()
        model.halting_classifier.weight.zero_()
        model.halting_classifier.weight[0, 0] = 100.0
        model.halting_classifier.bias.fill_(-100.0 * cut.item())
    stops = channel > cut
    assert 0 < stops.sum() < len(stops), f"the median split every sample to one side: {channel}"
    sizes = []
    backbone = backbone_of(model)
    hook = backbone.register_forward_hook(lambda m, a, kw, out: sizes.append(len(out[0])), with_kwargs=True)
    output = model(**batch)
    hook.remove()
    assert sizes == [len(stops), int((~stops).sum())], sizes
    assert output.supervision_steps_used.tolist() == [1 if s else 2 for s in stops.tolist()]
    expected = torch.where(stops[:, None], logits[0], logits[1])
    torch.testing.assert_close(output.logits, expected, rtol=0, atol=0)


def test_halting_head_is_saved_and_loaded(tmp_path):
    name = "hyperset-token"
    model, batch = build(name, supervision_steps=2, halting_head=True).eval(), inputs_of(name)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    assert loaded.config.halting_head and loaded.config.supervision_steps == 2
    torch.testing.assert_close(
        loaded.halting_classifier.weight, model.halting_classifier.weight, rtol=0, atol=0
    )
    torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits, rtol=0, atol=0)


def test_halting_in_eval_refuses_per_iteration_outputs_and_bad_thresholds():
    name = "hyperset-image"
    model, batch = build(name, supervision_steps=2, halting_head=True).eval(), inputs_of(name)
    with pytest.raises(ValueError, match="output_hidden_states cannot be combined"):
        model(**batch, output_hidden_states=True)
    with pytest.raises(ValueError, match="output_attentions and output_energies"):
        model(**batch, output_energies=True)
    for bad in (0, 1, 1.5, -0.1, True, "0.5"):
        with pytest.raises(
            ValueError, match=re.escape(f"halting_threshold must be a number in (0, 1); got {bad!r}")
        ):
            model(**batch, halting_threshold=bad)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("config_class", [HyperSetConfig, LoopedTransformerConfig])
@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("supervision_steps", 0, "expected an integer >= 1"),
        ("supervision_steps", 2.0, "expected an integer >= 1"),
        ("halting_head", 1, "expected True or False"),
        ("halting_loss_weight", 0.0, "expected a float > 0 (finite)"),
        ("halting_loss_weight", float("inf"), "expected a float > 0 (finite)"),
    ],
)
def test_bad_values_are_clear_errors(config_class, field, value, allowed):
    message = f"{config_class.__name__}: invalid {field}={value!r}; {allowed}"
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        config_class(**{field: value})


def test_old_configs_without_the_fields_read_as_one_step():
    record = HyperSetConfig(num_iterations=4).to_dict()
    for key in ("supervision_steps", "halting_head", "halting_loss_weight"):
        record.pop(key)
    config = HyperSetConfig.from_dict(record)
    assert (
        config.supervision_steps == 1 and config.halting_head is False and config.halting_loss_weight == 0.5
    )
    looped = LoopedTransformerConfig.from_hyperset(HyperSetConfig(supervision_steps=4, halting_head=True))
    assert looped.supervision_steps == 4 and looped.halting_head  # the baseline of a config steps as it does


# ---------------------------------------------------------------- both training loops


@pytest.mark.parametrize("loop_name", ["trainer", "accelerate"])
@pytest.mark.parametrize("model_type", ["hyperset", "looped-transformer"])
def test_flags_in_both_loops(small_generated, tmp_path, loop_name, model_type):
    """Tiny Sudoku runs with two supervision steps and a halting head: the flags set the config fields of the same
    name (saved in config.json) and the run finishes with its metrics."""
    import json

    from energyformers.training import accelerate_loop, train

    loop = train if loop_name == "trainer" else accelerate_loop
    out = tmp_path / "run"
    argv = [
        "--model", model_type, "--dataset", "sudoku", "--config", *REDUCED, "--max_steps", "2", "--batch_size", "8",
        "--supervision_steps", "2", "--halting_head", "--halting_loss_weight", "0.25", "--deep_supervision", "all",
        "--num_predictions", "0", "--output_dir", str(out), "--disable_tqdm", "--num_threads", "1",
    ]  # fmt: skip
    assert loop.main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    expected = {"supervision_steps": 2, "halting_head": True, "halting_loss_weight": 0.25}
    assert {k: config[k] for k in expected} == expected
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["test"]) >= {"blank_cell_accuracy", "board_accuracy"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--supervision_steps", "0"], "--supervision_steps 0: expected an integer >= 1"),
        (["--halting_loss_weight", "-1"], "--halting_loss_weight -1.0: expected a finite weight > 0"),
    ],
)
def test_bad_flags_are_usage_errors(tmp_path, flags, message):
    from energyformers.training.arguments import parse_arguments
    from energyformers.training.cli import UsageError

    with pytest.raises(UsageError, match=re.escape(message)):
        parse_arguments([*flags, "--output_dir", str(tmp_path / "x")], "train", "")


@pytest.mark.parametrize(
    ("flags", "value"), [([], None), (["--halting_head"], True), (["--halting_head", "false"], False)]
)
def test_halting_head_flag_alone_means_true_and_unset_keeps_the_config(tmp_path, flags, value):
    from energyformers.training.arguments import config_flags, parse_arguments

    args = parse_arguments([*flags, "--output_dir", str(tmp_path / "x")], "train", "")
    assert config_flags(args.model).get("halting_head") is value
