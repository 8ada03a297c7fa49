"""The one test-fixture module: tiny configs, inputs and models for every (family, head, input type).

Every test file builds its tiny configs, inputs and models here (tests/ is on `sys.path` in pytest's default
import mode, so test files `from fixtures import ...`). The heads come from `energyformers.FAMILIES` (the
single source for Auto registration), so a new family or head is covered as soon as it is registered there
and given a tiny-config factory in `TINY` below. The base model (`AutoModel`) takes both input types, so it
appears once per input type. Family-specific choices are overrides: `Case.build(**overrides)`,
`Case.config(**overrides)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers.utils import ModelOutput

from energyformers import (
    FAMILIES,
    HyperBFConfig,
    HyperSetConfig,
    HyperSetForImageClassification,
    HyperSetForMaskedImageModeling,
    IMixerConfig,
    LoopedTransformerConfig,
    LoopedTransformerForImageClassification,
    LoopedTransformerForMaskedImageModeling,
)

# ---------------------------------------------------------------- what a test needs from the machine


def in_ci() -> bool:
    """Whether the suite runs in CI: the `CI` variable that CI services set (`CI=true`) is 1, true or yes."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def skip_or_fail(reason: str) -> NoReturn:
    """A test whose prerequisite (data, fixtures) this machine lacks: skipped on a developer's machine, failed under
    `CI=true`, where a skip would report a check that never ran as passed."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: this test may not be skipped in CI)", pytrace=False)
    pytest.skip(reason)


# The authors' fixtures: outputs of the authors' own code (official weights under official names, inputs,
# float64/float32 outputs and intermediates), one `NAME.safetensors` and its `NAME.json` notes each. They live
# beside the checkout (`../shared/fixtures/authors`) unless `$ENERGYFORMERS_AUTHOR_FIXTURES` names another folder.
AUTHOR_FIXTURES = Path(
    os.environ.get("ENERGYFORMERS_AUTHOR_FIXTURES")
    or Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "authors"
)
AUTHOR_FIXTURE_NAMES = (
    "imixer_tiny",
    "hyperbf_vit_tiny",
    "hyperset_ic_m32",
    "hyperset_sudoku",
    "hyperset_mim",
)


def require_author_fixtures(*names: str) -> Path:
    """`AUTHOR_FIXTURES`, once the files of fixtures `names` (default: all of them) are there; otherwise the test
    is skipped, or failed under `CI=true` (`skip_or_fail`), with the missing files and where they were looked for."""
    unknown = sorted(set(names) - set(AUTHOR_FIXTURE_NAMES))
    if unknown:
        raise ValueError(
            f"names={unknown}: not an author fixture; the fixtures are {list(AUTHOR_FIXTURE_NAMES)}"
        )
    files = [
        f"{name}{suffix}" for name in names or AUTHOR_FIXTURE_NAMES for suffix in (".safetensors", ".json")
    ]
    missing = [file for file in files if not (AUTHOR_FIXTURES / file).is_file()]
    if missing:
        what = f"missing: {', '.join(missing)}" if AUTHOR_FIXTURES.is_dir() else "no such folder"
        skip_or_fail(
            f"the authors' fixtures are not at {AUTHOR_FIXTURES} ({what}); "
            "set ENERGYFORMERS_AUTHOR_FIXTURES to their folder"
        )
    return AUTHOR_FIXTURES


def needs_author_fixtures(test: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: `require_author_fixtures()` before the test runs. Checked when the test runs, not when the module
    is collected, so that under `CI=true` each such test fails on its own instead of the whole file erroring."""

    @functools.wraps(test)  # keeps the signature (pytest's fixtures and parameters) and the marks
    def checked(*args: Any, **kwargs: Any) -> Any:
        require_author_fixtures()
        return test(*args, **kwargs)

    return checked


