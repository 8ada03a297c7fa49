"""Masked image modelling (the paper's third task): `HyperSetForMaskedImageModeling`, its presets, the authors'
`hyperset_mim` fixture, MaskGIT decoding and the offline VQ tokenizer (`energyformers.mim`)."""

from __future__ import annotations

import math

import pytest
import torch
from fixtures import (
    assert_close_to_scale,
    assert_differs,
    digit_images,
    digit_mim_model,
    require_author_fixtures,
    rounding,
)
from safetensors.torch import load_file

from energyformers import (
    HyperSetConfig,
    HyperSetForMaskedImageModeling,
    LoopedTransformerConfig,
    LoopedTransformerForMaskedImageModeling,
)
from energyformers.mim import PatchKMeansTokenizer, VQTokenizer, mask_codes, reconstruction_metrics
from energyformers.modeling.modeling_hyperset import MASKGIT_SCHEDULES, maskgit_schedule
from energyformers.training.convert import SOURCES
from energyformers.training.convert.mim import MIM_FIELDS


def fixture_config(**overrides) -> HyperSetConfig:
    """The fixture's size (hyperset_mim.json constructor) in the authors' MIM structure: the preset's fields with
    the paper's iteration conditioning, as the converter sets it (`MIM_FIELDS`)."""
    # intermediate_size 64: multiplier 2
    size = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, time_embedding_dim=32)
    size["iteration_conditioning"] = MIM_FIELDS["iteration_conditioning"]
    return HyperSetConfig.from_preset("mim-1-12-d", **{**size, "num_iterations": 3, **overrides})


def fixture_model(dtype: torch.dtype) -> tuple[HyperSetForMaskedImageModeling, dict[str, torch.Tensor]]:
    tensors = load_file(require_author_fixtures("hyperset_mim") / "hyperset_mim.safetensors")
    model = HyperSetForMaskedImageModeling(fixture_config()).eval()
    # the converter's key mapping (`energyformers convert --source hyperset-mim`)
    source = SOURCES["hyperset-mim"]
    official = {key: value for key, value in tensors.items() if "/" not in key}
    state = source.to_ours(official, source.kwargs_from_config(model.config))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and missing == [], (missing, unexpected)
    return model.to(dtype), tensors


@pytest.mark.parametrize("preset, paper", [("mim-1-12-d", 3.94e6), ("mim-1-24-8d", 8.07e6)])
def test_presets_have_the_papers_parameter_counts(preset, paper):
    """Exactly the paper's count with its conditioning (sinusoid(t), no parameters); the default "none" learns the
    vector c in its place (hidden_size = 768 more), still the paper's count at its rounding."""
    exact = {"mim-1-12-d": 3_937_856, "mim-1-24-8d": 8_072_000}[preset]
    for conditioning, expected in (("sinusoidal-no-mlp", exact), ("none", exact + 768)):
        with torch.device("meta"):
            config = HyperSetConfig.from_preset(preset, iteration_conditioning=conditioning)
            count = HyperSetForMaskedImageModeling(config).num_parameters()
        # the paper rounds to 0.01 M (Table 2); the exact counts follow from the structure of mim.md
        assert round(count / 1e6, 2) == paper / 1e6, (
            f"{preset}, {conditioning}: {count}, paper {paper / 1e6:.2f} M"
        )
        assert count == expected, f"{preset}, {conditioning}: {count} parameters, expected {expected}"


@pytest.mark.parametrize("preset", ["mim-1-12-d", "mim-1-24-8d", "cli-mim"])
def test_mim_presets_have_time_invariant_step_sizes(preset):
    """recurrent-depth.md: iteration_conditioning="none" is every preset's default (the paper's t-conditioned step
    sizes lose accuracy past the trained T); the paper's conditioning stays an override, valid at the preset's
    time_embedding_dim = hidden_size."""
    config = HyperSetConfig.from_preset(preset)
    assert config.iteration_conditioning == "none", f"{preset}: {config.iteration_conditioning!r}"
    paper = HyperSetConfig.from_preset(preset, iteration_conditioning="sinusoidal-no-mlp")
    assert paper.time_embedding_dim == paper.hidden_size, (paper.time_embedding_dim, paper.hidden_size)


