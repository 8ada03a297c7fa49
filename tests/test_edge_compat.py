"""Compatibility edges where the models now do what transformers' BERT / ViT do (found by comparing them on boundary
inputs and with `Trainer`):

* `inputs_embeds` of another float dtype (bfloat16 embeddings from another model) run in the model's dtype, as
  `pixel_values` do; the fixed positions and iMixer's pad embedding follow the model's dtype, not the input's;
* `position_ids` of shape `(1, L)` apply to every sample (BERT's own buffer has that shape), through the outer
  steps, the halting head's early stop and test-time search; other shapes are refused, naming both accepted ones;
* numpy integers (a sweep over `np.arange`) are integers for the per-call depth / count arguments and for every
  config's integer fields, which store them as Python's (JSON has no numpy types); bools, floats and tensors stay
  refused;
* `Trainer.evaluate` / `predict` hand `compute_metrics` the logits alone, whatever output fields a head adds
  (`keys_to_ignore_at_inference`);
* the CLI's refusal of supervision steps / a halting head beside label smoothing names only the settings that are on.
"""

from __future__ import annotations

import json
import typing

import numpy as np
import pytest
import torch
from fixtures import (
    hyperbf_config,
    hyperset_config,
    imixer_config,
    looped_transformer_config,
    main_output,
    perturb,
)
from transformers import Trainer, TrainingArguments
from transformers.utils import ModelOutput

from energyformers import (
    BASELINES,
    FAMILIES,
    HyperBFConfig,
    HyperSetConfig,
    HyperSetForImageClassification,
    HyperSetForTokenClassification,
    IMixerConfig,
    IMixerForImageClassification,
    LoopedTransformerConfig,
    LoopedTransformerForImageClassification,
    LoopedTransformerForTokenClassification,
)
from energyformers.training.arguments import parse_arguments
from energyformers.training.cli import UsageError
from energyformers.training.setup import check_supervision_flags

CONFIGS = {
    HyperSetConfig: hyperset_config,
    IMixerConfig: imixer_config,
    HyperBFConfig: hyperbf_config,
    LoopedTransformerConfig: looped_transformer_config,
}
HEADS = [
    (auto, head)
    for family in (*FAMILIES.values(), *BASELINES.values())
    for auto, head in family.heads.items()
]
# every model class that takes token ids: the sequence heads, the masked-image-modelling heads (image codes) and
# the base models built on a sequence config
TOKEN_MODELS = [
    pytest.param(head, id=head.__name__) for auto, head in HEADS if auto != "AutoModelForImageClassification"
]
# the families whose sequences take position_ids (iMixer places its tokens itself)
POSITION_MODELS = [
    pytest.param(head, id=head.__name__)
    for auto, head in HEADS
    if auto in ("AutoModel", "AutoModelForSequenceClassification", "AutoModelForTokenClassification")
    and head.config_class is not IMixerConfig
]


def build(model_class: type, input_type: str = "sequence", **overrides: object) -> torch.nn.Module:
    """The tiny model of the suite, perturbed (so Hyper-SET's zero-initialised step sizes move), in eval mode."""
    config = CONFIGS[model_class.config_class](input_type, **overrides)
    torch.manual_seed(0)
    return perturb(model_class(config)).eval()


def token_ids(config: object, batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(3))


# ------------------------------------------------------------------------------------ inputs_embeds' dtype


@pytest.mark.parametrize("model_class", TOKEN_MODELS)
def test_inputs_embeds_of_another_dtype_run_in_the_models_dtype(model_class):
    """As BERT (float32 logits from bfloat16 embeddings): the embeddings are cast to the model's dtype first, so the
    result is exactly that of the cast embeddings, both ways round (half embeddings into a float32 model, float32
    ones into a bfloat16 model), and gradients reach the given embeddings in their own dtype (attribution)."""
    model = build(model_class)
    ids = token_ids(model.config, 2, 6)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)  # (B, L, d) float32
    for half in (torch.bfloat16, torch.float16):
        given = embeds.to(half).requires_grad_()
        out = main_output(model(inputs_embeds=given))
        with torch.no_grad():
            cast = main_output(model(inputs_embeds=given.detach().float()))
        assert out.dtype == torch.float32, out.dtype
        torch.testing.assert_close(
            out, cast, atol=0, rtol=0, msg=lambda m, half=half: f"{half} embeddings: {m}"
        )
        out.float().square().sum().backward()
        assert given.grad is not None and given.grad.dtype == half, given.grad
        assert torch.isfinite(given.grad).all() and given.grad.abs().sum() > 0, given.grad
    model.to(torch.bfloat16)
    with torch.no_grad():
        out = main_output(model(inputs_embeds=embeds))
        cast = main_output(model(inputs_embeds=embeds.to(torch.bfloat16)))
    assert out.dtype == torch.bfloat16, out.dtype
    torch.testing.assert_close(
        out, cast, atol=0, rtol=0, msg=lambda m: f"float32 embeddings, bf16 model: {m}"
    )


