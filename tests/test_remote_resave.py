"""An exported masked-image-modelling folder, loaded and saved again where only transformers is installed.

The saves run in the exported folder's own code (`transformers_modules.*`) in a fresh `python -I -S` process that
cannot import `energyformers` (`run_without_package` of test_export.py). transformers copies a remote model's and
config's files on save, but not the pipeline module config.json's `custom_pipelines` names; the configs' own
`save_pretrained` copies it, and what it imports, from where the config was loaded: a folder, or a Hub repo through
transformers' cache (here a hand-made offline cache). Every saved folder must rebuild the pipeline with
`pipeline("masked-image-modeling", model=saved, trust_remote_code=True)` and reconstruct as the export does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_export import (
    MIM_DECODE,
    MIM_PIPELINE_KEYS,
    build_mim_dir,
    pipeline_image_bytes,
    run_without_package,
    single_thread,
)

from energyformers.training.export import export_model_dir

# Two commits of one hand-made Hub repo: the model is loaded at REVISION_A while main points at REVISION_B, whose
# pipeline file differs by a comment, so a copy from the wrong commit shows.
REPO_ID = "acme/mim"
REVISION_A = "a" * 40
REVISION_B = "b" * 40
MAIN_MARKER = "\n# the repo's main branch, not the loaded commit\n"
PIPELINE_CODE = ("pipeline_mim.py", "mim.py")  # the file custom_pipelines names, and the one it imports
MISSING_WARNING = "save_pretrained: config.json names custom_pipelines"

# Runs in the fresh interpreter: loads each source with trust_remote_code, saves the model (and for a folder the
# pipeline) again, rebuilds the pipeline from every saved folder, and records outputs, files and warnings as JSON.
CHILD = r"""
import json, os, sys, traceback, warnings
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
spec = args["cases"]
image = Image.frombytes("RGB", (8, 8), bytes(spec["image"]))

def reconstruct(pipe):
    answer = pipe(image, **spec["decode"])
    return json.loads(json.dumps({key: answer[key] for key in spec["keys"]},
                                 default=lambda o: o.tolist() if hasattr(o, "tolist") else float(o)))

def saved(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if spec["warning"] in str(w.message)]

for case in spec["sources"]:
    out = result["cases"][case["id"]] = {}
    try:
        hub = {"revision": case["revision"]} if case.get("revision") else {}
        original = None
        if case.get("pipeline", True):
            original = transformers.pipeline("masked-image-modeling", model=case["path"], trust_remote_code=True, **hub)
            out["pipeline_module"] = type(original).__module__
            out["original"] = reconstruct(original)
        model = transformers.AutoModelForMaskedImageModeling.from_pretrained(case["path"], trust_remote_code=True, **hub)
        folders = {"model": os.path.join(spec["out"], case["id"] + "-model")}
        out["warnings"] = {"model": saved(lambda: model.save_pretrained(folders["model"]))}
        if case.get("save_pipeline"):
            folders["pipeline"] = os.path.join(spec["out"], case["id"] + "-pipeline")
            out["warnings"]["pipeline"] = saved(lambda: original.save_pretrained(folders["pipeline"]))
        out["folders"] = folders
        out["files"] = {name: sorted(os.listdir(folder)) for name, folder in folders.items()}
        if original is not None:
            out["reloaded"] = {}
            for name, folder in folders.items():
                # a model-only save carries no image tokenizer (docs/hub.md): the pipeline is handed the original's
                extra = {} if name == "pipeline" else {"vq_tokenizer": original.vq_tokenizer}
                pipe = transformers.pipeline("masked-image-modeling", model=folder, trust_remote_code=True, **extra)
                out["reloaded"][name] = {"module": type(pipe).__module__, "output": reconstruct(pipe)}
    except Exception:
        out["error"] = traceback.format_exc()