def require_dataset(name: str) -> Any:
    """The built-in dataset `name` (`load_data(name)`, a `DatasetDict`) when its data package is installed
    (`.ci/install-data.sh`); otherwise the test is skipped, or failed under `CI=true`, with the install command."""
    # imported here: the data module pulls in `datasets`, which most test files never need
    from energyformers.training.data import MissingDataError, load_data

    try:
        return load_data(name)
    except MissingDataError as err:
        reason = f"{name} is not installed: {err.install_command}"
    skip_or_fail(reason)  # outside the `except`: the report shows the reason, not the error chained to it


# ---------------------------------------------------------------- tiny configs, one per family and input type

# The architecture of each family's tiny config: what stays the same for both input types, and what the CLI
# tests pass as `--config` overrides (the CLI derives the geometry — image size, vocabulary — from the data).
ARCHITECTURE: dict[str, dict[str, Any]] = {
    "hyperset": dict(
        hidden_size=16,
        num_attention_heads=4,
        intermediate_size=24,
        num_hidden_layers=2,
        num_iterations=3,
        time_embedding_dim=16,
    ),
    "imixer": dict(hidden_size=16, num_hidden_layers=2, fixed_point_iterations=2),
    "hyperbf": dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=2),
}


@dataclasses.dataclass(frozen=True)
class Tiny:
    """A family's tiny config and the sizes its inputs need."""

    config: Callable[..., transformers.PretrainedConfig]  # (input_type, **overrides) -> config
    batch: int
    length: int
    image: int
    channels: int
    vocab: int
    labels: int
    hidden: int
    positions: int  # max_position_embeddings of the sequence config


def tiny_vq_model(codebook_size: int = 16, sample_size: int = 8) -> torch.nn.Module:
    """A tiny random diffusers VQModel in eval mode, seeded: two levels (downsampling factor 2), 4-channel latents."""
    import diffusers

    torch.manual_seed(0)
    return diffusers.VQModel(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "AttnDownEncoderBlock2D"),
        up_block_types=("AttnUpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        num_vq_embeddings=codebook_size,
        norm_num_groups=4,
        sample_size=sample_size,
    ).eval()


def hyperset_config(input_type: str, **overrides: Any) -> HyperSetConfig:
    kwargs = dict(**ARCHITECTURE["hyperset"], num_labels=4)
    if input_type == "image":
        kwargs.update(image_size=8, patch_size=2, num_channels=1)
    else:
        kwargs.update(input_type="sequence", vocab_size=20, max_position_embeddings=16)
    return HyperSetConfig(**{**kwargs, **overrides})


def imixer_config(input_type: str, **overrides: Any) -> IMixerConfig:
    kwargs = dict(**ARCHITECTURE["imixer"], num_labels=4)
    if input_type == "image":
        kwargs.update(image_size=8, patch_size=2, num_channels=1)
    else:
        kwargs.update(input_type="sequence", vocab_size=20, max_position_embeddings=10)
    return IMixerConfig(**{**kwargs, **overrides})


def hyperbf_config(input_type: str, **overrides: Any) -> HyperBFConfig:
    kwargs = dict(
        input_type=input_type,
        **ARCHITECTURE["hyperbf"],
        image_size=8,
        patch_size=2,
        num_channels=3,
        num_labels=3,
    )
    if input_type == "sequence":
        kwargs.update(vocab_size=16, max_position_embeddings=12)
    return HyperBFConfig(**{**kwargs, **overrides})


# The main input each `config.input_type` must give a model: the models set `main_input_name` themselves
# (`_set_input_names` in the model files), and test_common checks every head against this table.
MAIN_INPUT_NAMES = {"image": "pixel_values", "sequence": "input_ids"}

TINY = {
    "hyperset": Tiny(
        hyperset_config, batch=3, length=7, image=8, channels=1, vocab=20, labels=4, hidden=16, positions=16
    ),
    "imixer": Tiny(
        imixer_config, batch=3, length=7, image=8, channels=1, vocab=20, labels=4, hidden=16, positions=10
    ),
    "hyperbf": Tiny(
        hyperbf_config, batch=2, length=12, image=8, channels=3, vocab=16, labels=3, hidden=32, positions=12
    ),
}


