"""What an API audit of the models (a Python user, tiny configs) found and pins down:

* eval outputs follow the weights however they were written (a hand-written EMA through `param.data`): iMixer
  keeps no eval cache, HyperBF reuses what its centers give only inside `cached_centers()`;
* `position_ids` of the sequence backbones and heads of Hyper-SET, HyperBF and the looped baseline: a left-padded
  batch gives the unpadded logits, and ids that cannot index the position table are refused by name;
* iMixer's `spectral_norm_schedule="per_call"` is refused with activation checkpointing, before anything changes;
* a config with `output_attentions=True` builds every head, as BERT's does.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers
from fixtures import (
    Case,
    assert_close_to_scale,
    assert_differs,
    cli_config,
    hyperbf_config,
    hyperset_config,
    looped_transformer_config,
    perturb,
    rounding,
)
from transformers import PreTrainedModel

from energyformers import (
    HyperBFConfig,
    HyperBFForImageClassification,
    HyperBFForSequenceClassification,
    HyperBFModel,
    HyperSetConfig,
    HyperSetForImageClassification,
    HyperSetForSequenceClassification,
    HyperSetForTokenClassification,
    HyperSetModel,
    IMixerForImageClassification,
    LoopedTransformerConfig,
    LoopedTransformerForImageClassification,
    LoopedTransformerForSequenceClassification,
    LoopedTransformerForTokenClassification,
    LoopedTransformerModel,
)
from energyformers.training import train
from energyformers.training.setup import enable_activation_checkpointing

# ------------------------------------------------------------- eval outputs follow weights written through .data

STATEFUL = [
    pytest.param(IMixerForImageClassification, None, id="imixer"),
    pytest.param(HyperBFForImageClassification, "sdpa", id="hyperbf-sdpa"),  # the folded feedforward
    pytest.param(HyperBFForImageClassification, "eager", id="hyperbf-eager"),  # the explicit one
]


def _ema_step(model: torch.nn.Module) -> None:
    """The classic hand-written EMA update, through `.data` (which bumps no version counter)."""
    g = torch.Generator().manual_seed(2)
    for parameter in model.parameters():
        parameter.data.mul_(0.5).add_(torch.randn(parameter.shape, generator=g), alpha=0.1)


@pytest.mark.parametrize(("model_class", "implementation"), STATEFUL)
def test_eval_outputs_follow_weights_written_through_data(model_class, implementation):
    """Same weights, same logits: with or without autograd, and as a model rebuilt from them."""
    case = Case.of(model_class)
    overrides = {} if implementation is None else {"attn_implementation": implementation}
    model = perturb(case.build(**overrides))
    inputs = case.inputs()
    with torch.no_grad():
        before = model(**inputs).logits  # an evaluation first (where an eval cache would fill)
    _ema_step(model)
    with torch.no_grad():
        no_grad = model(**inputs).logits
    with_grad = model(**inputs).logits.detach()
    rebuilt = case.build(**overrides)
    rebuilt.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = rebuilt(**inputs).logits
    assert_differs(with_grad, before, "logits after the EMA step", beyond_allclose=True)
    # the same computation on the same weights: bit for bit
    torch.testing.assert_close(no_grad, with_grad, atol=0, rtol=0)
    torch.testing.assert_close(no_grad, expected, atol=0, rtol=0)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_hyperbf_reuses_the_centers_inside_cached_centers_only(implementation):
    case = Case.of(HyperBFForImageClassification)
    model = perturb(case.build(attn_implementation=implementation))
    feedforwards = [layer.feedforward for layer in model.hyperbf.layers]
    inputs = case.inputs()
    calls = []
    for feedforward in feedforwards:  # count the computations from the centers
        compute = feedforward._projected_centers
        feedforward._projected_centers = lambda compute=compute: calls.append(1) or compute()
    with torch.no_grad():
        plain = [model(**inputs).logits for _ in range(3)]
        assert len(calls) == 3 * len(feedforwards), calls  # outside the block: at every forward
        calls.clear()
        with model.cached_centers():
            cached = [model(**inputs).logits for _ in range(3)]
        assert len(calls) == len(feedforwards), calls  # inside: once
        assert not any(feedforward._eval_cache for feedforward in feedforwards)  # dropped on leaving
    for got in cached:
        torch.testing.assert_close(got, plain[0], atol=0, rtol=0)


# ------------------------------------------------------------------------------------------- position_ids


def build(model_class: type, input_type: str, **overrides: object) -> torch.nn.Module:
    """The tiny model of the test suite (the looped baseline: that of the tiny Hyper-SET config), perturbed, eval."""
    if model_class.config_class is LoopedTransformerConfig:
        config = looped_transformer_config(input_type, **overrides)
    else:
        make = {HyperSetConfig: hyperset_config, HyperBFConfig: hyperbf_config}[model_class.config_class]
        config = make(input_type, **overrides)
    torch.manual_seed(0)
    return perturb(model_class(config)).eval()


def images(config: transformers.PretrainedConfig) -> torch.Tensor:
    shape = (2, config.num_channels, config.image_size, config.image_size)
    return torch.randn(shape, generator=torch.Generator().manual_seed(4))


def left_padded(config: transformers.PretrainedConfig, lengths: list[int]) -> tuple[list[torch.Tensor], dict]:
    """Sequences of `lengths` (ids from 1: 0 is the pad id) and the batch of them padded on the left."""
    g = torch.Generator().manual_seed(5)
    sequences = [torch.randint(1, config.vocab_size, (length,), generator=g) for length in lengths]
    width = max(lengths)
    input_ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, sequence in enumerate(sequences):
        input_ids[row, width - len(sequence) :] = sequence
        attention_mask[row, width - len(sequence) :] = 1
    return sequences, {"input_ids": input_ids, "attention_mask": attention_mask}


def positions_of(attention_mask: torch.Tensor) -> torch.Tensor:
    """The position ids of a left-padded batch: 0.. from each sequence's first real token (pads at 0)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


