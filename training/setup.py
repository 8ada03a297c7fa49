"""Config, processor, model and data of a training run, built from the parsed arguments (both loops).

`build(args, state)` first checks the model flags as far as they can be judged without the data
(`check_flags_before_data`) and loads the `--from_pretrained` checkpoint's processor (`pretrained_processor`),
then loads and checks the data, builds the config (CLI preset, `--preset`, `--config`,
`--from_pretrained`, config-field flags) and the processor saved with the model, creates or loads the model
and runs one real batch through it, so every mismatch surfaces before training and before anything is written.
Input errors are `UsageError` (bad flags) or `DataError` (bad data): one line each, no traceback.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import energyformers

from ..tokenizer_fit import MIM_AUTO_CLASS
from .arguments import (
    MIM_TASK,
    Arguments,
    RunArguments,
    UsageError,
    check_attn_flag,
    check_output_dir,
    config_flags,
    mim_tokenizer_source,
    output_folder,
    parse_overrides,
    redacted_argv,
    work_folder,
)
from .batches import batches_done
from .cli import check_model_source, launch_rank
from .data import (
    BUILTIN_DATASETS,
    DataError,
    decode_image,
    decode_lazily,
    input_type_of,
    label_names,
    load_data,
    task_of,
)
from .evaluation import has_recurrent_depth
from .predict import cannot_load
from .weights import check_model_folder, load_or_refuse

# Small configs used when no --preset is given, per (family, input_type): the CLI's model sizes. They are sized
# for the built-in datasets on a 2-core CPU (`make demo` trains digits in a few minutes).
# Dataset-dependent fields (image_size/patch_size, vocab_size/max_position_embeddings, labels) are filled in
# from the data; --config key=value overrides win over everything.
# Longest tokenized text per built-in (spam e-mails are long; rotten_tomatoes sentences are ~25 tokens).
DEFAULT_MAX_LENGTH = {"spam": 256}
# Below this many examples an accuracy is too coarse to mean much (one example = 1 point at 100); say so.
SMALL_SPLIT = 100
# The CLI's sizes for transformers' own baselines (`registry.TRANSFORMERS_BASELINES`; they have no presets of
# ours). `vit` on images is parameter-matched to the CLI's Hyper-SET image model (`cli-image`: width 128, 4 heads,
# 69,890 parameters on digits): width 64, 4 heads, 2 layers, MLP 2d is 72,778 parameters on digits (16×16 inputs,
# 2×2 patches, 10 labels; tests/test_vit_baseline.py checks both counts). The ViT of Hyper-SET's width and
# effective depth (128, 4 heads, 4 layers, MLP 4d: 804,746 parameters) is `--config hidden_size=128
# num_hidden_layers=4 intermediate_size=512`. Dropouts stay at ViTConfig's 0, as Hyper-SET has none.
TRANSFORMERS_CLI_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "vit": {
        "image": dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128),
    },
}
# From-scratch learning rate per model where it differs from the CLI's 3e-3 (how each was chosen:
# docs/training.md, "Default learning rates").
NEW_MODEL_LEARNING_RATE: dict[str, float] = {"vit": 3e-3}


@dataclass
class Built:
    """Everything a training loop needs, built and checked before any file is written."""

    model: Any  # transformers.PreTrainedModel
    data: Any  # DatasetDict with the preprocessing transform attached
    processor: Any  # image processor or tokenizer (saved with the model)
    collator: Any
    task: str
    warnings: list[str] = field(default_factory=list)  # printed now and recorded in metrics.json
    # masked image modelling: (model, split) -> the reconstruction metrics of that split after MaskGIT decoding
    masked_images: Any = None
    # the dataset columns read, after detection (`data.normalize`); None for a built-in (fixed columns)
    source_columns: dict[str, str] | None = None


# --------------------------------------------------------------------------- registry


def model_registry() -> dict[str, energyformers.Family]:
    """Everything `--model` accepts: the families, our baselines (`energyformers.BASELINES`) and transformers' own
    baselines (`registry.TRANSFORMERS_BASELINES`, e.g. `vit`); trainable here alike, `export`/`push` take
    families only."""
    from energyformers import registry

    return {**registry.FAMILIES, **registry.BASELINES, **registry.TRANSFORMERS_BASELINES}


def family(model_type: str) -> energyformers.Family:
    """The registered family or baseline of `model_type`; else a `UsageError` naming the registered ones."""
    registry = model_registry()
    if model_type not in registry:
        raise UsageError(f"--model {model_type!r} is not available; registered models are {sorted(registry)}")
    return registry[model_type]


def auto_head(input_type: str, task: str) -> type:
    """The transformers Auto class of `task`'s head for `input_type` inputs (`energyformers.INPUT_TYPES`)."""
    import transformers

    return getattr(transformers, energyformers.INPUT_TYPES[input_type].tasks[task])


# The head module whose shape follows the label set: `train --from_pretrained` re-initialises it when the labels
# change (every family and the baseline name it so); the halting head is new or dropped by `--halting_head`
CLASSIFIER_MODULE = "classifier"
HALTING_MODULE = "halting_classifier"


def new_head_tensors(kind: str, name: str) -> bool:
    """The tensors `train --from_pretrained` may leave re-initialised (`load_fitting_weights`'s `allowed`): the
    classifier's, whose shape changes with the label set, and the halting head's, which `--halting_head` adds to
    or drops from a checkpoint (missing or unexpected, never another shape)."""
    module = name.split(".", 1)[0]
    return module == CLASSIFIER_MODULE or (module == HALTING_MODULE and kind != "mismatched")


def auto_processor(input_type: str) -> type:
    """The transformers Auto class that loads the saved processor of `input_type` inputs."""
    import transformers

    return getattr(transformers, energyformers.INPUT_TYPES[input_type].processor_class)


def processor_keyword(input_type: str) -> str:
    """`transformers.pipeline`'s keyword for that processor: AutoImageProcessor → image_processor, AutoTokenizer → tokenizer."""
    name = energyformers.INPUT_TYPES[input_type].processor_class.removeprefix("Auto")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def accepts(config_class: type, key: str) -> bool:
    """Whether `config_class.__init__` takes `key` (a config field of that family)."""
    return key in inspect.signature(config_class.__init__).parameters


def default_epochs(task: str) -> int:
    """Epochs of a run given neither --num_train_epochs nor --max_steps, by task."""
    return 12 if task == "image-classification" else 5


def default_learning_rate(args: Arguments) -> float:
    """--learning_rate, else the model's from-scratch rate (`NEW_MODEL_LEARNING_RATE`, 3e-3 when not listed) and
    5e-4 when fine-tuning (both loops)."""
    if args.run.learning_rate is not None:
        return args.run.learning_rate
    if args.model.from_pretrained:
        return 5e-4
    return NEW_MODEL_LEARNING_RATE.get(args.model.model or "hyperset", 3e-3)


def cli_preset(model_type: str, modality: str) -> dict[str, Any]:
    """The small config the CLI trains from scratch: the family's `cli-<input type>` preset (a baseline gets the
    Hyper-SET sizes it shares: same embeddings, head and iteration count, for side-by-side comparisons; a
    transformers baseline its `TRANSFORMERS_CLI_PRESETS` entry)."""
    if model_type in TRANSFORMERS_CLI_PRESETS:
        return dict(TRANSFORMERS_CLI_PRESETS[model_type].get(modality, {}))
    config_class = model_registry()[model_type].config_class
    try:
        fields = config_class.preset_fields(f"cli-{modality}")
    except ValueError:  # no such preset (e.g. Sudoku boards: the `sudoku` preset or --config sizes)
        return {}
    return {k: v for k, v in fields.items() if accepts(config_class, k)}


# --------------------------------------------------------------------------- config


# The label keywords a config takes: the CLI sets them from the dataset's labels (after `--config`), so one given in
# `--config` would be replaced without a word (or, `num_labels`, leave a head of the wrong width).
DATASET_LABEL_KEYWORDS = ("num_labels", "id2label", "label2id")


def check_override_names(config_class: type, overrides: dict[str, Any]) -> None:
    """`--config` names: the config class's own check of override names (`_check_override_names`, which
    `from_preset` runs: its fields, its attribute aliases and transformers' config keywords; the closest names of a
    misspelt one), so the CLI and the Python API accept the same names and word a refusal alike. A config class
    without that check (transformers' own, e.g. ViT, or remote code) gets the families' rule read off its own
    signature. The CLI-only rule on top: the label keywords (`DATASET_LABEL_KEYWORDS`) are the dataset's."""
    # PreTrainedConfig keeps an unknown keyword as an attribute that nothing reads: a typo must not pass silently
    from energyformers import HyperSetConfig

    where = "__init__"
    check = getattr(config_class, "_check_override_names", None)
    if check is None:
        check = partial(HyperSetConfig._check_override_names.__func__, config_class)
    try:
        check(overrides, where)
    except ValueError as err:
        # the config names itself and its method ("HyperSetConfig.__init__: "); the CLI names the flag instead
        message = str(err).removeprefix(f"{config_class.__name__}.{where}: ")
        raise UsageError(f"--config: {message}") from None
    for name in DATASET_LABEL_KEYWORDS:
        if name in overrides:
            raise UsageError(
                f"--config {name}={json.dumps(overrides[name])}: the labels come from the dataset (its label "
                f"column or ClassLabel names); drop {name}"
            )


