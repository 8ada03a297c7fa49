"""energyformers: Hyper-SET, iMixer and HyperBF as native Hugging Face `transformers` models.

Importing the package registers every config with `AutoConfig` and every head with its `AutoModelFor*` class, so
`from_pretrained` works on our checkpoints without `trust_remote_code`.

The import itself is light, the same in every process (as `import transformers` is): the public names below load on
first use (PEP 562 `__getattr__`), and the Auto registration happens when transformers loads its Auto classes
(`energyformers.auto_registration`). So the `energyformers` command checks its arguments before torch loads, and a
program that only needs the Auto classes never pays for the names it does not use.
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from . import auto_registration

# pyproject.toml's version, read from the installed distribution's metadata so it is written in one place. No
# fallback for a source tree that is not installed: there the subpackages (mapped by setuptools' package-dir) do
# not import either, so the package is unusable before `pip install` anyway.
__version__ = version("energyformers")

if TYPE_CHECKING:
    from .registry import (  # what IDEs, type checkers and ruff read; at run time `__getattr__` loads these
        BASELINES,
        FAMILIES,
        INPUT_TYPES,
        Family,
        HyperBFConfig,
        HyperBFForImageClassification,
        HyperBFForSequenceClassification,
        HyperBFModel,
        HyperSetConfig,
        HyperSetForImageClassification,
        HyperSetForMaskedImageModeling,
        HyperSetForSequenceClassification,
        HyperSetForTokenClassification,
        HyperSetModel,
        IMixerConfig,
        IMixerForImageClassification,
        IMixerForSequenceClassification,
        IMixerModel,
        InputType,
        LoopedTransformerConfig,
        LoopedTransformerForImageClassification,
        LoopedTransformerForMaskedImageModeling,
        LoopedTransformerForSequenceClassification,
        LoopedTransformerForTokenClassification,
        LoopedTransformerModel,
        task_of,
    )


def __getattr__(name: str) -> Any:
    # `energyformers.pipelines` (depth arguments as pipeline call arguments) imports transformers' pipeline
    # classes, which loading and training models never needs.
    if name == "pipelines":
        from .pipelines import DEPTH_ARGUMENTS  # noqa: F401  (`from . import pipelines` would ask `__getattr__` again)

        return sys.modules[f"{__name__}.pipelines"]
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import registry  # imports the model files and registers the real classes

    return getattr(registry, name)


def __dir__() -> list[str]:
    return sorted([*__all__, "auto_registration", "pipelines"])


auto_registration.install()

__all__ = [
    "BASELINES",
    "FAMILIES",
    "INPUT_TYPES",
    "Family",
    "HyperBFConfig",
    "HyperBFForImageClassification",
    "HyperBFForSequenceClassification",
    "HyperBFModel",
    "HyperSetConfig",
    "HyperSetForImageClassification",
    "HyperSetForMaskedImageModeling",
    "HyperSetForSequenceClassification",
    "HyperSetForTokenClassification",
    "HyperSetModel",
    "IMixerConfig",
    "IMixerForImageClassification",
    "IMixerForSequenceClassification",
    "IMixerModel",
    "InputType",
    "LoopedTransformerConfig",
    "LoopedTransformerForImageClassification",
    "LoopedTransformerForMaskedImageModeling",
    "LoopedTransformerForSequenceClassification",
    "LoopedTransformerForTokenClassification",
    "LoopedTransformerModel",
    "__version__",
    "task_of",
]
