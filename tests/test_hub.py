"""Hub publishing end to end through the real `huggingface_hub` client against a LOCAL STAND-IN of the Hub
(`tests/hub_standin.py`, 127.0.0.1 only; not the real Hub).

For every family: a tiny model is trained for a few optimiser steps on the digits data, pushed with
`energyformers push`, then loaded in a fresh process with an empty cache where `energyformers` is not
importable (`from_pretrained("org/name", trust_remote_code=True)`, a pipeline, `ModelCard.load`), and again
with `HF_HUB_OFFLINE=1` from the cache that download left behind, and from a hand-made Hub-layout cache.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers.utils.hub
from fixtures import Case, cli_config
from hub_standin import STANDIN_TOKEN, HubStandIn
from huggingface_hub import constants
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.metrics import f1_score
from sklearn.model_selection import train_test_split
from test_export import (
    MIM_DECODE,
    MIM_MODELS,
    build_mim_dir,
    mim_pipeline_image,
    run_without_package,
    single_thread,
)
from transformers import ViTImageProcessorPil, pipeline

from energyformers import FAMILIES
from energyformers.training import push
from energyformers.training.export import export_model_dir
from energyformers.training.push import PushError, push_model_dir

DIGIT_LABELS = {i: str(i) for i in range(10)}
HAND_MADE_REVISION = "0123456789abcdef0123456789abcdef01234567"
STEPS = 30


def digits_rgb() -> tuple[np.ndarray, np.ndarray]:
    """UCI digits as 8×8 RGB uint8 images (0–16 scaled to 0–255) and labels."""
    data = load_digits()
    grey = (data.images * (255 / 16)).round().astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=-1), data.target


def train_digits_model(path: Path, model_type: str) -> Path:
    """A model folder like `energyformers train` writes, from a few AdamW steps on digits (measured metrics)."""
    start = time.perf_counter()
    images, labels = digits_rgb()
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, stratify=labels, random_state=0
    )
    processor = ViTImageProcessorPil(
        size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    pixels_train = processor(list(x_train), return_tensors="pt")["pixel_values"]
    pixels_test = processor(list(x_test), return_tensors="pt")["pixel_values"]
    labels = dict(num_labels=10, id2label=DIGIT_LABELS, label2id={v: k for k, v in DIGIT_LABELS.items()})
    model = Case(model_type, "AutoModelForImageClassification", "image").build(num_channels=3, **labels)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    generator = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        batch = torch.randint(0, len(pixels_train), (64,), generator=generator)
        loss = model(pixel_values=pixels_train[batch], labels=torch.as_tensor(y_train)[batch]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        predictions = model(pixel_values=pixels_test).logits.argmax(-1).numpy()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    scores = {
        "accuracy": float((predictions == y_test).mean()),
        "f1_macro": float(f1_score(y_test, predictions, average="macro")),
    }
    metrics = {
        "model": model_type,
        "preset": None,
        "dataset": "digits",
        "task": "image-classification",
        "num_parameters": model.num_parameters(),
        "recipe": {
            "command": "tests/test_hub.py (in-test AdamW loop)",
            "epochs": None,
            "learning_rate": 3e-3,
            "batch_size": 64,
            "seed": 0,
            "max_steps": STEPS,
        },
        "train": {"train_loss": loss.item()},
        "eval": scores,  # no separate validation split in this short test run
        "test": scores,
        "wall_time_s": time.perf_counter() - start,
    }
    (path / "metrics.json").write_text(json.dumps(metrics))
    return path


@contextmanager
def dead_endpoint() -> Iterator[str]:
    """A URL where nothing answers: its port is bound but not listening (a connection is refused) and stays bound
    while the block runs, so no other socket (another test's server) can take it and answer."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def digit_image_bytes(index: int = 0) -> list[int]:
    images, _ = digits_rgb()
    return list(images[-1 - index].tobytes())


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The stand-in, with this process's huggingface_hub pointed at it and online; temp files go to tmp_path."""
    with HubStandIn() as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        # transformers' shared HfApi keeps the endpoint it was built with (by any earlier test of this process):
        # rebuilt here, it asks the stand-in, not the real Hub (unreachable offline: minutes of retries)
        monkeypatch.setattr(transformers.utils.hub, "_hf_api", None)
        # and any other client that reaches past the stand-in is named here, not found as a slow test
        outside: list[str] = []
        resolve = socket.getaddrinfo

        def local_only(host, *args, **kwargs):
            if host not in ("127.0.0.1", "localhost", "::1"):
                outside.append(host)
                raise socket.gaierror(f"{host}: outside the Hub stand-in")
            return resolve(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", local_only)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token-file"))
        monkeypatch.setenv("HF_TOKEN", STANDIN_TOKEN)
        scratch = tmp_path / "tmp"
        scratch.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where push builds its export
        yield server
        assert server.unhandled == [], f"client used endpoints the stand-in lacks: {server.unhandled}"
        assert outside == [], f"clients reached for hosts outside the stand-in: {sorted(set(outside))}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trained")
    with single_thread():  # 2 OpenMP threads on this shared 2-core box are up to 100× slower for tiny ops
        return {model_type: train_digits_model(root / model_type, model_type) for model_type in FAMILIES}


