"""The looped-Transformer baseline (docs/hyperset.md): one weight-tied pre-norm layer iterated T times
between Hyper-SET's embeddings and head, registered with the Auto classes but not exported (not in FAMILIES)."""

from __future__ import annotations

import pytest
import torch
import transformers
from fixtures import assert_close_to_scale, hyperset_config, looped_transformer_config, perturb, rounding

from energyformers import (
    BASELINES,
    FAMILIES,
    HyperSetConfig,
    HyperSetForImageClassification,
    LoopedTransformerConfig,
    LoopedTransformerForImageClassification,
    LoopedTransformerForSequenceClassification,
    LoopedTransformerForTokenClassification,
    LoopedTransformerModel,
)
from energyformers.training.setup import enable_activation_checkpointing

BATCH, LENGTH, LABELS, WIDTH = 3, 7, 4, 16
# Two orders of the same float32 forward (eager vs SDPA attention, padded vs unpadded), per unit of the output's
# largest magnitude: 2 layers × 3 iterations = 6 blocks, each rounding its largest values about 10 times (a 4-long
# dot product, the softmax, the sum over the tokens, the feedforward's sums): 64 roundings.
FORWARD = rounding(torch.float32, 64)


def build(model_class, input_type: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return perturb(model_class(looped_transformer_config(input_type, **overrides))).eval()


def images(seed: int = 0) -> torch.Tensor:
    return torch.randn(BATCH, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 20, (BATCH, LENGTH), generator=torch.Generator().manual_seed(seed))


HEADS = [
    (LoopedTransformerModel, "image"),
    (LoopedTransformerModel, "sequence"),
    (LoopedTransformerForImageClassification, "image"),
    (LoopedTransformerForSequenceClassification, "sequence"),
    (LoopedTransformerForTokenClassification, "sequence"),
]


@pytest.mark.parametrize(("model_class", "input_type"), HEADS, ids=lambda v: getattr(v, "__name__", v))
def test_forward_shapes_states_and_maps(model_class, input_type):
    model = build(model_class, input_type)
    if input_type == "image":
        inputs, tokens_per_sample = {"pixel_values": images()}, 1 + 16
    else:
        inputs, tokens_per_sample = (
            {"input_ids": tokens(), "attention_mask": torch.ones(BATCH, LENGTH, dtype=torch.long)},
            LENGTH,
        )
    out = model(**inputs, output_hidden_states=True, output_attentions=True)
    layers, iterations = 2, 3
    assert len(out.hidden_states) == 1 + layers * iterations
    assert len(out.attentions) == layers * iterations
    assert out.attentions[0].shape == (BATCH, 4, tokens_per_sample, tokens_per_sample)
    if model_class is LoopedTransformerModel:
        assert out.last_hidden_state.shape == (BATCH, tokens_per_sample, WIDTH)
        assert out.pooler_output.shape == (BATCH, WIDTH)
    elif model_class is LoopedTransformerForTokenClassification:
        assert out.logits.shape == (BATCH, LENGTH, LABELS)
    else:
        assert out.logits.shape == (BATCH, LABELS)
    # the maps are the softmax actually applied: the SDPA path (no maps) gives the same result
    plain = model(**inputs, return_dict=False)[0]
    assert_close_to_scale(plain, out[0], FORWARD, "sdpa vs eager (maps)")
    assert torch.isfinite(plain).all()


def test_heads_compute_a_loss_and_reject_the_other_input_type():
    model = build(LoopedTransformerForTokenClassification, "sequence")
    labels = torch.randint(0, LABELS, (BATCH, LENGTH))
    assert model(input_ids=tokens(), labels=labels).loss.ndim == 0
    with pytest.raises(ValueError, match="input_type"):
        LoopedTransformerForImageClassification(looped_transformer_config("sequence"))
    assert isinstance(
        build(LoopedTransformerForImageClassification, "image", num_labels=0).classifier, torch.nn.Identity
    )


def test_weights_are_tied_across_iterations():
    def count(model):
        return sum(p.numel() for p in model.parameters())

    shallow = LoopedTransformerForImageClassification(looped_transformer_config("image", num_iterations=1))
    deep = LoopedTransformerForImageClassification(looped_transformer_config("image", num_iterations=7))
    assert count(shallow) == count(deep)
    # every iteration of layer l applies the same module: state t + 1 = layers[l](state t)
    model = build(LoopedTransformerModel, "image")
    states = model(pixel_values=images(), output_hidden_states=True).hidden_states
    with torch.no_grad():
        for step in range(len(states) - 1):
            layer = model.layers[step // 3]
            # one layer on the same input, the model's own call of it in another autograd mode: a layer's roundings
            # (a 16-long dot product, a 17-token sum, a 16-wide feedforward)
            got = layer(states[step])[0]
            assert_close_to_scale(got, states[step + 1], rounding(torch.float32, 64), f"step {step}")


def test_per_call_depth_and_random_depth_in_training():
    model = build(
        LoopedTransformerModel, "image", iteration_sampling="uniform", min_iterations=1, max_iterations=5
    )
    assert len(model(pixel_values=images(), num_iterations=6, output_hidden_states=True).hidden_states) == 13
    model.train()
    depths = {
        len(model(pixel_values=images(), output_hidden_states=True).hidden_states) // 2 for _ in range(8)
    }
    assert model.iteration_draws == 8 and len(depths) > 1 and depths <= set(range(1, 6))
    with pytest.raises(ValueError, match="num_iterations"):
        model(pixel_values=images(), num_iterations=0)


def test_interpolate_pos_encoding_takes_images_of_another_resolution():
    """Hyper-SET's embeddings, so ViT's `interpolate_pos_encoding`: 16×16 images into the 8×8 model."""
    model = build(LoopedTransformerForImageClassification, "image")
    large = torch.randn(BATCH, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        outputs = model(pixel_values=large, interpolate_pos_encoding=True, output_hidden_states=True)
        plain = model(pixel_values=images()).logits
        flagged = model(pixel_values=images(), interpolate_pos_encoding=True).logits
    assert outputs.logits.shape == (BATCH, LABELS)
    assert outputs.hidden_states[0].shape == (BATCH, 1 + 8 * 8, WIDTH)
    assert torch.equal(plain, flagged), f"max difference {(plain - flagged).abs().max().item():.3g}"
    with pytest.raises(ValueError, match="interpolate_pos_encoding=True"):
        model(pixel_values=large)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_appending_padding_does_not_change_the_logits(pooling):
    model = build(LoopedTransformerForSequenceClassification, "sequence", pooling=pooling)
    ids = tokens()
    mask = torch.ones_like(ids)
    mask[0, 4:] = 0  # sample 0 is already padded
    padded_ids = torch.cat([ids, torch.zeros(BATCH, 5, dtype=ids.dtype)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(BATCH, 5, dtype=mask.dtype)], dim=1)
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask).logits
        extended = model(input_ids=padded_ids, attention_mask=padded_mask).logits
        alone = model(input_ids=ids[:1, :4]).logits  # the padded sample without its padding
        maps = model(input_ids=padded_ids, attention_mask=padded_mask, output_attentions=True).attentions
    assert_close_to_scale(extended, reference, FORWARD, "extended padding")
    assert_close_to_scale(alone, reference[:1], FORWARD, "alone, unpadded")
    # no padded key read: sample 0's attention to its padded keys (positions 4..) is exactly 0 in every layer
    read = [p[0, ..., 4:].abs().max().item() for p in maps]
    assert read == [0.0] * len(maps), f"largest attention to sample 0's padded keys, per layer: {read}"


def test_attention_maps_under_autocast_have_the_query_dtype_with_and_without_padding():
    """The maps of the eager attention (HyperBF's, shared) are in the dtype of the attention inputs, as transformers'
    eager functions return them: under autocast the queries are bfloat16 and the padding bias float32, which must
    not turn the padded batch's maps (and only them) into float32."""
    model = build(LoopedTransformerForSequenceClassification, "sequence")
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[0, 4:] = 0
    dtypes = {}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for name, attention_mask in (("padded", mask), ("unpadded", None)):
            maps = model(input_ids=tokens(), attention_mask=attention_mask, output_attentions=True).attentions
            dtypes[name] = {p.dtype for p in maps}
    assert dtypes == {"padded": {torch.bfloat16}, "unpadded": {torch.bfloat16}}, dtypes


def test_gradient_checkpointing_equals_plain_backprop():
    def gradients(checkpointing: bool) -> dict[str, torch.Tensor]:
        model = build(LoopedTransformerForImageClassification, "image").train()
        if checkpointing:
            enable_activation_checkpointing(model)
        model(pixel_values=images(), labels=torch.tensor([0, 1, 2])).loss.backward()
        return {name: p.grad for name, p in model.named_parameters()}

    plain, checkpointed = gradients(False), gradients(True)
    missing = [name for name, grad in plain.items() if grad is None]
    assert not missing, f"parameters without a gradient: {missing}"
    for name, grad in plain.items():
        torch.testing.assert_close(
            checkpointed[name], grad, atol=0, rtol=0, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_truncated_backprop_leaves_the_embeddings_without_gradient():
    model = build(LoopedTransformerForSequenceClassification, "sequence").train()
    labels = torch.tensor([0, 1, 2])
    model(input_ids=tokens(), labels=labels, backprop_iterations=2).loss.backward()
    backbone = model.looped_transformer

    def with_gradient(module: torch.nn.Module) -> dict[str, bool]:
        return {name: p.grad is not None for name, p in module.named_parameters()}

    embeddings, first, last = (
        with_gradient(m) for m in (backbone.embeddings, backbone.layers[0], backbone.layers[-1])
    )
    assert not any(embeddings.values()), f"embeddings, has a gradient per parameter: {embeddings}"
    # the last layer's last k iterations are differentiated; the frozen iterations in front of them cut the
    # graph, so (as in Hyper-SET) nothing upstream of them — earlier layers, embeddings — gets a gradient
    assert all(last.values()), f"last layer, has a gradient per parameter: {last}"
    assert not any(first.values()), f"first layer, has a gradient per parameter: {first}"
    model.zero_grad(set_to_none=True)
    model(input_ids=tokens(), labels=labels).loss.backward()  # full backprop reaches them
    assert backbone.embeddings.word_embeddings.weight.grad is not None


@pytest.mark.parametrize(
    ("auto_class", "model_class", "input_type"),
    [
        ("AutoModelForImageClassification", LoopedTransformerForImageClassification, "image"),
        ("AutoModelForTokenClassification", LoopedTransformerForTokenClassification, "sequence"),
        ("AutoModel", LoopedTransformerModel, "sequence"),
    ],
)
def test_save_and_reload_through_the_auto_classes(tmp_path, auto_class, model_class, input_type):
    model = build(model_class, input_type)
    model.save_pretrained(tmp_path)
    reloaded = getattr(transformers, auto_class).from_pretrained(tmp_path).eval()
    assert type(reloaded) is model_class and type(reloaded.config) is LoopedTransformerConfig
    inputs = {"pixel_values": images()} if input_type == "image" else {"input_ids": tokens()}
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs)[0], model(**inputs)[0])
    assert "qkv_norm" not in (tmp_path / "config.json").read_text()


def test_registered_as_a_baseline_not_as_an_exported_family():
    assert "looped-transformer" in BASELINES and "looped-transformer" not in FAMILIES
    assert transformers.AutoConfig.for_model("looped-transformer").__class__ is LoopedTransformerConfig


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        (dict(hidden_size=0), "hidden_size"),
        (dict(intermediate_size=-1), "intermediate_size"),
        (dict(num_attention_heads=5), "hidden_size"),
        (dict(num_iterations=0), "num_iterations"),
        (dict(backprop_iterations=13), "backprop_iterations"),
        (dict(hidden_act="swish"), "hidden_act"),
        (dict(iteration_sampling="geometric"), "iteration_sampling"),
        (dict(qkv_norm="shared"), "qkv_norm"),  # Hyper-SET-only options are refused, not ignored
        (dict(halting_tolerance=0.01), "halting_tolerance"),
    ],
)
def test_bad_config_raises_naming_the_argument(overrides, name):
    with pytest.raises(ValueError, match=rf"LoopedTransformerConfig: invalid {name}="):
        LoopedTransformerConfig(**overrides)


