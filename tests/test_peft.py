"""PEFT (LoRA) adapters act wherever they are put, and `merge_and_unload()` gives the model that was adapted.

Every Linear, Conv2d and Embedding of every family (and of the looped baseline) is wrapped on its own with a LoRA
adapter whose zero-initialised factor is made nonzero: the logits must change (no forward reads the raw `.weight`
past the wrapper), and the merged model must give the adapted logits. iMixer's spectrally normalised fc_sn1 /
fc_sn2 are refused instead (docs/usage.md, "Fine-tuning with PEFT (LoRA)").
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest
import torch
from fixtures import (
    ALL,
    BASELINE_TINY,
    Case,
    DispatchedOps,
    assert_close_to_scale,
    assert_differs,
    in_ci,
    main_output,
    perturb,
    rounding,
)
from torch import nn

from energyformers import (
    HyperBFForImageClassification,
    HyperSetForImageClassification,
    IMixerForImageClassification,
    IMixerForSequenceClassification,
    LoopedTransformerForImageClassification,
    LoopedTransformerForSequenceClassification,
)

try:
    import peft
except ImportError:  # a dev extra (pyproject.toml); only an environment installed before it lacks it
    if in_ci():
        raise
    pytest.skip("peft is not installed: pip install -e '.[dev]'", allow_module_level=True)

# PEFT's own call of a deprecated transformers property, at every wrapped model's forward
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

ADAPTABLE = (nn.Linear, nn.Conv2d, nn.Embedding)  # the module types PEFT's LoRA wraps
CONTRACTIVE = (
    "fc_sn1",
    "fc_sn2",
)  # iMixer's F: refused (test_imixer_refuses_adapters_on_its_contractive_block)


@dataclasses.dataclass(frozen=True)
class Subject:
    """A tiny model to adapt: its name, how to build it and its inputs."""

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], dict[str, torch.Tensor]]
    covers: Callable[[str, nn.Module], bool]  # (path, module) -> whether this subject adapts it


def every_module(path: str, module: nn.Module) -> bool:
    return True


def embeddings(path: str, module: nn.Module) -> bool:
    return isinstance(module, nn.Embedding)


def tied(path: str, module: nn.Module) -> bool:
    return path.endswith((".qkv_proj", ".dictionary"))


def of_case(
    model_class: type, covers: Callable[[str, nn.Module], bool] = every_module, **overrides
) -> Subject:
    case = Case.of(model_class)
    suffix = "".join(f"-{key}={value}" for key, value in overrides.items())
    return Subject(f"{case}{suffix}", lambda: case.build(**overrides), case.inputs, covers)


def of_baseline(
    model_class: type, input_type: str, covers: Callable[[str, nn.Module], bool] = every_module, **overrides
) -> Subject:
    """The looped baseline, which embeds as Hyper-SET and takes Hyper-SET's inputs."""
    tiny = BASELINE_TINY["looped-transformer"]
    inputs = next(
        c for c in ALL if c.family == "hyperset" and c.input_type == input_type and not c.is_base
    ).inputs

    def build() -> nn.Module:
        torch.manual_seed(0)
        return model_class(tiny.config(input_type, **overrides)).eval()

    return Subject(f"{model_class.__name__}-{input_type}", build, inputs, covers)


def sequence_head(family: str) -> type:
    return next(
        c.model_class for c in ALL if c.family == family and c.auto_name.endswith("SequenceClassification")
    )


# Image heads: every adaptable module. Sequence heads: their embeddings (the rest is the image heads' code).
# Hyper-SET's other energies: their tied projections. Learned positions: Hyper-SET's sequence table.
SUBJECTS = [
    *(of_case(c.model_class) for c in ALL if c.auto_name == "AutoModelForImageClassification"),
    of_baseline(LoopedTransformerForImageClassification, "image"),
    of_case(HyperSetForImageClassification, tied, attention_energy="linear", feature_map="elu+1"),
    of_case(HyperSetForImageClassification, tied, feedforward_energy="gated", feature_map="silu"),
    of_case(sequence_head("hyperset"), embeddings, position_embedding_type="learned"),
    of_case(sequence_head("hyperbf"), embeddings),
    of_case(sequence_head("imixer"), embeddings),
    of_baseline(
        LoopedTransformerForSequenceClassification, "sequence", embeddings, position_embedding_type="learned"
    ),
]


