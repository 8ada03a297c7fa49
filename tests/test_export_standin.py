"""The `torch.export` stand-in (`transformers_suite/exporters/test_export.py`) on every transformers the package
allows: before 5.23 there is no `ExportedModel` and the exporter returns a plain `torch.export.ExportedProgram`,
which the tests run through its `module()` (the save-and-reload subtest is skipped, naming the version)."""

from __future__ import annotations

import importlib.util
import sys
import types
import unittest
from pathlib import Path
from unittest import mock

import pytest
import torch
import transformers
from fixtures import hyperset_config

from energyformers import HyperSetForSequenceClassification

STANDIN = Path(__file__).resolve().parent / "transformers_suite" / "exporters" / "test_export.py"


def _load_standin(exporters: types.ModuleType | None) -> types.ModuleType:
    """A fresh copy of the stand-in, imported while `transformers.exporters` is `exporters` (None: missing)."""
    spec = importlib.util.spec_from_file_location("export_standin_copy", STANDIN)
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(sys.modules, {"transformers.exporters": exporters}):
        spec.loader.exec_module(module)
    return module


def test_the_standin_imports_without_exported_model_or_without_the_exporters():
    version = transformers.__version__
    from transformers.exporters import DynamoConfig, DynamoExporter

    before_5_23 = types.ModuleType("transformers.exporters")  # what transformers 5.18-5.22 export
    before_5_23.DynamoConfig, before_5_23.DynamoExporter = DynamoConfig, DynamoExporter
    old = _load_standin(before_5_23)
    assert old.EXPORTER_MISSING is None and old.ExportedModel is None, (
        old.EXPORTER_MISSING,
        old.ExportedModel,
    )
    assert f"transformers {version} has no transformers.exporters.ExportedModel" in old.SAVE_MISSING, (
        old.SAVE_MISSING
    )

    none = _load_standin(None)
    assert f"transformers {version} has no transformers.exporters.DynamoExporter" in none.EXPORTER_MISSING, (
        none.EXPORTER_MISSING
    )


class _OldExporter:
    """transformers' `DynamoExporter` as before 5.23: a plain `ExportedProgram` (of a model made from seed `seed`,
    when given: a wrong program, to show the outputs are compared)."""

    def __init__(self, seed: int | None = None):
        self.seed = seed

    def export(self, model, inputs, config):
        from transformers.exporters import DynamoExporter

        if self.seed is not None:
            torch.manual_seed(self.seed)
            model = type(model)(model.config).eval()
        exported = DynamoExporter().export(model, inputs, config)
        return exported if isinstance(exported, torch.export.ExportedProgram) else exported.program


def _run_export_tests(standin: types.ModuleType) -> unittest.TestResult:
    """The stand-in's two tests on a tiny Hyper-SET sequence classifier."""
    config = hyperset_config("sequence")
    generator = torch.Generator().manual_seed(0)
    inputs = {
        "input_ids": torch.randint(0, config.vocab_size, (3, 7), generator=generator),
        "attention_mask": torch.ones(3, 7, dtype=torch.long),
    }

    class Case(standin.ExportTesterMixin, unittest.TestCase):
        all_model_classes = (HyperSetForSequenceClassification,)
        model_tester = types.SimpleNamespace(prepare_config_and_inputs_for_common=lambda: (config, inputs))

        def _prepare_for_class(self, inputs_dict, model_class):
            return dict(inputs_dict)

    result = unittest.TestResult()
    unittest.TestSuite([Case("test_torch_export"), Case("test_torch_export_dynamic_shapes")]).run(result)
    return result


@pytest.fixture
def standin_before_5_23(monkeypatch):
    """The stand-in as it imports under transformers 5.18-5.22 (no `ExportedModel`)."""
    from transformers_suite.exporters import test_export

    reason = "transformers 5.20.2 has no transformers.exporters.ExportedModel (5.23+)"
    monkeypatch.setattr(test_export, "ExportedModel", None)
    monkeypatch.setattr(test_export, "SAVE_MISSING", reason, raising=False)
    monkeypatch.setattr(test_export, "DynamoExporter", _OldExporter)
    return test_export, reason


def test_a_plain_exported_program_is_checked_through_its_module(standin_before_5_23):
    standin, reason = standin_before_5_23
    result = _run_export_tests(standin)
    problems = [(str(test), trace) for test, trace in result.failures + result.errors]
    assert result.testsRun == 2 and not problems, problems
    # only the save-and-reload part is skipped, once, with the reason
    assert len(result.skipped) == 1, result.skipped
    subtest, why = result.skipped[0]
    assert why == reason and "saved and reloaded" in str(subtest), (str(subtest), why)


def test_a_plain_exported_program_with_other_outputs_fails(standin_before_5_23, monkeypatch):
    standin, _ = standin_before_5_23
    monkeypatch.setattr(standin, "DynamoExporter", lambda: _OldExporter(seed=1))
    result = _run_export_tests(standin)
    failed = sorted(test._testMethodName for test, _ in result.failures)
    assert failed == ["test_torch_export", "test_torch_export_dynamic_shapes"] and not result.errors, (
        result.failures,
        result.errors,
    )


def test_without_the_exporters_both_export_tests_skip_naming_the_version(monkeypatch):
    from transformers_suite.exporters import test_export

    reason = "transformers 5.0.0 has no transformers.exporters.DynamoExporter / DynamoConfig"
    monkeypatch.setattr(test_export, "EXPORTER_MISSING", reason, raising=False)
    monkeypatch.setattr(test_export, "DynamoExporter", None)
    monkeypatch.setattr(test_export, "DynamoConfig", None)
    result = _run_export_tests(test_export)
    assert [why for _, why in result.skipped] == [reason, reason] and not result.failures + result.errors, (
        result.skipped,
        result.failures,
        result.errors,
    )