def test_from_hyperset_matches_width_depth_labels_and_defaults_the_mlp_to_4d():
    source = HyperSetConfig.from_preset("sudoku", id2label={i: str(i + 1) for i in range(9)})
    config = LoopedTransformerConfig.from_hyperset(source)
    shared = ("input_type", "hidden_size", "num_attention_heads", "num_iterations", "vocab_size")
    assert all(getattr(config, name) == getattr(source, name) for name in shared)
    assert config.position_embedding_type == "learned" and config.id2label == source.id2label
    assert config.intermediate_size == 4 * config.hidden_size and config.hidden_act == "gelu"
    assert LoopedTransformerConfig(hidden_size=32, num_attention_heads=2).intermediate_size == 128
    assert (
        LoopedTransformerConfig.from_preset("cifar10-small", intermediate_size=384).intermediate_size == 384
    )


@pytest.mark.parametrize(
    "make", [lambda: hyperset_config("image"), lambda: HyperSetConfig.from_preset("cifar10-small")]
)
def test_size_is_comparable_to_hyperset(make):
    """Same embeddings and head (asserted); per layer the baseline has q, k, v, o (4d²), a 4d-wide MLP (8d²) and
    two RMSNorm gains, Hyper-SET W (d²), its dictionary D (Md) and norms, plus one shared step-size net (2d² + 4d).

    Parameter counts baseline / Hyper-SET (ratio), measured: cifar10-small (d = 384, M = d, 224² images)
    2,072,842 / 894,538 (2.32; 1.33 with the baseline's MLP at width M = d); sudoku (d = 768, M = 4d) 7,156,992 /
    4,211,776 (1.70); the tiny image config (d = 16, M = 24, L = 2) 6,444 / 2,164 (2.98; 1.79 at width M)."""
    hyperset_config_ = make()
    with torch.device("meta"):
        hyperset = HyperSetForImageClassification(hyperset_config_)
        baseline = LoopedTransformerForImageClassification(
            LoopedTransformerConfig.from_hyperset(hyperset_config_)
        )

    def count(module):
        return sum(p.numel() for p in module.parameters())

    config = baseline.config
    assert count(baseline.looped_transformer.embeddings) == count(hyperset.hyperset.embeddings)
    assert count(baseline.layernorm) + count(baseline.classifier) == count(hyperset.layernorm) + count(
        hyperset.classifier
    )
    d, m = config.hidden_size, config.intermediate_size
    assert count(baseline.looped_transformer.layers) == config.num_hidden_layers * (
        4 * d * d + 2 * m * d + 2 * d
    )


@pytest.mark.parametrize("position_embedding_type", ["sincos-2d", "sinusoidal"])
def test_fixed_position_table_is_the_configured_one_at_init_and_after_reload(
    tmp_path, position_embedding_type
):
    from energyformers.modeling.modeling_hyperset import sincos_2d_positions, sinusoidal_positions

    # a 4 × 4 board of 16 cells (the tiny sequence config's max_position_embeddings), d = 16 (a multiple of 4)
    model = build(
        LoopedTransformerForTokenClassification, "sequence", position_embedding_type=position_embedding_type
    )
    table = model.looped_transformer.embeddings.position_encoding[0]
    make = sincos_2d_positions if position_embedding_type == "sincos-2d" else sinusoidal_positions
    expected = make(*table.shape)
    assert torch.equal(table, expected), (
        f"{position_embedding_type}: max |diff| {(table - expected).abs().max()}"
    )
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path).eval()
    assert reloaded.config.position_embedding_type == position_embedding_type
    table = reloaded.looped_transformer.embeddings.position_encoding[0]
    assert torch.equal(table, expected), f"reloaded: max |diff| {(table - expected).abs().max()}"
    ids = tokens()
    torch.testing.assert_close(reloaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)
