"""benchmarks/gpu_speed.py end to end on CPU in its smoke mode (tiny configs, one repeat), and its refusals.

The smoke numbers check the script, they are not measurements: they go to `gpu_speed_smoke.{json,md}`, marked so.
A real run needs CUDA; without it the script exits with a message and writes nothing.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
from fixtures import loaded_script, rounding

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_speed.py"
# a smoke run of the HyperBF group's inference only: the short runs of the modes and the profile checks
HYPERBF_INFERENCE = ["--device", "cpu", "--smoke", "--tasks", "inference", "--groups", "HyperBF"]


@pytest.fixture
def gpu_speed(monkeypatch):
    # tests/conftest.py turns Triton's (very slow) CPU interpreter on; off, the fused kernel cannot run on CPU, and
    # the script must record Hyper-SET's "triton" as skipped rather than time it
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with loaded_script(SCRIPT, "gpu_speed") as module:
        yield module


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke check of machines without CUDA")
def test_smoke_run_covers_every_group_and_writes_json_and_markdown(gpu_speed, tmp_path):
    report = gpu_speed.main(["--device", "cpu", "--smoke", "--modes", "eager", "--output_dir", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_speed_smoke.json", "gpu_speed_smoke.md"]
    assert json.loads((tmp_path / "gpu_speed_smoke.json").read_text()) == report
    assert report["smoke"] and report["environment"]["torch"] == torch.__version__
    names = list(report["groups"])
    assert [name.split(",")[0].split(" (")[0] for name in names] == [
        "Bi-softmax attention alone",
        "Bi-softmax attention alone",
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
                if "Hyper-SET" in name or "HyperBF" in name or "Bi-softmax" in name:
                    assert entry["attn_implementation"] in ("eager", "sdpa", "triton")
                if name != names[-1]:  # every group but the compile-time one has a baseline
                    assert entry["eager"]["inference"]["ratio"] > 0
        skipped = {v: e["skipped"] for v, e in group["variants"].items() if "skipped" in e}
        if (
            "Hyper-SET" in name or "Bi-softmax" in name
        ):  # the fused kernel needs CUDA: skipped, the model's message
            assert list(skipped) == [v for v in group["variants"] if v.endswith("(triton)")], skipped
            assert "CUDA" in next(iter(skipped.values()))
        else:  # the iMixer variant needs the config's spectral_norm_schedule option, nothing else may be missing
            assert all("spectral_norm_schedule" in reason for reason in skipped.values()), skipped
    # HyperBF runs both of its implementations; Mixer is iMixer with n = 0
    hyperbf = report["groups"][names[4]]["variants"]
    assert {e.get("attn_implementation") for e in hyperbf.values()} == {"eager", "sdpa", None}
    markdown = (tmp_path / "gpu_speed_smoke.md").read_text()
    assert markdown.startswith("# gpu_speed.py SMOKE RUN") and "not measurements" in markdown
    assert markdown.count("\n## ") == len(names)


def test_smoke_run_compiles(gpu_speed, tmp_path, monkeypatch):
    count_flops, counted = gpu_speed.count_flops, []

    def counting(model, inputs, batch):
        counted.append(type(model).__name__)
        return count_flops(model, inputs, batch)

    monkeypatch.setattr(gpu_speed, "count_flops", counting)
    arguments = [*HYPERBF_INFERENCE, "--modes", "eager", "compiled"]
    report = gpu_speed.main([*arguments, "--output_dir", str(tmp_path)])
    (group,) = report["groups"].values()
    # the FLOPs are counted once per model, in the eager pass: the compiled pass takes them from the report
    # (HyperBF's two implementations share the family's count, as in the eager pass alone)
    assert sorted(counted) == ["HyperBFForImageClassification", "ViTForImageClassification"], counted
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
            # float64 shares time / total of all rows: the total's sum (of no more rows than `count`), each share's
            # division and the shares' sum round, so they add up to at most 1 plus that many roundings of 1
            most = 1 + rounding(torch.float64, profile["count"] + 2 * len(shares))
            assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= most, (
                f"{name}, {mode}: shares {shares} add up to {sum(shares)!r}, at most {most!r}"
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

    def measure_then_stop(group, args, device, on_task=None, known=None):
        calls.append(group.name)
        if len(calls) == 2:  # stands for the stage's timeout arriving during the second group
            raise KeyboardInterrupt
        return measure(group, args, device, on_task, known)

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
    for name in (
        f"{calls[1]} [eager: inference]",
        f"{calls[0]} [compiled: inference]",
        f"{calls[1]} [compiled",
    ):
        assert name in pending, (name, pending)


def test_a_run_stopped_while_profiling_keeps_that_tasks_timings(gpu_speed, tmp_path, monkeypatch):
    """The timings of a (group, mode, task) are saved before its profiles are taken: a budget stop during the
    profiled call loses the profiles only, and a run resumed from the file does not time that task again."""

    def stop(call, device):  # stands for the stage's timeout arriving during the profiled call
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_speed, "profile_call", stop)
    with pytest.raises(KeyboardInterrupt):
        gpu_speed.main([*SUDOKU_EAGER, "--tasks", "inference", "--output_dir", str(tmp_path)])
    report = json.loads((tmp_path / "gpu_speed_smoke.json").read_text())
    (group,) = report["groups"].values()
    timings = {
        name: entry["eager"]["inference"] for name, entry in group["variants"].items() if "eager" in entry
    }
    assert timings and all("median_s" in t and "profile" not in t for t in timings.values()), timings
    assert report["complete"] is True, report  # nothing left to measure: only the profiles are missing
    assert "Incomplete run" not in (tmp_path / "gpu_speed_smoke.md").read_text()


# a smoke run of the Sudoku group (two variants on CPU: the fused kernel is skipped there) in eager mode: the
# shortest run with a whole group's structure, for the --resume checks
SUDOKU_EAGER = ["--device", "cpu", "--smoke", "--groups", "Hyper-SET sudoku", "--modes", "eager"]
# its inference alone, unprofiled: the earlier run the --resume checks below start from
SUDOKU_INFERENCE = [*SUDOKU_EAGER, "--tasks", "inference", "--profile_modes"]


@pytest.fixture(scope="module")
def sudoku_inference_run(tmp_path_factory) -> Path:
    """The folder of one SUDOKU_INFERENCE run, made once per module. Tests read it, never write it: one that
    changes its JSON copies it first."""
    out = tmp_path_factory.mktemp("sudoku-inference")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TRITON_INTERPRET", raising=False)  # as the gpu_speed fixture
        with loaded_script(SCRIPT, "gpu_speed") as module:
            module.main([*SUDOKU_INFERENCE, "--output_dir", str(out)])
    return out


# a median no measurement gives: a kept row must still carry it, a measured one never does
MARKER_S = 1234.5


def mark_measurements(path: Path, **environment: str) -> dict:
    """The JSON at `path` with every recorded median set to MARKER_S (and `environment` fields changed), rewritten
    in place: what a later --resume keeps is then told apart from what it measures."""
    report = json.loads(path.read_text())
    report["environment"].update(environment)
    for group in report["groups"].values():
        for entry in group["variants"].values():
            for mode in ("eager", "compiled", "cuda-graphs"):
                for timing in entry.get(mode, {}).values():
                    timing["median_s"] = MARKER_S
    path.write_text(json.dumps(report))
    return report


def tasks_measured(gpu_speed, monkeypatch) -> list:
    """Patch measure_group to note the (group, modes, tasks) of every call, then measure as usual."""
    measure, calls = gpu_speed.measure_group, []

    def noting(group, args, device, on_task=None, known=None):
        calls.append((group.name, list(args.modes), list(args.tasks)))
        return measure(group, args, device, on_task, known)

    monkeypatch.setattr(gpu_speed, "measure_group", noting)
    return calls


def test_a_run_stopped_inside_a_group_keeps_its_finished_task_and_a_resumed_run_measures_only_the_rest(
    gpu_speed, tmp_path, monkeypatch, capsys
):
    """A stage stopped by its budget between the inference and the training of one group (a compile is 20-40 s on
    the GPU) keeps the inference; a run resumed from that file keeps it as it is and measures only the training."""
    first, second = tmp_path / "first", tmp_path / "second"
    step_function = gpu_speed.step_function

    def stop_at_training(model, callable_model, inputs, task, graphs=False):
        if task == "train":  # stands for the stage's timeout arriving once the inference is measured
            raise KeyboardInterrupt
        return step_function(model, callable_model, inputs, task, graphs)

    monkeypatch.setattr(gpu_speed, "step_function", stop_at_training)
    with pytest.raises(KeyboardInterrupt):
        gpu_speed.main([*SUDOKU_EAGER, "--output_dir", str(first)])
    monkeypatch.setattr(gpu_speed, "step_function", step_function)
    stopped = json.loads((first / "gpu_speed_smoke.json").read_text())
    (group_name,) = stopped["groups"]
    assert stopped["complete"] is False and [r["run"] for r in stopped["runs"]] == [1], stopped["runs"]
    measured = {v: e for v, e in stopped["groups"][group_name]["variants"].items() if "skipped" not in e}
    assert len(measured) == 2 and all(list(e["eager"]) == ["inference"] for e in measured.values()), measured
    assert f"{group_name} [eager: train]" in (first / "gpu_speed_smoke.md").read_text()

    earlier = mark_measurements(first / "gpu_speed_smoke.json")
    calls = tasks_measured(gpu_speed, monkeypatch)
    report = gpu_speed.main(
        [*SUDOKU_EAGER, "--resume", str(first / "gpu_speed_smoke.json"), "--output_dir", str(second)]
    )
    assert calls == [(group_name, ["eager"], ["train"])], calls  # the inference is not measured again
    assert "inference kept from run 1 (--resume)" in capsys.readouterr().out
    assert report["complete"] is True and [r["run"] for r in report["runs"]] == [1, 2], report["runs"]
    assert report["runs"][0] == earlier["runs"][0]  # the first run's date and command, as they were
    for variant, entry in report["groups"][group_name]["variants"].items():
        if "skipped" in entry:
            continue
        kept = earlier["groups"][group_name]["variants"][variant]["eager"]["inference"]
        assert entry["eager"]["inference"] == kept, (
            variant,
            entry["eager"]["inference"],
            kept,
        )  # marker and all
        train = entry["eager"]["train"]
        assert train["run"] == 2 and 0 < train["median_s"] != MARKER_S, (variant, train)
    assert json.loads((second / "gpu_speed_smoke.json").read_text()) == report
    markdown = (second / "gpu_speed_smoke.md").read_text()
    assert "- run 1 (" in markdown and "- run 2 (" in markdown and "run (inf / train) |" in markdown, markdown
    assert "| 1 / 2 |" in markdown and "Incomplete run" not in markdown, markdown

    # resumed from a complete file: nothing is measured, and both files are written whole again
    third = tmp_path / "third"
    again = gpu_speed.main(
        [*SUDOKU_EAGER, "--resume", str(second / "gpu_speed_smoke.json"), "--output_dir", str(third)]
    )
    assert calls == [(group_name, ["eager"], ["train"])], calls
    out = capsys.readouterr().out
    assert f"{group_name} [eager]: inference, train kept from run 1, 2 (--resume)" in out, out
    assert again["groups"] == report["groups"] and again["runs"] == report["runs"] and again["complete"], (
        again
    )
    written = json.loads((third / "gpu_speed_smoke.json").read_text())
    assert again["run"] == 3 and written == again, again["run"]
    assert (third / "gpu_speed_smoke.md").read_text() == markdown
    # what benchmarks/gpu/summary.py (run.sh's summary) says of each resumed run's measurements
    with loaded_script(SCRIPT.parent / "gpu" / "summary.py", "gpu_summary") as summary:
        counts = [summary.speed_runs(r) for r in (stopped, report, again)]
    assert counts == [
        "; measurements (group × mode × task): 1 new in run 1",
        "; measurements (group × mode × task): 1 new in run 2, 1 kept from run 1",
        "; measurements (group × mode × task): 0 new in run 3, 2 kept from runs 1, 2",
    ], counts


def test_each_run_records_its_commit_machine_and_device_in_both_files(
    gpu_speed, tmp_path, sudoku_inference_run
):
    """benchmarks/provenance.py's run info, per run (a resumed file lists every run with its own commit)."""
    provenance = gpu_speed.provenance  # benchmarks/provenance.py, as the script imported it
    first, second = sudoku_inference_run, tmp_path / "second"
    report = json.loads((first / "gpu_speed_smoke.json").read_text())
    (run,) = report["runs"]
    commit = provenance.git_commit()
    assert run["git_commit"] == commit and run["seed"] == 0, run
    assert run["device"] == report["environment"]["device"] and run["machine"] == provenance.machine(), run
    assert "benchmarks/gpu_speed.py --device cpu --smoke" in run["command"], run
    markdown = (first / "gpu_speed_smoke.md").read_text()
    assert f"; commit {commit};" in markdown and f"; device {run['device']};" in markdown, markdown[:800]
    # a second run (the train task the first left out), resumed from the first: each run line names its commit
    again = gpu_speed.main(
        [*SUDOKU_EAGER, "--tasks", "train", "--profile_modes", "--resume", str(first / "gpu_speed_smoke.json"),
         "--output_dir", str(second)]
    )  # fmt: skip
    assert [r["run"] for r in again["runs"]] == [1, 2] and again["runs"][0] == run, again["runs"]
    markdown = (second / "gpu_speed_smoke.md").read_text()
    for number in (1, 2):
        assert f"- run {number} ({run['started'][:10]}" in markdown, markdown[:800]
    assert markdown.count(f", commit {commit}): `") == 2, markdown[:800]


