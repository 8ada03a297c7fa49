"""iMixer model tests (tiny configs; transformers model-test style)."""

from __future__ import annotations

import copy
import itertools
import pickle

import pytest
import torch
import torch.nn.functional as F
from fixtures import Case, assert_close_to_scale, assert_differs, perturb, rounding, step_once

from energyformers import IMixerConfig, IMixerForImageClassification, IMixerForSequenceClassification
from energyformers.modeling.modeling_imixer import IMixerSpectralNorm, IMixerTokenMixing

# the shared tiny configs, inputs and models (tests/fixtures.py)
IMAGE = Case.of(IMixerForImageClassification)
SEQUENCE = Case.of(IMixerForSequenceClassification)
HEADS = [IMAGE, SEQUENCE]
BATCH, LABELS, POSITIONS = IMAGE.tiny.batch, IMAGE.tiny.labels, SEQUENCE.tiny.positions


def spectral_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for name, m in model.named_modules() if name.endswith(("fc_sn1", "fc_sn2"))]


def buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: b.clone() for name, b in model.named_buffers()}


# ---------------------------------------------------------------- parameter counts (fidelity)


@pytest.mark.parametrize(
    ("preset", "overrides", "expected"),
    [
        ("s16", {}, 20_123_690),
        ("b16", {}, 66_210_874),
        ("l16", {}, 232_384_106),
        ("s16", {"fixed_point_iterations": 0}, 18_020_394),
        ("b16", {"fixed_point_iterations": 0}, 59_119_162),
        ("l16", {"fixed_point_iterations": 0}, 207_181_418),
        ("s16", {"hidden_ratio": 1.0}, 19_073_066),
    ],
)
def test_preset_trainable_parameter_counts_match_paper_exactly(preset, overrides, expected):
    config = IMixerConfig.from_preset(preset, **overrides)
    with torch.device("meta"):  # the real module tree, without allocating 232 M floats
        model = IMixerForImageClassification(config)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected
    # u, v are buffers, not parameters: 2 weights × (N_h + D_S) per block when n > 0
    n_buffers = sum(b.numel() for b in model.buffers())
    per_block = 2 * (config.contractive_size + config.token_mixing_size)
    assert n_buffers == (per_block * config.num_hidden_layers if config.fixed_point_iterations else 0)


def test_presets_cover_the_paper_table():
    for size, width, depth in (("s", 512, 8), ("b", 768, 12), ("l", 1024, 24)):
        for patch in (16, 32):
            config = IMixerConfig.from_preset(f"{size}{patch}")
            assert (config.hidden_size, config.num_hidden_layers, config.patch_size) == (width, depth, patch)
            assert (config.hidden_ratio, config.fixed_point_iterations, config.image_size) == (2.0, 2, 224)
    assert IMixerConfig.from_preset("b32", num_labels=100).num_labels == 100


# (every config field: tests/test_configuration.py)


def test_unknown_preset_raises():
    with pytest.raises(ValueError, match="unknown preset"):
        IMixerConfig.from_preset("h14")


# ---------------------------------------------------------------- n = 0 is the vanilla MLP-Mixer


def test_vanilla_token_mixing_is_fc2_gelu_fc1():
    model = IMAGE.build(fixed_point_iterations=0, hidden_dropout_prob=0.1)
    mixing = model.imixer.layers[0].token_mixing
    assert not hasattr(mixing, "fc_sn1") and not hasattr(mixing, "fc_sn2")
    tokens = torch.randn(2, 16, mixing.fc1.in_features)  # (B, D, S)
    by_hand = F.linear(
        F.gelu(F.linear(tokens, mixing.fc1.weight, mixing.fc1.bias)), mixing.fc2.weight, mixing.fc2.bias
    )
    output, _ = mixing(tokens, fixed_point_iterations=0)
    assert torch.equal(output, by_hand)


@pytest.mark.parametrize("iterations", [0, 2])
@pytest.mark.parametrize("case", HEADS, ids=str)
def test_every_parameter_takes_part_in_the_graph(case, iterations):
    # what DDP's unused-parameter check needs: every parameter receives a gradient tensor
    model = case.build(fixed_point_iterations=iterations).train()
    model(**case.inputs(labels=True)).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert missing == []


# ---------------------------------------------------------------- soft spectral normalisation