result["energyformers_modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "energyformers")
with open(args["result_path"], "w") as f:
    json.dump(result, f)
"""


@pytest.fixture(scope="module")
def resaved(tmp_path_factory) -> dict:
    """A tiny exported Hyper-SET MIM folder, the same export as a hand-made Hub cache, and one without its `mim.py`,
    each loaded and saved again in a process without the package."""
    root = tmp_path_factory.mktemp("remote-resave")
    with single_thread():
        export_dir = export_model_dir(build_mim_dir(root / "src", "hyperset"), root / "export")
    hf_home = root / "hf_home"
    repo = hf_home / "hub" / ("models--" + REPO_ID.replace("/", "--"))
    shutil.copytree(export_dir, repo / "snapshots" / REVISION_A)
    shutil.copytree(export_dir, repo / "snapshots" / REVISION_B)
    with (repo / "snapshots" / REVISION_B / "pipeline_mim.py").open("a", encoding="utf-8") as f:
        f.write(MAIN_MARKER)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION_B)
    incomplete = root / "incomplete"
    shutil.copytree(export_dir, incomplete)
    (incomplete / "mim.py").unlink()
    spec = {
        "image": pipeline_image_bytes(),
        "decode": MIM_DECODE,
        "keys": MIM_PIPELINE_KEYS,
        "warning": MISSING_WARNING,
        "out": str(root / "saved"),
        "sources": [
            {"id": "folder", "path": str(export_dir), "save_pipeline": True},
            {"id": "hub", "path": REPO_ID, "revision": REVISION_A},
            # its pipeline cannot be built (it imports the missing mim.py): only the model is loaded and saved
            {"id": "incomplete", "path": str(incomplete), "pipeline": False},
        ],
    }
    result = run_without_package(root / "child", spec, env={"HF_HOME": str(hf_home)}, child=CHILD)
    return {"export_dir": export_dir, "snapshot_a": repo / "snapshots" / REVISION_A, **result}


def _case(resaved: dict, case_id: str) -> dict:
    assert resaved["energyformers_import"].startswith("ModuleNotFoundError"), resaved["energyformers_import"]
    assert resaved["energyformers_modules"] == [], resaved["energyformers_modules"]
    case = resaved["cases"][case_id]
    assert "error" not in case, case["error"]
    return case


@pytest.mark.parametrize("case_id", ["folder", "hub"])
def test_saved_again_without_the_package_keeps_the_pipeline_code(resaved, case_id):
    """Every save writes the pipeline files byte for byte as the loaded source holds them (for the Hub repo: the
    loaded commit, not main), with no warning, and config.json keeps naming them."""
    case = _case(resaved, case_id)
    source = resaved["export_dir"] if case_id == "folder" else resaved["snapshot_a"]
    for name, folder in case["folders"].items():
        folder = Path(folder)
        assert case["warnings"][name] == [], (name, case["warnings"][name])
        assert set(PIPELINE_CODE) <= set(case["files"][name]), (name, case["files"][name])
        for filename in PIPELINE_CODE:
            got, expected = (folder / filename).read_bytes(), (source / filename).read_bytes()
            assert got == expected, (name, filename, len(got), len(expected), MAIN_MARKER.encode() in got)
        config = json.loads((folder / "config.json").read_text())
        exported = json.loads((resaved["export_dir"] / "config.json").read_text())
        assert config["custom_pipelines"] == exported["custom_pipelines"], config.get("custom_pipelines")


@pytest.mark.parametrize("case_id", ["folder", "hub"])
def test_pipeline_rebuilt_from_each_saved_folder_reconstructs_as_the_export(resaved, case_id):
    """The pipeline from every saved folder is the folder's own code and gives the export's pipeline outputs to
    the last bit: the same code, weights, image, seed and thread count in one process."""
    case = _case(resaved, case_id)
    assert case["pipeline_module"].endswith(".pipeline_mim"), case["pipeline_module"]
    expected_folders = {"model", "pipeline"} if case_id == "folder" else {"model"}
    assert set(case["reloaded"]) == expected_folders, sorted(case["reloaded"])
    for name, reloaded in case["reloaded"].items():
        assert reloaded["module"].startswith("transformers_modules."), (name, reloaded["module"])
        assert reloaded["module"].endswith(".pipeline_mim"), (name, reloaded["module"])
        for key in MIM_PIPELINE_KEYS:
            got, expected = reloaded["output"][key], case["original"][key]
            assert got == expected, (name, key, got, expected)


def test_pipeline_save_writes_the_image_tokenizer_and_a_model_save_does_not(resaved):
    """As docs/hub.md says: the pipeline's save writes the image tokenizer, the model's writes the model only."""
    files = _case(resaved, "folder")["files"]
    tokenizer = {"vq_tokenizer_config.json", "vq_tokenizer.safetensors"}
    assert tokenizer <= set(files["pipeline"]), files["pipeline"]
    assert not tokenizer & set(files["model"]), files["model"]


def test_a_pipeline_file_missing_from_the_source_is_a_warning_and_the_weights_are_saved(resaved):
    """A source lacking `mim.py` (which `pipeline_mim.py` imports): the save warns, naming the file and where it
    looked, and still writes the weights, the config and the pipeline file it found."""
    case = _case(resaved, "incomplete")
    messages = case["warnings"]["model"]
    assert len(messages) == 1, messages
    assert "['mim.py']" in messages[0] and "incomplete" in messages[0], messages[0]
    assert {"config.json", "model.safetensors", "pipeline_mim.py"} <= set(case["files"]["model"]), case[
        "files"
    ]
    assert "mim.py" not in case["files"]["model"], case["files"]


def test_a_folder_saved_again_gets_the_code_license_and_keeps_a_license_of_its_own(tmp_path):
    """Saving a config read from an export writes the remote code with the package's LICENSE, unless the folder
    already has a LICENSE: that one (a weights' license may differ from the code's) is kept as it is."""
    from energyformers import HyperSetConfig

    license_text = (Path(__file__).resolve().parents[1] / "LICENSE").read_text()
    for folder, own in ((tmp_path / "new", None), (tmp_path / "own", "My weights: CC-BY-NC-4.0\n")):
        folder.mkdir()
        if own is not None:
            (folder / "LICENSE").write_text(own)
        config = HyperSetConfig()
        config.auto_map = {"AutoConfig": "configuration_hyperset.HyperSetConfig"}
        config.save_pretrained(folder)
        assert (folder / "modeling_hyperset.py").is_file(), sorted(p.name for p in folder.iterdir())
        assert (folder / "LICENSE").read_text() == (own or license_text)