# --------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def published(trained, tmp_path_factory) -> dict:
    """Push every family with the CLI, then load each repo in fresh processes (online, then offline)."""
    root = tmp_path_factory.mktemp("published")
    with HubStandIn() as server:
        with pytest.MonkeyPatch.context() as mp:  # push from this process, as the CLI user would
            mp.setattr(constants, "ENDPOINT", server.url)
            mp.setattr(constants, "HF_HUB_OFFLINE", False)
            mp.setenv("HF_TOKEN", STANDIN_TOKEN)
            for model_type, model_dir in trained.items():
                argv = [str(model_dir), f"org/{model_type}-digits", "--commit-message", "first upload"]
                assert push.main(argv) == 0
        cases = [
            {
                "id": model_type,
                "auto_class": "AutoModelForImageClassification",
                "path": f"org/{model_type}-digits",
                "input_type": "image",
                "task": "image-classification",
                "inputs": {"pixel_values": reference_pixels().tolist()},
                "pipeline_input": digit_image_bytes(),
                "card": f"org/{model_type}-digits",
            }
            for model_type in trained
        ]
        cache = root / "hf_home"
        online = run_without_package(
            root / "online",
            cases,
            env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": server.url, "HF_HOME": str(cache)},
        )
        files = {model_type: server.files(f"org/{model_type}-digits") for model_type in trained}
        unhandled = list(server.unhandled)
    # A cache laid out by hand as in hf-v5-notes (hub/models--org--name/snapshots/<40 hex>/ + refs/main), next to
    # the one the online download left behind.
    hand_made = sorted(FAMILIES)[0]
    repo = cache / "hub" / "models--acme--hand-made"
    export_model_dir(trained[hand_made], repo / "snapshots" / HAND_MADE_REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(HAND_MADE_REVISION)
    cases.append({**cases[0], "id": "hand-made", "path": "acme/hand-made", "card": "acme/hand-made"})
    # The server is gone and the endpoint is a dead port: only the cache can answer.
    with dead_endpoint() as dead:
        offline = run_without_package(
            root / "offline", cases, env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": dead, "HF_HOME": str(cache)}
        )
    return {"online": online, "offline": offline, "files": files, "unhandled": unhandled}


def reference_pixels() -> torch.Tensor:
    images, _ = digits_rgb()
    processor = ViTImageProcessorPil(
        size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    return processor(list(images[-4:]), return_tensors="pt")["pixel_values"]


@pytest.fixture(scope="module")
def in_package(trained) -> dict[str, dict]:
    """The trained models' logits and pipeline output with the package installed (the reference)."""
    out = {}
    with single_thread():
        for model_type, model_dir in trained.items():
            model = FAMILIES[model_type].heads["AutoModelForImageClassification"].from_pretrained(model_dir)
            with torch.no_grad():
                logits = model.eval()(pixel_values=reference_pixels()).logits
            image = Image.frombytes("RGB", (8, 8), bytes(digit_image_bytes()))
            predictions = pipeline("image-classification", model=str(model_dir))(image)
            out[model_type] = {
                "logits": logits,
                "pipeline": json.loads(json.dumps(predictions, default=float)),
            }
    return out


def test_standin_served_every_request(published):
    assert published["unhandled"] == []


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_pushed_repo_is_the_export(published, trained, tmp_path, model_type):
    export_dir = export_model_dir(
        trained[model_type], tmp_path / "export", repo_id=f"org/{model_type}-digits"
    )
    local = {p.name: p.read_bytes() for p in export_dir.iterdir()}
    assert published["files"][model_type] == local


@pytest.mark.parametrize("mode", ["online", "offline"])
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_from_pretrained_repo_id_without_package(published, in_package, model_type, mode):
    result = published[mode]
    assert result["energyformers_import"].startswith("ModuleNotFoundError")
    case = result["cases"][model_type]
    assert "error" not in case, case["error"]
    assert case["module"].startswith("transformers_modules.org.")  # the repo's own code
    assert torch.equal(torch.tensor(case["output"]), in_package[model_type]["logits"])


@pytest.mark.parametrize("mode", ["online", "offline"])
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_pipeline_from_repo_id_matches_package(published, in_package, model_type, mode):
    case = published[mode]["cases"][model_type]
    assert "error" not in case, case["error"]
    assert case["pipeline"] == in_package[model_type]["pipeline"]


@pytest.mark.parametrize("mode", ["online", "offline"])
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_card_metrics_read_back_with_modelcard_load(published, trained, model_type, mode):
    case = published[mode]["cases"][model_type]
    assert "error" not in case, case["error"]
    measured = json.loads((trained[model_type] / "metrics.json").read_text())["test"]
    assert case["card_eval_results"] == [
        {"metric_type": "accuracy", "metric_value": measured["accuracy"], "dataset_split": "test"},
        {"metric_type": "f1", "metric_value": measured["f1_macro"], "dataset_split": "test"},
    ]


def test_offline_loading_from_hand_made_hub_cache(published, in_package):
    """HF_HUB_OFFLINE=1 with a cache written by hand (no client involved) in the hf-v5-notes layout."""
    case = published["offline"]["cases"]["hand-made"]
    assert "error" not in case, case["error"]
    assert case["module"].startswith("transformers_modules.acme.")
    model_type = sorted(FAMILIES)[0]
    assert torch.equal(torch.tensor(case["output"]), in_package[model_type]["logits"])
    assert case["pipeline"] == in_package[model_type]["pipeline"]


# ------------------------------------------------------------------------------------ push options
def test_push_to_branch_private_with_message(hub, trained):
    model_type = sorted(FAMILIES)[0]
    url = push_model_dir(
        trained[model_type], "org/branchy", private=True, revision="v1", commit_message="release v1"
    )
    assert url == f"{hub.url}/org/branchy"
    repo = hub.repos["org/branchy"]
    assert repo.private and repo.messages == ["release v1"]
    assert "model.safetensors" in hub.files("org/branchy", "v1") and hub.files("org/branchy", "main") == {}


def test_repush_is_accepted_and_unchanged_files_are_not_recommitted(hub, trained):
    model_type = sorted(FAMILIES)[0]
    push_model_dir(trained[model_type], "org/again")
    push_model_dir(trained[model_type], "org/again")
    assert len(hub.repos["org/again"].messages) == 1


def test_pushing_an_exported_folder_uploads_the_same_files(hub, trained, tmp_path):
    """`energyformers release` prints `energyformers push dist/<name> ...`: re-exporting an export is a no-op."""
    model_type = sorted(FAMILIES)[0]
    exported = export_model_dir(trained[model_type], tmp_path / "dist" / "x", repo_id="org/from-dist")
    push_model_dir(exported, "org/from-dist")
    assert hub.files("org/from-dist") == {p.name: p.read_bytes() for p in exported.iterdir()}


# ------------------------------------------------------------------------------------ failure modes
@pytest.mark.parametrize("model_type", MIM_MODELS)
def test_push_of_a_mim_folder_uploads_the_export_with_its_image_tokenizer(hub, model_type, tmp_path):
    """Both models of the paper's Table 2: the upload is the export, the image tokenizer included."""
    model_dir = build_mim_dir(tmp_path / "mim", model_type)
    push_model_dir(model_dir, f"org/{model_type}-mim")
    exported = export_model_dir(model_dir, tmp_path / "exported")
    uploaded = hub.files(f"org/{model_type}-mim")
    expected = {str(p.relative_to(exported)) for p in exported.rglob("*") if p.is_file()}
    assert set(uploaded) == expected, sorted(set(uploaded) ^ expected)
    assert {"vq_tokenizer_config.json", "vq_tokenizer.safetensors"} <= set(uploaded)
    assert uploaded["vq_tokenizer.safetensors"] == (model_dir / "vq_tokenizer.safetensors").read_bytes()


def test_mim_pipeline_from_a_repo_id_reads_the_repos_image_tokenizer(hub, monkeypatch, tmp_path):
    """`pipeline("masked-image-modeling", model="org/name")` with the package: the image tokenizer comes from the
    repo, at the revision asked for, then offline from the cache; a repo without one is named in the error."""
    from energyformers.mim import PatchKMeansTokenizer, load_vq_tokenizer
    from energyformers.pipelines import MaskedImageModelingPipeline

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))  # an empty cache of its own
    # downloads in this process: the file URLs (built from the endpoint when huggingface_hub was imported) too
    template = f"{hub.url}/{{repo_id}}/resolve/{{revision}}/{{filename}}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    model_dir = build_mim_dir(tmp_path / "mim", "hyperset")
    push_model_dir(model_dir, "org/mim")
    other = PatchKMeansTokenizer(torch.rand(8, 4, generator=torch.Generator().manual_seed(9)), 2, (8, 8), 1)
    other.save_pretrained(model_dir)  # revision v1: the same model with another codebook
    push_model_dir(model_dir, "org/mim", revision="v1")
    with single_thread():
        local = MaskedImageModelingPipeline(model=str(build_mim_dir(tmp_path / "local", "hyperset")))
        expected = local(mim_pipeline_image(), **MIM_DECODE)
        reconstruct = pipeline("masked-image-modeling", model="org/mim")
        got = reconstruct(mim_pipeline_image(), **MIM_DECODE)
    assert type(reconstruct) is MaskedImageModelingPipeline
    assert torch.equal(reconstruct.vq_tokenizer.centroids, local.vq_tokenizer.centroids)
    assert torch.equal(got["codes"], expected["codes"]) and got["psnr"] == expected["psnr"], (got, expected)
    at_v1 = MaskedImageModelingPipeline(model="org/mim", revision="v1")
    assert torch.equal(at_v1.vq_tokenizer.centroids, other.centroids)
    assert torch.equal(load_vq_tokenizer("org/mim", revision="v1").centroids, other.centroids)
    assert torch.equal(
        PatchKMeansTokenizer.from_pretrained("org/mim").centroids, local.vq_tokenizer.centroids
    )
    # offline: the cache the downloads left behind answers, the stand-in is not asked
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    served = len(hub.requests)
    offline = pipeline("masked-image-modeling", model="org/mim")
    assert torch.equal(offline.vq_tokenizer.centroids, local.vq_tokenizer.centroids)
    assert len(hub.requests) == served, hub.requests[served:]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    # a repo without an image tokenizer (a converted checkpoint): named with the missing file
    for name in ("vq_tokenizer_config.json", "vq_tokenizer.safetensors"):
        (model_dir / name).unlink()
    push_model_dir(model_dir, "org/bare")
    with pytest.raises(FileNotFoundError, match=r"Hub repo 'org/bare' holds no vq_tokenizer_config\.json"):
        pipeline("masked-image-modeling", model="org/bare")