def test_spectral_norm_is_a_parametrization_with_persistent_u_v():
    model = IMAGE.build()
    layers = spectral_layers(model)
    assert len(layers) == 2 * model.config.num_hidden_layers
    for layer in layers:
        assert isinstance(layer.parametrizations.weight[0], IMixerSpectralNorm)
    keys = model.state_dict().keys()
    assert "imixer.layers.0.token_mixing.fc_sn1.parametrizations.weight.0.u" in keys
    assert "imixer.layers.1.token_mixing.fc_sn2.parametrizations.weight.0.v" in keys


def test_training_forward_caps_spectral_norm_at_c():
    model = IMAGE.build(spectral_norm_power_iterations=200)
    coeff = model.config.spectral_norm_coeff
    torch.manual_seed(1)
    with torch.no_grad():  # fresh, large weights: the stored u, v are stale for them
        for layer in spectral_layers(model):
            layer.parametrizations.weight.original.normal_(0.0, 2.0)
    before = [torch.linalg.matrix_norm(layer.weight, ord=2).item() for layer in spectral_layers(model)]
    assert min(before) > 2 * coeff
    model.train()(**IMAGE.inputs())
    for layer in spectral_layers(model):
        sigma = torch.linalg.matrix_norm(layer.weight, ord=2).item()
        # not rounding: the accuracy of the σ that the training forward's 200 power steps estimate (looser below,
        # where an estimate from a still-converging u, v errs)
        assert coeff - 1e-3 <= sigma <= coeff + 1e-4, f"σ = {sigma!r}, c = {coeff!r}"


def test_weight_below_c_is_used_unchanged():
    model = IMAGE.build(spectral_norm_power_iterations=200)
    with torch.no_grad():
        for layer in spectral_layers(model):
            original = layer.parametrizations.weight.original
            original.mul_(0.5 / torch.linalg.matrix_norm(original, ord=2))  # σ = 0.5 < c = 0.9
    model.train()(**IMAGE.inputs())
    for layer in spectral_layers(model):
        assert torch.equal(layer.weight, layer.parametrizations.weight.original)


def test_u_v_start_at_the_fixed_unit_vector_whatever_the_weights():
    # transformers builds a model directly and on the meta device and compares the buffers: no random start
    for seed in (0, 1):
        for layer in spectral_layers(IMAGE.build(seed=seed)):
            spectral_norm = layer.parametrizations.weight[0]
            for vector in (spectral_norm.u, spectral_norm.v):
                torch.testing.assert_close(vector, torch.full_like(vector, vector.numel() ** -0.5))


def test_a_few_training_forwards_make_a_fresh_model_contractive_in_eval_mode():
    model = IMAGE.build()
    coeff = model.config.spectral_norm_coeff
    for seed in range(3):  # 8 power steps per training forward, from the fixed start
        model.train()(**IMAGE.inputs(seed=seed))
    for layer in spectral_layers(model.eval()):
        assert torch.linalg.matrix_norm(layer.weight, ord=2).item() <= 1.02 * coeff


@pytest.mark.parametrize("case", HEADS, ids=str)
def test_training_forward_updates_u_v_and_eval_forward_does_not(case):
    model = case.build()
    with torch.no_grad():  # make u, v stale so a power iteration visibly moves them
        for layer in spectral_layers(model):
            layer.parametrizations.weight.original.add_(
                torch.randn_like(layer.parametrizations.weight.original)
            )
    start = buffers(model)
    model.eval()(**case.inputs())
    moved = {
        k: (b - start[k]).abs().max().item() for k, b in model.named_buffers() if not torch.equal(start[k], b)
    }
    assert not moved, f"an eval forward moved these buffers (max |change|): {moved}"
    model.train()(**case.inputs())
    kept = [k for k, b in model.named_buffers() if torch.equal(start[k], b)]
    assert not kept, f"a training forward left these buffers unchanged: {kept}"


# ---------------------------------------------------------------- fixed-point diagnostics


