"""transformers pipelines that pass recurrent-depth arguments through to the model at call time.

transformers' classification pipelines call `model(**inputs)` and reject unknown call arguments. These
subclasses accept the depth arguments of the model's `forward` (Hyper-SET: `num_iterations`,
`halting_tolerance`, `halting_criterion`; iMixer: `fixed_point_iterations`, `fixed_point_solver`,
`fixed_point_tolerance`), and the halting threshold and test-time search of Hyper-SET and the looped Transformer
(`halting_threshold`, `search_trajectories`, `search_noise`, `search_seed`, `search_selector`), and forward them to
every model call, so depth and search can be chosen per call without editing the config:

    from transformers import pipeline
    from energyformers.pipelines import ImageClassificationPipeline

    classify = pipeline("image-classification", model="runs/demo-hyperset", pipeline_class=ImageClassificationPipeline)
    classify(image, num_iterations=16, halting_tolerance=1e-3)
    classify(image, search_trajectories=8, search_noise=0.1, search_seed=0, search_selector="energy")
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import transformers
from torch import nn

# Forward arguments a pipeline call may set, when the model's forward takes them.
DEPTH_ARGUMENTS = (
    "num_iterations",
    "halting_tolerance",
    "halting_criterion",
    "fixed_point_iterations",
    "fixed_point_solver",
    "fixed_point_tolerance",
)
# Test-time search and the halting head's threshold (Hyper-SET and the looped Transformer heads).
SEARCH_ARGUMENTS = (
    "halting_threshold",
    "search_trajectories",
    "search_noise",
    "search_seed",
    "search_selector",
)
CALL_ARGUMENTS = (*DEPTH_ARGUMENTS, *SEARCH_ARGUMENTS)


@contextlib.contextmanager
def _forward_arguments(model: nn.Module, arguments: dict[str, Any]) -> Iterator[None]:
    """Bind `arguments` to every call of `model` inside the block (through its instance `forward`)."""
    model.forward = functools.partial(model.forward, **arguments)  # every model's forward is its class's
    try:
        yield
    finally:
        del model.forward


class _DepthArgumentsMixin:
    """Takes `CALL_ARGUMENTS` (depth and search) out of the call's keyword arguments and hands them to the model
    call."""

    def _sanitize_parameters(self, **kwargs: Any) -> tuple[dict, dict, dict]:
        accepted = inspect.signature(self.model.forward).parameters
        depth = {name: kwargs.pop(name) for name in CALL_ARGUMENTS if name in kwargs}
        unknown = sorted(set(depth) - set(accepted))
        if unknown:
            raise ValueError(
                f"{type(self.model).__name__} takes no {unknown} argument(s); this model's depth and search "
                f"arguments are {[name for name in CALL_ARGUMENTS if name in accepted]}."
            )
        preprocess, forward, postprocess = super()._sanitize_parameters(**kwargs)
        return preprocess, {**forward, **depth}, postprocess

    def _forward(self, model_inputs: dict[str, Any], **forward_params: Any) -> Any:
        depth = {name: forward_params.pop(name) for name in CALL_ARGUMENTS if name in forward_params}
        with _forward_arguments(self.model, depth) if depth else contextlib.nullcontext():
            return super()._forward(model_inputs, **forward_params)


class ImageClassificationPipeline(_DepthArgumentsMixin, transformers.ImageClassificationPipeline):
    """`image-classification` with the model's depth arguments as call arguments."""


class TextClassificationPipeline(_DepthArgumentsMixin, transformers.TextClassificationPipeline):
    """`text-classification` with the model's depth arguments as call arguments."""


class TokenClassificationPipeline(_DepthArgumentsMixin, transformers.TokenClassificationPipeline):
    """`token-classification` with the model's depth arguments as call arguments."""


__all__ = [
    "CALL_ARGUMENTS",
    "DEPTH_ARGUMENTS",
    "SEARCH_ARGUMENTS",
    "ImageClassificationPipeline",
    "TextClassificationPipeline",
    "TokenClassificationPipeline",
]
