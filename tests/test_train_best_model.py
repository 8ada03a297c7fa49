"""`energyformers train --load_best_model_at_end --metric_for_best_model M`: the output folder holds the weights of
the best evaluated checkpoint (EMA ones with `--ema_decay`), metrics.json says which, and settings that cannot
support it are refused before anything runs (status 2, one line naming the flag, the value and what is allowed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from energyformers.training import accelerate_loop, train
from energyformers.training.cli import UsageError

MAX_STEPS, EVAL_STEPS = 8, 2
TINY = [
    "--dataset", "digits", "--config", "hidden_size=32", "num_attention_heads=4",
    "--max_train_samples", "64", "--max_eval_samples", "32", "--max_test_samples", "16",
    "--batch_size", "8", "--num_threads", "1", "--disable_tqdm", "--num_predictions", "0",
    "--seed", "0", "--lr", "3e-2",
]  # fmt: skip
BEST = ["--load_best_model_at_end", "--metric_for_best_model", "accuracy"]
# the metric to follow comes next
BY_METRIC = ["--max_steps", "8", "--load_best_model_at_end", "--metric_for_best_model"]  # fmt: skip


def best_run(out: Path, *extra: str) -> dict:
    """A run evaluated and checkpointed every EVAL_STEPS steps, keeping its checkpoints; its metrics.json."""
    rc = train.main([
        *TINY, "--max_steps", str(MAX_STEPS), "--eval_steps", str(EVAL_STEPS), "--keep_checkpoints",
        *BEST, *extra, "--output_dir", str(out),
    ])  # fmt: skip
    assert rc == 0, f"energyformers train exited {rc}"
    return json.loads((out / "metrics.json").read_text())


def training_evaluations(metrics: dict) -> list[tuple[int, float]]:
    """(step, eval_accuracy) of the evaluations during training: the first MAX_STEPS // EVAL_STEPS entries (the
    loop's final re-evaluation of the saved weights is logged after them, at the last step again)."""
    evals = [(h["step"], h["eval_accuracy"]) for h in metrics["log_history"] if "eval_accuracy" in h]
    return evals[: MAX_STEPS // EVAL_STEPS]


def assert_same_weights(
    saved: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], what: str
) -> None:
    """Exact equality: both are the same float32 tensors written to safetensors, no arithmetic in between."""
    assert saved.keys() == reference.keys(), f"{what}: keys differ: {sorted(saved.keys() ^ reference.keys())}"
    worst = max((saved[k].float() - reference[k].float()).abs().max().item() for k in saved)
    assert worst == 0.0, f"{what}: max |Δw| = {worst:.3g}, expected 0 (the same weights)"


def test_best_checkpoint_weights_are_saved_and_recorded(tmp_path: Path) -> None:
    out = tmp_path / "run"
    metrics = best_run(out)
    evals = training_evaluations(metrics)
    # transformers keeps the first of equal values (a later one must be strictly better)
    best_value = max(value for _, value in evals)
    best_step = next(step for step, value in evals if value == best_value)
    saved = metrics["saved_weights"]
    assert saved == {
        "weights": "best",
        "step": best_step,
        "metric": "eval_accuracy",
        "value": best_value,
        "greater_is_better": True,
        "ema": False,
        "last_step": MAX_STEPS,
    }, f"saved_weights {saved}; evaluations {evals}"
    checkpoints = Path(f"{out}.checkpoints")
    # the default --save_total_limit 2: rotation keeps the best checkpoint and the last one
    weights = load_file(str(out / "model.safetensors"))
    assert_same_weights(
        weights, load_file(str(checkpoints / f"checkpoint-{best_step}" / "model.safetensors")), "best"
    )
    if best_step != MAX_STEPS:  # the seeded run peaks before its end: the last weights are not what was saved
        last = load_file(str(checkpoints / f"checkpoint-{MAX_STEPS}" / "model.safetensors"))
        assert any(not torch.equal(weights[k], last[k]) for k in weights), "saved the last step's weights"
    # the final evaluation is of the saved weights: the best step's numbers again
    assert metrics["eval"]["accuracy"] == best_value, f"final eval {metrics['eval']} vs best {best_value}"


