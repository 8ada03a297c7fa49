"""The authors' released Hyper-SET files (`Yunzhe/Hyper-SET`): one command each, by their published names.

The released files themselves are not downloaded here; each test builds a checkpoint of the published structure
and file layout (bare state_dict, PyTorch Lightning `.ckpt`, dict with `model_state_dict`) from seeded random
tensors under the official key names, or from the authors' fixture tensors (`fixtures.AUTHOR_FIXTURES`).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fixtures import AUTHOR_FIXTURES, assert_differs, needs_author_fixtures, rounding
from safetensors.torch import load_file
from transformers import AutoModelForImageClassification

from energyformers import HyperSetConfig
from energyformers.training import cli
from energyformers.training.convert import SOURCES

SUDOKU_FILE = "Sudoku_layer1_recur24_dim768_multiplier4.pth"
IMAGENET_FILE = "IC_ImageNet1k_layer12_recur1_dim768_multiplier1.ckpt"
MIM_FILE = "MIM_ImageNet100_layer1_recur24_dim768_multiplier8.pth"


def run(*args: object) -> int:
    return cli.main(["convert", *map(str, args)])


def random_official_state(source: str, kwargs: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random tensors under the official names and shapes. Scales as in the fixtures' `parameter_init_used`
    (norm gains near 1, small biases, matrices ~ 1/√fan_in), so that step sizes are non-zero and the
    verification compares a live computation (the official init zeroes the step-size network)."""
    family = SOURCES[source]
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, (shape, _) in family.layout(family.normalise_kwargs(dict(kwargs))).items():
        if key.endswith("attn.mask"):  # the Sudoku class's unused causal buffer, at its official value
            state[key] = torch.tril(torch.ones(shape[-1], shape[-1])).view(shape)
        elif len(shape) == 1 and key.endswith("weight"):
            state[key] = 0.9 + 0.2 * torch.rand(shape, generator=generator)
        elif key.endswith("bias"):
            state[key] = 0.05 * torch.randn(shape, generator=generator)
        elif len(shape) == 2:
            state[key] = torch.randn(shape, generator=generator) / math.sqrt(shape[1])
        else:  # cls_token, learned positions
            state[key] = 0.5 * torch.randn(shape, generator=generator)
    return state


def lightning(state: dict[str, torch.Tensor], prefix: str = "model.") -> dict:
    """A PyTorch Lightning checkpoint around `state`, with the non-tensor objects such a file carries."""
    return {
        "epoch": 299,
        "global_step": 1000,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": {prefix + key: value for key, value in state.items()},
        "optimizer_states": [
            {
                "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(4)}},
                "param_groups": [{"lr": 1e-4, "betas": (0.0, 0.95), "params": [0]}],
            }
        ],
        "lr_schedulers": [{"T_max": 300, "last_epoch": 299, "base_lrs": [1e-4]}],
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"completed": 299}}}},
        "hparams_name": "cfg",
        "hyper_parameters": {"cfg": argparse.Namespace(lr=1e-4, n_layer=12), "seed": 42},
    }


def written(tmp_path: Path) -> list[str]:
    return sorted(path.name for path in tmp_path.iterdir())


# ------------------------------------------------------------------------- the released files, at their real size