def _no_partial_export(tmp_root: Path) -> None:
    assert list(Path(tempfile.tempdir).iterdir()) == [], "push left a temporary export behind"
    assert not [p for p in tmp_root.rglob("*") if p.name.startswith(".export.partial")]


def test_push_without_token_fails_before_any_request(hub, trained, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    with pytest.raises(PushError, match="no Hugging Face token found"):
        push_model_dir(trained[sorted(FAMILIES)[0]], "org/no-token")
    assert hub.requests == []
    _no_partial_export(tmp_path)


def test_push_with_rejected_token_names_the_problem(hub, trained, tmp_path):
    with pytest.raises(PushError, match=r"refused to create the repository .*token valid"):
        push_model_dir(trained[sorted(FAMILIES)[0]], "org/bad-token", token="hf_wrong")
    assert "org/bad-token" not in hub.repos
    _no_partial_export(tmp_path)


def test_push_to_unreachable_endpoint_fails_clearly(hub, trained, monkeypatch, tmp_path):
    with dead_endpoint() as dead:
        monkeypatch.setattr(constants, "ENDPOINT", dead)
        with pytest.raises(PushError, match=f"could not reach the Hub at {dead}"):
            push_model_dir(trained[sorted(FAMILIES)[0]], "org/unreachable")
    _no_partial_export(tmp_path)


def test_push_in_offline_mode_fails_clearly(hub, trained, monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(PushError, match="HF_HUB_OFFLINE"):
        push_model_dir(trained[sorted(FAMILIES)[0]], "org/offline")
    assert hub.requests == []


@pytest.mark.parametrize(
    "remove, match",
    [
        ("model.safetensors", "missing model.safetensors"),
        ("preprocessor_config.json", "missing image processor"),
        ("config.json", "missing config.json"),
    ],
)
def test_push_of_incomplete_folder_fails_before_upload(hub, trained, tmp_path, remove, match):
    model_dir = shutil.copytree(trained[sorted(FAMILIES)[0]], tmp_path / "incomplete")
    (model_dir / remove).unlink()
    with pytest.raises(FileNotFoundError, match=match):
        push_model_dir(model_dir, "org/incomplete")
    assert hub.requests == [] and hub.repos == {}
    _no_partial_export(tmp_path)


def test_push_cli_reports_errors_with_exit_code(hub, trained, monkeypatch, capsys):
    """No token at all is bad input (status 2, one line saying how to provide one); a token the Hub rejects is a
    failure of the upload (status 1)."""
    monkeypatch.delenv("HF_TOKEN")
    assert push.main([str(trained[sorted(FAMILIES)[0]]), "org/cli"]) == 2
    assert capsys.readouterr().err == (
        "energyformers push: error: no Hugging Face token found: pass --token, set HF_TOKEN, or run "
        "`hf auth login` (a token with write access)\n"
    )
    assert hub.requests == []
    assert push.main([str(trained[sorted(FAMILIES)[0]]), "org/cli", "--token", "hf_wrong"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("energyformers push: error: the Hub at") and "token valid" in err, err
    assert push.main([str(trained[sorted(FAMILIES)[0]]), "org/cli", "--token", STANDIN_TOKEN]) == 0
    assert capsys.readouterr().out.strip() == f"{hub.url}/org/cli"


def _no_weights_loaded(monkeypatch) -> None:
    """Make loading a folder's weights (export's check that they fit the config) fail the test."""

    def loaded(info):
        raise AssertionError(f"the weights of {info['model_dir']} were loaded")

    monkeypatch.setattr("energyformers.training.export.check_weights_load", loaded)


def test_push_names_a_folder_of_another_model_before_the_token(hub, monkeypatch, tmp_path, capsys):
    """A transformers folder that is no energyformers model is the problem to report, token or not."""
    from transformers import BertConfig, BertForSequenceClassification

    bert = tmp_path / "bertdir"
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    BertForSequenceClassification(config).save_pretrained(bert)
    monkeypatch.delenv("HF_TOKEN")
    _no_weights_loaded(monkeypatch)
    capsys.readouterr()
    assert push.main([str(bert), "org/bert"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"energyformers push: error: {bert / 'config.json'}: model_type='bert' is not an energyformers family; "
        f"expected one of {sorted(FAMILIES)}.\n"
    ), err
    assert hub.requests == []
    _no_partial_export(tmp_path)
    # the folder's kind comes before the repo id too, on the command line and through the API
    assert push.main([str(bert), "org/x y"]) == 2
    assert "model_type='bert' is not an energyformers family" in capsys.readouterr().err
    with pytest.raises(ValueError, match="model_type='bert' is not an energyformers family"):
        push_model_dir(bert, "org/x y", token=STANDIN_TOKEN)


@pytest.mark.parametrize("repo_id", ["org/x y", "org/-name", "org/name..git"])
def test_push_refuses_a_bad_repo_id_before_loading_anything(hub, trained, monkeypatch, capsys, repo_id):
    _no_weights_loaded(monkeypatch)
    assert push.main([str(trained[sorted(FAMILIES)[0]]), repo_id]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"energyformers push: error: REPO_ID {repo_id!r}: not a Hub repository id"), err
    with pytest.raises(ValueError, match=f"repo_id {re.escape(repr(repo_id))}: not a Hub repository id"):
        push_model_dir(trained[sorted(FAMILIES)[0]], repo_id)
    assert hub.requests == []


# ---------------------------------------------------------------------------- a real CLI subprocess
# `energyformers push` and `energyformers train --push_to_hub`, each run as `python -m energyformers` runs it
# (runpy), one after the other in one child process; after each, a line with the command and its exit status
CLI_CHILD = """
import json, runpy, sys
for argv in json.loads(sys.argv[1]):
    sys.argv = ["energyformers", *argv]
    try:
        runpy.run_module("energyformers", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = stop.code
    print(f"{END} {argv[0]} exit {code}", flush=True)
"""
END = "=== energyformers"


@pytest.fixture(scope="module")
def cli_runs(trained, tmp_path_factory) -> dict:
    """What a user runs, against the stand-in: `energyformers push` of a trained folder and `energyformers train
    --push_to_hub` (the training CLI, a few steps), in ONE fresh process (its start-up is most of the time)
    configured only by HF_* variables. Each command's stdout and exit status, the stand-in's repos, what the
    commands left in TMPDIR."""
    root = tmp_path_factory.mktemp("cli")
    model_type = sorted(FAMILIES)[0]
    push_argv = ["push", str(trained[model_type]), "org/subprocess"]
    train_argv = ["train", "--model", model_type, "--dataset", "digits"]
    train_argv += ["--max_steps", "2", "--max_train_samples", "128", "--max_eval_samples", "64"]
    train_argv += ["--max_test_samples", "64", "--disable_tqdm", "--output_dir", str(root / "run")]
    # the tiny architecture; the CLI derives the geometry from the data
    train_argv += ["--push_to_hub", "--hub_model_id", "org/trained", "--config", *cli_config(model_type)]
    train_argv += ["--hub_token", STANDIN_TOKEN]  # as HF_TOKEN: the flag's value must reach no uploaded file
    with HubStandIn() as server:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(root),
            "HF_HOME": str(root / "hf_home"),
            "HF_ENDPOINT": server.url,
            "HF_TOKEN": STANDIN_TOKEN,
            "TMPDIR": str(root),
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_DATASETS_OFFLINE": "1",  # the push needs the (stand-in) network; data comes from local packages
            "OMP_NUM_THREADS": "1",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        proc = subprocess.run(
            [sys.executable, "-c", CLI_CHILD.replace("{END}", END), json.dumps([push_argv, train_argv])],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        files = {repo: server.files(repo) for repo in ("org/subprocess", "org/trained")}
        unhandled = list(server.unhandled)
    commands, stdout = {}, proc.stdout
    for name in ("push", "train"):
        before, marker, stdout = stdout.partition(f"{END} {name} exit ")
        code, _, stdout = stdout.partition("\n")
        commands[name] = {"stdout": before, "exit": int(code) if marker and code.isdigit() else None}
    return {
        "commands": commands,
        "returncode": proc.returncode,
        "stderr": proc.stderr,
        "url": server.url,
        "files": files,
        "unhandled": unhandled,
        "train_out": root / "run",
        "left_in_tmpdir": [p.name for p in root.iterdir() if p.name.startswith("energyformers-push-")],
    }


def test_push_cli_subprocess_reads_hf_endpoint_and_hf_token(cli_runs):
    """What a user runs: `energyformers push` in its own process, configured only by HF_* variables."""
    push = cli_runs["commands"]["push"]
    assert push["exit"] == 0, (push, cli_runs["stderr"][-3000:])
    assert push["stdout"].strip().splitlines()[-1] == f"{cli_runs['url']}/org/subprocess", push["stdout"]
    assert {"config.json", "model.safetensors", "README.md"} <= set(cli_runs["files"]["org/subprocess"])
    assert cli_runs["left_in_tmpdir"] == [], cli_runs["left_in_tmpdir"]


def test_train_push_to_hub_uploads_no_token(cli_runs):
    """`train --push_to_hub --hub_token T`: T is in no uploaded file and no file of the run folder (the card and
    metrics.json record the command, with `<HUB_TOKEN>` in its place)."""
    assert cli_runs["commands"]["train"]["exit"] == 0, cli_runs["stderr"][-4000:]
    uploaded = cli_runs["files"]["org/trained"]
    assert "metrics.json" in uploaded and "README.md" in uploaded, sorted(uploaded)
    leaks = [name for name, data in uploaded.items() if STANDIN_TOKEN.encode() in data]
    leaks += [
        str(p)
        for p in cli_runs["train_out"].rglob("*")
        if p.is_file() and STANDIN_TOKEN.encode() in p.read_bytes()
    ]
    assert leaks == [], leaks
    command = json.loads(uploaded["metrics.json"])["recipe"]["command"]
    assert command.endswith("--hub_token '<HUB_TOKEN>'"), command


def test_train_push_to_hub_uploads_what_push_uploads(cli_runs, tmp_path):
    """`energyformers train --push_to_hub` (the training CLI, a few steps) against the stand-in: the repo holds
    exactly the export of the saved folder, i.e. what `energyformers push` uploads."""
    train = cli_runs["commands"]["train"]
    assert train["exit"] == 0 and cli_runs["returncode"] == 0, (train["exit"], cli_runs["stderr"][-4000:])
    assert f"pushed to {cli_runs['url']}/org/trained" in train["stdout"], train["stdout"][-4000:]
    assert cli_runs["unhandled"] == []
    expected = export_model_dir(cli_runs["train_out"], tmp_path / "export", repo_id="org/trained")
    assert cli_runs["files"]["org/trained"] == {p.name: p.read_bytes() for p in expected.iterdir()}
