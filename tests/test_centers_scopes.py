"""HyperBF's centers cache (`cached_centers`) where inference scopes it (`centers_scope`): one call of the package's
classification pipelines, and the scored loop of `energyformers evaluate`. Inside, each feedforward computes what its
centers give once for all the batches; the answers are the same as without the cache, bit for bit; outside, nothing
is cached. iMixer's spectrally normalised weights are computed at every forward, inside the scope too (no
process-wide `torch.nn.utils.parametrize.cached()`).

The centre computations are counted by wrapping `HyperBFFeedForward._projected_centers`, the work both paths start
from (the explicit path's projected centers, and the folded path's keys, which are built from them). The reference
"without the cache" is the same call with `cached_centers` hidden from the model: the pipelines and evaluate then
open no scope, as for the other families.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import hyperbf_config, imixer_config, perturb
from PIL import Image
from transformers import pipeline

from energyformers import (
    HyperBFForImageClassification,
    HyperBFForSequenceClassification,
    IMixerForImageClassification,
)
from energyformers.modeling.modeling_hyperbf import HyperBFFeedForward, HyperBFPreTrainedModel
from energyformers.modeling.modeling_imixer import IMixerSpectralNorm
from energyformers.pipelines import ImageClassificationPipeline, TextClassificationPipeline, centers_scope
from energyformers.training import cli
from energyformers.training.processing import build_image_processor, train_tokenizer

IMAGES = 6


@pytest.fixture
def centre_computations(monkeypatch) -> Counter:
    """Per feedforward module (its id), how often it computed its projected centers in a no-grad eval forward: the
    forwards the cache may serve."""
    counts: Counter = Counter()
    compute = HyperBFFeedForward._projected_centers

    def counted(self):
        if not self.training and not torch.is_grad_enabled():
            counts[id(self)] += 1
        return compute(self)

    monkeypatch.setattr(HyperBFFeedForward, "_projected_centers", counted)
    return counts


def without_cache(monkeypatch) -> None:
    """The model no longer offers `cached_centers`: the pipelines and evaluate then run as other families do."""
    monkeypatch.delattr(HyperBFPreTrainedModel, "cached_centers")


def feedforwards(model: torch.nn.Module) -> list[HyperBFFeedForward]:
    return [module for module in model.modules() if isinstance(module, HyperBFFeedForward)]


def assert_nothing_cached(model: torch.nn.Module) -> None:
    left = [(ff.reuse_centers, sorted(ff._eval_cache)) for ff in feedforwards(model)]
    assert all(not reuse and not cache for reuse, cache in left), f"left after the call: {left}"


def images(count: int = IMAGES) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)) for _ in range(count)]


def image_pipeline(implementation: str) -> tuple[torch.nn.Module, ImageClassificationPipeline]:
    torch.manual_seed(0)
    config = hyperbf_config("image", attn_implementation=implementation)
    model = perturb(HyperBFForImageClassification(config), seed=2).eval()
    classify = pipeline(
        "image-classification",
        model=model,
        image_processor=build_image_processor(model.config),
        pipeline_class=ImageClassificationPipeline,
    )
    return model, classify


# sdpa folds the feedforward at the fixtures' width (its cached keys and values), eager takes the explicit path
# (its cached projected centers)
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_one_image_pipeline_call_computes_the_centers_once_with_the_same_answers(
    implementation, batch_size, centre_computations, monkeypatch
):
    model, classify = image_pipeline(implementation)
    layers = feedforwards(model)
    # both paths are covered: the width folds, and the implementation decides whether it does
    assert all(ff.folds for ff in layers) and model.config._attn_implementation == implementation
    cached = classify(images(), batch_size=batch_size, top_k=None)
    once = dict(centre_computations)
    assert_nothing_cached(model)  # the scope ends with the call

    centre_computations.clear()
    without_cache(monkeypatch)
    plain = classify(images(), batch_size=batch_size, top_k=None)
    batches = -(-IMAGES // batch_size)
    assert once == {id(ff): 1 for ff in layers}, f"cached call: {once}, expected 1 per layer"
    assert dict(centre_computations) == {id(ff): batches for ff in layers}, (
        f"without the cache: {dict(centre_computations)}, expected {batches} per layer (one per batch)"
    )
    # the same keys and values enter the same operations: equal, not close
    assert cached == plain, f"with the cache {cached}\nwithout {plain}"


def test_one_text_pipeline_call_computes_the_centers_once_with_the_same_answers(
    centre_computations, monkeypatch
):
    texts = ["a good film", "a bad film", "good good", "bad bad film"]
    tokenizer = train_tokenizer(texts * 4, vocab_size=16, max_length=12)
    torch.manual_seed(0)
    config = hyperbf_config("sequence", vocab_size=len(tokenizer))
    model = perturb(HyperBFForSequenceClassification(config), seed=2).eval()
    classify = pipeline(
        "text-classification", model=model, tokenizer=tokenizer, pipeline_class=TextClassificationPipeline
    )
    cached = classify(texts, top_k=None)
    once = dict(centre_computations)
    centre_computations.clear()
    without_cache(monkeypatch)
    plain = classify(texts, top_k=None)
    layers = feedforwards(model)
    assert once == {id(ff): 1 for ff in layers}, once
    assert dict(centre_computations) == {id(ff): len(texts) for ff in layers}, dict(centre_computations)
    assert cached == plain, f"with the cache {cached}\nwithout {plain}"
    assert_nothing_cached(model)


def test_a_write_through_data_between_pipeline_calls_is_seen():
    """`param.data` writes are invisible to the cache's stamp, which is why it lives only inside a scope: the next
    call opens a new one and computes the centers of the weights as they are then."""
    model, classify = image_pipeline("sdpa")
    before = classify(images(2), top_k=None)
    for ff in feedforwards(model):
        ff.centers.data.mul_(2.0)
    after = classify(images(2), top_k=None)
    _, fresh = image_pipeline("sdpa")
    fresh.model.load_state_dict(model.state_dict())
    assert after == fresh(images(2), top_k=None)  # the written weights, as a model built with them answers
    assert after != before, "the write changed nothing: the check above proves nothing"


def test_a_lazy_call_runs_outside_the_scope_so_a_write_between_its_items_is_seen():
    """A generator is answered with an iterator the caller drains later, between steps of its own: its forwards run
    outside `cached_centers`, so a `param.data` write between two items is seen by the next one."""
    model, classify = image_pipeline("sdpa")
    _, reference = image_pipeline("sdpa")
    first, second = images(2)
    stream = iter(classify((image for image in (first, second)), top_k=None))
    assert next(stream) == reference(first, top_k=None)
    for ff in feedforwards(model):
        ff.centers.data.mul_(2.0)
    reference.model.load_state_dict(model.state_dict())
    written = next(stream)
    assert written == reference(second, top_k=None)
    assert_nothing_cached(model)


def test_a_family_with_nothing_to_cache_runs_the_pipeline():
    """A model with neither `cached_centers` nor parametrized weights (Hyper-SET) gets an empty scope: it answers a
    call over several batches."""
    from fixtures import hyperset_config

    from energyformers import HyperSetForImageClassification

    torch.manual_seed(0)
    model = HyperSetForImageClassification(hyperset_config("image", num_channels=3)).eval()
    assert not hasattr(model, "cached_centers")
    classify = pipeline(
        "image-classification",
        model=model,
        image_processor=build_image_processor(model.config),
        pipeline_class=ImageClassificationPipeline,
    )
    assert len(classify(images(2), batch_size=2)) == 2


# ------------------------------------------------------------------------------------------------ evaluate

EVAL_SAMPLES, EVAL_BATCH = 12, 4


@pytest.fixture(scope="module")
def hyperbf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny HyperBF digits classifier saved as `energyformers train` saves one (weights and image processor)."""
    torch.manual_seed(0)
    config = hyperbf_config("image", num_labels=10)
    model = perturb(HyperBFForImageClassification(config), seed=2)
    folder = tmp_path_factory.mktemp("centers") / "hyperbf-digits"
    model.save_pretrained(folder)
    build_image_processor(config).save_pretrained(folder)
    return folder