def config_flag_overrides(args: Arguments, config_class: type, model_type: str) -> dict[str, Any]:
    """The config-field flags that were given (recurrent depth, drop path), as config fields; a `UsageError`
    naming the flag for a model without that field, or when `--config` sets the same field to something else.
    A recipe's default for a field the model lacks is dropped (the recipe is not for that model's structure)."""
    given = config_flags(args.model)
    for name in list(given):
        if not accepts(config_class, name):
            if name not in args.explicit:
                del given[name]
                continue
            having = sorted(m for m, f in model_registry().items() if accepts(f.config_class, name))
            raise UsageError(
                f"--{name} {given[name]}: {model_type} has no such setting ({config_class.__name__} has no "
                f"{name} field); it applies to {having}. Drop the flag."
            )
    overrides = parse_overrides(args.model.config)
    for name, value in given.items():
        if name in overrides and overrides[name] != value:
            raise UsageError(
                f"--{name} {value} and --config {name}={overrides[name]} disagree; pass one of them"
            )
    return given


def _config_error(err: Exception, flags: dict[str, Any], what: str) -> UsageError:
    """A config validation error as a usage error naming the flags behind the fields it involves: the `fields` of
    the configuration files' `ConfigValueError` (the refused field, then those its rule reads), each of them a flag
    gave. A refusal that declares no fields (an unknown preset name, transformers' own configs, which no config
    flag sets) is named by `what`."""
    # each configuration file defines its own ConfigValueError class (Hub remote code), so read it by its field
    declared = dict.fromkeys(getattr(err, "fields", None) or ())
    named = [f"--{name} {flags[name]}" for name in declared if name in flags]
    return UsageError(f"invalid {' and '.join(named) if named else what}: {err}")


def _check_preset_name(config_class: type, preset: str, flags: dict[str, Any], what: str) -> None:
    """An unknown `--preset` name of `config_class`, refused before any data loads, as `_config_error` words it."""
    try:
        config_class.preset_fields(preset)
    except ValueError as err:  # the message names the presets there are
        raise _config_error(err, flags, what) from err


def _image_geometry(data: Any) -> dict[str, Any]:
    """Native image size of the dataset → image_size/patch_size giving ≤ 64 patch tokens."""
    width, height = data["train"][0]["image"].size
    side = max(height, width)
    if side <= 16:
        # digits: 8×8 upsampled → 64 tokens; more tokens than the native 8×8 grid gives, which trains less well
        return {"image_size": 16, "patch_size": 2}
    if side <= 32:
        return {"image_size": 4 * math.ceil(side / 4), "patch_size": 4}  # 28×28 → 49 tokens of 4×4
    return {"image_size": 32, "patch_size": 4}


def check_pretrained_source(source: str) -> None:
    """`--from_pretrained` must be an existing model folder or, with the Hub reachable, a repo id."""
    path = check_model_source(source, "--from_pretrained")
    if path is None:  # a Hub repo id: asked when the model loads
        return
    check_model_folder(source, label="--from_pretrained")


def build_config_and_processor(
    args: Arguments, data: Any, state: Any, processor: Any = None
) -> tuple[Any, Any]:
    """The model config and the processor saved with it, from the model flags and the data. `processor`: the
    `--from_pretrained` checkpoint's (`pretrained_processor`) where `build` loaded it before the data; else it is
    loaded here."""
    m, d = args.model, args.data
    task = task_of(data)
    modality = input_type_of(data)
    names = label_names(data)
    labels = {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}
    overrides = parse_overrides(m.config)
    if overrides.get("input_type", modality) != modality:
        raise UsageError(
            f"--config input_type={overrides['input_type']!r} but {d.dataset!r} is a dataset for {task}"
        )
    try:
        if m.from_pretrained:
            return _pretrained_config_and_processor(args, overrides, labels, modality, task, processor)
        return _new_config_and_processor(args, data, state, overrides, labels, modality, task)
    except (TypeError, ValueError) as err:  # e.g. the image processor refusing num_channels=1
        if isinstance(err, (UsageError, DataError)):
            raise
        raise UsageError(f"invalid --config for {m.model or 'the model'}: {err}") from err


def _pretrained_config(args: Arguments) -> Any:
    """The config of the `--from_pretrained` checkpoint as saved, after the checks that need only the flags and the
    checkpoint: no `--preset` beside it, an existing source, a readable config, `--model` (if given) its family.
    Checked and loaded once per run (`Arguments.pretrained_config`); callers must not change it."""
    from transformers import AutoConfig

    if args.pretrained_config is not None:  # checked and read once per run: each setup step asks for it
        return args.pretrained_config
    m, source = args.model, args.model.from_pretrained
    if m.preset:
        raise UsageError("--preset and --from_pretrained exclude each other (the checkpoint has its config)")
    check_pretrained_source(source)
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise UsageError(cannot_load(source, err, label="--from_pretrained")) from err
    if m.model and m.model != config.model_type:
        raise UsageError(f"--model {m.model} but {source!r} is a {config.model_type!r} checkpoint")
    check_pretrained_text_flags(args, config)
    args.pretrained_config = config  # the callers read it or rebuild from its to_dict(), never change it
    return config


def check_pretrained_text_flags(args: Arguments, config: Any) -> None:
    """The text flags beside `--from_pretrained`, whose checkpoint brings its tokenizer and position embeddings:
    `--vocab_size` (the size of a tokenizer to train) has no effect and is refused; `--max_length` is honoured when
    it is at most the checkpoint's `max_position_embeddings` (texts are truncated there; the saved tokenizer's
    `model_max_length` records it) and refused above it, where the model has no positions, or for a checkpoint
    that does not read texts. A `UsageError` in the words of the CLI's other flags without effect."""
    d, source = args.data, args.model.from_pretrained
    if "vocab_size" in args.explicit:
        raise UsageError(
            f"--vocab_size {d.vocab_size}: applies only when a tokenizer is trained, and --from_pretrained "
            f"{source} gives one (its vocab_size is {getattr(config, 'vocab_size', None)}); drop --vocab_size"
        )
    if d.max_length is None:
        return
    if getattr(config, "input_type", None) != "sequence":
        raise UsageError(
            f"--max_length {d.max_length}: applies to texts, and --from_pretrained {source} takes "
            f"input_type={getattr(config, 'input_type', None)!r}; drop --max_length"
        )
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and d.max_length > positions:
        raise UsageError(
            f"--max_length {d.max_length}: larger than the max_position_embeddings {positions} of "
            f"--from_pretrained {source} (it has no positions beyond); pass at most {positions}, or leave it unset"
        )


def pretrained_processor(args: Arguments) -> Any:
    """The `--from_pretrained` checkpoint's processor, loaded and tried as every command loads a model folder's
    (`processing.load_processor`): its image processor, or one built from its config as training builds it when it
    has none; its tokenizer, which a text or Sudoku checkpoint must ship (its embeddings were trained with it). A
    missing tokenizer or a broken file is a one-line `UsageError` naming it."""
    from .predict import load_processor_or_refuse

    source, config = args.model.from_pretrained, _pretrained_config(args).to_dict()
    return load_processor_or_refuse(source, config, build_missing=True, flag="--from_pretrained")


def _pretrained_config_and_processor(
    args: Arguments,
    overrides: dict[str, Any],
    labels: dict[str, Any],
    modality: str,
    task: str,
    processor: Any = None,
) -> tuple[Any, Any]:
    source = args.model.from_pretrained
    config = _pretrained_config(args)
    if getattr(config, "input_type", None) != modality:
        raise UsageError(
            f"{source!r} takes input_type={getattr(config, 'input_type', None)!r}, "
            f"but {args.data.dataset!r} is a dataset for {task}"
        )
    if processor is None:
        processor = pretrained_processor(args)
    if args.data.max_length is not None:
        if task != "text-classification":  # Sudoku cells: every board has its 81 positions
            raise UsageError(
                f"--max_length {args.data.max_length}: applies to text classification, and "
                f"{args.data.dataset!r} is a dataset for {task}; drop --max_length"
            )
        # truncation follows the saved tokenizer (`preprocessing`, `pipeline(..., truncation=True)`)
        processor.model_max_length = args.data.max_length
    check_override_names(type(config), overrides)
    flags = config_flag_overrides(args, type(config), config.model_type)
    try:  # re-validate the merged config
        config = type(config)(**{**config.to_dict(), **overrides, **flags, **labels})
    except (TypeError, ValueError) as err:
        raise _config_error(err, flags, f"--config for {config.model_type}") from err
    return config, processor


def check_preset_input_type(config_class: type, preset: str, modality: str, data: str) -> None:
    """A `UsageError` when `preset` is made for other inputs than `modality` (the data's); a preset that sets no
    input type sizes a model for any. An unknown preset name is left to the config build, which words it."""
    try:
        made_for = config_class.preset_fields(preset).get("input_type")
    except ValueError:
        return
    if made_for in (None, modality):
        return
    from energyformers.presets import PRESETS

    table = PRESETS.get(config_class.model_type, {})
    fitting = sorted(name for name, fields in table.items() if fields.get("input_type") in (None, modality))
    raise UsageError(
        f"--preset {preset}: a preset for {made_for} inputs, and {data} has {modality} inputs; use one of "
        f"{fitting} or no --preset"
    )