# ------------------------------------------------------------------------------------- position_ids (1, L)


# the position tables: Hyper-SET's and the baseline's fixed sinusoid and learned table, HyperBF's learned one
POSITION_TABLES = [
    pytest.param(model_class, overrides, id=f"{model_class.__name__}-{name}")
    for model_class in [p.values[0] for p in POSITION_MODELS]
    for name, overrides in (
        [("learned", {})]
        if model_class.config_class is HyperBFConfig
        else [(kind, {"position_embedding_type": kind}) for kind in ("sinusoidal", "learned")]
    )
]


@pytest.mark.parametrize(("model_class", "overrides"), POSITION_TABLES)
def test_position_ids_of_one_row_apply_to_every_sample(model_class, overrides):
    model = build(model_class, **overrides)
    ids = token_ids(model.config, 3, 6)
    row = torch.tensor([4, 0, 5, 1, 3, 2])  # not the default 0..5, so a row the model ignored would show
    with torch.no_grad():
        one = main_output(model(input_ids=ids, position_ids=row[None]))
        every = main_output(model(input_ids=ids, position_ids=row.expand(3, -1).clone()))
        default = main_output(model(input_ids=ids))
    torch.testing.assert_close(one, every, atol=0, rtol=0)
    assert not torch.equal(one, default), "the positions did not reach the output"


@pytest.mark.parametrize(
    "model_class", [HyperSetForTokenClassification, LoopedTransformerForTokenClassification]
)
def test_position_ids_of_one_row_go_along_with_the_halting_head_and_search(model_class):
    """The halting head drops halted samples from the batch and search repeats it: a (1, L) row is every sample's."""
    model = build(model_class, pooling="mean", supervision_steps=2, halting_head=True)
    ids = token_ids(model.config, 4, 6)
    row = torch.tensor([4, 0, 5, 1, 3, 2])
    every = row.expand(4, -1).clone()
    with torch.no_grad():
        first = model(input_ids=ids, position_ids=every, halting_threshold=0.999).halting_probabilities[:, 0]
        threshold = first.median().item()  # some samples stop after step 1, the others run on
        for call in (
            dict(halting_threshold=threshold),
            dict(search_trajectories=2, search_noise=0.1, search_seed=1),
        ):
            one = model(input_ids=ids, position_ids=row[None], **call)
            expected = model(input_ids=ids, position_ids=every, **call)
            torch.testing.assert_close(
                one.logits, expected.logits, atol=0, rtol=0, msg=lambda m, c=call: f"{c}: {m}"
            )
        steps = sorted(set(one.supervision_steps_used.tolist()))
    assert sorted(set(expected.supervision_steps_used.tolist())) == steps
    halted = model(input_ids=ids, position_ids=row[None], halting_threshold=threshold).supervision_steps_used
    assert sorted(set(halted.tolist())) == [1, 2], (first, threshold, halted)  # the batch was split


BAD_SHAPES = [
    pytest.param(lambda row: row, id="(L,)"),
    pytest.param(lambda row: row.expand(2, -1), id="(2, L) for batch 3"),
    pytest.param(lambda row: row[None, :-1], id="(1, L-1)"),
    pytest.param(lambda row: row[None, None], id="(1, 1, L)"),
]


@pytest.mark.parametrize("model_class", POSITION_MODELS)
@pytest.mark.parametrize("edit", BAD_SHAPES)
def test_position_ids_of_other_shapes_are_refused_naming_both_accepted_shapes(model_class, edit):
    model = build(model_class)
    ids = token_ids(model.config, 3, 6)
    bad = edit(torch.arange(6))
    with pytest.raises(ValueError, match=r"position_ids") as error:
        model(input_ids=ids, position_ids=bad)
    message = str(error.value)
    assert "(batch, sequence_length) = (3, 6), or (1, 6)" in message, message
    assert f"got shape {tuple(bad.shape)}" in message, message


# ---------------------------------------------------------------------------------------- numpy integers

