"""`VQGANTokenizer.from_taming`: a taming-transformers VQGAN checkpoint (MaskGIT's format) against the outputs of
taming's own code (`tests/data/taming_vqgan/`, see its README for how they were produced)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

pytest.importorskip("diffusers")

from energyformers.mim import VQGANTokenizer, load_vq_tokenizer

FIXTURE = Path(__file__).parent / "data" / "taming_vqgan"
CONFIG = FIXTURE / "model.yaml"
# float32 rounding accumulates through some twenty convolution, GroupNorm and attention layers; 64 epsilons of the
# output's magnitude leaves a few times the error measured on CPU (about 20 epsilons for the decoded pixels).
RTOL = 64 * torch.finfo(torch.float32).eps


def _fixture_weights():
    spec = importlib.util.spec_from_file_location("fixture_weights", FIXTURE / "fixture_weights.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fixture_tensor


REFERENCE = json.loads((FIXTURE / "reference.json").read_text())
OUTPUTS = load_file(str(FIXTURE / "reference.safetensors"))


def taming_state() -> dict[str, torch.Tensor]:
    """The state_dict taming's VQModel held when the reference was written (its `loss.*` entries included)."""
    fixture_tensor = _fixture_weights()
    return {
        key: fixture_tensor(key, shape, REFERENCE["codebook_scale"])
        for key, shape in REFERENCE["state_dict"].items()
    }