def test_released_sudoku_file_converts_with_one_command(tmp_path, capsys):
    """The published bare state_dict, by its published name: no --source, no --official-config."""
    from energyformers.training.convert.released import SUDOKU

    state = random_official_state("hyperset-sudoku", SUDOKU.kwargs)
    checkpoint = tmp_path / SUDOKU_FILE
    torch.save(state, checkpoint)
    out = tmp_path / "hyperset-sudoku"
    assert run(checkpoint, "--output_dir", out) == 0, capsys.readouterr().err
    config = HyperSetConfig.from_pretrained(out)
    expected = {
        "num_hidden_layers": 1,
        "num_iterations": 24,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "intermediate_size": 4 * 768,
        "vocab_size": 10,
        "max_position_embeddings": 81,
        "num_labels": 9,
        "step_size_condition": "input",
        "position_embedding_type": "learned",
        "hidden_act": "relu",
        "qkv_norm": "shared",
    }
    assert {key: getattr(config, key, None) for key in expected} == expected
    assert config.official_training_kwargs == {"resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.1}
    card = (out / "README.md").read_text()
    assert "shipped with the converter" in card and SUDOKU.path in card and "bare state_dict" in card
    ours = load_file(str(out / "model.safetensors"))
    assert torch.equal(ours["hyperset.layers.0.attention.qkv_proj.weight"], state["blocks.0.attn.qkv.weight"])
    assert torch.equal(ours["hyperset.embeddings.position_embeddings.weight"], state["pos_emb"][0])


def test_released_imagenet_file_converts_with_one_command(tmp_path, capsys):
    """The published Lightning `.ckpt` (`model.` prefix, DDP `module.`, optimizer, loop state and a Namespace in
    its hyper-parameters), read without --trust-pickle: 12 distinct layers × 1 iteration, 16 × 16 patches of 14 px."""
    from energyformers.training.convert.released import IMAGENET

    state = random_official_state("hyperset-ic", IMAGENET.kwargs)
    assert {key for key in state if key.endswith("attn.qkv.weight")} == {
        f"enc.{i}.attn.qkv.weight" for i in range(12)
    }
    assert state["emb.0.weight"].shape == (14 * 14 * 3,)  # a patch's features: 14 × 14 pixels × RGB
    checkpoint = tmp_path / IMAGENET_FILE
    torch.save(lightning(state, prefix="model.module."), checkpoint)
    out = tmp_path / "hyperset-imagenet1k"
    assert run(checkpoint, "--output_dir", out) == 0, capsys.readouterr().err
    log = capsys.readouterr().out
    assert "inert placeholders" in log and "argparse.Namespace" in log, log
    config = HyperSetConfig.from_pretrained(out)
    expected = {
        "num_hidden_layers": 12,
        "num_iterations": 1,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "intermediate_size": 768,
        "image_size": 224,
        "patch_size": 14,
        "num_labels": 1000,
        "pooling": "cls",
        "step_size_condition": "current",
        "hidden_act": "gelu",
        "qkv_norm": "separate",
        "iteration_conditioning": "sinusoidal",
        "time_embedding_dim": 512,
    }
    assert {key: getattr(config, key, None) for key in expected} == expected
    card = (out / "README.md").read_text()
    assert "shipped with the converter" in card and IMAGENET.path in card and "PyTorch-Lightning" in card
    ours = load_file(str(out / "model.safetensors"))
    for i in (0, 11):  # distinct layers, each its own weights
        assert torch.equal(
            ours[f"hyperset.layers.{i}.attention.qkv_proj.weight"], state[f"enc.{i}.attn.qkv.weight"]
        )
    assert_differs(
        ours["hyperset.layers.0.attention.qkv_proj.weight"],
        state["enc.1.attn.qkv.weight"],
        "layer 0 vs enc.1",
    )


def test_the_shipped_imagenet_config_is_the_published_structure():
    """HyperSetConfig expresses it: 12 layers × 1 iteration, patch_size = 224 / 16 = 14, 257 tokens with the CLS."""
    from energyformers import HyperSetForImageClassification
    from energyformers.training.convert.released import IMAGENET, released_file

    family = SOURCES["hyperset-ic"]
    kwargs = family.normalise_kwargs(dict(IMAGENET.kwargs))
    config = family.config(kwargs)
    assert (config.num_hidden_layers, config.num_iterations) == (12, 1)
    assert (config.image_size, config.patch_size) == (224, 14)
    assert config.image_size // config.patch_size == kwargs["patch"] == 16
    with torch.device("meta"):
        model = HyperSetForImageClassification(config)
    counted = sum(math.prod(shape) for shape, _ in family.layout(kwargs).values())
    assert model.num_parameters() == counted, (model.num_parameters(), counted)
    assert family.kwargs_from_config(config) == kwargs  # and back to the official kwargs
    # the typo'd name of the authors' eval script is the same file
    assert released_file("x/IC_ImageNet1k_layer12_reucr1_dim768_multiplier1.ckpt") is IMAGENET


def mim_payload(state: dict[str, torch.Tensor]) -> dict:
    """What `mim/trainer.py` saves: the weights under `model_state_dict` (DDP's `module.` prefix) beside the
    optimizer state and the loop's counters, plus a non-tensor config object."""
    return {
        "model_state_dict": {"module." + key: value for key, value in state.items()},
        "optimizer_state_dict": {
            "state": {
                0: {"step": torch.tensor(7.0), "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)}
            },
            "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.96), "weight_decay": 0.1, "params": [0]}],
        },
        "epoch": 299,
        "global_iter": 150_000,
        "args": argparse.Namespace(task="mim", n_recur=24),
    }


def test_released_mim_file_converts_with_one_command(tmp_path, capsys):
    """The published `model_state_dict` dict, by its published name, read without --trust-pickle: 1 layer × 24
    iterations, d 768, 12 heads, multiplier 8, a 16 × 16 grid of codes, codebook 1024 + [MASK]."""
    from energyformers import HyperSetForMaskedImageModeling
    from energyformers.training.convert.released import MIM

    state = random_official_state("hyperset-mim", MIM.kwargs)
    checkpoint = tmp_path / MIM_FILE
    torch.save(mim_payload(state), checkpoint)
    out = tmp_path / "hyperset-mim"
    assert run(checkpoint, "--output_dir", out) == 0, capsys.readouterr().err
    log = capsys.readouterr().out
    assert "model_state_dict" in log and "argparse.Namespace" in log, log
    config = HyperSetConfig.from_pretrained(out)
    # the shipped official config builds exactly the paper's preset "Ours 1 / 24 / 8d" with the paper's iteration
    # conditioning (the preset's default is the time-invariant "none")
    preset = HyperSetConfig.from_preset("mim-1-24-8d", iteration_conditioning="sinusoidal-no-mlp")
    fields = (
        "num_hidden_layers",
        "num_iterations",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
    )
    fields += ("vocab_size", "max_position_embeddings", "position_embedding_type", "iteration_conditioning")
    fields += ("time_embedding_dim", "step_size_norm", "step_size_condition", "qkv_norm", "hidden_act")
    fields += ("classifier_norm", "classifier_bias")
    assert {key: getattr(config, key) for key in fields} == {key: getattr(preset, key) for key in fields}
    assert (config.num_iterations, config.intermediate_size, config.vocab_size) == (24, 8 * 768, 1025)
    assert config.official_training_kwargs == {"n_layer": 1, "dropout": 0.1, "nclass": 100}
    model = HyperSetForMaskedImageModeling.from_pretrained(out)
    assert model.num_parameters() == 8_072_000  # Table 2's 8.07 M
    card = (out / "README.md").read_text()
    assert "shipped with the converter" in card and MIM.path in card and "model_state_dict" in card
    ours = load_file(str(out / "model.safetensors"))
    assert torch.equal(ours["code_head.bias"], state["lm_head.1.bias"])
    assert torch.equal(ours["hyperset.layers.0.attention.qkv_gain"][0], state["transformer.ln1.weight"])


@needs_author_fixtures
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_authors_mim_fixture_in_the_released_layout_verifies(dtype, tmp_path, capsys):
    """The authors' `hyperset_mim` tensors saved as `mim/trainer.py` saves them (`model_state_dict`, `module.`,
    optimizer state), read without --trust-pickle: the converted folder's logits on the authors' input are theirs
    (within rounding of the logits' scale: see the bound's comment)."""
    from transformers import AutoModelForMaskedImageModeling

    fixture = AUTHOR_FIXTURES / "hyperset_mim.safetensors"
    tensors = load_file(str(fixture))
    state = {key: value for key, value in tensors.items() if "/" not in key}
    checkpoint = tmp_path / "MIM_tiny.pth"
    torch.save(mim_payload(state), checkpoint)
    out = tmp_path / "out"
    args = (
        "--source",
        "hyperset-mim",
        checkpoint,
        "--official-config",
        AUTHOR_FIXTURES / "hyperset_mim.json",
    )
    assert run(*args, "--reference", fixture, "--dtype", dtype, "--output_dir", out) == 0, (
        capsys.readouterr().err
    )
    torch_dtype = torch.float64 if dtype == "float64" else torch.float32
    model = AutoModelForMaskedImageModeling.from_pretrained(out, dtype=torch_dtype).eval()
    tokens = tensors["golden/input/tokens"].flatten(1)
    tag = "f64" if dtype == "float64" else "f32"
    expected = tensors[f"golden/{tag}/logits"]
    # the authors' order of the same sums differs from ours by rounding: attention sums over 256 tokens, through
    # 3 iterations, in ulps of the logits' scale
    scale = max(1.0, float(expected.abs().max()))
    bound = rounding(torch_dtype, 256 * 3, scale)
    with torch.no_grad():
        error = float((model(tokens).logits - expected).abs().max())
        if dtype == "float64":  # beyond the trained depth too: the authors' n_recur=6 call (6 iterations)
            expected6 = tensors["golden/f64/logits_n_recur_6"]
            bound6 = rounding(torch_dtype, 256 * 6, max(1.0, float(expected6.abs().max())))
            error6 = float((model(tokens, num_iterations=6).logits - expected6).abs().max())
            assert error6 <= bound6, f"n_recur=6: max |Δlogits| = {error6:.3e} > {bound6:.3e}"
    assert error <= bound, f"{dtype}: max |Δlogits| = {error:.3e} > {bound:.3e} (scale {scale:.3g})"


def test_a_mim_file_of_the_wrong_structure_fails_before_writing(tmp_path, capsys):
    """The MIM file's published name holding the Sudoku model's tensors (same layout, another structure): the
    shipped config's key check names the first offending key and nothing is written."""
    from energyformers.training.convert.released import SUDOKU

    checkpoint = tmp_path / MIM_FILE
    torch.save(mim_payload(random_official_state("hyperset-sudoku", SUDOKU.kwargs)), checkpoint)
    before = written(tmp_path)
    assert run(checkpoint, "--output_dir", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "key 'tok_emb.weight' has shape [10, 768], but the official config gives [1025, 768]" in err, err
    assert written(tmp_path) == before
    # a width that contradicts the shipped config (d 64 instead of 768) fails the same way
    tiny = {**SOURCES["hyperset-mim"].normalise_kwargs(dict(_TINY_MIM))}
    torch.save(mim_payload(random_official_state("hyperset-mim", tiny)), checkpoint)
    assert run(checkpoint, "--output_dir", tmp_path / "out") == 2
    assert "but the official config gives" in capsys.readouterr().err
    assert written(tmp_path) == before


_TINY_MIM = {
    "model": "hyper-set",
    "img_size": 64,
    "codebook_size": 16,
    "n_embd": 64,
    "n_recur": 2,
    "head": 4,
    "multiplier": 2,
    "adaptive_mode": "gd_with_learnable_step_size",
}


# ------------------------------------------------------------------------- the ImageNet structure at tiny size

# The released ImageNet structure shrunk: 12 → 2 distinct layers × 1 iteration, d 768 → 16, and, as there, a grid
# that is not the patch size: `patch` = 4 patches per side of 3 pixels each at 12² (there 16 of 14 px at 224²).
TINY_IC = {
    "num_classes": 7,
    "img_size": 12,
    "patch": 4,
    "n_layer": 2,
    "n_recur": 1,
    "n_embd": 16,
    "head": 4,
    "mlp_hidden": 16,
    "time_embed": 16,
}


def reference_ic_logits(p: dict[str, torch.Tensor], images: torch.Tensor, kw: dict) -> torch.Tensor:
    """The official HyperSET forward, written from the computation order of `hyperset_ic_m32.json` (float64)."""
    d, heads, grid = kw["n_embd"], kw["head"], kw["patch"]
    ps, dh, batch = kw["img_size"] // grid, kw["n_embd"] // kw["head"], images.shape[0]
    # _to_words: token r*grid + c, feature (dy*ps + dx)*3 + channel
    words = torch.empty(batch, grid * grid, ps * ps * 3, dtype=images.dtype)
    for r in range(grid):
        for c in range(grid):
            for dy in range(ps):
                for dx in range(ps):
                    for ch in range(3):
                        words[:, r * grid + c, (dy * ps + dx) * 3 + ch] = images[
                            :, ch, r * ps + dy, c * ps + dx
                        ]

    def ln(x, name):
        return F.layer_norm(x, (x.shape[-1],), p[name + ".weight"], p[name + ".bias"], eps=1e-5)

    def rms(x, gain):  # nn.RMSNorm(eps=None): machine epsilon of the dtype
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps) * gain

    emb = ln(ln(words, "emb.0") @ p["emb.1.weight"].T + p["emb.1.bias"], "emb.2")
    x0 = torch.cat([p["cls_token"].expand(batch, 1, d), emb], dim=1)
    n = x0.shape[1]
    pos = torch.zeros(n, d, dtype=torch.float64)  # interleaved sin/cos, float64 rounded to float32
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * -(math.log(10000.0) / d))
    pos[:, 0::2] = torch.sin(torch.arange(n, dtype=torch.float64)[:, None] * div)
    pos[:, 1::2] = torch.cos(torch.arange(n, dtype=torch.float64)[:, None] * div)
    x0 = x0 + pos.float().double()
    half = kw["time_embed"] // 2  # SinusoidalPosEmb: [sin | cos] concatenated
    freqs = torch.exp(-torch.arange(half, dtype=torch.float64) * math.log(10000) / (half - 1))
    angles = torch.arange(1, kw["n_recur"] + 1, dtype=torch.float64)[:, None] * freqs
    t = torch.cat([angles.sin(), angles.cos()], -1) @ p["time_mlp.0.1.weight"].T + p["time_mlp.0.1.bias"]
    t = rms(F.gelu(rms(t, p["time_mlp.0.2.weight"])), p["time_mlp.0.4.weight"])
    time_emb = rms(t @ p["time_mlp.0.5.weight"].T + p["time_mlp.0.5.bias"], p["time_mlp.0.6.weight"])
    x = x0
    for layer in range(kw["n_layer"]):
        b = f"enc.{layer}."
        for step in range(kw["n_recur"]):  # the time index restarts for every layer
            s = F.gelu(time_emb[step] + rms(x, p["ln_inp.weight"])) @ p["time_mlp.1.1.weight"].T
            s = s + p["time_mlp.1.1.bias"]
            alpha, beta = s[..., :d], s[..., d:]
            W = p[b + "attn.qkv.weight"]
            w = x @ W.T
            y = torch.empty_like(x)
            for h in range(heads):
                wh = w[..., h * dh : (h + 1) * dh]
                q, k, v = (rms(wh, p[f"{b}attn.ln1_{role}.weight"]) for role in (1, 2, 3))
                a = q @ k.transpose(-1, -2) / math.sqrt(dh)
                y[..., h * dh : (h + 1) * dh] = (a.softmax(-1) + a.softmax(-2)) @ v
            x = x - alpha * (y @ W)
            D = p[b + "mlp.weight"]
            x = x + beta * (F.gelu(rms(x @ D.T, p[b + "ln2.weight"])) @ D)
    return ln(x[:, 0], "fc.0") @ p["fc.1.weight"].T + p["fc.1.bias"]


def test_imagenet_structure_at_tiny_size_matches_an_independent_reference(tmp_path, capsys):
    """Distinct layers × 1 iteration with grid ≠ patch size, as a Lightning `.ckpt`: the converted float64 folder
    gives the logits of a reference written here from the fixtures' computation order."""
    state = random_official_state("hyperset-ic", TINY_IC, seed=1)
    checkpoint, config = tmp_path / "tiny.ckpt", tmp_path / "tiny.json"
    torch.save(lightning(state), checkpoint)
    config.write_text(json.dumps(TINY_IC))
    out = tmp_path / "out"
    args = ("--source", "hyperset-ic", checkpoint, "--official-config", config, "--output_dir", out)
    assert run(*args, "--dtype", "float64") == 0, capsys.readouterr().err
    model = AutoModelForImageClassification.from_pretrained(out, dtype=torch.float64).eval()
    assert (model.config.patch_size, model.config.num_hidden_layers, model.config.num_iterations) == (3, 2, 1)
    images = torch.randn(3, 3, 12, 12, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        output = model(images, output_hidden_states=True)
    assert len(output.hidden_states) == 1 + 2 * 1  # embeddings, then one state per layer × iteration
    assert output.hidden_states[0].shape == (3, 1 + 4 * 4, 16)  # CLS + the 4 × 4 grid
    expected = reference_ic_logits({k: v.double() for k, v in state.items()}, images, TINY_IC)
    error = float((output.logits - expected).abs().max())
    # the same float64 computation in another order: sums of at most 27 terms (3 × 3 × 3 patch features; 17
    # tokens, width 16), rounded to 32, through 2 layers, in ulps of the logits' scale
    scale = max(1.0, float(expected.abs().max()))
    bound = rounding(torch.float64, 32 * 2, scale)
    assert error <= bound, f"max |Δlogits| = {error:.3e} > {bound:.3e} (logits up to {scale:.2f})"
    # reading `patch` as the patch size in pixels instead of the grid would give 4 × 4 × 3 = 48 features per patch
    swapped = tmp_path / "swapped.json"
    swapped.write_text(json.dumps({**TINY_IC, "patch": 3}))
    assert (
        run(
            "--source",
            "hyperset-ic",
            checkpoint,
            "--official-config",
            swapped,
            "--output_dir",
            tmp_path / "x",
        )
        == 2
    )
    assert "'emb.0.weight' has shape [27], but the official config gives [48]" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------- layouts, read without unpickling code


@needs_author_fixtures
@pytest.mark.parametrize("layout", ["lightning", "lightning-ddp", "model_state_dict"])
def test_authors_ic_fixture_in_the_released_layouts_verifies_without_trust(layout, tmp_path, capsys):
    """The authors' `hyperset_ic_m32` tensors saved as their trainers save them (Lightning `.ckpt` with `model.`
    and DDP `module.` prefixes, optimizer and loop state and a Namespace; a `model_state_dict` dict with optimizer
    state), read without --trust-pickle and verified against the authors' own float64 logits."""
    fixture = AUTHOR_FIXTURES / "hyperset_ic_m32.safetensors"
    state = {key: value for key, value in load_file(str(fixture)).items() if "/" not in key}
    if layout == "model_state_dict":
        payload = {
            "model_state_dict": {"module." + key: value for key, value in state.items()},
            "optimizer_state_dict": {"state": {}, "param_groups": [{"lr": 1e-3, "params": []}]},
            "epoch": 199,
            "config": argparse.Namespace(task="ic"),
        }
        checkpoint = tmp_path / "IC_tiny.pth"
    else:
        payload = lightning(state, prefix="module.model." if layout == "lightning-ddp" else "model.")
        checkpoint = tmp_path / "IC_tiny.ckpt"
    torch.save(payload, checkpoint)
    out = tmp_path / "out"
    args = (
        "--source",
        "hyperset-ic",
        checkpoint,
        "--official-config",
        AUTHOR_FIXTURES / "hyperset_ic_m32.json",
    )
    assert run(*args, "--reference", fixture, "--dtype", "float64", "--output_dir", out) == 0, (
        capsys.readouterr().err
    )
    log = capsys.readouterr().out
    match = re.search(r"reference outputs `golden/f64/logits`.*?= ([0-9.e+-]+)", log)
    # float64 rounding of the fixture (width 32, 3 iterations) as in tests/test_convert.py, of the logits' scale
    scale = max(1.0, float(load_file(str(fixture))["golden/f64/logits"].abs().max()))
    bound = rounding(torch.float64, 32 * 3, scale)
    assert match and float(match.group(1)) <= bound, f"reported error above {bound:.3e}:\n{log}"


class RunsCode:
    """Unpickling this object calls exec (what a malicious checkpoint would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def test_objects_outside_the_weights_run_no_code(tmp_path, capsys):
    """A Lightning file whose extra objects would run code when unpickled: without --trust-pickle they are inert
    placeholders, the weights convert, and the code never runs."""
    state = random_official_state("hyperset-ic", TINY_IC)
    marker = tmp_path / "code-ran"
    payload = lightning(state)
    payload["callbacks"] = {"ModelCheckpoint": RunsCode(marker)}
    checkpoint, config = tmp_path / "evil.ckpt", tmp_path / "tiny.json"
    torch.save(payload, checkpoint)
    config.write_text(json.dumps(TINY_IC))
    out = tmp_path / "out"
    assert run("--source", "hyperset-ic", checkpoint, "--official-config", config, "--output_dir", out) == 0
    assert not marker.exists()
    assert "builtins.exec" in capsys.readouterr().out


def test_objects_that_cannot_be_replaced_need_trust_pickle(tmp_path, capsys):
    """A dict subclass (here a defaultdict) is filled item by item, which the weights-only reader allows only for
    real dicts: refused with --trust-pickle named, nothing written; with the flag it converts."""
    state = random_official_state("hyperset-ic", TINY_IC)
    payload = lightning(state)
    payload["hyper_parameters"] = collections.defaultdict(list, {"lr": [1e-4]})
    checkpoint, config = tmp_path / "run.ckpt", tmp_path / "tiny.json"
    torch.save(payload, checkpoint)
    config.write_text(json.dumps(TINY_IC))
    args = (
        "--source",
        "hyperset-ic",
        checkpoint,
        "--official-config",
        config,
        "--output_dir",
        tmp_path / "out",
    )
    assert run(*args) == 2
    err = capsys.readouterr().err
    assert "collections.defaultdict" in err and "--trust-pickle" in err, err
    assert not (tmp_path / "out").exists()
    assert run(*args, "--trust-pickle") == 0


def test_a_weight_that_is_not_a_tensor_is_refused(tmp_path, capsys):
    state = random_official_state("hyperset-ic", TINY_IC)
    payload = lightning(state)
    payload["state_dict"]["model.cls_token"] = argparse.Namespace(data=[0.0])
    checkpoint, config = tmp_path / "odd.ckpt", tmp_path / "tiny.json"
    torch.save(payload, checkpoint)
    config.write_text(json.dumps(TINY_IC))
    args = (
        "--source",
        "hyperset-ic",
        checkpoint,
        "--official-config",
        config,
        "--output_dir",
        tmp_path / "out",
    )
    assert run(*args) == 2
    assert "weight 'model.cls_token' is an object of argparse.Namespace" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------- refusals, before anything is written


def test_a_released_name_holding_another_model_fails_before_writing(tmp_path, capsys):
    """The Sudoku file's name with the state_dict of an image model inside: the shipped config's key check fails."""
    checkpoint = tmp_path / SUDOKU_FILE
    torch.save(random_official_state("hyperset-ic", TINY_IC), checkpoint)
    before = written(tmp_path)
    assert run(checkpoint, "--output_dir", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "unexpected key 'cls_token'" in err and "43 more" in err, err
    assert written(tmp_path) == before


def test_a_source_contradicting_the_released_file_is_refused(tmp_path, capsys):
    checkpoint = tmp_path / SUDOKU_FILE
    torch.save({"x": torch.zeros(1)}, checkpoint)
    assert run("--source", "hyperset-ic", checkpoint, "--output_dir", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "--source hyperset-ic" in err and "--source hyperset-sudoku" in err, err
    assert not (tmp_path / "out").exists()
    other = tmp_path / "renamed.pth"  # not a published name: --source and --official-config are needed
    torch.save({"x": torch.zeros(1)}, other)
    assert run(other, "--output_dir", tmp_path / "out") == 2
    assert "--source and --official-config" in capsys.readouterr().err


# ------------------------------------------------------------------------- docs


def test_docs_give_the_hub_repo_and_a_command_per_released_file():
    """docs/conversion.md: the download and convert commands name each released file exactly as published, and the
    convert commands parse, and the Python download with `hf_hub_download` names each of them."""
    from energyformers.training.convert.released import HUB_REPO, RELEASED
    from energyformers.training.convert_cli import build_parser

    text = (Path(__file__).resolve().parents[1] / "docs" / "conversion.md").read_text()
    commands = [line for line in text.splitlines() if line.startswith("energyformers convert ")]
    for released in RELEASED:
        assert f"hf download {HUB_REPO} {released.path}" in text, released.path
        mine = [line for line in commands if released.filename in line]
        assert mine, f"no convert command for {released.filename}"
        args = build_parser().parse_args(shlex.split(mine[0])[2:])
        assert Path(args.checkpoint).name == released.filename
        assert args.official_config is None and args.source in (None, released.source)
        call = f'hf_hub_download(repo_id="{HUB_REPO}",filename="{released.path}")'
        assert call in re.sub(r"\s+", "", text), released.path  # however the formatter wraps the call
    assert "not available" not in text
