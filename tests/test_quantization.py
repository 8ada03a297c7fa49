"""Post-training int8 quantization runs every family's forward, with the quantized weights, as close to float as a
same-size ViT / BERT gets under the same scheme.

* A tensor-subclass weight that implements the matmul only (what torchao's are; a stand-in runs without torchao).
* torchao and quanto through transformers (`from_pretrained(..., quantization_config=TorchAoConfig(
  Int8WeightOnlyConfig()))`, `QuantoConfig(weights="int8")`): their Linears hold the weight as a tensor subclass.
  The quantized model must give the logits of a float copy
  whose Linears hold the dequantized weights, to float rounding: every use of a weight (Hyper-SET's tied Wᵀ and
  Dᵀ, HyperBF's folded values included) sees the quantized one, and none crashes on the subclass.
* `torch.ao.quantization.quantize_dynamic` (int8 weights, activations quantized per call): its gap to float must
  stay within a few times the gap of a same-size ViT (images) or BERT (sequences) under the same call. iMixer's
  spectrally normalised fc_sn1 / fc_sn2 are parametrized Linears, which torch cannot convert: they are left out by
  name, as docs/usage.md ("Quantization and ONNX") says; quanto leaves them out with `modules_to_not_convert`, which
  iMixer's refusal of a replaced fc_sn1 names.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable

import pytest
import torch
import transformers
from fixtures import (
    ALL,
    BASELINE_TINY,
    assert_differs,
    in_ci,
    main_output,
    perturb,
    rounding,
    step_once,
    tiny_mim_model,
)
from torch import nn
from torch.ao.quantization import quantize_dynamic

from energyformers import LoopedTransformerForImageClassification, LoopedTransformerForSequenceClassification

try:
    from torchao.quantization import Int8WeightOnlyConfig
except ImportError:  # its own extra (pyproject.toml, `quantization`, which says why it is not in dev)
    Int8WeightOnlyConfig = None
try:
    import optimum.quanto  # noqa: F401  (transformers' QuantoConfig)

    QUANTO = True
except ImportError:  # a dev extra too
    if in_ci():
        raise
    QUANTO = False

pytestmark = [
    # transformers' torchao quantizer warns that torchao's CPU kernels are slow; the dynamic quantizer is deprecated
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


@dataclasses.dataclass(frozen=True)
class Subject:
    """A tiny model of one family and input type, trained one step, and its inputs."""

    name: str
    input_type: str
    build: Callable[[], nn.Module]
    inputs: Callable[..., dict[str, torch.Tensor]]

    def __str__(self) -> str:
        return self.name


def trained(build: Callable[[], nn.Module], inputs: Callable[..., dict[str, torch.Tensor]]) -> nn.Module:
    """Perturbed and one SGD step: the zero-initialised step sizes and classifiers carry signal."""
    return step_once(perturb(build()), inputs(labels=True))


def family_subjects() -> list[Subject]:
    heads = [
        case
        for case in ALL
        if case.auto_name in ("AutoModelForImageClassification", "AutoModelForSequenceClassification")
    ]
    subjects = [Subject(str(case), case.input_type, case.build, case.inputs) for case in heads]
    for model_class, input_type in (
        (LoopedTransformerForImageClassification, "image"),
        (LoopedTransformerForSequenceClassification, "sequence"),
    ):
        hyperset = next(s for s in subjects if s.name.startswith("HyperSet") and s.input_type == input_type)

        def build(model_class: type = model_class, input_type: str = input_type) -> nn.Module:
            torch.manual_seed(0)
            return model_class(BASELINE_TINY["looped-transformer"].config(input_type)).eval()

        subjects.append(Subject(f"{model_class.__name__}-{input_type}", input_type, build, hyperset.inputs))
    return subjects


SUBJECTS = family_subjects()


def baseline(subject: Subject) -> nn.Module:
    """A ViT (images) or BERT (sequences) of the tiny width 16, 4 heads and 2 layers, on the subject's inputs."""
    inputs = subject.inputs()
    size = dict(
        hidden_size=16, num_attention_heads=4, intermediate_size=24, num_hidden_layers=2, num_labels=4
    )
    torch.manual_seed(0)
    if subject.input_type == "image":
        _, channels, height, _ = inputs["pixel_values"].shape
        config = transformers.ViTConfig(**size, image_size=height, patch_size=2, num_channels=channels)
        return transformers.ViTForImageClassification(config).eval()
    vocab = int(inputs["input_ids"].max()) + 1
    length = inputs["input_ids"].shape[1]
    config = transformers.BertConfig(**size, vocab_size=vocab, max_position_embeddings=length)
    return transformers.BertForSequenceClassification(config).eval()


