"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`) on every head of every family and of
the looped-Transformer baseline (`BASELINES`; its masked-image-modelling head: `test_mim_common.py`).

Vendor nothing: the tests are transformers' `tests/test_modeling_common.py` and `tests/test_configuration_common.py`
of the *installed* transformers version, taken from its source distribution on the package index. Fetching it is a
step of `make data`, before pytest (`python tests/transformers_suite/sdist.py`: `pip download --no-binary :all:
--no-deps transformers==<version>` into `.pytest_cache/d/transformers-sdist/`, or
`$ENERGYFORMERS_TRANSFORMERS_SUITE_CACHE`); this module only reads it, offline. Without it the module is skipped on
a developer's machine, and under `CI=true` its one test `test_common_suite_is_fetched` fails with the command to
fetch it: in CI the conformance check must never vanish silently. A suite that is there but does not import fails
that test too. Either way only this module's tests are lost, never the rest of the session (a failure while the
module is imported would be a collection error, which stops the whole run). See `transformers_suite/sdist.py`.

The sdist lacks three modules those files import; `tests/transformers_suite/` supplies stand-ins under the same
package names:
* `exporters/test_export.py`: `ExportTesterMixin`, inherited by `ModelTesterMixin`. Ours runs
  `test_torch_export` and `test_torch_export_dynamic_shapes` with transformers' `DynamoExporter` (not `@slow`,
  so they run in CI);
* `generation/test_utils.py`: `GenerationTesterMixin`, a marker class (no model here generates);
* `utils/test_configuration_utils.py`: `config_common_kwargs`, every public key of `PreTrainedConfig().__dict__`
  with a non-default value.

One test class per family (or baseline) and input type runs the mixin over that input type's heads (the base
model takes both, so it is in both classes), with the tiny config from `fixtures` and a tester in the style of
transformers' `tests/models/vit/test_modeling_vit.py`; `test_config` runs `ConfigTester`. The mixin reads the
`MODEL_*_MAPPING_NAMES` tables to choose labels and which classes train; our model types are added to them
for this module's tests and removed afterwards.
"""

from __future__ import annotations

import tempfile
import traceback
import unittest
import warnings
from typing import Any, ClassVar
from unittest import mock

import pytest
from fixtures import (
    BASELINE_TINY,
    TINY,
    hyperbf_config,
    hyperset_config,
    imixer_config,
    in_ci,
    looped_transformer_config,
)
from torch import nn
from transformers import PreTrainedConfig
from transformers.models.auto import modeling_auto
from transformers_suite import sdist

from energyformers import (
    BASELINES,
    FAMILIES,
    HyperBFForImageClassification,
    HyperBFForSequenceClassification,
    HyperBFModel,
    HyperSetForImageClassification,
    HyperSetForMaskedImageModeling,
    HyperSetForSequenceClassification,
    HyperSetForTokenClassification,
    HyperSetModel,
    IMixerForImageClassification,
    IMixerForSequenceClassification,
    IMixerModel,
    LoopedTransformerForImageClassification,
    LoopedTransformerForSequenceClassification,
    LoopedTransformerForTokenClassification,
    LoopedTransformerModel,
)

# Why this module's tests cannot run: None when transformers' suite imported.
PROBLEM: str | None = None
try:
    with warnings.catch_warnings():
        # transformers registers its suite's marks (`flash_attn_test`, ...) in a conftest we do not fetch
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        modeling_common, configuration_common = sdist.load()
except sdist.SuiteMissing as error:
    if not in_ci():
        pytest.skip(str(error), allow_module_level=True)
    PROBLEM = f"{error} (CI=true: the conformance suite may not be skipped in CI)"
except Exception:
    PROBLEM = f"transformers' common test files did not import:\n{traceback.format_exc()}"

if PROBLEM is not None:
    # The classes below are still defined, on stand-ins, but not collected (`_CommonTests.__test__`): this one
    # test reports the problem.
    modeling_common = configuration_common = None

    def test_common_suite_is_fetched() -> None:
        pytest.fail(PROBLEM, pytrace=False)


ModelTesterMixin = getattr(modeling_common, "ModelTesterMixin", object)
ConfigTester = getattr(configuration_common, "ConfigTester", None)
floats_tensor = getattr(modeling_common, "floats_tensor", None)
ids_tensor = getattr(modeling_common, "ids_tensor", None)
random_attention_mask = getattr(modeling_common, "random_attention_mask", None)

CONFIGS = {
    "hyperset": hyperset_config,
    "imixer": imixer_config,
    "hyperbf": hyperbf_config,
    "looped-transformer": looped_transformer_config,
}

# The model tables the mixin reads, by the Auto class a head registers with in `FAMILIES`.
AUTO_TABLES = {
    "AutoModel": modeling_auto.MODEL_MAPPING_NAMES,
    "AutoModelForImageClassification": modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
    "AutoModelForSequenceClassification": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    "AutoModelForTokenClassification": modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    # The mixin's masked-image-modelling inputs are BEiT's (pixels + `bool_masked_pos`). Ours reads code ids and
    # takes per-position labels (−100: no loss), which is what the mixin gives masked-LM heads: that table.
    "AutoModelForMaskedImageModeling": modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
}


@pytest.fixture(scope="module", autouse=True)
def _our_models_in_auto_tables():
    """Every head (of the families and the baselines) in the `MODEL_*_MAPPING_NAMES` table of its Auto class
    while this module's tests run."""
    entries: dict[str, dict[str, str]] = {auto_name: {} for auto_name in AUTO_TABLES}
    for model_type, family in {**FAMILIES, **BASELINES}.items():
        for auto_name, head in family.heads.items():
            entries[auto_name][model_type] = head.__name__
    patches = [mock.patch.dict(AUTO_TABLES[auto_name], names) for auto_name, names in entries.items()]
    for patch in patches:
        patch.start()
    yield
    for patch in reversed(patches):
        patch.stop()