@pytest.mark.parametrize("field", ["device", "torch", "transformers", "triton"])
def test_a_resume_file_of_another_device_or_software_is_ignored_saying_why(
    gpu_speed, tmp_path, monkeypatch, capsys, sudoku_inference_run, field
):
    """Results never mix machines: an earlier file of another device or versions is ignored (not an error) and
    every selected task is measured in this run."""
    path = tmp_path / "first" / "gpu_speed_smoke.json"
    path.parent.mkdir()
    shutil.copyfile(
        sudoku_inference_run / "gpu_speed_smoke.json", path
    )  # changed below: the module's is kept
    mark_measurements(path, **{field: "other 9.9"})
    calls = tasks_measured(gpu_speed, monkeypatch)
    report = gpu_speed.main(
        [*SUDOKU_INFERENCE, "--resume", str(path), "--output_dir", str(tmp_path / "second")]
    )
    out = capsys.readouterr().out
    assert f"--resume {path}: ignored" in out and f"{field} 'other 9.9' there" in out, out
    assert [call[2] for call in calls] == [["inference"]], calls
    assert [r["run"] for r in report["runs"]] == [1], report["runs"]
    for entry in next(iter(report["groups"].values()))["variants"].values():
        if "skipped" not in entry:
            assert 0 < entry["eager"]["inference"]["median_s"] != MARKER_S, entry