def _new_config_and_processor(
    args: Arguments,
    data: Any,
    state: Any,
    overrides: dict[str, Any],
    labels: dict[str, Any],
    modality: str,
    task: str,
) -> tuple[Any, Any]:
    from .processing import build_image_processor, cell_tokenizer, train_tokenizer

    m, d = args.model, args.data
    model_type = m.model or "hyperset"
    config_class = family(model_type).config_class
    head = energyformers.INPUT_TYPES[modality].tasks[task]
    if head not in family(model_type).heads:
        having = sorted(k for k, f in model_registry().items() if head in f.heads)
        text_heads = set(energyformers.INPUT_TYPES[modality].tasks.values()) - {"AutoModel"}
        if modality != "image" and not text_heads & set(family(model_type).heads):  # an image-only model
            raise UsageError(
                f"--model {model_type} is an image model and --dataset {d.dataset} is a dataset for {task} "
                f"({modality} inputs); train {model_type} on an image dataset, or use one of {having} for "
                f"{modality} data"
            )
        raise UsageError(
            f"--dataset {d.dataset} is a dataset for {task} and {model_type} has no {task} head; use one of {having}"
        )
    if m.preset:  # a preset made for other inputs (Sudoku's on images) would be silently re-purposed
        check_preset_input_type(config_class, m.preset, modality, f"--dataset {d.dataset} ({task})")
    check_override_names(config_class, overrides)  # before a text tokenizer is trained
    flags = config_flag_overrides(args, config_class, model_type)
    fields: dict[str, Any] = {"input_type": modality}
    if not m.preset:
        fields.update(cli_preset(model_type, modality))
    processor = None
    if task == "token-classification":  # the cells are the ids: a fixed tokenizer, nothing to train
        processor = cell_tokenizer(len(data["train"][0]["input_ids"]))
        fields.update(vocab_size=len(processor), max_position_embeddings=processor.model_max_length)
        if not m.preset and accepts(config_class, "position_embedding_type"):
            fields["position_embedding_type"] = "learned"  # a fixed 81-cell layout, as the sudoku preset
    elif modality == "image":
        if not m.preset:
            fields.update({k: v for k, v in _image_geometry(data).items() if accepts(config_class, k)})
        fields["num_channels"] = 3
    else:
        max_length = (
            overrides.get("max_position_embeddings") or d.max_length or DEFAULT_MAX_LENGTH.get(d.dataset, 128)
        )
        saved = run_tokenizer_file(args) if args.run.resume else None
        # the tokenizer the checkpoints were trained with, even if the data or `tokenizers` changed since
        if saved is not None:
            from .processing import wrap_tokenizer

            processor = wrap_tokenizer(_read_tokenizer(saved), max_length)
            if state.is_main_process:
                print(f"using the tokenizer of the interrupted run ({saved})", flush=True)
        else:
            if state.is_main_process:
                print(
                    f"training a WordPiece tokenizer (vocab {d.vocab_size}) on {len(data['train'])} texts",
                    flush=True,
                )
            texts = data["train"]["text"]
            if "text_pair" in data["train"].column_names:  # both texts of a pair share the vocabulary
                texts = list(texts) + list(data["train"]["text_pair"])
            processor = _share_tokenizer(
                train_tokenizer(texts, vocab_size=d.vocab_size, max_length=max_length), state
            )
        fields.update(
            vocab_size=len(processor), max_position_embeddings=max_length, pad_token_id=processor.pad_token_id
        )
    fields.update(overrides)
    fields.update(flags)
    fields.update(labels)
    try:
        config = config_class.from_preset(m.preset, **fields) if m.preset else config_class(**fields)
    except (TypeError, ValueError) as err:  # the config's own validation names the field and what is allowed
        raise _config_error(err, flags, f"--preset/--config for {model_type}") from err
    if processor is None:
        try:
            processor = build_image_processor(config)
        except ValueError as err:  # e.g. num_channels=1: the processor names the field and the fix
            raise UsageError(f"invalid --config for {model_type}: {err}") from err
    return config, processor


# The trained text tokenizer of a run, beside `RUN_ARGUMENTS_FILE` in its work folder (an Accelerate `step_N/`
# holds none; a Trainer `checkpoint-N/` has its own copy): what a --resume encodes its texts with.
RUN_TOKENIZER_FILE = "tokenizer.json"


def run_tokenizer_file(args: Arguments) -> Path | None:
    """The tokenizer.json an interrupted from-scratch text run in `--output_dir`'s work folder was trained with:
    the work folder's, else the newest Trainer checkpoint's (a run recorded before the work folder held one);
    None when there is neither (an Accelerate run of that age: its tokenizer is trained again)."""
    output_dir = Path(args.run.output_dir).expanduser().resolve()
    work_dir = work_folder(output_dir)
    if (work_dir / RUN_TOKENIZER_FILE).is_file():
        return work_dir / RUN_TOKENIZER_FILE
    steps = {}
    for folder in work_dir.glob("checkpoint-*"):
        number = folder.name.removeprefix("checkpoint-")
        if number.isdigit() and (folder / RUN_TOKENIZER_FILE).is_file():
            steps[int(number)] = folder / RUN_TOKENIZER_FILE
    return steps[max(steps)] if steps else None


def _read_tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the tokenizers error types are not public
        raise UsageError(
            f"--resume: cannot read the tokenizer of the interrupted run, {path} ({err}); train in another "
            "--output_dir"
        ) from None


def _share_tokenizer(tokenizer: Any, state: Any) -> Any:
    """With several processes, rank 0's tokenizer is the one every rank uses (one tokenizer per run, trained once)."""
    import torch

    if state.num_processes == 1 or not torch.distributed.is_initialized():
        return tokenizer
    payload = [tokenizer.backend_tokenizer.to_str() if state.is_main_process else None]
    torch.distributed.broadcast_object_list(payload, src=0)
    from tokenizers import Tokenizer

    from .processing import wrap_tokenizer

    return wrap_tokenizer(Tokenizer.from_str(payload[0]), tokenizer.model_max_length)


# --------------------------------------------------------------------------- data and model


def load_and_check_data(args: Arguments, state: Any) -> tuple[Any, list[str]]:
    """The normalised dataset with the --max_*_samples limits applied, and warnings about it."""
    d = args.data
    with state.local_main_process_first():  # one rank per machine builds the Arrow cache
        data = load_data(
            d.dataset,
            image_column=d.image_column,
            text_column=d.text_column,
            label_column=d.label_column,
            text_pair_column=d.text_pair_column,
            seed=0,
        )
    for split, limit in (
        ("train", d.max_train_samples),
        ("validation", d.max_eval_samples),
        ("test", d.max_test_samples),
    ):
        if limit is not None:
            data[split] = data[split].select(range(min(limit, len(data[split]))))
    if input_type_of(data) == "image":  # decode a few now: broken files there fail before anything is written
        from datasets import Image

        first = data["train"].select(range(min(8, len(data["train"]))))
        feature = first.features["image"]
        stored = first.with_format(None).cast_column("image", Image(mode=feature.mode, decode=False))
        for i, value in enumerate(stored["image"]):
            decode_image(feature, value, f"training image {i} of {d.dataset!r}")
    # e.g. an unlabelled split left out, string columns left unused (`data.normalize`)
    warnings = list(getattr(data, "notices", []))
    warnings += small_split_warnings(data, masked_image_modeling=d.task == MIM_TASK)
    if input_type_of(data) == "image" and d.dataset not in BUILTIN_DATASETS:  # the built-ins are 8-bit
        from .processing import clipped_image_modes, clipped_modes_warning

        clipped = clipped_modes_warning(clipped_image_modes(data))
        warnings += [clipped] if clipped else []
    return data, warnings


def small_split_warnings(data: Any, masked_image_modeling: bool = False) -> list[str]:
    """A warning for each evaluated split too small for its metric to mean much, counted in what that metric
    counts: examples for classification accuracy, boards for `board_accuracy` and blank cells for
    `blank_cell_accuracy` (token classification, `evaluation.task_metrics`), images for masked image modelling
    (its reconstruction metrics average over images)."""
    import numpy as np

    warnings = []
    token_classification = not masked_image_modeling and task_of(data) == "token-classification"
    for split in ("validation", "test"):
        n = len(data[split])
        if masked_image_modeling:
            if n < SMALL_SPLIT:
                warnings.append(
                    f"the {split} split has only {n} images: its reconstruction metrics average over too few "
                    "images to be a reliable estimate (use more data)"
                )
            continue
        if not token_classification:
            if n < SMALL_SPLIT:
                warnings.append(
                    f"the {split} split has only {n} examples: its accuracy moves in steps of {100 / n:.0f} "
                    "points and is not a reliable estimate (use more data)"
                )
            continue
        cells = int((np.asarray(data[split].with_format("numpy")["labels"]) != -100).sum())
        if n < SMALL_SPLIT:
            warnings.append(
                f"the {split} split has only {n} boards: its board_accuracy moves in steps of {100 / n:.0f} "
                f"points and is not a reliable estimate (use more data); its blank_cell_accuracy counts "
                f"{cells:,} blank cells"
            )
        if cells < SMALL_SPLIT:
            warnings.append(
                f"the {split} split has only {cells} blank cells: its blank_cell_accuracy moves in steps of "
                f"{100 / max(cells, 1):.0f} points and is not a reliable estimate (use more data)"
            )
    return warnings