class EnergyModelTester:
    """A family's tiny config and common inputs for one input type, with the sizes `ModelTesterMixin` checks.

    `seq_length` is the number of tokens the blocks see (the N of hidden states and attention maps: patches,
    plus a CLS token where the family has one, or the token ids), `num_hidden_layers` the number of layer
    applications (one hidden state after each, one attention map each).
    """

    family: ClassVar[str]
    overrides: ClassVar[dict[str, Any]] = {}
    has_cls_token: ClassVar[bool] = True  # for images

    def __init__(self, parent: unittest.TestCase, input_type: str) -> None:
        self.parent = parent
        self.input_type = input_type
        tiny = {**TINY, **BASELINE_TINY}[self.family]
        config = self.get_config()
        self.batch_size = tiny.batch
        self.is_training = True
        self.hidden_size = config.hidden_size
        self.num_attention_heads = getattr(config, "num_attention_heads", None)
        self.num_hidden_layers = self.layer_applications(config)
        self.num_labels = config.num_labels
        if input_type == "image":
            self.image_size, self.patch_size, self.num_channels = tiny.image, config.patch_size, tiny.channels
            self.seq_length = (tiny.image // config.patch_size) ** 2 + int(self.has_cls_token)
        else:
            self.vocab_size, self.seq_length = config.vocab_size, tiny.length

    def get_config(self) -> PreTrainedConfig:
        return CONFIGS[self.family](self.input_type, **self.overrides)

    def layer_applications(self, config: PreTrainedConfig) -> int:
        return config.num_hidden_layers

    def prepare_config_and_inputs(self) -> tuple[PreTrainedConfig, dict[str, Any]]:
        if self.input_type == "image":
            shape = [self.batch_size, self.num_channels, self.image_size, self.image_size]
            inputs = {"pixel_values": floats_tensor(shape)}
        else:
            shape = [self.batch_size, self.seq_length]
            inputs = {
                "input_ids": ids_tensor(shape, self.vocab_size),
                "attention_mask": random_attention_mask(shape),
            }
        return self.get_config(), inputs

    def prepare_config_and_inputs_for_common(self) -> tuple[PreTrainedConfig, dict[str, Any]]:
        return self.prepare_config_and_inputs()

    def config_tester(self) -> ConfigTester:
        """`ConfigTester` over the tiny config's own arguments (those `PreTrainedConfig` doesn't define)."""
        config = self.get_config()
        base = PreTrainedConfig().to_dict()
        kwargs = {key: value for key, value in config.to_diff_dict().items() if key not in base}
        # `common_properties=None` checks hidden_size, num_attention_heads and num_hidden_layers (+ vocab_size)
        common_properties = None if self.num_attention_heads else ["hidden_size", "num_hidden_layers"]
        return ConfigTester(
            self.parent,
            config_class=type(config),
            has_text_modality=self.input_type == "sequence",
            common_properties=common_properties,
            **kwargs,
        )


class HyperSetModelTester(EnergyModelTester):
    family = "hyperset"
    # One weight-tied layer iterated twice: 2 layer applications, each adding a hidden state and an attention
    # map (L·T of them), which keeps the mixin's "at most 2 layers" and exercises the recurrence.
    overrides: ClassVar[dict[str, Any]] = dict(num_hidden_layers=1, num_iterations=2)

    def layer_applications(self, config: PreTrainedConfig) -> int:
        return config.num_hidden_layers * config.num_iterations


class HyperSetMaskedImageModelingTester(HyperSetModelTester):
    """The paper's masked-image-modelling structure (preset `mim-1-12-d`: 2-D sin-cos positions on a 4 × 4 grid,
    step sizes from the sinusoid of t and x₀ without time MLP, RMSNorm head) at the tiny size; codebook 19 + [MASK]."""

    overrides: ClassVar[dict[str, Any]] = dict(
        HyperSetModelTester.overrides,
        position_embedding_type="sincos-2d",
        qkv_norm="shared",
        step_size_condition="input",
        iteration_conditioning="sinusoidal-no-mlp",
        step_size_norm="rmsnorm-sum",
        classifier_norm="rmsnorm",
    )


class LoopedTransformerModelTester(HyperSetModelTester):
    """The baseline of Hyper-SET's tester: the same embeddings and depth (one weight-tied layer iterated twice)."""

    family = "looped-transformer"


class IMixerModelTester(EnergyModelTester):
    family = "imixer"
    has_cls_token = False  # mean pooling over the patches


class HyperBFModelTester(EnergyModelTester):
    family = "hyperbf"


class _CommonTests(ModelTesterMixin):
    """`ModelTesterMixin` plus `ConfigTester` with a family's tester (the subclasses are the unittest cases)."""

    model_tester_class: ClassVar[type[EnergyModelTester]]
    input_type: ClassVar[str]
    # Not `__test__ = PROBLEM is None`: pytest collects a class with `__test__ = True` whatever its name.
    if PROBLEM is not None:
        __test__ = False

    def setUp(self) -> None:
        self.model_tester = self.model_tester_class(self, self.input_type)
        self.config_tester = self.model_tester.config_tester()

    def test_config(self) -> None:
        self.config_tester.run_common_tests()


class _ImageTests(_CommonTests):
    input_type = "image"
    # No token embeddings to resize: images are cut into patches (ViT's tests set the same).
    test_resize_embeddings = False

    @unittest.skip(
        reason="images have no inputs_embeds (ViT's tests skip it too); the backbone's one forward takes them for sequences"
    )
    def test_inputs_embeds(self) -> None:
        pass

    @unittest.skip(reason="images have no inputs_embeds (ViT's tests skip it too)")
    def test_inputs_embeds_matches_input_ids(self) -> None:
        pass

    def test_model_get_set_embeddings(self) -> None:
        # The one override, and not a flag: the mixin's version asserts `get_input_embeddings()` is an
        # `nn.Embedding`, which no patch-based model has. This is transformers' own override for image models,
        # verbatim from tests/models/vit/test_modeling_vit.py (and DeiT, Swin, ...): the input embedding is the
        # patch projection, and there is no output embedding. `set_input_embeddings` is checked as well.
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), (nn.Module))
            x = model.get_output_embeddings()
            self.assertTrue(x is None or isinstance(x, nn.Linear))
            replacement = nn.Conv2d(
                config.num_channels, config.hidden_size, config.patch_size, config.patch_size
            )
            model.set_input_embeddings(replacement)
            self.assertIs(model.get_input_embeddings(), replacement)


