"""`energyformers` command line: one sub-command per module, each owning its own argument parser.

Sub-command modules are imported lazily so `energyformers predict` does not pay for the
training stack and a broken optional path cannot break the others.

Every sub-command follows one convention, kept here in `run_command` and nowhere else:

* bad input (a flag value, a missing or wrong-kind path, a file of the wrong structure, an unknown sub-command):
  one line `energyformers <command>: error: <what>` on stderr and exit status 2, as argparse does for its own
  errors; a command raises `UsageError` for these, and argparse's own errors (an unknown flag, a bad choice, a
  missing argument) become one too, in every command, because every parser is a `CommandParser` (or, for the
  training loops' `HfArgumentParser`, has `UsageErrorParserMixin`);
* an expected failure of the work itself (the Hub refused an upload): one line and status 1 (`CommandFailed`);
* a full disk (or quota) while the work writes: one line naming the folder and "no space left on device", status 1
  as any failure of the work (`full_disk_message`); a folder found unwritable before any work starts is bad input;
* any other exception (a bug, a failing disk): its traceback and status 1;
* interrupted (Ctrl-C): status 130 (128 + SIGINT);
* under a launcher (torchrun, `accelerate launch`: WORLD_SIZE > 1) every rank parses the same arguments and
  refuses them alike, and the error is printed once, by rank 0: another rank waits (`LAUNCH_GRACE_S`) for the
  launcher to end it, as it does every rank once one fails, and prints only when it outlives that wait (an error
  of its own);
* a command may quiet transformers' logging and progress bars for itself; `run_command` gives an in-process
  caller (a notebook, a test) its own logging state back afterwards.

`run_command` parses and checks the arguments first and only then imports the models (torch, transformers'
modeling code), so an argument error is reported in about a second (`import energyformers` itself loads nothing
heavy).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from .interrupt import publish_leftovers

# sub-command -> (module under energyformers.training, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "train",
        "train a new model, or fine-tune a saved one (--from_pretrained), with transformers.Trainer",
    ),
    "train-accelerate": ("accelerate_loop", "the same training with a plain Accelerate loop"),
    "predict": (
        "predict",
        "classify images or texts, or reconstruct masked images, with a saved model folder",
    ),
    "evaluate": (
        "evaluate",
        "score a saved classifier on a dataset split (Trainer.evaluate, train's metrics)",
    ),
    "export": ("export", "write a Hub-ready folder with remote code and a model card"),
    "push": ("push", "export and upload a model folder to the Hugging Face Hub"),
    "release": ("release", "train or take the reference checkpoints and export them under dist/"),
    "convert": (
        "convert_cli",
        "convert the authors' official checkpoints to verified model folders and back",
    ),
    "inspect": ("inspect", "draw a model's energy / fixed-point / kernel-width dynamics (PNG + JSON)"),
}

USAGE_ERROR = 2  # argparse's status for bad arguments
RUNTIME_ERROR = 1
INTERRUPTED = 128 + signal.SIGINT
# How long a non-zero rank, refusing its arguments, waits before it prints them too. Every rank refuses the same
# arguments at about the same moment; a rank that exited at once could have the launcher (which ends every worker
# when one fails) end rank 0 before rank 0 printed, and the error would be read nowhere.
LAUNCH_GRACE_S = 20.0


class UsageError(ValueError):
    """Bad command-line input (a flag value, a path, a file's structure): exit status 2, before any work starts.

    `hint`, when set, is printed on a second line (e.g. the command that installs a missing dataset).
    """

    hint: str | None = None


class CommandFailed(RuntimeError):
    """The arguments were good but the work could not be done for a reason the message explains: exit status 1."""


Parsed = TypeVar("Parsed")


class UsageErrorParserMixin:
    """An argparse parser mixin: a parse error (unknown flag, bad choice or type, missing argument) and the
    command's own `parser.error(...)` raise `UsageError`, so `run_command` prints it as the command's one error
    line (status 2) instead of argparse's usage block and `sys.exit`. `--help` still prints and exits 0.

    Mixed into `CommandParser` and into the training loops' `HfArgumentParser`; it must come first in the bases so
    its `error` replaces argparse's."""

    def error(self, message: str) -> NoReturn:
        # "argument --eval_strategy/--eval-strategy: ..." names the flag once, spelled as --help lists it first
        message = re.sub(r"(--[\w-]+)(?:/--?[\w-]+)+", r"\1", message)
        raise UsageError(message.removeprefix("argument "))


class CommandParser(UsageErrorParserMixin, argparse.ArgumentParser):
    """The argument parser of every sub-command: argparse's, with its errors reported by `run_command`."""


# The data files `--dataset` reads as a table, by suffix, with the `datasets` builder of each (`data.load_data`); kept
# here, without the datasets stack, so the card and `release` name a model after a data file's stem cheaply.
TABLE_BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def looks_like_local_path(name: str) -> bool:
    """Whether `name` can only mean a local path, never a Hub repo id ("name" or "org/name"): it starts with
    `.`, `/` or `~`, or has more than one `/`. Light: the commands ask it before anything loads."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep in name[:1]


def check_model_source(source: str, label: str) -> Path | None:
    """The local model folder `source` names, or None for a Hub repo id (the Hub, or its cache, is asked later); a
    `UsageError` worded `<label> '<source>': ...` for a missing folder, a file, or a repo id the Hub cannot serve
    while it is offline (HF_HUB_OFFLINE=1) because the local Hub cache holds no config.json of it.

    Light (no torch, no transformers), so a command names a missing folder before it loads anything, instead of
    transformers' "couldn't connect to the Hub" after its retries. `label` is how the command names the argument
    (`--from_pretrained`, `model folder`)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise UsageError(f"{label} {source!r}: is a file, not a folder; pass a model folder")
    # a path (./x, /x, ~/x, a/b/c) or a name the Hub cannot hold is a local folder that is not there
    if looks_like_local_path(source) or not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", source):
        raise UsageError(f"{label} {source!r}: the folder does not exist")
    from huggingface_hub import constants  # light: the Hub client's settings, no network

    # Offline, transformers still loads a repo from the Hub cache (that is what HF_HUB_OFFLINE=1 is for); only a
    # repo the cache does not hold cannot load.
    if constants.HF_HUB_OFFLINE and not in_hub_cache(source):
        raise UsageError(
            f"{label} {source!r}: no such local folder, and the Hub is offline (HF_HUB_OFFLINE=1) and its cache "
            f"({constants.HF_HUB_CACHE}) holds no such repo, so it cannot be a Hub repo either"
        )
    return None


def in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hub cache (HF_HUB_CACHE) holds `repo_id`'s config.json at its main revision, as
    transformers finds it offline. Reads the cache's folders only: no network, no torch."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # huggingface_hub's own repo-id validation (e.g. "a..b"): no repo of that name
        return False
    return isinstance(found, str)


def check_output_folder(
    path: str | os.PathLike,
    flag: str,
    overwrite_flag: str | None,
    *,
    overwrite: bool = False,
    allowed: str | os.PathLike | None = None,
    error: type[Exception] = UsageError,
    repair_first: bool = False,
) -> Path:
    """The folder a command writes into, checked before any work: never a file (whatever the flags: a file there is
    not what anyone meant to replace with a folder), nor under one, and writable (the folder, or where it does not
    exist yet, the nearest folder above it, in which it is created); and new or empty unless `overwrite`
    (`overwrite_flag`, how the caller spells it, is named in the message) or it is `allowed` (inspect may write into
    the model folder itself). `overwrite_flag=None`: a non-empty folder is fine (the command adds files of its own
    names beside the others). `repair_first`: the command repairs what one killed inside `publish` left beside the
    folder (`restore_interrupted_publish`, under the folder's lock) and checks the folder again after that; where
    such leftovers are found it is not refused here for being taken, since the repair may put its previous folder
    back, or leave only the one moved in.

    Raises `error` (a `UsageError` for the command line; an API caller passes e.g. `FileExistsError`) worded
    `<flag> <path>: ...`, except that for an API caller a folder that cannot be created or written there is the
    `NotADirectoryError` / `PermissionError` it is; returns the folder (`~` expanded). Light: reads the folder's
    entries only."""
    folder = Path(path).expanduser()
    if os.path.lexists(folder) and not folder.is_dir():
        raise error(f"{flag} {path}: is a file, not a folder; name a folder to write into")
    _refuse_where_written(folder, flag, path, error)
    if repair_first and publish_leftovers(folder.absolute(), [folder.absolute()]):
        overwrite_flag = None
    if overwrite_flag is None or overwrite or not folder.is_dir() or not any(folder.iterdir()):
        return folder
    if allowed is not None and folder.resolve() == Path(allowed).expanduser().resolve():
        return folder
    raise error(
        f"{flag} {path}: the folder exists and is not empty; pass {overwrite_flag} or choose another folder"
    )


def check_output_file(
    path: str | os.PathLike,
    flag: str,
    overwrite_flag: str | None = None,
    *,
    overwrite: bool = False,
    error: type[Exception] = UsageError,
) -> Path:
    """The file a command writes, checked before any work: not a folder, not under a file, in a writable folder (or,
    where its folder does not exist yet, under a writable one, in which the command creates it), and not there yet
    unless `overwrite` (`overwrite_flag`, how the caller spells it, is named in the message; `None`: an existing
    file is replaced). Raises `error` worded `<flag> <path>: ...` (where it is written: as `check_output_folder`);
    returns the file's path (`~` expanded)."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise error(f"{flag} {path}: is a folder, not a file; name a file to write")
    _refuse_where_written(target.parent, flag, path, error)
    if overwrite_flag is not None and not overwrite and os.path.lexists(target):
        raise error(f"{flag} {path}: the file exists; pass {overwrite_flag} or choose another name")
    return target


def _refuse_where_written(folder: Path, flag: str, path: str | os.PathLike, error: type[Exception]) -> None:
    """Raise when nothing can be written in `folder` (created, with the folders above it, where missing): the nearest
    of it and the folders above it that exists is not a folder (a path under a file cannot be created) or is not
    writable (`os.access`: permissions for a user, a read-only filesystem for root too). A `UsageError` for the
    command line, else the `NotADirectoryError` / `PermissionError` it is."""
    for existing in (folder, *folder.parents):
        if not os.path.lexists(existing):
            continue
        if not existing.is_dir():
            what = "a file" if existing.is_file() else "not a folder (a broken link or a special file)"
            kind: type[Exception] = NotADirectoryError
            problem = f"{existing} is {what}, so nothing can be created under it; name a folder to write into"
        elif not os.access(existing, os.W_OK | os.X_OK):
            kind, problem = PermissionError, f"the folder {existing} is not writable; choose another folder"
        else:
            return
        raise (error if issubclass(error, UsageError) else kind)(f"{flag} {path}: {problem}")


def launch_rank() -> int:
    """This process's global rank under a launcher (torchrun and `accelerate launch` set RANK, and LOCAL_RANK);
    0 outside one, or where the rank is not a number. Launched means WORLD_SIZE > 1 (both launchers set it): a
    RANK alone is also exported by a job's pod, a scheduler's wrapper, or a script run under a launcher that then
    starts a command of its own, none of which has a rank 0 that prints for it."""
    try:
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return 0
        # RANK first: on a second machine LOCAL_RANK 0 is global rank 2 or more
        return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    except ValueError:
        return 0


def report_usage_error(*lines: str) -> None:
    """Print a usage error's `lines` on stderr once per launch: at once on rank 0 (or outside a launcher); on
    another rank only after `LAUNCH_GRACE_S`, which under a launcher it does not live to see when rank 0 refused the
    same arguments (the launcher ends the remaining workers), so it prints only an error rank 0 did not have."""
    if launch_rank() != 0:
        try:
            time.sleep(LAUNCH_GRACE_S)
        except KeyboardInterrupt:  # the launcher passed a Ctrl-C on: rank 0 has the terminal
            return
    print(*lines, sep="\n", file=sys.stderr)


# The write errors of a full disk and of an exceeded quota.
FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How the text of an error that is no OSError names the errno of the write that failed: a Rust library's I/O error
# (safetensors, tokenizers) "... (os error 122)" or, debug-printed, "Os { code: 122, ... }"; an OSError's own text
# carried into a RuntimeError (a writer called from C++, as torch.save's file writes are) "[Errno 122] ..."; a C or
# C++ library's "errno 122" or "errno: 122".
ERRNO_IN_TEXT = re.compile(r"\(os error (\d+)\)|\bOs \{ code: (\d+)|\[Errno (\d+)\]|\berrno:? (\d+)")
# torch.save to a path writes through a C++ stream whose failure names no cause: "basic_ios::clear: iostream
# error", then its zip writer's "[enforce fail at inline_container.cc:...] unexpected pos"; a full disk is told
# from another write failure by the space left where the command writes (a failed write fills it to the last
# blocks), under this many bytes.
TORCH_STREAM_ERRORS = ("iostream error", "inline_container")
FULL_DISK_BYTES = 1 << 20


def errnos_in_text(text: str) -> list[int]:
    """The errnos `text` names (`ERRNO_IN_TEXT`), in order."""
    return [int(next(group for group in match.groups() if group)) for match in ERRNO_IN_TEXT.finditer(text)]


def full_disk_message(err: BaseException, folders: Iterable[str | os.PathLike] = ()) -> str | None:
    """One line naming the folder and "no space left on device" (or "disk quota exceeded") when `err`, or an
    exception it was raised from or during (`__cause__`, `__context__`), is a write failing for want of space:
    an OSError with errno ENOSPC or EDQUOT (the folder of its file), another error whose text names one of them
    (`ERRNO_IN_TEXT`: safetensors', or torch.save's RuntimeError carrying it; the first of `folders`, those the
    command writes to), or torch.save's stream failure, which names no errno, while one of `folders` is on a full
    disk; None otherwise."""
    chain: list[BaseException] = []
    while err is not None and err not in chain:
        chain.append(err)
        err = err.__cause__ or err.__context__
    written = [Path(folder) for folder in folders]
    for error in chain:
        code, where = None, None
        if isinstance(error, OSError) and error.errno in FULL_DISK_ERRNOS:
            code = error.errno
            where = Path(os.fsdecode(error.filename)).parent if error.filename else None
        else:
            code = next((code for code in errnos_in_text(str(error)) if code in FULL_DISK_ERRNOS), None)
        if code is not None:
            where = where or (written[0] if written else None)
            return f"{os.strerror(code).lower()}" + (f" writing in {where}" if where else "")
    if any(isinstance(e, RuntimeError) and any(s in str(e) for s in TORCH_STREAM_ERRORS) for e in chain):
        for folder in written:
            existing = next(p for p in (folder, *folder.parents) if p.exists())
            if shutil.disk_usage(existing).free < FULL_DISK_BYTES:
                return f"{os.strerror(errno.ENOSPC).lower()} writing in {folder}"
    return None


def run_command(
    command: str,
    parse: Callable[[list[str]], Parsed],
    execute: Callable[[Parsed], int | None],
    argv: list[str],
    writes_to: Callable[[Parsed], Iterable[str | os.PathLike]] | None = None,
) -> int:
    """Run one sub-command: `parse(argv)` (light: no torch), then the models load, then `execute(parsed)`.
    `writes_to(parsed)`: the folders the command writes into, where a full disk is looked for when a write fails
    without saying why (`full_disk_message`).

    Returns the exit status; the one place that maps exceptions to statuses and messages.
    """
    prog = f"energyformers {command}"
    logging_state = _transformers_logging_state()
    # torch's thread count, read once torch is loaded (after parsing: `--help` and bad arguments stay light) and put
    # back afterwards, as the logging is: `--num_threads` is this command's, not the calling notebook's or test's.
    threads = None
    determinism = None
    parsed = None
    try:
        parsed = parse(argv)
        import energyformers.registry  # noqa: F401  (the models load, and register, only for good arguments)

        threads = _torch_threads()
        determinism = _determinism_state()  # `--full_determinism` is this command's too
        return int(execute(parsed) or 0)
    except UsageError as err:
        report_usage_error(f"{prog}: error: {err}", *([f"  {err.hint}"] if err.hint else []))
        return USAGE_ERROR
    except CommandFailed as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return RUNTIME_ERROR
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as err:  # a bug or an environment failure: the whole traceback, for the report
        full = full_disk_message(err, writes_to(parsed) if writes_to and parsed is not None else ())
        if full is not None:
            print(f"{prog}: error: {full}; free some space and run the command again", file=sys.stderr)
            return RUNTIME_ERROR
        traceback.print_exc()
        print(f"{prog}: error: unexpected failure (traceback above)", file=sys.stderr)
        return RUNTIME_ERROR
    finally:
        _restore_transformers_logging(logging_state)
        if threads is not None:
            _set_torch_threads(threads)
        if determinism is not None:
            _restore_determinism(determinism)


def _torch_threads() -> int | None:
    """torch's intra-op thread count when torch is loaded, else None (nothing is imported for it)."""
    torch = sys.modules.get("torch")
    return None if torch is None else torch.get_num_threads()


def _set_torch_threads(threads: int) -> None:
    """Put back `threads` (`_torch_threads`) where a command changed it; an unchanged count is left alone."""
    torch = sys.modules["torch"]
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


# What `transformers.enable_full_determinism` sets in the environment (read by CUDA, cuBLAS, flash-attn, NPUs).
DETERMINISM_ENVIRONMENT = (
    "CUDA_LAUNCH_BLOCKING",
    "CUBLAS_WORKSPACE_CONFIG",
    "ASCEND_LAUNCH_BLOCKING",
    "HCCL_DETERMINISTIC",
    "FLASH_ATTENTION_DETERMINISTIC",
)


def _determinism_state() -> tuple[Any, ...]:
    """torch's deterministic-algorithms mode (on, warn only), cuDNN's (deterministic, benchmark) and the environment
    variables `transformers.enable_full_determinism` sets, as `_restore_determinism` puts them back."""
    torch = sys.modules["torch"]
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        {name: os.environ.get(name) for name in DETERMINISM_ENVIRONMENT},
    )