def _recipe_task(recipe: str | None, task: str | None) -> None:
    from .recipes import check_recipe_task

    try:
        check_recipe_task(recipe, task)
    except ValueError as err:
        raise UsageError(str(err)) from None


# --------------------------------------------------------------------------- flags checked before the data loads

# The config fields a classification run sets from its data (`_new_config_and_processor`): its input type, the
# image geometry, the vocabulary and positions of its tokenizer, and its labels. Before the data loads, a config
# refusal that involves one of them (its `fields`; and no flag sets it) waits for the data's value.
DATA_FIELDS = (
    "input_type",
    "image_size",
    "patch_size",
    "num_channels",
    "vocab_size",
    "max_position_embeddings",
    "pad_token_id",
    "position_embedding_type",
    *DATASET_LABEL_KEYWORDS,
)
# The config fields a masked-image-modelling run takes from its image tokenizer's grid (`--config` may only repeat
# them): unknown before the data loads when the tokenizer is fitted on it.
MIM_GRID_FIELDS = ("vocab_size", "max_position_embeddings")


def _trial_configs(makers: list[Any], unknown: set[str], flags: dict[str, Any], what: str) -> list[Any]:
    """The configs `makers` build before the data loads (one per input type the data may turn out to have), each
    with stand-ins for the fields the data will set (`unknown`); the refusals are left out.

    A refusal is raised, as `build` words it (`_config_error`), only when it is certain to recur with the data's
    values: every maker refuses with the same message, and every refusal declares the config fields it involves
    (the `fields` of the configuration files' `ConfigValueError`: the refused field and those its rule reads), none
    of them `unknown`. A refusal involving a field the data sets is left to the build after loading, which words it
    with the data's value; so is one that declares no fields (transformers' own configs, remote code whose configs
    declare none), since nothing says which values it depends on.
    """
    built, refusals = [], []
    for make in makers:
        try:
            built.append(make())
        except Exception as err:  # judged below; the build after loading words every other refusal
            refusals.append(err)
    if (
        refusals
        and len(refusals) == len(makers)
        and len({str(err) for err in refusals}) == 1
        and isinstance(refusals[0], ValueError)
    ):
        # each configuration file defines its own ConfigValueError class (Hub remote code), so read it by its field
        declared = [getattr(err, "fields", None) for err in refusals]
        involved = {name for fields in declared for name in fields or ()}
        if all(declared) and not involved & unknown:
            raise _config_error(refusals[0], flags, what) from refusals[0]
    return built


def _refuse_eval_iterations(args: Arguments, model_type: str) -> None:
    raise UsageError(
        f"--eval_iterations {' '.join(map(str, args.run.eval_iterations))}: {model_type} has no "
        "recurrent depth (no per-call num_iterations); drop the flag"
    )


def check_supervision_flags(args: Arguments, config: Any) -> None:
    """A `UsageError` for deep supervision, supervision steps or a halting head beside this run's batch
    augmentation or label smoothing (which compute the loss from the last logits outside the model)."""
    augmented = args.augmentation.enabled or args.augmentation.label_smoothing > 0
    supervised = getattr(config, "deep_supervision", "last")
    if supervised != "last" and augmented:
        raise UsageError(
            f"--deep_supervision {supervised}: the batch augmentation / label smoothing of this run computes the "
            "training loss from the last logits outside the model, which would ignore the other iterations; "
            "train without them or with --deep_supervision last"
        )
    stepped = []  # only the settings that are on, whether a flag or --config set them
    if getattr(config, "supervision_steps", 1) > 1:
        stepped.append(f"--supervision_steps {config.supervision_steps}")
    if getattr(config, "halting_head", False):
        stepped.append("--halting_head")
    if stepped and augmented:
        raise UsageError(
            f"{' / '.join(stepped)}: the batch augmentation / label smoothing of this run computes the training "
            "loss from the last logits outside the model, which would ignore the other steps and the halting loss; "
            "train without them, or with --supervision_steps 1 and no halting head"
        )


def _model_type_before_data(args: Arguments) -> str:
    """The model family of the run: `--model`, else the `--from_pretrained` checkpoint's, else Hyper-SET."""
    if args.model.model:
        return args.model.model
    if args.model.from_pretrained:
        return _pretrained_config(args).model_type
    return "hyperset"


def check_flags_before_data(args: Arguments) -> None:
    """The checks of a classification run's model flags that need no data, run by `build` before the dataset loads
    (a large dataset is not read for a usage error), worded as when they ran after it: `--from_pretrained` (source,
    config, family), `--preset`, the `--config` names and the config-field flags, `--attn_implementation`,
    `--eval_iterations` for a model without recurrent depth, a `--config` value the config refuses whatever the
    data sets (`_trial_configs`), and batch augmentation beside deep supervision or supervision steps. What
    depends on the data (its task and input type, image size, vocabulary, labels) is checked after it loads."""
    m = args.model
    overrides = parse_overrides(m.config)
    if m.from_pretrained:
        config = _pretrained_config(args)
        config_class, model_type = type(config), config.model_type
        check_override_names(config_class, overrides)
        flags = config_flag_overrides(args, config_class, model_type)
        saved = config.to_dict()
        makers = [partial(config_class, **{**saved, **overrides, **flags})]
        if overrides.get("input_type", saved.get("input_type")) != saved.get("input_type"):
            makers = []  # refused against the data's input type once it loads
        unknown = set(DATASET_LABEL_KEYWORDS)  # the checkpoint's labels stand in for the data's
        what = f"--config for {model_type}"
    else:
        model_type = m.model or "hyperset"
        config_class = family(model_type).config_class
        check_override_names(config_class, overrides)
        flags = config_flag_overrides(args, config_class, model_type)
        what = f"--preset/--config for {model_type}"
        if m.preset and not hasattr(config_class, "from_preset"):  # transformers' own config classes (ViT)
            raise UsageError(
                f"--preset {m.preset}: {model_type} has no presets ({config_class.__name__} is transformers' own "
                "config); size it with --config"
            )
        if m.preset:
            _check_preset_name(config_class, m.preset, flags, what)
        # one trial per input type the data may have (`_new_config_and_processor` sets the same fields from it)
        modalities = list(energyformers.INPUT_TYPES)
        if "input_type" in overrides:  # refused after loading unless it is the data's
            modalities = [overrides["input_type"]]
        makers = []
        for modality in modalities if set(modalities) <= set(energyformers.INPUT_TYPES) else ():
            fields = {"input_type": modality, **({} if m.preset else cli_preset(model_type, modality))}
            if modality == "image":
                fields["num_channels"] = 3
            else:  # a stand-in vocabulary: the trained tokenizer's size is known once the texts are read
                fields["vocab_size"] = args.data.vocab_size
            fields = {**fields, **overrides, **flags}
            if m.preset:
                makers.append(partial(config_class.from_preset, m.preset, **fields))
            else:
                makers.append(partial(config_class, **fields))
        unknown = set(DATA_FIELDS) - set(overrides) - set(flags)  # what is given wins over the data's value
    if m.attn_implementation is not None:
        check_attn_flag(m.attn_implementation, model_type)
    registered = model_registry().get(model_type)
    backbone = registered.heads.get("AutoModel") if registered is not None else None
    if args.run.eval_iterations and backbone is not None and not has_recurrent_depth(backbone):
        _refuse_eval_iterations(args, model_type)
    # the supervision fields are the flags', the preset's or the checkpoint's, never the data's
    configs = _trial_configs(makers, unknown, flags, what)
    refusals = []
    for config in configs:
        try:
            check_supervision_flags(args, config)
        except UsageError as err:
            refusals.append(err)
    if refusals and len(refusals) == len(configs) and len({str(err) for err in refusals}) == 1:
        raise refusals[0]  # whichever input type the data has


def check_numbered_batch_workers(args: Arguments) -> None:
    """A `UsageError` for DataLoader worker flags under which the training draws that follow from a batch's index
    (the masks of masked image modelling, the `--sudoku_augmentation` symmetries: `batches.NumberedBatches`) could not
    be numbered: persistent workers keep the copy of the stream they took at the first epoch. The loops check their
    built loader again (`check_loader`); this refuses the flags before any work."""
    from .data import MaskedCodesCollator
    from .sudoku import SudokuAugmentation

    if args.data.task == MIM_TASK:
        flag, numbered = f"--task {MIM_TASK}", MaskedCodesCollator
    elif args.data.sudoku_augmentation:
        flag, numbered = "--sudoku_augmentation", SudokuAugmentation
    else:
        return
    workers = args.run.dataloader_num_workers
    try:
        numbered.check_workers(workers, persistent_workers=args.run.dataloader_persistent_workers)
    except ValueError:
        raise UsageError(
            f"--dataloader_persistent_workers with {flag} and --dataloader_num_workers {workers}: {numbered.draws} "
            "of a batch follow from its index only when fresh DataLoader workers start every epoch; drop "
            "--dataloader_persistent_workers"
        ) from None


