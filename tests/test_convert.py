"""`energyformers convert`: the authors' checkpoints through the CLI, both directions, and its failure modes.

The fixtures (`../shared/fixtures/authors`, or `$ENERGYFORMERS_AUTHOR_FIXTURES`) are outputs of the authors'
own code: official weights under official names, inputs, float64/float32 outputs and intermediates. The
fixture tests are skipped when that folder is absent; the failure-mode tests use a synthetic official iMixer
checkpoint built from the official key layout and run everywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForImageClassification, AutoModelForTokenClassification

from energyformers.training import cli
from energyformers.training.convert import EXTRAS_FILE, SOURCES, read_official_config, sha256_file

FIXTURES = Path(
    os.environ.get(
        "ENERGYFORMERS_AUTHOR_FIXTURES",
        Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "authors",
    )
)
needs_fixtures = pytest.mark.skipif(
    not FIXTURES.is_dir(), reason=f"the authors' fixtures are not at {FIXTURES}"
)
NAMES = {
    "imixer": "imixer_tiny",
    "hyperbf": "hyperbf_vit_tiny",
    "hyperset-ic": "hyperset_ic_m32",
    "hyperset-sudoku": "hyperset_sudoku",
}
ATOL = {"float64": 1e-10, "float32": 1e-5}
DTYPE = {"float64": torch.float64, "float32": torch.float32}
TAG = {"float64": "f64", "float32": "f32"}


def run(*args: object) -> int:
    return cli.main(["convert", *map(str, args)])


def fixture(name: str) -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / f"{name}.safetensors"))


def official_keys(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: value for key, value in tensors.items() if "/" not in key}


def close(actual: torch.Tensor, expected: torch.Tensor, atol: float, what: str) -> None:
    error = float((actual.double() - expected.double()).abs().max())
    assert error <= atol, f"{what}: max |Δ| = {error:.3e} > {atol:.0e}"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(source, dtype) -> folder converted from the fixture through the CLI (cached per module), or the rc."""
    cache: dict[tuple[str, str], Path | int] = {}
    root = tmp_path_factory.mktemp("converted")

    def get(source: str, dtype: str) -> Path:
        if (source, dtype) not in cache:
            name, out = NAMES[source], root / f"{source}-{dtype}"
            checkpoint, config = FIXTURES / f"{name}.safetensors", FIXTURES / f"{name}.json"
            rc = run(
                "--source",
                source,
                checkpoint,
                "--official-config",
                config,
                "--output_dir",
                out,
                "--dtype",
                dtype,
            )
            cache[source, dtype] = out if rc == 0 else rc
        result = cache[source, dtype]
        assert isinstance(result, Path), (
            f"energyformers convert --source {source} --dtype {dtype} exited {result}"
        )
        return result

    return get


class Capture:
    """Outputs of submodules during one forward (forward hooks), in call order."""

    def __init__(self, modules: dict[str, torch.nn.Module]):
        self.outputs: dict[str, list] = {name: [] for name in modules}
        self.handles = [
            module.register_forward_hook(lambda _m, _i, out, name=name: self.outputs[name].append(out))
            for name, module in modules.items()
        ]

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()


# ------------------------------------------------------------------------- per-family intermediates


def check_imixer(model, gold: dict[str, torch.Tensor], dtype: str) -> None:
    tag, atol = TAG[dtype], ATOL[dtype]
    layers = model.imixer.layers
    with (
        Capture({f"tokmix{i}": layer.token_mixing for i, layer in enumerate(layers)}) as capture,
        torch.no_grad(),
    ):
        out = model.imixer(gold["golden/input/images"].to(DTYPE[dtype]), output_hidden_states=True)
    if dtype == "float32":
        close(out.hidden_states[2], gold["golden/f32/block1/out"], atol, "block 1 output")
        close(
            capture.outputs["tokmix0"][0][0],
            gold["golden/f32/block0/tokmix_out"],
            atol,
            "block 0 token mixer",
        )
        return
    close(out.hidden_states[0], gold[f"golden/{tag}/stem_out"], atol, "stem output")
    for i in range(2):
        close(out.hidden_states[i + 1], gold[f"golden/{tag}/block{i}/out"], atol, f"block {i} output")
        close(
            capture.outputs[f"tokmix{i}"][0][0],
            gold[f"golden/{tag}/block{i}/tokmix_out"],
            atol,
            f"block {i} iMLP",
        )
    close(out.last_hidden_state, gold[f"golden/{tag}/norm_out"], atol, "final LayerNorm")
    close(out.pooler_output, gold[f"golden/{tag}/pooled"], atol, "pooled")


