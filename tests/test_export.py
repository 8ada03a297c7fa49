"""Hub export (`energyformers export`): flat remote code, auto_map, processor, model card, atomic writes.

Every family in `energyformers.FAMILIES` and every Auto class it registers is covered automatically. The
remote-code checks load the exported folders in ONE fresh interpreter started with `-I -S` and only the
venv's site-packages on `sys.path` (so the editable-install finder is never installed): `energyformers` is
not importable there, which the tests assert, and the model classes must come from the folders' own code.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from fixtures import ALL, Case, perturb, run_cli_cases, tiny_vq_model
from huggingface_hub import ModelCard
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, ViTImageProcessorPil, pipeline

import energyformers
from energyformers import FAMILIES, INPUT_TYPES, task_of
from energyformers.training import export, release
from energyformers.training.export import export_model_dir, generate_remote_code, remote_code_sources
from energyformers.training.weights import WeightsMismatchError

# --------------------------------------------------------------------------------------------- helpers
WORDS = "[PAD] [UNK] [CLS] [SEP] a an the good bad great boring film movie plot acting and not".split()
SENTENCES = ["a good film", "boring plot and not great acting"]
PIPELINE_TEXT = "the movie is not bad"
LABELS = {0: "LOW", 1: "MID", 2: "HIGH"}  # no "O": the token-classification pipeline would drop those tokens
# The fixture metrics.json of the *tiny untrained* test models; values are placeholders, never published.
FIXTURE_METRICS = {
    "preset": None,
    "dataset": "digits",
    "num_parameters": 0,
    "recipe": {"command": "pytest fixture", "epochs": 0.0, "learning_rate": 0.0, "batch_size": 1, "seed": 0},
    "eval": {"accuracy": 0.25, "f1_macro": 0.125},
    "test": {"accuracy": 0.375, "f1_macro": 0.1875},
    "wall_time_s": 0.0,
}
# A token-classification head is the Sudoku model: its run records board and blank-cell accuracy (placeholders too).
SUDOKU_FIXTURE_METRICS = {
    **FIXTURE_METRICS,
    "eval": {"blank_cell_accuracy": 0.25, "board_accuracy": 0.125},
    "test": {"blank_cell_accuracy": 0.375, "board_accuracy": 0.1875},
}


# Heads whose pipeline needs more than the folders of this table hold: masked image modelling over VQ codes (its task
# "masked-image-modeling" is `MaskedImageModelingPipeline`, which reads the image tokenizer these folders lack). Their
# export is checked without a pipeline here, and with their tokenizer in the MIM section below.
NO_PIPELINE = {"AutoModelForMaskedImageModeling"}

# (model_type, Auto class, input_type, pipeline task) for every head of every registered family
CASES = [(c.family, c.auto_name, c.input_type, task_of(c.input_type, c.auto_name)) for c in ALL]
CASE_IDS = [f"{m}-{a.removeprefix('AutoModel') or 'Model'}-{i}" for m, a, i, _ in CASES]


def make_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"
    )


def export_overrides(input_type: str) -> dict:
    """What the shared tiny configs (tests/fixtures.py) need here: RGB images, this file's tokenizer, LABELS."""
    overrides = dict(num_channels=3, num_labels=len(LABELS), id2label=LABELS)
    overrides["label2id"] = {v: k for k, v in LABELS.items()}
    return {**overrides, "vocab_size": len(WORDS)} if input_type == "sequence" else overrides


def build_model_dir(
    path: Path,
    model_type: str,
    auto_class: str,
    input_type: str,
    metrics: dict | None = FIXTURE_METRICS,
    labels: dict[int, str] | None = None,
) -> Path:
    """A model folder like `energyformers train` writes: tiny random model + processor (+ metrics.json); `labels`
    (default LABELS) for a folder that must match a dataset's label set."""
    overrides = export_overrides(input_type)
    if labels is not None:
        overrides.update(num_labels=len(labels), id2label=labels, label2id={v: k for k, v in labels.items()})
    model = Case(model_type, auto_class, input_type).build(**overrides)
    perturb(model)  # move off the initialisation (e.g. zero step sizes) so every code path matters
    model.save_pretrained(path)
    if input_type == "image":
        ViTImageProcessorPil(
            size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3
        ).save_pretrained(path)
    else:
        make_tokenizer().save_pretrained(path)
    if metrics is not None:
        task = "image-classification" if input_type == "image" else "text-classification"
        if auto_class == "AutoModelForTokenClassification":
            task, metrics = (
                "token-classification",
                SUDOKU_FIXTURE_METRICS if metrics is FIXTURE_METRICS else metrics,
            )
        (path / "metrics.json").write_text(json.dumps({"model": model_type, "task": task, **metrics}))
    return path


