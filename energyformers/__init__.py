"""energyformers: Hyper-SET, iMixer and HyperBF as native Hugging Face `transformers` models.

Importing the package registers every config with `AutoConfig` and every head with its `AutoModelFor*` class
(`energyformers.registry`), so `from_pretrained` works on our checkpoints without `trust_remote_code`.

One exception keeps the command line quick: when this process is the `energyformers` command (the console script,
or `python -m energyformers[.<module>]`), nothing heavy is imported up front, so every sub-command parses and checks
its arguments before torch and transformers' modeling code load (about 4.5 s on two cores): a mistyped flag or
sub-command is answered at once. The command loads the models itself once its arguments are good
(`energyformers.training.cli.run_command`); every public name below also loads, and the Auto classes register, on
first use (PEP 562 `__getattr__`), so such a process still sees the whole package. `import energyformers` from any
other program (a script, a notebook, `python -c`) imports and registers everything at once, as before.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"


def _command_line(argv: list[str], orig_argv: list[str]) -> bool:
    """Whether the process is `energyformers ...` / `python -m energyformers[.<module>] ...`.

    `argv` is `sys.argv`: its first item is the console script's path, or "-m" while Python imports the packages of
    the module `-m` names (`orig_argv`, the interpreter's own command line, says which module that is).
    """
    console_script = Path(argv[0]).name in ("energyformers", "energyformers.exe")
    module = orig_argv[orig_argv.index("-m") + 1] if argv[0] == "-m" and "-m" in orig_argv[:-1] else ""
    return console_script or module.split(".")[0] == "energyformers"


def _pipelines() -> Any:
    """The `energyformers.pipelines` module, imported on first use (`from . import pipelines` would ask this
    package's `__getattr__` for the name again)."""
    from .pipelines import DEPTH_ARGUMENTS  # noqa: F401  (importing a name imports the module)

    return sys.modules[f"{__name__}.pipelines"]


if TYPE_CHECKING or not _command_line(sys.argv, getattr(sys, "orig_argv", [])):
    from .registry import (  # importing the registry registers the Auto classes
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
        LoopedTransformerForSequenceClassification,
        LoopedTransformerForTokenClassification,
        LoopedTransformerModel,
        task_of,
    )

    def __getattr__(name: str) -> Any:
        # `energyformers.pipelines` (depth arguments as pipeline call arguments) loads on first use: it imports
        # transformers' pipeline classes, which loading and training models never needs.
        if name == "pipelines":
            return _pipelines()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
else:

    def __getattr__(name: str) -> Any:
        if name == "pipelines":
            return _pipelines()
        if name not in __all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from . import registry  # registers the Auto classes

        return getattr(registry, name)


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
    "LoopedTransformerForSequenceClassification",
    "LoopedTransformerForTokenClassification",
    "LoopedTransformerModel",
    "__version__",
    "task_of",
]