def evaluate_metrics(folder: Path, capsys) -> dict:
    argv = ["evaluate", str(folder), "--dataset", "digits", "--max_samples", str(EVAL_SAMPLES)]
    argv += ["--per_device_eval_batch_size", str(EVAL_BATCH), "--json"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)["metrics"]


def test_evaluate_computes_the_centers_once_for_the_split_with_the_same_metrics(
    hyperbf_folder, centre_computations, capsys, monkeypatch
):
    cached = evaluate_metrics(hyperbf_folder, capsys)
    once = sorted(centre_computations.values())
    centre_computations.clear()
    without_cache(monkeypatch)
    plain = evaluate_metrics(hyperbf_folder, capsys)
    layers = hyperbf_config("image").num_hidden_layers
    batches = EVAL_SAMPLES // EVAL_BATCH
    # per layer: the check of one batch before scoring (outside the scope), then the scored batches
    assert once == [1 + 1] * layers, f"with the cache: {once}, expected {[2] * layers}"
    assert sorted(centre_computations.values()) == [1 + batches] * layers, dict(centre_computations)
    scores = ("test_loss", "test_accuracy", "test_f1_macro")
    # the same logits from the same keys: the metrics are equal, not close
    assert {k: cached[k] for k in scores} == {k: plain[k] for k in scores}, (cached, plain)


