"""The package's two tables and the Auto registration they drive (imported by `energyformers/__init__.py`).

Importing this module registers every config with `AutoConfig` and every head with its `AutoModelFor*` class, so
`from_pretrained` works on our checkpoints without `trust_remote_code`.

`FAMILIES` (model_type → config class and heads by Auto class; Auto registration here, `auto_map` at export, the
CLIs' `--model`) and `INPUT_TYPES` (config.input_type → main input, processor and its files, pipeline task → Auto
head; training, prediction, export and data loading) are the single source for everything that needs to know the
families or the tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

import transformers
from transformers import PreTrainedConfig, PreTrainedModel

from . import kernels  # noqa: F401  (registers Hyper-SET's fused "triton" attention when Triton is installed)
from .configuration.configuration_hyperbf import HyperBFConfig
from .configuration.configuration_hyperset import HyperSetConfig
from .configuration.configuration_imixer import IMixerConfig
from .configuration.configuration_looped_transformer import LoopedTransformerConfig
from .modeling.modeling_hyperbf import (
    HyperBFForImageClassification,
    HyperBFForSequenceClassification,
    HyperBFModel,
)
from .modeling.modeling_hyperset import (
    HyperSetForImageClassification,
    HyperSetForMaskedImageModeling,
    HyperSetForSequenceClassification,
    HyperSetForTokenClassification,
    HyperSetModel,
)
from .modeling.modeling_imixer import (
    IMixerForImageClassification,
    IMixerForSequenceClassification,
    IMixerModel,
)
from .modeling.modeling_looped_transformer import (
    LoopedTransformerForImageClassification,
    LoopedTransformerForMaskedImageModeling,
    LoopedTransformerForSequenceClassification,
    LoopedTransformerForTokenClassification,
    LoopedTransformerModel,
)
from .tokenizer_fit import MIM_AUTO_CLASS, MIM_TASK


@dataclass(frozen=True)
class Family:
    """One architecture: its config class and its model classes keyed by the Auto class they register with."""

    stem: str  # file stem: configuration/configuration_<stem>.py, modeling/modeling_<stem>.py
    config_class: type[PreTrainedConfig]
    heads: dict[str, type[PreTrainedModel]]  # "AutoModel" / "AutoModelFor…" -> class

    @property
    def auto_map(self) -> dict[str, str]:
        """Auto class name -> our class name, `AutoConfig` included (config.json's `auto_map`, minus the module)."""
        return {
            "AutoConfig": self.config_class.__name__,
            **{auto: head.__name__ for auto, head in self.heads.items()},
        }


@dataclass(frozen=True)
class InputType:
    """What a `config.input_type` means outside the model: its inputs, its processor and the tasks it serves."""

    processor_class: str  # transformers Auto class that loads the saved processor
    processor_files: tuple[str, ...]  # files a saved model folder must hold for that processor to load
    tasks: dict[str, str]  # pipeline task (the Hub's pipeline_tag) -> Auto class of its head; first = default


FAMILIES: dict[str, Family] = {
    "hyperset": Family(
        stem="hyperset",
        config_class=HyperSetConfig,
        heads={
            "AutoModel": HyperSetModel,
            "AutoModelForImageClassification": HyperSetForImageClassification,
            "AutoModelForSequenceClassification": HyperSetForSequenceClassification,
            "AutoModelForTokenClassification": HyperSetForTokenClassification,
            # transformers' Auto class of BEiT's and ViT's masked-image-modelling heads
            "AutoModelForMaskedImageModeling": HyperSetForMaskedImageModeling,
        },
    ),
    "hyperbf": Family(
        stem="hyperbf",
        config_class=HyperBFConfig,
        heads={
            "AutoModel": HyperBFModel,
            "AutoModelForImageClassification": HyperBFForImageClassification,
            "AutoModelForSequenceClassification": HyperBFForSequenceClassification,
        },
    ),
    "imixer": Family(
        stem="imixer",
        config_class=IMixerConfig,
        heads={
            "AutoModel": IMixerModel,
            "AutoModelForImageClassification": IMixerForImageClassification,
            "AutoModelForSequenceClassification": IMixerForSequenceClassification,
        },
    ),
}

# Baselines the families are measured against: registered with the Auto classes like a family (a saved run
# reloads with `AutoModelFor*.from_pretrained`), but not in `FAMILIES`: no Hub export, except the looped
# Transformer's masked-image-modelling head (the other model of the paper's Table 2; docs/hub.md).
BASELINES: dict[str, Family] = {
    "looped-transformer": Family(
        stem="looped_transformer",
        config_class=LoopedTransformerConfig,
        heads={
            "AutoModel": LoopedTransformerModel,
            "AutoModelForImageClassification": LoopedTransformerForImageClassification,
            "AutoModelForSequenceClassification": LoopedTransformerForSequenceClassification,
            "AutoModelForTokenClassification": LoopedTransformerForTokenClassification,
            "AutoModelForMaskedImageModeling": LoopedTransformerForMaskedImageModeling,  # Table 2's baseline
        },
    ),
}

# Baselines that are transformers' own models: trainable with `--model NAME` and compared by the benchmarks, but
# NOT registered with the Auto classes here (transformers already maps their model_type) and never exported.
# `vit` is the paper's image-classification baseline (Hyper-SET paper, Table 1: "Transformer"), built from
# transformers' ViT classes as they are; its CLI size and learning rate: `training/setup.py`.
TRANSFORMERS_BASELINES: dict[str, Family] = {
    "vit": Family(
        stem="vit",
        config_class=transformers.ViTConfig,
        heads={
            "AutoModel": transformers.ViTModel,
            "AutoModelForImageClassification": transformers.ViTForImageClassification,
        },
    ),
}

INPUT_TYPES: dict[str, InputType] = {
    "image": InputType(
        processor_class="AutoImageProcessor",
        processor_files=("preprocessor_config.json",),
        tasks={
            "image-classification": "AutoModelForImageClassification",
            "image-feature-extraction": "AutoModel",
        },
    ),
    "sequence": InputType(
        processor_class="AutoTokenizer",
        processor_files=("tokenizer.json", "tokenizer_config.json"),
        tasks={
            "text-classification": "AutoModelForSequenceClassification",
            "token-classification": "AutoModelForTokenClassification",
            "feature-extraction": "AutoModel",
            # masked image modelling over the codes of an image tokenizer: the task `MaskedImageModelingPipeline`
            # is registered as with transformers (`energyformers.tokenizer_fit.MIM_TASK`, the training
            # CLI's `--task`); not "fill-mask", transformers' masked-language-model task. The Hub has no such task:
            # the model card's pipeline_tag is "image-to-image" (training/card.py).
            MIM_TASK: MIM_AUTO_CLASS,
        },
    ),
}


def task_of(input_type: str, auto_class: str) -> str:
    """The pipeline task a head of `auto_class` serves for `input_type` inputs (`ValueError` if none)."""
    if input_type not in INPUT_TYPES:
        served = "; ".join(f"{name}: {sorted(spec.tasks)}" for name, spec in INPUT_TYPES.items())
        raise ValueError(
            f"input_type={input_type!r} is not an input type; expected one of {list(INPUT_TYPES)} (their tasks: "
            f"{served})."
        )
    for task, head in INPUT_TYPES[input_type].tasks.items():
        if head == auto_class:
            return task
    raise ValueError(
        f"auto_class={auto_class!r} serves no task for input_type={input_type!r}; expected one of "
        f"{sorted(INPUT_TYPES[input_type].tasks.values())}."
    )


for _model_type, _family in {**FAMILIES, **BASELINES}.items():
    transformers.AutoConfig.register(_model_type, _family.config_class, exist_ok=True)
    for _auto_name, _head in _family.heads.items():
        getattr(transformers, _auto_name).register(_family.config_class, _head, exist_ok=True)
