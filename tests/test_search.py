"""Test-time search (docs/hyperset.md): K perturbed trajectories per input in
one batched forward, one kept per sample by the lowest final energy, the highest confidence, or a valid Sudoku board;
as model call arguments, in the pipelines and in `energyformers predict`."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from fixtures import assert_close_to_scale, assert_differs, hyperset_config, perturb, rounding
from test_cli_errors import hyperset_folder as hyperset_folder  # a fixture, used by name
from test_deep_supervision import backbone_of, build, inputs_of

from energyformers import (
    HyperSetForTokenClassification,
    LoopedTransformerConfig,
    LoopedTransformerForTokenClassification,
)
from energyformers.modeling import modeling_hyperset

K = 3


def eval_model(name: str, **overrides):
    return build(name, **overrides).eval()


def plain_inputs(name: str) -> dict:
    return {k: v for k, v in inputs_of(name).items() if k != "labels"}


class Recorder:
    """Records the batch size and the outputs of every backbone call; optionally rewrites `final_energy`."""

    def __init__(self, model, energies: torch.Tensor | None = None) -> None:
        self.calls, self.outputs, self.energies = [], [], energies
        self.handle = backbone_of(model).register_forward_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs, output):
        self.calls.append(len(output.last_hidden_state))
        if self.energies is not None:
            output.final_energy = self.energies.to(output.final_energy.dtype)
        self.outputs.append(output)

    def remove(self) -> None:
        self.handle.remove()


def trajectory_logits(model, output, batch: dict) -> torch.Tensor:
    """The head's logits for every trajectory `(B·K, ...)` from a recorded backbone output."""
    mask = batch.get("attention_mask")
    if mask is not None:
        mask = mask.repeat_interleave(K, 0).bool()
    features = (
        output.last_hidden_state
        if model._per_token
        else backbone_of(model)._pool(output.last_hidden_state, mask)
    )
    return model.classifier(model.layernorm(features))


# ---------------------------------------------------------------- K = 1 is a plain forward


@pytest.mark.parametrize(
    "name", ["hyperset-image", "hyperset-sequence", "hyperset-token", "looped-image", "looped-token"]
)
@pytest.mark.parametrize("noise", [0.0, 0.7])
def test_one_trajectory_is_a_plain_forward_exactly(name, noise):
    """K = 1: trajectory 0 starts from the embedding output itself, so any noise leaves it as the plain forward."""
    model, batch = eval_model(name), inputs_of(name)
    plain = model(**batch)
    searched = model(**batch, search_trajectories=1, search_noise=noise, search_seed=0)
    torch.testing.assert_close(searched.logits, plain.logits, rtol=0, atol=0)
    assert torch.equal(searched.loss, plain.loss)
    assert searched.search_chosen.tolist() == [0] * len(plain.logits)
    assert searched.search_confidences.shape == (len(plain.logits), 1)
    if name.startswith("hyperset"):
        assert searched.search_energies.shape == (len(plain.logits), 1)
    else:
        assert searched.search_energies is None


# ---------------------------------------------------------------- batched, seeded


@pytest.mark.parametrize("name", ["hyperset-sequence", "looped-image"])
def test_k_trajectories_run_in_one_batched_forward(name):
    model, batch = eval_model(name), plain_inputs(name)
    recorder = Recorder(model)
    output = model(**batch, search_trajectories=K, search_noise=0.5, search_seed=3)
    recorder.remove()
    size = len(output.logits)
    assert recorder.calls == [K * size], recorder.calls
    # trajectory 0 of every sample is the unperturbed one: its logits are the plain forward's
    plain = model(**batch).logits
    every = trajectory_logits(model, recorder.outputs[0], batch).view(size, K, *plain.shape[1:])
    torch.testing.assert_close(every[:, 0], plain, rtol=0, atol=0)
    # a liveness margin, not rounding: noise of 0.5 on the embeddings moves logits of size < 1 by about 1e-2,
    # and 1e-4 stays far above their float32 rounding (about 1e-7)
    moved = float((every[:, 1] - plain).detach().abs().max())
    assert moved > 1e-4, f"search_noise did not perturb trajectory 1: max |Δlogits| = {moved:.3g}"


