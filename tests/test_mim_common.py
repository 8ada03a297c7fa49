"""transformers' common model tests (`ModelTesterMixin`, `ConfigTester`) on the looped-Transformer baseline's
masked-image-modelling head, exactly as `test_transformers_common.py` runs them on Hyper-SET's (the baseline is not
in `FAMILIES`, so that module's tables do not list it: this one adds it to the masked-LM table the mixin reads)."""

from __future__ import annotations

import unittest
from typing import Any, ClassVar
from unittest import mock

import pytest
import test_transformers_common as common  # the suite and its testers (skips as that module does)
from transformers import PreTrainedConfig
from transformers.models.auto import modeling_auto

from energyformers import LoopedTransformerConfig, LoopedTransformerForMaskedImageModeling


@pytest.fixture(scope="module", autouse=True)
def _baseline_in_the_masked_lm_table():
    names = {"looped-transformer": LoopedTransformerForMaskedImageModeling.__name__}
    with mock.patch.dict(modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, names):
        yield


class LoopedTransformerMaskedImageModelingTester(common.HyperSetModelTester):
    """The baseline of the tiny Hyper-SET sequence config (one layer iterated twice, codebook 19 + [MASK]) with the
    learned positions of the `mim-1-12-4d` preset."""

    overrides: ClassVar[dict[str, Any]] = dict(common.HyperSetModelTester.overrides)

    def get_config(self) -> PreTrainedConfig:
        hyperset = common.CONFIGS["hyperset"](self.input_type, **self.overrides)
        return LoopedTransformerConfig.from_hyperset(hyperset, position_embedding_type="learned")


class LoopedTransformerMaskedImageModelingTest(common._SequenceTests, unittest.TestCase):
    model_tester_class = LoopedTransformerMaskedImageModelingTester
    all_model_classes = (LoopedTransformerForMaskedImageModeling,)