# The float32 bound of a padded vs an unpadded run, per unit of the logits' magnitude: the same per-token
# computation, except the masked sums over keys and pooled tokens (other order, exact zeros of the padded terms),
# a few roundings of each of the at most 2 layers × 3 iterations of the tiny configs, each a softmax-weighted sum
# over at most 16 keys: 6 × 16 roundings.
PADDED = rounding(torch.float32, 6 * 16)
POSITION_HEADS = [
    pytest.param(HyperSetForSequenceClassification, {}, id="hyperset-sinusoid"),
    pytest.param(
        HyperSetForSequenceClassification, {"position_embedding_type": "learned"}, id="hyperset-learned"
    ),
    pytest.param(HyperBFForSequenceClassification, {}, id="hyperbf"),
    pytest.param(LoopedTransformerForSequenceClassification, {}, id="looped-sinusoid"),
    pytest.param(
        LoopedTransformerForSequenceClassification,
        {"position_embedding_type": "learned"},
        id="looped-learned",
    ),
]
POSITION_BACKBONES = [HyperSetModel, HyperBFModel, LoopedTransformerModel]


def nonzero_head(model: torch.nn.Module) -> torch.nn.Module:
    """Hyper-SET's step sizes start at zero (no update), so the positions would not reach the logits: move them."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "step_size" in name:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(6)))
    return model


@pytest.mark.parametrize(("model_class", "overrides"), POSITION_HEADS)
def test_left_padding_with_position_ids_gives_the_unpadded_logits(model_class, overrides):
    model = nonzero_head(build(model_class, "sequence", pooling="mean", **overrides))
    longest = model.config.max_position_embeddings
    sequences, batch = left_padded(model.config, [5, longest, 2])
    with torch.no_grad():
        alone = torch.cat([model(input_ids=sequence[None]).logits for sequence in sequences])
        padded = model(**batch, position_ids=positions_of(batch["attention_mask"])).logits
        without = model(**batch).logits
    assert_close_to_scale(padded, alone, PADDED, "left-padded with position_ids vs each sequence alone")
    # without them the real tokens of the short rows sit at positions 11.., not 0..: other logits
    assert_differs(without, alone, "left-padded without position_ids", beyond_allclose=True)


@pytest.mark.parametrize("model_class", POSITION_BACKBONES, ids=lambda c: c.__name__)
def test_position_ids_0_to_n_minus_1_are_the_default_bit_for_bit(model_class):
    model = build(model_class, "sequence")
    _, batch = left_padded(model.config, [6, 6, 6])
    positions = torch.arange(6).expand(3, -1)
    with torch.no_grad():
        default = model(**batch).last_hidden_state
        given = model(**batch, position_ids=positions).last_hidden_state
    torch.testing.assert_close(given, default, atol=0, rtol=0)


@pytest.mark.parametrize(
    "model_class", [HyperSetForTokenClassification, LoopedTransformerForTokenClassification]
)
def test_position_ids_go_along_with_test_time_search_and_the_halting_head(model_class):
    """Search repeats the batch (here K = 2 unperturbed starts) and the halting head drops halted samples from it:
    position_ids go along, batch-first."""
    # mean pooling: the halting head reads the pooled state, and token 0 of a left-padded row is a pad
    model = nonzero_head(
        build(model_class, "sequence", pooling="mean", supervision_steps=2, halting_head=True)
    )
    sequences, batch = left_padded(model.config, [4, 7])
    position_ids = positions_of(batch["attention_mask"])
    with torch.no_grad():
        # a threshold between the two samples' first halting probabilities: one stops after step 1, one runs on
        first = model(**batch, position_ids=position_ids, halting_threshold=0.999).halting_probabilities[:, 0]
        assert abs(first[0] - first[1]) > 1e-3, first  # the rows must be told apart
        threshold = first.mean().item()
        for call in (dict(search_trajectories=2), dict(halting_threshold=threshold)):
            outputs = model(**batch, position_ids=position_ids, **call)
            for row, sequence in enumerate(sequences):
                alone = model(input_ids=sequence[None], **call).logits[0]
                got = outputs.logits[row, -len(sequence) :]  # (N, labels): the real tokens of the row
                assert_close_to_scale(got, alone, PADDED, f"{call}, row {row}")
        assert sorted(outputs.supervision_steps_used.tolist()) == [1, 2], outputs.supervision_steps_used


BAD_POSITIONS = [
    ("shape", lambda ids: ids[:, :-1], "shape (batch, sequence_length)"),
    ("float", lambda ids: ids.float(), "integer positions"),
    ("negative", lambda ids: ids - 1, "must lie in [0, max_position_embeddings"),
    ("too-large", lambda ids: ids + 100, "must lie in [0, max_position_embeddings"),
]


@pytest.mark.parametrize("model_class", POSITION_BACKBONES, ids=lambda c: c.__name__)
@pytest.mark.parametrize(("what", "edit", "message"), BAD_POSITIONS, ids=[b[0] for b in BAD_POSITIONS])
def test_bad_position_ids_are_refused_by_name(model_class, what, edit, message):
    model = build(model_class, "sequence")
    _, batch = left_padded(model.config, [6, 6])
    with pytest.raises(ValueError, match="position_ids") as error:
        model(**batch, position_ids=edit(torch.arange(6).expand(2, -1)))
    assert message in str(error.value), str(error.value)


@pytest.mark.parametrize("model_class", POSITION_BACKBONES, ids=lambda c: c.__name__)
def test_position_ids_are_refused_for_images(model_class):
    """As ViT, which takes no position_ids: an image's positions are those of its patch grid."""
    model = build(model_class, "image")
    with pytest.raises(ValueError, match=r"position_ids apply to token inputs.*config.input_type='image'"):
        model(pixel_values=images(model.config), position_ids=torch.zeros(2, 1, dtype=torch.long))