# ------------------------------------------------------------------------------------------- our own loops
# Trainer's evaluation and prediction passes (`DepthTrainer`, `RecipeTrainer`), the Accelerate loop's evaluation and
# `energyformers inspect`'s accuracy hold the scope for their whole pass: one centre computation per layer for all
# the batches, the same outputs as the same loop without the cache.

LOOP_SAMPLES, LOOP_BATCH = 12, 4


class _Rows(torch.utils.data.Dataset):
    """Seeded image rows `{"pixel_values", "labels"}`, as the collators give them."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.pixels = torch.randn(LOOP_SAMPLES, 3, 8, 8, generator=generator)
        self.labels = torch.randint(0, 3, (LOOP_SAMPLES,), generator=generator)

    def __len__(self) -> int:
        return LOOP_SAMPLES

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.pixels[index], "labels": self.labels[index]}


def loop_model() -> HyperBFForImageClassification:
    torch.manual_seed(0)
    return perturb(HyperBFForImageClassification(hyperbf_config("image")), seed=2)


def counted_both_ways(run, centre_computations, monkeypatch) -> tuple[object, object]:
    """`run()` with the cache and without it (`cached_centers` hidden), the computations per layer of each, checked:
    once per layer with it, once per batch without."""
    cached = run()
    once = sorted(centre_computations.values())
    centre_computations.clear()
    without_cache(monkeypatch)
    plain = run()
    batches = LOOP_SAMPLES // LOOP_BATCH
    layers = hyperbf_config("image").num_hidden_layers
    assert once == [1] * layers, f"with the cache: {once} computations per layer, expected 1 each"
    assert sorted(centre_computations.values()) == [batches] * layers, (
        f"without it: {dict(centre_computations)}, expected {batches} (one per batch) per layer"
    )
    return cached, plain


@pytest.mark.parametrize("call", ["evaluate", "predict"])
def test_trainer_evaluation_and_prediction_compute_the_centers_once_per_pass(
    call, centre_computations, monkeypatch, tmp_path
):
    from transformers import TrainingArguments

    from energyformers.training.trainer import DepthTrainer, RecipeTrainer

    # `energyformers train`'s trainer evaluates through the same pass (`evaluation_loop`) as this one
    assert DepthTrainer.evaluation_loop is RecipeTrainer.evaluation_loop
    model = loop_model()
    arguments = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=LOOP_BATCH,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    trainer = DepthTrainer(model=model, args=arguments, call_arguments={})

    def run():
        if call == "evaluate":
            return trainer.evaluate(_Rows())["eval_loss"]
        return trainer.predict(_Rows()).predictions

    cached, plain = counted_both_ways(run, centre_computations, monkeypatch)
    assert np.array_equal(cached, plain), f"with the cache {cached}\nwithout {plain}"
    assert_nothing_cached(model)


def test_accelerate_loop_evaluation_computes_the_centers_once_through_a_wrapper(
    centre_computations, monkeypatch
):
    """The loop's model may be wrapped (DDP): `centers_scope` finds the HyperBF model inside the wrapper."""
    from energyformers.training.accelerate_loop import evaluate_split

    class Wrapper(torch.nn.Module):  # as DDP: forwards the call, offers no `cached_centers`
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

        def forward(self, **inputs):
            return self.module(**inputs)

    class Gather:  # one process: `gather_for_metrics` hands back what it gets
        device = torch.device("cpu")

        def gather_for_metrics(self, values):
            return values

    model = loop_model()
    wrapped = Wrapper(model)
    loader = torch.utils.data.DataLoader(_Rows(), batch_size=LOOP_BATCH)
    cached, plain = counted_both_ways(
        lambda: evaluate_split(wrapped, loader, Gather(), "classification"), centre_computations, monkeypatch
    )
    assert cached == plain, f"with the cache {cached}\nwithout {plain}"
    assert_nothing_cached(model)