def targets(subject: Subject) -> list[str]:
    """The target names of the subject's adaptable modules: the module path past `layers.N.` (one name for a
    module of every layer), or the whole path for a module outside the layers."""
    model = subject.build()
    names = set()
    for path, module in model.named_modules():
        adaptable = isinstance(module, ADAPTABLE) and path.rsplit(".", 1)[-1] not in CONTRACTIVE
        if adaptable and subject.covers(path, module):
            names.add(re.sub(r"^.*\blayers\.\d+\.", "", path))
    return sorted(names)


CASES = [(subject, target) for subject in SUBJECTS for target in targets(subject)]


def adapted(model: nn.Module, config: peft.LoraConfig, seed: int = 3) -> peft.PeftModel:
    """`model` with `config`'s adapter, its zero-initialised factors (B; an embedding's A) drawn N(0, 0.5²), so
    the adapter changes the weights it wraps."""
    wrapped = peft.get_peft_model(model, config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if re.search(r"lora_B|lora_embedding_A", name):
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=g))
    return wrapped


def logits(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return main_output(model(**inputs)).clone()


# The merged weight W + s·BA rounds each entry once where the adapted model adds the two products, and those
# roundings pass through every chained product of the forward: a sum over at most 64 terms (the widest layer of
# the tiny configs) in each of at most 16 chained weight applications (layers × iterations or fixed-point steps).
MERGE_TOLERANCE = rounding(torch.float32, 64 * 16)


@pytest.mark.parametrize(("subject", "target"), CASES, ids=[f"{s.name}-{t}" for s, t in CASES])
def test_an_adapter_changes_the_logits_and_merging_gives_the_adapted_model(subject: Subject, target: str):
    inputs = subject.inputs()
    model = perturb(subject.build())
    plain = logits(model, inputs)
    wrapped = adapted(model, peft.LoraConfig(r=2, target_modules=[target]))
    assert wrapped.targeted_module_names, f"{target} wrapped nothing"
    with_adapter = logits(wrapped, inputs)
    assert_differs(with_adapter, plain, f"{subject.name}: LoRA on {target}", beyond_allclose=True)
    merged = logits(wrapped.merge_and_unload(), inputs)
    assert_close_to_scale(
        merged, with_adapter, MERGE_TOLERANCE, f"{subject.name}: merged vs adapted ({target})"
    )


def test_hyperset_reads_a_wrapped_tied_weight_once_per_layer_and_forward():
    # (module(I) − module(0))ᵀ is built beside the weight-only products, not at each of the T iterations; a plain
    # Linear builds nothing
    case = Case.of(HyperSetForImageClassification)
    inputs, model = case.inputs(), perturb(case.build())

    def identities(model: nn.Module) -> int:
        with torch.no_grad(), DispatchedOps() as probe:
            model(**inputs)
        return sum(str(func.overloadpacket) == "aten.eye" for func in probe.funcs)

    assert identities(model) == 0
    wrapped = adapted(model, peft.LoraConfig(r=2, target_modules=["qkv_proj", "dictionary"]))
    layers, iterations = model.config.num_hidden_layers, model.config.num_iterations
    built = identities(wrapped)
    assert iterations > 1 and built == 2 * layers, (
        f"{built} built; 2 per layer expected ({layers} layers, T = {iterations})"
    )


HYPERSET_HEADS = [HyperSetForImageClassification, sequence_head("hyperset")]


# PEFT's own warning at get_peft_model: a LoRA bias on a bias-free layer cannot be merged
@pytest.mark.filterwarnings("ignore:`lora_bias=True` was passed")
@pytest.mark.parametrize("target", ["qkv_proj", "dictionary"])
@pytest.mark.parametrize("model_class", HYPERSET_HEADS, ids=lambda c: c.__name__)
def test_hyperset_refuses_a_lora_bias_on_its_tied_projections(model_class: type, target: str):
    # the tie has no place for the adapter's offset module(0) (W_eff drops it), and no merged model holds it: PEFT
    # refuses to merge a LoRA bias into a bias-free layer. Refused at the first forward, the bias still zero
    case = Case.of(model_class)
    wrapped = peft.get_peft_model(
        perturb(case.build()), peft.LoraConfig(r=2, target_modules=[target], lora_bias=True)
    )
    with pytest.raises(ValueError, match=rf"tied {target} is a peft\..*lora_bias=True.*exclude_modules"):
        wrapped(**case.inputs())
    # the base model through the wrapper, adapters off: nothing to refuse
    with wrapped.disable_adapter():
        assert torch.isfinite(logits(wrapped, case.inputs())).all()


@pytest.mark.filterwarnings("ignore:`lora_bias=True` was passed")
@pytest.mark.parametrize("model_class", HYPERSET_HEADS, ids=lambda c: c.__name__)
def test_hyperset_lora_bias_without_its_tied_projections_merges_into_the_adapted_model(model_class: type):
    # what the refusal advises: lora_bias on the Linears that have a bias, the tied ones left out
    case = Case.of(model_class)
    inputs = case.inputs()
    model = perturb(case.build())
    config = peft.LoraConfig(
        r=2, target_modules="all-linear", exclude_modules=["qkv_proj", "dictionary"], lora_bias=True
    )
    wrapped = adapted(model, config)
    assert wrapped.targeted_module_names, "all-linear wrapped nothing"
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        biases = [p for name, p in wrapped.named_parameters() if re.search(r"lora_B\..*\.bias$", name)]
        assert biases, "no LoRA bias was created"
        for bias in biases:  # zero-initialised: drawn so that merging them is tested
            bias.copy_(0.5 * torch.randn(bias.shape, generator=g))
    with_adapter = logits(wrapped, inputs)
    merged = logits(wrapped.merge_and_unload(), inputs)
    assert_close_to_scale(merged, with_adapter, MERGE_TOLERANCE, f"{case}: merged vs adapted (lora_bias)")


def test_hyperbf_values_adapter_gives_the_same_logits_under_every_attention_implementation():
    # sdpa folds the feedforward into one attention call over the values' tensors; with `values` wrapped it runs
    # the explicit path as eager does, so both give the adapted model: the same sums in at most 32-term products
    case = Case.of(HyperBFForImageClassification)
    inputs = case.inputs()
    wrapped = adapted(perturb(case.build()), peft.LoraConfig(r=2, target_modules=["values"]))
    results = {}
    for implementation in ("eager", "sdpa"):
        wrapped.base_model.model.set_attn_implementation(implementation)
        results[implementation] = logits(wrapped, inputs)
    assert_close_to_scale(results["sdpa"], results["eager"], rounding(torch.float32, 32 * 4), "sdpa vs eager")


@pytest.mark.parametrize("model_class", [IMixerForImageClassification, IMixerForSequenceClassification])
def test_imixer_refuses_adapters_on_its_contractive_block(model_class: type):
    case = Case.of(model_class)
    inputs = case.inputs()
    wrapped = adapted(perturb(case.build()), peft.LoraConfig(r=2, target_modules=["fc_sn2"]))
    with pytest.raises(
        ValueError, match=r"layers\.0\.token_mixing\.fc_sn2 is a peft\..*‖W‖₂.*exclude_modules"
    ):
        wrapped(**inputs)
    # without the spectral norm too: the solver reads F's weights as tensors whatever keeps them small
    unnormalised = adapted(
        perturb(case.build(contractive_normalization="none")), peft.LoraConfig(r=2, target_modules=["fc_sn1"])
    )
    with pytest.raises(
        ValueError, match=r"layers\.0\.token_mixing\.fc_sn1 is a peft\..*ignored.*exclude_modules"
    ):
        unnormalised(**inputs)
    # what the message advises: every other Linear adapted, F left alone
    config = peft.LoraConfig(r=2, target_modules="all-linear", exclude_modules=list(CONTRACTIVE))
    wrapped = adapted(perturb(case.build()), config)
    assert not any(name.endswith(CONTRACTIVE) for name in wrapped.targeted_module_names)
    assert torch.isfinite(logits(wrapped, inputs)).all()


def test_a_trainer_run_trains_only_the_adapter_and_the_saved_adapter_reloads(tmp_path):
    # Hyper-SET's tied projection and dictionary: trained through both of their uses, so the merged model is the
    # trained one; the base weights stay as they were
    from transformers import Trainer, TrainingArguments

    case = Case.of(HyperSetForImageClassification)
    batches = [case.inputs(labels=True, seed=seed) for seed in range(4)]
    examples = [
        {key: value[i] for key, value in batch.items()}
        for batch in batches
        for i in range(len(batch["labels"]))
    ]
    model = perturb(case.build())
    base = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    config = peft.LoraConfig(r=2, target_modules=["qkv_proj", "dictionary", "classifier"])
    wrapped = peft.get_peft_model(model, config)
    before = {name: p.detach().clone() for name, p in wrapped.named_parameters() if p.requires_grad}
    assert before and all("lora_" in name for name in before), sorted(before)
    arguments = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=3,
        max_steps=4,
        learning_rate=0.05,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        remove_unused_columns=False,
        label_names=["labels"],
    )
    Trainer(model=wrapped, args=arguments, train_dataset=examples).train()
    wrapped.eval()
    changed = [
        name for name, p in wrapped.named_parameters() if name in before and not torch.equal(p, before[name])
    ]
    assert sorted(changed) == sorted(before), (
        f"adapter parameters left as they were: {set(before) - set(changed)}"
    )
    inner = wrapped.get_base_model().state_dict()
    moved = [
        name for name, tensor in base.items() if not torch.equal(inner[_wrapped_key(name, inner)], tensor)
    ]
    assert moved == [], f"base parameters changed by training: {moved}"

    inputs = case.inputs(seed=9)
    trained = logits(wrapped, inputs)
    wrapped.save_pretrained(tmp_path / "adapter")
    reloaded = peft.PeftModel.from_pretrained(perturb(case.build()), tmp_path / "adapter").eval()
    # the same weights and the same products in the same order
    torch.testing.assert_close(logits(reloaded, inputs), trained, rtol=0, atol=0)
    merged = logits(wrapped.merge_and_unload(), inputs)
    assert_close_to_scale(merged, trained, MERGE_TOLERANCE, "merged vs trained adapter")


