"""`energyformers` command line: one sub-command per module, each owning its own argument parser.

Sub-command modules are imported lazily so `energyformers predict` does not pay for the
training stack and a broken optional path cannot break the others.
"""

from __future__ import annotations

import importlib
import sys

# sub-command -> (module under energyformers.training, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("train", "fine-tune a model with transformers.Trainer"),
    "train-accelerate": ("accelerate_loop", "the same training with a plain Accelerate loop"),
    "predict": ("predict", "classify images or texts with a saved model folder"),
    "export": ("export", "write a Hub-ready folder with remote code and a model card"),
    "push": ("push", "export and upload a model folder to the Hugging Face Hub"),
    "release": ("release", "train or take the reference checkpoints and export them under dist/"),
    "convert": (
        "convert_cli",
        "convert the authors' official checkpoints to verified model folders and back",
    ),
    "inspect": ("inspect", "draw a model's energy / fixed-point / kernel-width dynamics (PNG + JSON)"),
}


def _usage() -> str:
    lines = ["usage: energyformers COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<17} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(
            f"energyformers: unknown command {command!r}; expected one of {sorted(COMMANDS)}\n",
            file=sys.stderr,
        )
        print(_usage(), file=sys.stderr)
        return 2
    module = importlib.import_module(f"energyformers.training.{COMMANDS[command][0]}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
