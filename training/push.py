"""`energyformers push MODEL_DIR REPO_ID`: export a model folder and upload it to the Hugging Face Hub.

The upload is exactly what `energyformers export` writes (remote code, `auto_map`, processor, card with the
run's metrics), built in a temporary folder that is always removed. The token comes from the usual
`huggingface_hub` mechanisms (`--token`, `HF_TOKEN`, or the file written by `hf auth login`) and the endpoint
from `HF_ENDPOINT`. `energyformers train --push_to_hub` calls `push_model_dir` after saving, so both routes
produce the same repository content.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from .cli import CommandFailed, CommandParser, UsageError, run_command


class PushError(CommandFailed):
    """A push that cannot proceed: no token, offline mode, unreachable endpoint, or a refusal by the Hub (exit
    status 1: the arguments were fine, the upload could not be made; the subclasses below are the user's own
    settings, status 2)."""


class MissingTokenError(PushError):
    """No Hugging Face token at all. `energyformers push` reports it as bad input (status 2, like a missing
    argument: the user supplies one and runs the command again); a token the Hub rejects stays a `PushError`."""


class HubOfflineError(PushError):
    """`HF_HUB_OFFLINE` is set: as with a missing token, the user's setting, reported as bad input (status 2),
    as `train --push_to_hub` reports it; an endpoint that cannot be reached stays a `PushError`."""


# How to provide a token (and `--token` on the command line): the two ways huggingface_hub's `get_token` reads.
HOW_TO_LOGIN = "set HF_TOKEN, or run `hf auth login` (a token with write access)"


def check_repo_id(repo_id: str, flag: str = "repo_id") -> None:
    """Refuse a repository id the Hub would refuse, before anything is loaded (ValueError naming `flag`)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    parts = repo_id.split("/")
    if len(parts) > 2 or not all(parts):  # NAME alone is the token owner's namespace
        raise ValueError(f"{flag} {repo_id!r}: expected NAMESPACE/NAME, e.g. your-name/hyperset-digits")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"{flag} {repo_id!r}: not a Hub repository id ({err})") from None


def hub_access_error(token: str | None, token_flag: str, upload_flag: str | None = None) -> PushError | None:
    """Why nothing can be uploaded with these settings, worded once for every route: no token at all (`token`,
    else HF_TOKEN or the stored login; `MissingTokenError`), or HF_HUB_OFFLINE set (`HubOfflineError`); None when
    an upload may be tried. `token_flag` is the caller's way to give a token (`--token` for push, `--hub_token`
    for train, `token=` for `push_model_dir`); `upload_flag` the flag that asked for the upload (train's
    `--push_to_hub`), which the offline line names with the other way out. `push_model_dir` raises the error;
    the commands report its text as bad input (`UsageError`, status 2) before any weights load."""
    from huggingface_hub import constants, get_token

    from .arguments import REDACTED

    if (
        token == REDACTED
    ):  # pasted from a printed command (`arguments.redacted_argv`): would go out as the token
        return MissingTokenError(
            f"{token_flag} {REDACTED}: the placeholder a printed command shows instead of a token; pass your token, "
            f"or leave {token_flag} out and {HOW_TO_LOGIN}"
        )
    if not (token or get_token()):
        return MissingTokenError(f"no Hugging Face token found: pass {token_flag}, {HOW_TO_LOGIN}")
    if constants.HF_HUB_OFFLINE:
        named = f"{upload_flag}: " if upload_flag else ""
        later = f", or drop {upload_flag} and run `energyformers push` later" if upload_flag else ""
        return HubOfflineError(
            f"{named}the Hub is offline (HF_HUB_OFFLINE=1), so nothing can be uploaded; unset HF_HUB_OFFLINE{later}"
        )
    return None


def check_push_request(repo_id: str, token: str | None, *, repo_flag: str, token_flag: str) -> None:
    """What an upload at the end of a long run needs, checked before the run starts (`train --push_to_hub`): a repo
    id the Hub accepts (`check_repo_id`), then a token and a Hub that is not switched off (`hub_access_error`).
    A `UsageError` (status 2, the words `energyformers push` uses) for each; nothing goes out."""
    try:
        check_repo_id(repo_id, flag=repo_flag)
    except ValueError as err:
        raise UsageError(str(err)) from None
    problem = hub_access_error(token, token_flag, upload_flag="--push_to_hub")
    if problem is not None:
        raise UsageError(str(problem))


# huggingface_hub raises its HTTP client's transport errors (connection refused, timeouts) unwrapped.
_TRANSPORT_MODULES = {"httpx", "httpx2"}


def _network_error(err: Exception) -> bool:
    transport = type(err).__module__.split(".")[0] in _TRANSPORT_MODULES
    return transport or isinstance(err, (ConnectionError, TimeoutError))