def _restore_determinism(state: tuple[Any, ...]) -> None:
    """Put back `state` (`_determinism_state`) where a command (`--full_determinism`) changed it."""
    if _determinism_state() == state:
        return
    torch = sys.modules["torch"]
    enabled, warn_only, cudnn_deterministic, cudnn_benchmark, environment = state
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    torch.backends.cudnn.deterministic = cudnn_deterministic
    torch.backends.cudnn.benchmark = cudnn_benchmark
    for name, value in environment.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _transformers_logging_state() -> tuple[int, bool] | None:
    """(verbosity, progress bars on) of transformers' logging when it is loaded; None when it is not yet (nothing
    is imported for it: `--help` stays light)."""
    logging = sys.modules.get("transformers.utils.logging")
    return None if logging is None else (logging.get_verbosity(), logging.is_progress_bar_enabled())


def _restore_transformers_logging(state: tuple[int, bool] | None) -> None:
    """Put back `state` (`_transformers_logging_state`); transformers' defaults when it was not loaded before."""
    logging = sys.modules.get("transformers.utils.logging")
    if logging is None:
        return
    if state is None:  # transformers' start-up level (its TRANSFORMERS_VERBOSITY, else warning), bars on
        state = (getattr(logging, "_get_default_logging_level", lambda: logging.WARNING)(), True)
    verbosity, progress_bars = state
    logging.set_verbosity(verbosity)
    (logging.enable_progress_bar if progress_bars else logging.disable_progress_bar)()


def _usage() -> str:
    lines = ["usage: energyformers [--version] COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<17} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def version() -> str:
    """`energyformers <version>`: the package's `__version__` (its import loads no torch)."""
    from energyformers import __version__

    return f"energyformers {__version__}"


def main(argv: list[str] | None = None) -> int:
    """The `energyformers` command: dispatch to the sub-command named first; returns its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    if argv[0] in {"-V", "--version"}:
        print(version())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        report_usage_error(
            f"energyformers: error: unknown command {command!r}; expected one of {', '.join(COMMANDS)} "
            "(energyformers --help lists them)"
        )
        return USAGE_ERROR
    module: Any = importlib.import_module(f"energyformers.training.{COMMANDS[command][0]}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