def test_seeded_search_is_reproducible_and_the_seed_matters():
    name = "hyperset-token"
    model, batch = eval_model(name), plain_inputs(name)
    first = model(**batch, search_trajectories=4, search_noise=0.5, search_seed=11)
    again = model(**batch, search_trajectories=4, search_noise=0.5, search_seed=11)
    for field in ("logits", "search_chosen", "search_energies", "search_confidences"):
        assert torch.equal(getattr(first, field), getattr(again, field)), field
    other = model(**batch, search_trajectories=4, search_noise=0.5, search_seed=12)
    assert_differs(
        first.search_energies[:, 1:], other.search_energies[:, 1:], "perturbed energies, seed 11 vs 12"
    )
    # trajectory 0 is unperturbed whatever the seed
    torch.testing.assert_close(first.search_energies[:, 0], other.search_energies[:, 0], rtol=0, atol=0)
    # no seed: a draw from torch's global generator, reproducible under torch.manual_seed
    torch.manual_seed(5)
    unseeded = model(**batch, search_trajectories=4, search_noise=0.5)
    torch.manual_seed(5)
    assert torch.equal(
        unseeded.search_energies, model(**batch, search_trajectories=4, search_noise=0.5).search_energies
    )


# ---------------------------------------------------------------- independent of the batch


SEARCH = dict(search_trajectories=4, search_noise=0.5, search_seed=0)
LENGTHS = [7, 3, 5, 2, 6, 4]  # real tokens of the sequences of `varied_batch`, padded at the end to 7


def amplified(name: str, **overrides):
    """An eval model whose classifier carries extra N(0, 0.5) weights: logits of order 1 instead of 1e-2, so a
    trajectory or a noise that follows the batch layout moves them far beyond rounding."""
    model = eval_model(name, **overrides)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.classifier.parameters():
            parameter.add_(0.5 * torch.randn(parameter.shape, generator=generator))
    return model


def varied_batch(name: str) -> dict:
    """Six images, or six sequences of `LENGTHS` real tokens right-padded to 7 (padded ids random, not 0)."""
    generator = torch.Generator().manual_seed(1)
    if name.endswith("image"):
        return {"pixel_values": torch.randn(len(LENGTHS), 1, 8, 8, generator=generator)}
    mask = (torch.arange(7) < torch.tensor(LENGTHS)[:, None]).long()
    return {"input_ids": torch.randint(1, 20, (len(LENGTHS), 7), generator=generator), "attention_mask": mask}


def sample_results(model, output, index: int, length: int | None) -> dict[str, torch.Tensor]:
    """Sample `index`'s chosen trajectory, its K scores, and its logits (per-token heads: the real tokens)."""
    logits = output.logits[index]
    if model._per_token and length is not None:
        logits = logits[:length]
    scores = output.search_energies if output.search_energies is not None else output.search_confidences
    return {"chosen": output.search_chosen[index], "scores": scores[index], "logits": logits}


# float32 rounding between a sample alone and in a batch, or padded to another length: the same per-sample sums,
# blocked differently by batch size and length. 2 layers x 3 iterations x (attention + feed-forward) = 12 chained
# updates, each a sum of at most 24 terms (the feed-forward width), in units of the compared values' largest
# magnitude; the energies' own sum (2 layers x 7 tokens x 24 units, as above) adds 336.
BATCH_ROUNDING = rounding(torch.float32, 12 * 24 + 2 * 7 * 24)