def looped_transformer_config(input_type: str, **overrides: Any) -> LoopedTransformerConfig:
    """The baseline of the tiny Hyper-SET config (`from_hyperset`: same embeddings, width, heads, depth and head;
    its own MLP of width 4d); `overrides` are the baseline's fields."""
    return LoopedTransformerConfig.from_hyperset(hyperset_config(input_type), **overrides)


# The baselines' tiny configs (`energyformers.BASELINES`), as `TINY` for the families; a baseline shares the
# inputs of the family it is measured against.
BASELINE_TINY = {
    "looped-transformer": dataclasses.replace(TINY["hyperset"], config=looped_transformer_config)
}


# CLI runs train and evaluate in (several) processes on real data: the tiny architecture at the least depth.
SHALLOW = dict(num_hidden_layers=1, num_iterations=2, fixed_point_iterations=1)


def cli_architecture(family: str) -> dict[str, Any]:
    """The tiny architecture of CLI runs: `ARCHITECTURE` made shallow."""
    return {**ARCHITECTURE[family], **{k: v for k, v in SHALLOW.items() if k in ARCHITECTURE[family]}}


def cli_config(family: str) -> list[str]:
    """`cli_architecture` as `energyformers train --config` values (`key=json`)."""
    return [f"{key}={json.dumps(value)}" for key, value in cli_architecture(family).items()]


# The few examples a test's training run takes from each split (train, validation, test).
TINY_SPLITS = ["--max_train_samples", "32", "--max_eval_samples", "16", "--max_test_samples", "16"]
# A whole training run on digits in seconds: 3 steps of 8 examples from `TINY_SPLITS`, one thread, no predictions.
TINY_DIGITS_RUN = [
    "--dataset",
    "digits",
    *TINY_SPLITS,
    "--max_steps",
    "3",
    "--batch_size",
    "8",
    "--warmup_ratio",
    "0",
    "--num_threads",
    "1",
    "--num_predictions",
    "0",
    "--disable_tqdm",
]


# ---------------------------------------------------------------- cases: one per (family, head, input type)