def check_hyperbf(model, gold: dict[str, torch.Tensor], dtype: str) -> None:
    tag, atol = TAG[dtype], ATOL[dtype]
    layers = model.hyperbf.layers
    modules = {f"attn{i}": layer.attention for i, layer in enumerate(layers)}
    modules.update({f"rbf{i}": layer.feedforward for i, layer in enumerate(layers)})
    with Capture(modules) as capture, torch.no_grad():
        out = model.hyperbf(
            gold["golden/input/images"].to(DTYPE[dtype]), output_hidden_states=True, output_attentions=True
        )
    for i in range(2):
        if f"golden/{tag}/block{i}/attn_w" in gold:  # float32: block 0 only
            close(
                out.attentions[i], gold[f"golden/{tag}/block{i}/attn_w"], atol, f"block {i} attention weights"
            )
        if dtype == "float64":
            close(
                capture.outputs[f"attn{i}"][0][0],
                gold[f"golden/{tag}/block{i}/attn_out"],
                atol,
                f"block {i} attn",
            )
            close(
                capture.outputs[f"rbf{i}"][0][0],
                gold[f"golden/{tag}/block{i}/rbf_out"],
                atol,
                f"block {i} RBF",
            )
            close(out.hidden_states[i + 1], gold[f"golden/{tag}/block{i}/out"], atol, f"block {i} output")
    if dtype == "float64":
        close(out.hidden_states[0], gold[f"golden/{tag}/x0"], atol, "embeddings")
        close(out.last_hidden_state[:, 0], gold[f"golden/{tag}/cls_final"], atol, "final CLS")
    else:
        close(out.hidden_states[2], gold["golden/f32/block1/out"], atol, "block 1 output")


def check_hyperset_ic(model, gold: dict[str, torch.Tensor], dtype: str) -> None:
    tag, atol = TAG[dtype], ATOL[dtype]
    backbone = model.hyperset
    with Capture({"steps": backbone.step_sizes}) as capture, torch.no_grad():
        out = backbone(
            gold["golden/input/images"].to(DTYPE[dtype]), output_hidden_states=True, output_attentions=True
        )
    close(out.hidden_states[0], gold[f"golden/{tag}/x0"], atol, "tokens entering the first iteration")
    for t in range(3):
        close(out.hidden_states[t + 1], gold[f"golden/{tag}/states"][t], atol, f"state after iteration {t}")
        alpha, gamma = capture.outputs["steps"][t]
        close(alpha, gold[f"golden/{tag}/alpha"][t], atol, f"alpha at iteration {t}")
        close(gamma, gold[f"golden/{tag}/beta"][t], atol, f"beta at iteration {t}")
        if dtype == "float64":
            close(out.attentions[t], gold["golden/f64/P"][t], atol, f"P at iteration {t}")
    if dtype == "float64":
        close(out.last_hidden_state[:, 0], gold["golden/f64/cls_final"], atol, "final CLS")


CHECKS = {"imixer": check_imixer, "hyperbf": check_hyperbf, "hyperset-ic": check_hyperset_ic}


# ------------------------------------------------------------------------- fixtures through the CLI