@pytest.mark.parametrize(
    "name", ["hyperset-image", "hyperset-sequence", "hyperset-token", "looped-image", "looped-token"]
)
def test_seeded_search_of_a_sample_is_independent_of_its_batch_and_padding(name):
    """Sample i's chosen trajectory, its K scores and its logits are the same alone (unpadded), in a batch of 6,
    in the reversed batch, alone padded to the batch's length and in the batch padded 5 tokens longer: its noise
    depends on the seed, the trajectory and the token position only."""
    model, batch = amplified(name), varied_batch(name)
    size, sequence = len(LENGTHS), "input_ids" in batch
    lengths = LENGTHS if sequence else [None] * size

    def alone(index: int, length: int | None) -> dict:
        return {key: value[index : index + 1, :length] for key, value in batch.items()}

    with torch.no_grad():
        reference = [model(**alone(i, lengths[i]), **SEARCH) for i in range(size)]
        # (what, output, the sample of each row); the padding first, so a padding-only dependence fails first
        layouts = []
        if sequence:
            for i in range(size):
                layouts.append(("alone, padded to 7", model(**alone(i, None), **SEARCH), [i]))
        layouts.append(("in a batch of 6", model(**batch, **SEARCH), list(range(size))))
        flipped = {key: value.flip(0) for key, value in batch.items()}
        layouts.append(("in the reversed batch", model(**flipped, **SEARCH), list(range(size))[::-1]))
        if sequence:  # 5 more padded tokens: mask 0, id 0
            longer = {key: torch.nn.functional.pad(value, (0, 5)) for key, value in batch.items()}
            layouts.append(("in the batch padded to 12", model(**longer, **SEARCH), list(range(size))))
    chosen = torch.stack([output.search_chosen[0] for output in reference])
    assert (chosen != 0).any(), (
        f"every sample kept the unperturbed trajectory: nothing would differ ({chosen})"
    )
    for layout, output, order in layouts:
        for row, i in enumerate(order):
            got = sample_results(model, output, row, lengths[i])
            want = sample_results(model, reference[i], 0, lengths[i])
            what = f"{name}, sample {i} {layout} (row {row}) vs alone unpadded"
            assert int(got["chosen"]) == int(want["chosen"]), (
                f"{what}: chosen {int(got['chosen'])} vs {int(want['chosen'])}; scores {got['scores'].tolist()} vs "
                f"{want['scores'].tolist()}"
            )
            assert_close_to_scale(got["scores"], want["scores"], BATCH_ROUNDING, f"{what}: scores")
            assert_close_to_scale(got["logits"], want["logits"], BATCH_ROUNDING, f"{what}: logits")


@pytest.mark.parametrize("name", ["hyperset-token", "looped-sequence"])
def test_more_trajectories_keep_the_first_ones(name):
    """K = 6 runs trajectories 0-3 from the same starts as K = 4: their scores agree (up to the rounding of a
    batch of 6·B instead of 4·B)."""
    model, batch = amplified(name), varied_batch(name)
    with torch.no_grad():
        four = model(**batch, **SEARCH)
        six = model(**batch, **{**SEARCH, "search_trajectories": 6})
    field = "search_energies" if four.search_energies is not None else "search_confidences"
    first, more = getattr(four, field), getattr(six, field)
    assert_close_to_scale(more[:, :4], first, BATCH_ROUNDING, f"{name}: {field}[:, :4], K = 6 vs K = 4")
    assert_differs(first[:, 1:], first[:, :1].expand(-1, 3), f"{name}: perturbed vs unperturbed {field}")


def test_search_noise_depends_on_the_trajectory_and_position_only():
    """ε[k, n] of `_search_noise` is the same for any K > k and any length N > n, across the boundary of its
    blocks of positions (here 5); trajectory 0 is zero; the seed and the trajectory change it."""
    noise = modeling_hyperset._search_noise
    cpu = torch.device("cpu")
    long, short = noise(7, 4, 13, 16, 5, cpu), noise(7, 2, 4, 16, 5, cpu)
    assert long.shape == (4, 13, 16) and long.dtype == torch.float32
    assert torch.equal(long[:2, :4], short), "trajectories 0-1 and positions 0-3 differ between the two draws"
    assert torch.equal(noise(7, 3, 11, 16, 5, cpu), long[:3, :11]), "a shorter length changed the noise"
    assert not long[0].any(), "trajectory 0 must start unperturbed"
    assert_differs(long[1], long[2], "trajectories 1 and 2")
    assert_differs(long[1:], noise(8, 4, 13, 16, 5, cpu)[1:], "seeds 7 and 8")


