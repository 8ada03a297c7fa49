"""HyperBF on flash kernels (docs/hyperbf.md): each unit is attention with a per-key bias.

Both HyperBF units are attention with a per-key bias: the Gaussian attention (bias −τ‖k‖²) and the normalized
RBF feedforward (cross-attention from Wx to the projected centers Wt_α, values c_α, bias −‖Wt_α‖²/2σ²). `eager`
is the reference (explicit scores, additive mask, the only path that returns maps and center weights); every
other `attn_implementation` folds the bias into one extra head dimension and calls mask-free attention. These
tests hold every other implementation to the eager result on every head (padding included), check that no mask
and no (B, H, N, N) / (B·N, K) tensor is built, that the centers are cached only inside `cached_centers` and
the cache follows the parameters there, and that the feedforward folds only where its folded head fits the fused
CUDA kernels (256).
"""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from fixtures import Case, assert_close_to_scale, assert_differs, labelled, main_output, perturb, rounding
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import AutoModel, AutoModelForImageClassification

from energyformers import HyperBFConfig
from energyformers.modeling.modeling_hyperbf import (
    HyperBFFeedForward,
    HyperBFForImageClassification,
    HyperBFForSequenceClassification,
    HyperBFModel,
)

# Every attention implementation HyperBF accepts besides the `eager` reference.
IMPLEMENTATIONS = ["sdpa"]
CASES = [Case.of(HyperBFModel, "image"), Case.of(HyperBFModel, "sequence")]
CASES += [Case.of(HyperBFForImageClassification), Case.of(HyperBFForSequenceClassification)]
# The feedforward variants: one width per layer (‖Wx‖² cancels), one per center (it needs a second folded
# column), and the Gaussian kernel (stays explicit, so only the attention unit is folded).
FEEDFORWARDS = [
    dict(),
    dict(rbf_width="center"),
    dict(feedforward_kernel="gaussian"),
]
# CPU always; CUDA where there is one (there the folded path runs on the fused SDPA kernels).
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
# (forward, gradient) bounds per unit of the compared tensor's largest magnitude (`assert_close_to_scale`): the
# folded path sums the same terms in another order, so its rounding grows with the largest term. Forward: two
# layers, each a softmax-weighted sum over at most 40 keys of 16-long dot products and the RBF sum over the
# centers, 64 roundings in all. Gradients add the backward sums over every token, head and batch row: 1024.
TOLERANCES = {dtype: (rounding(dtype, 64), rounding(dtype, 1024)) for dtype in (torch.float32, torch.float64)}


def pair(case: Case, implementation: str, dtype: torch.dtype = torch.float32, **overrides):
    """(model with `implementation`, the same weights with `eager`), perturbed off the initial values."""
    model = perturb(case.build(**overrides)).to(dtype)
    with torch.no_grad():  # distinct widths per center / head, so a mixed-up column or head is seen
        for layer in model.base_model.layers:
            sigma = layer.feedforward.log_sigma
            sigma.add_(torch.linspace(-0.3, 0.3, sigma.numel(), dtype=dtype))
            layer.attention.log_temperature.add_(torch.linspace(-0.5, 0.5, model.config.num_attention_heads))
    model.set_attn_implementation(implementation)
    reference = copy.deepcopy(model)
    reference.set_attn_implementation("eager")
    assert model.config._attn_implementation == implementation
    assert reference.config._attn_implementation == "eager"
    return model, reference