def test_looped_transformer_baseline_preset_has_table_2s_parameter_count():
    with torch.device("meta"):
        model = LoopedTransformerForMaskedImageModeling(LoopedTransformerConfig.from_preset("mim-1-12-4d"))
    count = model.num_parameters()
    # Table 2: "Transformer 1 / 12 / 4d", 8.85 M; exact: embeddings 1025·768 + learned positions 256·768, the layer's
    # q/k/v/o 4·768² and MLP 2·768·3072 and two RMSNorms, the head's RMSNorm and Linear(768, 1024) with bias
    assert count == 8_851_456 and round(count / 1e6, 2) == 8.85, f"{count} parameters, paper 8.85 M"
    config = model.config
    assert (config.num_hidden_layers, config.num_iterations, config.intermediate_size) == (1, 12, 4 * 768)
    assert model.codebook_size == 1024 and model.mask_token_id == 1024


def tiny_baseline(seed: int = 0) -> LoopedTransformerForMaskedImageModeling:
    """The baseline at the tiny size of `tiny_trained_free_model`: a 4 × 4 grid, codebook 8 + [MASK]."""
    torch.manual_seed(seed)
    config = LoopedTransformerConfig.from_preset(
        "cli-mim",
        hidden_size=16,
        num_attention_heads=4,
        intermediate_size=64,
        num_iterations=3,
        vocab_size=9,
        max_position_embeddings=16,
    )
    return LoopedTransformerForMaskedImageModeling(config).eval()


def test_looped_baseline_loss_decode_and_reload_follow_the_hyperset_heads_contract(tmp_path):
    import transformers

    model = tiny_baseline()
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 8, (2, 16), generator=g)
    masked = torch.rand(2, 16, generator=g) < 0.5
    inputs, labels = codes.masked_fill(masked, model.mask_token_id), codes.masked_fill(~masked, -100)
    out = model(inputs, labels=labels, output_hidden_states=True)
    assert out.logits.shape == (2, 16, 8) and len(out.hidden_states) == 1 + 3, (out.logits.shape,)
    expected = torch.nn.functional.cross_entropy(out.logits[masked], codes[masked])
    # float32 rounding of a mean of ~16 terms of size ~log 8, summed in another order
    assert_close_to_scale(out.loss, expected, rounding(torch.float32, 16), "loss")
    first, again = model.decode(inputs, steps=4, seed=5), model.decode(inputs, steps=4, seed=5)
    assert torch.equal(first.codes, again.codes) and torch.equal(first.codes[~masked], codes[~masked])
    assert first.sequences.shape == (5, 2, 16) and not (first.codes == model.mask_token_id).any()
    with pytest.raises(ValueError, match=r"labels must be codes in \[0, codebook_size=8\)"):
        model(inputs, labels=torch.full_like(labels, 8))
    with pytest.raises(ValueError, match="input_type='sequence'"):
        LoopedTransformerForMaskedImageModeling(
            LoopedTransformerConfig(hidden_size=16, num_attention_heads=4)
        )
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForMaskedImageModeling.from_pretrained(tmp_path).eval()
    assert type(loaded) is LoopedTransformerForMaskedImageModeling
    torch.testing.assert_close(
        loaded(inputs).logits, out.logits, rtol=0, atol=0
    )  # the same weights, same ops
    assert torch.equal(loaded.decode(inputs, steps=4, seed=5).codes, first.codes)


@pytest.mark.parametrize(
    "dtype, tolerance",
    # float64: the acceptance bound (correct code lands near 1e-14 here); float32: the fixture README's
    # suggested 1e-5 (its own float32-vs-float64 spread on these logits is 2.3e-6)
    [(torch.float64, 1e-10), (torch.float32, 1e-5)],
)
def test_logits_match_the_authors_fixture(dtype, tolerance):
    model, tensors = fixture_model(dtype)
    tokens = tensors["golden/input/tokens"].flatten(1)  # (2, 256), 1024 = [MASK]
    precision = "f64" if dtype == torch.float64 else "f32"
    with torch.no_grad():
        out = model(tokens, output_hidden_states=True)
        longer = model(tokens, num_iterations=6).logits
    checks = [
        ("embeddings", out.hidden_states[0], tensors[f"golden/{precision}/embeddings"]),
        ("final_state", out.hidden_states[-1], tensors[f"golden/{precision}/final_state"]),
        ("logits", out.logits, tensors[f"golden/{precision}/logits"]),
    ]
    if dtype == torch.float64:
        checks.append(("logits_n_recur_6", longer, tensors["golden/f64/logits_n_recur_6"]))
    for name, got, expected in checks:
        # logits: the absolute bound of the acceptance; the states (entries up to 60) carry rounding of their scale
        scale = 1.0 if name.startswith("logits") else max(1.0, expected.abs().max().item())
        error = (got - expected).abs().max().item()
        assert error <= tolerance * scale, (
            f"{name} ({dtype}): max |ours − authors'| = {error:.3g} > {tolerance:g} × scale {scale:.3g}"
        )