def test_search_noise_is_float32_under_another_default_dtype():
    """The docstring's float32 for every trajectory, the zero one included, whatever `torch.set_default_dtype`."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        noise = modeling_hyperset._search_noise(7, 3, 6, 4, 5, torch.device("cpu"))
    finally:
        torch.set_default_dtype(default)
    assert noise.dtype == torch.float32, f"search noise dtype {noise.dtype} under default float64"


def test_pipeline_search_labels_do_not_depend_on_its_batch_size():
    """The text pipeline with a seeded search gives every text the same label and scores at batch_size 1 and 8."""
    from transformers import pipeline

    from energyformers.pipelines import TextClassificationPipeline
    from energyformers.training.processing import train_tokenizer

    words = "a good film bad great boring plot actor scene long short fun".split()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, size=rng.integers(1, 9))) for _ in range(24)]
    tokenizer = train_tokenizer(texts * 3, vocab_size=40, max_length=16)
    for name in ("hyperset-sequence", "looped-sequence"):
        model = amplified(name, vocab_size=len(tokenizer), max_position_embeddings=48)
        classify = pipeline(
            "text-classification", model=model, tokenizer=tokenizer, pipeline_class=TextClassificationPipeline
        )
        one, eight = (classify(texts, batch_size=size, top_k=None, **SEARCH) for size in (1, 8))
        labels = [[entry["label"] for entry in result] for result in one]
        assert [[entry["label"] for entry in result] for result in eight] == labels, f"{name}: labels differ"
        got = [entry["score"] for result in eight for entry in result]
        expected = [entry["score"] for result in one for entry in result]
        # probabilities up to 1 from logits within BATCH_ROUNDING of each other (the softmax adds a few roundings)
        assert got == pytest.approx(expected, abs=BATCH_ROUNDING), f"{name}: scores differ"


# ---------------------------------------------------------------- selectors


@pytest.mark.parametrize("name", ["hyperset-image", "hyperset-token"])
def test_energy_selector_picks_the_lowest_energy_trajectory(name):
    """Constructed energies (written into the backbone's output) put the minimum at a different trajectory per
    sample: the chosen index, the reported energies and the returned logits follow them."""
    model, batch = eval_model(name), inputs_of(name)
    size = len(batch["labels"])
    energies = torch.tensor([[3.0, 1.0, 2.0], [0.5, 4.0, 1.0], [2.0, 2.0, -1.0], [7.0, 6.0, 6.5]])[:size]
    recorder = Recorder(model, energies.flatten())
    output = model(**batch, search_trajectories=K, search_noise=0.5, search_seed=0, search_selector="energy")
    recorder.remove()
    assert output.search_chosen.tolist() == [1, 0, 2, 1][:size]
    torch.testing.assert_close(output.search_energies, energies, rtol=0, atol=0)
    every = trajectory_logits(model, recorder.outputs[0], batch)
    every = every.view(size, K, *every.shape[1:])
    expected = every[torch.arange(size), output.search_chosen]
    torch.testing.assert_close(output.logits, expected, rtol=0, atol=0)
    # the loss is that of the chosen logits
    arguments = (expected, batch["labels"]) if model._per_token else (batch["labels"], expected)
    torch.testing.assert_close(output.loss, model.loss_function(*arguments, model.config), rtol=0, atol=0)


def test_reported_energies_are_the_final_energies_of_the_trajectories():
    """`search_energies` of trajectory 0 is Σ_layers E_ATTN + E_FF of a plain forward's per-layer final states."""
    name = "hyperset-sequence"
    model, batch = eval_model(name), plain_inputs(name)
    output = model(**batch, search_trajectories=K, search_noise=0.3, search_seed=1)
    backbone = backbone_of(model)
    states = backbone(**batch, output_hidden_states=True).hidden_states
    real = batch["attention_mask"].float()
    T = model.config.num_iterations
    expected = sum(
        backbone._energy(layer, states[(index + 1) * T], real) for index, layer in enumerate(backbone.layers)
    )
    # the same float32 energy of states computed in a batch of K × 4 instead of 4 (BLAS may block the sums
    # differently by batch size): the energy's longest sum, 2 layers × 7 tokens × 24 feed-forward units, in
    # ulps of the energies' scale (|E| up to a few hundred)
    assert_close_to_scale(
        output.search_energies[:, 0], expected, rounding(torch.float32, 2 * 7 * 24), "trajectory 0's energy"
    )
    assert (output.search_chosen == output.search_energies.argmin(-1)).all()


@pytest.mark.parametrize("name", ["hyperset-token", "looped-sequence"])
def test_confidence_selector_picks_the_most_confident_trajectory(name):
    model, batch = eval_model(name), plain_inputs(name)
    recorder = Recorder(model)
    output = model(
        **batch, search_trajectories=K, search_noise=2.0, search_seed=4, search_selector="confidence"
    )
    recorder.remove()
    size = len(output.logits)
    every = trajectory_logits(model, recorder.outputs[0], batch)
    top = every.softmax(-1).amax(-1)
    if model._per_token:
        mask = batch["attention_mask"].repeat_interleave(K, 0).float()
        top = (top * mask).sum(-1) / mask.sum(-1)
    expected = top.view(size, K)
    # the same softmax maximum (an exp, a sum of 4 labels, a division) and mean over at most 7 tokens, of
    # float32 logits recomputed from the recorded states: 16 roundings of probabilities up to 1
    assert_close_to_scale(output.search_confidences, expected, rounding(torch.float32, 16), "confidences")
    assert output.search_chosen.tolist() == expected.argmax(-1).tolist()
    assert len(set(output.search_chosen.tolist())) > 1 or output.search_chosen[0] != 0, (
        "every sample kept trajectory 0: the test would not see a wrong pick"
    )


# ---------------------------------------------------------------- Sudoku


def sudoku_batch(count: int = 2) -> tuple[torch.Tensor, np.ndarray]:
    from energyformers.training.sudoku import generate_puzzles

    puzzles, solutions = generate_puzzles(count, 0, 36, 45)
    return torch.as_tensor(puzzles.astype(np.int64)), solutions.astype(np.int64)


def test_sudoku_board_validity():
    puzzles, solutions = sudoku_batch(3)
    right = torch.nn.functional.one_hot(torch.as_tensor(solutions) - 1, 9).float()  # (B, 81, 9)
    assert modeling_hyperset.sudoku_boards_valid(puzzles, right).tolist() == [True] * 3
    wrong = right.clone()
    blank = int((puzzles[0] == 0).nonzero()[0])
    wrong[0, blank] = wrong[0, blank].roll(1)  # one blank cell off by one digit
    assert modeling_hyperset.sudoku_boards_valid(puzzles, wrong).tolist() == [False, True, True]
    # a wrong prediction on a given cell does not count: the given digit is kept
    given = int((puzzles[1] != 0).nonzero()[0])
    on_given = right.clone()
    on_given[1, given] = on_given[1, given].roll(1)
    assert modeling_hyperset.sudoku_boards_valid(puzzles, on_given).tolist() == [True] * 3


def test_sudoku_board_validity_checks_the_boxes():
    """A Latin square that is no Sudoku (rows and columns permutations, boxes not) is invalid, given as
    predictions on blanks, as givens, or mixed; a real solution in the same batch stays valid."""
    from test_sudoku import LATIN_NOT_SUDOKU, PUZZLE, SOLUTION

    latin, puzzle, solution = (
        torch.tensor([int(d) for d in g]) for g in (LATIN_NOT_SUDOKU, PUZZLE, SOLUTION)
    )
    half = torch.where(torch.arange(81) % 2 == 0, latin, 0)  # the even cells given, the odd ones predicted
    input_ids = torch.stack(
        [torch.zeros(81, dtype=torch.long), latin, half, puzzle, torch.zeros(81, dtype=torch.long)]
    )
    boards = torch.stack([latin, latin, latin, solution, solution])
    logits = torch.nn.functional.one_hot(boards - 1, 9).float()  # (5, 81, 9)
    got = modeling_hyperset.sudoku_boards_valid(input_ids, logits).tolist()
    assert got == [False, False, False, True, True], got


def sudoku_model(looped: bool = False):
    config = hyperset_config(
        "sequence", vocab_size=10, max_position_embeddings=81, num_labels=9, num_hidden_layers=1
    )
    if looped:
        return perturb(
            LoopedTransformerForTokenClassification(LoopedTransformerConfig.from_hyperset(config))
        ).eval()
    return perturb(HyperSetForTokenClassification(config)).eval()


@pytest.mark.parametrize("looped", [False, True], ids=["hyperset", "looped"])
def test_sudoku_selector_prefers_a_valid_board_else_falls_back(looped):
    """The classifier's output is rewritten per trajectory: trajectory 2 of sample 0 and trajectory 1 of sample 1
    give the solution; sample 0's trajectory 0 is the most confident / lowest-energy one, so only validity can pick
    trajectory 2. Without any valid board the fallback (energy, or confidence for the baseline) decides."""
    model = sudoku_model(looped)
    puzzles, solutions = sudoku_batch(2)
    right = torch.nn.functional.one_hot(torch.as_tensor(solutions) - 1, 9).float() * 10  # confident
    wrong = right.roll(1, dims=-1)  # every cell off by one digit: invalid only through the blanks

    def rewrite(valid: dict[int, int]):
        def hook(module, args, output):
            logits = wrong.repeat_interleave(K, 0) * 2  # more confident than the right boards
            for sample, trajectory in valid.items():
                logits[sample * K + trajectory] = right[sample]
            return logits

        return model.classifier.register_forward_hook(hook)

    handle = rewrite({0: 2, 1: 1})
    output = model(
        input_ids=puzzles, search_trajectories=K, search_noise=0.5, search_seed=0, search_selector="sudoku"
    )
    handle.remove()
    assert output.search_chosen.tolist() == [2, 1]
    assert output.search_valid_boards.tolist() == [[False, False, True], [False, True, False]]
    torch.testing.assert_close(output.logits, right, rtol=0, atol=0)

    handle = rewrite({})
    output = model(
        input_ids=puzzles, search_trajectories=K, search_noise=0.5, search_seed=0, search_selector="sudoku"
    )
    handle.remove()
    assert not output.search_valid_boards.any()
    fallback = output.search_confidences.argmax(-1) if looped else output.search_energies.argmin(-1)
    assert output.search_chosen.tolist() == fallback.tolist()


def test_sudoku_selector_refuses_a_model_that_is_no_sudoku_solver():
    model, batch = eval_model("hyperset-token"), plain_inputs("hyperset-token")
    with pytest.raises(
        ValueError,
        match=r"search_selector='sudoku' needs a Sudoku token-classification call.*"
        r"num_labels=4, input_ids shape \(4, 7\)",
    ):
        model(**batch, search_trajectories=2, search_selector="sudoku")


# ---------------------------------------------------------------- combined with the supervision steps


def test_search_runs_the_supervision_steps_of_each_trajectory():
    name = "hyperset-sequence"
    model, batch = eval_model(name, supervision_steps=2), plain_inputs(name)
    recorder = Recorder(model)
    output = model(**batch, search_trajectories=K, search_noise=0.0, search_seed=0)
    recorder.remove()
    assert recorder.calls == [K * 4, K * 4]
    torch.testing.assert_close(output.logits, model(**batch).logits, rtol=0, atol=0)
    assert output.supervision_steps_used.tolist() == [2] * 4


# ---------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(search_trajectories=0), "search_trajectories must be an integer >= 1 (1: no search); got 0."),
        (
            dict(search_trajectories=2.0),
            "search_trajectories must be an integer >= 1 (1: no search); got 2.0.",
        ),
        (
            dict(search_trajectories=True),
            "search_trajectories must be an integer >= 1 (1: no search); got True.",
        ),
        (
            dict(search_trajectories=2, search_noise=-0.1),
            "search_noise must be a finite number >= 0; got -0.1.",
        ),
        (
            dict(search_trajectories=2, search_noise=float("nan")),
            "search_noise must be a finite number >= 0; got nan.",
        ),
        (
            dict(search_trajectories=2, search_seed=-1),
            "search_seed must be None or an integer in [0, 2**63); got -1.",
        ),
        (
            dict(search_trajectories=2, search_selector="lowest"),
            "search_selector must be one of ['energy', 'confidence', 'sudoku']; got 'lowest'.",
        ),
        (dict(search_noise=0.1), "search_noise=0.1 given without search_trajectories"),
        (dict(search_selector="energy"), "search_selector='energy' given without search_trajectories"),
    ],
)
def test_bad_arguments_are_clear_errors_before_any_work(arguments, message):
    model, batch = eval_model("hyperset-token"), plain_inputs("hyperset-token")
    recorder = Recorder(model)
    with pytest.raises(ValueError, match=re.escape(message)):
        model(**batch, **arguments)
    recorder.remove()
    assert recorder.calls == [], "the backbone ran before the arguments were checked"