@pytest.mark.parametrize("case", HEADS, ids=str)
def test_fixed_point_residuals_shrink_and_are_returned(case):
    model = case.build(fixed_point_iterations=5)
    model.train()(**case.inputs())  # one training forward: σ estimates converge to c from the fixed start
    out = model.eval()(**case.inputs(), output_fixed_point_residuals=True)
    diagnostics = out.fixed_point_residuals
    layers = model.config.num_hidden_layers
    assert diagnostics.relative_residuals.shape == diagnostics.cosines.shape == (layers, 5)
    assert diagnostics.spectral_norms.shape == (layers, 2)
    residuals = diagnostics.relative_residuals
    # monotone decrease over every iteration, by a clear factor per step once F is normalised
    assert torch.all(residuals[:, 1:] < 0.5 * residuals[:, :-1])
    # the cosines are ≤ 1: a few float32 ulps of 1 of slack for the rounding of their norms
    slack = rounding(torch.float32, 8)
    assert torch.all(diagnostics.cosines[:, 1:] > diagnostics.cosines[:, :1] - slack), diagnostics.cosines
    assert torch.all(diagnostics.spectral_norms > 0)
    assert model(**case.inputs()).fixed_point_residuals is None


def test_residuals_match_the_iterates_computed_by_hand():
    model = IMAGE.build(num_hidden_layers=1, fixed_point_iterations=3)
    layer = model.imixer.layers[0]
    pixel_values = IMAGE.inputs()["pixel_values"]
    embedded, _, _ = model.imixer.embeddings(pixel_values=pixel_values)  # (tokens, padding mask, positions)
    tokens = layer.layernorm_before(embedded).transpose(1, 2)
    mixing = layer.token_mixing
    start = mixing.fc1(tokens)
    iterates = [start]
    for _ in range(3):
        iterates.append(start + mixing.fc_sn2(F.gelu(mixing.fc_sn1(F.gelu(iterates[-1])))))
    expected = [
        ((new - old).flatten(1).norm(dim=1) / old.flatten(1).norm(dim=1)).mean()
        for old, new in itertools.pairwise(iterates)
    ]
    got = model(pixel_values=pixel_values, output_fixed_point_residuals=True).fixed_point_residuals
    torch.testing.assert_close(got.relative_residuals[0], torch.stack(expected))
    sigma = [m.parametrizations.weight[0] for m in (mixing.fc_sn1, mixing.fc_sn2)]
    by_hand = [
        s.u @ m.parametrizations.weight.original @ s.v for s, m in zip(sigma, (mixing.fc_sn1, mixing.fc_sn2))
    ]
    torch.testing.assert_close(got.spectral_norms[0], torch.stack(by_hand))


def test_fixed_point_iterations_can_be_overridden_per_call():
    model = IMAGE.build().imixer
    inputs = IMAGE.inputs()
    out = model(**inputs, fixed_point_iterations=4, output_fixed_point_residuals=True)
    assert out.fixed_point_residuals.relative_residuals.shape[1] == 4
    fewer = model(**inputs, fixed_point_iterations=3).pooler_output
    assert_differs(out.pooler_output, fewer, "pooler_output, 4 vs 3 fixed-point iterations")
    vanilla = IMAGE.build(fixed_point_iterations=0)
    with pytest.raises(ValueError, match="fixed_point_iterations=0"):
        vanilla(**inputs, fixed_point_iterations=2)
    with pytest.raises(ValueError, match="integer >= 0"):
        model(**inputs, fixed_point_iterations=True)


# ---------------------------------------------------------------- outputs


@pytest.mark.parametrize("case", HEADS, ids=str)
def test_outputs_and_hidden_states(case):
    # (return_dict=False giving the same tensors as a tuple: tests/test_common.py)
    model = case.build()
    step_once(model, case.inputs(labels=True))
    out = model(**case.inputs(labels=True), output_hidden_states=True)
    # an image's patches, or a sequence's input positions (the S token-mixing slots stay inside)
    length = model.config.num_tokens if case.input_type == "image" else case.tiny.length
    assert out.logits.shape == (BATCH, LABELS)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1  # embeddings + one per block
    assert all(h.shape == (BATCH, length, 16) for h in out.hidden_states)


@pytest.mark.parametrize("input_type", ["image", "sequence"])
def test_base_model_output_and_pooling(input_type):
    case = Case("imixer", "AutoModel", input_type)
    model, inputs = case.build(), case.inputs()
    out = model(**inputs)
    if input_type == "image":
        assert out.last_hidden_state.shape == (BATCH, model.config.num_tokens, 16)
        torch.testing.assert_close(out.pooler_output, out.last_hidden_state.mean(1))
    else:  # masked mean over the real tokens, the usual idiom over `attention_mask` (sentence-transformers')
        assert out.last_hidden_state.shape == (BATCH, case.tiny.length, 16)
        weights = inputs["attention_mask"][..., None].float()
        masked = (out.last_hidden_state * weights).sum(1) / weights.sum(1)
        torch.testing.assert_close(out.pooler_output, masked)
        assert type(model.get_input_embeddings()) is torch.nn.Embedding


