"""SIGTERM in a real 2-process run on CPU (gloo): the ranks agree to stop after the same step (or at the same
prediction step of an evaluation during training), save one checkpoint together, exit with 143 and print the
"Continue with" line once (rank 0); `--resume` continues the run.

The ranks are started as a launcher starts them (RANK, WORLD_SIZE, MASTER_ADDR, ... in the environment) but by
this test, so each rank's own exit status can be checked; under torchrun the launcher's status is torchrun's. The
signal goes to rank 1 only: rank 0 learns of it through the per-step agreement, the part a launcher forwarding
the signal to every rank would not test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fixtures import cli_config, rounding

from energyformers.training import interrupt

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
TINY = cli_config("hyperset")
TIMEOUT_S = 300  # a stuck collective (a rank that stopped alone) must fail the test, not hang it
# What one collective of the evaluation test's ranks may wait for the other rank once both have started (the
# group's timeout, gloo's): there they run the same few milliseconds of work between collectives, so a longer wait
# is a rank waiting in a collective the other never enters (the ranks disagreeing on when to reduce), which fails
# the test in about a minute instead of at TIMEOUT_S; a minute, not seconds, so that a rank starved by a loaded
# machine (other tests, other jobs on two cores) is not taken for one that disagrees
COLLECTIVE_TIMEOUT_S = 60

# rank 1 sends itself SIGTERM while its first logged step is logged (Trainer logs after `on_step_end`, where
# the ranks agree): rank 1 has already agreed to go on at step 1, so both ranks stop after step 2
TRAINER_SCRIPT = """
import os, signal, sys
from transformers import TrainerCallback
from energyformers.training import train

class SignalRankOne(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if args.process_index == 1 and state.global_step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

sys.exit(train.main(sys.argv[1:], callbacks=[SignalRankOne()]))
"""


class Rank(subprocess.Popen):
    store: torch.distributed.TCPStore  # the group's rendezvous, kept while a rank can still reach it


def start_ranks(command: list[str], tmp_path: Path, name: str) -> list[Rank]:
    """Two ranks of one process group, each writing `<name>.rank<r>.out` / `.err` in `tmp_path`.

    The rendezvous store is this process's, as torchrun hosts it (`TORCHELASTIC_USE_AGENT_STORE`: every rank
    connects to it; none starts one): bound here to a port the system chooses, it is listening before a rank
    starts, so no other socket can take its port in the seconds a rank takes to start."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, world_size=2, is_master=True, wait_for_workers=False)
    ranks = []
    for rank in (0, 1):
        env = {
            **ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True",
        }  # fmt: skip
        out = open(tmp_path / f"{name}.rank{rank}.out", "w")  # the child writes; our copy closes below
        err = open(tmp_path / f"{name}.rank{rank}.err", "w")
        ranks.append(Rank(command, stdout=out, stderr=err, env=env, cwd=tmp_path))
        ranks[-1].store = store
        out.close(), err.close()
    return ranks


def wait_all(ranks: list[subprocess.Popen]) -> list[int]:
    deadline = time.monotonic() + TIMEOUT_S
    try:
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()


def logs(tmp_path: Path, name: str) -> dict[str, str]:
    return {f.name: f.read_text() for f in sorted(tmp_path.glob(f"{name}.rank*.*"))}


def args(out: Path, max_steps: int, eval_samples: int = 16) -> list[str]:
    return [
        "--dataset", "digits", "--config", *TINY, "--max_train_samples", "64", "--max_eval_samples", str(eval_samples),
        "--max_test_samples", "16", "--batch_size", "4", "--max_steps", str(max_steps), "--logging_steps", "1",
        "--save_strategy", "steps", "--save_steps", "100", "--eval_strategy", "no", "--num_predictions", "0",
        "--num_threads", "1", "--disable_tqdm", "--output_dir", str(out),
    ]  # fmt: skip


