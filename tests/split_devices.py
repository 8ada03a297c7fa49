"""A CPU stand-in for a model split over several accelerators (`device_map="auto"` on N GPUs).

`OnDevice` wraps a real CPU tensor and reports the device `meta:i`, one index per stand-in accelerator; accelerate's
own hooks (`dispatch_model`) then move each module's inputs to its device with `.to(meta:i)`, as they would to
`cuda:i`. Every op checks what CUDA checks: its tensors on one device (a 0-dim CPU tensor is allowed beside them, as
on CUDA), else `DeviceMismatch`; a cross-device copy (`.to`, `copy_`) is allowed. The arithmetic runs on the wrapped
CPU tensors, so values are those of the model on one device. What it cannot see: branches on `device.type ==
"cuda"`, compiled code and the CUDA kernels themselves (`tests/device_proxy.py`, the one-device stand-in, says more).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

_aten = torch.ops.aten
_ANY_SOURCE = {_aten._to_copy.default, _aten.copy_.default}  # a cross-device copy is allowed


def device(index: int) -> torch.device:
    """Stand-in accelerator `index`."""
    return torch.device("meta", index)


class DeviceMismatch(RuntimeError):
    """What CUDA would raise: tensors of two devices in one op."""


class OnDevice(torch.Tensor):
    """A CPU tensor standing in for one on accelerator `index` (reports `meta:index`)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int) -> OnDevice:
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            device=device(index), requires_grad=elem.requires_grad,
        )  # fmt: skip
        wrapper.elem = elem
        return wrapper

    def __repr__(self) -> str:
        return f"OnDevice({self.elem!r}, {self.device.index})"

    def tolist(self) -> Any:  # allowed on CUDA (a host sync)
        return self.elem.tolist()

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return _run(func, args, kwargs or {})


def _target(kwargs: dict[str, Any]) -> int | None:
    """The stand-in index a `device=` argument names, or None."""
    target = kwargs.get("device")
    if target is None or torch.device(target).type != "meta":
        return None
    return torch.device(target).index or 0


def _run(func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    flat, _ = tree_flatten((args, kwargs))
    indices = {t.device.index for t in flat if isinstance(t, OnDevice)}
    target = _target(kwargs)
    if func not in _ANY_SOURCE and indices:
        plain = [t for t in flat if type(t) is torch.Tensor and t.dim() > 0]
        if len(indices) > 1 or plain or (target is not None and {target} != indices):
            shapes = [tuple(t.shape) for t in plain]
            raise DeviceMismatch(
                f"{func}: tensors on meta:{sorted(indices)} and CPU tensors of shapes {shapes}"
            )
    if target is not None:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    unwrap = lambda value: value.elem if isinstance(value, OnDevice) else value  # noqa: E731
    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if func is _aten._to_copy.default and "device" in kwargs and target is None:
        return out  # .cpu(), .to("cpu"): a plain CPU tensor
    index = target if target is not None else (min(indices) if indices else None)
    if index is None:
        return out
    if not func._schema.returns:
        return None  # in place on lists of tensors (`torch._foreach_copy_`, ...): the op returns nothing
    if func is _aten.copy_.default or (func._schema.is_mutable and func.__name__.split(".")[0].endswith("_")):
        return args[0]  # in place: the wrapper whose contents changed
    return tree_map(lambda t: OnDevice(t, index) if type(t) is torch.Tensor else t, out)


class _Factories(TorchDispatchMode):
    """Routes ops on plain tensors that name a stand-in device (`x.to(meta:1)`, `torch.zeros(device=meta:1)`)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if any(isinstance(t, OnDevice) for t in tree_flatten((args, kwargs))[0]):
            return func(*args, **kwargs)
        return _run(func, args, kwargs)


@contextlib.contextmanager
def split_devices() -> Iterator[None]:
    """Inside: `device=meta:i` and `.to(meta:i)` make stand-in tensors of accelerator i."""
    with _Factories():
        yield


def place(module: torch.nn.Module, device_map: dict[str, int]) -> torch.nn.Module:
    """Every parameter and buffer of each `device_map` entry (a module name, "" for the root, or a split module's own
    tensor) on its stand-in device,
    then accelerate's `dispatch_model` hooks, as `from_pretrained(..., device_map=...)` attaches them for GPUs."""
    from accelerate import dispatch_model

    for name, index in device_map.items():
        owner, _, leaf = name.rpartition(".")
        parent = module.get_submodule(owner)
        if (
            leaf in parent._parameters or leaf in parent._buffers
        ):  # a split module's own tensor, as its own entry
            tensors = [(parent, leaf)]
        else:
            subs = module.get_submodule(name).modules()
            tensors = [(sub, key) for sub in subs for key in (*sub._parameters, *sub._buffers)]
        for sub, key in tensors:
            if sub._parameters.get(key) is not None:
                parameter = sub._parameters[key]
                wrapped = OnDevice(parameter.detach().clone(), index)
                sub._parameters[key] = torch.nn.Parameter(wrapped, requires_grad=parameter.requires_grad)
            elif sub._buffers.get(key) is not None:
                sub._buffers[key] = OnDevice(sub._buffers[key].clone(), index)
    stand_in = {name: device(index) for name, index in device_map.items()}
    return dispatch_model(module, device_map=stand_in, main_device=device(min(device_map.values())))
