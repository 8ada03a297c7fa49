"""Stopping a training run on request: SIGTERM (preemption, a scheduler's stop) or SIGINT (Ctrl-C).

Both loops treat the two signals alike: the step in progress finishes, a checkpoint is saved in
`<output_dir>.checkpoints/`, and the command prints how to continue (`--resume`) and exits with 128 + the signal
number (143, 130). A second Ctrl-C stops at once (`KeyboardInterrupt`) for whoever cannot wait for the step.
"""

from __future__ import annotations

import shlex
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Records the first stop signal; the training loop polls `received` after each optimizer step."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def received(self) -> bool:
        return self.signum is not None

    def handler(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: do not wait for the checkpoint
        if self.signum is None and signum == signal.SIGINT:
            print(
                "\ninterrupted: saving a checkpoint after this step (Ctrl-C again to stop without one)",
                file=sys.stderr,
                flush=True,
            )
        self.signum = signum

    @contextmanager
    def installed(self, enabled: bool = True) -> Iterator[StopRequest]:
        """Handle SIGTERM and SIGINT while the block runs (not at all when `enabled` is false: with several
        processes one rank stopping alone would hang the others in all-reduce); the old handlers come back after."""
        previous = {signum: signal.getsignal(signum) for signum in SIGNALS} if enabled else {}
        for signum in previous:
            signal.signal(signum, self.handler)
        try:
            yield self
        finally:
            for signum, old in previous.items():
                signal.signal(signum, old)

    def report(self, command: str, argv: list[str], step: int, work_dir: Path) -> int:
        """Print where the checkpoint is and the command that continues the run; returns the exit status."""
        assert self.signum is not None
        resume = [*argv] if "--resume" in argv else [*argv, "--resume"]
        print(
            f"energyformers {command}: stopped by {signal.Signals(self.signum).name} at step {step}; checkpoint "
            f"saved in {work_dir}. Continue with:\n  {shlex.join(['energyformers', command, *resume])}",
            file=sys.stderr,
            flush=True,
        )
        return 128 + self.signum


__all__ = ["SIGNALS", "StopRequest"]