def relative_gap(got: torch.Tensor, reference: torch.Tensor) -> float:
    return float((got - reference).norm() / reference.norm())


def logits(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return main_output(model(**inputs))


def is_quantized_weight(weight: torch.Tensor) -> bool:
    return type(weight) not in (torch.Tensor, nn.Parameter)


# iMixer's spectrally normalised fc_sn1 / fc_sn2 stay float: its forward refuses them replaced (quanto's QLinear);
# torchao leaves a parametrized Linear's weight float by itself
CONTRACTIVE = ["fc_sn1", "fc_sn2"]


def weight_only_int8(
    scheme: str, subject: Subject
) -> transformers.utils.quantization_config.QuantizationConfigMixin:
    if scheme == "torchao":
        return transformers.TorchAoConfig(Int8WeightOnlyConfig())
    keep = CONTRACTIVE if subject.name.startswith("IMixer") else None
    return transformers.QuantoConfig(weights="int8", modules_to_not_convert=keep)


def auto_class(subject: Subject) -> type:
    if subject.input_type == "image":
        return transformers.AutoModelForImageClassification
    return transformers.AutoModelForSequenceClassification


@pytest.mark.parametrize("subject", SUBJECTS, ids=str)
@pytest.mark.parametrize("scheme", ["torchao", "quanto"])
def test_int8_weight_only_forward_uses_the_quantized_weights(scheme, subject, tmp_path):
    if scheme == "quanto" and not QUANTO:
        pytest.skip("optimum-quanto is not installed: pip install -e '.[dev]'")
    if scheme == "torchao" and Int8WeightOnlyConfig is None:
        # the stand-in test below covers what torchao's weights need of the model
        pytest.skip("torchao is not installed: pip install -e '.[quantization]'")
    inputs = subject.inputs()
    trained(subject.build, subject.inputs).save_pretrained(tmp_path)
    auto = auto_class(subject)
    quantized = auto.from_pretrained(tmp_path, quantization_config=weight_only_int8(scheme, subject)).eval()
    # both hold a quantized Linear's weight as a tensor subclass that dequantizes
    weights = {
        name: module.weight.dequantize()
        for name, module in quantized.named_modules()
        if isinstance(module, nn.Linear) and is_quantized_weight(module.weight)
    }
    assert weights, f"{subject}: {scheme} quantized no Linear"
    got = logits(quantized, inputs)

    reference = auto.from_pretrained(tmp_path).eval()
    float_logits = logits(reference, inputs)
    with torch.no_grad():
        for name, weight in weights.items():
            reference.get_submodule(name).weight.copy_(weight)
    expected = logits(reference, inputs)
    assert_differs(
        expected, float_logits, f"{subject}: the dequantized weights"
    )  # the test sees the quantization
    # the same float32 model but for the order of some sums (the quantized matmul; Hyper-SET's tied Wᵀ as
    # module(I) − module(0), exact; HyperBF's values called rather than folded): a few roundings of the logits
    bound = rounding(torch.float32, 32)
    gap = relative_gap(got, expected)
    assert gap <= bound, (
        f"{subject}: {scheme} int8 vs float with the dequantized weights: rel {gap:.3g} > {bound:.3g}"
    )


def test_imixer_refusal_of_a_quantized_contractive_block_names_the_quantizer_setting(tmp_path):
    if not QUANTO:
        pytest.skip("optimum-quanto is not installed: pip install -e '.[dev]'")
    subject = next(s for s in SUBJECTS if s.name.startswith("IMixer") and s.input_type == "image")
    trained(subject.build, subject.inputs).save_pretrained(tmp_path)
    config = transformers.QuantoConfig(weights="int8")
    quantized = auto_class(subject).from_pretrained(tmp_path, quantization_config=config).eval()
    setting = re.escape("modules_to_not_convert=['fc_sn1', 'fc_sn2']")
    with pytest.raises(ValueError, match=rf"fc_sn1 is a optimum\.quanto\..*{setting}"):
        quantized(**subject.inputs())


class ViewlessWeight(torch.Tensor):
    """Stands in for torchao's `Int8Tensor` weight without torchao: a tensor subclass that `F.linear` takes and
    whose view ops are not implemented (torchao's dispatch raises NotImplementedError for them)."""

    REFUSED = frozenset(
        {"t", "unflatten", "view", "transpose", "flatten", "reshape", "permute", "__getitem__"}
    )

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in cls.REFUSED:
            raise NotImplementedError(f"{name} of a quantized weight")
        with torch._C.DisableTorchFunctionSubclass():  # results are plain tensors
            return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("subject", SUBJECTS, ids=str)
def test_linears_with_a_tensor_subclass_weight_are_called_not_read(subject):
    """Every Linear's weight as a tensor subclass of the same values: the forward calls the modules (Hyper-SET's
    tied Wᵀ from module calls, HyperBF's values unfolded) and gives the float logits."""
    inputs = subject.inputs()
    model = trained(subject.build, subject.inputs)
    expected = logits(model, inputs)
    replaced = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            weight = module.weight.detach().as_subclass(ViewlessWeight)
            del module.weight  # a plain attribute now, as a quantizer's weight need not be a Parameter
            module.weight = weight
            replaced += 1
    assert replaced, f"{subject}: no plain Linear"
    got = logits(model, inputs)
    # the same values: Hyper-SET's W = module(I) − module(0) is exact in float32; HyperBF's explicit values path
    # sums in another order than the folded one: a few roundings
    bound = rounding(torch.float32, 32)
    gap = relative_gap(got, expected)
    assert gap <= bound, f"{subject}: subclass weights vs float: rel {gap:.3g} > {bound:.3g}"


def dynamic_int8(model: nn.Module) -> nn.Module:
    """`quantize_dynamic` over the Linears torch can convert: by name, leaving out parametrized ones (iMixer's
    spectrally normalised fc_sn1 / fc_sn2), which it refuses."""
    names = {name for name, module in model.named_modules() if type(module) is nn.Linear}
    return quantize_dynamic(model, names, dtype=torch.qint8)


@functools.cache
def baseline_gap(name: str) -> float:
    """The relative logit gap `quantize_dynamic` gives the same-size baseline of the subject `name`."""
    subject = next(s for s in SUBJECTS if s.name == name)
    inputs = subject.inputs()
    model = trained(
        lambda: baseline(subject), lambda labels=False: {**inputs, **subject_labels(subject, labels)}
    )
    reference = logits(model, inputs)
    return relative_gap(logits(quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8), inputs), reference)