def padded_inputs(case: Case, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    inputs = case.inputs(labels=not case.is_base)
    if case.input_type == "sequence":
        inputs["attention_mask"][1, 5:] = 0  # a long padded tail in the second row too
    else:
        inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
    return inputs


def run(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    output = main_output(model(**inputs))
    output.pow(2).sum().backward()
    return output.detach()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(
    "feedforward", FEEDFORWARDS, ids=lambda o: "-".join(map(str, o.values())) or "default"
)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_every_head_gives_the_eager_outputs_and_gradients(case, implementation, feedforward, dtype, device):
    model, reference = (m.to(device) for m in pair(case, implementation, dtype, **feedforward))
    inputs = {key: value.to(device) for key, value in padded_inputs(case, dtype).items()}
    forward_tol, gradient_tol = TOLERANCES[dtype]
    for m in (model, reference):
        m.train()  # the training path: no cached centers, autograd through the attention kernels
    got, expected = run(model, inputs), run(reference, inputs)
    assert_close_to_scale(got, expected, forward_tol, "output")
    for (name, parameter), reference_parameter in zip(model.named_parameters(), reference.parameters()):
        assert_close_to_scale(parameter.grad, reference_parameter.grad, gradient_tol, name)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("seq_len", [1, 17, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_attention_unit_matches_eager_with_padding(implementation, seq_len, dtype):
    model, reference = pair(Case.of(HyperBFModel, "image"), implementation, dtype)
    units = [m.layers[0].attention for m in (model, reference)]
    generator = torch.Generator().manual_seed(seq_len)
    shape = (3, model.config.num_attention_heads, seq_len, model.config.head_dim)
    base = [2 * torch.randn(shape, generator=generator, dtype=dtype) for _ in range(3)]
    mask = torch.ones(3, seq_len, dtype=torch.bool)
    start = seq_len // 2 + 1  # row 1 padded from here (N = 1: no padding); rows 0 and 2 full
    mask[1, start:] = False
    results = []
    for unit in units:
        tensors = [t.clone().requires_grad_() for t in base]
        output, weights = unit.attend(*tensors, keep=mask)
        output.pow(2).sum().backward()
        results.append((output, weights, [t.grad for t in tensors], unit.log_temperature.grad))
    (got, none, got_grads, got_tau), (expected, maps, grads, tau) = results
    assert none is None and maps is not None  # different code: only the reference builds the maps
    forward_tol, gradient_tol = TOLERANCES[dtype]
    assert_close_to_scale(got, expected, forward_tol, "output")
    for name, a, b in zip("qkv", got_grads, grads):
        assert_close_to_scale(a, b, gradient_tol, f"d/d{name}")
    # dL/dlog τ sums terms as large as the loss (at N = 1, one key, softmax ≡ 1, it is exactly 0 and the folded path
    # leaves roundoff of the loss's size), so its rounding is taken relative to the loss: 64 roundings, the forward
    # count, of a term of the loss's size.
    loss = float(expected.detach().pow(2).sum())
    tau_atol = rounding(dtype, 64, loss)
    torch.testing.assert_close(
        got_tau, tau, atol=tau_atol, rtol=0, msg=labelled(f"d/dlog τ (loss {loss:.4g})")
    )
    assert (maps[1, :, :, start:] == 0).all()  # the reference gives padded keys zero weight
    assert (got_grads[1][1, :, start:] == 0).all()  # so does the folded path: no gradient reaches them


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_bfloat16_error_is_no_worse_than_eager(implementation, device):
    case = Case.of(HyperBFForSequenceClassification)
    model, reference = (m.to(device) for m in pair(case, implementation))
    inputs = {key: value.to(device) for key, value in padded_inputs(case, torch.float32).items()}
    with torch.no_grad():
        exact = main_output(reference(**inputs))
        errors = {
            name: (main_output(m.to(torch.bfloat16)(**inputs)).float() - exact).abs().max().item()
            for name, m in (("folded", model), ("eager", reference))
        }
    # not a rounding bound: the folded path may be up to twice as far off as eager, and 1e-3 (an eighth of a bfloat16
    # ulp at 1) is a floor, so an eager error near 0 does not demand an exact folded path
    assert errors["folded"] <= 2 * errors["eager"] + 1e-3, errors


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_fully_padded_row_stays_finite(implementation):
    case = Case.of(HyperBFForSequenceClassification)
    model, _ = pair(case, implementation, pooling="mean")
    inputs = case.inputs(labels=True)
    inputs["attention_mask"][1] = 0  # a row with no real token: its queries see only padded keys
    model.train()
    outputs = model(**inputs)
    outputs.loss.backward()
    assert torch.isfinite(outputs.logits).all(), outputs.logits
    nonfinite = {
        name: int((~torch.isfinite(p.grad)).sum())
        for name, p in model.named_parameters()
        if not p.grad.isfinite().all()
    }
    assert not nonfinite, f"parameters with non-finite gradient entries (count): {nonfinite}"


# ------------------------------------------------------------------- no mask, no scores, flash kernels


class _Probe(TorchDispatchMode):
    """The aten ops that run and the largest tensor any of them returns (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(str(func.overloadpacket))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.numel = max(self.numel, tensor.numel())
        return out


def _probe_forward_backward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> _Probe:
    with _Probe() as probe:
        main_output(model(**inputs)).pow(2).sum().backward()
    return probe


@pytest.mark.parametrize("rbf_width", ["layer", "center"])
def test_sdpa_path_builds_no_mask_and_no_score_tensor(rbf_width):
    # 16×16 images in 2×2 patches: N = 65 tokens, so one (B, H, N, N) score tensor or the (B·N, K) center
    # weights outgrow every activation and weight of the model.
    case = Case.of(HyperBFModel, "image")
    model, reference = pair(case, "sdpa", image_size=16, rbf_width=rbf_width)
    config = model.config
    inputs = {"pixel_values": torch.randn(2, 3, 16, 16)}
    batch, tokens = 2, 65
    scores = batch * config.num_attention_heads * tokens * tokens  # (B, H, N, N)
    center_weights = batch * tokens * config.num_centers  # (B·N, K)

    calls = []
    original = F.scaled_dot_product_attention

    def recording(query, key, value, attn_mask=None, *args, **kwargs):
        calls.append((query.shape, key.shape, value.shape, attn_mask))
        return original(query, key, value, attn_mask, *args, **kwargs)

    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", recording):
        probe = _probe_forward_backward(model, inputs)
    assert len(calls) == 2 * config.num_hidden_layers  # the attention unit and the feedforward of each layer
    for query_shape, key_shape, value_shape, attn_mask in calls:
        assert attn_mask is None
        assert query_shape[-1] == key_shape[-1] == value_shape[-1] and query_shape[-1] % 8 == 0
    # The CPU flash kernel ran, forward and backward; nothing as large as the scores was built.
    assert {
        "aten._scaled_dot_product_flash_attention_for_cpu",
        "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    } <= probe.ops
    assert probe.numel < min(scores, center_weights) / 2, (probe.numel, scores, center_weights)
    # The probe does see them on the reference path, so the bound above is a real one.
    assert _probe_forward_backward(reference, inputs).numel >= min(scores, center_weights)


# ------------------------------------------------------------- which feedforward path `sdpa` takes


def _round_up_8(width: int) -> int:
    return -(-width // 8) * 8


def _recorded_paths(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor]
) -> tuple[list[int], int, torch.Tensor]:
    """(head width of every SDPA call, explicit center-weight computations, output) of one training step."""
    widths = []
    original = F.scaled_dot_product_attention

    def recording(query, key, value, attn_mask=None, *args, **kwargs):
        widths.append(query.shape[-1])
        return original(query, key, value, attn_mask, *args, **kwargs)

    explicit = mock.patch.object(
        HyperBFFeedForward, "center_weights", autospec=True, side_effect=HyperBFFeedForward.center_weights
    )
    model.train()
    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", recording), explicit as spy:
        output = run(model, inputs)
    return widths, spy.call_count, output


# (preset, overrides, folded feedforward head width or None): the memo's D = 768 gives a folded width of
# 776 > 256, past the fused CUDA kernels, so the feedforward must stay explicit; `digits` (D = 64) folds at 72.
PRESET_PATHS = [
    ("cifar", dict(num_hidden_layers=1, image_size=8), None),
    ("digits", {}, 72),
]


@pytest.mark.parametrize(
    "preset, overrides, feedforward_width", PRESET_PATHS, ids=[p[0] for p in PRESET_PATHS]
)
def test_sdpa_folds_the_feedforward_only_at_widths_the_fused_kernels_take(
    preset, overrides, feedforward_width
):
    config = HyperBFConfig.from_preset(preset, **overrides)
    torch.manual_seed(0)
    model = HyperBFForImageClassification(config)
    assert model.config._attn_implementation == "sdpa"  # the default is what is checked
    reference = copy.deepcopy(model)
    reference.set_attn_implementation("eager")
    side = config.image_size
    inputs = {
        "pixel_values": torch.randn(
            2, config.num_channels, side, side, generator=torch.Generator().manual_seed(0)
        )
    }
    widths, explicit_calls, got = _recorded_paths(model, inputs)
    layers = config.num_hidden_layers
    attention_width = _round_up_8(config.head_dim + 1)  # the attention unit folds at every preset width
    if feedforward_width is None:
        expected_widths, expected_explicit = [attention_width] * layers, layers
    else:
        expected_widths, expected_explicit = [attention_width, feedforward_width] * layers, 0
    assert widths == expected_widths, f"SDPA head widths {widths}, expected {expected_widths}"
    assert explicit_calls == expected_explicit, (
        f"explicit feedforward ran {explicit_calls}×, expected {expected_explicit}"
    )
    assert_close_to_scale(got, run(reference, inputs), TOLERANCES[torch.float32][0], "output")


# (hidden_size, rbf_projection_dim, rbf_width, folded width): the folded head is max(R + 1, D) (R + 2 with
# per-center widths) rounded up to 8; it folds up to and including 256.
BOUNDARY = [
    (128, 255, "layer", 256),
    (128, 256, "layer", 264),
    (128, 254, "center", 256),
    (128, 255, "center", 264),
    (264, 16, "layer", 264),  # the values c_α (width D) are what is too wide
]


@pytest.mark.parametrize("hidden_size, rank, rbf_width, width", BOUNDARY, ids=lambda v: str(v))
def test_folded_feedforward_width_limit_is_inclusive(hidden_size, rank, rbf_width, width):
    case = Case.of(HyperBFModel, "image")
    model, reference = pair(
        case, "sdpa", hidden_size=hidden_size, rbf_projection_dim=rank, rbf_width=rbf_width
    )
    inputs = padded_inputs(case, torch.float32)
    widths, explicit_calls, got = _recorded_paths(model, inputs)
    folds = width <= 256
    layers = model.config.num_hidden_layers
    assert (width in widths) == folds, (
        f"SDPA head widths {widths}; a {width}-wide feedforward should fold: {folds}"
    )
    assert explicit_calls == (0 if folds else layers), (
        f"explicit feedforward ran {explicit_calls}× (folds: {folds})"
    )
    assert all(ff.folds == folds and ff.folded_width == width for ff in _feedforwards(model))
    reference.train()
    assert_close_to_scale(got, run(reference, inputs), TOLERANCES[torch.float32][0], "output")
    for (name, parameter), reference_parameter in zip(model.named_parameters(), reference.parameters()):
        assert_close_to_scale(parameter.grad, reference_parameter.grad, TOLERANCES[torch.float32][1], name)


# ------------------------------------------------------------------------- cached centers (eval mode)


def _feedforwards(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [layer.feedforward for layer in model.base_model.layers]


# the folded path (sdpa at the fixtures' width) caches its keys and values, the explicit one the projected centers
CACHES = pytest.mark.parametrize(("implementation", "cache"), [("sdpa", "folded"), ("eager", "projected")])


@CACHES
def test_centers_are_cached_only_inside_cached_centers_in_eval_inference(implementation, cache):
    case = Case.of(HyperBFForImageClassification)
    model, reference = pair(case, implementation)
    inputs = case.inputs()
    model.eval()
    with torch.no_grad():
        plain = main_output(model(**inputs))
    assert all(not ff._eval_cache for ff in _feedforwards(model))  # outside the block: nothing kept
    with model.cached_centers():
        with torch.no_grad():
            first = main_output(model(**inputs))
            cached = [ff._eval_cache[cache][1][0] for ff in _feedforwards(model)]
            second = main_output(model(**inputs))
        assert all(
            ff._eval_cache[cache][1][0] is keys for ff, keys in zip(_feedforwards(model), cached)
        )  # reused
        # With autograd on (eval-mode fine-tuning, saliency), the centers are recomputed so gradients reach them.
        main_output(model(**inputs)).sum().backward()
        assert all(
            ff.centers.grad is not None and ff.centers.grad.abs().sum() > 0 for ff in _feedforwards(model)
        )
    assert all(
        not ff._eval_cache and not ff.reuse_centers for ff in _feedforwards(model)
    )  # the block drops it
    torch.testing.assert_close(first, plain, atol=0, rtol=0)  # the same computation, once
    torch.testing.assert_close(second, first, atol=0, rtol=0)
    assert_close_to_scale(
        first, main_output(reference(**inputs)), TOLERANCES[torch.float32][0], "cached vs eager"
    )


@CACHES
@pytest.mark.parametrize("switch_to_train", [True, False], ids=["train-step-then-eval", "step-in-eval-mode"])
def test_cached_centers_follow_an_optimiser_step(switch_to_train, implementation, cache):
    case = Case.of(HyperBFForImageClassification)
    model, _ = pair(case, implementation)
    inputs = case.inputs(labels=True)
    model.eval()
    with model.cached_centers():
        with torch.no_grad():
            before = main_output(model(**inputs))  # fills the cache
        assert all(cache in ff._eval_cache for ff in _feedforwards(model))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        if switch_to_train:
            model.train()
        model(**inputs).loss.backward()
        optimizer.step()  # the parameter versions alone must invalidate the cache
        if switch_to_train:
            model.eval()
        with torch.no_grad():
            after = main_output(model(**inputs))
    with torch.no_grad():
        reference = copy.deepcopy(model)
        reference.set_attn_implementation("eager")
        expected = main_output(reference(**inputs))
    # a stale cache would give `before` again
    assert_differs(after, before, "output after the optimizer step", beyond_allclose=True)
    assert_close_to_scale(after, expected, TOLERANCES[torch.float32][0], "after the step vs eager")


@CACHES
def test_cached_centers_follow_load_state_dict(implementation, cache):
    case = Case.of(HyperBFForImageClassification)
    model, _ = pair(case, implementation)
    other, _ = pair(case, implementation)
    perturb(other, seed=7)
    inputs = case.inputs()
    with torch.no_grad(), model.cached_centers():
        model(**inputs)  # fills the cache
        assert all(cache in ff._eval_cache for ff in _feedforwards(model))
        model.load_state_dict(other.state_dict())
        torch.testing.assert_close(main_output(model(**inputs)), main_output(other(**inputs)), atol=0, rtol=0)


@CACHES
@pytest.mark.parametrize("write", ["no_grad", "detach"])
def test_cached_centers_follow_an_in_place_write(write, implementation, cache):
    """Inside `cached_centers`, a weight written in place with no optimiser step or `load_state_dict` (`w.mul_(2)`
    under `torch.no_grad()`, or through `w.detach()`) leaves the cache too: why its stamp reads the parameters'
    in-place versions."""
    case = Case.of(HyperBFForImageClassification)
    model, _ = pair(case, implementation)
    fresh, _ = pair(case, implementation)  # no cache: computes the centers of the weights it is given
    inputs = case.inputs()
    with torch.no_grad(), model.cached_centers():
        before = main_output(model(**inputs))  # fills the cache
        assert all(cache in ff._eval_cache for ff in _feedforwards(model))
        for ff in _feedforwards(model):
            if write == "no_grad":
                ff.centers.mul_(2.0)
            else:
                ff.centers.detach().mul_(2.0)
        after = main_output(model(**inputs))
        fresh.load_state_dict(model.state_dict())
        expected = main_output(fresh(**inputs))
    assert_differs(after, before, "output after the in-place write", beyond_allclose=True)  # stale: `before`
    torch.testing.assert_close(after, expected, atol=0, rtol=0)


# ------------------------------------------------------------------- choosing the implementation


def test_default_is_sdpa_and_a_choice_is_made_when_loading_not_saved(tmp_path):
    """As for transformers' own models (and Hyper-SET): config.json names no implementation; `attn_implementation=`
    at load time chooses one, otherwise the loading machine's default (sdpa) applies."""
    case = Case.of(HyperBFForImageClassification)
    model = case.build()
    assert model.config._attn_implementation == "sdpa"  # the best available path, on CPU and CUDA
    inputs = case.inputs()
    for implementation in ["eager", *IMPLEMENTATIONS]:
        model.set_attn_implementation(implementation)
        assert not any("attn" in key for key in model.config.to_dict()), model.config.to_dict().keys()
        model.save_pretrained(tmp_path / implementation)
        loaded = AutoModelForImageClassification.from_pretrained(tmp_path / implementation)
        assert loaded.config._attn_implementation == "sdpa"
        # the loaded model runs sdpa, the saved one `implementation`: two paths, the forward bound
        assert_close_to_scale(
            main_output(loaded(**inputs)),
            main_output(model(**inputs)),
            TOLERANCES[torch.float32][0],
            implementation,
        )
    chosen = HyperBFForImageClassification.from_pretrained(tmp_path / "sdpa", attn_implementation="eager")
    assert chosen.config._attn_implementation == "eager"
    from_config = AutoModel.from_config(case.config(), attn_implementation="eager")
    assert from_config.config._attn_implementation == "eager"


def test_unknown_implementations_are_rejected():
    case = Case.of(HyperBFForImageClassification)
    with pytest.raises(ValueError, match='attn_implementation="triton"'):
        HyperBFForImageClassification._from_config(case.config(), attn_implementation="triton")
    model = case.build()
    with pytest.raises(ValueError, match='attn_implementation="triton"'):
        model.set_attn_implementation("triton")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_maps_and_center_weights_come_from_the_reference_path(implementation):
    case = Case.of(HyperBFForSequenceClassification)
    model, reference = pair(case, implementation)
    inputs = padded_inputs(case, torch.float32)
    extra = dict(output_attentions=True, output_rbf_diagnostics=True)
    got, expected = model(**inputs, **extra), reference(**inputs, **extra)
    for a, b in zip(got.attentions, expected.attentions):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    torch.testing.assert_close(got.rbf_diagnostics.center_weights, expected.rbf_diagnostics.center_weights)
    # maps requested: the eager path ran; without them, the folded one
    assert_close_to_scale(
        got.logits, main_output(model(**inputs)), TOLERANCES[torch.float32][0], "logits with maps vs without"
    )


def test_folded_path_compiles_as_one_graph_in_eval_inference():
    torch._dynamo.reset()
    case = Case.of(HyperBFForImageClassification)
    model, reference = pair(case, "sdpa")
    inputs = case.inputs()
    compiled = torch.compile(model, fullgraph=True, backend="eager")  # the cache must not break the graph
    with torch.no_grad():
        assert_close_to_scale(
            main_output(compiled(**inputs)),
            main_output(reference(**inputs)),
            TOLERANCES[torch.float32][0],
            "compiled",
        )