# (model class, input type, argument, integer value, other call arguments)
INTEGER_ARGUMENTS = [
    pytest.param(HyperSetForImageClassification, "num_iterations", 3, {}, id="hyperset-num_iterations"),
    pytest.param(
        LoopedTransformerForImageClassification, "num_iterations", 3, {}, id="looped-num_iterations"
    ),
    pytest.param(
        HyperSetForImageClassification, "backprop_iterations", 1, {}, id="hyperset-backprop_iterations"
    ),
    pytest.param(
        HyperSetForImageClassification,
        "search_trajectories",
        2,
        {"search_noise": 0.1, "search_seed": 1},
        id="search_trajectories",
    ),
    pytest.param(
        LoopedTransformerForImageClassification,
        "search_seed",
        5,
        {"search_trajectories": 2, "search_noise": 0.1},
        id="search_seed",
    ),
    pytest.param(
        IMixerForImageClassification, "fixed_point_iterations", 1, {}, id="imixer-fixed_point_iterations"
    ),
]


@pytest.mark.parametrize(("model_class", "name", "value", "call"), INTEGER_ARGUMENTS)
def test_numpy_integer_call_arguments_are_integers(model_class, name, value, call):
    model = build(model_class, "image")
    pixels = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([0, 3])
    train = name == "backprop_iterations"  # truncation acts in training: compare the loss and the gradients
    model.train(train)
    results = []
    for given in (value, np.int64(value), np.int32(value)):
        model.zero_grad()
        outputs = model(pixel_values=pixels, labels=labels, **{name: given}, **call)
        if train:
            outputs.loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results.append((outputs.logits.detach(), outputs.loss.detach(), grads))
    for (logits, loss, grads), given in zip(results[1:], ("np.int64", "np.int32"), strict=True):
        torch.testing.assert_close(logits, results[0][0], atol=0, rtol=0, msg=lambda m, g=given: f"{g}: {m}")
        torch.testing.assert_close(loss, results[0][1], atol=0, rtol=0)
        assert len(grads) == len(results[0][2]) and all(map(torch.equal, grads, results[0][2])), given
    for bad in (True, float(value), np.float64(value), torch.tensor(value)):
        with pytest.raises(ValueError, match=name):
            model(pixel_values=pixels, **{name: bad}, **call)


# one integer field of each validation table (and vocab_size, a cross-field rule's), as numpy integers
CONFIG_INTEGERS = [
    pytest.param(
        HyperSetConfig,
        "sequence",
        {"num_iterations": 3, "backprop_iterations": 2, "hidden_size": 16, "vocab_size": 20, "num_labels": 4},
        id="hyperset",
    ),
    pytest.param(HyperSetConfig, "image", {"image_size": [8, 8], "patch_size": 2}, id="hyperset-image_size"),
    pytest.param(LoopedTransformerConfig, "image", {"num_iterations": 3, "hidden_size": 16}, id="looped"),
    pytest.param(IMixerConfig, "image", {"fixed_point_iterations": 1, "num_hidden_layers": 2}, id="imixer"),
    pytest.param(HyperBFConfig, "image", {"hidden_size": 32, "num_hidden_layers": 1}, id="hyperbf"),
]


def numpy_ints(value: object) -> object:
    return [np.int64(v) for v in value] if isinstance(value, list) else np.int64(value)


@pytest.mark.parametrize(("config_class", "input_type", "fields"), CONFIG_INTEGERS)
def test_config_integers_may_be_numpy_integers_and_are_stored_as_python_ints(
    config_class, input_type, fields
):
    if config_class is LoopedTransformerConfig:  # built directly: its intermediate_size follows hidden_size
        make = lambda **kw: LoopedTransformerConfig(num_attention_heads=4, num_labels=4, **kw)  # noqa: E731
    else:
        make = lambda **kw: CONFIGS[config_class](input_type, **kw)  # noqa: E731
    reference = make(**fields)
    config = make(**{name: numpy_ints(value) for name, value in fields.items()})
    for name in fields:
        value = getattr(config, name)
        items = value if isinstance(value, list) else [value]
        assert all(type(item) is int for item in items), f"{name}={value!r} ({type(value).__name__})"
    assert json.loads(config.to_json_string()) == json.loads(reference.to_json_string())
    name, value = next((n, v) for n, v in fields.items() if not isinstance(v, list))
    config.update({name: np.int64(value)})  # transformers' bulk edit: checked, and stored as int as well
    assert type(getattr(config, name)) is int, type(getattr(config, name))
    for bad in (True, float(value), np.float64(value), torch.tensor(value)):
        with pytest.raises(ValueError, match=f"invalid {name}="):
            make(**{**fields, name: bad})


