"""Stopping a training run on request: SIGTERM (preemption, a scheduler's stop) or SIGINT (Ctrl-C).

Both loops treat the two signals alike: the step in progress finishes, a checkpoint is saved in
`<output_dir>.checkpoints/`, and the command prints how to continue (`--resume`) and exits with 128 + the signal
number (143, 130). A second Ctrl-C stops at once (`KeyboardInterrupt`) for whoever cannot wait for the step.
An evaluation, during training or the final ones after it, ends at its next batch (`EvaluationStopped`),
abandoned: it can take longer than many training steps.

With several processes every rank handles the signals too, and the ranks decide together: after each optimizer
step they all-reduce one flag (`StopRequest.should_stop`), so all of them stop at the same point and save the
checkpoint together, whichever rank (or all, as a launcher forwards the signal) was signalled. In an evaluation
they do so only every few batches (`EvaluationCheck`), as many as take about `EVALUATION_CHECK_S` seconds on the
slowest rank.

A command without steps to finish (`export`, `convert`, `inspect`) stops at once instead: SIGTERM raises as Ctrl-C
does (`stopping_at_once`), so the staging folder it writes its output in (`staging_folder`) is removed either way.
Every command that replaces a folder (`train`, `export`, `convert`) holds the folder's lock (`locked_output_dir`)
while it repairs what a kill between `publish`'s two renames left (`restore_interrupted_publish`) and renames the
finished stage onto it (`publish`); `inspect` holds it while it repairs the same, draws its report and moves it into
the folder, and `convert --reverse` the lock of its file while it repairs, as one pair, what a kill inside
`publish_files` left (`restore_interrupted_publish_files`), stages the file and its JSON and moves both in
(`publish_files`). Each checks whether it may replace what is there only after its repair, which may change it
(`publish_leftovers`: whether there is anything to repair). What a killed command left beside a folder is judged by one rule (`left_by`): removed or put back when its process, named
in the leftover's name with its host, is gone; left, with a warning, when it is another machine's.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class EvaluationStopped(Exception):
    """An evaluation during training ended at a stop request, every rank at the same batch; the loop saves the
    checkpoint of the step just trained and stops."""


class StopRequest:
    """Records the first stop signal; the training loop asks `should_stop` after each optimizer step, an
    evaluation its `evaluation_check` after each batch."""

    # With several processes an evaluation's ranks agree (one all-reduce) about this often: after as many batches
    # as the slowest rank ran in this time, at least after every batch. A stop waits about this long, plus a
    # batch, instead of a collective per batch on fast batches.
    EVALUATION_CHECK_S = 1.0

    # With several processes a Ctrl-C reaches each worker twice: from the terminal (the whole foreground process
    # group) and forwarded by the launcher a moment later. A repeat this soon after the first is that same
    # request, not a second Ctrl-C.
    FORWARDED_REPEAT_S = 2.0

    def __init__(self) -> None:
        self.signum: int | None = None
        self.agreed = False  # every rank decided to stop after this step (`should_stop`)
        self._first_at = 0.0
        self._several_processes = False
        self._announce = True

    @property
    def received(self) -> bool:
        """Whether a stop signal is recorded: this process's own, or another rank's once `should_stop` shared it."""
        return self.signum is not None

    def handler(self, signum: int, frame: Any) -> None:
        """The handler `installed` sets: records the first signal (announcing a Ctrl-C); a second Ctrl-C, not a
        launcher's forwarded repeat, raises `KeyboardInterrupt`."""
        if self.signum is not None:
            forwarded = (
                self._several_processes and time.monotonic() - self._first_at < self.FORWARDED_REPEAT_S
            )
            if signum == signal.SIGINT and not forwarded:
                raise KeyboardInterrupt  # the second Ctrl-C: do not wait for the checkpoint
            return
        self.signum, self._first_at = signum, time.monotonic()
        if signum == signal.SIGINT and self._announce:
            print(
                "\ninterrupted: saving a checkpoint after this step (Ctrl-C again to stop without one)",
                file=sys.stderr,
                flush=True,
            )

    def should_stop(self, device: Any = None) -> bool:
        """Whether to stop after the step that just ended; call it on every rank at every optimizer step.

        One process: whether a signal came. Several (a `torch.distributed` process group is up): one all-reduce
        (max) of the signal number on `device` (the process group's device: CUDA for NCCL), so every rank gets
        the same answer at the same step even when the signal reached only some of them, or reached them while
        others had already passed this step. The answer, not a later local signal, is what the loop must act
        on (`agreed`): a rank that stopped alone would leave the others waiting in their next collective."""
        if several_processes():
            self.agree(device)
        else:
            self.agreed = self.received
        return self.agreed

    def agree(self, device: Any, seconds: float = 0.0) -> float:
        """One all-reduce (max) of this rank's signal number and of `seconds`; sets `agreed` (and `signum` from
        another rank's signal) and returns the largest `seconds` of the ranks."""
        import torch
        import torch.distributed as dist

        # one float64 tensor for both: a signal number is exact in it
        flag = torch.tensor([float(self.signum or 0), seconds], dtype=torch.float64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed_signum, slowest = (float(x) for x in flag.tolist())
        if agreed_signum and self.signum is None:
            self.signum = int(agreed_signum)  # another rank's signal: report and exit with its status
        self.agreed = agreed_signum != 0
        return slowest

    def evaluation_check(self, device: Any = None) -> EvaluationCheck:
        """The stop check of one evaluation pass (`EvaluationCheck`): a new one for each pass over a split."""
        return EvaluationCheck(self, device)

    @contextmanager
    def installed(self, *, several_processes: bool = False, announce: bool = True) -> Iterator[StopRequest]:
        """Handle SIGTERM and SIGINT while the block runs; the old handlers come back after. `several_processes`:
        the ranks of one run, where a launcher forwards the terminal's Ctrl-C (`FORWARDED_REPEAT_S`); `announce`:
        print the Ctrl-C notice (the main process only)."""
        self._several_processes, self._announce = several_processes, announce
        with handling(SIGNALS, self.handler):
            yield self

    def report(
        self, command: str, argv: list[str], step: int, work_dir: Path, *, final_evaluation: bool = False
    ) -> int:
        """Print where the checkpoint is and the command that continues the run, a token's value shown as
        `<HUB_TOKEN>` (`arguments.redacted_argv`: stderr ends up in logs); returns the exit status.
        `final_evaluation`: the stop came in the evaluations after the last step, which the resumed run runs."""
        from .arguments import redacted_argv

        if self.signum is None:
            raise ValueError("StopRequest.report: no stop signal was received")
        resume = redacted_argv([*argv] if "--resume" in argv else [*argv, "--resume"])
        name = signal.Signals(self.signum).name
        where = (
            f"in the final evaluation after the last step ({step})" if final_evaluation else f"at step {step}"
        )
        then = " (it runs the final evaluation and writes the model folder)" if final_evaluation else ""
        print(
            f"energyformers {command}: stopped by {name} {where}; checkpoint saved in {work_dir}. Continue "
            f"with{then}:\n  {shlex.join(['energyformers', command, *resume])}",
            file=sys.stderr,
            flush=True,
        )
        return 128 + self.signum


class EvaluationCheck:
    """Whether one evaluation pass stops: `batch_done` after each of its batches raises `EvaluationStopped` once a
    stop is agreed, on every rank after the same batch (call it on every rank after every batch).

    One process: after the first batch that follows the signal. Several: the ranks agree (`StopRequest.agree`)
    after the first batch, then after as many batches as the slowest rank ran in `StopRequest.EVALUATION_CHECK_S`
    (at least 1), measured since the previous agreement and shared by the same all-reduce, so every rank counts
    the same batches to the next one."""

    def __init__(self, request: StopRequest, device: Any = None) -> None:
        self.request, self.device = request, device
        self.several = several_processes()
        self.batches = 0  # batches done in this pass
        self.agreed_at = 0  # the batch after which the ranks last agreed (0: not yet)
        self.next_at = 1  # the batch after which they agree next
        self.since = time.monotonic()  # when the batches since the last agreement began
        self.agreements = 0  # all-reduces this pass made

    def batch_done(self) -> None:
        """Raise `EvaluationStopped` if the pass stops after this batch."""
        self.batches += 1
        if not self.several:
            self.request.agreed = self.request.received
        elif self.batches >= self.next_at:
            now = time.monotonic()
            per_batch = (now - self.since) / (self.batches - self.agreed_at)
            slowest = self.request.agree(self.device, per_batch)
            self.agreements += 1
            interval = int(StopRequest.EVALUATION_CHECK_S / slowest) if slowest > 0 else 1
            self.agreed_at, self.next_at, self.since = self.batches, self.batches + max(1, interval), now
        if self.request.agreed:
            raise EvaluationStopped


@contextmanager
def handling(signals: tuple[int, ...], handler: Any) -> Iterator[None]:
    """`handler` for `signals` while the block runs, the old handlers back after: the one place the commands install
    signal handlers. Outside the main thread (where Python cannot install them) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in signals}
    for signum in previous:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def stop_at_once(signum: int, frame: Any) -> None:
    """The SIGTERM handler of a command without steps to finish (`stopping_at_once`): raise `SystemExit` with the
    status a stop by that signal has (143), so its `except` / `finally` cleanup runs as for Ctrl-C."""
    raise SystemExit(128 + signum)


@contextmanager
def stopping_at_once() -> Iterator[None]:
    """SIGTERM (a scheduler's stop) ends the block through an exception, as Ctrl-C does (`KeyboardInterrupt`), instead
    of Python's default of ending the process where it stands: a command's cleanup runs for both."""
    with handling((signal.SIGTERM,), stop_at_once):
        yield


@contextmanager
def deferring_stops() -> Iterator[None]:
    """Finish the block before a SIGTERM or Ctrl-C that comes during it takes effect (a few renames that must all
    happen: `inspect` moving its report into place); then the stop ends the command as it would have."""
    stop = StopRequest()
    with stop.installed(announce=False):
        yield
    if stop.signum == signal.SIGINT:
        raise KeyboardInterrupt
    if stop.signum is not None:
        raise SystemExit(128 + stop.signum)


def process_alive(pid: int) -> bool:
    """Whether a process `pid` runs on this machine (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def left_by(pid: str | None, host: str | None) -> str:
    """Who left one of the hidden entries beside an output (a staging folder, a replaced folder's copy), by the pid
    and host its name carries: "running" (a process of this machine that still runs), "gone" (one of this machine
    that has ended: what it left is stale), or "unknown" (no pid in the name, or another machine's process, which
    this one cannot ask: on a folder shared between machines it may still run). `host` None: a name written before
    hosts were in it, taken as this machine's. The one rule by which every command judges what another left."""
    if pid is None or (host is not None and host != socket.gethostname()):
        return "unknown"
    return "running" if process_alive(int(pid)) else "gone"


def leftovers(out: Path, pattern: str) -> tuple[list[Path], list[Path]]:
    """The entries beside `out` whose names fully match `pattern` (a regex with groups `pid` and `host`, which may be
    absent) and whose owner is gone or cannot be told (`left_by`): (gone, unknown), each sorted by name."""
    regex = re.compile(pattern)
    gone: list[Path] = []
    unknown: list[Path] = []
    if not out.parent.is_dir():
        return gone, unknown
    for path in sorted(out.parent.iterdir()):
        match = regex.fullmatch(path.name)
        if match is not None:
            owner = left_by(match.group("pid"), match.group("host"))
            if owner == "gone":
                gone.append(path)
            elif owner == "unknown":
                unknown.append(path)
    return gone, unknown


# `.<out>.partial-<pid>@<host>-<random>`: the staging folder of a command writing `<out>` (`staging_folder`); the pid
# and host say whether the command that made it still runs
STAGING_MARK = ".partial-"


def _staging_pattern(out: Path) -> str:
    """The names of `out`'s staging folders (`staging_folder`; without pid and host from older versions)."""
    return rf"\.{re.escape(out.name)}{re.escape(STAGING_MARK)}(?:(?P<pid>\d+)@(?P<host>.+)-)?[^-@]+"


def stale_staging(out: Path) -> tuple[list[Path], list[Path]]:
    """The staging folders of `out` beside it that no running command of this machine owns (`left_by`): (those of a
    process that is gone, those whose owner cannot be told: another machine's, or named `.<out>.partial-<random>`,
    without pid and host)."""
    gone, unknown = leftovers(out, _staging_pattern(out))
    return [p for p in gone if is_real_folder(p)], [p for p in unknown if is_real_folder(p)]


def is_real_folder(path: Path) -> bool:
    """A folder, not a link to one (what a staging folder is; a link of that name was not made by a command)."""
    return path.is_dir() and not path.is_symlink()


def remove_stale_staging(out: Path) -> None:
    """Remove the staging folders of `out` whose command was killed (SIGKILL: its cleanup never ran) and mention
    those whose owner cannot be told (one line each on stderr)."""
    gone, unknown = stale_staging(out)
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
        print(f"warning: removed {path}, left by a killed command that was writing {out}", file=sys.stderr)
    for path in unknown:
        print(
            f"warning: {path} looks left by a killed command that was writing {out}; delete it if nothing is writing "
            "there now",
            file=sys.stderr,
        )


@contextmanager
def staging_folder(out: Path) -> Iterator[Path]:
    """A new empty folder beside `out` (`.<out>.partial-<pid>@<host>-<random>`, mode 0755) for a command to write
    `out`'s files into before it moves them into place, so that `out` never holds half of them. It never outlives
    the block: removed on any exception, Ctrl-C and SIGTERM included (`stopping_at_once`), and at the end if still
    there. What a SIGKILL leaves, the next command writing `out` removes (`remove_stale_staging`)."""
    out = Path(os.path.abspath(out))  # "." or "runs/.." named by their folder's own name, beside it
    remove_stale_staging(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with stopping_at_once():
        prefix = f".{out.name}{STAGING_MARK}{os.getpid()}@{socket.gethostname()}-"
        staging = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
        try:
            staging.chmod(0o755)  # mkdtemp makes it private; what is staged is meant to be shared
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)


LOCK_SUFFIX = ".lock"
# the output folders whose lock this process holds (`lock_output_dir`), by resolved path: the lock, and the folders
# above the output that taking it created
_held_locks: dict[Path, tuple[Any, list[Path]]] = {}


def lock_path(output_dir: Path) -> Path:
    """`<output_dir>.lock`, beside the folder: never in the model folder, nor in the work folder a run removes."""
    return output_dir.with_name(output_dir.name + LOCK_SUFFIX)


def lock_output_dir(
    output_dir: Path, given: str | None = None, flag: str = "--output_dir", what: str = "folder"
) -> None:
    """Take the lock on `output_dir` (resolved; `given`: as the command line named it, after `flag`) that a command
    writing the folder (`train`, `export`, `convert`, `inspect`), or the file (`what`: `convert --reverse`), holds
    until it ends (`release_output_dir`) or the process does: the kernel's lock on `lock_path` (flock), so a killed
    command holds nothing. Another command holding it, in this process or another, is a `UsageError` naming it."""
    from filelock import FileLock, Timeout

    from .cli import UsageError

    path = lock_path(output_dir)
    created = [folder for folder in path.parents if not folder.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        remove_created(created)
        raise UsageError(
            f"{flag} {given or output_dir}: another command is using this {what} (it holds {path}); wait for it to "
            f"end or choose another {flag}"
        ) from None
    _held_locks[output_dir] = (lock, created)


def release_output_dir(output_dir: Path) -> None:
    """Release `lock_output_dir`'s lock, removing the file while still holding it (a command that opened it
    meanwhile finds it gone and takes a new one), and the folders above the output it created that are still empty
    (a command refused after taking the lock leaves nothing); nothing if this process does not hold it."""
    held = _held_locks.pop(output_dir, None)
    if held is not None:
        lock, created = held
        lock_path(output_dir).unlink(missing_ok=True)
        lock.release()
        remove_created(created)


def remove_created(folders: list[Path]) -> None:
    """Remove `folders` (nested, deepest first) where they are empty, up to the first that is not."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # something was written there (the published folder): it stays, with those above it
            return


@contextmanager
def locked_output_dir(
    output_dir: str | os.PathLike, flag: str = "--output_dir", what: str = "folder"
) -> Iterator[Path]:
    """Hold `output_dir`'s lock (`lock_output_dir`) while the block runs, however it ends; yields the folder resolved.
    `flag`: how the command line names the folder (`what`: or the file), for the refusal. Around everything of a
    command that repairs or replaces the folder (`restore_interrupted_publish`, `staging_folder`, `publish`,
    `publish_files`), so two commands never do at once."""
    resolved = Path(output_dir).expanduser().resolve()
    lock_output_dir(resolved, os.fspath(output_dir), flag, what)
    try:
        yield resolved
    finally:
        release_output_dir(resolved)


def several_processes() -> bool:
    """Whether a `torch.distributed` process group of more than one process is up."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


# `.<out>.old-<pid>@<host>`: where `publish` moves the folder it replaces until the new one is in place; the pid and
# host say whether the command that moved it still runs (`.<out>.old-<pid>`, without the host, from older versions)
REPLACED_MARK = ".old-"


def replaced_name(output_dir: Path) -> Path:
    """The hidden copy `publish`, in this process, moves `output_dir`'s previous folder to."""
    return output_dir.with_name(f".{output_dir.name}{REPLACED_MARK}{os.getpid()}@{socket.gethostname()}")


def _replaced_pattern(output_dir: Path) -> str:
    """The names of the hidden copies (`replaced_name`) of `output_dir`'s previous folders."""
    return rf"\.{re.escape(output_dir.name)}{re.escape(REPLACED_MARK)}(?P<pid>\d+)(?:@(?P<host>.+))?"


def replaced_names(output_dir: Path) -> tuple[list[Path], list[Path]]:
    """The hidden copies (`replaced_name`) that `publish` moved the previous folder to and no running command of this
    machine owns (`left_by`): (those of processes that are gone, newest first: a kill between its renames, or before
    it removed the copy; those of another machine, whose process cannot be told)."""
    gone, unknown = leftovers(output_dir, _replaced_pattern(output_dir))
    return sorted(gone, key=lambda path: path.lstat().st_ctime, reverse=True), unknown


def restore_interrupted_publish(output_dir: Path) -> bool:
    """Undo what a command killed inside `publish` left (under the folder's lock, `locked_output_dir`, so no other
    command is publishing): without `output_dir`, its previous folder comes back from the newest hidden copy; the
    copies the folder has replaced are removed; another machine's copy is left where it is. One line on stderr for
    each. Returns whether a folder was put back."""
    restored = False
    gone, unknown = replaced_names(output_dir)
    for old in gone:
        if not os.path.lexists(output_dir):
            old.rename(output_dir)
            restored = True
            print(
                f"warning: restored {output_dir} from {old.name}, where a run killed while replacing it had left it",
                file=sys.stderr,
            )
        else:
            remove_path(old)
            print(
                f"warning: removed {old}, the previous {output_dir.name} a run killed while replacing it had left",
                file=sys.stderr,
            )
    for old in unknown:
        print(
            f"warning: {old} looks left by a command of another machine killed while replacing {output_dir}; if "
            f"nothing is writing there now, rename it to {output_dir.name} (when that is missing) or delete it",
            file=sys.stderr,
        )
    return restored


def remove_path(path: Path) -> None:
    """Remove a folder with its files, or a file or link."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def publish(stage: Path, output_dir: Path, *, overwrite: bool = False) -> None:
    """Atomically replace `output_dir` with the finished `stage` folder (same filesystem). A non-empty `output_dir`
    is replaced only with `overwrite` (--overwrite_output_dir): checked again here, since the folder may have
    appeared while the run trained (`CommandFailed`, the stage left where it is)."""
    if output_dir.is_dir() and not overwrite and any(output_dir.iterdir()):
        from .cli import CommandFailed

        raise CommandFailed(
            f"--output_dir {output_dir}: the folder appeared while the run trained and is not empty, and "
            f"--overwrite_output_dir was not given; the finished model is in {stage}"
        )
    old = None
    if os.path.lexists(output_dir):
        old = replaced_name(output_dir)
        output_dir.rename(old)
    try:
        stage.rename(output_dir)
    except BaseException:
        if old is not None:  # the previous folder back where it was
            old.rename(output_dir)
        raise
    if old is not None:  # a file or link there (refused by --output_dir's check; a race) goes too
        remove_path(old)


# the file `publish_files` writes beside the staged files before its first rename: from then on each new file is
# either staged or in place (never lost), so a kill's leftovers tell whether the publish finished
PUBLISHING_MARK = ".publishing"


def publish_files(staged: list[tuple[Path, Path]]) -> None:
    """Move each staged file (`(staged, target)`, same filesystem) onto its target, all of them or none: the targets
    there are moved aside (`replaced_name`) first, the staged files renamed in, and only then the old ones removed;
    a failure on the way (a full disk's, a permission's) moves the new files back and puts back what was there, so
    the files never mix two writes (`convert --reverse`: the weights and their JSON). A SIGTERM or Ctrl-C in between
    takes effect once all are moved (`deferring_stops`); what a SIGKILL in between leaves, the next command writing
    the targets repairs as one (`restore_interrupted_publish_files`)."""
    aside: list[tuple[Path, Path]] = []
    placed: list[tuple[Path, Path]] = []
    with deferring_stops():
        for folder in dict.fromkeys(new.parent for new, _ in staged):
            (folder / PUBLISHING_MARK).touch()
        try:
            for _, target in staged:
                if os.path.lexists(target):
                    old = replaced_name(target)
                    target.rename(old)
                    aside.append((old, target))
            for new, target in staged:
                new.rename(target)
                placed.append((new, target))
        except BaseException:
            for (
                new,
                target,
            ) in placed:  # back where they were staged: a kill during this undo still finds them
                target.rename(new)
            for old, target in aside:
                old.rename(target)
            raise
        for old, _ in aside:
            remove_path(old)


def _owner(path: Path, pattern: str) -> tuple[str, str]:
    """The pid and host a hidden entry's name carries (`pattern` matched it in `leftovers` with a pid; no host: this
    machine)."""
    match = re.fullmatch(pattern, path.name)
    assert match is not None and match.group("pid") is not None, (path, pattern)
    return match.group("pid"), match.group("host") or socket.gethostname()


def publish_leftovers(out: Path, targets: list[Path]) -> bool:
    """Whether a command writing `targets` in a staging folder of `out` (`staging_folder`) and moving them in
    (`publish_files`; a folder `out` replaced by `publish`: `targets` is `[out]`) left anything beside them (a
    staging folder, a moved-aside old copy) that is not a running command's: its repair
    (`restore_interrupted_publish_files`, `restore_interrupted_publish`) may change what is there, so a command
    checks whether it may replace them after it, not before."""
    return any(stale_staging(out)) or any(any(replaced_names(target)) for target in targets)


def restore_interrupted_publish_files(out: Path, targets: list[Path]) -> None:
    """Undo, as one, what a command killed inside `publish_files` left, its files staged in a staging folder of
    `out` (`staging_folder`) under the targets' names (under the lock, `locked_output_dir`): where its staging folder
    shows the publish begun but unfinished (`PUBLISHING_MARK`, a new file still staged), every target goes back to
    what it was before (the old file from its hidden copy; a new file placed where there was none removed); where
    it finished, the old copies are removed. Then the staging folders of gone commands are removed
    (`remove_stale_staging`). Old copies without their command's staging folder (removed by hand) go back where a
    target is missing, all of that command's, else are removed. Another machine's leftovers are left, with a
    warning (one line on stderr for each)."""
    olds: dict[tuple[str, str], dict[Path, Path]] = {}
    for target in targets:
        gone, unknown = replaced_names(target)
        for old in gone:
            olds.setdefault(_owner(old, _replaced_pattern(target)), {}).setdefault(target, old)
        for old in unknown:
            print(
                f"warning: {old} looks left by a command of another machine killed while replacing {target}; if "
                f"nothing is writing there now, rename it to {target.name} (when that is missing) or delete it",
                file=sys.stderr,
            )
    stagings: dict[tuple[str, str], Path] = {}
    for staging in stale_staging(out)[0]:  # gone: named with a pid
        if (staging / PUBLISHING_MARK).exists():
            stagings[_owner(staging, _staging_pattern(out))] = staging
    for owner in sorted(set(olds) | set(stagings)):
        aside, staging = olds.get(owner, {}), stagings.get(owner)
        if staging is not None:
            unfinished = any((staging / target.name).exists() for target in targets)
        else:
            unfinished = any(not os.path.lexists(target) for target in aside)
        names = " and ".join(target.name for target in targets)
        for target in targets:
            old = aside.get(target)
            if unfinished and old is not None:
                os.replace(old, target)
                print(
                    f"warning: restored {target} from {old.name}: a run killed while replacing {names} had not "
                    "moved all its files in",
                    file=sys.stderr,
                )
            elif (
                unfinished
                and staging is not None
                and not (staging / target.name).exists()
                and target.exists()
            ):
                target.unlink()  # its new file, where there was none before
                print(
                    f"warning: removed {target}, which a run killed while writing {names} had moved in alone",
                    file=sys.stderr,
                )
            elif old is not None:
                remove_path(old)
                print(
                    f"warning: removed {old}, the previous {target.name} a run killed after replacing {names} had "
                    "left",
                    file=sys.stderr,
                )
    remove_stale_staging(out)


__all__ = [
    "LOCK_SUFFIX",
    "PUBLISHING_MARK",
    "REPLACED_MARK",
    "SIGNALS",
    "STAGING_MARK",
    "EvaluationCheck",
    "EvaluationStopped",
    "StopRequest",
    "deferring_stops",
    "handling",
    "is_real_folder",
    "left_by",
    "leftovers",
    "lock_output_dir",
    "lock_path",
    "locked_output_dir",
    "process_alive",
    "publish",
    "publish_files",
    "publish_leftovers",
    "release_output_dir",
    "remove_created",
    "remove_path",
    "remove_stale_staging",
    "replaced_name",
    "replaced_names",
    "restore_interrupted_publish",
    "restore_interrupted_publish_files",
    "several_processes",
    "staging_folder",
    "stale_staging",
    "stop_at_once",
    "stopping_at_once",
]