def test_centers_scope_covers_every_hyperbf_model_of_a_container(centre_computations):
    """A container of several HyperBF models (an ensemble, a teacher and its student evaluated in one loop), itself
    without `cached_centers`: the scope covers each model inside, so every layer of each computes its centers once
    for all the forwards, and nothing is left cached after it."""

    class Ensemble(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.members = torch.nn.ModuleList([loop_model(), loop_model()])

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            logits = [member(pixel_values=pixel_values).logits for member in self.members]
            return sum(logits) / len(logits)

    ensemble = Ensemble().eval()
    pixels = _Rows().pixels[:LOOP_BATCH]
    forwards = 3
    with torch.no_grad(), centers_scope(ensemble):
        for _ in range(forwards):
            ensemble(pixels)
    per_model = [{id(ff): centre_computations[id(ff)] for ff in feedforwards(m)} for m in ensemble.members]
    assert per_model == [{id(ff): 1 for ff in feedforwards(m)} for m in ensemble.members], (
        f"computations per layer of each model over {forwards} forwards: {per_model}, expected 1 each"
    )
    for member in ensemble.members:
        assert_nothing_cached(member)


def test_inspect_accuracy_computes_the_centers_once(centre_computations, monkeypatch):
    from energyformers.training.inspect import accuracy

    model = loop_model().eval()
    rows = _Rows()
    batches = [
        ({"pixel_values": rows.pixels[start : start + LOOP_BATCH]}, rows.labels[start : start + LOOP_BATCH])
        for start in range(0, LOOP_SAMPLES, LOOP_BATCH)
    ]
    cached, plain = counted_both_ways(lambda: accuracy(model, batches), centre_computations, monkeypatch)
    assert cached == plain, f"with the cache {cached}, without {plain}"


# ------------------------------------------------------------------------------------- iMixer's parametrizations
# iMixer's spectrally normalised weights are `torch.nn.utils.parametrize` parametrizations: every read of
# `fc_sn*.weight` computes W / max(1, σ/c) (`IMixerSpectralNorm.forward`), once per forward. `centers_scope` caches
# none of it: counted here per parametrization module in no-grad eval forwards.


@pytest.fixture
def normalisations(monkeypatch) -> Counter:
    """Per `IMixerSpectralNorm` (its id), how often it computed its weight in a no-grad eval forward."""
    counts: Counter = Counter()
    compute = IMixerSpectralNorm.forward

    def counted(self, weight):
        if not self.training and not torch.is_grad_enabled():
            counts[id(self)] += 1
        return compute(self, weight)

    monkeypatch.setattr(IMixerSpectralNorm, "forward", counted)
    return counts


def spectral_norms(model: torch.nn.Module) -> list[IMixerSpectralNorm]:
    return [module for module in model.modules() if isinstance(module, IMixerSpectralNorm)]


def imixer_image_model(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return perturb(IMixerForImageClassification(imixer_config("image", **overrides)), seed=2).eval()


def test_imixer_eval_forwards_inside_centers_scope_normalise_each_weight_at_every_forward(normalisations):
    """Inside the scope as outside: each forward computes W / max(1, σ/c) from the weights as they are, so a `.data`
    write inside the scope is seen by the next forward."""
    model = imixer_image_model()
    norms = spectral_norms(model)
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), centers_scope(model):
        before = model(pixel_values=x).logits
        weight = model.imixer.layers[0].token_mixing.fc_sn1.parametrizations.weight.original
        weight.data.mul_(0.5)
        after = model(pixel_values=x).logits
        assert dict(normalisations) == {id(n): 2 for n in norms}, f"inside the scope: {dict(normalisations)}"
    reference = imixer_image_model()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = reference(pixel_values=x).logits
    assert torch.equal(after, expected), f"max |diff| = {(after - expected).abs().max().item():.3g}"
    assert not torch.equal(after, before), "the write changed nothing: the check above proves nothing"


@pytest.mark.parametrize("batch_size", [1, 4])
def test_one_imixer_pipeline_call_normalises_each_weight_at_every_batch(batch_size, normalisations):
    model = imixer_image_model(num_channels=3)
    classify = pipeline(
        "image-classification",
        model=model,
        image_processor=build_image_processor(model.config),
        pipeline_class=ImageClassificationPipeline,
    )
    norms = spectral_norms(model)
    classify(images(), batch_size=batch_size, top_k=None)
    batches = -(-IMAGES // batch_size)
    assert dict(normalisations) == {id(n): batches for n in norms}, (
        f"{dict(normalisations)}, expected {batches} per weight (one per batch)"
    )


@pytest.fixture(scope="module")
def imixer_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny iMixer digits classifier saved as `energyformers train` saves one (weights and image processor)."""
    torch.manual_seed(0)
    config = imixer_config("image", num_labels=10, num_channels=3)
    model = perturb(IMixerForImageClassification(config), seed=2)
    folder = tmp_path_factory.mktemp("centers") / "imixer-digits"
    model.save_pretrained(folder)
    build_image_processor(config).save_pretrained(folder)
    return folder


def test_evaluate_normalises_each_imixer_weight_at_every_batch(imixer_folder, normalisations, capsys):
    evaluate_metrics(imixer_folder, capsys)
    weights = 2 * imixer_config("image").num_hidden_layers
    batches = EVAL_SAMPLES // EVAL_BATCH
    # per weight: the check of one batch before scoring, then the scored batches
    assert sorted(normalisations.values()) == [1 + batches] * weights, dict(normalisations)