def test_energy_selection_is_refused_for_the_looped_baseline():
    model, batch = eval_model("looped-token"), plain_inputs("looped-token")
    with pytest.raises(
        ValueError, match=re.escape("search_selector='energy' needs a model with an energy (Hyper-SET)")
    ):
        model(**batch, search_trajectories=2, search_selector="energy")


def test_search_is_refused_in_training_mode():
    model, batch = build("hyperset-token"), plain_inputs("hyperset-token")
    with pytest.raises(
        ValueError, match=re.escape("search_trajectories=2 is test-time search: call model.eval()")
    ):
        model(**batch, search_trajectories=2)


# ---------------------------------------------------------------- pipelines and predict


def test_pipeline_passes_the_search_arguments_to_the_model():
    from test_pipelines import _direct_scores, _image, _scores, image_classifier  # noqa: F401
    from transformers import pipeline

    from energyformers.pipelines import ImageClassificationPipeline
    from energyformers.training.processing import build_image_processor

    torch.manual_seed(0)
    from energyformers import HyperSetForImageClassification

    model = perturb(HyperSetForImageClassification(hyperset_config("image", num_channels=3)), seed=2).eval()
    with torch.no_grad():
        model.hyperset.step_sizes.proj.weight.mul_(20)
    processor = build_image_processor(model.config)
    classify = pipeline(
        "image-classification",
        model=model,
        image_processor=processor,
        pipeline_class=ImageClassificationPipeline,
    )
    search = dict(search_trajectories=4, search_noise=1.0, search_seed=7, search_selector="energy")
    inputs = dict(processor(_image(), return_tensors="pt"))
    got = _scores(classify(_image(), top_k=4, **search))
    # the pipeline's numpy softmax vs torch's of the same float32 logits: the max subtracted, an exp, a sum of 4
    # labels, a division; 8 roundings of probabilities up to 1
    assert got == pytest.approx(_direct_scores(model, inputs, **search), abs=rounding(torch.float32, 8))
    # a liveness margin: the search moves these probabilities by about 1e-2, far above their rounding
    assert got != pytest.approx(_direct_scores(model, inputs), abs=1e-4), "the search changed nothing"
    assert "forward" not in model.__dict__