def seed_run(run: RunArguments) -> None:
    """Seed Python, NumPy and torch from `--seed`; with `--full_determinism`, through
    `transformers.enable_full_determinism` as Trainer does for `TrainingArguments.full_determinism`: it also turns
    on torch's deterministic algorithms (an op with none raises), cuDNN's deterministic mode without benchmarking,
    and sets the CUDA environment they need (`CUBLAS_WORKSPACE_CONFIG`). Called before the model is built: the
    same initial weights either way."""
    import transformers

    if run.full_determinism:
        transformers.enable_full_determinism(run.seed)
    else:
        transformers.set_seed(run.seed)


def build(args: Arguments, state: Any) -> Built:
    """Dataset (with preprocessing attached), processor, collator and model from the parsed arguments.

    Shared by both training loops; `state` is the (already initialised) `accelerate.PartialState`. Runs one real
    batch through the model so mismatches surface here, before any training or writing.
    """

    from .recipes import RECIPE_TASKS, drop_unapplied_recipe_values

    recipe = args.run.recipe
    check_numbered_batch_workers(args)
    if args.data.task == MIM_TASK:
        _recipe_task(recipe, MIM_TASK)
        return build_masked_image_modeling(args, state)
    served = {t for kind in energyformers.INPUT_TYPES.values() for t in kind.tasks} | {MIM_TASK}
    # a recipe for a task no dataset here can be: refused before the data loads
    if recipe in RECIPE_TASKS and RECIPE_TASKS[recipe][0] not in served:
        _recipe_task(recipe, None)
    check_flags_before_data(args)
    # a broken processor file of the checkpoint is refused before the dataset loads
    processor = pretrained_processor(args) if args.model.from_pretrained else None
    data, warnings = load_and_check_data(args, state)
    if processor is not None:
        from .processing import pair_separator_refusal

        refusal = pair_separator_refusal(data, processor, f"--from_pretrained {args.model.from_pretrained}")
        if refusal:
            raise UsageError(refusal)
    task = task_of(data)
    _recipe_task(recipe, task)
    config, processor = build_config_and_processor(args, data, state, processor)
    warnings += drop_unapplied_recipe_values(args, config)  # a recipe value this model has no field for
    seed_run(args.run)  # same initial weights on every rank and every rerun
    head = auto_head(config.input_type, task)
    attention = args.model.attn_implementation
    # transformers' own selection: the model checks the name and sets `config._attn_implementation`
    chosen = {} if attention is None else {"attn_implementation": attention}
    if attention is not None:
        check_attn_flag(attention, config.model_type)  # the family of a Hub checkpoint
    if args.model.from_pretrained:
        source = args.model.from_pretrained

        def refused(err: Exception) -> str:
            if attention is not None and "attn_implementation" in str(err):
                return f"--attn_implementation {attention}: {err}"
            return cannot_load(source, err, label="--from_pretrained")

        # a changed label set re-initialises the classifier; every other tensor must load as saved
        model = load_or_refuse(
            head,
            source,
            error=UsageError,
            message=refused,
            label="--from_pretrained",
            allowed=new_head_tensors,
            config=config,
            ignore_mismatched_sizes=True,
            **chosen,
        )
    else:
        try:
            model = head.from_config(config, **chosen)
        except ValueError as err:  # e.g. a listed implementation that cannot run on this machine
            if attention is None:
                raise
            raise UsageError(f"--attn_implementation {attention}: {err}") from err
    if args.run.eval_iterations and not has_recurrent_depth(model):
        _refuse_eval_iterations(args, config.model_type)
    check_supervision_flags(args, config)
    check_checkpointing_support(args, model)
    transform, collator = preprocessing(task, config, processor)
    transforms = {split: transform for split in data}
    if args.data.sudoku_augmentation:  # training split only: evaluation reads the puzzles as they are
        from .sudoku import AugmentationCollator, SudokuAugmentation

        augmentation = SudokuAugmentation(seed=args.run.seed + state.process_index)  # a stream per process
        transforms["train"] = AugmentedTransform(augmentation, transform)
        # the loops continue their collator's stream at each epoch: this one continues the symmetries'
        collator = AugmentationCollator(collator, augmentation)
    # images decoded as each batch reads them, a file that cannot be decoded named then (`decode_lazily`)
    for split in data:
        data[split] = decode_lazily(data[split], transforms[split], split)
    # the real preprocessing + forward on two examples: wrong sizes/ids fail now, not after an epoch
    check_one_batch(model, collator, data["train"], "a training batch")
    model.train()
    return Built(
        model, data, processor, collator, task, warnings, source_columns=getattr(data, "source_columns", None)
    )


def check_one_batch(model: Any, collator: Any, rows: Any, what: str, *, labels: bool = False) -> None:
    """Run the first two of `rows` (a split, with its transform set) through `collator` and `model` in eval mode,
    without gradients, so data the model cannot read fails before any training or scoring: a `DataError` worded
    `<what> does not fit the model: <why>`. The labels are left out of the forward unless `labels`. The model is
    left in eval mode."""
    import torch

    try:
        batch = collator([rows[i] for i in range(min(2, len(rows)))])
        with torch.no_grad():
            model.eval()(**{k: v for k, v in batch.items() if labels or k != "labels"})
    except Exception as err:
        raise DataError(f"{what} does not fit the model: {err}") from err


def preprocessing(task: str, config: Any, processor: Any) -> tuple[Any, Any]:
    """(`Dataset.set_transform` function, collator) of a classification split: the preprocessing of both training
    loops, and of `energyformers evaluate` with the processor saved in the model folder, so a split is scored on
    exactly the inputs training evaluated it on. Sudoku cells are already the ids; images go through the image
    processor; texts are tokenized to the model's positions and padded per batch."""
    from transformers import DataCollatorWithPadding, default_data_collator

    from .processing import cells_transform, image_transform, text_transform

    if task == "token-classification":
        return cells_transform(), default_data_collator
    if getattr(config, "input_type", "image") == "image":
        return image_transform(processor), default_data_collator
    # the tokenizer's length where it is shorter (`--max_length` on a `--from_pretrained` run)
    length = min(config.max_position_embeddings, processor.model_max_length)
    return text_transform(processor, length), DataCollatorWithPadding(processor)


# --------------------------------------------------------------------------- masked image modelling


def _mim_tokenizer(args: Arguments) -> Any:
    """The VQ tokenizer to use: `--tokenizer`, else the `--from_pretrained` folder's when it has one, else None
    (one is fitted on the training images)."""
    from energyformers.mim import PatchKMeansTokenizer

    given = mim_tokenizer_source(args.data.tokenizer, args.model.from_pretrained)
    if given is None:
        return None
    flag, source = given
    try:
        return PatchKMeansTokenizer.from_pretrained(Path(source).expanduser())
    except (OSError, ValueError, KeyError) as err:
        raise UsageError(f"{flag} {source}: not a saved PatchKMeansTokenizer folder ({err})") from err


def masked_image_modeling_config(args: Arguments, tokenizer: Any) -> Any:
    """The config of a masked-image-modelling run: the `cli-mim` preset of the family (or `--preset`, or the
    `--from_pretrained` checkpoint's), with the vocabulary (codebook + [MASK]) and positions of `tokenizer`'s
    grid, `--config` overrides and the config-field flags on top."""
    return _masked_image_modeling_config(args, tokenizer.codebook_size, tokenizer.grid)


def _masked_image_modeling_config(
    args: Arguments, codebook_size: int, grid_shape: tuple[int, int] | None
) -> Any:
    """`masked_image_modeling_config` from the tokenizer's numbers: also called with the numbers a tokenizer about
    to be fitted will have, so a bad `--config` is refused before the fit; and with `grid_shape=None` before the
    data loads (the grid of a tokenizer yet to be fitted follows the images): then only what the grid does not
    decide is checked (`check_flags_before_data`), with the messages of the full check, and None is returned."""
    from energyformers.mim import TokenizerMismatchError, check_tokenizer_fits

    m = args.model
    grid = {"vocab_size": codebook_size + 1}
    if grid_shape is not None:
        rows, columns = grid_shape
        grid["max_position_embeddings"] = rows * columns
    overrides = parse_overrides(m.config)
    if m.from_pretrained:
        config = _pretrained_config(args)
        if getattr(config, "vocab_size", None) != grid["vocab_size"]:
            raise UsageError(
                f"--from_pretrained {m.from_pretrained!r} predicts {getattr(config, 'vocab_size', 1) - 1} codes, "
                f"the tokenizer has {codebook_size}; pass --tokenizer with the checkpoint's tokenizer"
            )
        try:  # its positions too: the tokenizer's grid replaces them, which no checkpoint was trained on
            if grid_shape is not None:
                check_tokenizer_fits(None, grid_shape, config)
        except TokenizerMismatchError as err:
            raise UsageError(
                f"--from_pretrained {m.from_pretrained!r}: {err}; pass --tokenizer with the checkpoint's tokenizer"
            ) from None
        config_class, model_type, fields = type(config), config.model_type, config.to_dict()
    else:
        model_type = m.model or "hyperset"
        if MIM_AUTO_CLASS not in family(model_type).heads:
            having = sorted(k for k, f in model_registry().items() if MIM_AUTO_CLASS in f.heads)
            raise UsageError(
                f"--task {MIM_TASK}: --model {model_type} has no masked-image-modelling head; use one of {having}"
            )
        config_class, fields = family(model_type).config_class, {}
    check_override_names(config_class, overrides)
    for key in ("vocab_size", "max_position_embeddings") if grid_shape is not None else ():
        if key in overrides and overrides[key] != grid[key]:
            # the tokenizer sets both; another value leaves codes the model cannot read or misplaced
            raise UsageError(
                f"--config {key}={overrides[key]}: the image tokenizer sets {key}={grid[key]} ({codebook_size} "
                f"codes + [MASK] on a {rows} × {columns} grid); drop it"
            )
    flags = config_flag_overrides(args, config_class, model_type)
    fields = {**fields, "input_type": "sequence", **grid, **overrides, **flags}
    if not m.from_pretrained:
        fields.update(_derived_widths(config_class, m.preset or "cli-mim", fields, overrides))
    what = f"--preset/--config for {model_type} masked image modelling"

    def make() -> Any:
        if m.from_pretrained:
            return config_class(**fields)
        return config_class.from_preset(m.preset or "cli-mim", **fields)

    if grid_shape is None:
        if m.preset and not m.from_pretrained:
            _check_preset_name(config_class, m.preset, flags, what)
        # the tokenizer sets both MIM_GRID_FIELDS (a --config value of them must be its, checked after the fit)
        # the supervision fields are the flags', the preset's or the checkpoint's, never the grid's
        for config in _trial_configs([make], set(MIM_GRID_FIELDS), flags, what):
            check_mim_supervision(config)
        return None
    try:
        return make()
    except (TypeError, ValueError) as err:
        raise _config_error(err, flags, what) from err


