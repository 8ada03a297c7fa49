"""Writes this folder's reference outputs by running taming-transformers' own VQGAN code.

    python tests/data/taming_vqgan/generate.py --taming /path/to/taming-transformers --commit <its commit>

`--taming` is a checkout holding the `taming/` package; its modules are imported from there (nothing of it is
copied here). Two imports of `taming/models/vqgan.py` are not needed to run a VQGAN forward and are stood in for:
`pytorch_lightning` (its `LightningModule` base becomes `torch.nn.Module`; the forward code does not touch it) and
`main.instantiate_from_config` (the LPIPS/discriminator loss, which needs downloaded VGG weights, becomes a small
module with a few parameters under `loss.`, so that the checkpoint carries training-only tensors as a real one
does). It needs `einops` and `PyYAML` importable.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import types
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image
from safetensors.torch import save_file
from sklearn.datasets import load_sample_image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fixture_weights import fixture_tensor  # noqa: E402

# Chosen so that the codebook vectors spread like the encoder's latents (std ≈ 0.25 here; 0.4 × U(−1, 1) has std 0.23): the codes then vary.
CODEBOOK_SCALE = 0.4
# (image, top, left, side): crops of scikit-learn's two sample photographs, resized to the model's resolution.
CROPS = [("china.jpg", 40, 120, 256), ("china.jpg", 180, 300, 200), ("flower.jpg", 60, 180, 300)]


def stand_in_imports() -> None:
    lightning = types.ModuleType("pytorch_lightning")
    lightning.LightningModule = torch.nn.Module
    sys.modules["pytorch_lightning"] = lightning

    def instantiate_from_config(config: dict) -> torch.nn.Module:
        loss = torch.nn.Module()
        loss.discriminator = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 4, 2, 1), torch.nn.LeakyReLU(0.2), torch.nn.Conv2d(4, 1, 4, 1, 1)
        )
        loss.logvar = torch.nn.Parameter(torch.zeros(()))
        return loss

    main = types.ModuleType("main")
    main.instantiate_from_config = instantiate_from_config
    sys.modules["main"] = main


def images(resolution: int) -> torch.Tensor:
    out = []
    for name, top, left, side in CROPS:
        crop = Image.fromarray(load_sample_image(name)[top : top + side, left : left + side])
        out.append(np.asarray(crop.resize((resolution, resolution), Image.Resampling.BOX)))
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).contiguous()  # uint8 (B, 3, H, W)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--taming", required=True, help="taming-transformers checkout (holds taming/)")
    parser.add_argument("--commit", required=True, help="the checkout's commit, recorded in reference.json")
    parser.add_argument("--output", default=str(HERE))
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.taming).resolve()))
    stand_in_imports()
    from taming.models.vqgan import VQModel

    params = yaml.safe_load((HERE / "model.yaml").read_text())["model"]["params"]
    torch.manual_seed(0)  # only taming's own initialisation draws from it; every tensor is overwritten below
    model = VQModel(**params).eval()
    shapes = {key: list(value.shape) for key, value in model.state_dict().items()}
    model.load_state_dict({k: fixture_tensor(k, s, CODEBOOK_SCALE) for k, s in shapes.items()}, strict=True)

    pixels = images(params["ddconfig"]["resolution"])
    x = pixels.float() / 255 * 2 - 1  # MaskGIT feeds the VQGAN images in [−1, 1]
    with torch.no_grad():
        latents = model.quant_conv(model.encoder(x))
        _, _, (_, _, indices) = model.quantize(latents)
        batch, channels, side, _ = latents.shape
        codes = indices.reshape(batch, side * side)
        quant = model.quantize.get_codebook_entry(indices.reshape(-1), (batch, side, side, channels))
        decoded = model.decode(quant)
        # how far each latent is from a tie between its two nearest codebook vectors (squared distances)
        flat = latents.permute(0, 2, 3, 1).reshape(-1, channels).double()
        dist = torch.cdist(flat, model.quantize.embedding.weight.double()) ** 2
        two = dist.topk(2, largest=False).values
        margin = float((two[:, 1] - two[:, 0]).min())

    out = Path(args.output)
    save_file(
        {"pixels": pixels, "latents": latents, "codes": codes, "decoded": decoded.contiguous()},
        str(out / "reference.safetensors"),
    )
    record = {
        "source": {"repository": "https://github.com/CompVis/taming-transformers", "commit": args.commit},
        "classes": [
            "taming.models.vqgan.VQModel",
            "taming.modules.diffusionmodules.model.Encoder/Decoder",
            "taming.modules.vqvae.quantize.VectorQuantizer2",
        ],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "codebook_scale": CODEBOOK_SCALE,
        "crops": [list(crop) for crop in CROPS],
        "pixels": "uint8 (B, 3, H, W); the model input is pixels / 255 * 2 - 1",
        "decoded": "the decoder's raw output in the model's [-1, 1] range, not clamped",
        "distinct_codes": int(codes.unique().numel()),
        "min_squared_distance_margin": margin,
        "latent_std": float(latents.std()),
        "state_dict": shapes,
    }
    (out / "reference.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "state_dict"}, indent=1))


if __name__ == "__main__":
    main()