def test_best_checkpoint_with_ema_saves_that_checkpoints_ema_weights(tmp_path: Path) -> None:
    """The evaluations ranked the EMA weights, so the saved ones are the best checkpoint's EMA file."""
    out = tmp_path / "run"
    metrics = best_run(out, "--ema_decay", "0.5")
    saved = metrics["saved_weights"]
    assert saved["weights"] == "best" and saved["ema"] is True, f"saved_weights {saved}"
    folder = Path(f"{out}.checkpoints") / f"checkpoint-{saved['step']}"
    averaged = load_file(str(folder / "ema_model.safetensors"))
    averaged.pop("n_averaged")
    weights = load_file(str(out / "model.safetensors"))
    assert_same_weights({k: weights[k] for k in averaged}, averaged, "best checkpoint's EMA")


def test_without_the_flag_metrics_json_says_last_step(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert train.main([*TINY, "--max_steps", "2", "--output_dir", str(out)]) == 0
    saved = json.loads((out / "metrics.json").read_text())["saved_weights"]
    assert saved == {"weights": "last", "step": 2, "ema": False}, f"saved_weights {saved}"


REFUSED = {
    "no evaluation": (["--max_steps", "8", "--eval_strategy", "no", *BEST], "--eval_strategy no"),
    "no checkpoints": (["--max_steps", "8", "--save_strategy", "no", *BEST], "--save_strategy no"),
    "strategies differ": (
        ["--max_steps", "8", "--eval_strategy", "steps", "--save_strategy", "epoch", *BEST],
        "evaluation by steps and checkpoints by epoch",
    ),
    "save not a multiple": (
        ["--max_steps", "8", "--eval_steps", "2", "--save_steps", "3", *BEST],
        "--save_steps 3 is not a multiple of --eval_steps 2",
    ),
    "derived eval steps": (  # unset --eval_steps: a quarter of --max_steps 8, i.e. 2
        ["--max_steps", "8", "--save_steps", "3", *BEST],
        "--save_steps 3 is not a multiple of --eval_steps 2",
    ),
    "eval steps unknown": (
        ["--epochs", "1", "--eval_strategy", "steps", "--save_steps", "3", *BEST],
        "--save_steps 3 needs --eval_steps too",
    ),
    "metric the task does not log": (
        ["--max_steps", "8", "--load_best_model_at_end", "--metric_for_best_model", "board_accuracy"],
        "--metric_for_best_model board_accuracy: --dataset digits (classification) logs accuracy, f1_macro, loss",
    ),
    "metric without the flag": (
        ["--max_steps", "8", "--metric_for_best_model", "accuracy"],
        "--metric_for_best_model accuracy: picks the checkpoint --load_best_model_at_end loads",
    ),
    # per-depth names: the depth pass logs the task's primary metric only, at the depths the run evaluates
    "depth name of a metric the depth pass does not log": (
        [*BY_METRIC, "f1_macro_iterations_4"],
        "--metric_for_best_model f1_macro_iterations_4: --dataset digits (classification) logs accuracy, "
        "f1_macro, loss, accuracy_iterations_<t>",
    ),
    "depth not in --eval_iterations": (
        [*BY_METRIC, "eval_accuracy_iterations_4", "--eval_iterations", "1", "8"],
        "--metric_for_best_model eval_accuracy_iterations_4: the run evaluates accuracy_iterations_<t> at t = 1, 8",
    ),
    "depth not among the defaults": (  # T = 4 of the built model (cli-image): T/2, T and 2T; checked once built
        [*BY_METRIC, "accuracy_iterations_3"],
        "--metric_for_best_model accuracy_iterations_3: the run evaluates accuracy_iterations_<t> at t = 2, 4, 8",
    ),
    "model without the depth pass": (
        [*BY_METRIC, "accuracy_iterations_4", "--model", "imixer"],
        "--metric_for_best_model accuracy_iterations_4: imixer has no recurrent depth (no per-call "
        "num_iterations), so the run has no depth pass",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_settings_are_refused_before_anything_runs(case: str, tmp_path: Path, capsys) -> None:
    argv, expected = REFUSED[case]
    out = tmp_path / "run"
    rc = train.main([*TINY, *argv, "--output_dir", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, f"exit status {rc}, stderr {err!r}"
    assert expected in err, f"stderr {err!r} does not say {expected!r}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("energyformers train: error: "), f"stderr {err!r}"
    assert not out.exists() and not Path(f"{out}.checkpoints").exists(), "a refused run left files behind"


@pytest.mark.parametrize(
    ("argv", "allowed"),
    [
        (
            ["--dataset", "sudoku", "--metric_for_best_model", "accuracy"],
            "blank_cell_accuracy, board_accuracy",
        ),
        (["--task", "mim", "--metric_for_best_model", "eval_accuracy"], "masked_token_accuracy"),
    ],
)
def test_metric_is_checked_against_the_task(argv: list[str], allowed: str, tmp_path: Path, capsys) -> None:
    rc = train.main(
        [*argv, "--max_steps", "4", "--load_best_model_at_end", "--output_dir", str(tmp_path / "r")]
    )
    err = capsys.readouterr().err
    assert rc == 2 and allowed in err, f"exit status {rc}, stderr {err!r}"


def test_metric_names_with_and_without_eval_prefix_parse() -> None:
    for metric in ("accuracy", "eval_f1_macro", "loss", "eval_loss"):
        run = train.parse([*TINY, "--max_steps", "8", "--load_best_model_at_end", "--metric_for_best_model", metric,
                           "--output_dir", "unused"]).run  # fmt: skip
        assert run.load_best_model_at_end and run.metric_for_best_model == metric, f"{metric}: {run}"


@pytest.mark.parametrize("flags", [["--load_best_model_at_end"], ["--metric_for_best_model", "accuracy"]])
def test_train_accelerate_refuses_the_flags(flags: list[str], tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    rc = accelerate_loop.main([*TINY, "--max_steps", "8", *flags, "--output_dir", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, f"exit status {rc}, stderr {err!r}"
    assert f"{flags[0]}: energyformers train-accelerate does not track the best checkpoint" in err, err
    assert "use energyformers train" in err and not out.exists(), err


# A run that learns within 16 steps, evaluated every 2 at depths 1 and 8 besides its T = 4: one iteration peaks
# early while the trained depth keeps improving, so the two metrics pick different checkpoints.
DEPTH_RUN = [
    "--dataset", "digits", "--config", "hidden_size=64", "num_attention_heads=4",
    "--max_train_samples", "512", "--max_eval_samples", "64", "--max_test_samples", "16",
    "--batch_size", "32", "--num_threads", "1", "--disable_tqdm", "--num_predictions", "0",
    "--seed", "0", "--lr", "3e-3", "--warmup_steps", "0",
    "--max_steps", "16", "--eval_steps", "2", "--eval_iterations", "1", "8", "--keep_checkpoints",
]  # fmt: skip
DEPTH_KEY = "eval_accuracy_iterations_1"


def first_best(evaluations: dict[int, float]) -> int:
    """The step transformers picks: the first of the highest values (a later one must be strictly better)."""
    best = max(evaluations.values())
    return min(step for step, value in evaluations.items() if value == best)


def test_best_checkpoint_by_a_depth_metric(tmp_path: Path) -> None:
    """`--metric_for_best_model accuracy_iterations_1`: the saved weights are those of the checkpoint whose logged
    accuracy at one iteration (trainer_state.json's log_history) is the best, not the one the trained depth's
    accuracy would pick."""
    out = tmp_path / "run"
    argv = [*DEPTH_RUN, "--load_best_model_at_end", "--metric_for_best_model", "accuracy_iterations_1"]
    assert train.main([*argv, "--output_dir", str(out)]) == 0
    checkpoints = Path(f"{out}.checkpoints")
    state = json.loads((checkpoints / "checkpoint-16" / "trainer_state.json").read_text())
    depth = {h["step"]: h[DEPTH_KEY] for h in state["log_history"] if DEPTH_KEY in h}
    accuracy = {h["step"]: h["eval_accuracy"] for h in state["log_history"] if "eval_accuracy" in h}
    assert sorted(depth) == list(range(2, 17, 2)), f"evaluations logged {DEPTH_KEY} at steps {sorted(depth)}"
    best_step = first_best(depth)
    # the run must tell the metrics apart, or this test could not see which one picked the checkpoint
    assert best_step not in (first_best(accuracy), 16), (
        f"{DEPTH_KEY} {depth} and eval_accuracy {accuracy} pick the same checkpoint ({best_step}) or the last"
    )
    saved = json.loads((out / "metrics.json").read_text())["saved_weights"]
    assert saved == {
        "weights": "best",
        "step": best_step,
        "metric": DEPTH_KEY,
        "value": depth[best_step],
        "greater_is_better": True,
        "ema": False,
        "last_step": 16,
    }, f"saved_weights {saved}; {DEPTH_KEY} by step {depth}"
    weights = load_file(str(out / "model.safetensors"))
    best = load_file(str(checkpoints / f"checkpoint-{best_step}" / "model.safetensors"))
    assert_same_weights(weights, best, f"checkpoint-{best_step}")


def test_depth_metrics_parse_when_the_run_evaluates_that_depth() -> None:
    base = [*TINY, "--max_steps", "8", "--load_best_model_at_end", "--output_dir", "unused"]
    for extra in (
        ["--metric_for_best_model", "accuracy_iterations_16", "--eval_iterations", "4", "16"],
        ["--metric_for_best_model", "eval_accuracy_iterations_8"],  # T unknown until built (the cli preset's)
        ["--metric_for_best_model", "accuracy_iterations_3", "--config", "num_iterations=6"],  # T/2 of 6
        ["--dataset", "sudoku", "--metric_for_best_model", "blank_cell_accuracy_iterations_2"],
    ):
        run = train.parse([*base, *extra]).run
        assert run.metric_for_best_model == extra[extra.index("--metric_for_best_model") + 1], (
            f"{extra}: {run}"
        )


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (  # --config num_iterations=6: T/2, T and 2T known while parsing
            ["--config", "num_iterations=6", "--metric_for_best_model", "accuracy_iterations_4"],
            "--metric_for_best_model accuracy_iterations_4: the run evaluates accuracy_iterations_<t> at t = 3, 6, 12",
        ),
        (  # a local checkpoint's model type and T, read from its config.json
            ["--from_pretrained", "{folder}", "--metric_for_best_model", "accuracy_iterations_4"],
            "--metric_for_best_model accuracy_iterations_4: hyperbf has no recurrent depth",
        ),
        (
            ["--dataset", "sudoku", "--metric_for_best_model", "board_accuracy_iterations_4"],
            "--dataset sudoku (token-classification) logs blank_cell_accuracy, board_accuracy, loss, "
            "blank_cell_accuracy_iterations_<t>",
        ),
        (  # leading zeros: not the name the depth pass logs
            ["--metric_for_best_model", "accuracy_iterations_08"],
            "--metric_for_best_model accuracy_iterations_08: --dataset digits (classification) logs",
        ),
    ],
)
def test_depth_metrics_are_refused_while_parsing(extra: list[str], expected: str, tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "hyperbf", "num_iterations": 4}))
    extra = [item.replace("{folder}", str(folder)) for item in extra]
    argv = [*TINY[:2], "--max_steps", "8", "--load_best_model_at_end", *extra, "--output_dir", "unused"]
    with pytest.raises(UsageError) as refused:
        train.parse(argv)
    assert expected in str(refused.value), f"{refused.value!s} does not say {expected!r}"


def test_depth_pass_table_matches_the_models() -> None:
    """`DEPTH_PASS` (read while parsing, without torch) against the models: the backbones with recurrent depth."""
    from energyformers import registry
    from energyformers.training.arguments import DEPTH_PASS
    from energyformers.training.evaluation import has_recurrent_depth

    families = {**registry.FAMILIES, **registry.BASELINES, **registry.TRANSFORMERS_BASELINES}
    actual = {name: has_recurrent_depth(f.heads["AutoModel"]) for name, f in families.items()}
    assert DEPTH_PASS == actual, f"DEPTH_PASS {DEPTH_PASS}; the models {actual}"