@dataclasses.dataclass(frozen=True)
class Case:
    """One model class of one family with configs of one input type: builds its config, model and inputs."""

    family: str
    auto_name: str  # "AutoModel" is the base model
    input_type: str

    @classmethod
    def of(cls, model_class: type, input_type: str | None = None) -> Case:
        """The case of a model class (a base model needs the `input_type`; a head has exactly one)."""
        matches = [c for c in ALL if c.model_class is model_class and input_type in (None, c.input_type)]
        if len(matches) != 1:
            raise LookupError(f"{model_class.__name__} with input_type={input_type!r}: {matches}")
        return matches[0]

    @property
    def model_class(self) -> type:
        return FAMILIES[self.family].heads[self.auto_name]

    @property
    def auto_class(self) -> type:
        return getattr(transformers, self.auto_name)

    @property
    def is_base(self) -> bool:
        return self.auto_name == "AutoModel"

    @property
    def per_token(self) -> bool:
        return self.auto_name in ("AutoModelForTokenClassification", "AutoModelForMaskedImageModeling")

    @property
    def tiny(self) -> Tiny:
        return TINY[self.family]

    @property
    def main_input_name(self) -> str:
        return MAIN_INPUT_NAMES[self.input_type]

    def __str__(self) -> str:
        return f"{self.model_class.__name__}-{self.input_type}"

    def config(self, **overrides: Any) -> transformers.PretrainedConfig:
        return self.tiny.config(self.input_type, **overrides)

    def build(self, seed: int = 0, **overrides: Any) -> torch.nn.Module:
        """The model in eval mode, initialised from `torch.manual_seed(seed)`."""
        attn_implementation = overrides.pop("attn_implementation", None)
        torch.manual_seed(seed)
        model = self.model_class(self.config(**overrides)).eval()
        if attn_implementation is not None:
            model.set_attn_implementation(attn_implementation)
            assert model.config._attn_implementation == attn_implementation
        return model

    def inputs(self, labels: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
        """`pixel_values`, or `input_ids` + `attention_mask` with padding in the first row."""
        tiny, g = self.tiny, torch.Generator().manual_seed(seed)
        if self.input_type == "image":
            shape = (tiny.batch, tiny.channels, tiny.image, tiny.image)
            inputs = {"pixel_values": torch.randn(shape, generator=g)}
        else:
            # every token id occurs, so every embedding row is exercised
            ids = torch.randperm(tiny.batch * tiny.length, generator=g) % tiny.vocab
            mask = torch.ones(tiny.batch, tiny.length, dtype=torch.long)
            mask[0, -2:] = 0
            inputs = {"input_ids": ids.view(tiny.batch, tiny.length), "attention_mask": mask}
        if labels:
            shape = (tiny.batch, tiny.length) if self.per_token else (tiny.batch,)
            inputs["labels"] = torch.randint(0, tiny.labels, shape, generator=g)
            if self.per_token:
                inputs["labels"][inputs["attention_mask"] == 0] = -100
        return inputs


def _input_types(auto_name: str) -> list[str]:
    if auto_name == "AutoModel":
        return ["image", "sequence"]
    return ["image"] if auto_name == "AutoModelForImageClassification" else ["sequence"]


ALL = [
    Case(family, auto_name, input_type)
    for family, spec in FAMILIES.items()
    for auto_name in spec.heads
    for input_type in _input_types(auto_name)
]
HEADS = [case for case in ALL if not case.is_base]
BASES = [case for case in ALL if case.is_base]
IMAGE = [case for case in ALL if case.input_type == "image"]
SEQUENCE = [case for case in ALL if case.input_type == "sequence"]


def cases(selection: list[Case]) -> pytest.MarkDecorator:
    """Parametrise a test over `case` in `selection`, with readable ids."""
    return pytest.mark.parametrize("case", selection, ids=str)


# ---------------------------------------------------------------- helpers


def perturb(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Move every saved floating tensor (parameters and persistent buffers such as iMixer's u, v) off its
    initial value, so a checkpoint that silently re-initialised anything, or a zero-initialised head, is seen."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(0.01 * torch.randn(tensor.shape, generator=g, dtype=tensor.dtype))
    return model


def step_once(model: torch.nn.Module, inputs: dict[str, torch.Tensor], lr: float = 0.1) -> torch.nn.Module:
    """One SGD step on `inputs` (with labels), so zero-initialised parameters (Hyper-SET's step sizes, iMixer's
    classifier) become non-zero; returns the model in eval mode."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model(**inputs).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return model.eval()


def main_output(outputs: ModelOutput) -> torch.Tensor:
    return outputs.logits if hasattr(outputs, "logits") else outputs.last_hidden_state


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a (possibly nested) output, in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, ModelOutput):
        yield from tensors(value.to_tuple())
    elif isinstance(value, dict):
        yield from tensors(tuple(value.values()))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield from tensors(tuple(getattr(value, f.name) for f in dataclasses.fields(value)))
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors(item)


def assert_same_structure_and_tensors(got: Any, expected: Any, path: str = "out") -> None:
    """Exact (bitwise) equality, element by element, of two nested outputs."""
    if isinstance(expected, ModelOutput):
        expected = expected.to_tuple()
    if isinstance(got, ModelOutput):
        got = got.to_tuple()
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        assert torch.equal(got, expected), path
    elif isinstance(expected, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(expected), path
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_same_structure_and_tensors(a, b, f"{path}[{i}]")
    else:
        got_tensors, expected_tensors = list(tensors(got)), list(tensors(expected))
        assert len(got_tensors) == len(expected_tensors), path
        for i, (a, b) in enumerate(zip(got_tensors, expected_tensors)):
            assert torch.equal(a, b), f"{path}:{i}"


# ------------------------------------------------------------------ the aten ops a call dispatches


class DispatchedOps(TorchDispatchMode):
    """Every aten op dispatched inside the block, in order (the backward too: autograd runs it under the same modes).

    `ops`: their names (`aten.add.Tensor`); `packets`: the names without the overload (`aten.add`); `kernels`: how
    many are not views (the kernels a GPU launches); `from_nothing`: the names of those that built a tensor from no
    tensor argument (`zeros`, `ones`, `full`, ...: a kernel, and an allocation, at every call).
    """

    def __init__(self) -> None:
        super().__init__()
        self.funcs: list[Any] = []
        self.from_nothing: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.funcs.append(func)
        if isinstance(out, torch.Tensor) and not any(
            isinstance(t, torch.Tensor) for t in tree_flatten((args, kwargs))[0]
        ):
            self.from_nothing.append(str(func))
        return out

    @property
    def ops(self) -> list[str]:
        return [str(func) for func in self.funcs]

    @property
    def packets(self) -> set[str]:
        return {str(func.overloadpacket) for func in self.funcs}

    @property
    def kernels(self) -> int:
        return sum(not func.is_view for func in self.funcs)


# ------------------------------------------------------------------ tolerances from dtype and magnitude


@contextlib.contextmanager
def loaded_script(path: Path, name: str) -> Iterator[Any]:
    """A script of benchmarks/ imported as module `name` while the block runs (registered in `sys.modules` first:
    its dataclasses look their module up while the file executes), and unregistered afterwards, with `sys.path` as
    it was (each script puts its folder on it when imported)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    path_before = list(sys.path)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]
        sys.path[:] = path_before


def rounding(dtype: torch.dtype, roundings: float, magnitude: float = 1.0) -> float:
    """A bound on the rounding error of a `dtype` result: `roundings` units in the last place of `magnitude`.

    Each float operation rounds by at most eps/2 relative to its result, so `roundings` (the count of rounded
    operations whose errors can add up: the length of a sum, the depth of a chain of layers) times eps times the
    size of the largest quantity in the computation bounds what two orders of the same computation may differ by.
    Callers state the count and the magnitude in a comment next to the call.
    """
    return roundings * torch.finfo(dtype).eps * magnitude


def assert_differs(
    got: torch.Tensor, other: torch.Tensor, what: str, *, beyond_allclose: bool = False
) -> None:
    """`got` differs from `other`, and both are finite. `not torch.equal` / `not torch.allclose` alone also passes
    when either holds a NaN (NaN equals nothing), so a broken result would count as "changed". `beyond_allclose`:
    the difference must exceed `torch.allclose`'s default tolerances, not only be nonzero."""
    for name, tensor in (("got", got), ("other", other)):
        bad = int((~torch.isfinite(tensor)).sum())
        assert bad == 0, f"{what}: {name} has {bad} non-finite values out of {tensor.numel()}"
    same = torch.allclose(got, other) if beyond_allclose else torch.equal(got, other)
    delta = (
        (got.double() - other.double()).abs().max().item()
        if got.shape == other.shape and got.numel()
        else None
    )
    assert not same, f"{what}: expected a difference, got max |Δ| = {delta} (shapes {tuple(got.shape)})"


def labelled(name: str) -> Callable[[str], str]:
    """`msg=` for `torch.testing.assert_close` that names the tensor and keeps torch's message with the numbers."""
    return lambda default: f"{name}: {default}"


def assert_same_saved_weights(reference: Path, run: Path) -> None:
    """The `model.safetensors` of output folders `reference` and `run` hold the same tensors, bit for bit: what a run
    resumed from a checkpoint (or fed by DataLoader workers) gives when it repeats the uninterrupted run's float
    operations in the same order (same seed, restored optimizer, scheduler and RNG state, same data, one thread)."""
    a, b = load_file(reference / "model.safetensors"), load_file(run / "model.safetensors")
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=0, rtol=0, msg=labelled(key))


# The constructor kwargs of a tiny official iMixer (`synthetic_imixer_checkpoint`).
TINY_IMIXER = {
    "num_classes": 3,
    "img_size": 8,
    "patch_size": 4,
    "num_blocks": 1,
    "embed_dim": 8,
    "mlp_ratio": [0.5, 4.0],
    "hidden_ratio": 2.0,
    "n_power_iterations": 1,
    "n_repeat": 2,
}


def synthetic_imixer_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], Path, Path]:
    """A random official iMixer state_dict of `TINY_IMIXER` (seeded), written into `folder` as bare safetensors
    beside its constructor kwargs (JSON): (the state, the checkpoint, the kwargs file), what `convert` takes."""
    from energyformers.training.convert import SOURCES

    family = SOURCES["imixer"]
    kwargs = family.normalise_kwargs(dict(TINY_IMIXER))
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, (shape, _) in family.layout(kwargs).items():
        value = 0.3 * torch.randn(shape, generator=generator)
        state[key] = value / value.norm() if key.endswith(("weight_u", "weight_v")) else value
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "kwargs.json"
    config.write_text(json.dumps(TINY_IMIXER))
    checkpoint = folder / "imixer.safetensors"
    save_file(state, str(checkpoint))
    return state, checkpoint, config