def push_model_dir(
    model_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    info: dict[str, Any] | None = None,
) -> str:
    """Export `model_dir` to a temporary folder and upload it to `repo_id`; returns the repo URL.

    Checked before any weights load or anything goes out, in the order `energyformers push` checks them: the
    folder (FileNotFoundError / ValueError: a folder with config.json, of an energyformers model with its
    processor, which loads, as `export_model_dir` needs it), then `repo_id` (ValueError), then a token
    (`MissingTokenError`) and online mode (`HubOfflineError`), worded by `hub_access_error`. `info` is
    `export.inspect_model_dir(model_dir)` where the caller checked the folder already (`energyformers push`).
    """
    from huggingface_hub import HfApi, constants, get_token
    from huggingface_hub.errors import HfHubHTTPError

    from .export import export_model_dir, inspect_model_dir

    if info is None:  # reads config.json and the weights' headers, loads the processor, loads no weights
        info = inspect_model_dir(model_dir)
    check_repo_id(repo_id)
    problem = hub_access_error(token, "token=")
    if problem is not None:
        raise problem
    api = HfApi(token=token or get_token())
    with tempfile.TemporaryDirectory(prefix="energyformers-push-") as tmp:
        # Export first: a broken folder fails here, before the network, and the temp folder always goes.
        folder = export_model_dir(model_dir, Path(tmp) / "export", repo_id=repo_id, info=info)
        step = "create the repository"
        try:
            url = api.create_repo(repo_id, private=private, exist_ok=True)
            if revision not in (None, constants.DEFAULT_REVISION):
                step = f"create the branch {revision!r}"
                api.create_branch(repo_id, branch=revision, exist_ok=True)
            step = "upload the files"
            api.upload_folder(
                folder_path=folder,
                repo_id=repo_id,
                revision=revision,
                commit_message=commit_message or f"Upload {Path(model_dir).name} with energyformers",
            )
        except HfHubHTTPError as err:
            status = err.response.status_code if err.response is not None else None
            hint = " (is the token valid and allowed to write there?)" if status in (401, 403) else ""
            # one line: the HTTP status and the Hub's own message, without the client's links and blank lines
            reason = "; ".join(
                line.strip()
                for line in str(err).splitlines()
                if line.strip() and "more information" not in line
            )
            raise PushError(
                f"the Hub at {api.endpoint} refused to {step} for {repo_id!r}{hint}: {reason}"
            ) from err
        except Exception as err:
            if _network_error(err):
                raise PushError(
                    f"could not reach the Hub at {api.endpoint} to {step} ({type(err).__name__}: {err}); check "
                    "the network and HF_ENDPOINT."
                ) from err
            raise
    return str(url)


def build_parser() -> argparse.ArgumentParser:
    """The `energyformers push` argument parser."""
    parser = CommandParser(
        prog="energyformers push", description="Export a model folder and upload it to the Hugging Face Hub."
    )
    parser.add_argument("model_dir", help="folder written by `energyformers train`")
    parser.add_argument("repo_id", help="Hub repository, e.g. your-name/hyperset-digits")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--revision", help="branch to push to (created if missing); default: main")
    parser.add_argument("--commit-message", "--commit_message", dest="commit_message", help="commit message")
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the stored login)")
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """The arguments, checked in `push_model_dir`'s order before any weights load: the folder's basics (it exists,
    config.json, readable weights), its kind (an energyformers model with its processor, which loads: this reads
    the configs, imports the models and loads the processor, no weights), REPO_ID, then the token and online mode.
    Each a `UsageError`."""
    from .export import check_model_dir, inspect_model_dir

    args = build_parser().parse_args(argv)
    check_model_dir(args.model_dir)
    try:
        args.info = inspect_model_dir(args.model_dir)  # passed on to the export: the processor loads once
        check_repo_id(args.repo_id, flag="REPO_ID")
    except (FileNotFoundError, ValueError) as err:  # the messages name the folder, its file or the repo id
        raise UsageError(str(err)) from None
    problem = hub_access_error(args.token, "--token")
    if problem is not None:
        raise UsageError(str(problem))
    return args


def run(args: argparse.Namespace) -> int:
    """Export and upload the folder; prints the repository's URL and returns the exit status."""
    from transformers.utils import logging as hf_logging

    # export's check loads the weights once: its progress bar is noise here (`run_command` restores the setting)
    hf_logging.disable_progress_bar()
    try:
        url = push_model_dir(
            args.model_dir,
            args.repo_id,
            private=args.private,
            revision=args.revision,
            commit_message=args.commit_message,
            token=args.token,
            info=args.info,
        )
    except (FileNotFoundError, FileExistsError, ValueError) as err:  # the folder's content, found on export
        raise UsageError(str(err)) from None
    print(url)
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point of `energyformers push`; returns the exit status."""
    return run_command("push", parse, run, list(sys.argv[1:] if argv is None else argv))