def check_mim_supervision(config: Any) -> None:
    """A `UsageError` for a masked-image-modelling config with deep supervision, supervision steps or a halting
    head: its heads take the loss at the last iteration only."""
    for flag, default in (("deep_supervision", "last"), ("supervision_steps", 1), ("halting_head", False)):
        if getattr(config, flag, default) != default:
            raise UsageError(
                f"--{flag} {getattr(config, flag)}: the masked-image-modelling heads take the loss at the last "
                f"iteration only; use --{flag} {default}"
            )


def _derived_widths(
    config_class: type, preset: str, fields: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    """The widths that follow `hidden_size` when `--config` changes it and leaves them alone: `intermediate_size`
    keeps the preset's ratio to the width (its M = d or 8d dictionary, the baseline's 4d MLP: the paper's
    structure, HS Table 9 and Table 2), and `time_embedding_dim = hidden_size` where the iteration conditioning is
    `sinusoidal-no-mlp`, which adds the sinusoid to the state (its width is the model's, not a separate choice)."""
    if "hidden_size" not in overrides:
        return {}
    try:
        preset_fields = config_class.preset_fields(preset)
    except (AttributeError, ImportError, ValueError):  # no such preset: from_preset names the choices
        return {}
    derived = {}
    width, preset_width = overrides["hidden_size"], preset_fields.get("hidden_size")
    if "intermediate_size" not in overrides and preset_width and preset_fields.get("intermediate_size"):
        derived["intermediate_size"] = width * preset_fields["intermediate_size"] // preset_width
    conditioning = fields.get("iteration_conditioning", preset_fields.get("iteration_conditioning"))
    if (
        "time_embedding_dim" not in overrides
        and accepts(config_class, "time_embedding_dim")
        and conditioning == "sinusoidal-no-mlp"
    ):
        derived["time_embedding_dim"] = width
    return derived


def _planned_tokenizer_grid(args: Arguments, data: Any) -> tuple[int, int] | None:
    """The code grid of the tokenizer `data.masked_image_data` will fit (None when the patch does not divide the
    image: that function says so)."""
    from .data import mim_image_geometry

    size, default_patch = mim_image_geometry(max(data["train"][0]["image"].size))
    patch = args.data.tokenizer_patch_size or default_patch
    return None if size % patch else (size // patch, size // patch)


def build_masked_image_modeling(args: Arguments, state: Any) -> Built:
    """`build` for `--task masked-image-modeling`: the image dataset tokenized into code grids (the VQ tokenizer
    loaded or fitted on the training images), a masked-image-modelling head over them, the collator that masks
    every training batch afresh (`data.MaskedCodesCollator`) and the reconstruction metrics after decoding."""
    import transformers

    from .data import MaskedCodesCollator, masked_image_data
    from .evaluation import MaskedImageEvaluation

    d, m = args.data, args.model
    if args.augmentation.enabled or args.augmentation.label_smoothing > 0:
        raise UsageError(
            f"--task {MIM_TASK}: image augmentation and label smoothing are for image classification; the "
            "masking is this task's augmentation. Drop those flags"
        )
    # before the data loads: a given tokenizer (its grid known) and the flags checked as far as they can be
    tokenizer = _mim_tokenizer(args)
    if tokenizer is not None:
        check_mim_supervision(masked_image_modeling_config(args, tokenizer))
    else:
        _masked_image_modeling_config(args, d.codebook_size, None)
    if m.attn_implementation is not None:
        check_attn_flag(m.attn_implementation, _model_type_before_data(args))
    data, warnings = load_and_check_data(args, state)
    if input_type_of(data) != "image":
        raise UsageError(
            f"--task {MIM_TASK}: --dataset {d.dataset} is a dataset for {task_of(data)}; masked image modelling "
            "needs images (e.g. digits, fashion_mnist, an image folder)"
        )
    if tokenizer is None:
        # the config checked now with the grid the fit will give: a bad --config costs no fit
        planned = _planned_tokenizer_grid(args, data)
        if planned is not None:
            _masked_image_modeling_config(args, d.codebook_size, planned)
    log = (lambda line: print(line, flush=True)) if state.is_main_process else (lambda line: None)
    mim = masked_image_data(
        data,
        tokenizer,
        codebook_size=d.codebook_size,
        patch_size=d.tokenizer_patch_size,
        fit_samples=d.tokenizer_fit_samples,
        eval_mask_ratio=d.eval_mask_ratio,
        seed=args.run.seed,
        log=log,
    )
    config = masked_image_modeling_config(args, mim.tokenizer)
    check_mim_supervision(config)
    seed_run(args.run)
    head = transformers.AutoModelForMaskedImageModeling
    attention = m.attn_implementation
    chosen = {} if attention is None else {"attn_implementation": attention}
    if attention is not None:
        check_attn_flag(attention, config.model_type)

    def cannot_build(err: Exception) -> str:
        return f"cannot build the masked-image-modelling model: {err}"

    if m.from_pretrained:  # every tensor must load as saved: the head's codes are the tokenizer's
        model = load_or_refuse(
            head,
            m.from_pretrained,
            error=UsageError,
            message=cannot_build,
            label="--from_pretrained",
            config=config,
            **chosen,
        )
    else:
        try:
            model = head.from_config(config, **chosen)
        except (OSError, RuntimeError, ValueError) as err:
            raise UsageError(cannot_build(err)) from err
    check_checkpointing_support(args, model)
    collator = MaskedCodesCollator(
        model.mask_token_id, (0.0, d.mask_ratio_max), seed=args.run.seed + state.process_index
    )
    # one real batch through the model, its loss too: a grid that does not fit fails now (a copy of the collator:
    # its masking stream stays at 0)
    check_one_batch(model, replace(collator), mim.datasets["train"], "a training batch", labels=True)
    model.train()
    evaluation = MaskedImageEvaluation(
        mim,
        steps=d.decode_steps,
        samples=d.decode_samples,
        seed=args.run.seed,
        lpips_weights=d.lpips_weights,
        fid_weights=d.fid_weights,
    )
    return Built(
        model,
        mim.datasets,
        mim.tokenizer,
        collator,
        MIM_TASK,
        warnings,
        masked_images=evaluation,
        source_columns=getattr(data, "source_columns", None),
    )


@dataclass
class AugmentedTransform:
    """`Dataset.set_transform` callable: `augmentation` on the raw rows, then the preprocessing `transform`. A
    class rather than a closure, so DataLoader workers started by spawn can pickle it."""

    augmentation: Any
    transform: Any

    def __call__(self, batch: dict[str, list]) -> dict[str, Any]:
        return self.transform(self.augmentation(batch))


@contextmanager
def output_paths(args: Arguments) -> Iterator[tuple[Path, Path]]:
    """The run's (output folder, its `<name>.checkpoints` work folder), for the rest of the run: the main process
    holds the folder's lock (`run_folder.locked_output_dir`) until the block ends, however it ends (finished,
    stopped, refused, failed), so an in-process caller (a notebook, `train.main`) is left no lock. Refuses a
    non-empty output without --overwrite."""
    from .run_folder import locked_output_dir, restore_interrupted_publish

    # parse_arguments checked this already; again here for a caller that built `args` itself, and for a folder
    # that appeared since
    check_output_dir(args.run.output_dir, args.run.overwrite_output_dir)
    output_dir = Path(args.run.output_dir).expanduser().resolve()
    main_process = launch_rank() == 0  # the main process holds the run's lock; the others share its run
    # before anything of the run is read or written: another run on the folder is refused here
    with locked_output_dir(args.run.output_dir) if main_process else nullcontext():
        if main_process:
            restore_interrupted_publish(output_dir)
            # the folder as the repair left it (back, or its copy removed): checked as if nothing had been left
            check_output_dir(args.run.output_dir, args.run.overwrite_output_dir, repaired=True)
        yield output_dir, work_folder(output_dir)


# Written by the main process into `<output_dir>.checkpoints/` when training starts: what the run built
# (`resume_identity`), compared by `check_resume_arguments` before a resumed run loads a checkpoint.
RUN_ARGUMENTS_FILE = "run_arguments.json"
# Where a loop saves the finished model before `run_folder.finish_run` publishes it as `<output_dir>`.
STAGE_FOLDER = "final"
# Written into the work folder by `run_folder.finish_run` once the stage is complete, before it is published; with
# the stage gone (renamed to `<output_dir>`) the checkpoints left beside it are those of a run that finished (kept
# by --keep_checkpoints, or a kill came before they were removed), not of an interrupted one. A run that starts
# training in the folder removes it (`record_run_arguments`).
FINISHED_RUN_FILE = "finished.json"
# Config keys that say nothing of the weights or the data they map: the library version, where the config was
# read from, the dtype and the attention kernel (all may change on --resume).
VOLATILE_CONFIG_KEYS = frozenset(
    {
        "transformers_version",
        "_name_or_path",
        "_commit_hash",
        "dtype",
        "torch_dtype",
        "attn_implementation",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "_attn_implementation_internal",
    }
)
# How many differing config fields a refusal lists (a change of dataset changes every label field).
SHOWN_CONFIG_FIELDS = 4


def _as_path(value: str | None) -> str | None:
    """A local path as an absolute one (the same folder named from another working directory); other values as
    they are (built-in dataset names, Hub ids)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


# The `resume_identity` entry of a trained text tokenizer (its vocabulary's fingerprint), and the entries no flag
# sets (they follow from the data, its tokenizer and the package's version): a refusal over these says what
# changed, not which value to resume with.
TOKENIZER_KEY = "tokenizer_vocabulary"
DERIVED_CONFIG_KEYS = frozenset({"vocab_size", "pad_token_id", *DATASET_LABEL_KEYWORDS})


def vocabulary_fingerprint(tokenizer: Any) -> str:
    """sha256 of a `tokenizers.Tokenizer`'s token → id map, special tokens included: the same for the tokenizer
    in memory and the tokenizer.json saved from it."""
    vocabulary = json.dumps(sorted(tokenizer.get_vocab(with_added_tokens=True).items()))
    return hashlib.sha256(vocabulary.encode()).hexdigest()


def _saved_vocabulary_fingerprint(checkpoint: Path) -> str | None:
    """`vocabulary_fingerprint` of the checkpoint's tokenizer.json (a Trainer checkpoint holds one); None when it
    has none or it cannot be read."""
    from tokenizers import Tokenizer

    try:
        return vocabulary_fingerprint(Tokenizer.from_file(str(checkpoint / RUN_TOKENIZER_FILE)))
    except Exception:  # absent or unreadable (the tokenizers error types are not public)
        return None


def resume_identity(args: Arguments, built: Built) -> dict[str, Any]:
    """What decides the checkpoint's weights and the data they map, as the run built them (not as the flags were
    typed), as JSON values: the model family, the final model config (`to_dict()` less `VOLATILE_CONFIG_KEYS`:
    --preset, --config, --vocab_size, --max_length, the config-field flags and the dataset's labels all end up
    there, and only where they have an effect), the checkpoint fine-tuned from, the dataset (a path made
    absolute), the task, the columns read after detection, and for masked image modelling the VQ tokenizer
    (`--tokenizer`, or the codebook and patch size of the fitted one). The learning rate, schedule, steps, batch
    size, evaluation and sample limits are left out: they may change on --resume."""
    config = built.model.config
    settings = {k: v for k, v in config.to_dict().items() if k not in VOLATILE_CONFIG_KEYS}
    identity: dict[str, Any] = {
        "model": config.model_type,
        "from_pretrained": _as_path(args.model.from_pretrained),
        "dataset": _as_path(args.data.dataset),
        "task": built.task,
        **(built.source_columns or {}),
    }
    if args.model.from_pretrained and built.task == "text-classification":
        # where --max_length truncates the checkpoint's texts: the config keeps its positions
        identity["max_length"] = built.processor.model_max_length
    if built.task == "text-classification" and not args.model.from_pretrained:
        # the tokenizer is trained on the data at each start: the ids its words get must be the checkpoint's
        identity["vocab_size"] = args.data.vocab_size
        identity[TOKENIZER_KEY] = vocabulary_fingerprint(built.processor.backend_tokenizer)
    if built.task == MIM_TASK:
        tokenizer = built.processor
        identity["tokenizer"] = _as_path(args.data.tokenizer)
        identity["codebook_size"] = tokenizer.codebook_size
        identity["tokenizer_patch_size"] = getattr(tokenizer, "patch_size", None)
    identity["config"] = settings
    # tuples become lists, keys strings: the form a reloaded record has
    return json.loads(json.dumps(identity, default=str))


def record_run_arguments(args: Arguments, built: Built, work_dir: Path) -> None:
    """Write `RUN_ARGUMENTS_FILE` into the work folder (main process, when training starts)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / FINISHED_RUN_FILE).unlink(missing_ok=True)  # its checkpoints are this run's from now on
    record = {"built": resume_identity(args, built), "argv": redacted_argv(args.argv)}
    if TOKENIZER_KEY in record["built"]:  # what a --resume encodes with (`run_tokenizer_file`)
        built.processor.backend_tokenizer.save(str(work_dir / RUN_TOKENIZER_FILE))
    (work_dir / RUN_ARGUMENTS_FILE).write_text(json.dumps(record, indent=1) + "\n")