# ------------------------------------------------------------------------------------ Trainer's predictions


@pytest.mark.parametrize(
    ("auto", "model_class"), [pytest.param(a, h, id=h.__name__) for a, h in HEADS if a != "AutoModel"]
)
def test_every_output_field_but_the_logits_is_ignored_at_inference(auto, model_class):
    """Every field a head's output class has besides `loss` and `logits` (diagnostics, step, search, hidden-state
    fields) is in the config's `keys_to_ignore_at_inference`, a list (Trainer adds `["loss"]` to it)."""
    keys = getattr(model_class.config_class, "keys_to_ignore_at_inference", None)
    assert isinstance(keys, list), keys
    returned = typing.get_type_hints(model_class.forward)["return"]
    classes = [
        c
        for c in typing.get_args(returned) or (returned,)
        if isinstance(c, type) and issubclass(c, ModelOutput)
    ]
    assert classes, returned
    fields = {name for klass in classes for name in klass.__dataclass_fields__} - {"loss", "logits"}
    assert fields <= set(keys), sorted(fields - set(keys))
    assert not {"loss", "logits"} & set(keys), keys


def accuracy(prediction: object) -> dict[str, float]:
    """transformers' image-classification recipe, which expects the predictions to be the logits array."""
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


# (model class, input type, config overrides): each makes the head return fields besides the logits in eval
TRAINER_CASES = [
    pytest.param(
        HyperSetForImageClassification,
        "image",
        {"supervision_steps": 2, "halting_head": True},
        id="hyperset-halting",
    ),
    pytest.param(
        LoopedTransformerForTokenClassification, "sequence", {"supervision_steps": 2}, id="looped-token-steps"
    ),
    pytest.param(
        IMixerForImageClassification, "image", {"output_hidden_states": True}, id="imixer-hidden-states"
    ),
    pytest.param(
        FAMILIES["hyperbf"].heads["AutoModelForSequenceClassification"],
        "sequence",
        {"output_hidden_states": True},
        id="hyperbf-hidden-states",
    ),
]


@pytest.mark.parametrize(("model_class", "input_type", "overrides"), TRAINER_CASES)
def test_trainer_predictions_are_the_logits(model_class, input_type, overrides, tmp_path):
    model = build(model_class, input_type, **overrides)
    g = torch.Generator().manual_seed(5)
    if input_type == "image":
        channels = model.config.num_channels
        inputs = {"pixel_values": torch.randn(6, channels, 8, 8, generator=g)}
    else:
        inputs = {"input_ids": token_ids(model.config, 6, 5)}
    shape = (6, 5) if model_class is LoopedTransformerForTokenClassification else (6,)
    inputs["labels"] = torch.randint(0, model.config.num_labels, shape, generator=g)
    dataset = [{name: value[i] for name, value in inputs.items()} for i in range(6)]
    with torch.no_grad():
        expected = model(**inputs)
    assert len([v for k, v in expected.items() if k not in ("loss", "logits")]) > 0, (
        "no extra field to ignore"
    )
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=6, use_cpu=True, report_to=[], disable_tqdm=True
    )
    trainer = Trainer(model=model, args=args, eval_dataset=dataset, compute_metrics=accuracy)
    metrics = trainer.evaluate()
    assert "eval_accuracy" in metrics, metrics
    predictions = trainer.predict(dataset).predictions
    assert isinstance(predictions, np.ndarray), [getattr(p, "shape", p) for p in predictions]
    torch.testing.assert_close(torch.from_numpy(predictions), expected.logits, atol=0, rtol=0)


# --------------------------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        ({"supervision_steps": 2}, "--supervision_steps 2"),
        ({"halting_head": True}, "--halting_head"),
        ({"supervision_steps": 3, "halting_head": True}, "--supervision_steps 3 / --halting_head"),
    ],
)
def test_label_smoothing_refusal_names_only_the_settings_that_are_on(overrides, refused):
    args = parse_arguments(
        ["--output_dir", "x", "--label_smoothing_factor", "0.1"], "energyformers train", ""
    )
    with pytest.raises(UsageError) as error:
        check_supervision_flags(args, hyperset_config("image", **overrides))
    # what the message names as refused, before its reason and advice (which name flags too)
    assert str(error.value).startswith(f"{refused}: the batch augmentation"), str(error.value)
