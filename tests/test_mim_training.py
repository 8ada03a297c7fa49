"""Masked image modelling through both training loops (`energyformers train` / `train-accelerate` with
`--task masked-image-modeling`): the offline patch k-means tokenizer fitted on real images (digits), the paper's
per-batch masking, masked-token accuracy and reconstruction PSNR after MaskGIT decoding, and a run folder that
reloads — model and tokenizer — from the folder alone. CI-sized: a few steps of tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from fixtures import assert_differs

from energyformers import HyperSetForMaskedImageModeling, LoopedTransformerForMaskedImageModeling
from energyformers.mim import PatchKMeansTokenizer
from energyformers.training import accelerate_loop, train
from energyformers.training.data import MaskedCodesCollator

LOOPS = {"train": train.main, "train-accelerate": accelerate_loop.main}
# tiny sizes of each model's `cli-mim` preset (one layer iterated twice, width 32)
SIZES = {
    "hyperset": ["hidden_size=32", "num_attention_heads=4", "intermediate_size=32", "time_embedding_dim=32"],
    "looped-transformer": ["hidden_size=32", "num_attention_heads=4", "intermediate_size=64"],
}
HEADS = {
    "hyperset": HyperSetForMaskedImageModeling,
    "looped-transformer": LoopedTransformerForMaskedImageModeling,
}
COMMON = [
    "--task", "mim", "--dataset", "digits",
    "--max_train_samples", "128", "--max_eval_samples", "24", "--max_test_samples", "24",
    "--codebook_size", "16", "--tokenizer_fit_samples", "64", "--decode_steps", "2", "--decode_samples", "8",
    "--max_steps", "3", "--batch_size", "16", "--num_threads", "1", "--num_predictions", "1",
    "--warmup_ratio", "0", "--disable_tqdm",
]  # fmt: skip
METRICS = {"loss", "masked_token_accuracy", "decoded_token_accuracy", "psnr", "ssim", "tokenizer_psnr"}


def run(loop: str, model: str, out: Path, *extra: str) -> int:
    config = ["--config", *SIZES[model], "num_iterations=2"]
    return LOOPS[loop]([*COMMON, "--model", model, *config, "--output_dir", str(out), *extra])


@pytest.mark.parametrize("model", sorted(SIZES))
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_few_steps_write_a_folder_that_reloads_and_decodes(tmp_path, loop, model):
    out = tmp_path / "run"
    assert run(loop, model, out) == 0
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "vq_tokenizer_config.json",
        "vq_tokenizer.safetensors",
    } <= names
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "masked-image-modeling" and metrics["recipe"]["global_step"] == 3, metrics[
        "recipe"
    ]
    for split in ("eval", "test"):
        missing = METRICS - set(metrics[split])
        assert not missing, f"{split} lacks {missing}: {sorted(metrics[split])}"
        # a nearest-centroid tokenizer: no decoded grid reconstructs better than the true codes
        assert metrics[split]["psnr"] <= metrics[split]["tokenizer_psnr"] + 1e-9, metrics[split]
        assert 0 <= metrics[split]["masked_token_accuracy"] <= 1, metrics[split]
    # the folder alone: the Auto class gives the right head, the tokenizer saved beside it decodes its codes
    reloaded = transformers.AutoModelForMaskedImageModeling.from_pretrained(out).eval()
    tokenizer = PatchKMeansTokenizer.from_pretrained(out)
    assert type(reloaded) is HEADS[model] and reloaded.codebook_size == tokenizer.codebook_size == 16
    assert reloaded.config.max_position_embeddings == 64  # digits at 16 × 16 in 2 × 2 patches: an 8 × 8 grid
    grid = torch.full((1, 64), reloaded.mask_token_id)
    pixels = tokenizer.decode(reloaded.decode(grid, steps=2, seed=0).codes)
    assert pixels.shape == (1, 1, 16, 16) and torch.isfinite(pixels).all()


def test_a_saved_tokenizer_is_reused_and_bad_flags_fail_before_work(tmp_path, capsys):
    first = tmp_path / "first"
    assert run("train", "hyperset", first) == 0
    second = tmp_path / "second"
    # --tokenizer: the first run's codebook (no refit, so no fitting flags: COMMON's are dropped)
    fitting = {"--codebook_size", "--tokenizer_fit_samples"}
    without_fitting = [x for i, x in enumerate(COMMON) if x not in fitting and COMMON[i - 1] not in fitting]
    config = ["--config", *SIZES["looped-transformer"], "num_iterations=2"]
    argv = [*without_fitting, "--model", "looped-transformer", *config, "--output_dir", str(second)]
    assert LOOPS["train-accelerate"]([*argv, "--tokenizer", str(first)]) == 0
    recorded = json.loads((second / "metrics.json").read_text())["arguments"]["data"]
    # the recorded arguments carry the given tokenizer's codebook and patch, not the fitting defaults (64, unset)
    assert (recorded["codebook_size"], recorded["tokenizer_patch_size"]) == (16, 2), recorded
    saved = [PatchKMeansTokenizer.from_pretrained(f).centroids for f in (first, second)]
    assert torch.equal(*saved), "the second run must carry the given tokenizer"
    capsys.readouterr()
    small_grid = tmp_path / "small-grid"  # 16 codes of 4 × 4 patches of the 16 × 16 digits: a 4 × 4 grid
    PatchKMeansTokenizer(
        torch.rand(16, 16, generator=torch.Generator().manual_seed(0)), 4, (16, 16), 1
    ).save_pretrained(small_grid)
    for argv, message in (
        (["--dataset", "digits", "--codebook_size", "8"], "--codebook_size: a masked-image-modelling flag"),
        ([*COMMON, "--model", "imixer"], "--model imixer has no masked-image-modelling head"),
        ([*COMMON, "--mask_ratio_max", "1.5"], "--mask_ratio_max 1.5: expected a fraction in"),
        ([*COMMON, "--tokenizer", str(tmp_path / "nowhere")], "--tokenizer .*nowhere: no such folder"),
        # the fitting flags with a given tokenizer, which they would not shape
        (
            [*without_fitting, "--tokenizer", str(first), "--codebook_size", "32"],
            "--codebook_size 32: applies only when a tokenizer is fitted, .*its codebook_size is 16",
        ),
        (
            [*without_fitting, "--tokenizer", str(first), "--tokenizer_patch_size", "4"],
            "--tokenizer_patch_size 4: applies only when a tokenizer is fitted, .*its patch_size is 2",
        ),
        (
            [*without_fitting, "--tokenizer", str(first), "--tokenizer_fit_samples", "50"],
            "--tokenizer_fit_samples 50: applies only when a tokenizer is fitted, .*fitted already",
        ),
        # a checkpoint of an 8 × 8 grid with a tokenizer of 4 × 4 codes, and positions that contradict the tokenizer
        (
            [*without_fitting, "--from_pretrained", str(first), "--tokenizer", str(small_grid)],
            "--from_pretrained .*grid is 4 × 4 = 16 codes, .*max_position_embeddings=64 .*8 × 8 grid",
        ),
        (
            [*without_fitting, "--tokenizer", str(first), "--config", "max_position_embeddings=256"],
            "--config max_position_embeddings=256: the image tokenizer sets max_position_embeddings=64",
        ),
    ):
        out = tmp_path / "refused"
        assert train.main([*argv, "--output_dir", str(out)]) == 2, argv
        err = capsys.readouterr().err
        assert pytest.importorskip("re").search(message, err), (message, err)
        assert not out.exists() and not out.with_name("refused.checkpoints").exists()


def test_mim_step_sizes_are_time_invariant_unless_the_papers_conditioning_is_asked_for(tmp_path, capsys):
    """`train --task mim` builds time-invariant step sizes (iteration_conditioning "none", recurrent-depth.md's
    default); `--iteration_conditioning sinusoidal-no-mlp` (or its `--config` key) gives the paper's, whose sinusoid
    (added to the state, no MLP) follows `--config hidden_size=32`; a `time_embedding_dim` that contradicts it is
    refused before the tokenizer is fitted."""
    from energyformers.training import setup
    from energyformers.training.arguments import parse_arguments

    narrow = ["--config", "hidden_size=32", "num_attention_heads=4", "intermediate_size=32"]
    tokenizer = PatchKMeansTokenizer(torch.rand(16, 4), 2, (16, 16), 1)

    def config_of(*argv: str):
        args = parse_arguments([*COMMON, *argv, "--output_dir", str(tmp_path / "x")], train.PROG, "")
        return setup.masked_image_modeling_config(args, tokenizer)

    default = config_of(*narrow)
    assert (default.iteration_conditioning, default.hidden_size) == ("none", 32), default
    paper = ["--iteration_conditioning", "sinusoidal-no-mlp"]
    for argv in ([*paper, *narrow], [*narrow, "iteration_conditioning=sinusoidal-no-mlp"]):
        config = config_of(*argv)
        got = (config.iteration_conditioning, config.hidden_size, config.time_embedding_dim)
        assert got == ("sinusoidal-no-mlp", 32, 32), (argv, got)
    out = tmp_path / "refused"
    argv = [*COMMON, *paper, *narrow, "time_embedding_dim=64", "--output_dir", str(out)]
    assert train.main(argv) == 2
    captured = capsys.readouterr()
    assert "invalid time_embedding_dim=64" in captured.err and "expected hidden_size=32" in captured.err, (
        captured
    )
    assert "fitting" not in captured.out, captured.out  # refused before the k-means fit
    assert not out.exists() and not out.with_name("refused.checkpoints").exists()


@pytest.mark.parametrize("model, ratio", [("hyperset", 1), ("looped-transformer", 4)])
def test_a_narrower_mim_model_keeps_the_presets_feedforward_ratio(tmp_path, model, ratio):
    """`--config hidden_size=64` alone keeps `cli-mim`'s structure: Hyper-SET's dictionary M = d, the baseline's
    4d MLP (an explicit `intermediate_size` still wins)."""
    from energyformers.training import setup
    from energyformers.training.arguments import parse_arguments

    tokenizer = PatchKMeansTokenizer(torch.rand(16, 4), 2, (16, 16), 1)
    for extra, expected in (([], ratio * 64), (["intermediate_size=96"], 96)):
        argv = [*COMMON, "--model", model, "--config", "hidden_size=64", "num_attention_heads=4", *extra]
        args = parse_arguments([*argv, "--output_dir", str(tmp_path / "x")], train.PROG, "")
        config = setup.masked_image_modeling_config(args, tokenizer)
        assert (config.hidden_size, config.intermediate_size) == (64, expected), (model, extra, config)


def test_collator_masks_every_training_batch_afresh_with_the_papers_ratios():
    codes = torch.arange(64).repeat(32, 1)  # (32, 64): any code works, [MASK] = 64
    collate = MaskedCodesCollator(64, (0.0, 0.4), seed=3)
    rows = [{"codes": row} for row in codes]
    first, second = collate(rows), collate(rows)
    assert_differs(second["input_ids"], first["input_ids"], "each batch draws new masks")
    again = MaskedCodesCollator(64, (0.0, 0.4), seed=3)(rows)
    assert torch.equal(again["input_ids"], first["input_ids"]), "seeded: the same seed, the same masks"
    for batch in (first, second):
        masked = batch["input_ids"] == 64
        assert torch.equal(masked, batch["labels"] != -100), "labels exactly on the masked positions"
        assert torch.equal(batch["labels"][masked], codes[masked])
        counts = masked.sum(-1)
        assert int(counts.max()) <= round(0.4 * 64), counts  # r ≤ 0.4 of the 64 positions per image
    fixed = {"input_ids": torch.tensor([64, 1]), "labels": torch.tensor([0, -100])}
    batch = collate([fixed, fixed])  # evaluation rows keep their fixed masks
    assert torch.equal(batch["input_ids"], torch.tensor([[64, 1]] * 2)), batch


def test_collator_continues_the_mask_stream_where_a_resumed_run_stands():
    rows = [{"codes": row} for row in torch.arange(64).repeat(8, 1)]
    straight = MaskedCodesCollator(64, (0.0, 0.4), seed=3)
    stream = [straight(rows)["input_ids"] for _ in range(8)]
    # 3 batches an epoch, 2 per optimizer step: steps 1, 2 take batches 0-1, 2; step 3 takes 3-4 (epoch 1)
    for step, position in ((0, 0), (1, 2), (2, 3), (3, 5)):
        resumed = MaskedCodesCollator(64, (0.0, 0.4), seed=3)
        resumed.continue_after(step, batches_per_epoch=3, gradient_accumulation_steps=2)
        assert resumed.batches == position, (step, resumed.batches, position)
        assert torch.equal(resumed(rows)["input_ids"], stream[position]), (
            f"step {step}: batch {position}'s masks"
        )
    assert len({tuple(ids.flatten().tolist()) for ids in stream}) == len(stream), "no batch repeats another's"
    for kwargs, message in (
        ({"global_step": -1, "batches_per_epoch": 3, "gradient_accumulation_steps": 1}, "global_step=-1"),
        ({"global_step": 1, "batches_per_epoch": 0, "gradient_accumulation_steps": 1}, "batches_per_epoch=0"),
    ):
        with pytest.raises(ValueError, match=message):
            straight.continue_after(**kwargs)


def test_dataloader_workers_never_repeat_masks():
    rows = [{"codes": row} for row in torch.arange(64).repeat(32, 1)]
    collate = MaskedCodesCollator(64, (0.0, 0.4), seed=3)

    def masks(seed: int) -> list[tuple[int, ...]]:
        loader = torch.utils.data.DataLoader(
            rows,
            batch_size=4,
            collate_fn=collate,
            num_workers=2,
            generator=torch.Generator().manual_seed(seed),
        )
        return [tuple(batch["input_ids"].flatten().tolist()) for batch in loader]

    first = masks(0)
    assert len(set(first)) == len(first) == 8, "each worker's batches differ from the other worker's"
    assert masks(0) == first, "seeded: batch n's masks come from (seed, n) in whichever worker collates it"


def test_benchmark_script_smoke(tmp_path, capsys):
    """`benchmarks/mim.py --smoke --seeds 0 1`: tiny models, two steps each, both trained per seed through the CLI;
    the JSON holds every seed's numbers, their mean and std and the paired differences, the markdown the
    aggregated table and the per-seed difference line; every result file written."""
    import importlib.util
    import statistics

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "mim.py"
    spec = importlib.util.spec_from_file_location("mim_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The seeds' command line, checked before any work: `--seed N` is one seed; a repeated or negative seed, or
    # both flags, stop with the flag and the value named.
    assert module.parse_arguments(["--seed", "5"]).seeds == [5]
    assert module.parse_arguments([]).seeds == [0, 1, 2] and module.parse_arguments(["--smoke"]).seeds == [
        0,
        1,
    ]
    for bad, message in (
        (["--seeds", "0", "0"], "--seeds 0 0: each seed at most once"),
        (["--seed", "-1"], "--seed -1: seeds must be integers in [0, 2**32)"),
        (["--seed", "1", "--seeds", "0", "1"], "not allowed with argument"),
    ):
        with pytest.raises(SystemExit):
            module.parse_arguments(bad)
        assert message in capsys.readouterr().err, (bad, message)
    argv = ["--smoke", "--seeds", "0", "1", "--out", str(tmp_path), "--work", str(tmp_path / "runs")]
    assert module.main(argv) == 0
    # a smoke run writes mim_smoke.*, never the measurement's mim.* names
    written = {p.name for p in tmp_path.iterdir() if p.is_file()}
    assert written == {"mim_smoke.md", "mim_smoke.json", "mim_smoke.png", "mim_smoke_decode.png"}, written
    results = json.loads((tmp_path / "mim_smoke.json").read_text())
    setup = results["setup"]
    assert results["seeds"] == [0, 1] and set(setup["train_wall_s"]) == {"0", "1"}, setup
    # One tokenizer for every run, fitted once; one run folder per seed.
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert folders == ["seed-0", "seed-1", "tokenizer"], folders
    for model in ("hyperset", "looped-transformer"):
        r = results["models"][model]
        assert set(r["per_seed"]) == {"0", "1"} and r["num_parameters"] > 0, r.keys()
        for seed, run in r["per_seed"].items():
            decoded = run["decode_24"]
            assert set(run["by_iterations"]) == {"1", "2", "4"}, (seed, run["by_iterations"])
            assert decoded["psnr"] <= decoded["tokenizer_psnr"] + 1e-9, (seed, decoded)
            # The run's seed is the one its CLI training ran with.
            trained = json.loads((tmp_path / "runs" / f"seed-{seed}" / model / "metrics.json").read_text())
            assert trained["arguments"]["run"]["seed"] == int(seed), trained["arguments"]["run"]
        psnrs = [run["decode_24"]["psnr"] for run in r["per_seed"].values()]
        accuracies = [run["masked_token_accuracy"] for run in r["per_seed"].values()]
        mean, std = r["mean"], r["std"]
        # The same statistics of the same floats in the same order (JSON keeps a float exactly): equal exactly.
        assert mean["decode_24"]["psnr"] == statistics.fmean(psnrs), (mean["decode_24"], psnrs)
        assert std["decode_24"]["psnr"] == statistics.stdev(psnrs), (std["decode_24"], psnrs)
        assert mean["masked_token_accuracy"] == statistics.fmean(accuracies), (mean, accuracies)
        assert set(mean["by_decode_steps"]) == {"1", "2"}, mean["by_decode_steps"]
    h, b = (results["models"][m]["per_seed"] for m in ("hyperset", "looped-transformer"))
    differences = results["hyperset_minus_looped"]
    for name in ("psnr", "decoded_token_accuracy"):
        expected = {seed: h[seed]["decode_24"][name] - b[seed]["decode_24"][name] for seed in ("0", "1")}
        assert differences[name] == expected, (name, differences[name], expected)  # one subtraction: exact
    text = (tmp_path / "mim_smoke.md").read_text()
    assert "mean ± sample std over n = 2 seeds" in text, text
    # the `cli-mim` presets' depth schedule at T = 2 (uniform in [T - T // 2, T + T // 2]), read from each saved config
    schedules = setup["depth_schedule"]
    assert schedules == {
        "hyperset": {"iteration_sampling": "uniform", "iteration_range": [1, 3], "input_anchor": 0.5},
        "looped-transformer": {
            "iteration_sampling": "uniform",
            "iteration_range": [1, 3],
            "input_anchor": None,
        },
    }, schedules
    expected = (
        "Training depth: Hyper-SET uniform in [1, 3], anchor λ = 0.5; looped Transformer uniform in [1, 3]."
    )
    assert expected in text, text
    assert text.startswith("# SMOKE RUN (smoke, not a measurement): "), text[:200]
    assert "](mim_smoke.png)" in text and "](mim_smoke_decode.png)" in text, text
    hyperset = results["models"]["hyperset"]
    hm, hs = hyperset["mean"]["decode_24"], hyperset["std"]["decode_24"]
    assert f"| {hm['psnr']:.2f} ± {hs['psnr']:.2f} |" in text, text
    line = next(line for line in text.splitlines() if line.startswith("Hyper-SET − looped per seed"))
    for name, digits in (("psnr", 2), ("decoded_token_accuracy", 3)):
        shown = ", ".join(f"{differences[name][seed]:+.{digits}f}" for seed in ("0", "1"))
        assert shown in line, (name, shown, line)
    # The reading is generated: it counts the seeds on which Hyper-SET was ahead.
    wins = sum(d > 0 for d in differences["psnr"].values())
    assert f"Hyper-SET higher on {wins} of 2 seeds" in text, text
