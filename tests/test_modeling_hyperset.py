"""Hyper-SET model tests (tiny configs; transformers model-test style)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from fixtures import Case, DispatchedOps, assert_close_to_scale, assert_differs, perturb, rounding, step_once
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from energyformers import (
    HyperSetConfig,
    HyperSetForImageClassification,
    HyperSetForSequenceClassification,
    HyperSetForTokenClassification,
    HyperSetModel,
)
from energyformers.modeling.modeling_hyperset import iteration_embedding, sinusoidal_positions

# the shared tiny configs, inputs and models (tests/fixtures.py)
IMAGE = Case.of(HyperSetForImageClassification)
SEQUENCE = Case.of(HyperSetForSequenceClassification)
LENGTH, VOCAB = SEQUENCE.tiny.length, SEQUENCE.tiny.vocab


def trained(case: Case, steps: int = 1, **overrides) -> torch.nn.Module:
    """The tiny model after `steps` SGD steps, so the zero-initialised step sizes are non-zero."""
    model = case.build(**overrides)
    for seed in range(steps):
        step_once(model, case.inputs(labels=True, seed=seed), lr=0.1)
    return model


# ---------------------------------------------------------------- parameter counts (fidelity)


@pytest.mark.parametrize(
    ("preset", "expected"),
    [("cifar10-small", 1_240_138), ("cifar10-small-scaleup", 1_980_618), ("imagenet1k-640", 3_403_968)],
)
def test_image_preset_parameter_counts_match_paper_exactly(preset, expected):
    # the paper's models condition the step sizes on the iteration through the time MLP
    config = HyperSetConfig.from_preset(preset, iteration_conditioning="sinusoidal")
    with torch.device("meta"):
        model = HyperSetForImageClassification(config)
    assert sum(p.numel() for p in model.parameters()) == expected
    # the closed form of the spec, as a second witness
    d, f, c, m, dh = (
        config.hidden_size,
        3 * config.patch_size**2,
        config.num_labels,
        config.intermediate_size,
        config.head_dim,
    )
    assert expected == 3 * d * d + (f + c + 526) * d + 2 * f + c + config.num_hidden_layers * (
        d * d + d * m + m + 3 * dh
    )


def test_sudoku_preset_is_the_authors_model_with_the_papers_parameter_count():
    # their structure: no RMSNorms in the step-size network, RMSNorm + bias-free Linear head
    with torch.device("meta"):
        model = HyperSetForTokenClassification(
            HyperSetConfig.from_preset("sudoku", iteration_conditioning="sinusoidal")
        )
    assert sum(p.numel() for p in model.parameters()) == 5_195_584
    assert isinstance(model.layernorm, torch.nn.RMSNorm) and model.classifier.bias is None


def test_from_preset_applies_overrides_and_rejects_unknown_names():
    config = HyperSetConfig.from_preset("cifar10-small", num_iterations=4, image_size=32, patch_size=4)
    assert (config.num_iterations, config.image_size, config.hidden_size) == (4, 32, 384)
    labelled = HyperSetConfig.from_preset("cifar10-small", id2label={0: "cat", 1: "dog"})
    assert labelled.num_labels == 2
    with pytest.raises(ValueError, match="unknown preset name='cifar100'"):
        HyperSetConfig.from_preset("cifar100")


# ---------------------------------------------------------------- save / load
# (round trips, cross-head loading, Auto classes, return_dict=False, gradients, padding, wrong-input_type
# heads, inputs_embeds, num_labels=0 and recorded logits are checked for every head of every family in
# tests/test_common.py)


def test_ignore_mismatched_sizes_reinitialises_classifier(tmp_path):
    source = trained(IMAGE)
    source.save_pretrained(tmp_path)
    labels = {i: f"class_{i}" for i in range(7)}
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        HyperSetForImageClassification.from_pretrained(tmp_path, id2label=labels)
    target = HyperSetForImageClassification.from_pretrained(
        tmp_path, id2label=labels, ignore_mismatched_sizes=True
    )
    assert target.classifier.weight.shape == (7, 16)
    assert torch.equal(
        target.hyperset.layers[0].attention.qkv_proj.weight,
        source.hyperset.layers[0].attention.qkv_proj.weight,
    )


# ---------------------------------------------------------------- the energy view (exact gradients)


def _attention_module(**overrides):
    config = SEQUENCE.config(qkv_norm="shared", **overrides)
    torch.manual_seed(0)
    return HyperSetModel(config).double().layers[0].attention


@pytest.mark.parametrize("energy", ["bisoftmax", "sigmoid"])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_update_is_w_transpose_times_energy_gradient(energy, masked):
    attention = _attention_module(attention_energy=energy)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    keep = torch.ones(2, 6, dtype=torch.float64)
    if masked:
        keep[1, -2:] = 0
    dh = attention.head_dim
    z = attention.normalized_heads(x).detach().requires_grad_(True)  # gain-free, (B, H, N, d_h)
    scores = z @ z.transpose(-1, -2) / math.sqrt(dh)
    pair = keep[:, None, :, None] * keep[:, None, None, :]
    if energy == "bisoftmax":
        lse = scores.masked_fill(pair == 0, float("-inf")).logsumexp(-1).nan_to_num(neginf=0.0)
        total = math.sqrt(dh) * (lse * keep[:, None, :]).sum()
    else:
        total = 0.5 * math.sqrt(dh) * (torch.sigmoid(scores) * pair).sum()
    (grad_z,) = torch.autograd.grad(total, z)
    expected = grad_z.transpose(1, 2).reshape(2, 6, 16) @ attention.qkv_proj.weight  # Wᵀ ∂E/∂z per token
    update, _ = attention(x, keep if masked else None)
    real = keep.bool()
    # the same sums as autograd's in another order: over 6 tokens and the 4 head channels, then the 16 rows of W
    assert_close_to_scale(update[real], expected[real], rounding(torch.float64, 64), "update vs autograd")


@pytest.mark.parametrize("qkv_norm", ["separate", "shared"])
@pytest.mark.parametrize("energy", ["bisoftmax", "linear"])
def test_attention_reads_its_gains_without_index_or_repeat_kernels(qkv_norm, energy):
    # The attention runs once per iteration (L·T times a call): the gains are views of `qkv_gain`, and g_v scales
    # W through a broadcast. An index with a list builds its index on the host (a host-to-device copy on CUDA)
    # and `repeat` is one more launch, forward and backward, at every iteration.
    extra = {"feature_map": "elu+1"} if energy == "linear" else {}
    attention = (
        SEQUENCE.build(qkv_norm=qkv_norm, attention_energy=energy, **extra).hyperset.layers[0].attention
    )
    x = torch.randn(2, 6, 16, requires_grad=True)
    with DispatchedOps() as probe:
        attention(x)[0].square().sum().backward()
    avoided = {"aten.index", "aten.index_put", "aten._index_put_impl_", "aten.repeat", "aten.lift_fresh"}
    ran = probe.packets
    assert not ran & avoided, f"ops: {sorted(ran & avoided)} among {sorted(ran)}"
    assert attention.qkv_gain.grad is not None and torch.isfinite(attention.qkv_gain.grad).all()


class _WeightOnlyKernels(TorchDispatchMode):
    """Counts all dispatched aten ops, and the kernels (non-view ops) whose every tensor input derives from the
    parameters alone: work that gives the same result at every iteration of a forward."""

    def __init__(self, parameters) -> None:
        super().__init__()
        self.held = list(parameters)  # alive, so no other tensor takes the id of a weight-derived one
        self.ids = {id(t) for t in self.held}
        self.total, self.weight_only = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.total += 1
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if inputs and all(id(t) in self.ids for t in inputs):
            outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            self.held += outputs
            self.ids.update(id(t) for t in outputs)
            if not func.is_view:
                self.weight_only.append(str(func))
        return out


@pytest.mark.parametrize(
    ("overrides", "call"),
    [
        ({}, {}),
        ({"attention_energy": "sigmoid", "input_anchor": 0.5}, {}),
        ({"qkv_norm": "shared"}, {"halting_tolerance": 1e-30}),  # runs every iteration, by the halting loop
    ],
)
def test_weight_only_products_are_computed_once_per_forward_not_per_iteration(overrides, call):
    # The attention's q·k scale g_q g_k/√d_h and its g_v-scaled output weight depend on the parameters alone: the
    # model computes them once per layer and forward, so these kernels do not grow with the depth T (each would be
    # a launch, and its backward one more, at every one of the L·T iterations).
    model = trained(IMAGE, **overrides).eval()  # non-zero step sizes: the halting loop runs all T iterations
    inputs = IMAGE.inputs()
    counted = {}
    for depth in (4, 12):
        with torch.no_grad(), _WeightOnlyKernels(model.parameters()) as probe:
            out = model(**inputs, num_iterations=depth, **call)
        if "halting_tolerance" in call:
            assert (out.iterations_used == depth * model.config.num_hidden_layers).all(), out.iterations_used
        counted[depth] = probe
    short, long = counted[4], counted[12]
    assert long.weight_only == short.weight_only, (
        f"weight-only kernels at T=4: {len(short.weight_only)}, at T=12: {len(long.weight_only)} "
        f"({sorted(set(long.weight_only))}); all dispatched ops: {short.total} at T=4, {long.total} at T=12"
    )
    assert short.weight_only, "the probe saw no weight-only kernel at all: it tracks nothing"


@pytest.mark.parametrize("training", [False, True])
def test_a_plain_forward_builds_no_tensor_from_nothing(training):
    # Without padding, energies, halting, final energy, outer steps or a halting head nothing reads a token mask or
    # a step counter: the forward builds neither (each is a kernel, and a buffer, on every call).
    model, inputs = trained(IMAGE).train(training), IMAGE.inputs(labels=training)
    with DispatchedOps() as probe:
        out = model(**inputs)
        if training:
            out.loss.backward()
    assert probe.from_nothing == [], f"tensors built from no tensor: {probe.from_nothing}"
    assert out.supervision_steps_used is None and out.iterations_used is None


def test_the_anchor_step_costs_two_kernels_per_iteration():
    # x − λ(x_t − x₀): the difference, then one subtraction that carries λ; counted as the ops one more iteration
    # adds with the anchor energy, less those it adds without.
    per_iteration = {}
    for anchor in (0.0, 0.5):
        model, inputs = trained(IMAGE, input_anchor=anchor).eval(), IMAGE.inputs()
        counts = []
        for depth in (4, 5):
            with torch.no_grad(), DispatchedOps() as probe:
                model(**inputs, num_iterations=depth)
            counts.append(len(probe.ops))
        per_iteration[anchor] = (counts[1] - counts[0]) / model.config.num_hidden_layers
    extra = per_iteration[0.5] - per_iteration[0.0]
    assert extra == 2, f"ops per iteration and layer: {per_iteration} (the anchor adds {extra})"


def _gelu_energy(u: torch.Tensor) -> torch.Tensor:
    """−Σ ∫₀ᵘ tΦ(t) dt written out: −Σ (½[(u² − 1)Φ(u) + uϕ(u)] + ¼)."""
    cdf = 0.5 * (1 + torch.erf(u / math.sqrt(2)))
    pdf = torch.exp(-0.5 * u * u) / math.sqrt(2 * math.pi)
    return -(0.5 * ((u * u - 1) * cdf + u * pdf) + 0.25).sum()


# E_FF of u = n(Dx) for each (feedforward_energy, hidden_act), written from the definitions
FEEDFORWARD_ENERGIES = {
    ("relu", "relu"): lambda u: -0.5 * F.relu(u).pow(2).sum(),
    ("relu", "gelu"): _gelu_energy,
    ("softmax", "relu"): lambda u: (-u.logsumexp(-1)).sum(),
}


@pytest.mark.parametrize(("energy", "act"), list(FEEDFORWARD_ENERGIES))
def test_feedforward_update_is_minus_d_transpose_times_energy_gradient(energy, act):
    config = SEQUENCE.config(feedforward_energy=energy, hidden_act=act)
    torch.manual_seed(0)
    feedforward = HyperSetModel(config).double().layers[0].feedforward
    with torch.no_grad():
        feedforward.norm.weight.uniform_(0.5, 1.5)  # the update must hold with learnable gains too
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    u = feedforward.norm(feedforward.dictionary(x)).detach().requires_grad_(True)
    (grad_u,) = torch.autograd.grad(FEEDFORWARD_ENERGIES[energy, act](u), u)
    expected = -grad_u @ feedforward.dictionary.weight  # −Dᵀ ∂E/∂u per token
    # the same sums as autograd's in another order: over the 24 dictionary atoms, then the 16 channels
    assert_close_to_scale(feedforward(x), expected, rounding(torch.float64, 64), "update vs autograd")


@pytest.mark.parametrize(("energy", "act"), list(FEEDFORWARD_ENERGIES))
def test_reported_feedforward_energy_is_the_potential_of_the_update(energy, act):
    # The reported E_FF(x) = E(u(x)), u = n(Dx) without gains, must have ∂E/∂u = −act(u): then its gradient in x is
    # the pullback of −act(u) through u(x). With a square orthogonal D and unit gains, act(u) = D FF(x) exactly.
    config = SEQUENCE.config(feedforward_energy=energy, hidden_act=act, intermediate_size=16)
    torch.manual_seed(0)
    feedforward = HyperSetModel(config).double().layers[0].feedforward
    with torch.no_grad():
        feedforward.dictionary.weight.copy_(torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))[0])
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(2, 6, dtype=torch.float64)
    with torch.enable_grad():  # the energy methods run without autograd; call the undecorated one
        (grad_energy,) = torch.autograd.grad(
            type(feedforward).energy.__wrapped__(feedforward, x, keep).sum(), x
        )
        u = F.rms_norm(feedforward.dictionary(x), (16,), eps=feedforward.eps)
        coefficients = feedforward(x).detach() @ feedforward.dictionary.weight.t()  # D Dᵀ act(u) = act(u)
        (expected,) = torch.autograd.grad(u, x, -coefficients)
    # sums of 16 terms, a few in a row (D, the norm, Dᵀ, the pullback) in another order
    assert_close_to_scale(
        grad_energy, expected, rounding(torch.float64, 256), "∂E_FF/∂x vs pullback of −act(u)"
    )
    with torch.no_grad():
        u = F.rms_norm(feedforward.dictionary(x), (16,), eps=feedforward.eps)
        stated = torch.stack([FEEDFORWARD_ENERGIES[energy, act](row) for row in u])
        assert_close_to_scale(feedforward.energy(x, keep), stated, rounding(torch.float64, 256), "E_FF")
        if act == "relu" and energy == "relu":  # the paper's energy, to the bit
            assert torch.equal(feedforward.energy(x, keep), -0.5 * F.relu(u).pow(2).sum(-1).sum(-1))


def test_bisoftmax_maps_are_symmetric_with_shared_qkv_norm():
    model = SEQUENCE.build(qkv_norm="shared")
    inputs = SEQUENCE.inputs()
    inputs.pop("attention_mask")
    with torch.no_grad():
        probs = model(**inputs, output_attentions=True).attentions
    assert len(probs) == 2 * 3
    torch.testing.assert_close(probs[0], probs[0].transpose(-1, -2))
    # rows of the row softmax and columns of the column softmax each sum to 1: total mass 2N per head
    torch.testing.assert_close(probs[0].sum((-1, -2)), torch.full((3, 4), 2.0 * LENGTH))


def test_energies_match_definitions_and_geometry_diagnostics():
    model = SEQUENCE.build()
    inputs = SEQUENCE.inputs()
    with torch.no_grad():
        out = model(**inputs, output_energies=True, output_hidden_states=True)
    energies = out.energies
    assert energies.attention_energy.shape == (3, 2, 4) and energies.effective_rank.shape == (3, 2, 4, 4)
    # E_ATTN and E_FF by hand for sample 0 (2 padded tokens), layer 1, t = 0 (its input: the state after layer 0)
    x = out.hidden_states[3][0, :5]
    layer = model.hyperset.layers[1]
    z = F.rms_norm(layer.attention.qkv_proj(x).view(5, 4, 4).transpose(0, 1), (4,))
    expected_attention = 2.0 * (z @ z.transpose(-1, -2) / 2.0).logsumexp(-1).sum()
    u = F.rms_norm(layer.feedforward.dictionary(x), (24,))
    expected_feedforward = -0.5 * F.relu(u).pow(2).sum()
    torch.testing.assert_close(energies.attention_energy[0, 1, 0], expected_attention)
    torch.testing.assert_close(energies.feedforward_energy[0, 1, 0], expected_feedforward)
    # identical tokens: one direction → effective rank 1 and zero angles
    same = torch.full((1, 5), 3)
    with torch.no_grad():
        collapsed = HyperSetModel(SEQUENCE.config(position_embedding_type="learned"))
        collapsed.embeddings.position_embeddings.weight.zero_()
        diagnostics = collapsed(input_ids=same, num_iterations=1, output_energies=True).energies
    torch.testing.assert_close(diagnostics.effective_rank[0, 0, 0], torch.ones(4))
    assert diagnostics.average_angle[0, 0, 0].max() < 0.1  # degrees
    assert (energies.average_angle > 0).all() and (energies.effective_rank > 1).all()


def test_energy_diagnostics_of_a_float64_model_are_float64():
    model = SEQUENCE.build().double()
    with torch.no_grad():
        energies = model(**SEQUENCE.inputs(), output_energies=True).energies
    assert {energies[name].dtype for name in energies} == {torch.float64}


# ---------------------------------------------------------------- recurrence and step sizes


def test_model_is_the_identity_on_embedded_tokens_at_initialisation():
    model = IMAGE.build()
    with torch.no_grad():
        states = model(**IMAGE.inputs(), output_hidden_states=True).hidden_states
    assert len(states) == 1 + 2 * 3
    for state in states[1:]:
        assert torch.equal(state, states[0])


def test_iteration_embedding_learns_to_depend_on_t():
    # The public code zero-initialises both time_mlp Linears, so c_t stays a t-independent constant.
    model = IMAGE.build(iteration_conditioning="sinusoidal")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for seed in range(3):
        model(**IMAGE.inputs(labels=True, seed=seed)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    step_sizes = model.hyperset.step_sizes
    with torch.no_grad():
        conditions = step_sizes.iteration_conditions(3, torch.zeros(1))
        state = torch.randn(1, 5, 16)
        alphas = [step_sizes(conditions[t], state)[0] for t in range(3)]
    # not rounding bounds: trained, the iterations' conditions and step sizes differ, by far more than float32
    # rounding of these O(1) and O(0.1) values (~1e-7 and ~1e-8)
    apart = (conditions[0] - conditions[1]).abs().max().item(), (alphas[0] - alphas[2]).abs().max().item()
    assert apart[0] > 1e-3 and apart[1] > 1e-6, f"conditions {apart[0]:.3g} apart, step sizes {apart[1]:.3g}"
    assert step_sizes.proj.weight.abs().max() > 0


def test_iteration_sinusoid_and_position_encoding_follow_the_spec():
    e = iteration_embedding(torch.tensor([1.0, 2.0]), 8)  # half = 4, f_k = 10000^(−k/3)
    freqs = torch.tensor([10000.0 ** (-k / 3) for k in range(4)])
    torch.testing.assert_close(e[1], torch.cat([torch.sin(2 * freqs), torch.cos(2 * freqs)]))
    pe = sinusoidal_positions(5, 6)
    div = torch.exp(torch.arange(0, 6, 2) * (-math.log(10000.0) / 6))
    torch.testing.assert_close(pe[3, 0::2], torch.sin(3 * div))
    torch.testing.assert_close(pe[3, 1::2], torch.cos(3 * div))


def test_interpolate_pos_encoding_resamples_the_sinusoid_to_the_input_grid():
    """ViT's `interpolate_pos_encoding`: a 64×64 image into a 32×32 model (4×4 grid of 8×8 patches → 8×8 grid)."""
    model = perturb(
        IMAGE.build(image_size=32, patch_size=8)
    )  # perturbed: non-zero step sizes, positions matter
    large = torch.randn(2, 1, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        outputs = model(pixel_values=large, interpolate_pos_encoding=True, output_hidden_states=True)
    assert outputs.logits.shape == (2, IMAGE.tiny.labels) and torch.isfinite(outputs.logits).all()
    assert outputs.hidden_states[0].shape == (2, 1 + 8 * 8, IMAGE.tiny.hidden)
    with pytest.raises(
        ValueError, match=r"64×64 but config.image_size is 32×32.*interpolate_pos_encoding=True"
    ):
        model(pixel_values=large)
    # at the native size the flag changes nothing: the table is used as it is
    native = torch.randn(2, 1, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain, flagged = (
            model(pixel_values=native).logits,
            model(native, interpolate_pos_encoding=True).logits,
        )
    assert torch.equal(plain, flagged), f"max difference {(plain - flagged).abs().max().item():.3g}"
    # the positions added: the CLS row unchanged, the patch rows the bicubic resampling of the 4×4 sinusoid grid
    embeddings = model.hyperset.embeddings
    table = embeddings.position_encoding  # (1, 1 + 16, d)
    with torch.no_grad():
        tokens = embeddings.embed_patches(large)
        added = embeddings(pixel_values=large, interpolate_pos_encoding=True)[0] - tokens
    grid = table[:, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)  # (1, 16, d) → (1, d, 4, 4)
    expected = F.interpolate(grid, size=(8, 8), mode="bicubic", align_corners=False)
    expected = torch.cat([table[:, :1], expected.permute(0, 2, 3, 1).reshape(1, 64, -1)], dim=1)  # (1, 65, d)
    # `added` is (tokens + positions) − tokens in float32: off by the rounding of the sum, a few ulps of the
    # largest term (|tokens| after LayerNorm and |positions| <= 1 are both O(1))
    scale = max(tokens.abs().max().item(), 1.0)
    torch.testing.assert_close(
        added, expected.expand_as(added), atol=rounding(torch.float32, 4, scale), rtol=0
    )


def test_interpolate_pos_encoding_reaches_the_backbone_in_test_time_search():
    """Test-time search embeds the repeated inputs itself: the flag must reach those embeddings too."""
    model = perturb(IMAGE.build(image_size=32, patch_size=8))
    large = torch.randn(2, 1, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(large, interpolate_pos_encoding=True).logits
        searched = model(large, interpolate_pos_encoding=True, search_trajectories=2, search_seed=0).logits
    assert searched.shape == plain.shape
    # no noise: every trajectory starts from x₀, so the search returns the plain forward's answer
    torch.testing.assert_close(searched, plain)


def test_patch_features_are_ordered_dy_dx_channel():
    model = IMAGE.build(num_channels=3, image_size=[4, 6])
    pixels = torch.randn(1, 3, 4, 6)
    seen = {}
    model.hyperset.embeddings.patch_norm.register_forward_hook(
        lambda m, args, out: seen.setdefault("x", args[0])
    )
    with torch.no_grad():
        model(pixel_values=pixels)
    patches = seen["x"]
    assert patches.shape == (1, 2 * 3, 12)  # non-square grid, 3 channels
    # second patch in row-major order: rows 0..1, columns 2..3; channel is the fastest-varying feature
    torch.testing.assert_close(patches[0, 1], pixels[0, :, 0:2, 2:4].permute(1, 2, 0).reshape(-1))


def test_num_iterations_override_changes_output_and_extrapolates():
    model = trained(IMAGE, steps=2)
    inputs = IMAGE.inputs()
    with torch.no_grad():
        default = model(**inputs).logits
        same = model(**inputs, num_iterations=3).logits
        longer = model(**inputs, num_iterations=12, output_hidden_states=True)
    assert torch.equal(default, same)
    assert_differs(longer.logits, default, "logits, 12 vs 3 iterations", beyond_allclose=True)
    assert len(longer.hidden_states) == 1 + 2 * 12
    with pytest.raises(ValueError, match="num_iterations must be an integer >= 1; got 0"):
        model(**inputs, num_iterations=0)


# (gradient checkpointing = plain backprop, for both step-size conditions: tests/test_common.py)


# ---------------------------------------------------------------- padding (invariance: tests/test_common.py)


def test_fully_padded_rows_produce_no_nan():
    model = trained(SEQUENCE, steps=2)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1] = 0  # a sample with no real token at all
    mask[0, 3:] = 0
    with torch.no_grad():
        out = model(
            input_ids=torch.randint(0, VOCAB, (2, 6)),
            attention_mask=mask,
            output_attentions=True,
            output_hidden_states=True,
        )
    assert torch.isfinite(out.logits).all()
    assert all(torch.isfinite(t).all() for t in out.hidden_states + out.attentions)
    assert out.attentions[0][0, :, :, 3:].abs().max() == 0  # nobody reads padded keys


# ---------------------------------------------------------------- bad input and invalid configs
# (wrong input kind, channel count, image size, out-of-vocabulary ids, over-long and float input_ids:
# tests/test_common.py; every config field: tests/test_configuration.py)
