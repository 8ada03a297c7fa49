"""benchmarks/gpu_speed.py end to end on CPU in its smoke mode (tiny configs, one repeat), and its refusals.

The smoke numbers check the script, they are not measurements: they go to `gpu_speed_smoke.{json,md}`, marked so.
A real run needs CUDA; without it the script exits with a message and writes nothing.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_speed.py"
# a smoke run of the HyperBF group's inference only: the short runs of the modes and the profile checks
HYPERBF_INFERENCE = ["--device", "cpu", "--smoke", "--tasks", "inference", "--groups", "HyperBF"]


@pytest.fixture
def gpu_speed(monkeypatch):
    # tests/conftest.py turns Triton's (very slow) CPU interpreter on; off, the fused kernel cannot run on CPU, and
    # the script must record Hyper-SET's "triton" as skipped rather than time it
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    spec = importlib.util.spec_from_file_location("gpu_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while the file executes
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke check of machines without CUDA")
def test_smoke_run_covers_every_group_and_writes_json_and_markdown(gpu_speed, tmp_path):
    report = gpu_speed.main(["--device", "cpu", "--smoke", "--modes", "eager", "--output_dir", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_speed_smoke.json", "gpu_speed_smoke.md"]
    assert json.loads((tmp_path / "gpu_speed_smoke.json").read_text()) == report
    assert report["smoke"] and report["environment"]["torch"] == torch.__version__
    names = list(report["groups"])
    assert [name.split(",")[0].split(" (")[0] for name in names] == [
        "Hyper-SET cifar10-small",
        "Hyper-SET cifar10-small",
        "HyperBF cifar",
        "iMixer-S/16",
        "Hyper-SET sudoku",
    ]
    for name, group in report["groups"].items():
        measured = {v: e for v, e in group["variants"].items() if "skipped" not in e}
        assert measured, name
        for variant, entry in measured.items():
            for task in ("inference", "train"):
                timing = entry["eager"][task]
                assert "error" not in timing, (name, variant, timing)
                assert timing["median_s"] > 0 and timing["first_call_s"] > 0
                assert timing["peak_memory_bytes"] is None  # no CUDA: no memory figure is made up
            if not entry["baseline"]:
                assert entry["flops"]["train"] > entry["flops"]["forward"] > 0
                if "Hyper-SET" in name or "HyperBF" in name:
                    assert entry["attn_implementation"] in ("eager", "sdpa", "triton")
                if name != names[-1]:  # every group but the compile-time one has a baseline
                    assert entry["eager"]["inference"]["ratio"] > 0
        skipped = {v: e["skipped"] for v, e in group["variants"].items() if "skipped" in e}
        if "Hyper-SET" in name:  # the fused kernel needs CUDA: skipped with the model's own message
            assert list(skipped) == [v for v in group["variants"] if v.endswith("(triton)")], skipped
            assert "CUDA" in next(iter(skipped.values()))
        else:  # the iMixer variant needs the config's spectral_norm_schedule option, nothing else may be missing
            assert all("spectral_norm_schedule" in reason for reason in skipped.values()), skipped
    # HyperBF runs both of its implementations; Mixer is iMixer with n = 0
    hyperbf = report["groups"][names[2]]["variants"]
    assert {e.get("attn_implementation") for e in hyperbf.values()} == {"eager", "sdpa", None}
    markdown = (tmp_path / "gpu_speed_smoke.md").read_text()
    assert markdown.startswith("# gpu_speed.py SMOKE RUN") and "not measurements" in markdown
    assert markdown.count("\n## ") == len(names)


def test_smoke_run_compiles(gpu_speed, tmp_path):
    arguments = [*HYPERBF_INFERENCE, "--modes", "eager", "compiled"]
    report = gpu_speed.main([*arguments, "--output_dir", str(tmp_path)])
    (group,) = report["groups"].values()
    assert report["compile_backend"] == "aot_eager"  # smoke: capture + AOT autograd, no code generation
    for name, entry in group["variants"].items():  # the two passes (one mode each) merged into one record
        assert entry["compiled"]["inference"]["median_s"] > 0 and "train" not in entry["compiled"]
        assert entry["eager"]["inference"]["median_s"] > 0, (name, entry)
        if not entry["baseline"]:
            assert entry["eager"]["inference"]["ratio"] > 0 and entry["compiled"]["inference"]["ratio"] > 0
    assert group["best_ratio"]["inference"] > 0
    # one more call of each is profiled in both modes (the default --profile_modes): where its time goes
    markdown = (tmp_path / "gpu_speed_smoke.md").read_text()
    assert "Where the time goes" in markdown
    for name, entry in group["variants"].items():
        for mode in ("eager", "compiled"):
            profile = entry[mode]["inference"]["profile"]
            shares = [row["share"] for row in profile["top"]]
            assert profile["clock"] == "cpu operators" and profile["total_ms"] > 0, (name, mode, profile)
            assert profile["count"] >= len(shares) > 0 and all(row["name"] for row in profile["top"])
            if mode == "eager":  # the model's own operators (compiled: also the compiled region's frames)
                assert all(row["name"].startswith("aten::") for row in profile["top"]), profile["top"]
            assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9, (
                name,
                mode,
                shares,
            )
            assert f"- {name}, {mode}, inference: " in markdown, name


def test_no_profile_modes_profiles_nothing(gpu_speed, tmp_path):
    arguments = [*HYPERBF_INFERENCE, "--modes", "eager", "--profile_modes"]
    report = gpu_speed.main([*arguments, "--output_dir", str(tmp_path)])
    (group,) = report["groups"].values()
    assert all("profile" not in entry["eager"]["inference"] for entry in group["variants"].values())
    assert "Where the time goes" not in (tmp_path / "gpu_speed_smoke.md").read_text()


def test_a_graph_break_under_cuda_graphs_is_measured_between_breaks_and_recorded(
    gpu_speed, tmp_path, monkeypatch
):
    """mode="reduce-overhead" with fullgraph=True fails on a graph break; the run then measures CUDA graphs between
    the breaks (fullgraph=False) and says why, instead of losing the row. CPU stand-in: a compile whose fullgraph
    capture fails and whose split capture runs the model as it is."""
    compiles = []

    def fake_compile(model, mode=None, fullgraph=False, dynamic=None, **kwargs):
        compiles.append((mode, fullgraph))
        if not fullgraph:
            return model

        def broken(**inputs):
            raise RuntimeError("Unsupported: a data pointer comparison\n(the rest of dynamo's message)")

        return broken

    monkeypatch.setattr(gpu_speed, "cuda_graphs_available", lambda device: True)
    monkeypatch.setattr(gpu_speed.torch, "compile", fake_compile)
    arguments = ["--device", "cpu", "--smoke", "--modes", "cuda-graphs", "--groups", "HyperBF"]
    report = gpu_speed.main([*arguments, "--output_dir", str(tmp_path)])
    (group,) = report["groups"].values()
    for name, entry in group["variants"].items():
        for task in ("inference", "train"):
            timing = entry["cuda-graphs"][task]
            assert "error" not in timing and timing["median_s"] > 0, (name, task, timing)
            assert timing["graph_break"] == "RuntimeError: Unsupported: a data pointer comparison", timing
    # one fullgraph try and one split compile per variant, not one per task
    assert compiles == [("reduce-overhead", True)] * len(group["variants"]) + [
        ("reduce-overhead", False)
    ] * len(group["variants"]), compiles
    markdown = (tmp_path / "gpu_speed_smoke.md").read_text()
    assert markdown.count("graph break, so CUDA graphs between breaks") == len(group["variants"]), markdown


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_real_run_without_cuda_exits_with_a_message_and_writes_nothing(gpu_speed, tmp_path):
    with pytest.raises(SystemExit, match="no CUDA device is available"):
        gpu_speed.main(["--output_dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="only for --smoke"):
        gpu_speed.main(["--device", "cpu", "--output_dir", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_a_stopped_run_keeps_the_groups_it_measured(gpu_speed, tmp_path, monkeypatch):
    """benchmarks/gpu/run.sh stops gpu_speed.py at its time budget: the files are written after every group."""
    measure = gpu_speed.measure_group
    calls = []

    def measure_then_stop(group, args, device):
        calls.append(group.name)
        if len(calls) == 2:  # stands for the stage's timeout arriving during the second group
            raise KeyboardInterrupt
        return measure(group, args, device)

    monkeypatch.setattr(gpu_speed, "measure_group", measure_then_stop)
    arguments = ["--device", "cpu", "--smoke", "--modes", "eager", "compiled", "--tasks", "inference"]
    with pytest.raises(KeyboardInterrupt):
        gpu_speed.main([*arguments, "--groups", "HyperBF", "sudoku", "--output_dir", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_speed_smoke.json", "gpu_speed_smoke.md"]
    report = json.loads((tmp_path / "gpu_speed_smoke.json").read_text())
    assert list(report["groups"]) == calls[:1] and report["complete"] is False, report
    # one mode over every group first: the stop came in the second group's eager pass, before any compiling
    assert calls[1] != calls[0], calls
    for entry in report["groups"][calls[0]]["variants"].values():
        assert "eager" in entry and "compiled" not in entry, entry
    pending = (tmp_path / "gpu_speed_smoke.md").read_text().split("**Incomplete run**")[1]
    for name in (f"{calls[1]} [eager]", f"{calls[0]} [compiled]", f"{calls[1]} [compiled]"):
        assert name in pending, (name, pending)
