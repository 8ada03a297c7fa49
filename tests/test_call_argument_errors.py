"""Call-time arguments that used to be accepted and then read wrongly or not at all, refused by name:

* an `attention_mask` holding values other than 0 and 1 (an additive float mask, an integer padding sentinel), and
  a float one under torch.compile / torch.jit.trace, in every family's models (the wording of
  `energyformers.energy`); a float 0/1 mask is read as the integer one;
* `from_pretrained` of a folder that holds another model type;
* per-call depth arguments that the call would ignore;
* `decode(seed=)`, `minimize_energy`'s tolerance and step size, `task_of`'s task, the depth pipelines' arguments.
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import PIL.Image
import pytest
import torch
import transformers
from fixtures import SEQUENCE, Case, looped_transformer_config, perturb

from energyformers import (
    FAMILIES,
    INPUT_TYPES,
    HyperSetForImageClassification,
    IMixerForImageClassification,
    LoopedTransformerForImageClassification,
    LoopedTransformerForSequenceClassification,
    task_of,
)
from energyformers.energy import EnergyAttention, minimize_energy

# ------------------------------------------------------------------------------------------- attention_mask

MASK_CASES = [
    *SEQUENCE,
    # the looped baseline (no family of FAMILIES) reads its mask through Hyper-SET's embeddings
    pytest.param(None, id="looped"),
]


def _model_and_inputs(case: Case | None) -> tuple[torch.nn.Module, dict]:
    if case is None:
        torch.manual_seed(0)
        config = looped_transformer_config("sequence")
        model = perturb(LoopedTransformerForSequenceClassification(config)).eval()
        return model, _sequence_inputs()
    return perturb(case.build()), case.inputs()


def _sequence_inputs() -> dict:
    ids = torch.randint(1, 20, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _through(model: torch.nn.Module, inputs: dict, through: str) -> dict:
    """`inputs` with the ids replaced by their embeddings for `through="inputs_embeds"`."""
    if through == "inputs_embeds":
        inputs["inputs_embeds"] = model.get_input_embeddings()(inputs.pop("input_ids"))
    return inputs


@pytest.mark.parametrize("case", MASK_CASES, ids=str)
@pytest.mark.parametrize("through", ["input_ids", "inputs_embeds"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_a_float_0_1_attention_mask_gives_the_integer_masks_outputs_in_every_model(case, through, dtype):
    # `batch["attention_mask"].float()`, as BERT and ViT take it: 0 and 1 are exact in every float dtype, so the
    # keep-mask, and with it every output, is the integer mask's bit for bit (tolerance 0)
    model, inputs = _model_and_inputs(case)
    with torch.no_grad():
        inputs = _through(model, inputs, through)
        integer = model(**inputs)[0]
        inputs["attention_mask"] = inputs["attention_mask"].to(dtype)
        floating = model(**inputs)[0]
    difference = (floating - integer).abs().max().item()
    assert torch.equal(floating, integer), f"{dtype} 0/1 mask vs integer mask: max |difference| {difference}"


ADDITIVE = {"-inf": -torch.inf, "-1e9": -1e9}


@pytest.mark.parametrize("case", MASK_CASES, ids=str)
@pytest.mark.parametrize("through", ["input_ids", "inputs_embeds"])
@pytest.mark.parametrize("blocked", list(ADDITIVE), ids=str)
def test_an_additive_float_attention_mask_is_refused_in_every_model(case, through, blocked):
    # 0 means "attend" here and "masked" in a 0/1 mask: read as a keep-mask, it would attend only the padding
    model, inputs = _model_and_inputs(case)
    keep = inputs["attention_mask"].bool()
    inputs["attention_mask"] = torch.zeros(keep.shape).masked_fill(~keep, ADDITIVE[blocked])
    seen = torch.tensor([ADDITIVE[blocked]]).tolist()  # as float32 prints it
    with pytest.raises(ValueError) as raised:
        model(**_through(model, inputs, through))
    expected = (
        f"a float attention_mask must hold only 0 and 1 (1: attend, 0: masked); got 2 other value(s), among them "
        f"{seen}. An additive mask (0: attend, -inf or a large negative number: masked) converts with "
        "`attention_mask == 0`."
    )
    assert str(raised.value) == expected, f"{raised.value}\n!=\n{expected}"


TRACED_MESSAGE = (
    "attention_mask must be bool (True: attend) or integer 0/1 (1: attend) under torch.compile, torch.export and "
    "torch.jit.trace"
)


def _compile(model: torch.nn.Module, inputs: dict) -> object:
    torch._dynamo.reset()
    return torch.compile(model, backend="eager")(**inputs)


def _jit_trace(model: torch.nn.Module, inputs: dict) -> object:
    # torch.jit.trace on purpose (users still call it, deprecated as it is): its warnings are filtered here, around
    # this call only, by message and by the module raising them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings(
            "ignore",
            r"`torch\.jit\.trace(_method)?` is deprecated",
            DeprecationWarning,
            r"torch\.jit\._trace\Z",
        )
        # jit.trace reads every attribute of the module it traces (torch._jit_internal.module_has_exports),
        # transformers' deprecated `PreTrainedModel.is_gradient_checkpointing` property among them
        warnings.filterwarnings(
            "ignore",
            "`is_gradient_checkpointing` is deprecated",
            FutureWarning,
            r"transformers\.modeling_utils\Z",
        )
        return torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)


@pytest.mark.parametrize("case", MASK_CASES, ids=str)
@pytest.mark.parametrize("trace", [_compile, _jit_trace], ids=["compile", "jit.trace"])
def test_a_float_attention_mask_is_refused_when_traced(case, trace):
    # a traced graph cannot read the values that tell a 0/1 mask from an additive one: refused, as before float
    # 0/1 masks were accepted in eager mode, with both conversions in the message
    model, inputs = _model_and_inputs(case)
    inputs["attention_mask"] = inputs["attention_mask"].float()
    with pytest.raises(ValueError, match=re.escape(TRACED_MESSAGE)) as raised:
        trace(model, inputs)
    assert "`attention_mask.bool()`" in str(raised.value) and "`attention_mask == 0`" in str(raised.value)


@pytest.mark.parametrize("case", MASK_CASES, ids=str)
@pytest.mark.parametrize("through", ["input_ids", "inputs_embeds"])
@pytest.mark.parametrize("stray", [2, -1])  # -1: a padding sentinel copied from labels, say
def test_an_integer_attention_mask_other_than_0_1_is_refused_in_every_model(case, through, stray):
    # either would read as "attend" through `mask.bool()`
    model, inputs = _model_and_inputs(case)
    mask = inputs["attention_mask"].clone()
    mask[0, 0] = stray  # one stray value, on a position that is otherwise attended
    inputs["attention_mask"] = mask
    inputs = _through(model, inputs, through)
    with pytest.raises(
        ValueError, match=rf"an integer attention_mask must hold only 0 and 1 \(1: attend\); got {stray}"
    ):
        model(**inputs)


@pytest.mark.parametrize("case", MASK_CASES, ids=str)
def test_bool_and_integer_0_1_masks_give_the_same_outputs(case):
    model, inputs = _model_and_inputs(case)
    with torch.no_grad():
        integer = model(**inputs)[0]
        inputs["attention_mask"] = inputs["attention_mask"].bool()
        boolean = model(**inputs)[0]
    torch.testing.assert_close(boolean, integer, atol=0, rtol=0)


def test_the_energy_module_reads_and_refuses_masks_in_the_models_words():
    attention = EnergyAttention(8, 2)
    state = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    keep = torch.tensor([[1, 1, 0], [1, 1, 1]])
    with torch.no_grad():
        integer, floating = (attention(state, attention_mask=mask)[0] for mask in (keep, keep.float()))
    difference = (floating - integer).abs().max().item()
    assert torch.equal(floating, integer), f"float 0/1 mask vs integer mask: max |difference| {difference}"
    with pytest.raises(ValueError, match=r"a float attention_mask must hold only 0 and 1 .*\[-inf\]"):
        attention(state, attention_mask=torch.zeros(2, 3).masked_fill(keep == 0, -torch.inf))
    with pytest.raises(ValueError, match="must hold only 0 and 1"):
        attention(state, attention_mask=torch.full((2, 3), 2))


# ------------------------------------------------------------------------------------- from_pretrained model_type


@pytest.fixture(scope="module")
def saved_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny saved image classifier per model type: the three families, the looped baseline and a ViT."""
    root = tmp_path_factory.mktemp("model-types")
    folders = {}
    for family in FAMILIES:
        case = Case.of(FAMILIES[family].heads["AutoModelForImageClassification"])
        case.build().save_pretrained(root / family)
        folders[family] = root / family
    torch.manual_seed(0)
    looped = looped_transformer_config("image")
    LoopedTransformerForImageClassification(looped).save_pretrained(root / "looped_transformer")
    folders["looped_transformer"] = root / "looped_transformer"
    vit = transformers.ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=4,
    )
    transformers.ViTForImageClassification(vit).save_pretrained(root / "vit")
    folders["vit"] = root / "vit"
    return folders