# ---------------------------------------------------------------- sequences


def test_sequence_logits_do_not_depend_on_left_padding_or_padding_beyond_s():
    # right padding within S is checked for every sequence model of every family in tests/test_common.py
    model = SEQUENCE.build()
    step_once(model, SEQUENCE.inputs(labels=True))
    sequences = [[3, 5, 7, 2], [4, 4, 9, 1, 8, 6], [11]]
    alone = torch.cat([model(input_ids=torch.tensor([s])).logits for s in sequences])
    for width, side in (
        (6, "left"),
        (9, "left"),
        (13, "left"),
        (13, "right"),
    ):  # 13 > S: padding beyond S is fine
        ids = torch.full((3, width), 19)  # padding ids are arbitrary
        mask = torch.zeros(3, width, dtype=torch.long)
        for row, seq in enumerate(sequences):
            span = slice(0, len(seq)) if side == "right" else slice(width - len(seq), width)
            ids[row, span], mask[row, span] = torch.tensor(seq), 1
        batched = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).logits
        # the same per-sequence sums in batched kernels: 2 layers × 2 fixed-point steps, each mixing over at most
        # 10 positions and 16 channels, about 64 roundings of the O(1) values
        assert_close_to_scale(batched, alone, rounding(torch.float32, 64), f"width {width}, {side} padding")


BASE_SEQUENCE = Case("imixer", "AutoModel", "sequence")


