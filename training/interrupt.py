"""Stopping a training run on request: SIGTERM (preemption, a scheduler's stop) or SIGINT (Ctrl-C).

Both loops treat the two signals alike: the step in progress finishes, a checkpoint is saved in
`<output_dir>.checkpoints/`, and the command prints how to continue (`--resume`) and exits with 128 + the signal
number (143, 130). A second Ctrl-C stops at once (`KeyboardInterrupt`) for whoever cannot wait for the step.
An evaluation during training ends at its next batch (`EvaluationStopped`), abandoned: it can take longer than
many training steps.

With several processes every rank handles the signals too, and the ranks decide together: after each optimizer
step, and at each batch of an evaluation during training, they all-reduce one flag (`StopRequest.should_stop`), so
all of them stop at the same point and save the checkpoint together, whichever rank (or all, as a launcher forwards
the signal) was signalled.
"""

from __future__ import annotations

import shlex
import signal
import sys
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
    """Records the first stop signal; the training loop asks `should_stop` after each optimizer step."""

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
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            import torch

            flag = torch.tensor([self.signum or 0], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            agreed_signum = int(flag.item())
            if agreed_signum and self.signum is None:
                self.signum = agreed_signum  # another rank's signal: report and exit with its status
            self.agreed = agreed_signum != 0
        else:
            self.agreed = self.received
        return self.agreed

    @contextmanager
    def installed(self, *, several_processes: bool = False, announce: bool = True) -> Iterator[StopRequest]:
        """Handle SIGTERM and SIGINT while the block runs; the old handlers come back after. `several_processes`:
        the ranks of one run, where a launcher forwards the terminal's Ctrl-C (`FORWARDED_REPEAT_S`); `announce`:
        print the Ctrl-C notice (the main process only)."""
        self._several_processes, self._announce = several_processes, announce
        previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
        for signum in previous:
            signal.signal(signum, self.handler)
        try:
            yield self
        finally:
            for signum, old in previous.items():
                signal.signal(signum, old)

    def report(self, command: str, argv: list[str], step: int, work_dir: Path) -> int:
        """Print where the checkpoint is and the command that continues the run; returns the exit status."""
        if self.signum is None:
            raise ValueError("StopRequest.report: no stop signal was received")
        resume = [*argv] if "--resume" in argv else [*argv, "--resume"]
        print(
            f"energyformers {command}: stopped by {signal.Signals(self.signum).name} at step {step}; checkpoint "
            f"saved in {work_dir}. Continue with:\n  {shlex.join(['energyformers', command, *resume])}",
            file=sys.stderr,
            flush=True,
        )
        return 128 + self.signum


__all__ = ["SIGNALS", "EvaluationStopped", "StopRequest"]
