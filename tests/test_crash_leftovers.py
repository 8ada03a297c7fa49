"""What a killed or concurrent command leaves, and what the next one does with it: a training run, an export, a
conversion and an inspect hold a lock on their output folder (`run_folder.locked_output_dir`) and `publish` replaces
a folder only with --overwrite_output_dir; a run killed inside `publish` is undone, or recognised as finished, by
the next one; `export` and `inspect` stage their files beside the output (`interrupt.staging_folder`), which SIGTERM
removes as Ctrl-C does and a rerun removes after a SIGKILL; a stopped `inspect` leaves a folder's old report whole.

Every kill is placed at one exact point of the real command (a patched function of the process itself sends the
signal), in a fresh process: the default SIGTERM handler of the code before these fixes would end pytest itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures import cli_config, synthetic_imixer_checkpoint

from energyformers.training import run_folder
from energyformers.training.cli import CommandFailed

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
TINY = [
    "--model", "hyperset", "--dataset", "digits", "--num_threads", "1", "--disable_tqdm", "--num_predictions", "0",
    "--max_steps", "2", "--save_steps", "1", "--eval_steps", "1", "--max_train_samples", "16",
    "--max_eval_samples", "8", "--max_test_samples", "8", "--config", *cli_config("hyperset"),
]  # fmt: skip

# Runs `energyformers <argv>` after `PATCH` (Python source, with `die(sig)`: the process signals itself).
PROGRAM = """
import os, pathlib, signal, sys
from energyformers.training import cli, export, inspect, run_folder
die = lambda sig=signal.SIGKILL: os.kill(os.getpid(), sig)
{patch}
sys.exit(cli.main(sys.argv[1:]))
"""


def energyformers(argv: list[str], cwd: Path, patch: str = "") -> subprocess.CompletedProcess:
    """`energyformers ARGV` in a fresh process, after `patch`; its exit status as the shell gives it (128 + signal)."""
    program = [sys.executable, "-c", PROGRAM.format(patch=patch), *[str(a) for a in argv]]
    done = subprocess.run(program, capture_output=True, text=True, env=ENV, cwd=cwd, timeout=300)
    done.returncode = done.returncode if done.returncode >= 0 else 128 - done.returncode
    return done


def siblings(folder: Path) -> list[str]:
    """The entries beside `folder` whose names start with its own (hidden ones too), sorted."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.lstrip(".").startswith(folder.name))