@pytest.mark.parametrize(
    "model_class",
    [HyperSetForImageClassification, HyperBFForImageClassification, LoopedTransformerForImageClassification],
    ids=lambda c: c.__name__,
)
def test_image_heads_take_no_position_ids(model_class):
    model = build(model_class, "image")
    with pytest.raises(TypeError, match="position_ids"):
        model(pixel_values=images(model.config), position_ids=torch.zeros(2, 1, dtype=torch.long))


# ------------------------------------------------------------ iMixer per-call schedule and checkpointing


def _per_call_model() -> IMixerForImageClassification:
    return perturb(Case.of(IMixerForImageClassification).build(spectral_norm_schedule="per_call"))


@pytest.mark.parametrize("enable", ["activation_checkpointing_enable", "gradient_checkpointing_enable"])
def test_per_call_schedule_refuses_checkpointing_before_changing_anything(enable):
    if not hasattr(PreTrainedModel, enable):
        pytest.skip(f"this transformers has no {enable}")
    model = _per_call_model()
    state = copy.deepcopy(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old name is deprecated where the new one exists
        with pytest.raises(
            ValueError, match=r"spectral_norm_schedule='per_call'.*'per_forward'.*'per_optimizer_step'"
        ):
            getattr(model, enable)()
    assert not any(getattr(module, "gradient_checkpointing", False) for module in model.modules())
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_per_forward_and_per_optimizer_step_schedules_still_checkpoint():
    for schedule in ("per_forward", "per_optimizer_step"):
        model = Case.of(IMixerForImageClassification).build(spectral_norm_schedule=schedule)
        enable_activation_checkpointing(model)
        assert all(layer.gradient_checkpointing for layer in model.imixer.layers), schedule


def test_trainer_with_checkpointing_refuses_per_call_before_a_step(tmp_path):
    model = _per_call_model()
    state = copy.deepcopy(model.state_dict())
    case = Case.of(IMixerForImageClassification)
    inputs = case.inputs(labels=True)
    rows = [{"pixel_values": p, "labels": y} for p, y in zip(inputs["pixel_values"], inputs["labels"])]
    name = (
        "activation_checkpointing"
        if hasattr(transformers.TrainingArguments, "activation_checkpointing")
        else ("gradient_checkpointing")
    )
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, report_to=[], use_cpu=True, save_strategy="no", **{name: True}
    )
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=rows)
    with pytest.raises(ValueError, match="spectral_norm_schedule='per_call'"):
        trainer.train()
    assert trainer.state.global_step == 0
    for key, tensor in model.state_dict().items():  # no step, no power iteration ran
        assert torch.equal(tensor, state[key]), key