def assert_close_to_scale(
    actual: torch.Tensor, expected: torch.Tensor, tolerance: float, name: str = ""
) -> None:
    """`actual` equals `expected` within `tolerance` × max(1, max|expected|) in every entry.

    Two paths that compute the same sums in another order differ by rounding that grows with the largest terms of
    the tensor, not with each entry's own size: an entry near 0 beside entries of 45 carries the rounding of 45. So
    the bound is taken relative to the tensor's largest magnitude (never below `tolerance` itself); callers pick
    `tolerance` by dtype. On failure the message names the tensor and shows the difference, the bound and the scale.
    """
    scale = max(1.0, expected.detach().abs().max().item()) if expected.numel() else 1.0
    atol = tolerance * scale

    def message(default: str) -> str:
        return f"{name}: {default}\nallowed: {tolerance:g} x scale {scale:.4g} = {atol:.3g}"

    torch.testing.assert_close(actual, expected, atol=atol, rtol=0, msg=message)


# ------------------------------------------------------------------ fresh processes


def run_at_once(
    commands: dict[Any, dict[str, Any]], timeout: float
) -> dict[Any, subprocess.CompletedProcess]:
    """Run independent fresh processes at once and wait for all: key -> `subprocess.Popen` keyword arguments
    (`args`, `env`, `cwd`, ...), key -> the finished process with its text output.

    Each such process is mostly one thread importing torch and transformers, so on a small machine two or three at
    once take about the wall time of one or two. Output goes to temporary files, not pipes: no process can block on
    a full pipe while another is waited for. A process past `timeout` (seconds, each) stops them all.
    """
    with contextlib.ExitStack() as stack:
        running = {}
        for key, kwargs in commands.items():
            out, err = (stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(2))
            running[key] = (subprocess.Popen(**kwargs, stdout=out, stderr=err, text=True), out, err)
        done = {}
        try:
            for key, (proc, out, err) in running.items():
                returncode = proc.wait(timeout=timeout)
                out.seek(0), err.seek(0)
                done[key] = subprocess.CompletedProcess(proc.args, returncode, out.read(), err.read())
        except subprocess.TimeoutExpired as expired:
            _stop(running)
            # what each child had written by then: where it was stuck, which the bare timeout does not say
            tails = "\n".join(
                f"--- {key!r} ({_state(proc)}), last {TAIL} characters of {name}:\n{_tail(stream)}"
                for key, (proc, out, err) in running.items()
                for name, stream in (("stdout", out), ("stderr", err))
            )
            raise AssertionError(
                f"{expired.cmd!r} ran past {timeout} s; the processes' output:\n{tails}"
            ) from None
        finally:
            _stop(running)
        return done


