"""Real 2-process DDP on CPU (gloo): the Trainer CLI under torchrun, the Accelerate loop under `accelerate launch`.

Each rank dumps its parameters when training ends; both ranks must hold identical weights and the run
must take the expected global number of steps (the data is split across the two processes).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures import cli_config, run_launcher
from safetensors.torch import load_file

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
TINY = cli_config("hyperset")
# The launchers as modules of this interpreter, not the console scripts next to it: a script's shebang may name
# another environment's python (a copied virtualenv), whose workers would import another checkout's package.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ACCELERATE_LAUNCH = [sys.executable, "-m", "accelerate.commands.launch"]
N_TRAIN, BATCH, EPOCHS = 40, 4, 2

TRAINER_SCRIPT = """
import sys
from safetensors.torch import save_file
from transformers import TrainerCallback
from energyformers.training import train

class DumpParameters(TrainerCallback):
    def on_train_end(self, args, state, control, model=None, **kwargs):
        tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
        save_file(tensors, f"{OUT}/rank{args.process_index}.safetensors", metadata={"step": str(state.global_step)})

sys.exit(train.main(sys.argv[1:], callbacks=[DumpParameters()]))
"""

ACCELERATE_SCRIPT = """
import sys
from safetensors.torch import save_file
from energyformers.training import accelerate_loop

def dump(model, accelerator):
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    save_file(tensors, f"{OUT}/rank{accelerator.process_index}.safetensors")

sys.exit(accelerate_loop.main(sys.argv[1:], on_train_end=dump))
"""


def launch(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    proc = run_launcher(argv, tmp_path, ENV)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


def assert_ranks_identical(tmp_path: Path) -> None:
    ranks = [load_file(tmp_path / f"rank{r}.safetensors") for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys()
    for key in ranks[0]:
        assert torch.equal(ranks[0][key], ranks[1][key]), key


def common_args(out: Path) -> list[str]:
    return [
        "--dataset", "digits", "--max_train_samples", str(N_TRAIN), "--max_eval_samples", "16",
        "--max_test_samples", "16", "--config", *TINY, "--batch_size", str(BATCH), "--num_train_epochs",
        str(EPOCHS), "--num_predictions", "0", "--output_dir", str(out),
    ]  # fmt: skip


@pytest.mark.skipif(
    shutil.which("torchrun", path=str(BIN)) is None, reason="torchrun not installed in the venv"
)
def test_trainer_cli_under_torchrun_two_processes(tmp_path: Path) -> None:
    script = tmp_path / "run_trainer.py"
    script.write_text(TRAINER_SCRIPT.replace("{OUT}", str(tmp_path)))
    out = tmp_path / "model"
    launch(
        [
            *TORCHRUN,
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            *common_args(out),
            "--disable_tqdm",
        ],
        tmp_path,
    )
    assert_ranks_identical(tmp_path)
    metrics = json.loads((out / "metrics.json").read_text())
    expected = math.ceil(N_TRAIN / (2 * BATCH)) * EPOCHS  # each rank sees half of every epoch
    assert metrics["recipe"]["world_size"] == 2
    assert metrics["recipe"]["global_step"] == expected
    assert load_file(tmp_path / "rank0.safetensors").keys() == load_file(out / "model.safetensors").keys()


@pytest.mark.skipif(shutil.which("accelerate", path=str(BIN)) is None, reason="accelerate CLI not installed")
def test_accelerate_loop_under_accelerate_launch_two_processes(tmp_path: Path) -> None:
    script = tmp_path / "run_loop.py"
    script.write_text(ACCELERATE_SCRIPT.replace("{OUT}", str(tmp_path)))
    out = tmp_path / "model"
    proc = launch(
        [
            *ACCELERATE_LAUNCH, "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", str(script), *common_args(out),
        ],
        tmp_path,
    )  # fmt: skip
    assert_ranks_identical(tmp_path)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"]["world_size"] == 2
    assert metrics["recipe"]["global_step"] == math.ceil(N_TRAIN / (2 * BATCH)) * EPOCHS
    # the log lines come from rank 0 only, as under Trainer: one per logged step and one per evaluation
    logged = [line for line in proc.stdout.splitlines() if line.startswith('{"step"')]
    assert len(logged) == len(metrics["log_history"]), proc.stdout[-3000:]
    assert sum('"eval_loss"' in line for line in logged) == EPOCHS, proc.stdout[-3000:]