def test_train_cli_refuses_per_call_with_gradient_checkpointing_before_training(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [
        "--model", "imixer", "--dataset", "digits", "--output_dir", str(out),
        "--config", *cli_config("imixer"), 'spectral_norm_schedule="per_call"',
        "--gradient_checkpointing", "--max_steps", "2", "--max_train_samples", "16", "--max_eval_samples", "8",
        "--max_test_samples", "8", "--num_threads", "1", "--disable_tqdm",
    ]  # fmt: skip
    assert train.main(argv) == 2
    error = capsys.readouterr().err
    assert "--gradient_checkpointing" in error and "spectral_norm_schedule='per_call'" in error, error
    assert not (out / "model.safetensors").exists() and not list(out.glob("checkpoint-*"))


# ------------------------------------------------------------------- output_attentions=True in the config

ATTENTION_CASES = [
    pytest.param(HyperBFForImageClassification, None, id="hyperbf-head"),
    pytest.param(HyperBFForImageClassification, "sdpa", id="hyperbf-head-sdpa"),
    pytest.param(LoopedTransformerForImageClassification, None, id="looped-head"),
    pytest.param(LoopedTransformerForImageClassification, "sdpa", id="looped-head-sdpa"),
    pytest.param(HyperSetForImageClassification, "sdpa", id="hyperset-head-sdpa"),
    pytest.param(HyperBFModel, "sdpa", id="hyperbf-backbone-sdpa"),
]


@pytest.mark.parametrize(("model_class", "implementation"), ATTENTION_CASES)
def test_a_config_asking_for_attention_maps_builds_and_returns_them(model_class, implementation):
    """As BERT's heads build from such a config; these models compute the maps of any call with eager attention,
    so every implementation returns them. With no implementation asked for, the model runs eager, the one that
    computes them (what transformers' config picks when output_attentions is set first)."""
    config = build(model_class, "image").config  # the tiny config, then as a user would write it
    config = type(config)(**{**config.to_diff_dict(), "output_attentions": True})
    chosen = {} if implementation is None else {"attn_implementation": implementation}
    model = model_class._from_config(config, **chosen).eval()
    assert model.config._attn_implementation == (implementation or "eager")
    with torch.no_grad():
        outputs = model(pixel_values=images(config))
    layers = config.num_hidden_layers * getattr(config, "num_iterations", 1)
    assert outputs.attentions is not None and len(outputs.attentions) == layers, outputs.attentions
    assert all(torch.isfinite(maps).all() for maps in outputs.attentions)


def test_a_config_asking_for_attention_maps_saves_with_the_default_implementation(tmp_path):
    model = HyperBFForImageClassification(hyperbf_config("image", output_attentions=True))
    model.save_pretrained(tmp_path)
    loaded = HyperBFForImageClassification.from_pretrained(tmp_path)
    assert loaded.config.output_attentions and loaded.config._attn_implementation == "eager"


# ---------------------------------------------------------------- Hyper-SET's eager bi-softmax in half precision


def _symmetric_heads(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """q = z·c, k = z, v as Hyper-SET's attention forms them (symmetric scores), in `dtype`, and a padding mask."""
    g = torch.Generator().manual_seed(seed)
    z = (
        torch.nn.functional.normalize(torch.randn(2, 3, 24, 8, generator=g, dtype=torch.float64), dim=-1)
        * 8**0.5
    )
    q = z * ((0.5 + torch.rand(3, 1, 8, generator=g, dtype=torch.float64)) * 4 / 8**0.5)
    v = torch.randn(2, 3, 24, 8, generator=g, dtype=torch.float64)
    keep = torch.ones(2, 24, dtype=torch.bool)
    keep[1, 15:] = False
    return q.to(dtype), z.to(dtype), v.to(dtype), keep


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_eager_bisoftmax_maps_are_rounded_once_in_half_precision(dtype):
    """P = R + Rᵀ formed in float32 and rounded once to the input dtype (as the shared eager softmax attention):
    every entry within half an eps (one rounding) plus a few float32 eps of the exact P of the same scores; rounding
    R first and the sum again gives up to 1.5 eps/2."""
    from energyformers.modeling.modeling_hyperset import eager_bisoftmax_attention

    for seed in range(3):
        q, k, v, keep = _symmetric_heads(dtype, seed)
        _, probs = eager_bisoftmax_attention(q, k, v, keep)
        assert probs.dtype == dtype
        scores = (q @ k.transpose(-1, -2)).double()  # the scores in the input dtype, as the function has them
        mask = keep[:, None, None, :]
        row = scores.masked_fill(~mask, -torch.inf).softmax(-1)
        exact = (row + row.transpose(-1, -2)) * mask
        relative = (probs.double() - exact).abs() / exact.abs().clamp_min(torch.finfo(torch.float32).tiny)
        bound = rounding(dtype, 0.5) + rounding(torch.float32, 8)
        worst = relative[exact >= torch.finfo(dtype).tiny].max().item()  # the normal range: no underflow
        assert worst <= bound, (
            f"seed {seed}: max relative error of P {worst:.3e} > {bound:.3e} (one rounding)"
        )
        assert torch.equal(probs[exact == 0], torch.zeros_like(probs[exact == 0]))  # padded entries exactly 0


def test_eager_bisoftmax_in_float32_is_the_plain_softmax_formula_bit_for_bit():
    """In float32 the promotion changes nothing: the maps and output are those of one float32 softmax."""
    from energyformers.modeling.modeling_hyperset import eager_bisoftmax_attention

    q, k, v, keep = _symmetric_heads(torch.float32, 0)
    output, probs = eager_bisoftmax_attention(q, k, v, keep)
    mask = keep[:, None, None, :].to(torch.float32)
    row = (q @ k.transpose(-1, -2)).masked_fill(mask == 0, torch.finfo(torch.float32).min).softmax(-1)
    expected = (row + row.transpose(-1, -2)) * mask
    torch.testing.assert_close(probs, expected, atol=0, rtol=0)
    torch.testing.assert_close(output, expected @ v, atol=0, rtol=0)