IMAGE_CLASSES = {
    **{family: spec.heads["AutoModelForImageClassification"] for family, spec in FAMILIES.items()},
    "looped_transformer": LoopedTransformerForImageClassification,
}


@pytest.mark.parametrize("target", list(IMAGE_CLASSES))
@pytest.mark.parametrize("source", [*IMAGE_CLASSES, "vit"])
def test_from_pretrained_refuses_a_folder_of_another_model_type(saved_folders, source, target):
    model_class, folder = IMAGE_CLASSES[target], saved_folders[source]
    if source == target:
        model, loading = model_class.from_pretrained(folder, output_loading_info=True)
        assert type(model) is model_class and not any(loading.values()), loading
        return
    with pytest.raises(ValueError) as refused:
        model_class.from_pretrained(folder)
    expected = model_class.config_class.model_type
    found = "vit" if source == "vit" else IMAGE_CLASSES[source].config_class.model_type
    message = str(refused.value)
    assert f"{folder} holds a '{found}' model" in message, message
    assert f"{model_class.__name__} loads '{expected}' models" in message, message


@pytest.mark.parametrize("source", list(IMAGE_CLASSES))
def test_auto_classes_still_load_every_model_type(saved_folders, source):
    model = transformers.AutoModelForImageClassification.from_pretrained(saved_folders[source])
    assert type(model) is IMAGE_CLASSES[source]


