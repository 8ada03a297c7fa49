"""HyperBF (Gan & Poggio, CBMM memo 143): config, Gaussian attention, RBF feedforward, heads, Hub round trips."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from fixtures import Case, assert_close_to_scale, labelled, main_output, rounding
from torch.overrides import TorchFunctionMode

from energyformers.configuration.configuration_hyperbf import HyperBFConfig
from energyformers.modeling.modeling_hyperbf import (
    HyperBFForImageClassification,
    HyperBFForSequenceClassification,
    HyperBFModel,
)

# the shared tiny configs, inputs and models (tests/fixtures.py)
TINY = Case.of(HyperBFModel, "image").tiny
CASES = [Case.of(HyperBFModel, "image"), Case.of(HyperBFModel, "sequence")]
CASES += [Case.of(HyperBFForImageClassification), Case.of(HyperBFForSequenceClassification)]
# sdpa vs eager, per unit of the compared tensor's largest magnitude (`assert_close_to_scale`): the same sums in
# another order. Forward: two layers, each a softmax-weighted sum over at most 17 tokens of 16-long dot products
# and the RBF sum over the centers, 64 roundings. Gradients add the backward sums over every token, head and batch
# row: 1024 (tests/test_hyperbf_attention_implementations.py holds float64 to the same counts). The first layers'
# gradients are ill-conditioned (LayerNorm's backward amplifies the forward rounding): each float32 path alone is
# ~4e-5 of the largest entry off the float64 gradient, so this bound has only a few times headroom there.
FORWARD, GRADIENT = rounding(torch.float32, 64), rounding(torch.float32, 1024)
CLASSIFIERS = CASES[2:]


def build(model_class, input_type: str, seed: int = 0, **overrides):
    return Case.of(model_class, input_type).build(seed=seed, **overrides)


def num_tokens(case: Case) -> int:
    return TINY.length if case.input_type == "sequence" else (TINY.image // 2) ** 2 + 1  # patches + CLS


# ----------------------------------------------------------------------------------------- configuration


def test_presets_match_the_memo_and_accept_overrides():
    cifar = HyperBFConfig.from_preset("cifar")
    assert (cifar.hidden_size, cifar.num_attention_heads, cifar.num_hidden_layers) == (768, 4, 4)
    assert (cifar.patch_size, cifar.image_size, cifar.num_labels) == (4, 32, 10)
    assert cifar.num_centers == cifar.intermediate_size == 4 * 768 and cifar.rbf_projection_dim == 768
    tiny = HyperBFConfig.from_preset("tiny", feedforward_kernel="gaussian", hidden_size=16)
    assert tiny.feedforward_kernel == "gaussian" and tiny.num_centers == 64
    assert HyperBFConfig(hidden_size=64, intermediate_size=100).num_centers == 100
    with pytest.raises(ValueError, match="unknown preset"):
        HyperBFConfig.from_preset("imagenet")


# (every config field: tests/test_configuration.py)


# ------------------------------------------------------------------------------------------ forward pass


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_shapes_and_loss(case):
    model = case.build()
    inputs = case.inputs(labels=not case.is_base)
    outputs = model(**inputs)
    if case.is_base:
        assert outputs.last_hidden_state.shape == (TINY.batch, num_tokens(case), TINY.hidden)
        assert outputs.pooler_output.shape == (TINY.batch, TINY.hidden)
    else:
        assert outputs.logits.shape == (TINY.batch, TINY.labels)
        torch.testing.assert_close(outputs.loss, F.cross_entropy(outputs.logits, inputs["labels"]))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_output_hidden_states_are_embeddings_then_one_per_layer(case):
    model = case.build()
    inputs = case.inputs()
    outputs = model(**inputs, output_hidden_states=True)
    backbone = model.base_model
    assert len(outputs.hidden_states) == model.config.num_hidden_layers + 1
    first = {case.main_input_name: inputs[case.main_input_name]}
    embedded = backbone.embeddings(**first)
    embedded = embedded[0] if isinstance(embedded, tuple) else embedded  # (states, padding mask) or states
    torch.testing.assert_close(outputs.hidden_states[0], embedded)
    final = backbone(**inputs).last_hidden_state
    torch.testing.assert_close(backbone.layernorm(outputs.hidden_states[-1]), final)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_output_attentions_are_row_stochastic_maps_per_layer(case):
    model = case.build()  # default sdpa: maps come from the eager path for this call
    assert model.config._attn_implementation == "sdpa"
    inputs = case.inputs()
    outputs = model(**inputs, output_attentions=True)
    tokens = num_tokens(case)
    assert len(outputs.attentions) == model.config.num_hidden_layers
    for maps in outputs.attentions:
        assert maps.shape == (TINY.batch, model.config.num_attention_heads, tokens, tokens)
        torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))
    # the maps came from the eager path, the plain call from sdpa: two orders of the same sums (see FORWARD)
    assert_close_to_scale(main_output(outputs), main_output(model(**inputs)), FORWARD, "output with maps")


@pytest.mark.parametrize("rbf_width", ["layer", "center"])
@pytest.mark.parametrize("kernel", ["normalized", "gaussian"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_output_rbf_diagnostics(case, kernel, rbf_width):
    model = case.build(feedforward_kernel=kernel, rbf_width=rbf_width)
    outputs = model(**case.inputs(), output_rbf_diagnostics=True)
    diagnostics = outputs.rbf_diagnostics
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    num_centers = 4 * TINY.hidden
    weights = diagnostics.center_weights
    assert weights.shape == (TINY.batch, layers, num_tokens(case), num_centers)
    assert bool((weights > 0).all() and (weights <= 1).all())
    if kernel == "normalized":
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    widths = 1 if rbf_width == "layer" else num_centers
    assert diagnostics.feedforward_sigmas.shape == (layers, widths)
    assert diagnostics.attention_sigmas.shape == (layers, heads)
    for index, layer in enumerate(model.base_model.layers):
        torch.testing.assert_close(diagnostics.feedforward_sigmas[index], layer.feedforward.log_sigma.exp())
        tau = layer.attention.log_temperature.exp()
        torch.testing.assert_close(diagnostics.attention_sigmas[index], 1 / torch.sqrt(2 * tau))
    assert model(**case.inputs()).rbf_diagnostics is None


@pytest.mark.parametrize("case", CASES, ids=str)
def test_output_rbf_weights_is_the_specifications_name_of_output_rbf_diagnostics(case):
    """The model and every head take `output_rbf_weights` and return what `output_rbf_diagnostics` returns, bit for
    bit (the same switch); set both, they must agree."""
    model = case.build().eval()
    inputs = case.inputs()
    with torch.no_grad():
        expected = model(**inputs, output_rbf_diagnostics=True).rbf_diagnostics
        got = model(**inputs, output_rbf_weights=True).rbf_diagnostics
        assert model(**inputs, output_rbf_weights=False).rbf_diagnostics is None
        assert (
            model(**inputs, output_rbf_weights=True, output_rbf_diagnostics=True).rbf_diagnostics is not None
        )
    assert got is not None, f"{case}: output_rbf_weights=True returned no rbf_diagnostics"
    for name in ("center_weights", "feedforward_sigmas", "attention_sigmas"):
        difference = (getattr(got, name) - getattr(expected, name)).abs().max().item()
        assert torch.equal(getattr(got, name), getattr(expected, name)), (
            f"{case} {name}: max diff {difference:.3g}"
        )
    with pytest.raises(
        ValueError, match="output_rbf_weights=False is an alias of output_rbf_diagnostics=True"
    ):
        model(**inputs, output_rbf_weights=False, output_rbf_diagnostics=True)


# ----------------------------------------------------------------- initialisation: the public code's bug


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("rbf_width", ["layer", "center"])
@pytest.mark.parametrize("kernel", ["normalized", "gaussian"])
@pytest.mark.parametrize("case", CLASSIFIERS, ids=str)
def test_every_parameter_gets_a_finite_nonzero_gradient_at_init(case, kernel, rbf_width, attn_implementation):
    model = case.build(
        feedforward_kernel=kernel, rbf_width=rbf_width, attn_implementation=attn_implementation
    )
    model.train()
    model(**case.inputs(labels=True)).loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(parameter.grad).all(), f"{name} has a non-finite gradient"
        assert parameter.grad.abs().sum() > 0, f"{name} has an all-zero gradient at init"
        if name.endswith(("centers", "metric", "values.weight")):
            # Per center / per row: no dead center at init (the public code's whole feedforward was dead).
            assert (parameter.grad.abs().sum(-1) > 0).all(), f"{name} has dead rows"


@pytest.mark.parametrize("kernel", ["normalized", "gaussian"])
def test_rbf_weights_are_not_numerically_zero_for_layernormed_inputs_at_memo_width(kernel):
    # Memo width D = 768, K = 3072 (the public code's exp(−β·distance) is exactly 0 there in float32).
    config = HyperBFConfig.from_preset("cifar", num_hidden_layers=1, feedforward_kernel=kernel)
    torch.manual_seed(0)
    feedforward = HyperBFModel(config).layers[0].feedforward
    inputs = F.layer_norm(3 * torch.randn(4, 16, config.hidden_size) + 1, (config.hidden_size,))
    with torch.no_grad():
        weights = feedforward.center_weights(inputs)
    num_centers = config.num_centers
    # Every center is in play (no weight anywhere near float32 underflow) and none dominates: each weight is
    # within a factor 100 of 1/K, and the Gaussian kernel's total mass is O(1) like the normalized one's.
    assert weights.min() > 0.01 / num_centers and weights.max() < 100 / num_centers, (
        weights.min(),
        weights.max(),
    )
    mass = weights.sum(-1)
    assert mass.min() > 0.2 and mass.max() < 5, (mass.min(), mass.max())


# ------------------------------------------------------------------------------------ Gaussian attention


def _attention_unit(seed: int = 0, attn_implementation: str = "eager", dtype=torch.float32):
    model = build(HyperBFModel, "image", seed=seed).to(dtype)
    model.set_attn_implementation(attn_implementation)
    attention = model.layers[0].attention
    with torch.no_grad():  # distinct temperatures per head so head mixing would be caught
        attention.log_temperature.copy_(torch.log(torch.tensor([0.3, 1.7], dtype=dtype)))
    return attention


def test_memo_identity_unit_norm_gaussian_attention_equals_dot_product_softmax():
    attention = _attention_unit(dtype=torch.float64)
    generator = torch.Generator().manual_seed(1)
    query, key, value = (torch.randn(2, 2, 7, 16, generator=generator, dtype=torch.float64) for _ in range(3))
    query, key = F.normalize(query, dim=-1), F.normalize(key, dim=-1)
    _, weights = attention.attend(query, key, value, output_attentions=True)
    tau = attention.log_temperature.exp().view(1, -1, 1, 1)
    dot_product = torch.softmax(2 * tau * query @ key.transpose(-1, -2), dim=-1)
    # the logits −τ‖q − k‖² reach 4τ ≤ 7 and are 16-long sums; softmax passes their rounding on to the weights
    logit_rounding = rounding(torch.float64, 32, 7.0)
    torch.testing.assert_close(
        weights, dot_product, atol=logit_rounding, rtol=0, msg=labelled("vs dot product")
    )
    # …and both equal the Gaussian kernel from its definition, softmax_j(−τ‖q_i − k_j‖²).
    definition = torch.softmax(-tau * (query.unsqueeze(-2) - key.unsqueeze(-3)).pow(2).sum(-1), dim=-1)
    torch.testing.assert_close(
        weights, definition, atol=logit_rounding, rtol=0, msg=labelled("vs definition")
    )


def test_eager_attention_equals_gaussian_kernel_definition_for_any_norms():
    attention = _attention_unit(dtype=torch.float64)
    generator = torch.Generator().manual_seed(2)
    query, key, value = (
        3 * torch.randn(2, 2, 7, 16, generator=generator, dtype=torch.float64) for _ in range(3)
    )
    output, weights = attention.attend(query, key, value, output_attentions=True)
    tau = attention.log_temperature.exp().view(1, -1, 1, 1)
    definition = torch.softmax(-tau * (query.unsqueeze(-2) - key.unsqueeze(-3)).pow(2).sum(-1), dim=-1)
    # the logits −τ‖q − k‖² are 16-long sums of their largest size; softmax turns their absolute rounding δ into a
    # relative one of at most 2δ on each weight (≤ 1), so the output, a convex combination of the values, is off by
    # at most 2δ·max|v|
    logits = (tau * (query.unsqueeze(-2) - key.unsqueeze(-3)).pow(2).sum(-1)).max().item()
    weight_rounding = rounding(torch.float64, 32, logits)
    torch.testing.assert_close(weights, definition, atol=weight_rounding, rtol=0, msg=labelled("weights"))
    output_rounding = 2 * weight_rounding * value.abs().max().item()
    expected = (definition @ value).transpose(1, 2)
    torch.testing.assert_close(output, expected, atol=output_rounding, rtol=0, msg=labelled("output"))


def test_sdpa_and_eager_attention_units_agree_with_padding():
    eager, sdpa = _attention_unit(attn_implementation="eager"), _attention_unit(attn_implementation="sdpa")
    generator = torch.Generator().manual_seed(3)
    query, key, value = (2 * torch.randn(2, 2, 9, 16, generator=generator) for _ in range(3))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False
    expected, weights = eager.attend(query, key, value, mask)
    got, none = sdpa.attend(query, key, value, mask)
    assert weights is not None and none is None  # the two paths really are different code
    # 16-long dot products, then a softmax-weighted sum over 9 keys, in another order: 16 roundings of the output
    assert_close_to_scale(got, expected, rounding(torch.float32, 16), "sdpa vs eager")
    assert weights[1, :, :, 5:].max() == 0  # padded keys get exactly zero weight


@pytest.mark.parametrize("case", CASES, ids=str)
def test_sdpa_and_eager_models_agree_in_outputs_and_gradients(case):
    sdpa = case.build()
    eager = copy.deepcopy(sdpa)
    eager.set_attn_implementation("eager")
    assert (sdpa.config._attn_implementation, eager.config._attn_implementation) == ("sdpa", "eager")
    inputs = case.inputs()
    if case.input_type == "sequence":
        inputs["attention_mask"][1, 8:] = 0
    outs = [main_output(model(**inputs)) for model in (sdpa, eager)]
    assert_close_to_scale(outs[0], outs[1], FORWARD, "output")
    for out in outs:
        out.pow(2).sum().backward()
    for (name, p_sdpa), p_eager in zip(sdpa.named_parameters(), eager.parameters()):
        assert_close_to_scale(p_sdpa.grad, p_eager.grad, GRADIENT, name)


# -------------------------------------------------------------------------------------- RBF feedforward


@pytest.mark.parametrize("rbf_width", ["layer", "center"])
@pytest.mark.parametrize("kernel", ["normalized", "gaussian"])
def test_feedforward_equals_its_definition_float64(kernel, rbf_width):
    model = build(
        HyperBFModel, "image", feedforward_kernel=kernel, rbf_width=rbf_width, rbf_projection_dim=12
    )
    feedforward = model.layers[0].feedforward.double()
    with torch.no_grad():  # move centers / widths off their init so the check is generic
        feedforward.centers.mul_(0.5).add_(0.1)
        feedforward.log_sigma.add_(
            torch.linspace(-0.5, 0.5, feedforward.log_sigma.numel(), dtype=torch.float64)
        )
    x = torch.randn(2, 5, TINY.hidden, dtype=torch.float64)
    # Definition: d²_α(x) = ‖W(x − t_α)‖², w = softmax_α(−d²/(2σ²)) or exp(−d²/(2σ²)), out = Σ_α w_α c_α + b.
    diff = x[:, :, None, :] - feedforward.centers[None, None]  # (B, N, K, D): fine at this size
    sq_dist = (diff @ feedforward.metric.t()).pow(2).sum(-1)
    logits = -sq_dist / (2 * feedforward.log_sigma.exp() ** 2)
    weights = torch.softmax(logits, -1) if kernel == "normalized" else torch.exp(logits)
    expected = weights @ feedforward.values.weight.t() + feedforward.values.bias
    out, got_weights = feedforward(x, output_center_weights=True)
    # the logits are 12-long sums of squares of their largest size; exp / softmax turn their absolute rounding δ
    # into a relative one of at most 2δ on each weight (≤ 1); the output sums the centers' values with them
    weight_rounding = rounding(torch.float64, 32, logits.abs().max().item())
    value_sum = feedforward.values.weight.abs().sum(-1).max().item()  # Σ_α |c_α| per output channel
    output_rounding = 2 * weight_rounding * value_sum + rounding(
        torch.float64, 64, expected.abs().max().item()
    )
    torch.testing.assert_close(got_weights, weights, atol=weight_rounding, rtol=0, msg=labelled("weights"))
    torch.testing.assert_close(out, expected, atol=output_rounding, rtol=0, msg=labelled("output"))
    # The default (sdpa) path: the normalized kernel as bias-folded attention, no weights returned.
    out, got_weights = feedforward(x)
    assert (got_weights is None) == (kernel == "normalized")
    torch.testing.assert_close(
        out, expected, atol=output_rounding, rtol=0, msg=labelled("default path output")
    )


def test_normalized_feedforward_weights_do_not_cancel_at_large_input_norms():
    """With one σ the softmax drops ‖Wx‖² (the same for every center), so float32 weights keep their accuracy when
    ‖Wx‖² dwarfs the distances between centers; the full distance ‖Wx‖² − 2Wx·Wt + ‖Wt‖² loses it to cancellation."""
    model = build(HyperBFModel, "image", rbf_projection_dim=12)
    feedforward = model.layers[0].feedforward.eval()
    generator = torch.Generator().manual_seed(0)
    x = 300 * torch.randn(2, 5, TINY.hidden, generator=generator)  # ‖Wx‖² of order 1e5–1e6
    with torch.no_grad():
        feedforward.log_sigma.fill_(math.log(30.0))  # σ large enough that the weights are not one-hot
        got = feedforward.center_weights(x)
        reference = copy.deepcopy(feedforward).double().center_weights(x.double())
    error = (got.double() - reference).abs().max().item()
    # weights up to ~0.3 here: a few float32 eps (1.2e-7) of them without cancellation; with it, ~6e-6
    assert error < 8 * torch.finfo(torch.float32).eps, f"max weight error {error:.3g} against float64"


def test_gaussian_rbf_weights_are_at_most_one_also_at_the_centers():
    """exp(−d²/(2σ²)) <= 1: at a center the distance ‖Wx‖² − 2Wx·Wt + ‖Wt‖² is a cancellation that rounding can
    leave below 0, and narrow kernels (1/(2σ²) ~ 200 here) would turn that into a weight far above 1."""
    feedforward = build(HyperBFModel, "image", feedforward_kernel="gaussian").layers[0].feedforward.eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in (feedforward.centers, feedforward.metric):
            parameter.copy_(3 * torch.randn(parameter.shape, generator=generator))
        feedforward.log_sigma.fill_(-3.0)
        at_centers = feedforward.centers[None].repeat(4, 1, 1)  # every input at a center
        weights = feedforward.center_weights(at_centers)
    # exact: exp of a logit <= 0 is <= 1 in any dtype, so no rounding allowance
    assert weights.max().item() <= 1.0, f"largest weight {weights.max().item():.6g} > 1"


class _LargestTensor(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.numel = max(self.numel, tensor.numel())
        return out


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_feedforward_never_materialises_batch_tokens_centers_width(attn_implementation):
    model = build(HyperBFModel, "image", num_centers=64, rbf_projection_dim=32)
    model.set_attn_implementation(attn_implementation)
    feedforward = model.layers[0].feedforward
    x = torch.randn(2, 5, TINY.hidden)
    with _LargestTensor() as probe:
        feedforward(x)
    full = 2 * 5 * 64 * TINY.hidden
    assert probe.numel < full / 4, f"largest intermediate has {probe.numel} elements (B·N·K·D = {full})"


# ------------------------------------------------------------------------------------- images, sequences


def test_interpolate_pos_encoding_handles_other_resolutions():
    model = build(HyperBFForImageClassification, "image", image_size=[8, 6])  # non-square grid 4×3
    pixels = torch.randn(2, 3, 12, 10)
    outputs = model(pixel_values=pixels, interpolate_pos_encoding=True, output_hidden_states=True)
    assert outputs.hidden_states[0].shape == (2, 6 * 5 + 1, TINY.hidden)
    native = torch.randn(2, 3, 8, 6)
    torch.testing.assert_close(
        model(pixel_values=native, interpolate_pos_encoding=True).logits, model(pixel_values=native).logits
    )
    table = model.hyperbf.embeddings.interpolate_pos_encoding(12, 10)
    expected = F.interpolate(
        model.hyperbf.embeddings.position_embeddings[:, 1:].reshape(1, 4, 3, -1).permute(0, 3, 1, 2),
        size=(6, 5),
        mode="bicubic",
        align_corners=False,
    )
    torch.testing.assert_close(table[:, 1:], expected.permute(0, 2, 3, 1).reshape(1, 30, -1))


def test_mean_pooling_of_an_image_skips_the_cls_token():
    """`pooling="mean"` averages the patch tokens only (as Hyper-SET, timm and ViT): the CLS token is no patch."""
    model = build(HyperBFModel, "image", pooling="mean")
    pixels = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        outputs = model(pixel_values=pixels)
    patches = outputs.last_hidden_state[:, 1:].mean(1)
    # the same float32 mean, summed in another order: a few ulps of the LayerNorm'd (O(1)) values
    torch.testing.assert_close(
        outputs.pooler_output, patches, atol=rounding(torch.float32, 8), rtol=0, msg=labelled("pooler output")
    )
    with_cls = outputs.last_hidden_state.mean(1)
    assert (outputs.pooler_output - with_cls).abs().max() > 1e-3, "the CLS token entered the mean"
    assert model.embeddings.num_prefix_tokens == 1  # the attribute's name and meaning as in Hyper-SET


@pytest.mark.parametrize(
    "pixels, interpolate, message",
    [
        (torch.randn(2, 3, 12, 12), False, "interpolate_pos_encoding=True"),
        (torch.randn(2, 3, 9, 9), True, "multiple of patch_size"),
        (torch.randn(3, 8, 8), False, "shape"),
        (None, False, "pixel_values"),
    ],
)
def test_invalid_image_inputs_raise_value_error(pixels, interpolate, message):
    # (wrong channel count and image size without interpolation, for every family: tests/test_common.py)
    model = build(HyperBFForImageClassification, "image")
    with pytest.raises(ValueError, match=message):
        model(pixel_values=pixels, interpolate_pos_encoding=interpolate)


# (bad input_ids, inputs_embeds, resize_token_embeddings: tests/test_common.py)


# ------------------------------------------------------------------------------ training-related checks


# (gradient checkpointing = plain backprop, both kernels: tests/test_common.py)


@pytest.mark.parametrize("kernel", ["normalized", "gaussian"])
def test_fits_a_small_batch(kernel):
    model = build(HyperBFForImageClassification, "image", feedforward_kernel=kernel).train()
    inputs = {"pixel_values": torch.randn(8, 3, 8, 8), "labels": torch.arange(8) % TINY.labels}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        loss = model(**inputs).loss
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1 * first, f"loss {first:.3f} -> {loss.item():.3f}"


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["normalized"])
def test_trainer_learns_digits_with_the_digits_preset(kernel, tmp_path, request):
    # The long variant of test_fits_a_small_batch: UCI digits (bundled with scikit-learn), stratified 80/20
    # split with seed 0, `transformers.Trainer`, 20 epochs (~1-2 min on 2 CPU cores).
    import numpy as np
    from datasets import Dataset
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from transformers import Trainer, TrainingArguments

    threads = torch.get_num_threads()  # put back afterwards: the rest of the suite runs with its own count
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    torch.set_num_threads(2)
    images, labels = load_digits(return_X_y=True)
    images = (images.reshape(-1, 1, 8, 8) / 8.0 - 1.0).astype(np.float32)  # 0..16 -> -1..1
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, stratify=labels, random_state=0
    )
    train = Dataset.from_dict({"pixel_values": x_train, "labels": y_train}).with_format("torch")
    torch.manual_seed(0)
    model = HyperBFForImageClassification(HyperBFConfig.from_preset("digits", feedforward_kernel=kernel))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=64,
        num_train_epochs=20,
        learning_rate=3e-3,
        weight_decay=0.05,
        warmup_steps=20,
        lr_scheduler_type="cosine",
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        seed=0,
    )
    Trainer(model=model, args=args, train_dataset=train).train()
    with torch.no_grad():
        logits = model.eval()(pixel_values=torch.from_numpy(x_test)).logits
    accuracy = (logits.argmax(-1).numpy() == y_test).mean()
    assert accuracy >= 0.95, accuracy


def test_default_num_centers_keeps_parameters_within_15_percent_of_vit():
    from transformers import ViTConfig, ViTForImageClassification

    config = HyperBFConfig.from_preset("cifar")
    vit_config = ViTConfig(
        hidden_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=4 * 768,
        image_size=32,
        patch_size=4,
        num_labels=10,
    )
    with torch.device("meta"):  # counts only; no memory, no init work
        hyperbf = sum(p.numel() for p in HyperBFForImageClassification(config).parameters())
        vit = sum(p.numel() for p in ViTForImageClassification(vit_config).parameters())
    assert abs(hyperbf / vit - 1) <= 0.15, (hyperbf, vit)


# ------------------------------------------------------------------------------------------ initialisation
# (save/load round trips, cross-head loading, Auto classes, return_dict=False, padding invariance, heads
# rejecting the wrong input_type and recorded logits are checked for every head of every family in
# tests/test_common.py)


def test_attention_temperature_initialisation_matches_dot_product_scale():
    model = build(HyperBFModel, "image")
    tau = model.layers[0].attention.log_temperature.exp()
    torch.testing.assert_close(2 * tau, torch.full_like(tau, 1 / math.sqrt(TINY.hidden // 2)))
    custom = build(HyperBFModel, "image", attention_temperature_init=0.25, rbf_sigma_init=2.0)
    torch.testing.assert_close(custom.layers[1].attention.log_temperature.exp(), torch.full((2,), 0.25))
    torch.testing.assert_close(custom.layers[1].feedforward.log_sigma.exp(), torch.tensor([2.0]))
