"""What each converter source reverses, read from a model folder's config.json alone: light (no torch), for
the command line (`convert_cli`, before anything loads) and the converters (`write.reverse`) alike."""

from __future__ import annotations

from pathlib import Path

from ..weights import read_json_object

# Which model folder each source reverses: (config.json `model_type`, `architectures[0]`), the model type and class
# name of `convert.SOURCES[source].head_class` (a test checks they stay equal), known without importing torch.
SOURCE_MODELS = {
    "hyperbf": ("hyperbf", "HyperBFForImageClassification"),
    "hyperset-ic": ("hyperset", "HyperSetForImageClassification"),
    "hyperset-mim": ("hyperset", "HyperSetForMaskedImageModeling"),
    "hyperset-sudoku": ("hyperset", "HyperSetForTokenClassification"),
    "imixer": ("imixer", "IMixerForImageClassification"),
}


def reverse_input_problem(source: str, model_dir: str | Path) -> str | None:
    """Why `model_dir` cannot be reversed with `--source source`, read from its config.json alone (before anything
    loads); None when it is a folder of the model that source describes."""
    config_path = Path(model_dir) / "config.json"
    if not config_path.is_file():
        return f"{model_dir}: no config.json; with --reverse the input is our model folder (save_pretrained)"
    try:
        config = read_json_object(config_path, optional={"model_type": str, "architectures": list})
    except ValueError as err:
        return str(err)
    model_type, architectures = config.get("model_type"), config.get("architectures") or []
    # transformers writes a list of class names; anything else would be read character by character
    if not all(isinstance(name, str) for name in architectures):
        return f"{config_path}: architectures holds a value that is not a string; save it again with save_pretrained."
    want_type, want_class = SOURCE_MODELS[source]
    fitting = [name for name, model in SOURCE_MODELS.items() if model == (model_type, *architectures[:1])]
    hint = f" (a {architectures[0]} folder goes with --source {fitting[0]})" if fitting else ""
    if model_type != want_type:
        return (
            f"{model_dir} is a {model_type} model; --source {source} needs {_article(want_type)} folder{hint}"
        )
    if architectures[:1] != [want_class]:
        return (
            f"{model_dir} is a {model_type} model ({'/'.join(architectures) or 'no architectures'}); --source "
            f"{source} needs {_article(want_class)} folder{hint}"
        )
    return None


def _article(word: str) -> str:
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


__all__ = ["SOURCE_MODELS", "reverse_input_problem"]
