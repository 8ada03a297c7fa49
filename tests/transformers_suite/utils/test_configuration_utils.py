"""Stand-in for transformers' `tests/utils/test_configuration_utils.py`, which its sdist does not ship.

`ConfigTester.check_config_arguments_init` builds a config from `config_common_kwargs` and checks every value
comes back: the arguments every `PreTrainedConfig` takes must reach the base class. Here that dict is built
from the installed transformers: every public key of `PreTrainedConfig().__dict__`, with a value that is not
its default (`dtype` as a string, which the tester compares with `torch.float16`).
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedConfig

# Keys whose non-default value cannot be derived from the default's type.
_VALUES: dict[str, Any] = {
    "transformers_version": "0.0.1",
    "architectures": ["BertModel"],
    "dtype": "float16",
    "id2label": {0: "label"},
    "label2id": {"label": 0},
    "problem_type": "regression",
}


def _non_default(key: str, default: Any) -> Any:
    if key in _VALUES:
        return _VALUES[key]
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 5
    if isinstance(default, str):
        return default + "_changed"
    raise KeyError(
        f"PreTrainedConfig has a new public attribute {key!r} (default {default!r}); give it a non-default "
        f"value in {__name__}._VALUES."
    )


config_common_kwargs: dict[str, Any] = {
    key: _non_default(key, default)
    for key, default in PreTrainedConfig().__dict__.items()
    if not key.startswith("_")
}
