"""energyformers: Hyper-SET, iMixer and HyperBF as native Hugging Face `transformers` models.

Importing the package registers every config with `AutoConfig` and every head with its
`AutoModelFor*` class, so `from_pretrained` works on our checkpoints without `trust_remote_code`.
"""

from __future__ import annotations

import importlib

import transformers

__version__ = "0.1.0"

# model_type -> (architecture file stem, {Auto class name: our class name}). The single source for
# Auto registration here and for `auto_map` in exported Hub folders (energyformers.training.export).
FAMILIES: dict[str, tuple[str, dict[str, str]]] = {
    "hyperset": (
        "hyperset",
        {
            "AutoConfig": "HyperSetConfig",
            "AutoModel": "HyperSetModel",
            "AutoModelForImageClassification": "HyperSetForImageClassification",
            "AutoModelForSequenceClassification": "HyperSetForSequenceClassification",
            "AutoModelForTokenClassification": "HyperSetForTokenClassification",
        },
    ),
    "hyperbf": (
        "hyperbf",
        {
            "AutoConfig": "HyperBFConfig",
            "AutoModel": "HyperBFModel",
            "AutoModelForImageClassification": "HyperBFForImageClassification",
            "AutoModelForSequenceClassification": "HyperBFForSequenceClassification",
        },
    ),
    "imixer": (
        "imixer",
        {
            "AutoConfig": "IMixerConfig",
            "AutoModel": "IMixerModel",
            "AutoModelForImageClassification": "IMixerForImageClassification",
            "AutoModelForSequenceClassification": "IMixerForSequenceClassification",
        },
    ),
}


def _register_families() -> dict[str, type]:
    exported: dict[str, type] = {}
    for model_type, (stem, classes) in FAMILIES.items():
        configuration = importlib.import_module(f"energyformers.configuration.configuration_{stem}")
        modeling = importlib.import_module(f"energyformers.modeling.modeling_{stem}")
        config_class = getattr(configuration, classes["AutoConfig"])
        transformers.AutoConfig.register(model_type, config_class, exist_ok=True)
        exported[config_class.__name__] = config_class
        for auto_name, class_name in classes.items():
            if auto_name == "AutoConfig":
                continue
            model_class = getattr(modeling, class_name)
            getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
            exported[class_name] = model_class
    return exported


globals().update(_register_families())

__all__ = [
    "FAMILIES",
    "__version__",
    *(name for _, classes in FAMILIES.values() for name in classes.values()),
]