@needs_fixtures
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("source", ["imixer", "hyperbf", "hyperset-ic"])
def test_fixture_converts_to_the_authors_outputs(converted, source, dtype):
    folder = converted(source, dtype)
    name = NAMES[source]
    gold = fixture(name)
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "README.md"} <= {
        p.name for p in folder.iterdir()
    }
    card = (folder / "README.md").read_text()
    assert sha256_file(FIXTURES / f"{name}.safetensors") in card and "golden/" in card
    kwargs = {"attn_implementation": "eager"} if source == "hyperbf" else {}
    model = AutoModelForImageClassification.from_pretrained(folder, dtype=DTYPE[dtype], **kwargs).eval()
    with torch.no_grad():
        logits = model(gold["golden/input/images"].to(DTYPE[dtype])).logits
    close(logits, gold[f"golden/{TAG[dtype]}/logits"], ATOL[dtype], "logits")
    CHECKS[source](model, gold, dtype)


@needs_fixtures
def test_card_states_the_feedforward_activation(converted):
    card = (converted("hyperset-ic", "float32") / "README.md").read_text()
    assert "**GELU**" in card and "hidden_act" in card
    assert (
        json.loads((converted("hyperset-ic", "float32") / "config.json").read_text())["hidden_act"] == "gelu"
    )


@needs_fixtures
@pytest.mark.parametrize("source", ["imixer", "hyperbf", "hyperset-ic"])
def test_round_trip_official_ours_official_is_exact(converted, source, tmp_path):
    name = NAMES[source]
    out = tmp_path / f"{name}.safetensors"
    assert run("--reverse", "--source", source, converted(source, "float32"), "--output", out) == 0
    original, back = official_keys(fixture(name)), load_file(str(out))
    assert back.keys() == original.keys()
    for key, value in original.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key
    reference = json.loads((FIXTURES / f"{name}.json").read_text())["constructor"]["kwargs"]
    kwargs, _ = read_official_config(out.with_suffix(".json"), SOURCES[source])
    assert kwargs == read_official_config(FIXTURES / f"{name}.json", SOURCES[source])[0]
    assert {k: v for k, v in kwargs.items() if k in reference} == reference


@needs_fixtures
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_hyperbf_reverse_without_extras_is_function_equivalent(converted, dtype, tmp_path, capsys):
    """Without the stored originals (e.g. after fine-tuning) the reverse emits M = I and folded temperatures."""
    folder = tmp_path / "folder"
    shutil.copytree(converted("hyperbf", dtype), folder)
    (folder / EXTRAS_FILE).unlink()
    out = tmp_path / "official.safetensors"
    assert run("--reverse", "--source", "hyperbf", folder, "--output", out) == 0
    assert "canonical" in capsys.readouterr().out
    gold, state = fixture("hyperbf_vit_tiny"), load_file(str(out))
    assert torch.equal(state["blocks.0.attn.M"], torch.eye(8, dtype=DTYPE[dtype]))
    kwargs, _ = read_official_config(out.with_suffix(".json"), SOURCES["hyperbf"])
    logits = SOURCES["hyperbf"].official_logits(state, kwargs, gold["golden/input/images"], DTYPE[dtype])
    close(
        logits, gold[f"golden/{TAG[dtype]}/logits"], ATOL[dtype], "official computation on canonical tensors"
    )


@needs_fixtures
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("source", sorted(NAMES))
def test_official_computation_matches_the_authors_run(source, dtype):
    """`official_logits` (used to verify real checkpoints) is the authors' computation, Sudoku included."""
    gold, family = fixture(NAMES[source]), SOURCES[source]
    kwargs, _ = read_official_config(FIXTURES / f"{NAMES[source]}.json", family)
    inputs = gold["golden/input/idx" if family.input_kind == "ids" else "golden/input/images"]
    logits = family.official_logits(official_keys(gold), kwargs, inputs, DTYPE[dtype])
    close(logits, gold[f"golden/{TAG[dtype]}/logits"], 1e-12 if dtype == "float64" else ATOL[dtype], "logits")


@needs_fixtures
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sudoku_fixture_converts_to_the_authors_outputs(converted, dtype):
    folder = converted("hyperset-sudoku", dtype)
    model = AutoModelForTokenClassification.from_pretrained(folder, dtype=DTYPE[dtype]).eval()
    gold = fixture("hyperset_sudoku")
    with torch.no_grad():
        logits = model(gold["golden/input/idx"]).logits
    close(logits, gold[f"golden/{TAG[dtype]}/logits"], ATOL[dtype], "per-cell logits")