@pytest.mark.parametrize("target", list(IMAGE_CLASSES))
def test_the_model_type_check_reads_config_json_in_the_subfolder_from_pretrained_loads(saved_folders, target):
    # `saved_folders`' root holds no config.json, each model type's folder under it one: a check that looked at
    # the root (not `subfolder=`) would find nothing and let transformers load a randomly initialised model
    model_class, root = IMAGE_CLASSES[target], saved_folders[target].parent
    model, loading = model_class.from_pretrained(root, subfolder=target, output_loading_info=True)
    assert type(model) is model_class and not any(loading.values()), loading
    other = next(source for source in IMAGE_CLASSES if source != target)
    found = IMAGE_CLASSES[other].config_class.model_type
    with pytest.raises(ValueError) as refused:
        model_class.from_pretrained(root, subfolder=other)
    message = str(refused.value)
    assert f"holds a '{found}' model" in message, message


@pytest.mark.parametrize("target", list(IMAGE_CLASSES))
def test_a_folder_whose_config_names_no_model_type_is_left_to_transformers(saved_folders, target, tmp_path):
    model_class, folder = IMAGE_CLASSES[target], tmp_path / target
    shutil.copytree(saved_folders[target], folder)
    config = json.loads((folder / "config.json").read_text())
    del config["model_type"]
    (folder / "config.json").write_text(json.dumps(config))
    model, loading = model_class.from_pretrained(folder, output_loading_info=True)
    assert type(model) is model_class and not any(loading.values()), loading


# ------------------------------------------------------------------------------ per-call arguments a call ignores


def _image_head(model_class: type, **overrides: object) -> tuple[torch.nn.Module, torch.Tensor]:
    if model_class is LoopedTransformerForImageClassification:
        torch.manual_seed(0)
        config = looped_transformer_config("image", **overrides)
        model = perturb(model_class(config)).eval()
    else:
        model = perturb(Case.of(model_class).build(**overrides))
    shape = (2, model.config.num_channels, model.config.image_size, model.config.image_size)
    return model, torch.randn(shape, generator=torch.Generator().manual_seed(3))


def test_halting_criterion_without_a_tolerance_is_refused():
    model, pixels = _image_head(HyperSetForImageClassification)
    assert model.config.halting_tolerance is None
    with pytest.raises(ValueError, match=r"halting_criterion='energy' says what halting_tolerance measures"):
        model(pixel_values=pixels, halting_criterion="energy")
    with torch.no_grad():  # with a tolerance, of the call or of the config, the criterion is read
        model(pixel_values=pixels, halting_criterion="energy", halting_tolerance=1e-3)
        model.config.halting_tolerance = 1e-3
        model(pixel_values=pixels, halting_criterion="energy")


@pytest.mark.parametrize(
    "model_class",
    [HyperSetForImageClassification, LoopedTransformerForImageClassification],
    ids=["hyperset", "looped"],
)
def test_halting_threshold_without_a_halting_head_is_refused(model_class):
    model, pixels = _image_head(model_class)
    assert not model.config.halting_head
    with pytest.raises(ValueError, match=r"halting_threshold=0.5 is what the halting head's probability"):
        model(pixel_values=pixels, halting_threshold=0.5)
    halting, pixels = _image_head(model_class, halting_head=True, supervision_steps=2)
    with torch.no_grad():
        halting(pixel_values=pixels, halting_threshold=0.5)