def test_loss_is_cross_entropy_on_the_masked_positions_only():
    torch.manual_seed(0)
    model = HyperSetForMaskedImageModeling(fixture_config(vocab_size=9, max_position_embeddings=16)).eval()
    codes = torch.randint(0, 8, (2, 16))
    masked = torch.zeros(2, 16, dtype=torch.bool)
    masked[0, [1, 5]] = masked[1, [0, 7, 9]] = True
    inputs = codes.masked_fill(masked, model.mask_token_id)
    labels = codes.masked_fill(~masked, -100)
    out = model(inputs, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits[masked], codes[masked])
    # float32 rounding of a mean of 5 terms of size ~log 8, summed in another order
    assert_close_to_scale(out.loss, expected, rounding(torch.float32, 8), "loss")
    nothing = model(inputs, labels=torch.full_like(labels, -100)).loss
    assert nothing.item() == 0.0, f"no masked position must give loss 0, got {nothing.item()}"
    assert out.logits.shape == (2, 16, 8), out.logits.shape  # the codebook, no logit for [MASK]


def test_bad_labels_and_configs_fail_clearly():
    torch.manual_seed(0)
    model = HyperSetForMaskedImageModeling(fixture_config(vocab_size=9, max_position_embeddings=16)).eval()
    ids = torch.zeros(1, 16, dtype=torch.long)
    with pytest.raises(ValueError, match=r"labels must be codes in \[0, codebook_size=8\).*got 8"):
        model(ids, labels=torch.full((1, 16), 8))
    with pytest.raises(ValueError, match="labels must have the shape of input_ids"):
        model(ids, labels=torch.zeros(1, 15, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"invalid time_embedding_dim=16; .*'sinusoidal-no-mlp'.*hidden_size=32"
    ):
        fixture_config(time_embedding_dim=16)
    with pytest.raises(ValueError, match="input_type='sequence'"):
        HyperSetForMaskedImageModeling(HyperSetConfig(hidden_size=16, num_attention_heads=4))


# ------------------------------------------------------------------------------------ MaskGIT decoding


def tiny_trained_free_model(seed: int = 0) -> HyperSetForMaskedImageModeling:
    """A 4 × 4 grid, codebook 8 + [MASK], with non-zero step sizes (moved off their zero initialisation)."""
    torch.manual_seed(seed)
    config = fixture_config(
        hidden_size=16, num_attention_heads=4, intermediate_size=16, time_embedding_dim=16, vocab_size=9
    )
    config.max_position_embeddings = 16
    model = HyperSetForMaskedImageModeling(config).eval()
    with torch.no_grad():
        model.hyperset.step_sizes.proj.weight.normal_(0, 0.1)
    return model


def test_schedules_give_maskgits_counts():
    # linear over 4 steps for 16 masked: w = [0, 1/3, 2/3, 1] → round(16·w/2) = [0, 3, 5, 8], at least 1 →
    # [1, 3, 5, 8], the last step takes what is left (16 − 17) → [1, 3, 5, 7]
    counts = maskgit_schedule(torch.tensor([16, 0, 2]), 4, "linear")
    assert counts.tolist() == [[1, 3, 5, 7], [0, 0, 0, 0], [1, 1, 0, 0]], counts.tolist()
    for name in MASKGIT_SCHEDULES:
        for masked, steps in ((256, 24), (102, 24), (7, 3), (1, 5)):
            counts = maskgit_schedule(torch.tensor([masked]), steps, name)
            assert counts.sum().item() == masked and (counts >= 0).all(), (
                name,
                masked,
                steps,
                counts.tolist(),
            )
    # one step unmasks everything with every schedule (its only weight w(1) is 0)
    for name in MASKGIT_SCHEDULES:
        one = maskgit_schedule(torch.tensor([16, 0]), 1, name)
        assert one.tolist() == [[16], [0]], (name, one.tolist())
    # arccos (the default) fixes few tokens first and most at the end
    arccos = maskgit_schedule(torch.tensor([256]), 24, "arccos")[0]
    assert arccos[0] < arccos[-1], arccos.tolist()


def test_decode_is_seeded_fills_every_mask_and_keeps_known_codes():
    model = tiny_trained_free_model()
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 8, (3, 16), generator=g)
    masked = torch.rand(3, 16, generator=g) < 0.5
    masked[2] = True  # one fully masked grid
    inputs = codes.masked_fill(masked, model.mask_token_id)
    first = model.decode(inputs, steps=4, schedule="linear", seed=7)
    again = model.decode(inputs, steps=4, schedule="linear", seed=7)
    other = model.decode(inputs, steps=4, schedule="linear", seed=8)
    assert torch.equal(first.codes, again.codes) and torch.equal(first.confidences, again.confidences)
    assert_differs(other.sequences, first.sequences, "sequences decoded with seed 8 vs seed 7")
    assert (first.codes < model.codebook_size).all(), first.codes
    assert torch.equal(first.codes[~masked], codes[~masked]), "known codes changed"
    # the records: the grid before and after each step; each step fixes exactly the schedule's count
    expected = maskgit_schedule(masked.sum(-1), 4, "linear")  # (B, S)
    assert first.sequences.shape == (5, 3, 16) and torch.equal(first.sequences[0], inputs)
    assert torch.equal(first.unmasked.sum(-1).T, expected), (first.unmasked.sum(-1).T, expected)
    still_masked = (first.sequences[1:] == model.mask_token_id).sum(-1).T  # (B, S)
    assert torch.equal(still_masked, masked.sum(-1, keepdim=True) - expected.cumsum(-1)), still_masked
    fixed_confidence = first.confidences[first.unmasked]
    assert ((fixed_confidence > 0) & (fixed_confidence <= 1)).all(), fixed_confidence