@pytest.mark.slow  # two 2-process launches: over 30 s
def test_trainer_sigterm_to_one_rank_stops_both_and_resume_continues(tmp_path: Path) -> None:
    script = tmp_path / "signal_rank_one.py"
    script.write_text(TRAINER_SCRIPT)
    out = tmp_path / "model"
    statuses = wait_all(start_ranks([sys.executable, str(script), *args(out, 6)], tmp_path, "stop"))
    text = logs(tmp_path, "stop")
    assert statuses == [143, 143], (statuses, {k: v[-2500:] for k, v in text.items()})
    work = tmp_path / "model.checkpoints"
    checkpoints = sorted(p.name for p in work.glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-2"], (checkpoints, text["stop.rank0.err"][-2500:])
    assert not out.exists()
    # the report comes once, from rank 0, though the signal reached rank 1 only
    assert text["stop.rank0.err"].count("Continue with:") == 1, text["stop.rank0.err"][-2500:]
    assert "stopped by SIGTERM at step 2" in text["stop.rank0.err"]
    assert "Continue with:" not in text["stop.rank1.err"], text["stop.rank1.err"][-2500:]
    assert "Traceback" not in text["stop.rank0.err"] + text["stop.rank1.err"]
    # Trainer wraps the model in DDP without searching for unused parameters (every parameter gets a gradient)
    assert "find_unused_parameters" not in text["stop.rank0.err"] + text["stop.rank1.err"]

    resume = [sys.executable, "-m", "energyformers", "train", *args(out, 6), "--resume"]
    statuses = wait_all(start_ranks(resume, tmp_path, "resume"))
    text = logs(tmp_path, "resume")
    assert statuses == [0, 0], (statuses, {k: v[-2500:] for k, v in text.items()})
    assert "resuming from step 2" in text["resume.rank0.out"], text["resume.rank0.out"][-2500:]
    recipe = json.loads((out / "metrics.json").read_text())["recipe"]
    assert (recipe["global_step"], recipe["world_size"]) == (6, 2), recipe
    assert recipe["resumed_from"].endswith("checkpoint-2"), recipe


# rank 1 sends itself SIGTERM at its first prediction step of the step-2 evaluation; each rank writes the number
# of prediction steps it ran to argv[1].rank<r>. The ranks agree after every batch (`EVALUATION_CHECK_S` 0), so
# the batch they stop at is known (`test_an_evaluation_agrees_on_a_stop_every_few_batches...`: the default)
TRAINER_EVALUATION_SCRIPT = """
import os, signal, sys
from transformers import TrainerCallback
from energyformers.training import train
from energyformers.training.interrupt import StopRequest

StopRequest.EVALUATION_CHECK_S = 0

class SignalRankOneInEvaluation(TrainerCallback):
    steps = 0

    def on_prediction_step(self, args, state, control, **kwargs):
        type(self).steps += 1
        if args.process_index == 1 and self.steps == 1:
            os.kill(os.getpid(), signal.SIGTERM)

status = train.main(sys.argv[2:], callbacks=[SignalRankOneInEvaluation()])
open(f"{sys.argv[1]}.rank{os.environ['RANK']}", "w").write(str(SignalRankOneInEvaluation.steps))
sys.exit(status)
"""


@pytest.mark.slow  # a 2-process launch
def test_trainer_sigterm_to_one_rank_during_an_evaluation_stops_both_at_the_next_prediction_step(
    tmp_path: Path,
) -> None:
    script = tmp_path / "signal_rank_one.py"
    script.write_text(TRAINER_EVALUATION_SCRIPT)
    out = tmp_path / "model"
    argv = args(out, 6)
    argv[argv.index("--eval_strategy") + 1] = "steps"
    argv += [
        "--eval_steps",
        "2",
        "--per_device_eval_batch_size",
        "2",
    ]  # 16 samples: 4 prediction steps per rank
    command = [sys.executable, str(script), str(tmp_path / "steps"), *argv]
    statuses = wait_all(start_ranks(command, tmp_path, "stop"))
    text = logs(tmp_path, "stop")
    assert statuses == [143, 143], (statuses, {k: v[-2500:] for k, v in text.items()})
    steps = [int((tmp_path / f"steps.rank{rank}").read_text()) for rank in (0, 1)]
    assert steps == [1, 1], f"prediction steps run per rank: {steps} (of 4)"
    checkpoints = sorted(p.name for p in (tmp_path / "model.checkpoints").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-2"], (checkpoints, text["stop.rank0.err"][-2500:])
    assert "stopped by SIGTERM at step 2" in text["stop.rank0.err"], text["stop.rank0.err"][-2500:]
    assert "Traceback" not in text["stop.rank0.err"] + text["stop.rank1.err"]


def first_logged_step(path: Path, ranks: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while '{"step"' not in path.read_text():
        assert all(p.poll() is None for p in ranks) and time.monotonic() < deadline, path.read_text()[-2500:]
        time.sleep(0.05)


@pytest.mark.slow  # two 2-process launches: over 30 s
def test_accelerate_loop_sigterm_to_one_rank_stops_both_and_evaluation_is_exact(tmp_path: Path) -> None:
    out = tmp_path / "model"
    # far more steps than the run can take before the signal: it stops at the step the ranks agree on
    command = [
        sys.executable,
        "-m",
        "energyformers.training.accelerate_loop",
        *args(out, 5000, eval_samples=15),
    ]
    ranks = start_ranks(command, tmp_path, "stop")
    first_logged_step(tmp_path / "stop.rank0.out", ranks)
    os.kill(ranks[1].pid, signal.SIGTERM)
    statuses = wait_all(ranks)
    text = logs(tmp_path, "stop")
    assert statuses == [143, 143], (statuses, {k: v[-2500:] for k, v in text.items()})
    checkpoints = [p.name for p in (tmp_path / "model.checkpoints").glob("step_*")]
    assert len(checkpoints) == 1, checkpoints
    step = int(checkpoints[0].removeprefix("step_"))
    assert 1 <= step < 5000, step
    assert text["stop.rank0.err"].count("Continue with:") == 1, text["stop.rank0.err"][-2500:]
    assert f"stopped by SIGTERM at step {step}" in text["stop.rank0.err"]
    assert "Continue with:" not in text["stop.rank1.err"], text["stop.rank1.err"][-2500:]
    state = json.loads((tmp_path / "model.checkpoints" / checkpoints[0] / "loop_state.json").read_text())
    assert state["step"] == step, state

    resume = [*command[:3], *args(out, step + 2, eval_samples=15), "--resume"]
    statuses = wait_all(start_ranks(resume, tmp_path, "resume"))
    text = logs(tmp_path, "resume")
    assert statuses == [0, 0], (statuses, {k: v[-2500:] for k, v in text.items()})
    assert f"resuming from step {step}" in text["resume.rank0.out"], text["resume.rank0.out"][-2500:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"]["global_step"] == step + 2, metrics["recipe"]

    # 15 validation samples on 2 processes: one rank's last batch is padded with a repeated sample, which the
    # gathered loss must not count. The same loss in this one process, one batch of all 15:
    from accelerate import PartialState
    from safetensors.torch import load_file

    from energyformers.training import accelerate_loop
    from energyformers.training.setup import build

    built = build(accelerate_loop.parse(args(tmp_path / "ref", 1, eval_samples=15)), PartialState())
    built.model.load_state_dict(load_file(out / "model.safetensors"))
    built.model.eval()
    split = built.data["validation"]
    with torch.no_grad():
        expected = built.model(**built.collator([split[i] for i in range(len(split))])).loss.item()
    # the mean of 15 float32 cross-entropies (each ~ln 10) summed in another order: 64 roundings, relative
    assert metrics["eval"]["loss"] == pytest.approx(expected, rel=rounding(torch.float32, 64), abs=0), (
        metrics["eval"]["loss"],
        expected,
    )


# SIGTERM is the case CI runs (one launch); Ctrl-C, whose signal reaches each worker twice, is slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_torchrun_forwards_the_signal_and_the_workers_save_in_its_grace_period(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """The launcher signalled (as by a scheduler, or Ctrl-C reaching the whole terminal group): torchrun sends the
    signal on to the workers and waits its grace period (`--shutdown-timeout`, 30 s by default) before SIGKILL;
    the workers stop after a common step, save and report once. torchrun's own status is 1 (it re-raises)."""
    out = tmp_path / "model"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command = [*launcher, "-m", "energyformers", "train", *args(out, 5000)]
    log = tmp_path / "torchrun.out"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            command, stdout=f, stderr=subprocess.STDOUT, env=ENV, cwd=tmp_path, start_new_session=True
        )
    first_logged_step_trainer(log, proc)
    # Ctrl-C reaches every process of the terminal's group; SIGTERM from a scheduler reaches the launcher
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    checkpoints = sorted(p.name for p in (tmp_path / "model.checkpoints").glob("checkpoint-*"))
    assert len(checkpoints) == 1, (checkpoints, text[-3000:])
    assert text.count("Continue with:") == 1, text[-3000:]
    assert f"stopped by {sig.name} at step" in text, text[-3000:]
    assert text.count("interrupted: saving") == (1 if sig == signal.SIGINT else 0), text[-3000:]
    assert "KeyboardInterrupt" not in text, text[-3000:]
    # Trainer wraps the model in DDP without searching for unused parameters (every parameter gets a gradient)
    assert "find_unused_parameters" not in text, text[-3000:]


def first_logged_step_trainer(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while "'loss'" not in path.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text()[-2500:]
        time.sleep(0.05)


def test_a_launchers_forwarded_copy_of_a_ctrl_c_is_not_a_second_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a launcher one Ctrl-C reaches each worker twice, from the terminal's process group and forwarded by
    the launcher: a repeat within `FORWARDED_REPEAT_S` of the first is the same request; a later one, or any repeat
    in one process, is a second Ctrl-C (`KeyboardInterrupt`: stop without the checkpoint). The slow torchrun Ctrl-C
    test above passes without the repeat rule; here the handler runs on the test's clock."""
    now = [100.0]
    monkeypatch.setattr(interrupt, "time", SimpleNamespace(monotonic=lambda: now[0]))
    repeat_s = interrupt.StopRequest.FORWARDED_REPEAT_S

    def second_ctrl_c(request: interrupt.StopRequest, after_s: float) -> bool:
        """Whether a Ctrl-C `after_s` seconds after the first one raised KeyboardInterrupt."""
        now[0] = 100.0
        request.handler(signal.SIGINT, None)
        now[0] += after_s
        try:
            request.handler(signal.SIGINT, None)
        except KeyboardInterrupt:
            return True
        return False

    for several, after_s, raises in [
        (True, 0.0, False),
        (True, repeat_s / 2, False),
        (True, repeat_s * 1.5, True),
        (False, 0.0, True),
    ]:
        request = interrupt.StopRequest()
        with request.installed(several_processes=several, announce=False):
            raised = second_ctrl_c(request, after_s)
        where = f"several processes: {several}, a second Ctrl-C {after_s} s after the first (repeat window {repeat_s} s)"
        assert raised == raises, f"{where}: KeyboardInterrupt raised {raised}, expected {raises}"
        assert request.signum == signal.SIGINT, (where, request.signum)


# Two evaluations of 20 batches per rank with `accelerate_loop.evaluate_split`, every `dist.all_reduce` counted, on
# a test clock that each batch advances by a fixed time (`interrupt.time`): the counts are those of the batch times
# given here, not of how loaded the machine is. Rank 1's batches take twice rank 0's, so both ranks size the
# interval from rank 1's. One pass without a signal at an `EVALUATION_CHECK_S` of 10 s, then one at 1/16 s (2 of
# rank 1's batches) where rank 1 sends itself SIGTERM in its 5th batch; each rank writes what it saw to
# argv[1].rank<r>. A collective that waits longer than argv[2] seconds (`COLLECTIVE_TIMEOUT_S`) ends the rank with
# status 1, after writing the counts of the pass so far and the error; argv[3]: how long a rank waits for the other
# to start (`TIMEOUT_S`)
EVALUATION_COLLECTIVES_SCRIPT = """
import json, os, signal, sys
from datetime import timedelta
from types import SimpleNamespace
import torch
import torch.distributed as dist
from accelerate import Accelerator, InitProcessGroupKwargs
from torch.utils.data import DataLoader
from energyformers.training import accelerate_loop
from energyformers.training.arguments import MIM_TASK
from energyformers.training import interrupt
from energyformers.training.interrupt import EvaluationStopped, StopRequest

# both ranks meet at the test's store first, with the long wait (one may take seconds longer to import), so the
# group's short timeout counts only the waits of its collectives, not a rank's start
rank, started = int(os.environ["RANK"]), timedelta(seconds=float(sys.argv[3]))
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=started)
store.set(f"evaluate.started.{rank}", "1")
store.wait(["evaluate.started.0", "evaluate.started.1"])
collective_timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=float(sys.argv[2])))
accelerator = Accelerator(cpu=True, kwargs_handlers=[collective_timeout])
rank = accelerator.process_index
clock = [0.0]
interrupt.time = SimpleNamespace(monotonic=lambda: clock[0])  # the batches' time, not the machine's
BATCH_S = 1 / 64 if rank == 0 else 1 / 32  # powers of 2: the interval's arithmetic is exact

class Slow(torch.nn.Module):
    def __init__(self, signal_at=None):
        super().__init__()
        self.linear, self.batches, self.signal_at = torch.nn.Linear(4, 3), 0, signal_at

    def forward(self, x, labels):
        self.batches += 1
        if rank == 1 and self.batches == self.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        clock[0] += BATCH_S
        logits = self.linear(x)
        return SimpleNamespace(logits=logits, loss=torch.nn.functional.cross_entropy(logits, labels))

generator = torch.Generator().manual_seed(0)
rows = [(torch.randn(4, generator=generator), i % 3) for i in range(80)]
collate = lambda rows: {"x": torch.stack([x for x, _ in rows]), "labels": torch.tensor([y for _, y in rows])}
loader = accelerator.prepare(DataLoader(rows, batch_size=2, collate_fn=collate))
reductions = []
all_reduce = dist.all_reduce

def counting_all_reduce(*args, **kwargs):
    reductions.append(1)
    return all_reduce(*args, **kwargs)

dist.all_reduce = counting_all_reduce
seen = {}
for name, signal_at, check_s in (("whole", None, 10.0), ("stopped", 5, 1 / 16)):
    StopRequest.EVALUATION_CHECK_S = check_s
    model, stop, stopped = Slow(signal_at), StopRequest(), False
    reductions.clear()
    with stop.installed(several_processes=True, announce=False):
        try:
            accelerate_loop.evaluate_split(model, loader, accelerator, MIM_TASK, stop)
        except EvaluationStopped:
            stopped = True
        except RuntimeError as error:  # a collective that timed out (the other rank never entered it), say
            seen[name] = {"batches": model.batches, "all_reduce": len(reductions), "error": str(error)[:300]}
            open(f"{sys.argv[1]}.rank{rank}", "w").write(json.dumps(seen))
            print(json.dumps(seen), file=sys.stderr, flush=True)
            os._exit(1)  # not through the group's teardown, which may wait on the other rank again
    seen[name] = {"batches": model.batches, "all_reduce": len(reductions), "stopped": stopped}
open(f"{sys.argv[1]}.rank{rank}", "w").write(json.dumps(seen))
dist.destroy_process_group()  # not left to interpreter exit, where gloo's threads may abort the process
# the group's threads end with it unless something still holds the group (`torch.distributed.fsdp` imported after
# `init_process_group`, as `transformers.pipelines` does): then they are left to abort the process at exit
tasks = "/proc/self/task"
threads = [open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks)] if os.path.isdir(tasks) else []
print(json.dumps({"threads_after_destroy": sorted(threads)}), flush=True)
"""


def test_an_evaluation_agrees_on_a_stop_every_few_batches_and_all_ranks_stop_at_the_same_one(
    tmp_path: Path,
) -> None:
    """Fewer collectives than batches, not one per batch: about one a second (`EVALUATION_CHECK_S`), sized
    from the slowest rank's batch time that the same all-reduce shares; with the signal at one rank only, both
    ranks still stop after the same batch, a few after the signal."""
    script = tmp_path / "evaluate.py"
    script.write_text(EVALUATION_COLLECTIVES_SCRIPT)
    # faulthandler: an abort (SIGABRT) prints where each thread was
    timeouts = [str(COLLECTIVE_TIMEOUT_S), str(TIMEOUT_S)]
    command = [sys.executable, "-X", "faulthandler", str(script), str(tmp_path / "seen"), *timeouts]
    statuses = wait_all(start_ranks(command, tmp_path, "evaluate"))
    text = logs(tmp_path, "evaluate")
    # a rank whose collective timed out wrote the batches and all-reduces of each pass up to there
    counts = "; ".join(f"{p.name}: {p.read_text()}" for p in sorted(tmp_path.glob("seen.rank*")))
    tails = {k: v[-2500:] for k, v in text.items()}
    assert statuses == [0, 0], f"statuses {statuses}; {counts or 'no counts written'}; logs {tails}"
    for rank in (0, 1):
        threads = json.loads(text[f"evaluate.rank{rank}.out"].splitlines()[-1])["threads_after_destroy"]
        assert not [t for t in threads if "gloo" in t], (
            f"rank {rank}: the process group outlived its destruction: {threads}"
        )
    seen = [json.loads((tmp_path / f"seen.rank{rank}").read_text()) for rank in (0, 1)]
    whole, stopped = [s["whole"] for s in seen], [s["stopped"] for s in seen]
    # no signal: an agreement after the first batch, then none for 10 s / (1/32 s) = 320 batches, more than the pass
    assert whole == [{"batches": 20, "all_reduce": 1, "stopped": False}] * 2, whole
    # the signal in batch 5: agreements after batches 1, 3 and 5, every (1/16) / (1/32) = 2 batches of the slower
    # rank (of rank 0's own time it would be every 4, and the ranks would disagree on when to reduce)
    assert stopped == [{"batches": 5, "all_reduce": 3, "stopped": True}] * 2, stopped