class _SequenceTests(_CommonTests):
    input_type = "sequence"


class _HyperSetAttentionDefault:
    def test_sdpa_can_dispatch_non_composite_models(self) -> None:
        # An override, not a flag: the mixin asserts that a model supporting SDPA loads with it when none is named.
        # Hyper-SET's default is the fastest path of the machine: its eager path on CPU (faster there than SDPA,
        # benchmarks/speed.py), the fused kernel or SDPA on CUDA. The rest of the check is the mixin's: SDPA and
        # eager, each asked for when loading, are what the model gets.
        for model_class in self.all_model_classes:
            config, _ = self.model_tester.prepare_config_and_inputs_for_common()
            with tempfile.TemporaryDirectory() as folder:
                model_class(config).save_pretrained(folder)
                for name in ("sdpa", "eager"):
                    loaded = model_class.from_pretrained(folder, attn_implementation=name)
                    self.assertEqual(loaded.config._attn_implementation, name)


class HyperSetImageModelTest(_HyperSetAttentionDefault, _ImageTests, unittest.TestCase):
    model_tester_class = HyperSetModelTester
    all_model_classes = (HyperSetModel, HyperSetForImageClassification)


class HyperSetSequenceModelTest(_HyperSetAttentionDefault, _SequenceTests, unittest.TestCase):
    model_tester_class = HyperSetModelTester
    all_model_classes = (HyperSetModel, HyperSetForSequenceClassification, HyperSetForTokenClassification)