def write_lightning_checkpoint(path: Path, state: dict[str, torch.Tensor]) -> Path:
    """A Lightning-style `.ckpt` as taming's training writes it: the state_dict beside optimizer and loop state
    and a non-tensor Python object (read as an inert placeholder, never unpickled)."""
    parameter_ids = list(range(3))
    torch.save(
        {
            "epoch": 0,
            "global_step": 0,
            "pytorch-lightning_version": "1.0.8",
            "state_dict": state,
            "optimizer_states": [
                {
                    "state": {
                        i: {"exp_avg": torch.full((2,), 0.5), "step": torch.tensor(1.0)}
                        for i in parameter_ids
                    },
                    "param_groups": [{"lr": 4.5e-6, "betas": (0.5, 0.9), "params": parameter_ids}],
                }
            ],
            "lr_schedulers": [],
            "hparams": argparse.Namespace(base_learning_rate=4.5e-6),
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_lightning_checkpoint(tmp_path_factory.mktemp("taming") / "last.ckpt", taming_state())


@pytest.fixture(scope="module")
def tokenizer(checkpoint) -> VQGANTokenizer:
    return VQGANTokenizer.from_taming(checkpoint, CONFIG)


def pixels() -> torch.Tensor:
    return OUTPUTS["pixels"].float() / 255


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    scale = max(1.0, float(expected.abs().max()))
    error = float((actual - expected).abs().max())
    assert error <= RTOL * scale, f"{what}: max |ours − taming| = {error:.3g} > {RTOL:.3g} × {scale:.3g}"


def test_codes_latents_and_pixels_match_taming(tokenizer):
    assert tokenizer.codebook_size == 16 and tokenizer.downsampling == 4, tokenizer.model.config
    codes = tokenizer.encode(pixels())
    expected = OUTPUTS["codes"]
    assert torch.equal(codes, expected), (
        f"codes differ at {int((codes != expected).sum())} of {codes.numel()}"
    )
    with torch.no_grad():
        latents = tokenizer.model.encode(pixels() * 2 - 1).latents
    assert_close(latents, OUTPUTS["latents"], "encoder latents (after quant_conv)")
    side = latents.shape[-1]
    quantized = tokenizer.model.quantize.embedding.weight[expected].view(len(codes), side, side, -1)
    with torch.no_grad():
        raw = tokenizer.model.decode(quantized.permute(0, 3, 1, 2), force_not_quantize=True).sample
    assert_close(raw, OUTPUTS["decoded"], "decoded pixels in the model's range")
    # the tokenizer's own decode: back to [0, 1] from MaskGIT's [−1, 1], clamped
    assert_close(tokenizer.decode(codes), ((OUTPUTS["decoded"] + 1) / 2).clamp(0, 1), "decode()")


def test_the_diffusers_structure_follows_the_config(tokenizer):
    config = tokenizer.model.config
    assert list(config.down_block_types) == [
        "DownEncoderBlock2D",
        "DownEncoderBlock2D",
        "AttnDownEncoderBlock2D",
    ]
    assert list(config.up_block_types) == ["AttnUpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"]
    assert list(config.block_out_channels) == [32, 32, 64] and config.layers_per_block == 2, config
    assert (config.latent_channels, config.vq_embed_dim, config.num_vq_embeddings) == (8, 6, 16), config


def test_saved_and_reloaded_tokenizer_gives_identical_codes_and_pixels(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    reloaded = load_vq_tokenizer(tmp_path)
    assert isinstance(reloaded, VQGANTokenizer) and reloaded.pixel_range == (-1.0, 1.0)
    assert torch.equal(reloaded.encode(pixels()), OUTPUTS["codes"])
    assert torch.equal(reloaded.decode(OUTPUTS["codes"]), tokenizer.decode(OUTPUTS["codes"]))


def _drop(state, key):
    state.pop(key)


def _extra(state, key):
    state[key] = torch.ones(3)


def _reshape(state, key):
    state[key] = state[key][:-1]


@pytest.mark.parametrize(
    ("edit", "key", "problem"),
    [
        (_drop, "decoder.up.1.block.0.nin_shortcut.weight", "missing key"),
        (_drop, "quantize.embedding.weight", "missing key"),
        (
            _extra,
            "encoder.down.1.attn.0.q.weight",
            "unexpected key",
        ),  # level 1 has no attention in this config
        (_extra, "model_ema.decay", "unexpected key"),
        (_reshape, "encoder.mid.attn_1.proj_out.weight", "has shape"),
        (_reshape, "decoder.up.2.block.1.conv2.bias", "has shape"),
    ],
)
def test_a_wrong_checkpoint_fails_naming_the_file_and_key(tmp_path, edit, key, problem):
    state = taming_state()
    edit(state, key)
    path = write_lightning_checkpoint(tmp_path / "bad.ckpt", state)
    with pytest.raises(ValueError, match=problem) as caught:
        VQGANTokenizer.from_taming(path, CONFIG)
    message = str(caught.value)
    assert str(path) in message and repr(key) in message, message
    assert [p.name for p in tmp_path.iterdir()] == ["bad.ckpt"], "nothing is written on failure"


def test_a_checkpoint_of_another_config_fails_on_the_shapes(checkpoint, tmp_path):
    data = yaml.safe_load(CONFIG.read_text())
    data["model"]["params"]["n_embed"] = 32
    config = tmp_path / "model.yaml"
    config.write_text(yaml.safe_dump(data))
    with pytest.raises(
        ValueError, match=r"'quantize.embedding.weight' has shape \(16, 6\); the config gives \(32, 6\)"
    ):
        VQGANTokenizer.from_taming(checkpoint, config)


@pytest.mark.parametrize(
    ("section", "key", "value", "problem"),
    [
        ("ddconfig", "double_z", True, r"ddconfig.double_z=True; only False"),
        ("ddconfig", "ch_mult", [2, 2], r"ch_mult=\[2, 2\]; diffusers' VQModel needs it to start at 1"),
        ("ddconfig", "ch", 48, r"widths \[48, 48, 96\]"),
        ("ddconfig", "use_checkpoint", True, r"has unknown \['use_checkpoint'\]"),
        ("params", "remap", "used.npy", r"remap='used.npy'"),
        ("params", "n_embed", None, r"no 'n_embed'"),
        ("model", "target", "taming.models.vqgan.GumbelVQ", r"target='taming.models.vqgan.GumbelVQ'"),
    ],
)
def test_a_config_the_diffusers_structure_cannot_hold_is_refused(
    checkpoint, tmp_path, section, key, value, problem
):
    data = yaml.safe_load(CONFIG.read_text())
    where = {
        "model": data["model"],
        "params": data["model"]["params"],
        "ddconfig": data["model"]["params"]["ddconfig"],
    }
    if value is None:
        where[section].pop(key)
    else:
        where[section][key] = value
    config = tmp_path / "model.yaml"
    config.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=problem) as caught:
        VQGANTokenizer.from_taming(checkpoint, config)
    assert str(config) in str(caught.value), caught.value


def test_missing_files_are_named(checkpoint, tmp_path):
    with pytest.raises(ValueError, match=r"checkpoint .*nothing.ckpt does not exist"):
        VQGANTokenizer.from_taming(tmp_path / "nothing.ckpt", CONFIG)
    with pytest.raises(ValueError, match=r"config .*nothing.yaml does not exist"):
        VQGANTokenizer.from_taming(checkpoint, tmp_path / "nothing.yaml")