def test_decode_without_masks_returns_the_input_and_checks_its_arguments():
    model = tiny_trained_free_model()
    codes = torch.randint(0, 8, (2, 16), generator=torch.Generator().manual_seed(0))
    out = model.decode(codes, steps=1, seed=0)
    assert torch.equal(out.codes, codes) and not out.unmasked.any()
    for kwargs, message in (
        (dict(steps=0), "steps must be an integer >= 1; got 0"),
        (dict(schedule="cubic"), "schedule must be one of .*got 'cubic'"),
        (dict(temperature=0.0), "temperature must be a number > 0; got 0.0"),
        (dict(randomize_temperature=-1), "randomize_temperature must be a number >= 0; got -1"),
    ):
        with pytest.raises(ValueError, match=message):
            model.decode(codes, **kwargs)
    with pytest.raises(
        ValueError, match=r"input_ids must be codes in \[0, 8\) or \[MASK\] = 8; got values in"
    ):
        model.decode(codes + 5)


# ------------------------------------------------------------------- offline tokenizer, end to end


def test_patch_kmeans_tokenizer_round_trip_save_and_errors(tmp_path):
    images = digit_images()[:300]
    tokenizer = PatchKMeansTokenizer.fit(images, patch_size=2, codebook_size=16, seed=0)
    codes = tokenizer.encode(images)
    assert codes.shape == (300, 64) and 0 <= int(codes.min()) and int(codes.max()) < 16, codes.shape
    decoded = tokenizer.decode(codes)
    assert decoded.shape == images.shape
    # a code decodes to its centroid, and a patch's code is its nearest centroid: re-encoding is a fixed point
    assert torch.equal(tokenizer.encode(decoded), codes)
    tokenizer.save_pretrained(tmp_path)
    loaded = PatchKMeansTokenizer.from_pretrained(tmp_path)
    assert torch.equal(loaded.centroids, tokenizer.centroids) and loaded.image_size == (16, 16)
    assert isinstance(loaded, VQTokenizer)
    with pytest.raises(
        ValueError, match=r"pixel_values must have shape \(batch, 1, 16, 16\); got \(2, 1, 8, 8\)"
    ):
        tokenizer.encode(torch.zeros(2, 1, 8, 8))
    with pytest.raises(
        ValueError, match=r"codes must lie in \[0, codebook_size=16\); got values in \[0, 16\]"
    ):
        tokenizer.decode(torch.full((1, 64), 16).index_fill(1, torch.tensor([0]), 0))
    with pytest.raises(ValueError, match="ratio must be a fraction in"):
        mask_codes(codes, 16, (0.5, 0.2))