class HyperSetMaskedImageModelingTest(_HyperSetAttentionDefault, _SequenceTests, unittest.TestCase):
    model_tester_class = HyperSetMaskedImageModelingTester
    all_model_classes = (HyperSetForMaskedImageModeling,)


class IMixerImageModelTest(_ImageTests, unittest.TestCase):
    model_tester_class = IMixerModelTester
    all_model_classes = (IMixerModel, IMixerForImageClassification)
    # An MLP-Mixer: token mixing is an MLP, there are no attention maps.
    has_attentions = False


class IMixerSequenceModelTest(_SequenceTests, unittest.TestCase):
    model_tester_class = IMixerModelTester
    all_model_classes = (IMixerModel, IMixerForSequenceClassification)
    has_attentions = False  # as above


class HyperBFImageModelTest(_ImageTests, unittest.TestCase):
    model_tester_class = HyperBFModelTester
    all_model_classes = (HyperBFModel, HyperBFForImageClassification)


class HyperBFSequenceModelTest(_SequenceTests, unittest.TestCase):
    model_tester_class = HyperBFModelTester
    all_model_classes = (HyperBFModel, HyperBFForSequenceClassification)


class LoopedTransformerImageModelTest(_ImageTests, unittest.TestCase):
    model_tester_class = LoopedTransformerModelTester
    all_model_classes = (LoopedTransformerModel, LoopedTransformerForImageClassification)


class LoopedTransformerSequenceModelTest(_SequenceTests, unittest.TestCase):
    model_tester_class = LoopedTransformerModelTester
    all_model_classes = (
        LoopedTransformerModel,
        LoopedTransformerForSequenceClassification,
        LoopedTransformerForTokenClassification,
    )