@pytest.mark.parametrize("schedule", ["per_forward", "per_optimizer_step", "per_call"])
def test_imixer_adapter_training_leaves_the_base_estimates_so_base_and_adapter_are_the_trained_model(
    tmp_path, schedule
):
    """Training forwards refine only the σ estimates (u, v buffers) of weights that require grad: under an adapter
    F's weights are frozen, so the base's u, v stay as they were and the adapter file, which holds no buffers,
    reloaded onto the base gives the trained model's logits exactly (its merge too, to rounding)."""
    case = Case.of(IMixerForSequenceClassification)

    def base() -> nn.Module:
        return perturb(case.build(spectral_norm_schedule=schedule))

    model = base()
    start = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    wrapped = adapted(model, peft.LoraConfig(r=2, target_modules=["fc1", "fc2", "classifier"]))
    optimizer = torch.optim.SGD([p for p in wrapped.parameters() if p.requires_grad], lr=0.1)
    wrapped.train()
    for seed in range(3):
        wrapped(**case.inputs(labels=True, seed=seed)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    wrapped.eval()
    inner = wrapped.get_base_model().state_dict()
    moved = {
        name: (inner[_wrapped_key(name, inner)] - tensor).abs().max().item()
        for name, tensor in start.items()
        if not torch.equal(inner[_wrapped_key(name, inner)], tensor)
    }
    assert moved == {}, f"{schedule}: base tensors changed by training (max |change|): {moved}"

    inputs = case.inputs(seed=9)
    trained = logits(wrapped, inputs)
    # what the adapter file holds, put on a fresh base: the same weights and buffers, the same products in the
    # same order
    fresh = peft.get_peft_model(base(), wrapped.peft_config["default"]).eval()
    peft.set_peft_model_state_dict(fresh, peft.get_peft_model_state_dict(wrapped))
    torch.testing.assert_close(logits(fresh, inputs), trained, rtol=0, atol=0)
    # through the file: tensors loaded from safetensors may sit at another alignment, where BLAS sums in another
    # order, so to rounding (the merge's bound covers it); the merge of the reloaded model likewise
    wrapped.save_pretrained(tmp_path / "adapter")
    reloaded = peft.PeftModel.from_pretrained(base(), tmp_path / "adapter").eval()
    assert_close_to_scale(logits(reloaded, inputs), trained, MERGE_TOLERANCE, f"{schedule}: reloaded adapter")
    merged = logits(reloaded.merge_and_unload(), inputs)
    assert_close_to_scale(merged, trained, MERGE_TOLERANCE, f"{schedule}: merged vs trained adapter")


def _wrapped_key(name: str, state: dict[str, torch.Tensor]) -> str:
    """The key of base parameter `name` inside the PEFT-wrapped model (`….base_layer.weight` when wrapped)."""
    if name in state:
        return name
    module, _, leaf = name.rpartition(".")
    return f"{module}.base_layer.{leaf}"
