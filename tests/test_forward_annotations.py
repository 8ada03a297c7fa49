"""Every head's `forward` declares the output class it returns, as transformers' models do (IDEs, docs, type checkers
read the annotation; a `ModelOutput` or a parent class there hides the fields the head adds)."""

from __future__ import annotations

import typing

import pytest

import energyformers

HEADS = sorted(
    (
        obj
        for obj in (getattr(energyformers, name) for name in energyformers.__all__)
        if isinstance(obj, type) and hasattr(obj, "_output_class")
    ),
    key=lambda cls: cls.__name__,
)


def test_the_package_exports_heads_of_every_kind():
    names = {cls.__name__ for cls in HEADS}
    assert {
        "HyperSetForSequenceClassification",
        "LoopedTransformerForImageClassification",
        "LoopedTransformerForTokenClassification",
        "LoopedTransformerForMaskedImageModeling",
    } <= names, sorted(names)


@pytest.mark.parametrize("head", HEADS, ids=lambda cls: cls.__name__)
def test_forward_declares_the_exact_output_class(head):
    returned = typing.get_type_hints(head.forward)["return"]
    declared = set(typing.get_args(returned)) or {returned}
    assert head._output_class in declared, (
        f"{head.__name__}.forward returns {head._output_class.__name__} but declares {returned}"
    )