def _padded(sequences: list[list[int]], width: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`input_ids` and `attention_mask` of `sequences` padded to `width` on `side` (pad id 19: arbitrary)."""
    ids = torch.full((len(sequences), width), 19)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, seq in enumerate(sequences):
        span = slice(0, len(seq)) if side == "right" else slice(width - len(seq), width)
        ids[row, span], mask[row, span] = torch.tensor(seq), 1
    return ids, mask


def test_sequence_hidden_states_carry_the_gradient_of_the_states_they_show():
    """Each `hidden_states` entry is on the path to the outputs (as BERT's: `retain_grad` on it gives the state's
    gradient) while the outputs stay those of a call without `output_hidden_states`."""
    model = perturb(BASE_SEQUENCE.build())
    ids, mask = _padded([[3, 5, 7, 2], [4, 4, 9, 1, 8, 6]], 8, "left")
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
    plain = model(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
    out = model(inputs_embeds=embeds, attention_mask=mask, output_hidden_states=True)
    assert torch.equal(out.last_hidden_state, plain), "output_hidden_states changed last_hidden_state"
    for state in out.hidden_states:
        state.retain_grad()
    out.last_hidden_state.square().sum().backward()
    real = mask.bool()
    for i, state in enumerate(out.hidden_states):
        assert state.grad is not None, f"hidden_states[{i}] has no gradient"
        assert state.grad[real].abs().amin(-1).gt(0).any(), (
            f"hidden_states[{i}]: zero gradient at the real tokens"
        )
    # the embedding output at a real position is the given embedding itself: the same gradient, copied exactly
    assert torch.equal(out.hidden_states[0].grad[real], embeds.grad[real]), (
        f"max |Δ| {(out.hidden_states[0].grad[real] - embeds.grad[real]).abs().max():.3e}"
    )


def test_sequence_states_sit_at_their_input_positions_whatever_the_padding():
    """`last_hidden_state` and every `hidden_states` entry are (B, L, D), row i the state of input position i, as
    BERT's: right or left padding, within S or beyond; a padded position holds its row's first pad slot."""
    model = perturb(BASE_SEQUENCE.build())
    sequences = [[3, 5, 7, 2], [4, 4, 9, 1, 8, 6], [11]]
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([s]), output_hidden_states=True) for s in sequences]
        pad_states = {}
        for width, side in ((9, "right"), (9, "left"), (13, "right"), (13, "left")):  # 13 > S = 10
            ids, mask = _padded(sequences, width, side)
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            states = {"last_hidden_state": out.last_hidden_state}
            states.update({f"hidden_states[{i}]": h for i, h in enumerate(out.hidden_states)})
            for name, state in states.items():
                assert state.shape == (3, width, 16), f"{name} {width} {side}: {tuple(state.shape)}"
            for row, single in enumerate(alone):
                real = mask[row].bool()
                expected = {"last_hidden_state": single.last_hidden_state[0]}
                expected.update({f"hidden_states[{i}]": h[0] for i, h in enumerate(single.hidden_states)})
                for name, state in states.items():
                    # the same per-sequence sums in batched kernels: 2 layers × 2 fixed-point steps, each mixing
                    # over at most 10 positions and 16 channels, about 64 roundings of the O(1) values
                    where = f"{name}, row {row}, width {width}, {side} padding"
                    assert_close_to_scale(
                        state[row, real], expected[name], rounding(torch.float32, 64), where
                    )
                    pads = state[row, ~real]
                    assert torch.equal(pads, pads[:1].expand_as(pads)), f"{where}: pad positions differ"
                    pad_states.setdefault((name, row), []).append((where, pads[0]))
        # one pad slot's state (the slot after the real tokens) wherever the padding was
        for states in pad_states.values():
            (_, first), *rest = states
            assert first.abs().max() > 0, states[0][0]  # a state (the pad embedding first), not zeros
            for where, state in rest:
                assert_close_to_scale(state, first, rounding(torch.float32, 64), where)


def test_padded_positions_hold_zeros_when_the_real_tokens_fill_every_slot():
    model = perturb(BASE_SEQUENCE.build())
    slots = model.config.max_position_embeddings
    ids, mask = _padded([list(range(1, slots + 1))], slots + 3, "left")  # S real tokens, 3 padded positions
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    for name, state in [("last_hidden_state", out.last_hidden_state), *enumerate(out.hidden_states)]:
        assert torch.equal(state[0, :3], torch.zeros_like(state[0, :3])), (
            f"{name}: {state[0, :3].abs().max()}"
        )
        assert state[0, 3:].abs().amax(-1).min() > 0, name


def test_gathering_the_outputs_back_leaves_logits_and_pooler_output_bit_for_bit(monkeypatch):
    """The pooler and the heads read the S token-mixing slots: returning the states at the input positions (the
    gather) changes neither, checked against the same forward returning the slots themselves."""
    from energyformers.modeling import modeling_imixer

    head, base = perturb(SEQUENCE.build()), perturb(BASE_SEQUENCE.build())
    ids, mask = _padded([[3, 5, 7, 2], [4, 4, 9, 1, 8, 6], [11]], 9, "left")
    with torch.no_grad():
        logits, pooled = (
            head(input_ids=ids, attention_mask=mask).logits,
            base(input_ids=ids, attention_mask=mask),
        )
        monkeypatch.setattr(modeling_imixer, "at_input_positions", lambda states, positions: states)
        slot_logits = head(input_ids=ids, attention_mask=mask).logits
        slot_pooled = base(input_ids=ids, attention_mask=mask)
    assert slot_pooled.last_hidden_state.shape[1] == base.config.max_position_embeddings  # the slots indeed
    assert torch.equal(logits, slot_logits), (logits - slot_logits).abs().max()
    assert torch.equal(pooled.pooler_output, slot_pooled.pooler_output)


@pytest.mark.parametrize(
    "case", [IMAGE, SEQUENCE, Case("imixer", "AutoModel", "image"), BASE_SEQUENCE], ids=str
)
def test_output_attentions_is_accepted_and_ignored(case):
    """As transformers' ConvNext (no attention either): no TypeError, no `attentions`, the same outputs."""
    model, inputs = perturb(case.build()), case.inputs()
    with torch.no_grad():
        expected = model(**inputs)
        got = model(**inputs, output_attentions=True)
        as_tuple = model(**inputs, output_attentions=True, return_dict=False)
    assert got.attentions is None
    assert got.keys() == expected.keys()
    for key in expected.keys():
        assert torch.equal(got[key], expected[key]), key
    assert len(as_tuple) == len(expected.to_tuple())


@pytest.mark.parametrize("case", [IMAGE, Case("imixer", "AutoModel", "image")], ids=str)
def test_interpolate_pos_encoding_refuses_another_size_with_the_size_error(case):
    """iMixer has no position table to resample: `interpolate_pos_encoding=True` is taken (ViT's signature) and an
    image of another size gets the size ValueError, which says that the flag cannot apply and why (without it:
    no word about the flag, and no hint to pass it); the native size runs."""
    model, inputs = perturb(case.build()), case.inputs()
    image, patch = model.config.image_size, model.config.patch_size
    larger = torch.randn(BATCH, model.config.num_channels, image + 4, image + 4)
    size = rf"spatial size {image + 4}×{image + 4} but config.image_size is {image}×{image}"
    with pytest.raises(ValueError, match=size) as info:
        model(pixel_values=larger, interpolate_pos_encoding=True)
    cannot = "interpolate_pos_encoding=True cannot apply to iMixer"
    sized = f"token-mixing weights are sized to the {(image // patch) ** 2} patches of config.image_size"
    assert cannot in str(info.value) and sized in str(info.value), str(info.value)
    for flag in ({}, {"interpolate_pos_encoding": False}):
        with pytest.raises(ValueError, match=size) as info:
            model(pixel_values=larger, **flag)
        assert "interpolate_pos_encoding" not in str(info.value), (flag, str(info.value))
    with torch.no_grad():
        expected, got = model(**inputs), model(**inputs, interpolate_pos_encoding=True)
    key = "logits" if "logits" in expected else "last_hidden_state"
    assert torch.equal(got[key], expected[key])


def test_copies_start_without_the_eager_shortcuts_fingerprint():
    """`per_optimizer_step` skips a refinement when W's storage and version are as at the last check: a copy
    (deepcopy, pickle) holds other storages, so it carries no fingerprint that a reused address could match."""
    model = IMAGE.build(spectral_norm_schedule="per_optimizer_step").train()
    model(**IMAGE.inputs())
    norms = [m for m in model.modules() if isinstance(m, IMixerSpectralNorm)]
    assert norms and all(getattr(m, "_last_check", None) is not None for m in norms)
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        copies = [m for m in copied.modules() if isinstance(m, IMixerSpectralNorm)]
        assert len(copies) == len(norms)
        assert all(not hasattr(m, "_last_check") for m in copies)


def test_sequence_too_long_for_token_mixing_raises():
    model = SEQUENCE.build()
    with pytest.raises(ValueError, match=r"max_position_embeddings=10.*truncat"):
        model(input_ids=torch.ones(1, 11, dtype=torch.long))


# ---------------------------------------------------------------- bad inputs, gradient checkpointing
# (wrong input kind, channel count, image size, out-of-vocabulary / float ids, and gradient checkpointing =
# plain backprop with one power iteration per forward, not per recompute: tests/test_common.py)


# ---------------------------------------------------------------- learning (transformers.Trainer on real data)


class _Digits(torch.utils.data.Dataset):
    def __init__(self, images, labels) -> None:
        self.pixel_values = torch.tensor(images, dtype=torch.float32)[:, None] / 8.0 - 1.0  # 0..16 → [-1, 1]
        self.labels = torch.tensor(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.pixel_values[index], "labels": self.labels[index]}


def digits_accuracy(tmp_path, epochs: int) -> float:
    """Train the recommended small iMixer on sklearn digits (stratified 80/20, seed 0) with Trainer."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from transformers import Trainer, TrainingArguments

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images, digits.target, test_size=0.2, stratify=digits.target, random_state=0
    )
    config = IMixerConfig(
        image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=4, num_labels=10
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only loses from threads on shared cores
    try:
        torch.manual_seed(0)
        args = TrainingArguments(
            output_dir=str(tmp_path),
            per_device_train_batch_size=32,
            num_train_epochs=epochs,
            learning_rate=3e-3,
            weight_decay=0.05,
            warmup_steps=0.05,
            lr_scheduler_type="cosine",
            save_strategy="no",
            use_cpu=True,
            seed=0,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=IMixerForImageClassification(config), args=args, train_dataset=_Digits(x_train, y_train)
        )
        trainer.train()
        logits = trainer.predict(_Digits(x_test, y_test)).predictions
    finally:
        torch.set_num_threads(threads)
    return float((logits.argmax(-1) == y_test).mean())


def test_trainer_learns_digits_quickly(tmp_path):
    assert digits_accuracy(tmp_path, epochs=3) >= 0.9


@pytest.mark.slow
def test_trainer_learns_digits_to_95_percent(tmp_path):
    assert digits_accuracy(tmp_path, epochs=8) >= 0.95


def test_token_mixing_activation_edited_after_the_checks_is_refused_by_name():
    """The activation is read through the config's table: a value set after the config's checks raises a
    ValueError naming the field and the choices, not a bare KeyError."""
    config = IMAGE.config()
    config.token_mixing_activation = "swish"
    with pytest.raises(
        ValueError, match=r"invalid token_mixing_activation='swish'; expected one of \['gelu'"
    ):
        IMixerTokenMixing(config)