def test_imixer_fixed_point_tolerance_with_the_unrolled_solver_is_refused():
    model, pixels = _image_head(IMixerForImageClassification)
    assert model.config.fixed_point_solver == "unrolled"
    with pytest.raises(
        ValueError, match=r"fixed_point_tolerance=0.5 is where the picard and anderson solvers stop"
    ):
        model(pixel_values=pixels, fixed_point_tolerance=0.5)
    with torch.no_grad():
        model(pixel_values=pixels, fixed_point_tolerance=0.5, fixed_point_solver="picard")


# ------------------------------------------------------------------------------------------------ smaller cases


@pytest.mark.parametrize(("seed", "shown"), [(-1, "-1"), (2**64, str(2**64)), (1.5, "1.5"), (True, "True")])
def test_decode_refuses_a_seed_outside_0_to_2_63(seed, shown):
    from test_mim import tiny_trained_free_model

    model = tiny_trained_free_model()
    codes = torch.full((1, 16), model.mask_token_id)
    with pytest.raises(
        ValueError, match=re.escape(f"seed must be None or an integer in [0, 2**63); got {shown}.")
    ):
        model.decode(codes, steps=1, seed=seed)
    with pytest.raises(ValueError, match=r"generator must be None or a torch\.Generator; got str"):
        model.decode(codes, steps=1, generator="x")


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("tolerance", float("nan"), "tolerance must be None or a finite number >= 0; got nan"),
        ("tolerance", float("inf"), "tolerance must be None or a finite number >= 0; got inf"),
        ("step_size", float("inf"), "step_size must be a finite number > 0; got inf"),
    ],
)
def test_minimize_energy_refuses_non_finite_tolerance_and_step_size(argument, value, message):
    state = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=re.escape(message)):
        minimize_energy(lambda x: x.pow(2).sum(-1), state, **{argument: value})


def test_task_of_an_unknown_input_type_lists_the_input_types_and_their_tasks():
    with pytest.raises(ValueError) as refused:
        task_of("video", "AutoModel")
    message = str(refused.value)
    assert "input_type='video' is not an input type; expected one of ['image', 'sequence']" in message, (
        message
    )
    for spec in INPUT_TYPES.values():
        assert all(task in message for task in spec.tasks), message


@pytest.mark.parametrize(
    ("model_class", "call", "message"),
    [
        (
            HyperSetForImageClassification,
            dict(num_iterations=0),
            "num_iterations must be an integer >= 1; got 0",
        ),
        (
            HyperSetForImageClassification,
            dict(halting_criterion="energy"),
            "says what halting_tolerance measures",
        ),
        (
            HyperSetForImageClassification,
            dict(search_seed=1),
            r"search_seed=1 given without search_trajectories",
        ),
        (
            HyperSetForImageClassification,
            dict(search_trajectories=2, search_noise=-1.0),
            "search_noise must be",
        ),
        (HyperSetForImageClassification, dict(halting_threshold=0.5), "has no halting head"),
        (
            LoopedTransformerForImageClassification,
            dict(num_iterations=-1),
            "num_iterations must be an integer",
        ),
        (IMixerForImageClassification, dict(fixed_point_iterations=-1), "invalid fixed_point_iterations=-1"),
        (
            IMixerForImageClassification,
            dict(fixed_point_tolerance=0.5),
            "the picard and anderson solvers stop",
        ),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else None,
)
def test_depth_pipelines_check_their_arguments_when_built(model_class, call, message):
    from transformers import pipeline

    from energyformers.pipelines import ImageClassificationPipeline
    from energyformers.training.processing import build_image_processor

    model, _ = _image_head(model_class, num_channels=3)  # the pipeline converts every image to RGB
    processor = build_image_processor(model.config)
    with pytest.raises(ValueError, match=message):
        pipeline(
            "image-classification",
            model=model,
            image_processor=processor,
            pipeline_class=ImageClassificationPipeline,
            **call,
        )


@pytest.mark.parametrize(
    ("family", "flags", "message"),
    [
        ("hyperset", ["--halting_threshold", "0.5"], "has no halting head"),
        ("imixer", ["--fixed_point_tolerance", "0.5"], "the picard and anderson solvers stop"),
    ],
)
def test_predict_refuses_a_flag_the_model_call_would_ignore_in_one_line(
    tmp_path, capsys, family, flags, message
):
    from test_cli_errors import model_folder

    from energyformers.training import predict

    folder = model_folder(tmp_path / family, family)
    image = tmp_path / "x.png"
    pixels = torch.rand(8, 8, 3, generator=torch.Generator().manual_seed(3))
    PIL.Image.fromarray((pixels * 255).byte().numpy()).save(image)
    capsys.readouterr()  # the save's progress bar
    assert predict.main([str(folder), str(image), *flags]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"energyformers predict: error: {' '.join(flags)}: ") and message in line, line
