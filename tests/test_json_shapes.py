"""Files a user can edit or a broken run can leave behind, valid JSON of the wrong shape (not an object, a field
missing or of another type): each command refuses them as it refuses a missing or corrupt file, in one line naming
the file and what was expected (`weights.read_json_object`, `mim.read_tokenizer_settings`), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_checkpoint_layouts import ARGV, LAYOUTS, tree
from test_export import build_model_dir

from energyformers import FAMILIES
from energyformers.mim import PatchKMeansTokenizer, VQGANTokenizer, load_vq_tokenizer, read_tokenizer_settings
from energyformers.training import cli, export, push, weights

# (file, its new text, or config.json changes; a part of the message after the file's path)
DEEP_JSON = "[" * 100_000 + "]" * 100_000
FOLDER_CASES = {
    "config_model_type_list": ("config.json", {"model_type": ["x"]}, 'model_type=["x"] is not a string'),
    "config_architectures_nested": ("config.json", {"architectures": [["x"]]}, "architectures=[['x']]"),
    "config_architectures_object": ("config.json", {"architectures": {"a": 1}}, "is not a list"),
    "config_input_type_list": ("config.json", {"input_type": []}, "input_type=[] is not a string"),
    "inspect_list": ("inspect.json", "[]", "holds a JSON list, not an object"),
    "inspect_figures_number": ("inspect.json", '{"figures": 5}', "figures=5 is not a list"),
    "metrics_string": ("metrics.json", '"x"', "holds a JSON str, not an object"),
    "metrics_invalid": ("metrics.json", "{", "not valid JSON"),
    # deeper than Python's JSON parser recurses: its RecursionError was a traceback
    "metrics_too_deep": ("metrics.json", DEEP_JSON, "not valid JSON (nested too deeply to read"),
    "metrics_recipe_string": ("metrics.json", '{"recipe": "x"}', 'recipe="x" is not an object'),
    "metrics_wall_time_string": ("metrics.json", '{"wall_time_s": "1"}', 'wall_time_s="1" is not a number'),
    "metrics_warnings_numbers": ("metrics.json", '{"warnings": [1]}', "warnings holds a value that is not"),
    "metrics_from_pretrained": (
        "metrics.json",
        '{"recipe": {"from_pretrained": 3}}',
        "recipe.from_pretrained=3 is not a string",
    ),
}


def _write(folder: Path, name: str, content: str | dict) -> Path:
    path = folder / name
    if isinstance(content, dict):  # changes to the folder's own file, so only the changed field is wrong
        content = json.dumps({**json.loads(path.read_text()), **content})
    path.write_text(content)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_model_dir(
        tmp_path_factory.mktemp("json") / "model",
        sorted(FAMILIES)[0],
        "AutoModelForImageClassification",
        "image",
    )


@pytest.fixture
def folder(model_dir, tmp_path) -> Path:
    copy = tmp_path / "model"
    copy.mkdir()
    for path in model_dir.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    return copy


@pytest.mark.parametrize("command", ["export", "push"])
@pytest.mark.parametrize("case", sorted(FOLDER_CASES))
def test_a_file_of_the_wrong_shape_is_refused_in_one_line_naming_it(folder, tmp_path, capsys, command, case):
    name, content, expected = FOLDER_CASES[case]
    path = _write(folder, name, content)
    capsys.readouterr()
    if command == "export":
        status = export.main([str(folder), str(tmp_path / "out")])
    else:  # refused while its arguments are checked, before the token is looked at
        status = push.main([str(folder), "someone/tiny"])
    err = capsys.readouterr().err
    assert status == 2, (status, err)
    assert err.startswith(f"energyformers {command}: error: ") and err.count("\n") == 1, err
    assert f"{path}: " in err and expected in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["export", "push", "predict"])
def test_a_config_nested_too_deeply_is_refused_in_one_line_naming_it(folder, tmp_path, capsys, command):
    """config.json deeper than Python's JSON parser recurses: the folder check's one line, not a RecursionError
    traceback (transformers' own config reader raises one)."""
    from energyformers.training import predict

    (folder / "config.json").write_text(DEEP_JSON)
    capsys.readouterr()
    argv = {"export": [str(tmp_path / "out")], "push": ["someone/tiny"], "predict": ["text"]}[command]
    status = {"export": export.main, "push": push.main, "predict": predict.main}[command](
        [str(folder), *argv]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, (status, err)
    expected = (
        f"{folder}: config.json is not readable JSON (nested too deeply to read: Python's JSON parser stops"
    )
    assert err.startswith(f"energyformers {command}: error: ") and expected in err, err


def test_a_safetensors_index_naming_no_files_is_refused(folder, tmp_path, capsys):
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {"w": 1}}')
    capsys.readouterr()
    assert export.main([str(folder), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"energyformers export: error: model folder {folder}: model.safetensors.index.json is not a safetensors "
        "index (a weight_map value is not a file name)\n"
    ), err


def test_an_image_tokenizer_config_of_the_wrong_shape_does_not_stop_the_overlap_check(folder, capsys):
    """`export MODEL MODEL/sub --overwrite` reads the image tokenizer's settings to protect its subfolder; settings
    it cannot read protect nothing (the folder's check names them where the model needs them), so an image model's
    export, which carries no image tokenizer, goes on."""
    (folder / "vq_tokenizer_config.json").write_text("[]")
    (folder / "sub").mkdir()
    capsys.readouterr()
    assert export.main([str(folder), str(folder / "sub"), "--overwrite"]) == 0, capsys.readouterr().err
    assert (folder / "sub" / "model.safetensors").is_file()


# The file each training loop reads to resume, damaged in ways a killed run or an edit leaves it.
STATE_CASES = {
    "train": [
        ("[]", "holds a JSON list, not an object"),
        ('{"step": 3}', "no 'global_step' (an integer)"),
        # what transformers' TrainerState loader refuses, and the fields Trainer's resume computes with
        (
            '{"global_step": 3, "bogus": 1}',
            "not a state transformers' Trainer reads (TrainerState.__init__() got an unexpected keyword argument "
            "'bogus')",
        ),
        ('{"global_step": 3, "total_flos": "1e9"}', 'total_flos="1e9" is not a number'),
        ('{"global_step": 3, "num_input_tokens_seen": 1.5}', "num_input_tokens_seen=1.5 is not an integer"),
        ('{"global_step": 3, "best_metric": "0.5"}', 'best_metric="0.5" is not a number'),
        (
            '{"global_step": 3, "log_history": [{"loss": 1.0, "step": 1}, {"loss": "x", "step": 2}]}',
            "log_history[1] is not an object whose loss and step are numbers",
        ),
        (
            '{"global_step": 3, "log_history": [3]}',
            "log_history[0] is not an object whose loss and step are numbers",
        ),
    ],
    "train-accelerate": [
        ("[]", "holds a JSON list, not an object"),
        ('{"step": 3}', "no 'history' (a list)"),
        ('{"step": "3", "history": []}', 'step="3" is not an integer'),
    ],
}


@pytest.mark.parametrize(
    ("command", "content", "expected"),
    [(command, *case) for command, cases in STATE_CASES.items() for case in cases],
)
def test_resume_refuses_a_damaged_state_file_before_any_work(tmp_path, capsys, command, content, expected):
    work = tmp_path / "run.checkpoints"
    checkpoint = work / LAYOUTS[command][0].format(3)
    checkpoint.mkdir(parents=True)
    (checkpoint / LAYOUTS[command][1]).write_text(content)
    before = tree(work)
    status = cli.main([command, *ARGV, "--output_dir", str(tmp_path / "run"), "--resume"])
    err = capsys.readouterr().err
    assert status == 2, (status, err)
    assert err == (
        f"energyformers {command}: error: {checkpoint / LAYOUTS[command][1]}: {expected}; delete {checkpoint} to "
        f"resume from an earlier checkpoint, or {work} to start again.\n"
    ), err
    assert tree(work) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run.checkpoints"]


# fields Trainer overwrites or only compares on resume: it resumes from these states, so the check lets them through
RESUMABLE_STATES = [
    {"logging_steps": True},
    {"best_model_checkpoint": 5},
    {"stateful_callbacks": {"TrainerControl": 1}},
    {"max_steps": "4", "epoch": "1"},
]


@pytest.mark.parametrize("fields", RESUMABLE_STATES, ids=lambda fields: ",".join(fields))
def test_resume_reads_the_step_of_a_state_trainer_resumes_from(tmp_path, fields):
    from energyformers.training import train

    checkpoint = tmp_path / "run.checkpoints" / "checkpoint-3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 3, **fields}))
    assert train.checkpoint_step(checkpoint) == 3


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("vq")
    PatchKMeansTokenizer(torch.rand(4, 4), patch_size=2, image_size=(8, 8), num_channels=1).save_pretrained(
        folder
    )
    return folder


TOKENIZER_LOADERS = {
    "load_vq_tokenizer": load_vq_tokenizer,
    "PatchKMeansTokenizer": PatchKMeansTokenizer.from_pretrained,
    "VQGANTokenizer": VQGANTokenizer.from_pretrained,
}
TOKENIZER_CASES = {
    "list": (lambda s: [], "holds a JSON list, not an object"),
    "class_list": (lambda s: {**s, "tokenizer_class": ["x"]}, 'tokenizer_class=["x"] is not a string'),
    "subfolder_number": (lambda s: {**s, "subfolder": 3}, "subfolder=3 is not a string"),
}


# a codebook tokenizer's settings name no subfolder: only the VQGAN reads one
TOKENIZER_PAIRS = [
    (loader, case)
    for loader in sorted(TOKENIZER_LOADERS)
    for case in sorted(TOKENIZER_CASES)
    if case != "subfolder_number" or loader == "VQGANTokenizer"
]


@pytest.mark.parametrize(("loader", "case"), TOKENIZER_PAIRS)
def test_image_tokenizer_settings_of_the_wrong_shape_are_named(tokenizer_dir, tmp_path, loader, case):
    change, expected = TOKENIZER_CASES[case]
    for path in tokenizer_dir.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    settings = json.loads((tmp_path / "vq_tokenizer_config.json").read_text())
    (tmp_path / "vq_tokenizer_config.json").write_text(json.dumps(change(settings)))
    with pytest.raises(ValueError) as raised:
        TOKENIZER_LOADERS[loader](tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'vq_tokenizer_config.json'}: ") and expected in message, message


@pytest.mark.parametrize("key", ["patch_size", "image_size", "num_channels"])
def test_a_codebook_tokenizer_without_a_setting_is_named(tokenizer_dir, tmp_path, key):
    for path in tokenizer_dir.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    settings = json.loads((tmp_path / "vq_tokenizer_config.json").read_text())
    del settings[key]
    (tmp_path / "vq_tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(ValueError, match=rf"vq_tokenizer_config.json: no '{key}' \(an? "):
        load_vq_tokenizer(tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{}", "no 'n' (an integer)"),
        ('{"n": true}', "n=true is not an integer"),
        ('{"n": 1, "x": [1]}', "x=[1] is not a number"),
        ('{"n": 1, "x": "' + "y" * 60 + '"}', 'x="' + "y" * 36 + "... is not a number"),
    ],
)
def test_read_json_object_names_the_field_and_its_type(tmp_path, text, expected):
    path = tmp_path / "f.json"
    path.write_text(text)
    with pytest.raises(ValueError) as raised:
        weights.read_json_object(path, {"n": int}, optional={"x": (int, float)}, remedy="fix it")
    assert str(raised.value) == f"{path}: {expected}; fix it.", str(raised.value)
    path.write_text('{"n": 1, "x": null}')
    assert weights.read_json_object(path, {"n": int}, optional={"x": (int, float)}) == {"n": 1, "x": None}


# The same bad file for both readers: mim's copy (which the exported pipeline code carries) and the training
# package's must word it alike, remedy included (both tell the user to save the image tokenizer again).
READER_CASES = {
    "invalid": "{",
    "too_deep": DEEP_JSON,
    "not_utf8": b"\xff\xfe{",
    "list": "[]",
    "string": '"x"',
    "missing": '{"image_size": [8, 8]}',
    "null": '{"patch_size": null, "image_size": [8, 8]}',
    "bool_for_int": '{"patch_size": true, "image_size": [8, 8]}',
    "float_for_int": '{"patch_size": 2.5, "image_size": [8, 8]}',
    "long_value": '{"patch_size": 2, "image_size": "' + "y" * 60 + '"}',
    "value_of_40": '{"patch_size": 2, "image_size": "' + "y" * 38 + '"}',
    "value_of_41": '{"patch_size": 2, "image_size": "' + "y" * 39 + '"}',
    "optional_number": '{"patch_size": 2, "image_size": [8, 8], "subfolder": 3}',
    "a_folder": None,
}


@pytest.mark.parametrize("case", sorted(READER_CASES))
def test_mims_json_reader_words_a_bad_file_as_the_shared_reader_does(tmp_path, case):
    content, path = READER_CASES[case], tmp_path / "vq_tokenizer_config.json"
    if content is None:
        path.mkdir()  # exists, but cannot be read as a file
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    fields = {"patch_size": int, "image_size": list}
    messages = []
    for read in (
        lambda: read_tokenizer_settings(path, fields, optional=("subfolder",)),
        lambda: weights.read_json_object(
            path, fields, optional={"subfolder": str}, remedy=export.TOKENIZER_REMEDY
        ),
    ):
        with pytest.raises(ValueError) as raised:
            read()
        messages.append(str(raised.value))
    assert messages[0] == messages[1], messages
    assert messages[0].startswith(f"{path}: ") and messages[0].endswith(f"; {export.TOKENIZER_REMEDY}."), (
        messages
    )


def test_mims_json_reader_and_the_shared_reader_accept_the_same_file(tmp_path):
    path = tmp_path / "vq_tokenizer_config.json"
    path.write_text('{"patch_size": 2, "image_size": [8, 8], "subfolder": null}')
    fields = {"patch_size": int, "image_size": list}
    read = read_tokenizer_settings(path, fields, optional=("subfolder",))
    assert read == weights.read_json_object(path, fields, optional={"subfolder": str}), read