def test_predict_passes_the_search_flags_to_the_model_call(hyperset_folder, capsys, monkeypatch):
    import inspect

    from test_cli_errors import predicted_scores

    import energyformers

    folder, image = hyperset_folder
    calls: list[dict] = []
    original = energyformers.HyperSetForImageClassification.forward
    names = ("search_trajectories", "search_noise", "search_seed", "search_selector", "halting_threshold")

    def recording(self, *args, **kwargs):
        calls.append({k: kwargs.get(k) for k in names})
        return original(self, *args, **kwargs)

    recording.__signature__ = inspect.signature(
        original
    )  # predict checks the flags against the forward's names
    monkeypatch.setattr(energyformers.HyperSetForImageClassification, "forward", recording)
    flags = ["--search_trajectories", "3", "--search_noise", "0.5", "--search_seed", "1"]
    predicted_scores(capsys, str(folder), str(image), *flags, "--search_selector", "confidence")
    assert calls[-1] == {
        "search_trajectories": 3,
        "search_noise": 0.5,
        "search_seed": 1,
        "search_selector": "confidence",
        "halting_threshold": None,
    }, calls


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--search_trajectories", "0"], "--search_trajectories 0: expected an integer >= 1"),
        (
            ["--search_trajectories", "2", "--search_noise", "-1"],
            "--search_noise -1.0: expected a finite number >= 0",
        ),
        (["--halting_threshold", "1"], "--halting_threshold 1.0: expected a number in (0, 1)"),
        (
            ["--search_noise", "0.1"],
            "--search_noise: a test-time search flag; pass --search_trajectories K as well",
        ),
    ],
)
def test_predict_refuses_bad_search_flags_before_loading(hyperset_folder, capsys, flags, message):
    from energyformers.training import predict

    folder, image = hyperset_folder
    assert predict.main([str(folder), str(image), *flags]) == 2
    assert message in capsys.readouterr().err