# ------------------------------------------------------------------------- failure modes (no fixtures needed)

TINY_IMIXER = {
    "num_classes": 3,
    "img_size": 8,
    "patch_size": 4,
    "num_blocks": 1,
    "embed_dim": 8,
    "mlp_ratio": [0.5, 4.0],
    "hidden_ratio": 2.0,
    "n_power_iterations": 1,
    "n_repeat": 2,
}


@pytest.fixture
def synthetic(tmp_path):
    """A random official iMixer state_dict (bare safetensors) and its constructor kwargs (JSON)."""
    family = SOURCES["imixer"]
    kwargs = family.normalise_kwargs(dict(TINY_IMIXER))
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, (shape, _) in family.layout(kwargs).items():
        value = 0.3 * torch.randn(shape, generator=generator)
        state[key] = value / value.norm() if key.endswith(("weight_u", "weight_v")) else value
    config = tmp_path / "kwargs.json"
    config.write_text(json.dumps(TINY_IMIXER))
    checkpoint = tmp_path / "imixer.safetensors"
    save_file(state, str(checkpoint))
    return state, checkpoint, config


def refused(tmp_path: Path, capsys, *args: object) -> str:
    """Run a conversion expected to fail; assert it wrote nothing (no output folder, no temporary left)."""
    before = set(tmp_path.iterdir())
    assert run(*args, "--output_dir", tmp_path / "out") == 1
    assert set(tmp_path.iterdir()) == before
    return capsys.readouterr().err


def test_convert_is_a_cli_command(capsys):
    assert "convert" in cli.COMMANDS
    assert cli.main([]) == 0 and "convert" in capsys.readouterr().out


def test_synthetic_checkpoint_converts_without_reference(synthetic, tmp_path, capsys):
    _, checkpoint, config = synthetic
    assert (
        run("--source", "imixer", checkpoint, "--official-config", config, "--output_dir", tmp_path / "out")
        == 0
    )
    assert "no reference outputs" in capsys.readouterr().out
    assert not list(tmp_path.glob(".*"))  # the temporary folder was renamed into place
    yaml = pytest.importorskip("yaml")
    hydra = tmp_path / "run.yaml"  # a YAML config with the kwargs in its `model` group
    hydra.write_text(yaml.safe_dump({"model": TINY_IMIXER, "seed": 0}))
    assert (
        run("--source", "imixer", checkpoint, "--official-config", hydra, "--output_dir", tmp_path / "y") == 0
    )
    first, second = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("out", "y"))
    assert first.keys() == second.keys() and all(torch.equal(first[key], second[key]) for key in first)


def test_renamed_key_fails_naming_it(synthetic, tmp_path, capsys):
    state, _, config = synthetic
    state["head.kernel"] = state.pop("head.weight")
    bad = tmp_path / "renamed.safetensors"
    save_file(state, str(bad))
    err = refused(tmp_path, capsys, "--source", "imixer", bad, "--official-config", config)
    assert "unexpected key 'head.kernel'" in err and "missing key 'head.weight'" in err


def test_wrong_shape_fails_naming_the_key(synthetic, tmp_path, capsys):
    state, _, config = synthetic
    state["blocks.0.mlp_channels.fc1.weight"] = torch.zeros(31, 8)
    bad = tmp_path / "shape.safetensors"
    save_file(state, str(bad))
    err = refused(tmp_path, capsys, "--source", "imixer", bad, "--official-config", config)
    assert "'blocks.0.mlp_channels.fc1.weight' has shape [31, 8]" in err


