"""Auto registration that imports nothing until transformers' Auto classes load.

`import energyformers` must register every config with `AutoConfig` and every head with its `AutoModelFor*` class,
yet stay as light as `import transformers` (no torch): the `energyformers` command answers `--help` and argument
errors before torch loads, and the package is imported the same way in every process. Touching `AutoConfig` imports
torch (transformers' configuration code does), so registration cannot happen while `energyformers` is imported.
It happens when transformers loads the module that defines the Auto classes instead, through the public API
(`AutoConfig.register`, `AutoModelFor*.register`):

* `transformers.models.auto.configuration_auto` loads: our config classes register with `AutoConfig` (their modules
  import only transformers' configuration code, already loaded by then);
* `transformers.models.auto.modeling_auto` loads: each head registers as a `LazyHead` stand-in that carries the
  head's name, module and config class, and imports the model files (`energyformers.registry`) on first real use;
  importing the registry registers the real classes in their place.

* `transformers.pipelines` loads: `energyformers.pipelines` is imported, which registers the masked-image-modelling
  pipeline with `PIPELINE_REGISTRY`, so `pipeline("masked-image-modeling", model=folder)` works as transformers'
  own tasks do (`energyformers.INPUT_TYPES` names that task for the masked-image-modelling heads).

A module already loaded when `energyformers` is imported registers at once. The modeling code is not imported at
`modeling_auto` load time because transformers imports that module from inside its own modeling modules
(`transformers.modeling_layers`), which our model files import: they may be half-initialised at that moment.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# model_type -> (file stem, Auto classes its heads register with). `energyformers.registry` holds the classes
# themselves; tests/test_new_user.py checks that the two tables agree.
AUTO_HEADS: dict[str, tuple[str, tuple[str, ...]]] = {
    "hyperset": (
        "hyperset",
        (
            "AutoModel",
            "AutoModelForImageClassification",
            "AutoModelForSequenceClassification",
            "AutoModelForTokenClassification",
            "AutoModelForMaskedImageModeling",
        ),
    ),
    "hyperbf": (
        "hyperbf",
        ("AutoModel", "AutoModelForImageClassification", "AutoModelForSequenceClassification"),
    ),
    "imixer": (
        "imixer",
        ("AutoModel", "AutoModelForImageClassification", "AutoModelForSequenceClassification"),
    ),
    "looped-transformer": (
        "looped_transformer",
        (
            "AutoModel",
            "AutoModelForImageClassification",
            "AutoModelForSequenceClassification",
            "AutoModelForTokenClassification",
            "AutoModelForMaskedImageModeling",
        ),
    ),
}

CONFIGURATION_AUTO = "transformers.models.auto.configuration_auto"
MODELING_AUTO = "transformers.models.auto.modeling_auto"
PIPELINES = "transformers.pipelines"


def config_classes() -> dict[str, type]:
    """model_type -> config class, importing only the configuration modules."""
    classes = {}
    for model_type, (stem, _) in AUTO_HEADS.items():
        module = importlib.import_module(f"energyformers.configuration.configuration_{stem}")
        classes[model_type] = next(
            value
            for value in vars(module).values()
            if isinstance(value, type) and getattr(value, "model_type", None) == model_type
        )
    return classes


def head_name(config_class: type, auto_class: str) -> str:
    """`HyperSetConfig`, `AutoModelForImageClassification` -> `HyperSetForImageClassification` (the layout's names)."""
    base = config_class.__name__.removesuffix("Config")
    return f"{base}Model" if auto_class == "AutoModel" else base + auto_class.removeprefix("AutoModel")


class _LazyHeadType(type):
    """Metaclass of a stand-in: any attribute it does not carry itself, a call, `isinstance` and `issubclass`
    resolve the real class first (which imports the model files)."""

    _auto_class: str

    def resolve(cls) -> type:
        from . import registry  # registers the real classes, replacing the stand-ins

        model_type = cls.config_class.model_type
        family = registry.FAMILIES.get(model_type) or registry.BASELINES[model_type]
        return family.heads[cls._auto_class]

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):  # copy/pickle/inspect probes: not the real class's
            raise AttributeError(name)
        return getattr(cls.resolve(), name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.resolve()(*args, **kwargs)

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, cls.resolve())

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, cls.resolve())

    def __repr__(cls) -> str:
        return f"<lazy class '{cls.__module__}.{cls.__name__}'>"


def lazy_head(config_class: type, stem: str, auto_class: str) -> type:
    """A stand-in for one head: what transformers reads without using the class (its name, module, config class)
    without importing the model file; everything else imports it."""
    name = head_name(config_class, auto_class)
    namespace = {
        "__module__": f"energyformers.modeling.modeling_{stem}",
        "__qualname__": name,
        "config_class": config_class,
        "_auto_class": auto_class,
    }
    return _LazyHeadType(name, (), namespace)


def register_configs(configuration_auto: ModuleType) -> None:
    """Register every family's config class with AutoConfig (the hook on `configuration_auto`; see `install`)."""
    for model_type, config_class in config_classes().items():
        configuration_auto.AutoConfig.register(model_type, config_class, exist_ok=True)


def register_heads(modeling_auto: ModuleType) -> None:
    """Register a stand-in per head with the Auto model classes, unless the registry registers the real ones."""
    if "energyformers.registry" in sys.modules:
        return  # the registry is loading (it imports `modeling_auto`) or loaded: it registers the real classes
    for model_type, config_class in config_classes().items():
        stem, auto_classes = AUTO_HEADS[model_type]
        for auto_class in auto_classes:
            head = lazy_head(config_class, stem, auto_class)
            getattr(modeling_auto, auto_class).register(config_class, head, exist_ok=True)


def register_pipelines(_pipelines: ModuleType) -> None:
    """The hook on `transformers.pipelines` (`_pipelines`, unused: a hook receives the module it waits for):
    `energyformers.pipelines` registers its pipeline with transformers' registry itself, when imported."""
    if "energyformers.pipelines" in sys.modules:
        return  # loading (its transformers classes load `transformers.pipelines`) or loaded: it registers itself
    importlib.import_module("energyformers.pipelines")  # registers at its end


class _ThenCall(importlib.abc.Loader):
    """Runs the real loader, then `callback(module)`, then puts the real loader back on the module."""

    def __init__(self, loader: importlib.abc.Loader, callback: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.callback(module)


class _WhenImported(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module it asks the path finder for the real spec and wraps its loader.
    Each watched module fires once. The finder stays in `sys.meta_path` (removing it while the import system
    iterates that list would skip the finder after it); with nothing left to watch it answers None at once."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.callbacks = callbacks

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        callback = self.callbacks.pop(fullname, None)
        if callback is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ThenCall(spec.loader, callback)
        return spec


def install() -> None:
    """Register now with the Auto (and pipelines) modules already loaded; register with the others when they
    load."""
    pending = {}
    for name, callback in (
        (CONFIGURATION_AUTO, register_configs),
        (MODELING_AUTO, register_heads),
        (PIPELINES, register_pipelines),
    ):
        module = sys.modules.get(name)
        if module is not None:
            callback(module)
        else:
            pending[name] = callback
    if pending and not any(isinstance(finder, _WhenImported) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenImported(pending))