def test_offline_end_to_end_tokenize_train_mask_decode_measure():
    """Real images → codes → a few training steps with the paper's masking → 40 % masked → MaskGIT decoding →
    pixels → PSNR/SSIM; decoding the true codes gives the tokenizer's own bound, which no other codes exceed."""
    images = digit_images()
    train, test = images[:512], images[-64:]
    tokenizer = PatchKMeansTokenizer.fit(train, patch_size=2, codebook_size=32, seed=0)
    model = digit_mim_model(tokenizer.codebook_size)
    # the paper's optimiser (AdamW β = (0, 0.95), weight decay 0.1, clipping 3), a larger lr for a few steps
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.0, 0.95), weight_decay=0.1)
    codes = tokenizer.encode(train)
    g = torch.Generator().manual_seed(0)
    losses = []
    model.train()
    for _ in range(40):
        batch = codes[torch.randint(0, len(codes), (64,), generator=g)]
        inputs, labels = mask_codes(
            batch, model.mask_token_id, (0.0, 0.4), generator=g
        )  # paper: r ~ U[0, 0.4]
        loss = model(inputs, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 3.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first, f"training did not lower the masked-token loss: {first:.3f} → {last:.3f}"

    true_codes = tokenizer.encode(test)
    inputs, _ = mask_codes(true_codes, model.mask_token_id, 0.4, generator=torch.Generator().manual_seed(1))
    assert ((inputs == model.mask_token_id).sum(-1) == round(0.4 * 64)).all()
    out = model.decode(inputs, steps=8, seed=0)
    assert out.codes.shape == true_codes.shape and not (out.codes == model.mask_token_id).any()
    reconstructed = tokenizer.decode(out.codes)
    assert reconstructed.shape == test.shape
    ours = reconstruction_metrics(reconstructed, test)
    bound = reconstruction_metrics(tokenizer.decode(true_codes), test)
    accuracy = (out.codes == true_codes)[inputs == model.mask_token_id].float().mean().item()
    print(
        f"masked-token accuracy {accuracy:.3f}; PSNR {ours['psnr']:.2f} dB (tokenizer bound {bound['psnr']:.2f}); "
        f"SSIM {ours['ssim']:.3f} (bound {bound['ssim']:.3f})"
    )
    assert all(math.isfinite(v) for v in (*ours.values(), *bound.values())), (ours, bound)
    # each patch's true code is its nearest centroid, so any other code can only raise that image's error; equal
    # codes decode to the same bits, so 1e-9 dB (far below a float32 ulp of a PSNR, ~2e-6 dB) allows no real excess
    assert ours["psnr"] <= bound["psnr"] + 1e-9, (ours, bound)
    # the bound is the tokenizer's own PSNR, computed independently here: 10 log10(1 / MSE) per image
    mse = (tokenizer.decode(true_codes).double() - test.double()).pow(2).flatten(1).mean(1)
    own = (10 * torch.log10(1 / mse)).mean().item()
    # torchmetrics holds data_range in float32: agreement to a few float32 epsilons of the value
    assert abs(bound["psnr"] - own) <= rounding(torch.float32, 8, own), (bound["psnr"], own)


def test_reconstruction_metrics_of_images_smaller_than_the_ssim_window():
    # SSIM's window is 11 pixels, odd; on an 8-pixel side it must shrink to an odd 7, not to an even 8 (refused)
    generator = torch.Generator().manual_seed(0)
    reference = torch.rand(2, 3, 8, 8, generator=generator)
    noisy = (reference + 0.05 * torch.randn(reference.shape, generator=generator)).clamp(0, 1)
    ssim = reconstruction_metrics(noisy, reference)["ssim"]
    assert math.isfinite(ssim) and 0 < ssim < 1, ssim
    same = reconstruction_metrics(reference, reference)["ssim"]
    # float64 window sums over at most 7 × 7 pixels of values <= 1, in the numerator and the denominator alike
    assert abs(same - 1) <= rounding(torch.float64, 64), f"SSIM(x, x) = {same!r}"


@pytest.mark.parametrize(
    "setting, value",
    [("deep_supervision", "all"), ("supervision_steps", 2), ("halting_head", True)],
)
def test_mim_heads_refuse_iteration_wise_training_settings(setting, value):
    """The MIM heads take the loss at the last iteration; a config asking for more is refused, not ignored."""
    configs = [
        fixture_config(vocab_size=9, max_position_embeddings=16),
        LoopedTransformerConfig.from_preset("cli-mim", hidden_size=16, num_attention_heads=4, vocab_size=9),
    ]
    for config, head in zip(
        configs, (HyperSetForMaskedImageModeling, LoopedTransformerForMaskedImageModeling)
    ):
        setattr(config, setting, value)
        with pytest.raises(
            ValueError, match=rf"last iteration only: config\.{setting} must be .*got {value!r}"
        ):
            head(config)
