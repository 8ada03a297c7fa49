"""transformers' common model tests (`ModelTesterMixin`, `ConfigTester`) on the looped-Transformer baseline's
masked-image-modelling head, exactly as `test_transformers_common.py` runs them on Hyper-SET's and on the baseline's
other heads (that module's tables fixture is its own: this one adds the head to the masked-LM table the mixin reads)."""

from __future__ import annotations

import unittest
from typing import Any, ClassVar
from unittest import mock

import pytest
import test_transformers_common as common  # the suite and its testers (skips as that module does)
from transformers.models.auto import modeling_auto

from energyformers import LoopedTransformerForMaskedImageModeling


@pytest.fixture(scope="module", autouse=True)
def _baseline_in_the_masked_lm_table():
    names = {"looped-transformer": LoopedTransformerForMaskedImageModeling.__name__}
    with mock.patch.dict(modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, names):
        yield


if common.PROBLEM is not None:
    # The class below is then not collected (`_CommonTests.__test__`): without this test the module would pass
    # with 0 tests. It fails, as in `test_transformers_common.py`, naming the problem.
    test_common_suite_is_fetched = common.test_common_suite_is_fetched


class LoopedTransformerMaskedImageModelingTester(common.LoopedTransformerModelTester):
    """The baseline's tester (one layer iterated twice; as a sequence, codebook 19 + [MASK]) with the learned
    positions of the `mim-1-12-4d` preset."""

    overrides: ClassVar[dict[str, Any]] = dict(
        common.LoopedTransformerModelTester.overrides, position_embedding_type="learned"
    )


class LoopedTransformerMaskedImageModelingTest(common._SequenceTests, unittest.TestCase):
    model_tester_class = LoopedTransformerMaskedImageModelingTester
    all_model_classes = (LoopedTransformerForMaskedImageModeling,)
