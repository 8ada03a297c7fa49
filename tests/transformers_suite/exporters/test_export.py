"""Stand-in for transformers' `tests/exporters/test_export.py` (`ExportTesterMixin`), which its sdist lacks.

`ModelTesterMixin` inherits `ExportTesterMixin` for its `torch.export` tests. These run transformers' own
exporter (`transformers.exporters.DynamoExporter`: `torch.export.export(strict=False)` plus its patches) on
every class in `all_model_classes`, with the tester's common inputs, and compare the exported program's
outputs with the eager model's:

* `test_torch_export`: exported at the sample shapes, called directly and (subtest "saved and reloaded") after
  `save_pretrained` / `ExportedModel.from_pretrained`;
* `test_torch_export_dynamic_shapes`: exported with `DynamoConfig(dynamic=True)` and called with one more
  example in the batch and, for token inputs, a shorter sequence.

Both honour the mixin's `test_torch_exportable` flag. They are not marked `@slow`: they are the export check
of our CI, which deselects slow tests.

Every transformers version the package allows runs them. Before 5.23 the exporter returns a plain
`torch.export.ExportedProgram` (no `ExportedModel`): the outputs are then checked through its
`ExportedProgram.module()`, which is what `ExportedModel` itself runs a dynamo program through, so the export is
still tested; only the save-and-reload subtest, which needs `ExportedModel`, is skipped, with the version in
the reason. A transformers without `DynamoExporter` (none the package allows) skips both tests, likewise.
"""

from __future__ import annotations

import copy
import inspect
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch
import transformers
from fixtures import assert_close_to_scale, rounding
from torch.utils import _pytree as pytree
from transformers.testing_utils import torch_device

# Why a part of these tests cannot run with the installed transformers: None when it can.
try:
    from transformers.exporters import DynamoConfig, DynamoExporter
except ImportError as error:  # the module or either name
    DynamoConfig = DynamoExporter = None
    EXPORTER_MISSING: str | None = (
        f"transformers {transformers.__version__} has no transformers.exporters.DynamoExporter / DynamoConfig "
        f"({error})"
    )
else:
    EXPORTER_MISSING = None
try:
    from transformers.exporters import ExportedModel
except ImportError:  # before transformers 5.23
    ExportedModel = None
    SAVE_MISSING: str | None = (
        f"transformers {transformers.__version__} has no transformers.exporters.ExportedModel (5.23+): its "
        "exporter returns a plain torch.export.ExportedProgram, without save_pretrained / from_pretrained"
    )
else:
    SAVE_MISSING = None

# Inputs laid out (batch, sequence): shortened together in the dynamic-shapes test.
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class ExportTesterMixin:
    """`torch.export` tests for a `ModelTesterMixin` test class (needs its `model_tester`, `all_model_classes`)."""

    test_torch_exportable = True
    # The exported program runs the eager forward's operators on the same inputs; a decomposition may order a
    # reduction differently along the tiny models' few layers: 64 roundings of each output's largest magnitude
    export_roundings = 64

    def _export_cases(self) -> Iterator[tuple[torch.nn.Module, dict[str, Any]]]:
        if EXPORTER_MISSING is not None:
            self.skipTest(reason=EXPORTER_MISSING)
        if not self.test_torch_exportable:
            self.skipTest(reason="test_torch_exportable is set to False")
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            torch.manual_seed(0)
            model = model_class(copy.deepcopy(config)).eval().to(torch_device)
            yield model, self._prepare_for_class(inputs_dict, model_class)

    def _export(
        self, model: torch.nn.Module, inputs: dict[str, Any], config: DynamoConfig
    ) -> Callable[..., Any]:
        """The exported model, callable with the inputs: an `ExportedModel`, or before transformers 5.23 the plain
        `ExportedProgram`'s `module()`."""
        try:
            exported = DynamoExporter().export(model, dict(inputs), config)
        except Exception as error:
            raise AssertionError(
                f"{type(model).__name__} does not export with {config}: {type(error).__name__}: {error}"
            ) from error
        if isinstance(exported, torch.export.ExportedProgram):  # an ExportedProgram cannot be called directly
            return exported.module()
        return exported

    def _assert_export_matches(
        self, model: torch.nn.Module, exported: Callable[..., Any], inputs: dict[str, Any], what: str
    ) -> None:
        name = f"{type(model).__name__} ({what})"
        with torch.no_grad():
            expected = model(**inputs)
            try:
                got = exported(**inputs)
            except Exception as error:
                raise AssertionError(
                    f"{name}: the exported program fails: {type(error).__name__}: {error}"
                ) from error
        expected_leaves, _ = pytree.tree_flatten(expected)
        got_leaves, _ = pytree.tree_flatten(got)
        self.assertEqual(len(got_leaves), len(expected_leaves), f"{name}: the outputs differ in structure")
        compared = 0
        for index, (got_leaf, expected_leaf) in enumerate(zip(got_leaves, expected_leaves)):
            if isinstance(expected_leaf, torch.Tensor):
                what = f"{name}, output {index}"
                if expected_leaf.is_floating_point():
                    tolerance = rounding(expected_leaf.dtype, self.export_roundings)
                    assert_close_to_scale(got_leaf, expected_leaf, tolerance, what)
                else:  # integer outputs (ids, masks): no rounding
                    torch.testing.assert_close(
                        got_leaf,
                        expected_leaf,
                        rtol=0,
                        atol=0,
                        msg=lambda message, what=what: f"{what}: {message}",
                    )
                compared += 1
        self.assertGreater(compared, 0, f"{name}: no tensor output to compare")

    def test_torch_export(self):
        for model, inputs in self._export_cases():
            exported = self._export(model, inputs, DynamoConfig())
            self._assert_export_matches(model, exported, inputs, "exported")
            if SAVE_MISSING is not None:
                continue
            with tempfile.TemporaryDirectory() as directory:
                exported.save_pretrained(directory)
                # Newer transformers (5.24) gate dynamo programs (pickled) like remote code, also from a local
                # folder; this one was written just above.
                trusted = "trust_remote_code" in inspect.signature(ExportedModel.from_pretrained).parameters
                reloaded = ExportedModel.from_pretrained(
                    directory, **({"trust_remote_code": True} if trusted else {})
                )
                self._assert_export_matches(model, reloaded, inputs, "saved and reloaded")
        if SAVE_MISSING is not None:
            # The export itself was checked above; only this part is reported as skipped.
            with self.subTest("saved and reloaded"):
                self.skipTest(reason=SAVE_MISSING)

    def test_torch_export_dynamic_shapes(self):
        for model, inputs in self._export_cases():
            exported = self._export(model, inputs, DynamoConfig(dynamic=True))
            self._assert_export_matches(model, exported, _other_shapes(inputs), "other batch and length")


def _other_shapes(inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs with one more example (a copy of the first) and, for token inputs, two fewer positions."""
    batch = next(value.shape[0] for value in inputs.values() if isinstance(value, torch.Tensor))
    resized = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == batch:
            value = torch.cat([value, value[:1]])
            if key in TOKEN_INPUTS:
                value = value[:, :-2].clone()
        resized[key] = value
    if "attention_mask" in resized:
        resized["attention_mask"][:, 0] = 1  # every example keeps a real token
    return resized
