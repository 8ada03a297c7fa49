"""The configuration classes. Importing this package (as every `energyformers.configuration.*` import does first)
lets configs read from an exported folder write its remote code when saved again: that generator lives in the package,
and the configuration modules themselves are copied into exported folders, where they must not import it."""

from __future__ import annotations

import os
from typing import Any

from .configuration_hyperbf import HyperBFConfig
from .configuration_hyperset import RecurrentDepthConfig
from .configuration_imixer import IMixerConfig


def _write_folder_code(config: Any, folder: str | os.PathLike) -> None:
    # imported on save only: the generator reads the package sources
    from ..training.remote_code import write_folder_code

    write_folder_code(config, folder)


for _config_class in (HyperBFConfig, IMixerConfig, RecurrentDepthConfig):
    _config_class.folder_code_writer = _write_folder_code
