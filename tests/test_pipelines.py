"""`energyformers.pipelines`: transformers' classification pipelines with the model's depth arguments as call
arguments, checked against direct model calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures import hyperset_config, imixer_config, perturb, rounding
from PIL import Image
from transformers import pipeline

from energyformers import (
    HyperSetForImageClassification,
    HyperSetForSequenceClassification,
    HyperSetForTokenClassification,
    IMixerForImageClassification,
)
from energyformers.pipelines import (
    ImageClassificationPipeline,
    TextClassificationPipeline,
    TokenClassificationPipeline,
)
from energyformers.training.processing import build_image_processor, train_tokenizer


def _image() -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _scores(result: list[dict]) -> dict[str, float]:
    return {entry["label"]: entry["score"] for entry in result}


def _direct_scores(model: torch.nn.Module, inputs: dict, **depth) -> dict[str, float]:
    with torch.no_grad():
        probabilities = model(**inputs, **depth).logits.softmax(-1)[0]
    return {model.config.id2label[i]: float(p) for i, p in enumerate(probabilities)}


@pytest.fixture
def image_classifier() -> tuple:
    torch.manual_seed(0)
    model = perturb(
        HyperSetForImageClassification(hyperset_config("image", num_hidden_layers=1, num_channels=3)), seed=2
    )
    with torch.no_grad():
        model.hyperset.step_sizes.proj.weight.mul_(20)
    processor = build_image_processor(model.config)
    classify = pipeline(
        "image-classification",
        model=model.eval(),
        image_processor=processor,
        pipeline_class=ImageClassificationPipeline,
    )
    return model, processor, classify


@pytest.mark.parametrize(
    "depth", [dict(num_iterations=1), dict(num_iterations=9), dict(halting_tolerance=0.5)]
)
def test_image_pipeline_passes_depth_arguments_to_the_model(image_classifier, depth):
    model, processor, classify = image_classifier
    inputs = processor(_image(), return_tensors="pt")
    got = _scores(classify(_image(), top_k=4, **depth))
    expected = _direct_scores(model, dict(inputs), **depth)
    # the pipeline's numpy softmax vs torch's of the same float32 logits: the max subtracted, an exp, a sum of 4
    # labels, a division; 8 roundings of probabilities up to 1
    assert got == pytest.approx(expected, abs=rounding(torch.float32, 8))
    # the argument mattered: a liveness margin far above that rounding (the depth moves these by 5e-3 or more)
    assert got != pytest.approx(_direct_scores(model, dict(inputs)), abs=1e-4)
    assert "forward" not in model.__dict__  # the model is left as it was


def test_depth_arguments_reach_the_model_call_without_patching_the_instance(image_classifier):
    """The arguments go into the model call itself: an instance `forward` bound for the call would be shared with
    every other caller of the model (another pipeline in another thread) and outlive a call that fails."""
    model, _, classify = image_classifier
    seen = []

    def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append(("forward" in vars(module), kwargs.get("num_iterations")))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        classify(_image(), num_iterations=3)
    finally:
        handle.remove()
    # per model call: (an instance forward bound, num_iterations in the call's arguments)
    assert seen == [(False, 3)], seen
    assert "forward" not in vars(model)


def _token_scores(results: list[list[dict]]) -> list[list[tuple[str, str, float]]]:
    return [[(entry["word"], entry["entity"], entry["score"]) for entry in result] for result in results]


def test_token_pipeline_takes_depth_arguments_in_batches():
    """Token classification returns its model inputs with the logits and un-batches them per item when
    batch_size > 1: the depth argument added to the call must not be among them."""
    torch.manual_seed(0)
    texts = ["a good film", "a bad film", "good good", "bad bad film"] * 4
    tokenizer = train_tokenizer(texts, vocab_size=30, max_length=16)
    config = hyperset_config("sequence", num_hidden_layers=1, vocab_size=len(tokenizer))
    model = perturb(HyperSetForTokenClassification(config), seed=2).eval()
    with torch.no_grad():
        model.hyperset.step_sizes.proj.weight.mul_(20)  # so the depth moves the scores (checked below)
    tag = pipeline(
        "token-classification", model=model, tokenizer=tokenizer, pipeline_class=TokenClassificationPipeline
    )
    # 4, 3 and 4 tokens with [CLS]: the first batch of two is padded
    inputs = ["a good film", "bad film", "good good bad"]
    one = _token_scores(tag(inputs, batch_size=1, num_iterations=9, ignore_labels=[]))
    two = _token_scores(tag(inputs, batch_size=2, num_iterations=9, ignore_labels=[]))
    assert [[entry[:2] for entry in result] for result in two] == [[entry[:2] for entry in r] for r in one]
    # one sample alone vs padded to its batch's longest: the same float32 sums over the unmasked keys up to the
    # order of a handful of additions per layer and iteration; 9 iterations of a few roundings of scores up to 1
    got = [entry[2] for result in two for entry in result]
    expected = [entry[2] for result in one for entry in result]
    assert got == pytest.approx(expected, abs=rounding(torch.float32, 9 * 16)), (got, expected)
    # the argument mattered
    default = [entry[2] for result in _token_scores(tag(inputs, ignore_labels=[])) for entry in result]
    assert default != pytest.approx(expected, abs=1e-4), (default, expected)


def test_text_pipeline_passes_depth_arguments_to_the_model():
    torch.manual_seed(0)
    texts = ["a good film", "a bad film", "good good", "bad bad film"] * 4
    tokenizer = train_tokenizer(texts, vocab_size=30, max_length=16)
    config = hyperset_config("sequence", num_hidden_layers=1, vocab_size=len(tokenizer))
    model = perturb(HyperSetForSequenceClassification(config), seed=2).eval()
    classify = pipeline(
        "text-classification", model=model, tokenizer=tokenizer, pipeline_class=TextClassificationPipeline
    )
    inputs = dict(tokenizer("a good film", return_tensors="pt"))
    got = _scores(classify("a good film", top_k=None, num_iterations=7))
    # numpy's softmax vs torch's of the same float32 logits, as in the image pipeline above (here 4 labels too)
    assert got == pytest.approx(
        _direct_scores(model, inputs, num_iterations=7), abs=rounding(torch.float32, 8)
    )


def test_an_argument_the_model_does_not_take_is_rejected_by_name():
    model = IMixerForImageClassification(imixer_config("image", num_channels=3)).eval()
    classify = pipeline(
        "image-classification",
        model=model,
        image_processor=build_image_processor(model.config),
        pipeline_class=ImageClassificationPipeline,
    )
    assert len(classify(_image(), fixed_point_iterations=4)) == 4
    with pytest.raises(ValueError, match="halting_tolerance"):
        classify(_image(), halting_tolerance=0.1)


ARGVS = {"import": ["python"], "help-only-command-line": ["energyformers", "--help"]}


@pytest.fixture(scope="module")
def import_runs() -> dict:
    """`import energyformers` then `energyformers.pipelines.X` in a fresh process per command line, run at once."""
    import sys

    from fixtures import run_at_once

    code = (
        "import sys; sys.argv = {!r}; import energyformers; print(energyformers.pipelines.DEPTH_ARGUMENTS[0])"
    )
    commands = {name: dict(args=[sys.executable, "-c", code.format(argv)]) for name, argv in ARGVS.items()}
    return run_at_once(commands, timeout=300)


@pytest.mark.parametrize("argv", list(ARGVS))
def test_pipelines_is_an_attribute_after_import_energyformers(import_runs, argv):
    """`import energyformers` then `energyformers.pipelines.X`, in a fresh process (here other tests imported it),
    also where the package defers its imports (the command line asking for help)."""
    result = import_runs[argv]
    assert result.returncode == 0 and result.stdout.strip() == "num_iterations", result.stderr[-2000:]