def test_a_smoke_run_ignores_a_real_runs_results(gpu_speed, tmp_path, capsys):
    """The committed GPU results given to a smoke run (benchmarks/gpu/run.sh --smoke does so) are read and refused."""
    committed = SCRIPT.parent / "results" / "gpu_speed.json"
    arguments = [*SUDOKU_EAGER, "--tasks", "inference", "--profile_modes", "--resume", str(committed)]
    report = gpu_speed.main([*arguments, "--output_dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "ignored, nothing is kept from it: it is from a measurement, this run is a smoke run" in out, out
    assert [r["run"] for r in report["runs"]] == [1] and report["complete"], report


def test_the_committed_gpu_results_resume_with_every_eager_task_kept(gpu_speed):
    """benchmarks/results/gpu_speed.json (the first GPU session's, written before runs were numbered) continued on
    the same machine: every group's eager inference and training are kept, the compiled modes are still to do. A
    renamed group or variant would make the next GPU session measure eager again, so the groups measured again are
    named here with the reason: the attention-alone groups came later, HyperBF's variants changed (its sdpa
    path stopped folding the feedforward at D = 768, so its committed sdpa row timed code that no longer runs, and
    both implementations' inference is now timed inside `cached_centers`), and so did Hyper-SET's (its attention reads the gains as views, no index or repeat per iteration)."""
    measured_again = ("Bi-softmax attention alone", "HyperBF cifar", "Hyper-SET")
    committed = json.loads((SCRIPT.parent / "results" / "gpu_speed.json").read_text())
    assert gpu_speed.resume_problem(committed) is None
    report = {"groups": {}, "runs": []}
    definitions = gpu_speed.groups(smoke=False)
    gpu_speed.adopt(report, committed, definitions, None, Path("gpu_speed.json"))
    assert report["runs"] == [
        {"run": 1, "started": None, "command": committed["command"], "repeats": committed["repeats"]}
    ]
    for group in definitions:
        record = report["groups"].get(group.name)
        if group.name.startswith(measured_again):
            assert not any(gpu_speed.task_measured(record, group, "eager", t) for t in ("inference", "train"))
            continue
        for task in ("inference", "train"):
            assert gpu_speed.task_measured(record, group, "eager", task), (group.name, task)
            assert not gpu_speed.task_measured(record, group, "compiled", task), (group.name, task)
        for entry in record["variants"].values():
            assert all(timing["run"] == 1 for timing in entry.get("eager", {}).values()), entry


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it (FileNotFoundError"),
        ("{", "cannot read it (JSONDecodeError"),
        ("[1, 2]", "not a result of this script (a JSON list, not an object)"),
        (
            '{"environment": {"device": "x"}, "groups": {"g": {"variants": {"v": {"eager": 3}}}}}',
            "not a result of this script (group 'g', variant 'v'",
        ),
    ],
)
def test_a_bad_resume_file_is_refused_before_any_work(gpu_speed, tmp_path, capsys, content, message):
    path = tmp_path / "earlier.json"
    if content is not None:
        path.write_text(content)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stopped:
        gpu_speed.main([*SUDOKU_EAGER, "--resume", str(path), "--output_dir", str(out)])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and f"error: --resume {path}: {message}" in error, (
        stopped.value.code,
        error,
    )
    assert not out.exists()


def test_the_committed_gpu_results_plan_the_missing_tasks_compile_time_first(gpu_speed, tmp_path):
    """The next GPU session's speed stage, planned from benchmarks/results/gpu_speed.json without measuring: the
    eager tasks the committed file lacks (the attention-alone groups came later; HyperBF's variants and
    Hyper-SET's changed, a new revision each, and a task is measured again as a whole), then every compiled and
    CUDA-graph pass, group by group in priority order, the T = 24 compile time first. Hyper-SET's sdpa
    implementation is measured in eager mode only; HyperBF's sdpa is its default and stays in every mode."""
    committed = json.loads((SCRIPT.parent / "results" / "gpu_speed.json").read_text())
    report = {"groups": {}, "runs": []}
    definitions = gpu_speed.groups(smoke=False)
    gpu_speed.adopt(report, committed, definitions, None, Path("gpu_speed.json"))
    passes = gpu_speed.plan_passes(
        definitions, list(gpu_speed.MODES), list(gpu_speed.TASKS), report["groups"]
    )

    def short(name: str) -> str:
        return next(key for key in ("attention 197", "attention 785", "197", "785", "HyperBF", "iMixer", "sudoku")
                    if all(word in name for word in key.split()))  # fmt: skip

    both = ["inference", "train"]
    planned = [(p.mode, short(p.group.name), p.kept, p.tasks) for p in passes]
    assert planned == [
        ("eager", "attention 197", [], both),
        ("eager", "attention 785", [], both),
        ("eager", "197", [], both),
        ("eager", "785", [], both),
        ("eager", "HyperBF", [], both),
        ("eager", "iMixer", both, []),
        ("eager", "sudoku", [], both),
        ("compiled", "sudoku", [], both),
        ("compiled", "197", [], both),
        ("cuda-graphs", "197", [], both),
        ("compiled", "HyperBF", [], both),
        ("cuda-graphs", "HyperBF", [], both),
        ("compiled", "785", [], both),
        ("cuda-graphs", "785", [], both),
        ("compiled", "iMixer", [], both),
        ("cuda-graphs", "iMixer", [], both),
        ("compiled", "attention 197", [], both),
        ("cuda-graphs", "attention 197", [], both),
        ("compiled", "attention 785", [], both),
        ("cuda-graphs", "attention 785", [], both),
    ], planned
    for p in passes:
        names = [variant.name for variant in p.group.members(p.mode)]
        if p.mode == "eager":
            continue
        if short(p.group.name) == "sudoku":  # the compile-time target is about the default implementation
            assert names == ["Hyper-SET sudoku (eager)"], names
        elif "Hyper-SET" in p.group.name or "Bi-softmax" in p.group.name:
            implementations = [
                v.attn_implementation for v in p.group.members(p.mode) if v is not p.group.baseline
            ]
            assert implementations == ["eager", "triton"], (p.group.name, names)
            assert any("(triton)" in n for n in names) and any("(eager)" in n for n in names), names
        if p.group.baseline is not None:  # a baseline runs in every mode of its group
            assert names[-1] == p.group.baseline.name, names
    # --plan prints the same passes without measuring or writing anything (no CUDA needed)
    out = tmp_path / "plan"
    printed = gpu_speed.main(
        ["--plan", "--resume", str(SCRIPT.parent / "results" / "gpu_speed.json"), "--output_dir", str(out)]
    )
    assert [(p.mode, p.group.name, p.tasks) for p in printed] == [
        (p.mode, p.group.name, p.tasks) for p in passes
    ]
    assert not out.exists()


def test_compiled_passes_follow_the_priority_order_and_a_stopped_run_lists_the_rest_in_it(
    gpu_speed, tmp_path, monkeypatch
):
    """The order of the passes main() runs (without measuring): eager over both groups, then the Sudoku group's
    compiled pass (no CUDA-graph pass: the group has no baseline) before HyperBF's compiled and CUDA-graph passes;
    a run stopped at the third pass lists what it did not measure in that order."""
    calls = []

    def stop_at_the_third(group, args, device, on_task=None, known=None):
        calls.append((group.name.split(" (")[0], args.modes[0]))
        if len(calls) == 2:  # the Sudoku group's eager inference (no baseline, no variant: nothing to time)
            on_task(
                {"batch": args.batch or group.batch, "note": group.note, "variants": {}}, "eager", "inference"
            )
        if len(calls) == 3:
            raise KeyboardInterrupt  # the stage's budget running out

    monkeypatch.setattr(gpu_speed, "measure_group", stop_at_the_third)
    monkeypatch.setattr(gpu_speed, "cuda_graphs_available", lambda device: True)
    arguments = ["--device", "cpu", "--smoke", "--tasks", "inference", "--groups", "HyperBF", "sudoku"]
    with pytest.raises(KeyboardInterrupt):
        gpu_speed.main([*arguments, "--output_dir", str(tmp_path)])
    assert calls == [
        ("HyperBF cifar", "eager"),
        ("Hyper-SET sudoku", "eager"),
        ("Hyper-SET sudoku", "compiled"),
    ], calls
    pending = (tmp_path / "gpu_speed_smoke.md").read_text().split("**Incomplete run**")[1]
    # in order: the Sudoku group's compiled pass, then HyperBF's two; none for the Sudoku group's CUDA graphs
    expected = ("compile time [compiled: inference]", "blocks) [compiled: inference]", "blocks) [cuda-graphs")
    where = [pending.find(text) for text in expected]
    assert -1 < where[0] < where[1] < where[2] and pending.count("[") == 3, (where, pending)


def test_the_compiled_modes_leave_hyperset_sdpa_out_and_count_flops_once(gpu_speed, tmp_path, monkeypatch):
    """Hyper-SET's sdpa implementation is measured in eager mode only: the compiled pass builds and times the
    default implementation and the baseline (the fused kernel is skipped without CUDA), the report has no
    compiled row for sdpa and says why, and the ratios and the best-mode ratio come from what was measured. The
    FLOPs (FlopCounterMode, float32) are counted once per model in the eager run, then taken from its report:
    the run resumed from that file for the compiled pass counts none again."""
    count_flops, counted = gpu_speed.count_flops, []

    def counting(model, inputs, batch):
        counted.append(type(model).__name__)
        return count_flops(model, inputs, batch)

    monkeypatch.setattr(gpu_speed, "count_flops", counting)
    arguments = ["--device", "cpu", "--smoke", "--tasks", "inference", "--groups", "32²/8", "--profile_modes"]
    # the eager rows only, then a run resumed from them adds the compiled mode without counting FLOPs again (a
    # run of both modes counts them in its eager pass only: test_smoke_run_compiles)
    eager_only = gpu_speed.main([*arguments, "--modes", "eager", "--output_dir", str(tmp_path / "eager")])
    assert sorted(counted) == ["HyperSetForImageClassification", "ViTForImageClassification"], counted
    counted.clear()
    report = gpu_speed.main(
        [
            *arguments,
            "--modes",
            "eager",
            "compiled",
            "--resume",
            str(tmp_path / "eager" / "gpu_speed_smoke.json"),
            "--output_dir",
            str(tmp_path / "resumed"),
        ]
    )
    assert counted == [], counted
    (name,) = report["groups"]
    variants = report["groups"][name]["variants"]
    sdpa, eager, vit = (
        variants["Hyper-SET (sdpa)"],
        variants["Hyper-SET (eager)"],
        variants[next(v for v in variants if v.startswith("ViT"))],
    )
    assert "compiled" not in sdpa and sdpa["eager"]["inference"]["ratio"] > 0, sdpa
    assert eager["compiled"]["inference"]["ratio"] > 0 and "median_s" in vit["compiled"]["inference"], eager
    assert report["complete"] and report["groups"][name]["best_ratio"]["inference"] > 0, report["groups"][
        name
    ]
    assert sdpa["flops"] == eager["flops"] and eager["flops"]["forward"] > 0, (sdpa, eager)
    markdown = (tmp_path / "resumed" / "gpu_speed_smoke.md").read_text()
    assert "| Hyper-SET (sdpa) | eager |" in markdown and "| Hyper-SET (sdpa) | compiled |" not in markdown
    assert "| Hyper-SET (eager) | compiled |" in markdown, markdown
    assert (
        "Not measured: Hyper-SET (sdpa): not in compiled / cuda-graphs mode (the compiled modes" in markdown
    )
    kept = eager_only["groups"][name]["variants"]
    assert {v: e.get("flops") for v, e in kept.items()} == {v: e.get("flops") for v, e in variants.items()}


def test_flops_per_sample_share_the_work_done_once_per_call_over_the_batch(gpu_speed):
    """HyperBF projects its centres once per training step, whatever the batch: per sample of a batch-B call that
    work counts 1/B, so the count (from batches 1 and 2) equals FlopCounterMode over a real batch-B call divided by B
    (forward and training step), not the batch-one count, which charged it whole to one sample. Its forward is
    counted as its inference is timed, inside `cached_centers` after a call that filled it: no centre work is left,
    so the forward count per sample is the same at every batch, below a forward that computes the centres."""
    from torch.utils.flop_counter import FlopCounterMode

    from energyformers import HyperBFConfig

    batch = 6
    group = next(g for g in gpu_speed.groups(smoke=True) if g.name.startswith("HyperBF"))
    torch.manual_seed(0)
    model = group.variants[0].build()
    inputs = group.inputs(batch, torch.device("cpu"))
    counted = gpu_speed.count_flops(model, inputs, batch)

    forward, train = (flops / batch for flops in gpu_speed.call_flops(model, inputs))  # the whole call
    assert counted["batch"] == batch, counted
    # integer counts divided by a small batch: equal up to the float64 rounding of each side's division (and of
    # the sums of the counts, exact below 2^53): 2 roundings, relative
    rel = rounding(torch.float64, 2)
    assert counted["forward"] == pytest.approx(forward, rel=rel), (counted, forward)
    assert counted["train"] == pytest.approx(train, rel=rel), (counted, train)
    one = gpu_speed.count_flops(model, inputs, 1)
    assert one["train"] > counted["train"], (one, counted)  # the once-per-step work, whole at batch one
    # no once-per-call work in a cached forward: the same integer count per sample at batch one and six
    assert one["forward"] == pytest.approx(counted["forward"], rel=rel), (one, counted)
    model.eval()
    with FlopCounterMode(display=False) as uncached:  # autograd on: the centres computed in the call
        model(pixel_values=inputs["pixel_values"][:1])
    assert uncached.get_total_flops() > one["forward"], (uncached.get_total_flops(), one)
    assert isinstance(model.config, HyperBFConfig)


def test_hyperbf_inference_is_timed_inside_cached_centers(gpu_speed, monkeypatch):
    """HyperBF's inference runs as a pipeline call or an evaluation runs it, inside `cached_centers`: each
    feedforward computes what its centres give in the first call only, and the warm-up, timed and profiled calls
    reuse it (counted in inference mode, where the script's inference calls run). The training step is not in a
    scope: it computes them at every call, and no scope is left open on the models afterwards."""
    from energyformers.modeling.modeling_hyperbf import HyperBFFeedForward

    counts = {"inference": {}, "train": {}}
    modules = []
    compute = HyperBFFeedForward._projected_centers

    def counted(self):
        task = "inference" if torch.is_inference_mode_enabled() else "train" if self.training else None
        if task is not None:
            counts[task][id(self)] = counts[task].get(id(self), 0) + 1
            if self not in modules:
                modules.append(self)
        return compute(self)

    monkeypatch.setattr(HyperBFFeedForward, "_projected_centers", counted)
    group = next(g for g in gpu_speed.groups(smoke=True) if g.name.startswith("HyperBF"))
    args = gpu_speed.parse_args(["--device", "cpu", "--smoke", "--modes", "eager", "--repeats", "3"])
    record = gpu_speed.measure_group(group, args, torch.device("cpu"))
    variants = [name for name, entry in record["variants"].items() if not entry["baseline"]]
    assert len(variants) == 2 and all(
        "median_s" in record["variants"][v]["eager"]["inference"] for v in variants
    )
    layers = group.variants[0].build().config.num_hidden_layers
    assert len(modules) == 2 * layers, modules  # both implementations' models
    assert counts["inference"] == {id(m): 1 for m in modules}, f"inference: {counts['inference']}"
    # training: at least the first call, the warm-up, 3 timed repeats and the profiled call each compute them (the
    # eager variant's FLOP count adds its own training steps)
    calls = 1 + 1 + args.repeats + 1
    assert all(counts["train"].get(id(m), 0) >= calls for m in modules), f"train: {counts['train']}, {calls}"
    assert all(not m.reuse_centers and not m._eval_cache for m in modules)


def test_flops_of_another_batch_or_without_one_are_counted_again(gpu_speed, monkeypatch):
    """A count is reused only when it names the batch of this run's calls (counts from before they named it are
    batch-one counts)."""
    counted = []
    count_flops = gpu_speed.count_flops

    def counting(model, inputs, batch):
        counted.append(batch)
        return count_flops(model, inputs, batch)

    monkeypatch.setattr(gpu_speed, "count_flops", counting)
    group = next(g for g in gpu_speed.groups(smoke=True) if g.name.startswith("HyperBF"))
    # unprofiled (--profile_modes without a mode): the profiles count no FLOPs and are checked elsewhere
    arguments = ["--device", "cpu", "--smoke", "--modes", "eager", "--tasks", "inference", "--profile_modes"]
    args = gpu_speed.parse_args(arguments)
    record = gpu_speed.measure_group(group, args, torch.device("cpu"))
    assert counted == [group.batch, group.batch], counted  # the family (eager) and the baseline
    kept = {name: {"flops": entry["flops"]} for name, entry in record["variants"].items() if "flops" in entry}
    for flops, expected in (
        (None, [group.batch] * 2),  # as counted: reused
        ({"forward": 1.0, "train": 2.0}, [group.batch] * 2),  # no batch named: counted again
        ({"forward": 1.0, "train": 2.0, "batch": group.batch + 1}, [group.batch] * 2),  # another batch
    ):
        counted.clear()
        known = kept if flops is None else {name: {"flops": flops} for name in kept}
        gpu_speed.measure_group(group, args, torch.device("cpu"), known={"variants": known})
        assert counted == ([] if flops is None else expected), (flops, counted)


# ------------------------------------------------------------------------------------------ compile workers

# HyperBF's inference and training, eager then compiled (aot_eager in smoke mode): the shortest run with a warm
# pass. The compiled pass's inference is begun by the main process as the workers start (not warmed); its
# training is the workers' share
HYPERBF_COMPILED = ["--device", "cpu", "--smoke", "--groups", "HyperBF", "--modes", "eager", "compiled",
                    "--profile_modes"]  # fmt: skip


def wait_for_workers(gpu_speed, monkeypatch) -> None:
    """Patch measure_group to wait, before each compiled pass, until the workers have made every first call they
    were given: which items a worker warms before the main process reaches them is then fixed, not a race."""
    measure = gpu_speed.measure_group

    def waiting(group, args, device, on_task=None, known=None):
        workers = getattr(args, "workers", None)
        if workers is not None and args.modes != ["eager"]:
            deadline = time.monotonic() + 600
            while not workers.idle() and time.monotonic() < deadline:
                time.sleep(0.2)
        return measure(group, args, device, on_task, known)

    monkeypatch.setattr(gpu_speed, "measure_group", waiting)


def rows(report: dict) -> dict:
    """What a run measured, without the figures that differ from run to run: (group, variant, mode, task) keys
    and each variant's fixed fields (parameters, FLOPs, implementation)."""
    measured = {}
    for name, group in report["groups"].items():
        for variant, entry in group["variants"].items():
            fixed = {
                k: entry.get(k) for k in ("params", "flops", "attn_implementation", "baseline", "skipped")
            }
            modes = {mode: sorted(entry.get(mode, {})) for mode in gpu_speed_modes() if mode in entry}
            measured[(name, variant)] = (fixed, modes)
    return measured


def gpu_speed_modes() -> tuple:
    return ("eager", "compiled", "cuda-graphs")


# two smoke runs and two worker processes: minutes on 2 cores; CI runs the failing-worker case, which goes through
# the same start, queue and pipe
@pytest.mark.slow
def test_compile_workers_warm_the_compiled_pass_and_the_run_measures_the_same_rows(
    gpu_speed, tmp_path, monkeypatch, capfd
):
    """--compile_workers 2: the workers make the compiled pass's training first calls (the inference the main
    process begins at once itself); each warmed row records the worker's own cold first call and that the main
    process's first call came after it (warm_cache), and the run measures exactly the rows a run without workers
    does. The markdown shows both figures, saying which is which."""
    plain = gpu_speed.main(
        [*HYPERBF_COMPILED, "--compile_workers", "0", "--output_dir", str(tmp_path / "plain")]
    )
    wait_for_workers(gpu_speed, monkeypatch)
    report = gpu_speed.main(
        [*HYPERBF_COMPILED, "--compile_workers", "2", "--output_dir", str(tmp_path / "warm")]
    )
    err = capfd.readouterr().err
    assert rows(report) == rows(plain), (rows(report), rows(plain))
    assert [r["compile_workers"] for r in report["runs"]] == [2] and plain["runs"][0]["compile_workers"] == 0
    (group_name,) = report["groups"]
    for variant, entry in report["groups"][group_name]["variants"].items():
        train, inference = entry["compiled"]["train"], entry["compiled"]["inference"]
        worker = train["worker"]
        assert worker["first_call_s"] > 0 and worker["workers"] == 2 and "error" not in worker, (
            variant,
            train,
        )
        assert train["warm_cache"] is True and train["median_s"] > 0, (variant, train)
        assert inference["warm_cache"] is False and "worker" not in inference, (variant, inference)
        assert all("warm_cache" not in t and "worker" not in t for t in entry["eager"].values()), entry
        assert f"warmed {group_name} / compiled / {variant} / train: " in err, err
    markdown = (tmp_path / "warm" / "gpu_speed_smoke.md").read_text()
    assert (
        "worker first call s (inf / train)" in markdown and "Compile workers (`--compile_workers`" in markdown
    )
    worker_s = report["groups"][group_name]["variants"]["HyperBF (eager)"]["compiled"]["train"]["worker"]
    assert f" (w) | – / {worker_s['first_call_s']:.2f} |" in markdown, markdown
    assert "worker first call" not in (tmp_path / "plain" / "gpu_speed_smoke.md").read_text()


# a worker whose every compile raises, or which dies at its first item: loaded as the script, patched, then run
FAILING_WORKER = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("gpu_speed", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["gpu_speed"] = module
spec.loader.exec_module(module)
def fail(*args, **kwargs):
    if {die}:
        os._exit(3)
    raise RuntimeError("a compile that fails in the worker")
module.compile_runner = fail
module.main(sys.argv[2:])
"""


# CI runs "raises"; "dies" (the worker exits at its first item) is the long variant
@pytest.mark.parametrize("die", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["raises", "dies"])
def test_a_failing_compile_worker_is_reported_and_the_run_completes(
    gpu_speed, tmp_path, monkeypatch, capfd, die
):
    """A worker's failed item is reported on stderr (run.log) with the item's name and recorded beside the row as
    failed; a worker that dies is reported with its exit status. The run measures every row all the same."""
    command = gpu_speed.worker_command
    monkeypatch.setattr(
        gpu_speed,
        "worker_command",
        lambda args, index: [sys.executable, "-c", FAILING_WORKER.format(die=die), *command(args, index)[1:]],
    )
    wait_for_workers(gpu_speed, monkeypatch)
    # What is checked is the worker's failure, not this process's compiles: its "compiled" runners are the models
    # themselves, which keeps the test to the worker's start-up instead of six aot_eager compiles beside it.
    monkeypatch.setattr(gpu_speed, "compile_runner", lambda model, mode, backend, fullgraph=True: model)
    # compiled only (no eager pass): the workers start at once
    arguments = [*HYPERBF_COMPILED[:-4], "compiled", "--profile_modes", "--compile_workers", "1"]
    arguments += ["--output_dir", str(tmp_path)]
    report = gpu_speed.main(arguments)
    err = capfd.readouterr().err
    assert report["complete"] is True, report
    (group_name,) = report["groups"]
    variants = report["groups"][group_name]["variants"]
    for entry in variants.values():
        assert all(entry["compiled"][task]["median_s"] > 0 for task in ("inference", "train")), entry
    first = f"{group_name} / compiled / HyperBF (eager) / train"
    if die:
        assert f"[compile worker 0] stopped while warming {first}" in err and "exit status 3" in err, err
        assert "error" in variants["HyperBF (eager)"]["compiled"]["train"]["worker"], variants
    else:
        for variant, entry in variants.items():
            message = (
                f"{group_name} / compiled / {variant} / train: failed, not warmed (RuntimeError: a compile"
            )
            assert message in err, err
            assert entry["compiled"]["train"]["worker"]["error"].startswith("RuntimeError"), entry
            assert entry["compiled"]["train"]["warm_cache"] is False, entry
    assert (
        " | failed / " not in (tmp_path / "gpu_speed_smoke.md").read_text()
    )  # training is the second figure
    assert "/ failed |" in (tmp_path / "gpu_speed_smoke.md").read_text()


def test_compile_workers_start_after_the_eager_passes_and_the_cold_compile_time_group(
    gpu_speed, tmp_path, monkeypatch
):
    """The T = 24 compile-time group is never warmed and its compiled pass runs before the workers start (cold and
    uncontended); they start before the next compiled pass. No measuring here: the passes are noted."""
    events = []

    def note(group, args, device, on_task=None, known=None):
        events.append((group.name.split(" (")[0], args.modes[0]))

    monkeypatch.setattr(gpu_speed, "measure_group", note)
    monkeypatch.setattr(
        gpu_speed.CompileWorkers, "start", lambda self: events.append(("workers", self.count))
    )
    arguments = [
        "--device",
        "cpu",
        "--smoke",
        "--groups",
        "HyperBF",
        "sudoku",
        "--modes",
        "eager",
        "compiled",
    ]
    gpu_speed.main([*arguments, "--compile_workers", "3", "--output_dir", str(tmp_path)])
    assert events == [
        ("HyperBF cifar", "eager"),
        ("Hyper-SET sudoku", "eager"),
        ("Hyper-SET sudoku", "compiled"),
        ("workers", 3),
        ("HyperBF cifar", "compiled"),
    ], events
    items = gpu_speed.warm_items(
        gpu_speed.plan_passes(gpu_speed.groups(smoke=True), ["eager", "compiled"], ["inference"], {}),
        torch.device("cpu"),
    )
    assert items and not any("sudoku" in item.group for item in items), items


def test_plan_shows_which_compiles_the_workers_warm(gpu_speed, capsys):
    committed = str(SCRIPT.parent / "results" / "gpu_speed.json")
    gpu_speed.main(["--plan", "--resume", committed, "--compile_workers", "4"])
    out = capsys.readouterr().out
    sudoku = out.split("compiled Hyper-SET sudoku")[1].split("\n 9.")[0]
    assert "not warmed: compiled cold by this process before the compile workers start" in sudoku, sudoku
    assert "warmed ahead by the compile workers (4)" in out.split("\n 9.")[1], out
    listed = out.split("compile workers: 4, warming ")[1].splitlines()
    assert (
        "Hyper-SET cifar10-small, 224²/16" in listed[1]
        and "/ compiled / Hyper-SET (eager) / inference" in listed[1]
    )
    assert not any("sudoku" in line for line in listed), listed
    gpu_speed.main(["--plan", "--device", "cpu", "--smoke"])  # smoke: none by default
    assert "compile workers: none (--compile_workers 0)" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["-1", "two", "1.5", ""])
def test_a_bad_compile_workers_value_is_refused_before_any_work(gpu_speed, tmp_path, capsys, value):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stopped:
        gpu_speed.main([*SUDOKU_EAGER, "--compile_workers", value, "--output_dir", str(out)])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "argument --compile_workers: must be an integer >= 0" in error, error
    assert (repr(value) if value != "-1" else "got -1") in error, error
    assert not out.exists()
