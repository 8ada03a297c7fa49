"""transformers idioms every model follows as ViT's and BERT's do (an audit against ViT, BERT and ConvNext):

* the base models take `add_pooling_layer=False`, directly and through `from_pretrained`, and then return no
  `pooler_output`; the heads keep their pooler;
* every model pickles (`pickle`, `torch.save(model)`) to the same outputs bit for bit, iMixer's spectrally
  normalised layers included, and `copy.deepcopy` still copies it.

iMixer's own idioms (sequence outputs at the input positions, `output_attentions` accepted):
tests/test_modeling_imixer.py.
"""

from __future__ import annotations

import copy
import io
import pickle
from dataclasses import dataclass

import pytest
import torch
import transformers
from fixtures import ALL, Case, looped_transformer_config, main_output, perturb
from torch.nn.utils import parametrize

from energyformers import BASELINES


@dataclass(frozen=True)
class Built:
    """A model class of a family or of the looped baseline, with its tiny config and inputs."""

    name: str
    model_class: type
    config: transformers.PretrainedConfig
    inputs: dict

    def __str__(self) -> str:
        return self.name

    def build(self, **kwargs: object) -> torch.nn.Module:
        torch.manual_seed(0)
        return perturb(self.model_class(self.config, **kwargs)).eval()


def _looped(auto_name: str, input_type: str) -> Built:
    # the baseline shares the inputs of Hyper-SET, the family it is measured against
    model_class = BASELINES["looped-transformer"].heads[auto_name]
    inputs = Case("hyperset", "AutoModel", input_type).inputs()
    return Built(
        f"{model_class.__name__}-{input_type}", model_class, looped_transformer_config(input_type), inputs
    )


MODELS = [Built(str(case), case.model_class, case.config(), case.inputs()) for case in ALL] + [
    _looped("AutoModel", "image"),
    _looped("AutoModel", "sequence"),
    _looped("AutoModelForImageClassification", "image"),
    _looped("AutoModelForSequenceClassification", "sequence"),
]
BASE_MODELS = [built for built in MODELS if built.model_class.__name__.endswith("Model")]
HEAD_MODELS = [built for built in MODELS if built not in BASE_MODELS]


def test_every_base_model_is_covered():
    names = {built.model_class.__name__ for built in BASE_MODELS}
    assert names == {"HyperSetModel", "IMixerModel", "HyperBFModel", "LoopedTransformerModel"}, names


# ---------------------------------------------------------------- add_pooling_layer


@pytest.mark.parametrize("built", BASE_MODELS, ids=str)
def test_base_model_without_pooling_layer_returns_no_pooler_output(built, tmp_path):
    pooled, bare = built.build(), built.build(add_pooling_layer=False)
    assert bare.state_dict().keys() == pooled.state_dict().keys()  # the poolers have no weights
    with torch.no_grad():
        expected = pooled(**built.inputs)
        got = bare(**built.inputs)
        as_tuple = bare(**built.inputs, return_dict=False)
    assert expected.pooler_output is not None
    assert got.pooler_output is None
    assert torch.equal(got.last_hidden_state, expected.last_hidden_state)
    # as BERT's: the tuple leaves the None out, the state comes first
    assert torch.equal(as_tuple[0], expected.last_hidden_state)
    assert len(as_tuple) == len(expected.to_tuple()) - 1

    pooled.save_pretrained(tmp_path)
    for loader in (built.model_class, transformers.AutoModel):
        loaded = loader.from_pretrained(tmp_path, add_pooling_layer=False).eval()
        assert type(loaded) is built.model_class
        with torch.no_grad():
            out = loaded(**built.inputs)
        assert out.pooler_output is None, loader.__name__
        assert torch.equal(out.last_hidden_state, expected.last_hidden_state), loader.__name__


@pytest.mark.parametrize("built", HEAD_MODELS, ids=str)
def test_heads_build_their_backbone_with_the_pooler(built):
    assert built.build().base_model.add_pooling_layer is True


# ---------------------------------------------------------------- pickling


def _torch_save_round_trip(model: torch.nn.Module) -> torch.nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)  # a whole model object: the caller's own file


@pytest.mark.parametrize("built", MODELS, ids=str)
def test_model_pickles_and_deep_copies_to_the_same_outputs(built):
    model = built.build()
    with torch.no_grad():
        expected = main_output(model(**built.inputs))
    copies = {
        "pickle": pickle.loads(pickle.dumps(model)),
        "torch.save": _torch_save_round_trip(model),
        "deepcopy": copy.deepcopy(model),
    }
    for how, copied in copies.items():
        assert type(copied) is type(model), how
        assert not copied.training, how
        with torch.no_grad():
            got = main_output(copied(**built.inputs))
        # the same weights and the same computation: bit for bit
        assert torch.equal(got, expected), (
            f"{how}: max |difference| {(got - expected).abs().max().item():.3g}"
        )
        ours = dict(model.named_parameters())
        for name, parameter in copied.named_parameters():
            assert parameter is not ours[name], f"{how}: {name} is shared with the original"


def test_unpickled_imixer_keeps_its_spectral_normalisation_and_trains():
    built = next(b for b in MODELS if b.name == "IMixerForImageClassification-image")
    model = built.build().train()

    def spectral_norms(module: torch.nn.Module) -> list[torch.nn.Module]:
        return [m for name, m in module.named_modules() if name.endswith(("fc_sn1", "fc_sn2"))]

    copied = pickle.loads(pickle.dumps(model))
    layers = spectral_norms(copied)
    assert layers and all(parametrize.is_parametrized(layer, "weight") for layer in layers)
    u_original = [layer.parametrizations.weight[0].u.clone() for layer in spectral_norms(model)]
    u_before = [layer.parametrizations.weight[0].u.clone() for layer in layers]
    copied(**built.inputs).logits.sum().backward()
    # a training forward refines u (power iteration) and the gradient reaches the unnormalised weight
    assert all(not torch.equal(layer.parametrizations.weight[0].u, u) for layer, u in zip(layers, u_before))
    assert all(layer.parametrizations.weight.original.grad is not None for layer in layers)
    # the copy's buffers are its own
    assert all(
        torch.equal(layer.parametrizations.weight[0].u, u)
        for layer, u in zip(spectral_norms(model), u_original)
    )
