"""Each config class's docstring is the complete field reference the docs point to (`help(IMixerConfig)`): every
`__init__` argument has an `Args:` entry, and the default the entry states is the code's."""

from __future__ import annotations

import ast
import inspect
import re

import pytest

from energyformers import HyperBFConfig, HyperSetConfig, IMixerConfig, LoopedTransformerConfig

# an argument documented inside another's entry rather than in its own
ALIASES = {HyperBFConfig: {"intermediate_size": "num_centers"}}


@pytest.mark.parametrize(
    "config_class",
    [HyperSetConfig, IMixerConfig, HyperBFConfig, LoopedTransformerConfig],
    ids=lambda c: c.__name__,
)
def test_the_docstring_documents_every_argument_with_its_default(config_class):
    doc = inspect.getdoc(config_class)
    entries = {name: rest for name, rest in re.findall(r"^    (\w+) \((.*)\):$", doc, re.M)}
    aliases = ALIASES.get(config_class, {})
    wrong = []
    for parameter in inspect.signature(config_class.__init__).parameters.values():
        if parameter.name == "self" or parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            continue
        if parameter.name in aliases:  # named in the entry of the field it aliases
            entry = re.search(rf"^    {aliases[parameter.name]} \(.*?(?=^    \w|\Z)", doc, re.M | re.S)
            if entry is None or f"`{parameter.name}`" not in entry[0]:
                wrong.append(f"{parameter.name}: not named in the `{aliases[parameter.name]}` entry")
            continue
        if parameter.name not in entries:
            wrong.append(f"{parameter.name}: no Args entry")
            continue
        stated = re.search(r"defaults to (.+)$", entries[parameter.name])
        if (
            stated is None
        ):  # an entry without "defaults to" describes an argument whose default is None (unset)
            if parameter.default is not None:
                wrong.append(
                    f"{parameter.name}: entry states no default, the code's is {parameter.default!r}"
                )
            continue
        value = ast.literal_eval(stated[1].strip("`"))
        default = list(parameter.default) if isinstance(parameter.default, tuple) else parameter.default
        value = list(value) if isinstance(value, tuple) else value
        if value != default:
            wrong.append(f"{parameter.name}: docstring says {value!r}, the code's default is {default!r}")
    assert not wrong, f"{config_class.__name__}:\n" + "\n".join(wrong)