def test_official_config_disagreeing_with_the_weights_fails(synthetic, tmp_path, capsys):
    _, checkpoint, _ = synthetic
    config = tmp_path / "wrong.json"
    config.write_text(json.dumps({**TINY_IMIXER, "embed_dim": 16}))
    err = refused(tmp_path, capsys, "--source", "imixer", checkpoint, "--official-config", config)
    # the first offending key in the file's order (safetensors stores keys sorted), then a summary of the others
    assert err.startswith(
        "energyformers convert: error: checkpoint imixer.safetensors: key 'blocks.0.mlp_channels.fc1.bias' has "
        "shape [32], but the official config gives [64]"
    )
    config.write_text(json.dumps({key: value for key, value in TINY_IMIXER.items() if key != "n_repeat"}))
    assert "'n_repeat' is missing" in refused(
        tmp_path, capsys, "--source", "imixer", checkpoint, "--official-config", config
    )
    config.write_text(json.dumps({**TINY_IMIXER, "n_repeats": 2}))
    assert "'n_repeats' is not an argument" in refused(
        tmp_path, capsys, "--source", "imixer", checkpoint, "--official-config", config
    )


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_truncated_file_fails_naming_it(synthetic, tmp_path, capsys, suffix):
    state, checkpoint, config = synthetic
    bad = tmp_path / f"truncated{suffix}"
    if suffix == ".pth":
        torch.save(state, bad)
    else:
        shutil.copy(checkpoint, bad)
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    err = refused(tmp_path, capsys, "--source", "imixer", bad, "--official-config", config)
    assert str(bad) in err and "truncated" in err


def test_pickle_is_refused_without_trust_pickle(synthetic, tmp_path, capsys):
    """A Lightning checkpoint whose hyper-parameters are a Python object needs full unpickling."""
    state, _, config = synthetic
    ckpt = tmp_path / "lightning.ckpt"
    lightning = {"model." + key: value for key, value in state.items()}
    torch.save({"state_dict": lightning, "epoch": 3, "hyper_parameters": argparse.Namespace(lr=0.1)}, ckpt)
    err = refused(tmp_path, capsys, "--source", "imixer", ckpt, "--official-config", config)
    assert str(ckpt) in err and "--trust-pickle" in err
    out = tmp_path / "out"
    assert (
        run("--source", "imixer", ckpt, "--official-config", config, "--output_dir", out, "--trust-pickle")
        == 0
    )
    assert "PyTorch-Lightning" in (out / "README.md").read_text()
    assert not [p for p in out.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl")]


def test_checkpoint_layouts_convert_to_the_same_weights(synthetic, tmp_path):
    state, checkpoint, config = synthetic
    native = tmp_path / "native.pth"
    torch.save({"model_state_dict": {"module." + k: v for k, v in state.items()}, "epoch": 1}, native)
    lightning = tmp_path / "lightning.ckpt"
    torch.save(
        {"state_dict": {"model." + k: v for k, v in state.items()}, "optimizer_states": [{}]}, lightning
    )
    folders = []
    for path in (checkpoint, native, lightning):
        folders.append(tmp_path / f"out-{path.stem}")
        assert run("--source", "imixer", path, "--official-config", config, "--output_dir", folders[-1]) == 0
    weights = [load_file(str(folder / "model.safetensors")) for folder in folders]
    assert all(w.keys() == weights[0].keys() for w in weights)
    assert all(torch.equal(w[k], weights[0][k]) for w in weights for k in w)


def test_failed_verification_writes_nothing(synthetic, tmp_path, capsys):
    _, checkpoint, config = synthetic
    reference = tmp_path / "reference.safetensors"
    save_file(
        {"golden/input/images": torch.randn(2, 3, 8, 8), "golden/f32/logits": torch.zeros(2, 3)},
        str(reference),
    )
    err = refused(
        tmp_path,
        capsys,
        "--source",
        "imixer",
        checkpoint,
        "--official-config",
        config,
        "--reference",
        reference,
    )
    assert "verification failed" in err


def test_existing_output_is_kept_without_overwrite(synthetic, tmp_path, capsys):
    _, checkpoint, config = synthetic
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert run("--source", "imixer", checkpoint, "--official-config", config, "--output_dir", out) == 1
    assert "--overwrite" in capsys.readouterr().err and [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (
        run("--source", "imixer", checkpoint, "--official-config", config, "--output_dir", out, "--overwrite")
        == 0
    )
    assert "keep.txt" not in {p.name for p in out.iterdir()} and not list(tmp_path.glob(".*"))