TAIL = 3000  # characters of each stream `run_at_once` shows of a timed-out run: a traceback or the last lines


def _stop(running: dict[Any, tuple[subprocess.Popen, Any, Any]]) -> None:
    for proc, _, _ in running.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _state(proc: subprocess.Popen) -> str:
    return "killed at the timeout" if proc.returncode == -9 else f"exit status {proc.returncode}"


def _tail(stream: Any) -> str:
    stream.seek(0)
    return stream.read()[-TAIL:] or "(empty)"


# The environment of the command-line tests: one thread, offline.
CLI_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# Modules an argument error must not import: torch, and the package's model code.
HEAVY = ("torch", "energyformers.registry", "energyformers.modeling")

# Runs `energyformers ARGS` for each case in one process, as the console script does (sys.argv[0] is the
# script's name, so `import energyformers` defers the models), recording status, stderr, stdout, time and which
# heavy modules were imported by then.
_CLI_CASES = """
import contextlib, io, json, runpy, sys, time
out, cases = sys.argv[1], json.loads(sys.argv[2])
results = []
for argv in cases:
    sys.argv = ["energyformers", *argv]
    err, printed, start = io.StringIO(), io.StringIO(), time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(printed):
        try:
            runpy.run_module("energyformers", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            code = stop.code
    heavy = sorted(m for m in sys.modules if m in HEAVY or m.startswith("energyformers.modeling"))
    results.append({
        "code": code, "err": err.getvalue(), "out": printed.getvalue(), "seconds": time.perf_counter() - start,
        "heavy": heavy,
    })
open(out, "w").write(json.dumps(results))
""".replace("HEAVY", repr(HEAVY))