# a host name no machine running this test has (`socket.gethostname` never returns one with this ending)
OTHER_HOST = "another-machine.invalid"


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_second_run_on_the_same_output_dir_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    """While one run trains, a second one with the same --output_dir (either loop) is one usage-error line naming
    the folder, status 2, and writes nothing; the first run finishes into its folder and leaves no lock file."""
    from transformers import TrainerCallback

    from energyformers.training import train

    out = tmp_path / "race"
    second: dict[str, subprocess.CompletedProcess] = {}

    class StartAnother(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            for command in ("train", "train-accelerate"):
                argv = [command, "--output_dir", out, *TINY, "--seed", "7"]
                second[command] = energyformers(argv, tmp_path)

    assert train.main(["--output_dir", str(out), *TINY], callbacks=[StartAnother()]) == 0
    for command, done in second.items():
        expected = f"energyformers {command}: error: --output_dir {out}: another command is using this folder"
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(expected), (
            command,
            done.returncode,
            done.stderr[-2000:],
        )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"]["seed"] != 7, metrics["recipe"]["seed"]  # the first run's, not the second's
    assert siblings(out) == ["race"], siblings(out)


def test_publish_replaces_a_non_empty_folder_only_when_allowed(tmp_path: Path) -> None:
    """A folder that appeared at `--output_dir` while the run trained stays, and the error names the finished
    stage; with overwrite (--overwrite_output_dir) it is replaced, and no hidden copy is left."""
    stage, out = tmp_path / "work" / "final", tmp_path / "out"
    stage.mkdir(parents=True)
    (stage / "config.json").write_text("new\n")
    out.mkdir()
    (out / "config.json").write_text("someone else's\n")
    with pytest.raises(CommandFailed, match="--overwrite_output_dir was not given; the finished model is in"):
        run_folder.publish(stage, out)
    assert (out / "config.json").read_text() == "someone else's\n" and (stage / "config.json").is_file()
    run_folder.publish(stage, out, overwrite=True)
    assert (out / "config.json").read_text() == "new\n" and not stage.exists()
    assert siblings(out) == ["out"], siblings(out)


def test_a_run_killed_inside_publish_is_recognised_by_the_next_one(tmp_path: Path) -> None:
    """SIGKILL right after `publish` (before the checkpoints are removed): the next run says the checkpoints are a
    finished run's, not an interrupted one's. SIGKILL between publish's two renames, replacing that folder: the
    next run puts the previous folder back (one line naming the hidden copy) and refuses as for any folder there."""
    out = tmp_path / "run"
    work = tmp_path / "run.checkpoints"
    after_publish = (
        "publish = run_folder.publish\nrun_folder.publish = lambda *a, **k: (publish(*a, **k), die())"
    )
    killed = energyformers(["train", "--output_dir", out, *TINY], tmp_path, after_publish)
    assert killed.returncode == 128 + signal.SIGKILL, killed.stderr[-2000:]
    assert (out / "metrics.json").is_file() and any(work.glob("checkpoint-*")), siblings(out)
    published = (out / "metrics.json").read_bytes()

    again = energyformers(["train", "--output_dir", out, "--overwrite_output_dir", *TINY], tmp_path)
    expected = (
        f"{work} holds checkpoints of a run that finished (its model folder is {out}); delete the folder"
    )
    assert again.returncode == 2 and expected in again.stderr, again.stderr[-2000:]

    import shutil

    shutil.rmtree(work)
    between = (
        "rename = pathlib.Path.rename\n"
        "pathlib.Path.rename = lambda self, target: die() if self.name == 'final' else rename(self, target)"
    )
    killed = energyformers(["train", "--output_dir", out, "--overwrite_output_dir", *TINY], tmp_path, between)
    hidden = [name for name in siblings(out) if ".old-" in name]
    assert killed.returncode == 128 + signal.SIGKILL and not out.exists() and len(hidden) == 1, (
        killed.returncode,
        siblings(out),
    )

    # --resume without a checkpoint to resume from: refused at once by the code before this fix, which left the copy
    restored = energyformers(["train", "--output_dir", out, "--resume", *TINY], tmp_path)
    note = f"warning: restored {out} from {hidden[0]}"
    refusal = f"error: --output_dir {out}: the folder exists and is not empty; pass --overwrite_output_dir"
    assert restored.returncode == 2 and note in restored.stderr and refusal in restored.stderr, (
        restored.stderr
    )
    assert (out / "metrics.json").read_bytes() == published and not any(
        ".old-" in n for n in siblings(out)
    ), siblings(out)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run folder."""
    from energyformers.training import train

    out = tmp_path_factory.mktemp("trained") / "run"
    assert train.main(["--output_dir", str(out), *TINY]) == 0
    return out


def test_a_stopped_export_leaves_no_staging_folder_and_a_rerun_removes_a_killed_ones(
    trained: Path, tmp_path: Path
) -> None:
    """SIGTERM while `export` writes its staging folder: status 143, nothing left beside the output (as for
    Ctrl-C). The staging folder of an export killed by SIGKILL (its pid gone) is removed by the next export to the
    same folder, which names it; one whose owner cannot be told (no pid in its name) is named and kept."""
    out = tmp_path / "exported"
    stop = "card = export.render_model_card\nexport.render_model_card = lambda *a, **k: die(signal.SIGTERM)"
    stopped = energyformers(["export", trained, out], tmp_path, stop)
    assert stopped.returncode == 128 + signal.SIGTERM and siblings(out) == [], (
        stopped.returncode,
        siblings(out),
    )

    killed = tmp_path / f".exported.partial-{dead_pid()}@{socket.gethostname()}-k1ll3d00"
    unknown = tmp_path / ".exported.partial-8charsxx"
    elsewhere = tmp_path / f".exported.partial-{os.getpid()}@{OTHER_HOST}-3ls3wh3r"
    for folder in (killed, unknown, elsewhere):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    done = energyformers(["export", trained, out], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert siblings(out) == sorted([unknown.name, elsewhere.name, "exported"]), siblings(out)
    assert f"warning: removed {killed}" in done.stderr and f"warning: {unknown} looks left" in done.stderr, (
        done.stderr
    )
    # another machine's: its pid says nothing here (this test's own pid, alive), so it is named and kept
    assert f"warning: {elsewhere} looks left" in done.stderr, done.stderr


def test_publish_names_its_copy_by_pid_and_host_and_another_machines_copy_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`publish` hides the folder it replaces as `.<out>.old-<pid>@<host>`, as staging folders are named. The repair
    (`restore_interrupted_publish`) puts back a copy of a process of this machine that is gone, also one named
    `.<out>.old-<pid>` by the version before hosts were in the name; it leaves a copy of a running process of this
    machine silently, and one of another machine with one warning line naming it, whatever its pid: a live process
    there cannot be told from a dead one here."""
    from energyformers.training import interrupt

    stage, out = tmp_path / "stage", tmp_path / "out"
    for folder, text in ((stage, "new"), (out, "old")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
    hidden: list[str] = []
    remove = interrupt.remove_path
    monkeypatch.setattr(interrupt, "remove_path", lambda path: (hidden.append(path.name), remove(path)))
    run_folder.publish(stage, out, overwrite=True)
    assert hidden == [f".out.old-{os.getpid()}@{socket.gethostname()}"], hidden
    assert (out / "config.json").read_text() == "new" and siblings(out) == ["out"], siblings(out)

    def leftover(name: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(name)
        return path

    ours_running = leftover(f".gone.old-{os.getpid()}@{socket.gethostname()}")
    elsewhere = leftover(f".gone.old-{dead_pid()}@{OTHER_HOST}")
    gone = tmp_path / "gone"
    assert not run_folder.restore_interrupted_publish(gone)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"warning: {elsewhere} looks left by a command of another"
    ), lines
    assert not gone.exists() and ours_running.is_dir() and elsewhere.is_dir(), siblings(gone)

    names = [f".gone.old-{dead_pid()}@{socket.gethostname()}", f".gone.old-{dead_pid()}"]  # now, and before
    for name in names:
        copy = leftover(name)
        assert run_folder.restore_interrupted_publish(gone)
        assert f"warning: restored {gone} from {name}" in capsys.readouterr().err
        assert (gone / "config.json").read_text() == name and not copy.exists(), siblings(gone)
        shutil.rmtree(gone)


def export_or_convert(
    command: str, trained: Path, tmp_path: Path, out: Path
) -> tuple[Callable, list[str], str]:
    """`energyformers export` (of the trained run) or `convert` (of a synthetic official iMixer checkpoint) writing
    `out`: the command's `main`, its arguments (without --overwrite) and how its errors name the folder."""
    from energyformers.training import convert_cli, export

    if command == "export":
        return export.main, [str(trained), str(out)], "OUT_DIR"
    _, checkpoint, config = synthetic_imixer_checkpoint(tmp_path / "official")
    argv = ["--source", "imixer", str(checkpoint), "--official-config", str(config), "--output_dir", str(out)]
    return convert_cli.main, argv, "--output_dir"


@pytest.mark.parametrize(
    ("command", "refusal"),
    [
        ("export", "OUT_DIR {out}: the folder exists and is not empty; pass --overwrite"),
        ("convert", "--output_dir {out}: the folder exists and is not empty; pass --overwrite"),
    ],
)
def test_export_and_convert_killed_between_their_two_renames_are_repaired_by_the_next_one(
    command: str, refusal: str, trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What an export or a conversion killed between the two renames that replace its output folder leaves: no
    output folder, the previous one in `.<out>.old-<pid>@<host>` of a dead process. The next command to it puts it
    back (one line naming the copy) and refuses as for any folder there without --overwrite, leaving it as it was;
    with --overwrite it then replaces it, leaving no copy beside it."""
    out = tmp_path / "written"
    main, argv, _ = export_or_convert(command, trained, tmp_path, out)
    assert main(argv) == 0
    previous = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    hidden = out.with_name(f".{out.name}.old-{dead_pid()}@{socket.gethostname()}")
    out.rename(hidden)
    capsys.readouterr()

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        f"warning: restored {out} from {hidden.name}" in err and f"error: {refusal.format(out=out)}" in err
    ), err
    assert siblings(out) == ["written"], siblings(out)
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == previous

    out.rename(hidden)
    assert main([*argv, "--overwrite"]) == 0
    assert f"warning: restored {out} from {hidden.name}" in capsys.readouterr().err
    assert siblings(out) == ["written"] and (out / "config.json").is_file(), siblings(out)


@pytest.mark.parametrize("command", ["train", "export", "convert", "inspect"])
def test_a_command_killed_after_moving_its_folder_in_is_repaired_by_a_rerun_without_overwrite(
    command: str, trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `train`, `export` or `convert` killed between `publish`'s second rename and the removal of the folder it
    replaced leaves: the new folder in place, the previous one in `.<out>.old-<pid>@<host>` of a dead process. The
    next command to that folder (an `inspect` too) without --overwrite (--overwrite_output_dir) removes the copy (one
    line naming it), then refuses as for any folder there (the usual one line, status 2): nothing is left hidden
    beside the folder, which stays as it was. The code before this check refused at once and left the copy."""
    from energyformers.training import inspect, train

    out = tmp_path / "written"
    out.mkdir()
    (out / "config.json").write_text("the new folder\n")
    hidden = out.with_name(f".{out.name}.old-{dead_pid()}@{socket.gethostname()}")
    hidden.mkdir()
    (hidden / "config.json").write_text("the previous folder\n")
    if command in ("train", "inspect"):
        main, first = (train.main, TINY) if command == "train" else (inspect.main, ["--landscape"])
        argv, flag, overwrite_flag = (
            [*first, "--output_dir", str(out)],
            "--output_dir",
            "--overwrite_output_dir",
        )
    else:
        main, argv, flag = export_or_convert(command, trained, tmp_path, out)
        overwrite_flag = "--overwrite"
    capsys.readouterr()

    status = main(argv)
    err = capsys.readouterr().err
    refusal = (
        f"energyformers {command}: error: {flag} {out}: the folder exists and is not empty; pass {overwrite_flag} "
        "or choose another folder"
    )
    assert status == 2 and refusal in err.splitlines(), (status, err)
    assert (
        f"warning: removed {hidden}, the previous written a run killed while replacing it had left" in err
    ), err
    assert siblings(out) == ["written"], siblings(out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json"], sorted(out.iterdir())
    assert (out / "config.json").read_text() == "the new folder\n"


@pytest.mark.parametrize("command", ["export", "convert"])
def test_export_and_convert_are_refused_while_another_command_holds_the_folder(
    command: str, trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """While a command holds an output folder's lock (as `train` does for its whole run), an export or a conversion
    to that folder, one to replace (--overwrite) with a copy a killed command left beside it, is one usage-error line
    naming the folder, status 2: the folder, the copy and everything else beside it stay as they were."""
    out = tmp_path / "taken"
    out.mkdir()
    (out / "config.json").write_text("the old folder\n")
    copy = tmp_path / f".taken.old-{dead_pid()}@{socket.gethostname()}"
    copy.mkdir()
    main, argv, flag = export_or_convert(command, trained, tmp_path, out)
    argv = [*argv, "--overwrite"]
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    capsys.readouterr()
    with run_folder.locked_output_dir(out):
        assert main(argv) == 2
        after = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    lines = capsys.readouterr().err.strip().splitlines()
    expected = f"energyformers {command}: error: {flag} {out}: another command is using this folder"
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert after == sorted([*before, "taken.lock"]), (before, after)
    assert (out / "config.json").read_text() == "the old folder\n" and copy.is_dir()


@pytest.fixture
def reversed_pair(tmp_path: Path) -> tuple[list[str], Path, dict[str, bytes]]:
    """`convert --reverse` of a converted synthetic iMixer folder over an official file and JSON already there: its
    arguments (with --overwrite), the file, and the previous pair's bytes by name."""
    from energyformers.training import convert_cli

    _, checkpoint, config = synthetic_imixer_checkpoint(tmp_path / "official")
    folder = tmp_path / "ours"
    argv = [
        "--source",
        "imixer",
        str(checkpoint),
        "--official-config",
        str(config),
        "--output_dir",
        str(folder),
    ]
    assert convert_cli.main(argv) == 0
    out = tmp_path / "back.safetensors"
    previous = {out.name: b"the previous weights\n", "back.json": b"the previous kwargs\n"}
    for name, content in previous.items():
        (tmp_path / name).write_bytes(content)
    return (
        ["--reverse", "--source", "imixer", str(folder), "--output", str(out), "--overwrite"],
        out,
        previous,
    )


def test_a_reverse_conversion_is_refused_while_another_command_holds_its_output(
    reversed_pair: tuple[list[str], Path, dict[str, bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    """While a command holds the lock of `convert --reverse`'s --output (another reverse conversion writing it), a
    second one is one usage-error line naming the file, status 2, as `train`, `export`, `convert` and `inspect`
    refuse theirs: the file and its JSON stay as they were and nothing else is written beside them."""
    from energyformers.training import convert_cli

    argv, out, previous = reversed_pair
    before = siblings(out.with_suffix(""))
    capsys.readouterr()
    with run_folder.locked_output_dir(out, flag="--output", what="file"):
        status = convert_cli.main(argv)
        after = siblings(out.with_suffix(""))
    lines = capsys.readouterr().err.strip().splitlines()
    expected = f"energyformers convert: error: --output {out}: another command is using this file (it holds "
    assert status == 2 and len(lines) == 1 and lines[0].startswith(expected), (status, lines)
    assert after == sorted([*before, "back.safetensors.lock"]), (before, after)
    assert {name: (out.parent / name).read_bytes() for name in previous} == previous


def test_a_reverse_conversion_that_fails_while_moving_its_files_in_leaves_the_previous_pair(
    reversed_pair: tuple[list[str], Path, dict[str, bytes]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`convert --reverse --overwrite` whose JSON cannot be moved into place (a full disk there), after its weights
    were: the previous file and JSON stay, byte for byte, nothing is left beside them, and the error is reported.
    The two files never mix two conversions."""
    from energyformers.training import convert_cli

    argv, out, previous = reversed_pair
    before = siblings(out.with_suffix(""))
    sidecar = out.with_suffix(".json")
    moved: list[str] = []

    def failing(move: Callable) -> Callable:
        def wrapper(src, dst, *args, **kwargs):
            if Path(dst) == sidecar and ".partial-" in str(src):  # the new JSON, from the staging folder
                raise OSError(28, "No space left on device", str(dst))
            moved.append(Path(dst).name)
            return move(src, dst, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(os, "rename", failing(os.rename))
    monkeypatch.setattr(os, "replace", failing(os.replace))
    capsys.readouterr()
    status = convert_cli.main(argv)
    err = capsys.readouterr().err
    expected = f"energyformers convert: error: no space left on device writing in {out.parent};"
    assert status == 1 and err.startswith(expected), (status, err)
    assert out.name in moved, moved  # the weights had been moved in before the JSON failed
    assert {name: (out.parent / name).read_bytes() for name in previous} == previous
    assert siblings(out.with_suffix("")) == before, (before, siblings(out.with_suffix("")))


def test_an_inspect_is_refused_while_another_one_writes_the_same_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two `inspect`s into one folder at once: the second, started while the first draws, is one usage-error line
    naming the folder, status 2, as `train`, `export` and `convert` refuse theirs, and writes nothing; the first
    finishes its report and leaves no lock file."""
    from energyformers.training import inspect

    out = tmp_path / "report"
    argv = ["--landscape", "--output_dir", str(out), "--overwrite_output_dir"]
    second: list[subprocess.CompletedProcess] = []
    plot_landscape = inspect.plot_landscape

    def start_another(result, path):
        second.append(energyformers(["inspect", *argv], tmp_path))
        plot_landscape(result, path)

    monkeypatch.setattr(inspect, "plot_landscape", start_another)
    assert inspect.main(argv) == 0, capsys.readouterr().err[-2000:]
    (done,) = second
    lines = done.stderr.strip().splitlines()
    expected = f"energyformers inspect: error: --output_dir {out}: another command is using this folder"
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(expected), (
        done.returncode,
        done.stderr[-2000:],
    )
    written = sorted(p.name for p in out.iterdir())
    assert written == ["energy_landscape.png", "inspect.json"], written
    assert siblings(out) == ["report"], siblings(out)


@pytest.mark.parametrize("previous", [["config.json"], []], ids=["non-empty", "empty"])
def test_an_inspect_puts_back_a_folder_a_killed_publish_had_moved_aside(
    previous: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A train, export or conversion killed between `publish`'s two renames left no folder, the previous one in
    `.<out>.old-<pid>@<host>` of a dead process. An `inspect` into that folder puts it back first (one line naming
    the copy), then refuses as for any folder there without --overwrite_output_dir (status 2), or, the folder being
    empty, writes its report into it; nothing is left hidden beside it. The code before this wrote the report into
    a new folder and left the copy, which the next train, export or conversion there would remove as replaced."""
    from energyformers.training import inspect

    out = tmp_path / "report"
    hidden = out.with_name(f".{out.name}.old-{dead_pid()}@{socket.gethostname()}")
    hidden.mkdir()
    for name in previous:
        (hidden / name).write_text("the previous folder\n")
    capsys.readouterr()
    status = inspect.main(["--landscape", "--output_dir", str(out)])
    err = capsys.readouterr().err
    assert f"warning: restored {out} from {hidden.name}" in err, (status, err)
    assert siblings(out) == ["report"], siblings(out)
    if previous:
        refusal = (
            f"energyformers inspect: error: --output_dir {out}: the folder exists and is not empty; pass "
            "--overwrite_output_dir or choose another folder"
        )
        assert status == 2 and refusal in err.splitlines(), (status, err)
        assert sorted(p.name for p in out.iterdir()) == previous, sorted(out.iterdir())
    else:
        assert status == 0, err
        written = sorted(p.name for p in out.iterdir())
        assert written == ["energy_landscape.png", "inspect.json"], written


def test_a_stopped_inspect_leaves_the_old_report_whole(tmp_path: Path) -> None:
    """`inspect` into a folder that holds a report, stopped (SIGTERM) after drawing a new figure: the folder keeps
    the old report (figure and inspect.json) byte for byte and nothing is left beside it. Stopped while it moves
    the new report into place: it finishes the move first (the new report whole), then exits 143."""
    out = tmp_path / "report"
    argv = ["inspect", "--landscape", "--output_dir", out, "--overwrite_output_dir"]
    first = energyformers(argv, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    old = {name: (out / name).read_bytes() for name in ("energy_landscape.png", "inspect.json")}

    drawn = "pathlib.Path(path).write_bytes(b'new')"
    stop = f"inspect.plot_landscape = lambda result, path: ({drawn}, die(signal.SIGTERM))"
    stopped = energyformers(argv, tmp_path, stop)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    now = {name: (out / name).read_bytes() for name in sorted(p.name for p in out.iterdir())}
    assert now == old, sorted(now)
    assert siblings(out) == ["report"], siblings(out)

    during_move = "replace = os.replace\nos.replace = lambda a, b: (die(signal.SIGTERM), replace(a, b))"
    new_figure = f"inspect.plot_landscape = lambda result, path: {drawn}"
    moved = energyformers(argv, tmp_path, f"{new_figure}\n{during_move}")
    assert moved.returncode == 128 + signal.SIGTERM, moved.stderr[-2000:]
    report = json.loads((out / "inspect.json").read_text())
    assert (out / "energy_landscape.png").read_bytes() == b"new" and report["figures"] == [
        "energy_landscape.png"
    ]
    assert siblings(out) == ["report"], siblings(out)


@pytest.mark.parametrize("loop", ["train", "accelerate_loop"])
def test_an_in_process_run_refused_after_taking_the_lock_releases_it(
    loop: str, tmp_path: Path, capsys
) -> None:
    """A run that ends by a usage error after it took the output folder's lock (here `check_schedule`, on
    arguments a caller changed after parsing) leaves no lock file, and the folder can be locked again at once
    (an in-process caller: a notebook, `train.main`)."""
    import importlib

    from energyformers.training.cli import run_command

    module = importlib.import_module(f"energyformers.training.{loop}")
    out = tmp_path / "out"
    args = module.parse(["--output_dir", str(out), *TINY])
    args.run.cooldown_epochs, args.run.lr_scheduler_type = 1, "linear"  # refused by `check_schedule`
    # as `main` runs it (`run_command` maps the refusal to status 2), with the changed arguments
    assert run_command("train", lambda argv: args, module.run, []) == 2
    assert "--lr_scheduler_type linear" in capsys.readouterr().err
    assert siblings(out) == [], siblings(out)
    run_folder.lock_output_dir(out.resolve())  # no Timeout: nobody holds it
    run_folder.release_output_dir(out.resolve())
    assert siblings(out) == [], siblings(out)


def test_a_refused_publish_puts_the_tracker_files_back_in_the_work_folder(
    tmp_path: Path, monkeypatch
) -> None:
    """`finish_run` whose publish is refused (a folder appeared at `--output_dir`) leaves the trackers' files in the
    work folder's `runs/`, where a `--resume --overwrite_output_dir` goes on writing them, not in the stage that the
    resumed run's save replaces."""
    from types import SimpleNamespace

    out, work = tmp_path / "out", tmp_path / "out.checkpoints"
    stage = work / "final"
    stage.mkdir(parents=True)
    (stage / "config.json").write_text("{}")
    events = work / "runs" / "out" / "events.out.tfevents.1"
    events.parent.mkdir(parents=True)
    events.write_bytes(b"history")
    out.mkdir()
    (out / "note.txt").write_text("appeared while the run trained")
    monkeypatch.setattr(run_folder, "write_run_folder", lambda *args: {})
    result = SimpleNamespace(args=SimpleNamespace(run=SimpleNamespace(overwrite_output_dir=False)))
    with pytest.raises(CommandFailed, match="appeared while the run trained"):
        run_folder.finish_run(stage, result, out, work)
    assert events.read_bytes() == b"history"
    assert not (stage / "runs").exists(), sorted(p.name for p in stage.iterdir())
    assert sorted(p.name for p in out.iterdir()) == ["note.txt"]


# The steps of `publish_files` for the weights and their JSON, in order: a kill after the first `killed_after` of
# them leaves what `killed_publish` lays out. Before the fourth (both new files in) the publish is unfinished.
PUBLISH_STEPS = [
    "weights aside",
    "JSON aside",
    "weights in",
    "JSON in",
    "old weights removed",
    "old JSON removed",
]


def killed_publish(out: Path, previous: dict[str, bytes] | None, killed_after: int) -> dict[str, bytes]:
    """Lay out beside `out` what `convert --reverse` killed (SIGKILL: a process that is gone) inside
    `publish_files` after `killed_after` of `PUBLISH_STEPS` leaves: its staging folder, marked as publishing, with
    the new files not yet moved in, the previous files (`previous`, None: there were none) moved aside or still in
    place, the new ones moved in. Returns the new pair's bytes by name."""
    from energyformers.training.interrupt import PUBLISHING_MARK

    pid, host = dead_pid(), socket.gethostname()
    sidecar = out.with_suffix(".json")
    new = {out.name: b"the new weights\n", sidecar.name: b"the new kwargs\n"}
    staging = out.with_name(f".{out.name}.partial-{pid}@{host}-k1ll3d00")
    staging.mkdir()
    (staging / PUBLISHING_MARK).touch()
    for name, content in new.items():
        (staging / name).write_bytes(content)
    for step, target in enumerate([out, sidecar, out, sidecar, out, sidecar]):
        old = target.with_name(f".{target.name}.old-{pid}@{host}")
        if step >= killed_after:
            break
        if step < 2 and previous is not None:
            target.rename(old)
        elif 2 <= step < 4:
            (staging / target.name).rename(target)
        elif step >= 4 and previous is not None:
            old.unlink()
    return new


def pair(out: Path) -> dict[str, bytes]:
    """The weights and JSON at `out`, by name (those that are there)."""
    return {p.name: p.read_bytes() for p in (out, out.with_suffix(".json")) if p.exists()}


@pytest.mark.parametrize("had_previous", [True, False], ids=["over-a-pair", "new-file"])
@pytest.mark.parametrize("killed_after", range(len(PUBLISH_STEPS) + 1))
@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "no-overwrite"])
def test_a_reverse_conversion_killed_while_moving_its_files_in_is_undone_as_a_pair_by_the_next_one(
    killed_after: int,
    had_previous: bool,
    overwrite: bool,
    reversed_pair: tuple[list[str], Path, dict[str, bytes]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What `convert --reverse` killed at any point of moving its weights and JSON in leaves, the next conversion to
    the same --output repairs as one pair, with or without --overwrite, before it refuses or writes: both files back
    to the previous pair (or none) while the new one was not all in, else the new pair, never the weights of one
    beside the JSON of the other; the old copies and the staging folder are removed. A rerun without --overwrite is
    then refused for the file that is there (status 2), one with --overwrite stopped (Ctrl-C) before it writes
    leaves the repaired pair."""
    from energyformers.training import convert_cli
    from energyformers.training.convert import write

    argv, out, previous = reversed_pair
    if not had_previous:
        for name in previous:
            (out.parent / name).unlink()
    new = killed_publish(out, previous if had_previous else None, killed_after)
    expected = (
        new if killed_after >= PUBLISH_STEPS.index("JSON in") + 1 else (previous if had_previous else {})
    )

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(write, "save_file", interrupted)
    capsys.readouterr()
    status = convert_cli.main(argv if overwrite else [a for a in argv if a != "--overwrite"])
    err = capsys.readouterr().err
    refused = not overwrite and bool(expected)
    assert status == (2 if refused else 130), (status, err)
    if refused:
        assert f"error: --output {out}: the file exists; pass --overwrite" in err, err
    assert pair(out) == expected, (PUBLISH_STEPS[:killed_after], pair(out), err)
    assert siblings(out.with_suffix("")) == sorted(expected), siblings(out.with_suffix(""))


@pytest.mark.parametrize("placed", ["back.safetensors", "back.json"])
def test_a_reverse_conversion_sigkilled_after_moving_a_file_in_leaves_one_whole_pair_after_the_next_one(
    placed: str, reversed_pair: tuple[list[str], Path, dict[str, bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    """The real `convert --reverse --overwrite` SIGKILLed right after it moved its weights in (the JSON not yet),
    or its JSON too: the next conversion to that --output, without --overwrite, finds the previous pair whole in the
    first case, the new one in the second (then refuses, status 2), with nothing else beside them."""
    from energyformers.training import convert_cli

    argv, out, previous = reversed_pair
    patch = f"""
real = os.rename
def rename(src, dst, *args, **kwargs):
    real(src, dst, *args, **kwargs)
    if pathlib.Path(dst).name == {placed!r} and ".partial-" in str(src):
        die()
os.rename = rename
"""
    killed = energyformers(["convert", *argv], out.parent, patch)
    assert killed.returncode == 128 + signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    assert any(".partial-" in name for name in siblings(out.with_suffix(""))), siblings(out.with_suffix(""))
    capsys.readouterr()
    status = convert_cli.main([a for a in argv if a != "--overwrite"])
    err = capsys.readouterr().err
    assert status == 2 and f"error: --output {out}: the file exists; pass --overwrite" in err, (status, err)
    after = pair(out)
    if placed == out.name:
        assert after == previous, (after, err)
    else:  # both new: the official model's JSON, the weights those of the model folder
        assert sorted(after) == sorted(previous), (after, err)
        assert all(after[name] != previous[name] for name in previous), (after, err)
        assert '"constructor"' in after["back.json"].decode(), after
    assert siblings(out.with_suffix("")) == sorted(previous), siblings(out.with_suffix(""))