def _differences(before: dict[str, Any], now: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(this command's values, the recorded ones) of each entry that differs, as `--flag value` (`--flag unset`
    for none) or `config field=value` for a model config field; a change of family is reported alone (every
    config field differs with it)."""
    names = ["model"] if before.get("model") != now.get("model") else [n for n in before if n in now]
    given, recorded = [], []
    for name in names:
        if name == "config":
            old, new = before[name], now[name]
            fields = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            for key in fields[:SHOWN_CONFIG_FIELDS]:
                given.append(f"config {key}=" + (json.dumps(new[key]) if key in new else "unset"))
                recorded.append(f"config {key}=" + (json.dumps(old[key]) if key in old else "unset"))
            if len(fields) > SHOWN_CONFIG_FIELDS:
                more = f"(and {len(fields) - SHOWN_CONFIG_FIELDS} more config fields)"
                given.append(more)
                recorded.append(more)
        elif name == TOKENIZER_KEY:
            if before[name] != now[name]:
                given.append(f"tokenizer vocabulary sha256 {str(now[name])[:12]}")
                recorded.append(f"tokenizer vocabulary sha256 {str(before[name])[:12]}")
        elif before[name] != now[name]:
            given.append(f"--{name} {'unset' if now[name] is None else now[name]}")
            recorded.append(f"--{name} {'unset' if before[name] is None else before[name]}")
    return given, recorded


def _derived(entry: str) -> bool:
    """Whether a `_differences` entry is one no flag sets (`DERIVED_CONFIG_KEYS`, the tokenizer's vocabulary)."""
    if entry.startswith("tokenizer vocabulary "):
        return True
    key = entry.removeprefix("config ").split("=", 1)[0]
    return entry.startswith("config ") and key in DERIVED_CONFIG_KEYS


def _weights_mismatch(model: Any, checkpoint: Path) -> str | None:
    """For a checkpoint without a run record or config.json (an Accelerate `step_N/` folder written before
    `RUN_ARGUMENTS_FILE` existed): the first tensor of its `model.safetensors` that `model` lacks or holds in
    another shape, as text; None when they fit or there is no such file. Reads the file's header only."""
    from safetensors import safe_open

    weights = checkpoint / "model.safetensors"
    if not weights.is_file():
        return None
    here = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    try:
        with safe_open(str(weights), framework="pt") as saved:
            for key in saved.keys():
                name = key.removeprefix("module.").removeprefix("_orig_mod.")  # DDP / torch.compile wrappers
                shape = tuple(saved.get_slice(key).get_shape())
                if here.get(name) != shape:
                    now = "absent" if name not in here else f"shape {list(here[name])}"
                    return (
                        f"{name} has shape {list(shape)} there but is {now} in the model this command builds"
                    )
    except (OSError, ValueError, RuntimeError):  # unreadable: loading it reports the problem
        return None
    return None


def check_resume_arguments(args: Arguments, built: Built, work_dir: Path, checkpoint: Path) -> None:
    """A `UsageError` naming each flag or config field whose effective value (`resume_identity`) differs from the
    run that wrote the checkpoints, with both values, before the checkpoint's weights are loaded into a model of
    another shape. Checkpoints written without the record: a Trainer checkpoint's family (its config.json's
    `model_type`) must match; an Accelerate `step_N/` folder holds no config.json, so the tensor names and
    shapes of its model.safetensors must fit the model built."""
    recorded_file = work_dir / RUN_ARGUMENTS_FILE
    now = resume_identity(args, built)
    try:
        before = json.loads(recorded_file.read_text())["built"]
    except (OSError, ValueError, KeyError, TypeError):
        before = None
    if before is None:  # no record (or one of an older form): what the checkpoint says of itself
        try:
            before = {"model": json.loads((checkpoint / "config.json").read_text())["model_type"]}
        except (OSError, ValueError, KeyError, TypeError):
            mismatch = _weights_mismatch(built.model, checkpoint)
            if mismatch is not None:
                raise UsageError(
                    f"--resume: the checkpoint {checkpoint} holds another model than this command builds "
                    f"({mismatch}); resume with the flags of the run that wrote it, or train in another "
                    "--output_dir"
                ) from None
            return
    if TOKENIZER_KEY in now and TOKENIZER_KEY not in before:  # recorded before the fingerprint was
        saved = _saved_vocabulary_fingerprint(checkpoint)
        if saved is not None:
            before = {**before, TOKENIZER_KEY: saved}
    given, recorded = _differences(before, now)
    if given and all(_derived(entry) for entry in given):
        # nothing a flag can repeat: the data, or the package's tokenizer or label mapping, changed
        tokens = any(entry.startswith("tokenizer vocabulary ") for entry in given)
        what = (
            f" (the run's {RUN_TOKENIZER_FILE} is gone, and the tokenizer trained again maps words to other ids)"
            if tokens
            else ""
        )
        raise UsageError(
            f"--resume: the checkpoints in {work_dir} were trained with {', '.join(recorded)} and this command "
            f"builds {', '.join(given)} from the same flags{what}: these follow from the "
            "data (its texts and labels) and the version of energyformers, not from a flag, so the checkpoints "
            "cannot continue; train in another --output_dir"
        )
    if given:
        raise UsageError(
            f"--resume: this command has {', '.join(given)} but the checkpoints in {work_dir} were trained with "
            f"{', '.join(recorded)}; resume with those values, or train in another --output_dir"
        )


def find_checkpoint(
    args: Arguments, work_dir: Path, command: str, checkpoints: dict[str, list[Path]]
) -> Path | None:
    """The checkpoint to resume from (`--resume`), or None; refuses to silently restart over a killed run. The
    model and data are compared with the checkpoint's once built (`check_resume_arguments`).

    `checkpoints`: each training loop's complete checkpoints in `work_dir`, by its sub-command ("train",
    "train-accelerate"). A loop resumes only its own (`command`'s) and refuses a folder that holds another loop's:
    it could not load them, and a finished run removes its whole work folder (unless --keep_checkpoints, or a kill
    came first: `finished_run` tells those from an interrupted run)."""
    finished = finished_run(work_dir)
    kind = "a finished" if finished else "an interrupted"
    for other, found in checkpoints.items():
        if other != command and found:
            # a token's value redacted, as in the resume line a stop prints (`StopRequest.report`)
            resume = redacted_argv(args.argv if "--resume" in args.argv else [*args.argv, "--resume"])
            error = UsageError(
                f"{work_dir} holds checkpoints of {kind} `energyformers {other}` run "
                f"({', '.join(p.name for p in found)}); only `energyformers {other}` can continue it, or delete the "
                "folder"
            )
            error.hint = f"continue with: {shlex.join(['energyformers', other, *resume])}"
            raise error
    own = checkpoints[command]
    if args.run.resume:
        if not own:
            raise UsageError(f"--resume: no checkpoint in {work_dir}; run without --resume to start training")
        return own[-1]
    if own and finished:
        raise UsageError(
            f"{work_dir} holds checkpoints of a run that finished (its model folder is {output_folder(work_dir)}); "
            "delete the folder, or pass --resume to train on from its last checkpoint"
        )
    if own:
        raise UsageError(
            f"{work_dir} holds checkpoints of an interrupted run; pass --resume to continue it or delete the folder"
        )
    return None


def finished_run(work_dir: Path) -> bool:
    """Whether the checkpoints in `work_dir` are those of a run that finished and published its model folder: its
    `FINISHED_RUN_FILE` is there and its stage is not (renamed to `<output_dir>`)."""
    return (work_dir / FINISHED_RUN_FILE).is_file() and not (work_dir / STAGE_FOLDER).exists()


def continue_iteration_draws(
    model: Any, global_step: int, batches_per_epoch: int, gradient_accumulation_steps: int
) -> None:
    """On (re)start, set the depth draw counter of a recurrent-depth backbone (`iteration_draws`, one draw per
    training forward) to the forwards done by `global_step` optimizer steps (`batches.batches_done`: an epoch's last
    step may take fewer batches), so a resumed run continues the sequence of sampled depths where it stopped.
    `batches_per_epoch`: this process's; every process sets the same value, so ranks stay in lock-step."""
    backbone = getattr(model, "base_model", model)
    if has_recurrent_depth(backbone):
        backbone.iteration_draws = batches_done(global_step, batches_per_epoch, gradient_accumulation_steps)


def announce_run(built: Built, dataset: str, world_size: int) -> None:
    """What both training loops print on the main process before the first step: one line naming the model, its
    parameter count, the dataset's splits and the number of processes; then each warning of the run on stderr."""
    model = built.model
    n = sum(p.numel() for p in model.parameters())
    splits = ", ".join(f"{name} {len(split)}" for name, split in built.data.items())
    print(
        f"{model.config.model_type} {type(model).__name__}: {n:,} parameters; {dataset}: {splits}; "
        f"{world_size} process(es)",
        flush=True,
    )
    for warning in built.warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)


def checkpointing_name() -> str:
    """The installed transformers' name for activation checkpointing, for the `TrainingArguments` field and the
    model's `<name>_enable`: "activation_checkpointing" where both carry the new name, else "gradient_checkpointing"
    (older versions have only that; newer ones keep it as a deprecated alias that warns)."""
    import dataclasses

    from transformers import PreTrainedModel, TrainingArguments

    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    renamed = "activation_checkpointing" in fields and hasattr(
        PreTrainedModel, "activation_checkpointing_enable"
    )
    return "activation_checkpointing" if renamed else "gradient_checkpointing"


def enable_activation_checkpointing(model: Any) -> None:
    """transformers' activation checkpointing, by the name the model has: `activation_checkpointing_enable` where
    transformers has the new name (the old one then warns), else `gradient_checkpointing_enable`."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def check_checkpointing_support(args: Arguments, model: Any) -> None:
    """`--gradient_checkpointing` only for a model that supports it, as built (a `UsageError` naming the model class,
    or saying what the model's own check refuses), before any training work."""
    if not args.run.gradient_checkpointing:
        return
    if not model.supports_gradient_checkpointing:
        raise UsageError(f"--gradient_checkpointing: {type(model).__name__} does not support it")
    check = getattr(model, "check_activation_checkpointing", None)  # iMixer: not with the per-call schedule
    if check is not None:
        try:
            check()
        except ValueError as err:
            raise UsageError(f"--gradient_checkpointing: {err}") from err


def check_precision(precision: str) -> str:
    """The device type, after checking it supports the requested autocast precision."""
    import torch

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if precision == "fp16" and device_type == "cpu":
        raise UsageError("--mixed_precision fp16 needs a GPU; use bf16 or no on CPU")
    if precision == "bf16":
        from transformers.utils.import_utils import is_torch_bf16_available_on_device

        if not is_torch_bf16_available_on_device(device_type):
            raise UsageError(f"--bf16: this {device_type} has no bfloat16 support; train without --bf16")
    return device_type


def warmup_steps(args: Arguments, total_steps: int, steps_per_epoch: int) -> int:
    """Warm-up in optimizer steps: --warmup_epochs (recipes), else --warmup_steps (a float < 1 is a fraction)."""
    if args.run.warmup_epochs is not None:
        return min(total_steps, round(args.run.warmup_epochs * steps_per_epoch))
    value = args.run.warmup_steps
    return int(value) if value >= 1 else math.ceil(total_steps * value)


__all__ = [
    "CLASSIFIER_MODULE",
    "DATA_FIELDS",
    "DEFAULT_MAX_LENGTH",
    "FINISHED_RUN_FILE",
    "HALTING_MODULE",
    "MIM_GRID_FIELDS",
    "STAGE_FOLDER",
    "AugmentedTransform",
    "Built",
    "accepts",
    "announce_run",
    "auto_head",
    "auto_processor",
    "build",
    "build_config_and_processor",
    "build_masked_image_modeling",
    "check_checkpointing_support",
    "check_flags_before_data",
    "check_mim_supervision",
    "check_one_batch",
    "check_precision",
    "check_pretrained_source",
    "check_pretrained_text_flags",
    "check_resume_arguments",
    "check_supervision_flags",
    "checkpointing_name",
    "cli_preset",
    "continue_iteration_draws",
    "default_epochs",
    "default_learning_rate",
    "enable_activation_checkpointing",
    "family",
    "find_checkpoint",
    "finished_run",
    "load_and_check_data",
    "masked_image_modeling_config",
    "model_registry",
    "new_head_tensors",
    "output_paths",
    "preprocessing",
    "pretrained_processor",
    "processor_keyword",
    "record_run_arguments",
    "resume_identity",
    "small_split_warnings",
    "warmup_steps",
]