def model_inputs(input_type: str) -> dict[str, torch.Tensor]:
    if input_type == "image":
        return {"pixel_values": torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))}
    encoded = make_tokenizer()(SENTENCES, padding=True, return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def pipeline_image_bytes() -> list[int]:
    """An 8×8 RGB test image as raw bytes (rebuilt with PIL in the child process)."""
    return torch.randint(0, 256, (8 * 8 * 3,), generator=torch.Generator().manual_seed(2)).tolist()


def pipeline_input(input_type: str):
    if input_type == "sequence":
        return PIPELINE_TEXT
    from PIL import Image

    return Image.frombytes("RGB", (8, 8), bytes(pipeline_image_bytes()))


@contextlib.contextmanager
def single_thread():
    """Same thread count as the child process, so reductions run in the same order (bit-identical logits)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def head_output(output) -> torch.Tensor:
    return output.logits if "logits" in output else output.last_hidden_state


def to_jsonable(value):
    """Pipeline outputs (numpy scalars / arrays inside lists and dicts) as plain JSON values."""
    return json.loads(json.dumps(value, default=lambda o: o.tolist() if hasattr(o, "tolist") else float(o)))


# Runs in the fresh interpreter: loads every case with trust_remote_code, records outputs as JSON.
CHILD = r"""
import json, sys, traceback
args = json.loads(sys.argv[1])
sys.path.extend(args["site_packages"])
result = {"cases": {}}
try:
    import energyformers
    result["energyformers_import"] = "succeeded from " + str(energyformers.__file__)
except ModuleNotFoundError as err:
    result["energyformers_import"] = "ModuleNotFoundError: " + str(err)
import torch, transformers
from PIL import Image
torch.set_num_threads(1)

def plain(value):
    return json.loads(json.dumps(value, default=lambda o: o.tolist() if hasattr(o, "tolist") else float(o)))

for case in args["cases"]:
    out = result["cases"][case["id"]] = {}
    try:
        model = getattr(transformers, case["auto_class"]).from_pretrained(case["path"], trust_remote_code=True).eval()
        out["module"] = type(model).__module__
        with torch.no_grad():
            output = model(**{k: torch.tensor(v) for k, v in case["inputs"].items()})
        out["output"] = (output.logits if "logits" in output else output.last_hidden_state).tolist()
        if case.get("decode") is not None:  # MaskGIT decoding of a masked-image-modelling head, seeded
            decoded = model.decode(torch.tensor(case["inputs"]["input_ids"]), **case["decode"])
            out["decode"] = {key: value.tolist() for key, value in decoded.items()}
        x = case["pipeline_input"]
        if case["input_type"] == "image":
            x = Image.frombytes("RGB", (8, 8), bytes(x))
        if case.get("task") is not None:
            pipe = transformers.pipeline(case["task"], model=case["path"], trust_remote_code=True)
            out["pipeline_module"] = type(pipe).__module__
            answer = pipe(x, **case.get("pipeline_kwargs", {}))
            if case.get("pipeline_keys"):  # outputs JSON cannot hold (a PIL image) left out
                answer = {key: answer[key] for key in case["pipeline_keys"]}
            out["pipeline"] = plain(answer)
        if case.get("card"):
            from huggingface_hub import ModelCard
            card = ModelCard.load(case["card"])
            out["card_eval_results"] = [
                {"metric_type": r.metric_type, "metric_value": r.metric_value, "dataset_split": r.dataset_split}
                for r in card.data.eval_results or []
            ]
    except Exception:
        out["error"] = traceback.format_exc()
result["energyformers_modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "energyformers")
with open(args["result_path"], "w") as f:
    json.dump(result, f)
"""


def run_without_package(
    tmp: Path, cases: list[dict], env: dict[str, str] | None = None, timeout: int = 600, child: str = CHILD
) -> dict:
    """Run `child` (CHILD unless given: a script that reads the same JSON argument and writes its result to
    `result_path`) in `python -I -S` (no site, so no editable finder) with only site-packages added; return its
    JSON."""
    tmp.mkdir(parents=True, exist_ok=True)
    site_packages = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    args = {"site_packages": site_packages, "cases": cases, "result_path": str(tmp / "result.json")}
    child_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "HF_HOME": str(tmp / "hf_home"),  # empty cache
        "HF_MODULES_CACHE": str(tmp / "hf_modules"),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "NO_PROXY": "127.0.0.1,localhost",
        **(env or {}),
    }
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", child, json.dumps(args)],
        cwd=tmp,  # not the repo root, whose energyformers/ folder would otherwise be importable
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tmp / "result.json").read_text())


# --------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, dict]:
    """Per case: in-package folder, its export, and the in-package model's outputs on fixed inputs."""
    root = tmp_path_factory.mktemp("export")
    out = {}
    with single_thread():
        for case_id, (model_type, auto_class, input_type, task) in zip(CASE_IDS, CASES):
            model_dir = build_model_dir(root / f"{case_id}-src", model_type, auto_class, input_type)
            export_dir = export_model_dir(model_dir, root / case_id)
            inputs = model_inputs(input_type)
            model = FAMILIES[model_type].heads[auto_class].from_pretrained(model_dir).eval()
            with torch.no_grad():
                reference = head_output(model(**inputs))
            pipe = None if auto_class in NO_PIPELINE else pipeline(task, model=str(model_dir))
            out[case_id] = {
                "model_type": model_type,
                "auto_class": auto_class,
                "input_type": input_type,
                "task": task,
                "model_dir": model_dir,
                "export_dir": export_dir,
                "inputs": inputs,
                "reference": reference,
                "reference_pipeline": None if pipe is None else to_jsonable(pipe(pipeline_input(input_type))),
            }
    return out


@pytest.fixture(scope="module")
def remote_runs(exported, mim_exported, mim_resaved, tmp_path_factory) -> dict:
    """Every remote-code case of this file (`remote_cases`, `mim_remote_cases`, `mim_resaved_cases`: each a folder
    of its own) loaded in ONE fresh interpreter where energyformers is not importable (`run_without_package`)."""
    cases = [
        *remote_cases(exported),
        *mim_remote_cases(mim_exported),
        *mim_resaved_cases(mim_resaved),
    ]
    ids = [case["id"] for case in cases]
    assert len(set(ids)) == len(ids), ids
    return run_without_package(tmp_path_factory.mktemp("remote"), cases)


def remote_part(runs: dict, ids: Iterable[str]) -> dict:
    """`remote_runs` with only the cases of `ids`."""
    return {**runs, "cases": {case_id: runs["cases"][case_id] for case_id in ids}}


@pytest.fixture(scope="module")
def remote(exported, remote_runs) -> dict:
    """Outputs of every exported folder loaded in a fresh process where energyformers is not importable."""
    return remote_part(remote_runs, exported)


def remote_cases(exported: dict[str, dict]) -> list[dict]:
    return [
        {
            "id": case_id,
            "auto_class": case["auto_class"],
            "path": str(case["export_dir"]),
            "input_type": case["input_type"],
            "task": None if case["auto_class"] in NO_PIPELINE else case["task"],
            "inputs": {k: v.tolist() for k, v in case["inputs"].items()},
            "pipeline_input": PIPELINE_TEXT if case["input_type"] == "sequence" else pipeline_image_bytes(),
        }
        for case_id, case in exported.items()
    ]


# ------------------------------------------------------------------------------- loading without package
def test_fresh_process_cannot_import_energyformers(remote):
    assert remote["energyformers_import"].startswith("ModuleNotFoundError"), remote["energyformers_import"]
    assert remote["energyformers_modules"] == []


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_remote_code_logits_identical_to_package(exported, remote, case_id):
    result = remote["cases"][case_id]
    assert "error" not in result, result["error"]
    assert result["module"].startswith("transformers_modules."), result["module"]  # the folder's own code
    assert torch.equal(torch.tensor(result["output"]), exported[case_id]["reference"])


@pytest.mark.parametrize("case_id", [i for i, c in zip(CASE_IDS, CASES) if c[1] not in NO_PIPELINE])
def test_remote_code_pipeline_matches_package(exported, remote, case_id):
    result = remote["cases"][case_id]
    assert "error" not in result, result["error"]
    assert result["pipeline"] == exported[case_id]["reference_pipeline"]


# ------------------------------------------------------------------------------------- folder contents
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_export_folder_contents(exported, case_id):
    case = exported[case_id]
    export_dir, model_dir = case["export_dir"], case["model_dir"]
    family = FAMILIES[case["model_type"]]
    stem, processor = family.stem, INPUT_TYPES[case["input_type"]].processor_files
    expected = {"config.json", "model.safetensors", "metrics.json", "README.md", "LICENSE", *processor}
    expected |= {f"configuration_{stem}.py", f"modeling_{stem}.py"}
    if case["auto_class"] == "AutoModelForMaskedImageModeling":  # and its pipeline (transformers has none)
        expected |= {"pipeline_mim.py", "mim.py"}
    assert {p.name for p in export_dir.iterdir()} == expected
    # the license of the code it carries, as the repository has it (Apache-2.0 §4(a))
    license_file = Path(__file__).resolve().parents[1] / "LICENSE"
    assert (export_dir / "LICENSE").read_bytes() == license_file.read_bytes()
    assert (export_dir / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    config = json.loads((export_dir / "config.json").read_text())
    assert config["auto_map"] == {
        auto: (f"configuration_{stem}." if auto == "AutoConfig" else f"modeling_{stem}.") + name
        for auto, name in family.auto_map.items()
    }
    assert not list(export_dir.parent.glob(".*partial*"))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_remote_code_imports_only_stdlib_torch_transformers(exported, model_type):
    case = next(c for c in exported.values() if c["model_type"] == model_type)
    stem, config_class = FAMILIES[model_type].stem, FAMILIES[model_type].config_class.__name__
    allowed = set(sys.stdlib_module_names) | {"torch", "transformers"}
    for name in (f"configuration_{stem}.py", f"modeling_{stem}.py"):
        tree = ast.parse((case["export_dir"] / name).read_text())
        # the one optional import: the package's presets, tried by `from_preset` (ImportError: a clear message)
        optional = {
            id(statement)
            for node in ast.walk(tree)
            if isinstance(node, ast.Try)
            and any(getattr(h.type, "id", None) == "ImportError" for h in node.handlers)
            for statement in node.body
            if isinstance(statement, ast.ImportFrom) and statement.module == "energyformers.presets"
        }
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                assert {a.name.split(".")[0] for a in node.names} <= allowed, ast.unparse(node)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module.split(".")[0] in allowed, ast.unparse(node)
            elif isinstance(node, ast.ImportFrom):  # the one relative import: the sibling config
                assert (name, node.level, node.module) == (f"modeling_{stem}.py", 1, f"configuration_{stem}")
                assert [a.name for a in node.names] == [config_class]


# The masked-image-modelling head's card (its Hub task and its metrics) is checked with a MIM run folder below
@pytest.mark.parametrize("case_id", [i for i, c in zip(CASE_IDS, CASES) if c[1] not in NO_PIPELINE])
def test_card_renders_metadata_and_measured_metrics(exported, case_id):
    case = exported[case_id]
    card = ModelCard.load(case["export_dir"] / "README.md")
    assert card.data.library_name == "transformers"
    assert card.data.pipeline_tag == case["task"]
    assert card.data.license == "apache-2.0"
    assert case["model_type"] in card.data.tags
    metrics = {(r.metric_name, r.dataset_split): r.metric_value for r in card.data.eval_results}
    names = ("Accuracy", "F1 (macro)")
    if case["task"] == "token-classification":  # the Sudoku head
        names = ("blank-cell accuracy", "board accuracy")
    assert metrics == {(names[0], "test"): 0.375, (names[1], "test"): 0.1875}, metrics
    assert "trust_remote_code=True" in card.text and "## Citation" in card.text
    assert "0.3750" in card.text and "0.1250" in card.text  # test and eval rows of the table


# --------------------------------------------------------------------------------- refusals / failures
def _sources(model_type: str) -> tuple[dict[str, str], str, str]:
    stem, config_class = FAMILIES[model_type].stem, FAMILIES[model_type].config_class.__name__
    root = Path(energyformers.__file__).resolve().parent.parent
    sources = {
        f"configuration_{stem}.py": (root / "configuration" / f"configuration_{stem}.py").read_text(),
        f"modeling_{stem}.py": (root / "modeling" / f"modeling_{stem}.py").read_text(),
    }
    return sources, stem, config_class


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_generated_remote_code_equals_package_source_but_one_line(model_type):
    sources, stem, config_class = _sources(model_type)
    generated = remote_code_sources(model_type)
    assert generated[f"configuration_{stem}.py"] == sources[f"configuration_{stem}.py"]
    before = sources[f"modeling_{stem}.py"].splitlines()
    after = generated[f"modeling_{stem}.py"].splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after)
    assert changed == [
        (
            f"from ..configuration.configuration_{stem} import {config_class}",
            f"from .configuration_{stem} import {config_class}",
        )
    ]


@pytest.mark.parametrize(
    "extra, match",
    [
        ("from ..modeling.shared import helper", "relative import"),
        ("from . import something", "relative import"),
        ("import energyformers", "without energyformers"),
        ("from energyformers.modeling import x", "without energyformers"),
        ("import numpy", "only the standard library, torch and transformers"),
        (
            "def f():\n    import importlib\n    return importlib.import_module('energyformers')",
            "without energyformers",
        ),
    ],
)
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_refuses_imports_that_break_remote_loading(model_type, extra, match):
    sources, stem, config_class = _sources(model_type)
    for target in sources:
        bad = {**sources, target: sources[target] + "\n" + extra + "\n"}
        with pytest.raises(ValueError, match=match):
            generate_remote_code(bad, stem, config_class)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_refuses_modeling_file_without_the_single_config_import(model_type):
    sources, stem, config_class = _sources(model_type)
    line = f"from ..configuration.configuration_{stem} import {config_class}"
    for bad_text in (
        sources[f"modeling_{stem}.py"].replace(line, ""),
        sources[f"modeling_{stem}.py"] + line + "\n",
    ):
        with pytest.raises(ValueError, match="exactly once"):
            generate_remote_code({**sources, f"modeling_{stem}.py": bad_text}, stem, config_class)


@pytest.fixture
def image_model_dir(tmp_path) -> Path:
    model_type = sorted(FAMILIES)[0]
    return build_model_dir(tmp_path / "model", model_type, "AutoModelForImageClassification", "image")


def _assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    if out.parent.exists():  # no hidden staging folder either
        assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]


@pytest.mark.parametrize(
    "remove, match",
    [
        ("model.safetensors", "missing model.safetensors"),
        ("config.json", "missing config.json"),
        ("preprocessor_config.json", "missing image processor"),
    ],
)
def test_missing_file_fails_clearly_without_partial_export(image_model_dir, tmp_path, remove, match):
    (image_model_dir / remove).unlink()
    out = tmp_path / "exports" / "hub"
    with pytest.raises(FileNotFoundError, match=match):
        export_model_dir(image_model_dir, out)
    _assert_nothing_written(out)


def test_missing_tokenizer_fails_clearly(tmp_path):
    model_type = sorted(FAMILIES)[0]
    model_dir = build_model_dir(
        tmp_path / "model", model_type, "AutoModelForSequenceClassification", "sequence"
    )
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing tokenizer file\(s\) \['tokenizer.json'\]"):
        export_model_dir(model_dir, tmp_path / "out")
    _assert_nothing_written(tmp_path / "out")


def test_pickle_checkpoint_is_refused(image_model_dir, tmp_path):
    (image_model_dir / "model.safetensors").rename(image_model_dir / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pickle weights"):
        export_model_dir(image_model_dir, tmp_path / "out")
    _assert_nothing_written(tmp_path / "out")


def test_weights_not_matching_config_are_refused(image_model_dir, tmp_path):
    config = json.loads((image_model_dir / "config.json").read_text())
    config["hidden_size"] *= 2  # the checkpoint no longer fits the architecture
    (image_model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsMismatchError, match="weights do not match"):
        export_model_dir(image_model_dir, tmp_path / "out")
    _assert_nothing_written(tmp_path / "out")


def test_failure_after_writing_started_leaves_nothing(image_model_dir, tmp_path, monkeypatch):
    def broken_card(*args, **kwargs):
        raise RuntimeError("card rendering failed")

    monkeypatch.setattr(export, "render_model_card", broken_card)
    with pytest.raises(RuntimeError, match="card rendering failed"):
        export_model_dir(image_model_dir, tmp_path / "out")
    _assert_nothing_written(tmp_path / "out")


def test_existing_output_needs_overwrite_and_is_replaced_whole(image_model_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(
        FileExistsError, match=r"out_dir .*: the folder exists and is not empty; pass overwrite=True"
    ):
        export_model_dir(image_model_dir, out)
    assert (out / "stale.txt").exists()
    export_model_dir(image_model_dir, out, overwrite=True)
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "out"]


def test_a_token_recorded_before_redaction_is_published_by_no_file(tmp_path):
    """A folder trained before the command was recorded without its token (`--hub_token VALUE`, abbreviated as
    `--hub-tok=VALUE`): its export (what `push` uploads) holds neither, in metrics.json or the card, and still shows
    the command, the token as `<HUB_TOKEN>`."""
    secrets = ["hf_SECRETseparate", "hf_SECRETequals"]
    command = f"energyformers train --dataset digits --hub_token {secrets[0]} --hub-tok={secrets[1]} --seed 3"
    metrics = {**FIXTURE_METRICS, "recipe": {**FIXTURE_METRICS["recipe"], "command": command}}
    model_type = sorted(FAMILIES)[0]
    model_dir = build_model_dir(
        tmp_path / "model", model_type, "AutoModelForImageClassification", "image", metrics
    )
    out = export_model_dir(model_dir, tmp_path / "out")
    leaks = [p.name for p in out.iterdir() for secret in secrets if secret.encode() in p.read_bytes()]
    assert leaks == [], leaks
    shown = "energyformers train --dataset digits --hub_token '<HUB_TOKEN>' '--hub-tok=<HUB_TOKEN>' --seed 3"
    published = json.loads((out / "metrics.json").read_text())["recipe"]["command"]
    assert published == shown, published
    assert f"`{shown}`" in (out / "README.md").read_text()


def test_cli_exports_and_reports_errors(image_model_dir, tmp_path, capsys):
    assert export.main([str(image_model_dir), str(tmp_path / "out"), "--repo-id", "org/tiny"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    assert 'from_pretrained("org/tiny"' in (tmp_path / "out" / "README.md").read_text()
    assert export.main([str(tmp_path / "nowhere"), str(tmp_path / "out2")]) == 2  # a usage error
    assert "does not exist" in capsys.readouterr().err
    _assert_nothing_written(tmp_path / "out2")


def fresh_cli(*argv: object, cwd: Path) -> dict:
    """`energyformers ARGV` in a fresh process as the console script runs it: its status, stderr and whether the
    models were imported by the time it returned (a check "before the models load" leaves them unimported)."""
    (result,) = run_cli_cases([list(argv)], cwd=cwd)
    return {**result, "models": "energyformers.registry" in result["heavy"]}


def test_cli_refuses_a_taken_output_before_the_models_load(image_model_dir, tmp_path):
    """An OUT_DIR that is not empty (without --overwrite), or MODEL_DIR itself, is refused while the arguments are
    checked: the message names the command-line flag (not the Python keyword) and nothing is loaded or written."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = fresh_cli("export", image_model_dir, out, cwd=tmp_path)
    assert result["code"] == 2 and not result["models"], result
    assert result["err"] == (
        f"energyformers export: error: OUT_DIR {out}: the folder exists and is not empty; pass --overwrite or "
        "choose another folder\n"
    )
    assert "overwrite=True" not in result["err"] and [p.name for p in out.iterdir()] == ["keep.txt"]
    result = fresh_cli("export", image_model_dir, image_model_dir, cwd=tmp_path)
    assert result["code"] == 2 and not result["models"] and "is MODEL_DIR itself" in result["err"], result
    assert export.main([str(image_model_dir), str(out), "--overwrite"]) == 0
    assert (out / "model.safetensors").is_file() and not (out / "keep.txt").exists()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_out_dir_holding_the_model_dir_is_refused_and_the_model_survives(
    image_model_dir, tmp_path, capsys
):
    """`export runs/x/model runs/x --overwrite` would replace runs/x, and the model in it: refused on the command
    line before the models load (status 2) and by `export_model_dir` for API callers; nothing is moved or deleted."""
    before = _files(tmp_path)
    result = fresh_cli("export", image_model_dir, tmp_path, "--overwrite", cwd=tmp_path)
    assert result["code"] == 2 and not result["models"], result
    assert result["err"] == (
        f"energyformers export: error: OUT_DIR {tmp_path} holds MODEL_DIR {image_model_dir}, which replacing "
        "OUT_DIR would delete; name a folder outside it\n"
    ), result
    assert _files(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    with pytest.raises(
        ValueError, match=r"out_dir .* holds model_dir .*, which replacing out_dir would delete"
    ):
        export_model_dir(image_model_dir, tmp_path, overwrite=True)
    assert _files(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_an_out_dir_inside_the_model_dir_is_written_unless_it_holds_part_of_the_model(
    image_model_dir, tmp_path, capsys
):
    """A folder inside MODEL_DIR may take the export (again with --overwrite: the export carries only the files it
    lists, so it never nests); one holding part of the model (a VQGAN tokenizer's subfolder) is not replaced."""
    hub = image_model_dir / "hub"
    assert export.main([str(image_model_dir), str(hub)]) == 0, capsys.readouterr().err
    assert export.main([str(image_model_dir), str(hub), "--overwrite"]) == 0, capsys.readouterr().err
    assert (hub / "model.safetensors").is_file() and not (hub / "hub").exists()
    # the layout `VQGANTokenizer.save_pretrained(model_dir)` writes: the tokenizer config naming its subfolder
    (image_model_dir / "vq_tokenizer_config.json").write_text(json.dumps({"subfolder": "vqgan"}))
    (image_model_dir / "vqgan").mkdir()
    (image_model_dir / "vqgan" / "config.json").write_text("{}")
    capsys.readouterr()
    assert export.main([str(image_model_dir), str(image_model_dir / "vqgan"), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"energyformers export: error: OUT_DIR {image_model_dir / 'vqgan'} holds vqgan/config.json of MODEL_DIR "
        f"{image_model_dir}, which --overwrite would delete; name a folder that holds no part of the model\n"
    ), err
    assert (image_model_dir / "vqgan" / "config.json").read_text() == "{}"


def test_cli_names_a_folder_without_weights_once(image_model_dir, tmp_path, capsys):
    (image_model_dir / "model.safetensors").unlink()
    capsys.readouterr()  # the fixture's save progress bars
    assert export.main([str(image_model_dir), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"energyformers export: error: model folder {image_model_dir}: missing model.safetensors.\n"
    assert err.count(str(image_model_dir)) == 1
    _assert_nothing_written(tmp_path / "out")


# ---------------------------------------------------------------------------------------------- release
def test_release_dry_run_plans_every_family_and_reference_dataset(tmp_path, capsys):
    runs, dist = tmp_path / "runs", tmp_path / "dist"
    argv = ["--dry_run", "--runs_dir", str(runs), "--dist_dir", str(dist), "--", "--max_steps", "2"]
    assert release.main(argv) == 0
    expected = [
        f"train  energyformers train --model {m} --dataset {d} --output_dir {runs / f'{m}-{d}'} "
        "--overwrite_output_dir --max_steps 2"
        for m in sorted(FAMILIES)
        for d in ("digits", "fashion_mnist", "rotten_tomatoes")
    ]
    assert capsys.readouterr().out.splitlines() == expected
    assert not runs.exists() and not dist.exists()


def test_release_refuses_an_unknown_family_before_any_work(tmp_path, capsys):
    assert (
        release.main(["--models", "hyperset", "vit", "--runs_dir", str(tmp_path / "runs"), "--dry_run"]) == 2
    )
    assert (
        "--models vit: unknown; expected some of ['hyperbf', 'hyperset', 'imixer']" in capsys.readouterr().err
    )
    assert not (tmp_path / "runs").exists()


def test_release_reuses_a_finished_run_instead_of_training(tmp_path, capsys):
    model_type = sorted(FAMILIES)[0]
    run = build_model_dir(
        tmp_path / "runs" / f"{model_type}-digits", model_type, "AutoModelForImageClassification", "image"
    )
    argv = [
        "--dry_run",
        "--models",
        model_type,
        "--datasets",
        "digits",
        "fashion_mnist",
        "--runs_dir",
        str(tmp_path / "runs"),
    ]
    assert release.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"take   {run}" and lines[1].startswith(
        f"train  energyformers train --model {model_type} --dataset fashion_mnist"
    )


def test_release_exports_taken_folders_with_cards_and_metrics(tmp_path, capsys):
    """One folder of each family taken: each exported with its card, metrics and figures; the figures are drawn in
    copies under the dist folder (removed afterwards), so the taken folders stay byte for byte unchanged."""
    digits = {i: str(i) for i in range(10)}  # release draws each folder's curves on its dataset, digits
    dirs = [
        build_model_dir(tmp_path / m, m, "AutoModelForImageClassification", "image", labels=digits)
        for m in sorted(FAMILIES)
    ]

    def snapshot() -> dict[str, bytes]:
        return {
            str(p.relative_to(tmp_path)): p.read_bytes()
            for taken in dirs
            for p in sorted(taken.rglob("*"))
            if p.is_file()
        }

    before = snapshot()
    dist = tmp_path / "dist"
    assert release.main(["--take", *map(str, dirs), "--dist_dir", str(dist), "--namespace", "acme"]) == 0
    printed = capsys.readouterr().out
    after = snapshot()
    assert sorted(after) == sorted(before) and all(after[name] == before[name] for name in before), sorted(
        set(after) - set(before)
    )
    assert sorted(p.name for p in dist.iterdir()) == sorted(
        [f"{m}-digits" for m in FAMILIES] + ["release.json"]
    )  # no staging left
    summary = json.loads((dist / "release.json").read_text())
    assert (
        sorted(summary["released"]) == [f"{m}-digits" for m in sorted(FAMILIES)] and summary["failed"] == {}
    )
    for model_type, taken in zip(sorted(FAMILIES), dirs):
        folder = dist / f"{model_type}-digits"
        assert summary["released"][f"{model_type}-digits"]["source"] == str(taken)
        assert summary["released"][f"{model_type}-digits"]["test"] == FIXTURE_METRICS["test"]
        card = ModelCard.load(folder / "README.md")
        assert {(r.metric_type, r.metric_value) for r in card.data.eval_results} == {
            ("accuracy", 0.375),
            ("f1", 0.1875),
        }
        assert f'from_pretrained("acme/{model_type}-digits"' in card.text
        assert f"energyformers push {folder} acme/{model_type}-digits" in printed
        # `energyformers inspect` ran on the folder; the export carries its figures and the card links them
        figures = json.loads((folder / "inspect.json").read_text())["figures"]
        assert figures and "## Dynamics" in card.text
        for figure in figures:
            assert (folder / figure).is_file() and f"]({figure})" in card.text


def test_card_of_a_folder_without_a_run_record_claims_no_training_or_metrics(tmp_path):
    """Without metrics.json nothing is known of how the model was trained, or whether it was: its card names no
    metrics in the front matter, no training, dataset, preset or benchmark; with the record, the same folder's card
    says all of that."""
    model_type = sorted(FAMILIES)[0]
    bare = build_model_dir(
        tmp_path / "bare", model_type, "AutoModelForImageClassification", "image", metrics=None
    )
    card = ModelCard.load(export_model_dir(bare, tmp_path / "bare-out") / "README.md")
    text = " ".join(card.text.split())  # the template wraps its sentences
    assert card.data.metrics is None and not card.data.eval_results, card.data
    for claim in ("trained with energyformers", "trained on a small benchmark", "Preset:", "Data: **"):
        assert claim not in text, (claim, text)
    assert "No record of its training came with it (the model folder had no `metrics.json`)" in text, text
    assert "No evaluation was recorded for this checkpoint" in text, text
    trained = build_model_dir(tmp_path / "trained", model_type, "AutoModelForImageClassification", "image")
    card = ModelCard.load(export_model_dir(trained, tmp_path / "trained-out") / "README.md")
    text = " ".join(card.text.split())
    assert card.data.metrics == ["accuracy", "f1"], card.data.metrics
    for claim in ("trained with energyformers", "trained on a small benchmark", "Preset:", "Data: **"):
        assert claim in text, (claim, text)
    assert "No record of its training" not in text and "No evaluation was recorded" not in text, text


def test_release_refuses_a_taken_folder_without_metrics_before_any_work(tmp_path, capsys):
    """A --take folder that cannot be released is bad input: one line naming it once, status 2, nothing written
    (no dist folder, no release.json), even when the other folders are fine."""
    model_type = sorted(FAMILIES)[0]
    good = build_model_dir(tmp_path / "good", model_type, "AutoModelForImageClassification", "image")
    bad = build_model_dir(
        tmp_path / "bad", model_type, "AutoModelForSequenceClassification", "sequence", metrics=None
    )
    dist = tmp_path / "dist"
    capsys.readouterr()  # the fixture's save progress bars
    assert release.main(["--take", str(good), str(bad), "--dist_dir", str(dist)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"energyformers release: error: --take {bad}: missing metrics.json;"), err
    assert err.count(str(bad)) == 1 and len(err.splitlines()) == 1, err
    assert not dist.exists()


def test_release_refuses_a_taken_folder_of_another_model_before_any_work(tmp_path, capsys):
    """A transformers model folder that is no energyformers model (here BERT) is refused as export refuses it,
    before anything is inspected or written."""
    from transformers import BertConfig, BertForSequenceClassification

    bert = tmp_path / "bertdir"
    config = BertConfig(
        vocab_size=len(WORDS), hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(bert)
    (bert / "metrics.json").write_text(json.dumps({"model": "bert", **FIXTURE_METRICS}))
    dist = tmp_path / "dist"
    capsys.readouterr()  # the fixture's save progress bars
    assert release.main(["--take", str(bert), "--dist_dir", str(dist)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"energyformers release: error: --take: {bert / 'config.json'}: model_type='bert' is not an energyformers "
        f"family; expected one of {sorted(FAMILIES)}.\n"
    )
    assert not dist.exists()


def test_release_refuses_two_taken_folders_with_one_release_name(tmp_path, capsys):
    model_type = sorted(FAMILIES)[0]
    one, two = (
        build_model_dir(tmp_path / name, model_type, "AutoModelForImageClassification", "image")
        for name in ("one", "two")
    )
    capsys.readouterr()  # the fixture's save progress bars
    assert release.main(["--take", str(one), str(two), "--dist_dir", str(tmp_path / "dist")]) == 2
    assert f"both would be released as '{model_type}-digits'" in capsys.readouterr().err
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize("dry_run", [["--dry_run"], []])
@pytest.mark.parametrize(
    ("dataset", "reason"),
    [
        (
            "cifar99",
            "nor a local path, and the Hub is offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)",
        ),
        ("./no_such_folder", "no such local folder or file"),
        ("a/b/c", "no such local folder or file"),
        ("not a name!", "not a built-in dataset, a local path or a Hub dataset id"),
    ],
)
def test_release_refuses_an_unknown_dataset_dry_run_or_not(
    dry_run, dataset, reason, tmp_path, capsys, monkeypatch
):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # a Hub id cannot be a dataset offline
    monkeypatch.chdir(tmp_path)
    runs, dist = tmp_path / "runs", tmp_path / "dist"
    status = release.main(
        ["--datasets", "digits", dataset, *dry_run, "--runs_dir", str(runs), "--dist_dir", str(dist)]
    )
    assert status == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(f"energyformers release: error: --datasets {dataset}: "), err
    assert f"{reason}; expected a built-in dataset of `energyformers train` (digits, " in err, err
    assert captured.out == "" and not runs.exists() and not dist.exists()


@pytest.mark.parametrize("online", [False, True])
def test_release_plans_local_folders_and_hub_datasets_as_train_takes_them(
    online, tmp_path, capsys, monkeypatch
):
    """`train --dataset` takes local folders and (online) Hub ids; so does `release --datasets`, each trained into
    one folder under --runs_dir named after the dataset's last part."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", not online)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0" if online else "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_images").mkdir()
    runs, dist = tmp_path / "runs", tmp_path / "dist"
    datasets = ["./my_images", *(["someone/their-images"] if online else [])]
    argv = ["--models", "hyperset", "--datasets", *datasets, "--dry_run", "--runs_dir", str(runs)]
    assert release.main([*argv, "--dist_dir", str(dist)]) == 0
    out = capsys.readouterr().out
    assert f"--dataset ./my_images --output_dir {runs / 'hyperset-my_images'}" in out, out
    if online:
        assert f"--dataset someone/their-images --output_dir {runs / 'hyperset-their-images'}" in out, out


def test_release_names_trains_built_in_datasets():
    from energyformers.training.data import BUILTIN_DATASETS

    assert sorted(release.TRAIN_DATASETS) == sorted(BUILTIN_DATASETS)
    assert set(release.REFERENCE_DATASETS) <= set(release.TRAIN_DATASETS)


def test_release_plans_masked_image_modelling_on_the_image_datasets(tmp_path, capsys):
    runs, dist = tmp_path / "runs", tmp_path / "dist"
    argv = ["--models", "--mim", *release.MIM_MODELS, "--datasets", "digits", "rotten_tomatoes"]
    forwarded = ["--", "--max_steps", "2"]  # checked as train reads them: a real flag
    assert (
        release.main([*argv, "--dry_run", "--runs_dir", str(runs), "--dist_dir", str(dist), *forwarded]) == 0
    )
    expected = [
        f"train  energyformers train --model {m} --dataset digits --output_dir {runs / f'{m}-mim-digits'} "
        "--overwrite_output_dir --task mim --max_steps 2"
        for m in release.MIM_MODELS
    ]  # no family (`--models` alone), no text dataset
    assert capsys.readouterr().out.splitlines() == expected
    assert not runs.exists() and not dist.exists()


def test_release_mim_models_are_the_registrys_masked_image_modelling_heads():
    from energyformers import registry

    heads = {
        name
        for name, family in {**registry.FAMILIES, **registry.BASELINES}.items()
        if "AutoModelForMaskedImageModeling" in family.heads
    }
    assert sorted(release.MIM_MODELS) == sorted(heads)
    assert set(release.IMAGE_DATASETS) <= set(release.REFERENCE_DATASETS)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mim", "imixer"], "--mim imixer: no masked-image-modelling head; expected some of"),
        (["--models"], "--models with no name releases no family"),
        (
            ["--mim", "hyperset", "--datasets", "rotten_tomatoes"],
            "--mim trains on images: --datasets needs one",
        ),
        (["--mim", "hyperset", "--take", "."], "--mim trains; --take releases given folders"),
    ],
    ids=["no-mim-head", "nothing", "text-only", "with-take"],
)
def test_release_refuses_mim_requests_it_cannot_plan(argv, message, tmp_path, capsys):
    assert release.main([*argv, "--runs_dir", str(tmp_path / "runs"), "--dry_run"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_release_trains_and_exports_a_masked_image_modelling_run(tmp_path, capsys):
    """The whole path (short version: the plan above and `test_release_takes_mim_folders`): train with the train
    CLI's MIM defaults (a few steps), skip `inspect`, export with the image tokenizer and the folder's pipeline."""
    runs, dist = tmp_path / "runs", tmp_path / "dist"
    argv = [
        "--models",
        "--mim",
        "hyperset",
        "--datasets",
        "digits",
        "--runs_dir",
        str(runs),
        "--dist_dir",
        str(dist),
    ]
    small = [
        "--max_steps",
        "2",
        "--decode_samples",
        "4",
        "--tokenizer_fit_samples",
        "200",
        "--max_train_samples",
        "64",
    ]
    assert release.main([*argv, "--", *small, "--max_eval_samples", "16"]) == 0
    out = dist / "hyperset-mim-digits"
    for name in (
        "vq_tokenizer_config.json",
        "pipeline_mim.py",
        "mim.py",
        "modeling_hyperset.py",
        "README.md",
    ):
        assert (out / name).is_file(), name
    released = json.loads((dist / "release.json").read_text())["released"]
    assert list(released) == ["hyperset-mim-digits"] and "masked_token_accuracy" in released[out.name]["test"]
    assert "masked-token accuracy" in capsys.readouterr().out


# ------------------------------------------------------------------------------ masked image modelling
# A MIM folder as `energyformers train --task mim` writes it: the model, its image tokenizer (a patch k-means
# codebook: `vq_tokenizer_config.json` + `vq_tokenizer.safetensors`), metrics.json with the MIM metrics; no text
# tokenizer. Both models of the paper's Table 2: Hyper-SET's head and the looped-Transformer baseline's.
MIM_GRID, MIM_CODEBOOK = 16, 8  # a 4 × 4 grid of 2 × 2 patches of 8 × 8 grey images; [MASK] = 8
MIM_DECODE = {"steps": 3, "schedule": "arccos", "seed": 5}
# placeholders of the tiny untrained test models, never published
MIM_SCORES = {
    "masked_token_accuracy": 0.25,
    "decoded_token_accuracy": 0.3125,
    "psnr": 12.5,
    "ssim": 0.5,
    "tokenizer_psnr": 25.0,
    "tokenizer_ssim": 0.875,
}
MIM_METRICS_JSON = {
    **{k: v for k, v in FIXTURE_METRICS.items() if k not in ("eval", "test")},
    "task": "masked-image-modeling",
    "eval": {"loss": 2.0, **MIM_SCORES},
    "test": {"loss": 2.0, **MIM_SCORES, "masked_token_accuracy": 0.375},
}
MIM_MODELS = ("hyperset", "looped-transformer")


def build_mim_dir(path: Path, model_type: str) -> Path:
    from energyformers import LoopedTransformerConfig, LoopedTransformerForMaskedImageModeling
    from energyformers.mim import PatchKMeansTokenizer

    size = dict(num_attention_heads=4, num_iterations=2, vocab_size=MIM_CODEBOOK + 1)
    size["max_position_embeddings"] = MIM_GRID
    torch.manual_seed(0)
    if model_type == "hyperset":
        config = energyformers.HyperSetConfig.from_preset(
            "cli-mim", hidden_size=16, intermediate_size=16, time_embedding_dim=16, **size
        )
        model = energyformers.HyperSetForMaskedImageModeling(config)
    else:
        config = LoopedTransformerConfig.from_preset("cli-mim", hidden_size=16, intermediate_size=64, **size)
        model = LoopedTransformerForMaskedImageModeling(config)
    perturb(model)  # off the initialisation (zero step sizes), so every code path shows in the logits
    model.save_pretrained(path)
    centroids = torch.rand(MIM_CODEBOOK, 2 * 2, generator=torch.Generator().manual_seed(3))
    PatchKMeansTokenizer(centroids, patch_size=2, image_size=(8, 8), num_channels=1).save_pretrained(path)
    (path / "metrics.json").write_text(json.dumps({"model": model_type, **MIM_METRICS_JSON}))
    return path


def mim_inputs() -> torch.Tensor:
    """Codes with about half the positions masked, every row with at least one mask."""
    g = torch.Generator().manual_seed(4)
    codes = torch.randint(0, MIM_CODEBOOK, (2, MIM_GRID), generator=g)
    masked = torch.rand(2, MIM_GRID, generator=g) < 0.5
    masked[:, 0] = True
    return codes.masked_fill(masked, MIM_CODEBOOK)


# The pipeline's outputs compared with and without the package (its PIL image and decoding record left out: the
# first is `pixel_values` rounded, the second holds `codes`).
MIM_PIPELINE_KEYS = [
    "codes",
    "input_codes",
    "true_codes",
    "masked",
    "pixel_values",
    "masked_accuracy",
    "psnr",
]
MIM_PIPELINE_KEYS += ["ssim", "tokenizer_psnr"]


def mim_pipeline_image():
    """The 8×8 RGB test image the child process rebuilds from `pipeline_image_bytes()` (read as grey)."""
    return pipeline_input("image")


def assert_same_pipeline_outputs(got: dict, expected: dict) -> None:
    """The pipeline outputs a fresh process printed equal, key by key, to the package pipeline's."""
    for key in MIM_PIPELINE_KEYS:
        assert got[key] == expected[key], (key, got[key], expected[key])


@pytest.fixture(scope="module")
def mim_exported(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("mim")
    out = {}
    with single_thread():
        for model_type in MIM_MODELS:
            model_dir = build_mim_dir(root / f"{model_type}-src", model_type)
            export_dir = export_model_dir(
                model_dir, root / f"{model_type}-mim", repo_id=f"org/{model_type}-mim"
            )
            model = energyformers.BASELINES.get(model_type, FAMILIES.get(model_type))
            model = model.heads["AutoModelForMaskedImageModeling"].from_pretrained(model_dir).eval()
            with torch.no_grad():
                logits = model(input_ids=mim_inputs()).logits
            decoded = model.decode(mim_inputs(), **MIM_DECODE)
            reconstruct = pipeline("masked-image-modeling", model=str(model_dir))
            answer = reconstruct(mim_pipeline_image(), **MIM_DECODE)
            out[model_type] = {
                "model_dir": model_dir,
                "export_dir": export_dir,
                "logits": logits,
                "decode": decoded,
                "pipeline": to_jsonable({key: answer[key] for key in MIM_PIPELINE_KEYS}),
            }
    return out


@pytest.fixture(scope="module")
def mim_remote(mim_exported, remote_runs) -> dict:
    return remote_part(remote_runs, mim_exported)


def mim_remote_cases(mim_exported: dict[str, dict]) -> list[dict]:
    return [
        {
            "id": model_type,
            "auto_class": "AutoModelForMaskedImageModeling",
            "path": str(case["export_dir"]),
            "input_type": "image",
            "inputs": {"input_ids": mim_inputs().tolist()},
            "decode": MIM_DECODE,
            "task": "masked-image-modeling",  # the folder's custom pipeline
            "pipeline_input": pipeline_image_bytes(),
            "pipeline_kwargs": MIM_DECODE,
            "pipeline_keys": MIM_PIPELINE_KEYS,
        }
        for model_type, case in mim_exported.items()
    ]


@pytest.mark.parametrize("model_type", MIM_MODELS)
def test_mim_folder_exports_with_its_image_tokenizer(mim_exported, model_type):
    case = mim_exported[model_type]
    export_dir, model_dir = case["export_dir"], case["model_dir"]
    stems = ["hyperset"] if model_type == "hyperset" else ["hyperset", "looped_transformer"]
    code = {f"{kind}_{stem}.py" for kind in ("configuration", "modeling") for stem in stems}
    code |= {"pipeline_mim.py", "mim.py"}  # the pipeline transformers lacks, and what it imports
    expected = {"config.json", "model.safetensors", "metrics.json", "README.md", "LICENSE", *code}
    tokenizer = {"vq_tokenizer_config.json", "vq_tokenizer.safetensors"}
    assert {p.name for p in export_dir.iterdir()} == expected | tokenizer
    for name in ("model.safetensors", *tokenizer):
        assert (export_dir / name).read_bytes() == (model_dir / name).read_bytes(), name
    family = energyformers.BASELINES.get(model_type, FAMILIES.get(model_type))
    auto_map = json.loads((export_dir / "config.json").read_text())["auto_map"]
    head = family.heads["AutoModelForMaskedImageModeling"].__name__
    assert auto_map["AutoModelForMaskedImageModeling"] == f"modeling_{family.stem}.{head}", auto_map
    # the tokenizer read back from the export is the saved one
    from energyformers.mim import load_vq_tokenizer

    assert torch.equal(load_vq_tokenizer(export_dir).centroids, load_vq_tokenizer(model_dir).centroids)


def test_mim_remote_process_cannot_import_energyformers(mim_remote):
    assert mim_remote["energyformers_import"].startswith("ModuleNotFoundError"), mim_remote[
        "energyformers_import"
    ]
    assert mim_remote["energyformers_modules"] == []


@pytest.mark.parametrize("model_type", MIM_MODELS)
def test_mim_remote_code_logits_and_decode_identical_to_package(mim_exported, mim_remote, model_type):
    result, case = mim_remote["cases"][model_type], mim_exported[model_type]
    assert "error" not in result, result["error"]
    assert result["module"].startswith("transformers_modules."), result["module"]  # the folder's own code
    # the same code, weights, inputs and thread count: bit-identical, and the same seeded samples
    assert torch.equal(torch.tensor(result["output"]), case["logits"]), (result["output"], case["logits"])
    for key, value in case["decode"].items():
        got = torch.tensor(result["decode"][key], dtype=value.dtype)
        assert torch.equal(got, value), (key, got, value)


@pytest.mark.parametrize("model_type", MIM_MODELS)
def test_mim_remote_pipeline_reconstructs_as_the_package_does(mim_exported, mim_remote, model_type):
    """`pipeline("masked-image-modeling", model=folder, trust_remote_code=True)` where the package is not
    importable builds the folder's own pipeline (config.json's `custom_pipelines`) and reconstructs the image as the
    package's pipeline does: the same code, weights, image, seed and thread count, so equal to the last bit."""
    result, case = mim_remote["cases"][model_type], mim_exported[model_type]
    assert "error" not in result, result["error"]
    assert result["pipeline_module"].startswith("transformers_modules."), result["pipeline_module"]
    assert result["pipeline_module"].endswith(".pipeline_mim"), result["pipeline_module"]
    assert_same_pipeline_outputs(result["pipeline"], case["pipeline"])
    config = json.loads((case["export_dir"] / "config.json").read_text())
    assert config["custom_pipelines"] == {
        "masked-image-modeling": {
            "impl": "pipeline_mim.MaskedImageModelingPipeline",
            "pt": ["AutoModelForMaskedImageModeling"],
            "type": "image",
        }
    }, config.get("custom_pipelines")


@pytest.mark.parametrize("trust_remote_code", [None, True])
def test_mim_export_with_the_package_builds_the_registered_pipeline(mim_exported, trust_remote_code):
    """With the package imported, the exported folder's `custom_pipelines` must not stand in the way: without
    trust_remote_code transformers would refuse a config's custom pipeline, so the package's configs drop entries
    of tasks the process already serves, and both calls build the registered class."""
    from energyformers.pipelines import MaskedImageModelingPipeline

    case = mim_exported["hyperset"]
    with single_thread():
        reconstruct = pipeline(
            "masked-image-modeling", model=str(case["export_dir"]), trust_remote_code=trust_remote_code
        )
        answer = reconstruct(mim_pipeline_image(), **MIM_DECODE)
    assert type(reconstruct) is MaskedImageModelingPipeline, type(reconstruct)
    got = to_jsonable({key: answer[key] for key in MIM_PIPELINE_KEYS})
    assert got == case["pipeline"], (got, case["pipeline"])


# A folder loaded with the package and saved again (the model's `save_pretrained`, or the pipeline's) must stay what
# the export made it: usable by someone with only transformers, through the same `custom_pipelines` entry.
@pytest.fixture(scope="module")
def mim_resaved(mim_exported, tmp_path_factory) -> dict[str, Path]:
    from transformers import AutoModelForMaskedImageModeling

    from energyformers.mim import load_vq_tokenizer

    root = tmp_path_factory.mktemp("mim-resaved")
    out = {}
    for model_type, case in mim_exported.items():
        # the model alone, as after fine-tuning; its image tokenizer is not the model's, so it is saved beside it
        folder = out[f"model-{model_type}"] = root / f"model-{model_type}"
        AutoModelForMaskedImageModeling.from_pretrained(case["export_dir"]).save_pretrained(folder)
        load_vq_tokenizer(case["export_dir"]).save_pretrained(folder)
    # the package's pipeline saves model and tokenizer together
    folder = out["pipeline-hyperset"] = root / "pipeline-hyperset"
    pipeline("masked-image-modeling", model=str(mim_exported["hyperset"]["export_dir"])).save_pretrained(
        folder
    )
    return out


def resaved_model_type(name: str) -> str:
    return name.split("-", 1)[1]


@pytest.fixture(scope="module")
def mim_resaved_remote(mim_resaved, remote_runs) -> dict:
    return remote_part(remote_runs, mim_resaved)


def mim_resaved_cases(mim_resaved: dict[str, Path]) -> list[dict]:
    return [
        {
            "id": name,
            "auto_class": "AutoModelForMaskedImageModeling",
            "path": str(folder),
            "input_type": "image",
            "inputs": {"input_ids": mim_inputs().tolist()},
            "decode": MIM_DECODE,
            "task": "masked-image-modeling",
            "pipeline_input": pipeline_image_bytes(),
            "pipeline_kwargs": MIM_DECODE,
            "pipeline_keys": MIM_PIPELINE_KEYS,
        }
        for name, folder in mim_resaved.items()
    ]


@pytest.mark.parametrize("name", ["model-hyperset", "model-looped-transformer", "pipeline-hyperset"])
def test_mim_folder_saved_again_keeps_its_custom_pipeline_and_code(mim_exported, mim_resaved, name):
    export_dir, folder = mim_exported[resaved_model_type(name)]["export_dir"], mim_resaved[name]
    config, exported_config = (json.loads((f / "config.json").read_text()) for f in (folder, export_dir))
    assert config.get("custom_pipelines") == exported_config["custom_pipelines"], config.get(
        "custom_pipelines"
    )
    assert config["auto_map"] == exported_config["auto_map"], config["auto_map"]
    # every file auto_map and custom_pipelines name is there, as the export wrote it
    code = {p.name for p in export_dir.glob("*.py")}
    assert code <= {p.name for p in folder.iterdir()}, sorted(p.name for p in folder.iterdir())
    for filename in code:
        assert (folder / filename).read_text() == (export_dir / filename).read_text(), filename


@pytest.mark.parametrize("name", ["model-hyperset", "model-looped-transformer", "pipeline-hyperset"])
def test_mim_folder_saved_again_runs_without_the_package(mim_exported, mim_resaved_remote, name):
    """The saved-again folder in a Python that cannot import the package: the model from its own code and
    `pipeline(..., trust_remote_code=True)` from its `custom_pipelines` give the package's outputs to the last bit
    (the same code, weights, inputs, seed and thread count)."""
    assert mim_resaved_remote["energyformers_import"].startswith("ModuleNotFoundError")
    result, case = mim_resaved_remote["cases"][name], mim_exported[resaved_model_type(name)]
    assert "error" not in result, result["error"]
    assert result["module"].startswith("transformers_modules."), result["module"]
    assert torch.equal(torch.tensor(result["output"]), case["logits"]), (result["output"], case["logits"])
    assert result["pipeline_module"].endswith(".pipeline_mim"), result["pipeline_module"]
    assert_same_pipeline_outputs(result["pipeline"], case["pipeline"])


def test_mim_folder_saved_again_builds_the_registered_pipeline_with_the_package(mim_exported, mim_resaved):
    """With the package imported the kept entry is still out of `pipeline()`'s way: the config reads no served
    task, while what it writes keeps the entry."""
    from energyformers.pipelines import MaskedImageModelingPipeline

    folder = mim_resaved["model-hyperset"]
    config = energyformers.HyperSetConfig.from_pretrained(folder)
    assert config.custom_pipelines == {}, config.custom_pipelines
    assert "masked-image-modeling" in config.to_dict()["custom_pipelines"], config.to_dict().get(
        "custom_pipelines"
    )
    with single_thread():
        reconstruct = pipeline("masked-image-modeling", model=str(folder))
        answer = reconstruct(mim_pipeline_image(), **MIM_DECODE)
    assert type(reconstruct) is MaskedImageModelingPipeline, type(reconstruct)
    got = to_jsonable({key: answer[key] for key in MIM_PIPELINE_KEYS})
    assert got == mim_exported["hyperset"]["pipeline"], (got, mim_exported["hyperset"]["pipeline"])


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_exported_folder_saved_again_keeps_its_remote_code(exported, case_id, tmp_path):
    """Every family's export loaded with the package and saved again still carries the code its `auto_map` names,
    as the export wrote it (the folder then loads without the package as the export does: tests above)."""
    case = exported[case_id]
    model = FAMILIES[case["model_type"]].heads[case["auto_class"]].from_pretrained(case["export_dir"])
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    exported_config = json.loads((case["export_dir"] / "config.json").read_text())
    assert saved.get("auto_map") == exported_config["auto_map"], (
        saved.get("auto_map"),
        exported_config["auto_map"],
    )
    for code in case["export_dir"].glob("*.py"):
        assert (tmp_path / "saved" / code.name).is_file(), sorted(
            p.name for p in (tmp_path / "saved").iterdir()
        )
        assert (tmp_path / "saved" / code.name).read_text() == code.read_text(), code.name


def test_a_folder_without_auto_map_is_saved_without_remote_code(mim_exported, tmp_path):
    """A training folder (no `auto_map`: not an export) saves as before: no code files appear."""
    case = mim_exported["hyperset"]
    model = energyformers.HyperSetForMaskedImageModeling.from_pretrained(case["model_dir"])
    model.save_pretrained(tmp_path / "saved")
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["config.json", "model.safetensors"]


def test_mim_pipeline_code_is_cut_from_the_package_sources():
    """Every definition in the folder's pipeline files is the package's, byte for byte; the methods that need more
    than remote code may import are the only ones left out."""
    from energyformers.training import remote_code

    sources = remote_code.mim_pipeline_sources()
    assert set(sources) == {"pipeline_mim.py", "mim.py"}
    # mim.py also carries what energyformers/mim.py imports from its torch-free sibling tokenizer_fit.py
    origins = {"pipeline_mim.py": ["pipelines"], "mim.py": ["mim", "tokenizer_fit"]}
    for filename, source in sources.items():
        package = "".join(remote_code._read_source("", name) for name in origins[filename])
        tree = ast.parse(source)
        for node in tree.body[1:]:  # after the generated docstring
            if isinstance(node, ast.ClassDef) and any(
                (node.name, method) in remote_code.MIM_OMITTED_METHODS for method in ("fit", "from_taming")
            ):
                for method in node.body:
                    segment = ast.get_source_segment(source, method, padded=True)
                    assert segment in package, (filename, node.name, getattr(method, "name", None))
                continue
            segment = ast.get_source_segment(source, node)
            assert segment in package, (filename, segment[:200])
    tokenizer = ast.parse(sources["mim.py"])
    methods = {
        (node.name, item.name)
        for node in tokenizer.body
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef)
    }
    assert not methods & set(remote_code.MIM_OMITTED_METHODS), methods & set(remote_code.MIM_OMITTED_METHODS)
    assert ("PatchKMeansTokenizer", "from_pretrained") in methods
    defined = {name for node in tokenizer.body for name in remote_code._bound_names(node)}
    assert {"load_vq_tokenizer", "mask_codes", "reconstruction_metrics", "perceptual_metrics"} <= defined
    assert (
        "register_pipelines" not in sources["pipeline_mim.py"]
    )  # no registration as a side effect of loading
    from energyformers.tokenizer_fit import MIM_TASK

    assert list(remote_code.custom_pipelines()) == [MIM_TASK], remote_code.custom_pipelines()


@pytest.mark.parametrize(
    "edit, match",
    [
        ("import energyformers\n", "imports 'energyformers'"),
        ("import sklearn\n", "imports 'sklearn' .* at top level"),
        ("def f():\n    import sklearn\n", "imports 'sklearn' .* inside a function"),
        ("from .modeling_hyperset import X\n", "look for modeling_hyperset.py"),
        ("from .mim import not_there\n", "imports what the folder's files"),
        ('"""\n   from .vqgan import X\n"""\n', "makes transformers look for vqgan.py"),
    ],
)
def test_mim_pipeline_code_check_refuses_what_would_not_load(edit, match):
    from energyformers.training import remote_code

    sources = remote_code.mim_pipeline_sources()
    remote_code.check_pipeline_code(sources)  # as generated: accepted
    # a package import inside a try block is what transformers skips, so only that form is accepted
    guarded = sources["mim.py"] + "\ntry:\n    import sklearn\nexcept ImportError:\n    sklearn = None\n"
    remote_code.check_pipeline_code({**sources, "mim.py": guarded})
    with pytest.raises(ValueError, match=match):
        remote_code.check_pipeline_code({**sources, "pipeline_mim.py": sources["pipeline_mim.py"] + edit})


@pytest.mark.parametrize("model_type", MIM_MODELS)
def test_mim_card_has_a_hub_task_its_metrics_and_a_code_usage_example(mim_exported, model_type):
    card = ModelCard.load(mim_exported[model_type]["export_dir"] / "README.md")
    # a task of the Hub's list (huggingface.js `PIPELINE_DATA`): the Hub has no masked-image-modelling task
    assert card.data.pipeline_tag == "image-to-image" and card.data.language is None, card.data
    results = {(r.metric_name, r.dataset_split): r.metric_value for r in card.data.eval_results}
    assert results == {
        ("masked-token accuracy", "test"): 0.375,
        ("decoded-token accuracy", "test"): 0.3125,
        ("PSNR (dB)", "test"): 12.5,
        ("SSIM", "test"): 0.5,
        ("tokenizer PSNR (dB)", "test"): 25.0,
    }, results
    text = card.text
    assert "| — |" not in text and "macro F1" not in text and "LABEL_0" not in text
    assert "| test | 0.3750 | 0.3125 | 12.5000 | 0.5000 | 25.0000 |" in text
    assert "AutoTokenizer" not in text and "text classifier" not in text
    for snippet in (
        "load_vq_tokenizer(folder)",
        "model.decode(inputs, steps=8, seed=0)",
        f'pipeline("masked-image-modeling", model="org/{model_type}-mim")',
        f'AutoModelForMaskedImageModeling.from_pretrained("org/{model_type}-mim", trust_remote_code=True)',
        f'pipeline("masked-image-modeling", model="org/{model_type}-mim", trust_remote_code=True)',
    ):
        assert snippet in text, snippet


def test_mim_card_snippets_run(mim_exported, monkeypatch):
    """The card's usage code, run on the exported folder (the Hub download replaced by the folder)."""
    import re

    import huggingface_hub

    folder = mim_exported["hyperset"]["export_dir"]
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id: str(folder))
    text = ModelCard.load(folder / "README.md").text
    blocks = [
        block.replace('"org/hyperset-mim"', repr(str(folder)))
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.S)
    ]
    assert len(blocks) == 4, blocks
    images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    from PIL import Image

    image = folder.parent / "digit.png"
    Image.fromarray((images[0, 0].numpy() * 255).astype("uint8")).save(image)
    scope = {}
    exec(blocks[0].replace("path/to/image.png", str(image)), scope)  # package + tokenizer + decode
    assert scope["reconstruction"].shape == (1, 1, 8, 8)
    pipeline_code = (
        blocks[1]
        .replace("path/to/image.png", str(image))
        .replace('"reconstruction.png"', repr(str(folder.parent / "reconstruction.png")))
    )
    exec(pipeline_code, scope)
    assert (folder.parent / "reconstruction.png").is_file()
    exec(blocks[2], scope)  # in this process the package is importable; the remote-code run is checked above
    assert scope["codes"].shape == (1, MIM_GRID) and (scope["codes"] < MIM_CODEBOOK).all()
    exec(blocks[3].replace("path/to/image.png", str(image)), scope)  # (the remote pipeline: tested above)
    assert scope["out"]["codes"].shape == (MIM_GRID,), scope["out"]["codes"].shape


def test_mim_folder_without_an_image_tokenizer_exports_and_says_so(tmp_path):
    """A converted checkpoint has no tokenizer (the paper's VQGAN is not part of it): exported, the card says so."""
    model_dir = build_mim_dir(tmp_path / "src", "hyperset")
    for name in ("vq_tokenizer_config.json", "vq_tokenizer.safetensors", "metrics.json"):
        (model_dir / name).unlink()
    out = export_model_dir(model_dir, tmp_path / "out")
    assert not list(out.glob("vq_tokenizer*"))
    text = (out / "README.md").read_text()
    assert "holds no image tokenizer" in text and "VQGANTokenizer" in text
    assert "pipeline_tag: image-to-image" in text


def test_mim_vqgan_subfolder_travels_and_a_broken_tokenizer_is_refused(tmp_path):
    from energyformers.mim import VQGANTokenizer

    model_dir = build_mim_dir(tmp_path / "src", "hyperset")
    (model_dir / "vq_tokenizer.safetensors").unlink()
    # a tiny random VQGAN of the model's codebook (export loads the image tokenizer before it writes anything), saved
    # as VQGANTokenizer.save_pretrained saves it: the diffusers VQModel folder in vqgan/, its settings beside it
    vq_model = tiny_vq_model(MIM_CODEBOOK)
    VQGANTokenizer(vq_model).save_pretrained(model_dir)
    vqgan = model_dir / "vqgan"
    settings = json.loads((model_dir / "vq_tokenizer_config.json").read_text())
    out = export_model_dir(model_dir, tmp_path / "out")
    for name in (
        "vq_tokenizer_config.json",
        "vqgan/config.json",
        "vqgan/diffusion_pytorch_model.safetensors",
    ):
        assert (out / name).read_bytes() == (model_dir / name).read_bytes(), name
    assert "`VQGANTokenizer`" in (out / "README.md").read_text()
    # a tokenizer config naming files the folder lacks: refused before anything is written
    (vqgan / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="subfolder='vqgan' is not a model folder"):
        export_model_dir(model_dir, tmp_path / "out2")
    _assert_nothing_written(tmp_path / "out2")
    settings.pop("subfolder")
    settings["tokenizer_class"] = "PatchKMeansTokenizer"
    (model_dir / "vq_tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(
        FileNotFoundError, match=r"vq_tokenizer_config\.json without vq_tokenizer\.safetensors"
    ):
        export_model_dir(model_dir, tmp_path / "out3")
    _assert_nothing_written(tmp_path / "out3")


def test_a_baseline_head_other_than_mim_is_still_refused(tmp_path):
    from energyformers import LoopedTransformerConfig, LoopedTransformerForImageClassification

    config = LoopedTransformerConfig(hidden_size=16, num_attention_heads=4, image_size=8, patch_size=4)
    model_dir = tmp_path / "looped"
    LoopedTransformerForImageClassification(config).save_pretrained(model_dir)
    with pytest.raises(ValueError, match="is a baseline for side-by-side measurements"):
        export_model_dir(model_dir, tmp_path / "out")
    _assert_nothing_written(tmp_path / "out")


def test_release_takes_mim_folders(mim_exported, tmp_path, capsys):
    dirs = [mim_exported[m]["model_dir"] for m in MIM_MODELS]
    dist = tmp_path / "dist"
    assert release.main(["--take", *map(str, dirs), "--dist_dir", str(dist)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((dist / "release.json").read_text())
    assert sorted(summary["released"]) == [f"{m}-mim-digits" for m in MIM_MODELS], summary
    for model_type in MIM_MODELS:
        folder = dist / f"{model_type}-mim-digits"
        assert (folder / "vq_tokenizer.safetensors").is_file()
        assert f"{model_type}-mim-digits" in printed and "masked-token accuracy 0.3750" in printed, printed


RECURRENT_DEPTH_FIELDS = (
    "deep_supervision",
    "deep_supervision_interval",
    "deep_supervision_samples",
    "deep_supervision_weights",
    "supervision_steps",
    "halting_head",
    "halting_loss_weight",
)


@pytest.mark.parametrize("case_id", [i for i in CASE_IDS if i.startswith(("hyperset-", "looped"))])
def test_card_lists_the_recurrent_depth_training_fields(exported, case_id):
    """As every other config field the card shows: each recurrent-depth training setting with its value."""
    case = exported[case_id]
    config = json.loads((case["export_dir"] / "config.json").read_text())
    text = (case["export_dir"] / "README.md").read_text()
    for field in RECURRENT_DEPTH_FIELDS:
        assert f"| `{field}` | `{json.dumps(config[field])}` |" in text, field


@pytest.mark.parametrize("model_type", MIM_MODELS)
def test_mim_card_lists_the_recurrent_depth_training_fields(mim_exported, model_type):
    export_dir = mim_exported[model_type]["export_dir"]
    config = json.loads((export_dir / "config.json").read_text())
    text = (export_dir / "README.md").read_text()
    for field in RECURRENT_DEPTH_FIELDS:
        assert f"| `{field}` | `{json.dumps(config[field])}` |" in text, field


@pytest.mark.parametrize("model_type", MIM_MODELS)
def test_mim_card_without_a_repo_id_is_named_as_release_names_mim_folders(mim_exported, model_type):
    """Without a repo id the card names the model `<model>-mim-<dataset>` (as `release` does), not like the
    dataset's classifier; Hyper-SET's per-call depth example passes the masked codes as `input_ids`."""
    from energyformers.training.card import render_model_card
    from energyformers.training.export import inspect_model_dir

    text = render_model_card(inspect_model_dir(mim_exported[model_type]["model_dir"])).text
    assert f"# {model_type}-mim-digits" in text and f"<your-namespace>/{model_type}-mim-digits" in text, text[
        :600
    ]
    assert f"# {model_type}-digits" not in text
    if model_type == "hyperset":
        assert "`model(input_ids=inputs, num_iterations=24)`" in text and "model(**inputs" not in text
