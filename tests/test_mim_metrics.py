# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""LPIPS and FID of masked-image-modelling reconstructions (`energyformers.mim.PerceptualMetrics`): computed by
torchmetrics from local weight files only, never downloaded.

The weight files are made here with seeded random values in the formats users hold: an FID detector with the
`net(images, return_features=True)` convention saved as TorchScript and with torch.export, torch-fidelity's Inception state dict from its own module
class, and torchvision's AlexNet state dict under torchvision's file name. The real networks' weights are not on
this machine, so the numbers test the code path (loading, preprocessing, torchmetrics' formulas), not calibrated
LPIPS/FID values. Where torchvision cannot import beside this torch (PyPI's CUDA build of torchvision beside a CPU
torch), the LPIPS and state-dict FID tests are replaced by the checks that those options are refused clearly.
"""

from __future__ import annotations

import re
import socket

import pytest
import torch
from fixtures import digit_images

from energyformers import mim
from energyformers.mim import PerceptualMetrics, check_perceptual_weights, reconstruction_metrics

# The stand-in detector is a TorchScript file, the format the FID metric reads; torch deprecates TorchScript
# (a FutureWarning from 2.15 on), which is torch's advice to the file's author, not a finding of these tests
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.(load|script|save)` is deprecated")

TORCHVISION_PROBLEM = mim._torchvision_problem()
try:
    import torch_fidelity  # noqa: F401

    TORCH_FIDELITY = True
except Exception:  # not installed, or installed beside a torchvision that does not import
    TORCH_FIDELITY = False


class TinyDetector(torch.nn.Module):
    """A stand-in FID detector with the TorchScript detectors' calling convention: `(B, 3, H, W)` floats in
    [0, 255], resized inside, `return_features=True` → `(B, 16)` pool features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, images: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        x = torch.nn.functional.interpolate(images, size=(32, 32), mode="bilinear", align_corners=False)
        x = (x - 128) / 128
        # tanh, not ReLU, on the last layer: no feature is constant, so the covariance has full rank
        x = torch.tanh(self.conv2(torch.relu(self.conv1(x))))
        features = x.mean(dim=(2, 3))
        if return_features:
            return features
        return self.fc(features)


@pytest.fixture(autouse=True)
def fresh_cache():
    """Each test loads its own files: the per-process cache must not hand one test's networks to another."""
    mim._perceptual_cache.clear()
    yield
    mim._perceptual_cache.clear()


def export_detector(
    path, dynamic=("batch", "height", "width"), network=TinyDetector, device="cpu", **call
) -> None:
    """The seeded stand-in detector (`network`: TinyDetector or a subclass) saved with torch.export from `device`:
    `call` the keyword arguments it is exported with (`return_features=True`, the TorchScript convention);
    `dynamic` the input sizes left free."""
    torch.manual_seed(0)
    axes = {0: "batch", 2: "height", 3: "width"}
    shapes = {"images": {axis: torch.export.Dim(name) for axis, name in axes.items() if name in dynamic}}
    shapes.update(dict.fromkeys(call))
    example = torch.rand(4, 3, 28, 28, generator=torch.Generator().manual_seed(0)) * 255
    net = network().eval().to(device)
    program = torch.export.export(net, (example.to(device),), call, dynamic_shapes=shapes)
    torch.export.save(program, str(path))


@pytest.fixture(params=["torchscript", "export"])
def detector_file(tmp_path, request):
    """The stand-in detector, seeded alike, in each format the FID metric reads."""
    if request.param == "export":
        path = tmp_path / "inception-2015-12-05.pt2"
        export_detector(path, return_features=True)
        return path
    torch.manual_seed(0)
    path = tmp_path / "inception-2015-12-05.pt"
    torch.jit.script(TinyDetector().eval()).save(str(path))
    return path


def images(n: int = 24, channels: int = 1, side: int = 28, seed: int = 0) -> torch.Tensor:
    """Smooth random images in [0, 1] (gray like the offline tokenizer's datasets unless `channels` is 3)."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, channels, side // 4, side // 4, generator=g)
    return torch.nn.functional.interpolate(coarse, size=(side, side), mode="bilinear", align_corners=False)


def detector_features(path, x: torch.Tensor) -> torch.Tensor:
    net = torch.export.load(str(path)).module() if path.suffix == ".pt2" else torch.jit.load(str(path))
    pixels = (x.expand(-1, 3, -1, -1) * 255).round()
    with torch.no_grad():
        return net(pixels, return_features=True).double()


def test_fid_of_a_detector_is_zero_for_the_same_set_and_grows_with_a_shift(detector_file):
    x = images()
    same = reconstruction_metrics(x, x, fid_weights=detector_file)
    shifted = reconstruction_metrics((x + 0.3).clamp(0, 1), x, fid_weights=detector_file)
    # FID(x, x) = 2 tr(S) - 2 tr(sqrt(S S)) with S the features' covariance computed twice identically in float64:
    # 24 images, 16 features, so S has full rank and the eigenvalue square roots agree to a few hundred float64
    # eps relative to tr(S); 1e-9 tr(S) leaves orders of magnitude of room and is far below any real distance.
    feats = detector_features(detector_file, x)
    tolerance = 1e-9 * torch.cov(feats.T).trace().item()
    assert abs(same["fid"]) <= tolerance, f"FID(x, x) = {same['fid']:.3e}, tolerance {tolerance:.3e}"
    assert shifted["fid"] > 1e3 * tolerance, (
        f"FID(x + 0.3, x) = {shifted['fid']:.3e} vs tolerance {tolerance:.3e}"
    )
    # the PSNR/SSIM of the same call are unchanged by the option
    assert same["psnr"] == reconstruction_metrics(x, x)["psnr"]


def test_a_torchscript_detector_loads_without_torchs_deprecation_warning(detector_file):
    # torch deprecates TorchScript (a FutureWarning, shown to every user, from torch 2.15): the user picked the file
    # format the metric reads and cannot act on it, so loading the detector must not repeat it on every run
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reconstruction_metrics(images(n=4), images(n=4, seed=1), fid_weights=detector_file)
    shown = [str(w.message) for w in caught if "torch.jit.load" in str(w.message)]
    assert not shown, f"warnings about torch.jit.load: {shown}"


def test_fid_matches_the_frechet_distance_of_the_detector_features(detector_file):
    x, y = images(seed=0), images(seed=1)
    fx, fy = detector_features(detector_file, x), detector_features(detector_file, y)
    # the Fréchet distance of the two feature Gaussians written out, with scipy's matrix square root
    import scipy.linalg

    mx, my, sx, sy = fx.mean(0), fy.mean(0), torch.cov(fx.T), torch.cov(fy.T)
    root = scipy.linalg.sqrtm((sx @ sy).numpy()).real
    expected = float((mx - my).square().sum() + sx.trace() + sy.trace() - 2 * root.trace())
    got = reconstruction_metrics(y, x, fid_weights=detector_file)["fid"]
    # float32 features, float64 statistics; two square-root algorithms (eigenvalues vs Schur): 1e-6 relative
    assert got == pytest.approx(expected, rel=1e-6), f"FID {got!r} vs the written-out distance {expected!r}"


def test_fid_is_the_same_from_either_detector_format(tmp_path):
    # one network, seeded alike, saved both ways: the same features, so the same FID; the exported graph runs
    # the same float32 ops as the TorchScript one, and the float64 statistics agree to float32 rounding of
    # features of size ~1 (1e-6 relative to the distance leaves a margin of orders of magnitude)
    torch.manual_seed(0)
    scripted = tmp_path / "inception-2015-12-05.pt"
    torch.jit.script(TinyDetector().eval()).save(str(scripted))
    exported, features_only = tmp_path / "inception.pt2", tmp_path / "features-only.pt2"
    export_detector(exported, return_features=True)

    class Features(TinyDetector):  # a program that returns Inception's 2048 pool features with no flag
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            # the 16 features and zeros: the same means and covariance, padded, so the same Fréchet distance
            features = super().forward(images, return_features=True)
            return torch.nn.functional.pad(features, (0, 2048 - features.shape[1]))

    torch.manual_seed(0)
    features = Features().eval()  # seeded as export_detector's network
    example = torch.rand(4, 3, 28, 28) * 255
    batch = {"images": {0: torch.export.Dim("batch"), 2: torch.export.Dim("h"), 3: torch.export.Dim("w")}}
    torch.export.save(torch.export.export(features, (example,), dynamic_shapes=batch), features_only)
    x, y = images(seed=0), images(seed=1)
    fids = {
        path.name: reconstruction_metrics(y, x, fid_weights=path)["fid"] for path in (exported, features_only)
    }
    expected = reconstruction_metrics(y, x, fid_weights=scripted)["fid"]
    assert expected > 0 and all(f == pytest.approx(expected, rel=1e-6) for f in fids.values()), (
        fids,
        expected,
    )


def test_a_file_of_no_detector_format_is_refused_naming_the_argument_and_the_formats(tmp_path):
    import zipfile

    text, archive = tmp_path / "inception.pt", tmp_path / "inception.zip"
    text.write_text("not a network")
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("inception/readme.txt", "not a network either")
    for path in (text, archive):
        with pytest.raises(ValueError) as err:
            PerceptualMetrics(fid_weights=path)
        message = str(err.value)
        assert message.startswith(f"fid_weights={str(path)!r}: not an FID detector file"), message
        assert all(f in message for f in ("TorchScript", "torch.export.save", "torch-fidelity")), message


@pytest.mark.parametrize(
    "export, problem",
    [
        ({"dynamic": ("height", "width"), "return_features": True}, "of any batch size"),
        ({"return_features": False}, "exported with {'return_features': False}"),
        # the plain `torch.export.export(net, (images,))`: no flag recorded, so the program returns the logits
        ({}, "the 2048 pool features per image; this program, exported without return_features, returns 10"),
    ],
    ids=["fixed-batch", "logits", "logits-without-the-flag"],
)
def test_an_exported_detector_of_another_signature_is_refused_before_any_work(tmp_path, export, problem):
    path = tmp_path / "inception.pt2"
    export_detector(path, **export)
    with pytest.raises(ValueError) as err:
        check_perceptual_weights(None, path)
    message = str(err.value)
    assert message.startswith(f"fid_weights={str(path)!r}: an exported FID detector") and problem in message
    assert "dynamic_shapes=" in message, message  # and how to export it


def test_an_exported_detector_of_a_fixed_image_size_takes_that_size_and_names_it_for_another(tmp_path):
    path = tmp_path / "inception.pt2"
    export_detector(path, dynamic=("batch",), return_features=True)
    x = images(side=28)
    assert reconstruction_metrics((x + 0.3).clamp(0, 1), x, fid_weights=path)["fid"] > 0
    with pytest.raises(
        ValueError, match=r"takes 28×28 images only; got 32×32\. Export it with dynamic height"
    ):
        reconstruction_metrics(images(side=32), images(side=32, seed=1), fid_weights=path)


class PoolOutput(TinyDetector):
    """The stand-in returning its pool features as Inception's pool layer does, (B, F, 1, 1), unflattened."""

    def forward(self, images: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        out = super().forward(images, return_features)
        return out[:, :, None, None] if return_features else out


def test_an_exported_detector_may_keep_the_pool_features_spatial_dimensions(tmp_path):
    # (B, 16, 1, 1) holds the same 16 values per image as (B, 16): the same Fréchet distance, from the same float32
    # features and float64 statistics (1e-12 relative: float64 rounding of distances of size ~0.1)
    flat, pooled = tmp_path / "flat.pt2", tmp_path / "pooled.pt2"
    export_detector(flat, return_features=True)
    export_detector(pooled, network=PoolOutput, return_features=True)
    x = images()
    fids = [
        reconstruction_metrics((x + 0.3).clamp(0, 1), x, fid_weights=path)["fid"] for path in (flat, pooled)
    ]
    assert fids[0] > 0 and fids[1] == pytest.approx(fids[0], rel=1e-12), fids


def saved_on(source, target, device: str) -> None:
    """`source` (a torch.export archive saved from the CPU) rewritten as if saved from `device`: every tensor's
    recorded device, which torch.export.load puts it back on."""
    import zipfile

    cpu = b'"device": {"type": "cpu", "index": null}'
    rewritten = []
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w") as out:
        for info in archive.infolist():
            data = archive.read(info.filename)
            if info.filename.endswith(".json") and cpu in data:
                data = data.replace(cpu, f'"device": {{"type": "{device}", "index": 0}}'.encode())
                rewritten.append(info.filename.rsplit("/", 1)[-1])
            out.writestr(info, data)
    # the weights' records (what torch.export.load moves) and the graph's
    assert "model_weights_config.json" in rewritten and "model.json" in rewritten, rewritten


@pytest.mark.skipif(torch.cuda.is_available(), reason="loads here: the GPU test below covers this machine")
def test_a_detector_exported_on_a_gpu_is_refused_on_a_machine_without_one_naming_the_argument(tmp_path):
    exported, moved = tmp_path / "on-cpu.pt2", tmp_path / "inception-on-cuda.pt2"
    export_detector(exported, return_features=True)
    saved_on(exported, moved, "cuda")
    with pytest.raises(ValueError) as err:
        check_perceptual_weights(None, moved)
    message = str(err.value)
    assert message.startswith(
        f"fid_weights={str(moved)!r}: the program was exported with its tensors on cuda"
    ), message
    assert "move_to_device_pass(program, 'cpu')" in message, message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="exports on a GPU")
def test_a_detector_exported_on_the_gpu_runs_on_the_cpu_as_one_exported_there(tmp_path):
    # the same seeded weights, copied to the GPU and back exactly: the same float32 features on the CPU, where the
    # metric gets its images, so the same FID (1e-12 relative: float64 rounding of the statistics)
    on_cpu, on_gpu = tmp_path / "cpu.pt2", tmp_path / "gpu.pt2"
    export_detector(on_cpu, return_features=True)
    export_detector(on_gpu, device="cuda", return_features=True)
    x = images()
    fids = [reconstruction_metrics((x + 0.3).clamp(0, 1), x, fid_weights=p)["fid"] for p in (on_cpu, on_gpu)]
    assert fids[0] > 0 and fids[1] == pytest.approx(fids[0], rel=1e-12), fids


def test_fid_runs_with_the_network_blocked(detector_file, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    x = images()
    metrics = reconstruction_metrics((x + 0.2).clamp(0, 1), x, fid_weights=detector_file)
    assert metrics["fid"] > 0, metrics


def test_fid_needs_two_images(detector_file):
    x = images(n=1)
    with pytest.raises(ValueError, match="at least 2"):
        reconstruction_metrics(x, x, fid_weights=detector_file)


@pytest.mark.parametrize("argument", ["lpips_weights", "fid_weights"])
def test_a_missing_file_is_refused_before_any_work(tmp_path, monkeypatch, argument):
    import torchmetrics.functional.image as image_metrics

    def no_work(*args, **kwargs):
        raise AssertionError("a metric was computed before the weight paths were checked")

    monkeypatch.setattr(image_metrics, "peak_signal_noise_ratio", no_work)
    missing = tmp_path / "absent" / "alexnet-owt-7be5be79.pth"
    x = images()
    with pytest.raises(FileNotFoundError) as err:
        reconstruction_metrics(x, x, **{argument: missing})
    assert f"{argument}={str(missing)!r}" in str(err.value), str(err.value)


def test_an_lpips_file_not_named_as_torchvision_names_it_is_refused(tmp_path):
    path = tmp_path / "backbone.pth"
    torch.save({}, path)
    with pytest.raises(ValueError, match=re.escape("alexnet-owt-7be5be79.pth")) as err:
        check_perceptual_weights(path, None)
    assert "lpips_weights=" in str(err.value) and "backbone.pth" in str(err.value), str(err.value)


@pytest.mark.skipif(TORCHVISION_PROBLEM is None, reason="torchvision imports here: LPIPS is computed instead")
def test_lpips_is_refused_naming_torchvision_where_it_cannot_import(tmp_path):
    path = tmp_path / "alexnet-owt-7be5be79.pth"
    torch.save({}, path)
    with pytest.raises(ImportError) as err:
        PerceptualMetrics(lpips_weights=path)
    message = str(err.value)
    assert "lpips_weights=" in message and str(path) in message and "torchvision" in message, message


@pytest.mark.skipif(
    TORCH_FIDELITY, reason="torch-fidelity imports here: the state-dict FID is computed instead"
)
def test_a_state_dict_inception_is_refused_naming_torch_fidelity_where_it_cannot_import(tmp_path):
    path = tmp_path / "weights-inception-2015-12-05-6726825d.pth"
    torch.save({"Conv2d_1a_3x3.conv.weight": torch.zeros(32, 3, 3, 3)}, path)
    with pytest.raises(ImportError) as err:
        PerceptualMetrics(fid_weights=path)
    message = str(err.value)
    assert "fid_weights=" in message and str(path) in message and "torch-fidelity" in message, message
    assert "inception-2015-12-05.pt" in message, message  # and it names the format that runs here


@pytest.mark.skipif(TORCHVISION_PROBLEM is not None, reason=f"LPIPS needs torchvision: {TORCHVISION_PROBLEM}")
def test_lpips_from_a_local_backbone_file(tmp_path, monkeypatch):
    import torchvision

    torch.manual_seed(0)
    path = tmp_path / "alexnet-owt-7be5be79.pth"
    torch.save(torchvision.models.alexnet().state_dict(), path)

    def refuse(*args, **kwargs):
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    hub = torch.hub.get_dir()
    x = images(n=4, channels=3)
    same = reconstruction_metrics(x, x, lpips_weights=path)
    other = reconstruction_metrics(images(n=4, channels=3, seed=1), x, lpips_weights=path)
    assert torch.hub.get_dir() == hub  # the private hub folder is not left behind
    # identical inputs give identical features: every LPIPS term is a bias-free 1x1 conv of a zero difference
    assert same["lpips"] == 0.0, same
    assert other["lpips"] > 0.0, other


@pytest.mark.skipif(
    not TORCH_FIDELITY, reason="a state-dict Inception needs torch-fidelity (and torchvision)"
)
def test_fid_from_a_torch_fidelity_state_dict(tmp_path, monkeypatch):
    from torch_fidelity import feature_extractor_inceptionv3 as tf_inception

    # torch-fidelity's own class, seeded, without its download: its loader returns nothing and loading is skipped
    monkeypatch.setattr(tf_inception, "load_state_dict_from_url", lambda *a, **k: None)
    monkeypatch.setattr(tf_inception.FeatureExtractorInceptionV3, "load_state_dict", lambda self, state: None)
    torch.manual_seed(0)
    net = tf_inception.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    path = tmp_path / "weights-inception-2015-12-05-6726825d.pth"
    torch.save(net.state_dict(), path)
    monkeypatch.undo()

    def refuse(*args, **kwargs):
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    x = images(n=6, channels=3, side=32)
    same = reconstruction_metrics(x, x, fid_weights=path)
    shifted = reconstruction_metrics((x + 0.3).clamp(0, 1), x, fid_weights=path)
    # 6 images against 2048 features: the covariance has rank 5, and the square roots of the ~2043 zero
    # eigenvalues of S S come out as ~sqrt(eps) * |S| each; their sum bounds FID(x, x), far below a real shift
    assert abs(same["fid"]) < 1e-2 * shifted["fid"], (same, shifted)
    assert shifted["fid"] > 0, shifted


def tiny_mim(folder=None):
    """An untrained tiny MIM head and a patch k-means tokenizer fitted on real `digits` images (16 × 16)."""
    from energyformers import HyperSetConfig, HyperSetForMaskedImageModeling
    from energyformers.mim import PatchKMeansTokenizer

    pixels = digit_images()[:64]
    tokenizer = PatchKMeansTokenizer.fit(pixels, patch_size=2, codebook_size=16, seed=0)
    torch.manual_seed(0)
    config = HyperSetConfig.from_preset(
        "mim-1-12-d",
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        time_embedding_dim=16,
        num_iterations=2,
        vocab_size=tokenizer.codebook_size + 1,
        max_position_embeddings=64,
    )
    model = HyperSetForMaskedImageModeling(config).eval()
    if folder is not None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return model, tokenizer, pixels


def test_masked_image_metrics_report_fid_and_the_tokenizer_bound(detector_file):
    from energyformers.mim import mask_codes
    from energyformers.training.evaluation import masked_image_metrics

    model, tokenizer, pixels = tiny_mim()
    codes = tokenizer.encode(pixels[:16])
    inputs, _ = mask_codes(codes, model.mask_token_id, 0.4, generator=torch.Generator().manual_seed(0))
    plain = masked_image_metrics(model, inputs, codes, pixels[:16], tokenizer, steps=2)
    with_fid = masked_image_metrics(
        model, inputs, codes, pixels[:16], tokenizer, steps=2, fid_weights=detector_file
    )
    assert set(with_fid) == set(plain) | {"fid", "tokenizer_fid"}, sorted(with_fid)
    assert {k: with_fid[k] for k in plain} == plain  # seeded decoding: the other metrics are unchanged
    assert with_fid["fid"] >= 0 and with_fid["tokenizer_fid"] >= 0, with_fid


@pytest.mark.parametrize("flag", ["--lpips_weights", "--fid_weights"])
def test_cli_refuses_a_missing_weight_file_naming_the_flag_and_path(tmp_path, flag):
    from energyformers.training import train
    from energyformers.training.arguments import parse_arguments
    from energyformers.training.cli import UsageError

    missing = tmp_path / "absent.pt"
    out = str(tmp_path / "out")
    with pytest.raises(UsageError) as err:
        parse_arguments(["--output_dir", out, "--task", "mim", flag, str(missing)], train.PROG, "")
    assert flag in str(err.value) and str(missing) in str(err.value), str(err.value)
    with pytest.raises(UsageError, match="masked-image-modelling flag"):  # meaningless without the task
        parse_arguments(["--output_dir", out, flag, str(missing)], train.PROG, "")


# What each weight flag's check says of a missing file after the flag and its value (energyformers.mim)
MISSING_FILE = {
    "lpips_weights": "no such file (torchvision's ImageNet weights of the LPIPS backbone, one of ",
    "fid_weights": "no such file (a TorchScript Inception such as inception-2015-12-05.pt, ",
}


@pytest.mark.parametrize("name", ["lpips_weights", "fid_weights"])
def test_train_reports_a_missing_weight_file_naming_the_flag_once(tmp_path, capsys, name):
    """`energyformers train`: one line `--NAME PATH: no such file (what is allowed)`, status 2; the path once, and
    no Python argument form (`NAME='PATH'`) repeating it."""
    from energyformers.training import train

    missing = tmp_path / "absent" / "weights.pt"
    argv = ["--output_dir", str(tmp_path / "out"), "--task", "mim", f"--{name}", str(missing)]
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    expected = f"energyformers train: error: --{name} {missing}: {MISSING_FILE[name]}"
    assert err.startswith(expected) and err.count("\n") == 1, err
    assert err.count(str(missing)) == 1 and f"{name}=" not in err, err


@pytest.mark.parametrize("name", ["lpips_weights", "fid_weights"])
def test_mim_benchmark_reports_a_missing_weight_file_naming_the_flag_once(tmp_path, capsys, name):
    """`benchmarks/mim.py` (argparse's usage, then its one error line, status 2): the same message as `train`."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "mim.py"
    spec = importlib.util.spec_from_file_location("mim_benchmark_flags", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = tmp_path / "absent" / "weights.pt"
    with pytest.raises(SystemExit) as exit_:
        module.parse_arguments([f"--{name}", str(missing)])
    assert exit_.value.code == 2, exit_.value.code
    error = capsys.readouterr().err.splitlines()[-1]
    assert f"error: --{name} {missing}: {MISSING_FILE[name]}" in error, error
    assert error.count(str(missing)) == 1 and f"{name}=" not in error, error


@pytest.mark.parametrize("name", ["lpips_weights", "fid_weights"])
def test_python_callers_get_the_argument_form(tmp_path, name):
    """Python callers are told the argument as they wrote it (`NAME='PATH'`), not a command-line flag."""
    missing = tmp_path / "absent" / "weights.pt"
    with pytest.raises(FileNotFoundError) as err:
        check_perceptual_weights(**{"lpips_weights": None, "fid_weights": None, name: missing})
    message = str(err.value)
    assert message.startswith(f"{name}={str(missing)!r}: {MISSING_FILE[name]}"), message
    assert message.count(str(missing)) == 1 and "--" not in message, message


def test_cli_names_a_misnamed_lpips_file_with_its_flag(tmp_path):
    from energyformers.training import train
    from energyformers.training.arguments import parse_arguments
    from energyformers.training.cli import UsageError

    path = tmp_path / "backbone.pth"
    torch.save({}, path)
    argv = ["--output_dir", str(tmp_path / "out"), "--task", "mim", "--lpips_weights", str(path)]
    with pytest.raises(UsageError) as err:
        parse_arguments(argv, train.PROG, "")
    message = str(err.value)
    assert message.startswith(f"--lpips_weights {path}: the backbone is known by torchvision's file name"), (
        message
    )
    assert message.count(str(path)) == 1 and "lpips_weights=" not in message, message


def test_cli_takes_an_existing_fid_file(tmp_path, detector_file):
    from energyformers.training import train
    from energyformers.training.arguments import parse_arguments

    argv = ["--output_dir", str(tmp_path / "out"), "--task", "mim", "--fid_weights", str(detector_file)]
    assert parse_arguments(argv, train.PROG, "").data.fid_weights == str(detector_file)


def test_pipeline_checks_lpips_weights_before_reading_the_model(tmp_path):
    from energyformers.pipelines import MaskedImageModelingPipeline

    missing = tmp_path / "alexnet-owt-7be5be79.pth"
    with pytest.raises(FileNotFoundError) as err:
        MaskedImageModelingPipeline(model=str(tmp_path / "no-model"), lpips_weights=missing)
    assert f"lpips_weights={str(missing)!r}" in str(err.value), str(err.value)


@pytest.mark.skipif(TORCHVISION_PROBLEM is not None, reason=f"LPIPS needs torchvision: {TORCHVISION_PROBLEM}")
def test_pipeline_reports_lpips(tmp_path):
    import torchvision

    from energyformers.pipelines import MaskedImageModelingPipeline

    torch.manual_seed(0)
    weights = tmp_path / "alexnet-owt-7be5be79.pth"
    torch.save(torchvision.models.alexnet().state_dict(), weights)
    _, _, pixels = tiny_mim(tmp_path / "model")
    out = MaskedImageModelingPipeline(model=str(tmp_path / "model"), lpips_weights=weights)(
        pixels[0], steps=2
    )
    assert out["lpips"] >= 0 and out["tokenizer_lpips"] >= 0, out