def run_cli_cases(
    argvs: list[list[Any]], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> list[dict[str, Any]]:
    """`energyformers ARGV` for each argv, in order, in one fresh process: per case its exit `code`, its `err`
    (stderr), `out` (stdout), `seconds` and the `heavy` modules imported by the time it returned. `cwd` also holds
    the record."""
    record = Path(cwd) / ".cli-cases.json"
    cases = json.dumps([[str(a) for a in argv] for argv in argvs])
    program = [sys.executable, "-c", _CLI_CASES, str(record), cases]
    done = subprocess.run(
        program, capture_output=True, text=True, env=env or CLI_ENV, timeout=timeout, cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(record.read_text())
    record.unlink()
    return results


def tiny_mim_model(model_type: str, **overrides: object) -> torch.nn.Module:
    """Both masked-image-modelling heads of the paper's Table 2 at a tiny size of their `cli-mim` presets (the paper's
    structure: sin-cos 2-D / learned positions, input-conditioned step sizes): a 4 × 4 grid, codebook 8 + [MASK]."""
    size = dict(
        hidden_size=16,
        num_attention_heads=4,
        num_iterations=3,
        vocab_size=9,
        max_position_embeddings=16,
        **overrides,
    )
    torch.manual_seed(0)
    if model_type == "hyperset":
        config = HyperSetConfig.from_preset("cli-mim", intermediate_size=16, time_embedding_dim=16, **size)
        return perturb(HyperSetForMaskedImageModeling(config))
    config = LoopedTransformerConfig.from_preset("cli-mim", intermediate_size=64, **size)
    return perturb(LoopedTransformerForMaskedImageModeling(config))


def compact_labels(config_dict: dict) -> dict:
    """`config_dict` with transformers' default label names ("LABEL_i") replaced by their count, as the old-code
    config fixtures hold them (tests/data/old_models/generate.py): the ImageNet presets' 1000 names would make the
    fixture two hundred times larger and say nothing about our fields."""
    out = dict(config_dict)
    id2label = out.get("id2label")
    if id2label is not None and id2label == {str(i): f"LABEL_{i}" for i in range(len(id2label))}:
        out["id2label"] = f"default names of {len(id2label)} labels"
        if out.get("label2id") == {f"LABEL_{i}": i for i in range(len(id2label))}:
            out["label2id"] = f"default names of {len(id2label)} labels"
    return out


def run_launcher(
    argv: list[str], tmp_path: Path, env: dict[str, str], timeout: float = 400
) -> subprocess.CompletedProcess:
    """A multi-process launch (`argv`: torchrun or `accelerate launch`, as modules of this interpreter) run in
    `tmp_path` with `env`, its output captured. Torch elastic makes a torchelastic_* log folder in TMPDIR per launch
    and leaves it: a TMPDIR under `tmp_path` makes it pytest's to clean."""
    temporary = tmp_path / "tmp"
    temporary.mkdir(exist_ok=True)
    env = {**env, "TMPDIR": str(temporary)}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=tmp_path)


DIGIT_LABELS = {i: str(i) for i in range(10)}  # the built-in digits dataset's label names


def saved_digits_classifier(family: str, folder: Path, **fields: Any) -> Path:
    """A tiny untrained image classifier for the built-in `digits` (8 × 8 RGB, patch 4, T = 2, its label names) saved
    in `folder` with its image processor, as a run folder holds it: Hyper-SET (`family` "hyperset") or the looped
    Transformer ("looped"); `fields` add to its config."""
    from energyformers.training.processing import build_image_processor

    geometry = dict(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_attention_heads=2)
    fields = dict(geometry, num_iterations=2, id2label=DIGIT_LABELS, **fields)
    if family == "hyperset":
        model = HyperSetForImageClassification(HyperSetConfig(intermediate_size=8, **fields))
    else:
        model = LoopedTransformerForImageClassification(
            LoopedTransformerConfig(intermediate_size=32, **fields)
        )
    model.save_pretrained(folder)
    build_image_processor(model.config).save_pretrained(folder)
    return folder


def digit_images() -> torch.Tensor:
    """scikit-learn's 1,797 UCI digits (bundled, offline), 8×8 grey values 0..16 → `(1797, 1, 16, 16)` in [0, 1]
    (bilinear, so 2×2 patches are not all flat)."""
    from sklearn.datasets import load_digits

    images = torch.from_numpy(load_digits().images).float()[:, None] / 16.0
    return torch.nn.functional.interpolate(images, scale_factor=2, mode="bilinear").clamp(0, 1)


def digit_mim_model(codebook_size: int) -> HyperSetForMaskedImageModeling:
    """A small untrained (seeded) masked-image-modelling model of the paper's `mim-1-12-d` structure for the codes
    of `digit_images` at patch 2: the 8 × 8 grid, `codebook_size` codes + [MASK]."""
    torch.manual_seed(0)
    config = HyperSetConfig.from_preset(
        "mim-1-12-d",
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        time_embedding_dim=32,
        num_iterations=3,
        vocab_size=codebook_size + 1,
        max_position_embeddings=64,  # the 8 × 8 grid
    )
    return HyperSetForMaskedImageModeling(config)


class Records(logging.Handler):
    """A handler keeping the messages of the logger it is added to (transformers' loggers do not propagate to
    pytest's caplog)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_stopped_runs(
    script: str, plan: list, root: Path, env: dict[str, str], timeout: float
) -> list[tuple[dict, str]]:
    """Run a stop script's `plan` (a JSON list, one entry per run) in one child process: the script writes one
    record per run to the file its second argument names and starts each run's stderr with a line `===== <index>`.
    Returns (record, that run's part of stderr) per run, in plan order."""
    import re

    path, seen = root / "stop.py", root / "seen.json"
    path.write_text(script)
    command = [sys.executable, str(path), json.dumps(plan), str(seen)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0 and seen.is_file(), (proc.returncode, proc.stderr[-3000:])
    parts = re.split(r"^===== (\d+)\n", proc.stderr, flags=re.M)[1:]
    assert parts[::2] == [str(i) for i in range(len(plan))], (parts[::2], proc.stderr[-3000:])
    return list(zip(json.loads(seen.read_text()), parts[1::2], strict=True))


# ---------------------------------------------------------------- a decompression bomb


def decompression_bomb_png(path: Path, side: int = 20000) -> Path:
    """A valid PNG of `side` × `side` 1-bit pixels, all black: a few dozen KB (the zeros compress), but at the
    default side twice PIL's `Image.MAX_IMAGE_PIXELS` and more, so opening it raises `DecompressionBombError`.
    Written a block of rows at a time (never the whole image in memory): well under a second."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor = zlib.compressobj(9)
    row = bytes(1 + (side + 7) // 8)  # filter byte 0, then the packed bits
    block = row * 1000
    data = b"".join(compressor.compress(block) for _ in range(side // 1000))
    data += compressor.compress(row * (side % 1000)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # bit depth 1, greyscale: PIL's mode "1"
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
    )
    return path