def subject_labels(subject: Subject, labels: bool) -> dict[str, torch.Tensor]:
    """The subject's labels, clamped to the baseline's 4 classes."""
    return {"labels": subject.inputs(labels=True)["labels"] % 4} if labels else {}


# Under the same call the families' gaps and the baselines' differ by their depth of quantized products (a
# recurrent model runs its Linears at every iteration): 4× leaves room for that, far below a weight that is read as
# float or a product that is wrong (gaps near 1).
BASELINE_FACTOR = 4.0


@pytest.mark.parametrize("subject", SUBJECTS, ids=str)
def test_quantize_dynamic_forward_is_as_close_as_a_same_size_baseline(subject):
    inputs = subject.inputs()
    model = trained(subject.build, subject.inputs)
    reference = logits(model, inputs)
    quantized = dynamic_int8(model)
    converted = [name for name, module in quantized.named_modules() if type(module).__name__ == "Linear"]
    assert any("quantized" in type(quantized.get_submodule(n)).__module__ for n in converted), (
        f"{subject}: quantize_dynamic converted no Linear"
    )
    got = logits(quantized, inputs)
    assert_differs(got, reference, f"{subject}: dynamic int8")
    gap, allowed = relative_gap(got, reference), BASELINE_FACTOR * baseline_gap(subject.name)
    assert gap <= allowed, (
        f"{subject}: dynamic int8 rel gap {gap:.3g} > {BASELINE_FACTOR}× the same-size baseline's "
        f"{baseline_gap(subject.name):.3g}"
    )


def test_maskgit_decoding_of_a_dynamic_int8_model_runs_on_its_device():
    """`decode` takes the device to decode on from the model, not from a Linear's `.weight` (a method after
    `quantize_dynamic`), and fills every [MASK] with a code of the codebook."""
    model = dynamic_int8(tiny_mim_model("hyperset").eval())
    codes = torch.randint(0, 8, (2, 16), generator=torch.Generator().manual_seed(0))
    codes[:, ::2] = model.mask_token_id
    with torch.no_grad():
        decoded = model.decode(codes, steps=3, seed=0).codes
    assert ((decoded >= 0) & (decoded < model.mask_token_id)).all(), decoded
    assert torch.equal(decoded[:, 1::2], codes[:, 1::2]), "known codes changed"
