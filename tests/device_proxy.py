"""A CPU stand-in for an accelerator: catches the device mix-ups that only a GPU run would show.

`Accelerated` wraps a real CPU tensor and reports the `meta` device, so code that follows its inputs' device
(`torch.zeros(..., device=x.device)`, `.to(x.device)`, `new_zeros`, `torch.Generator(x.device)`) produces
`Accelerated` tensors, while a tensor created without `device=` stays a plain CPU tensor. Every op then checks what
CUDA checks: a CPU tensor with dimensions beside accelerator tensors is an error (a 0-dim CPU tensor is allowed,
as on CUDA; so are CPU indices of an indexing op and the source of a copy), a CPU generator cannot draw an
accelerator tensor, and `.numpy()` / `np.asarray` need `.cpu()` first. The arithmetic runs on the wrapped CPU
tensors, so values, `.item()`, data-dependent shapes and autograd behave as on a real device.

Why not `FakeTensorMode` with fake CUDA tensors: on a CPU-only build of torch 2.13 autograd aborts the process
(no CUDA device guard for the gradient accumulator) and every op without a meta kernel (`int(t.min())`, in-place
`copy_`) fails with "not linked with support for cuda devices". The `meta` device alone misses mixes that CUDA
rejects (a matmul of a meta and a CPU matrix passes). What this stand-in cannot see: branches taken only when
`device.type == "cuda"` (they see `meta`), compiled code, and CUDA kernels themselves. Known gap: `torch.linalg.svdvals`
(Hyper-SET's `output_energies` geometry) sometimes reads uninitialised memory through the wrapper, so tests leave
that path out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

STAND_IN = torch.device("meta")
_aten = torch.ops.aten
# ops that take CPU index tensors for a device tensor, as CUDA does (the indices are moved for the kernel)
_INDEX_OPS = {
    _aten.index.Tensor,
    _aten.index_put_.default,
    _aten.index_put.default,
    _aten._index_put_impl_.default,
}
_ANY_SOURCE = {_aten._to_copy.default, _aten.copy_.default}  # a cross-device copy is allowed


class DeviceMismatch(RuntimeError):
    """What CUDA would raise: a CPU tensor or generator used with accelerator tensors."""


class Accelerated(torch.Tensor):
    """A CPU tensor standing in for an accelerator tensor (reports `meta`)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> Accelerated:
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            device=STAND_IN, requires_grad=elem.requires_grad,
        )  # fmt: skip
        wrapper.elem = elem
        return wrapper

    def __repr__(self) -> str:
        return f"Accelerated({self.elem!r})"

    def tolist(self) -> Any:  # allowed on CUDA (a host sync)
        return self.elem.tolist()

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError(
            "can't convert an accelerator tensor to numpy (CUDA: 'can't convert cuda:0 device type tensor to "
            "numpy. Use Tensor.cpu() to copy the tensor to host memory first.')"
        )

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return _run(func, args, kwargs or {})


def _run(func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    flat, _ = tree_flatten((args, kwargs))
    on_accelerator = any(isinstance(t, Accelerated) for t in flat)
    device = kwargs.get("device")
    creates = device is not None and torch.device(device) == STAND_IN
    if on_accelerator or creates:
        if func not in _ANY_SOURCE:
            checked = flat
            if (
                func in _INDEX_OPS
            ):  # self and values must be on the device; the indices (args[1]) may be on CPU
                checked = [args[0], *args[2:]]
            for t in checked:
                if isinstance(t, torch.Tensor) and not isinstance(t, Accelerated) and t.dim() > 0:
                    raise DeviceMismatch(
                        f"{func}: a CPU tensor of shape {tuple(t.shape)} ({t.dtype}) beside accelerator tensors"
                    )
    if creates:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    if func is _aten._to_copy.default and device is not None and torch.device(device).type == "cpu":
        return out  # .cpu(), .to("cpu"): a plain CPU tensor
    if not (on_accelerator or creates):
        return out
    if not func._schema.returns:
        return None  # in place on lists of tensors (`torch._foreach_copy_`, ...): the op returns nothing
    if func is _aten.copy_.default or (func._schema.is_mutable and func.__name__.split(".")[0].endswith("_")):
        return args[0]  # in place: the wrapper whose contents changed
    return tree_map(lambda t: Accelerated(t) if type(t) is torch.Tensor else t, out)


def _unwrap(value: Any) -> Any:
    return value.elem if isinstance(value, Accelerated) else value


class _Factories(TorchDispatchMode):
    """Routes `device=meta` factory calls (no tensor argument) to the stand-in."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if any(isinstance(t, Accelerated) for t in tree_flatten((args, kwargs))[0]):
            return func(*args, **kwargs)
        return _run(func, args, kwargs)


class _Generators(TorchFunctionMode):
    """A plain CPU generator drawing a stand-in tensor is an error, as on CUDA. Checked before the dispatcher,
    which hands `__torch_dispatch__` a new Python object for the same generator."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        generator = kwargs.get("generator")
        if isinstance(generator, _Generator) and not isinstance(generator, _StandInGenerator):
            flat, _ = tree_flatten((args, kwargs))
            device = kwargs.get("device")
            if any(isinstance(t, Accelerated) for t in flat) or (
                device is not None and torch.device(device) == STAND_IN
            ):
                raise DeviceMismatch(
                    f"{func.__name__}: a {generator.device} generator draws an accelerator tensor"
                )
        return func(*args, **kwargs)


_Generator = torch.Generator
_tensor, _as_tensor = torch.tensor, torch.as_tensor


class _StandInGenerator(_Generator):
    """`torch.Generator(meta)`: a CPU generator that may draw stand-in tensors (a plain CPU one may not)."""

    def __new__(cls, device: Any = "cpu") -> torch.Generator:
        if torch.device(device) == STAND_IN:
            return _Generator.__new__(cls, "cpu")
        return _Generator.__new__(_Generator, device)


def _on_stand_in(factory: Any) -> Any:
    """`torch.tensor` / `torch.as_tensor` build their data below the dispatcher: wrap what `device=meta` asks for."""

    def create(data: Any, *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        if device is not None and torch.device(device) == STAND_IN:
            return to_accelerator(factory(data, *args, device="cpu", **kwargs))
        return factory(data, *args, device=device, **kwargs)

    return create


@contextlib.contextmanager
def accelerator() -> Iterator[None]:
    """Inside: `device=meta` creates stand-in tensors and `torch.Generator(meta)` a stand-in generator."""
    torch.Generator = _StandInGenerator  # type: ignore[misc]
    torch.tensor, torch.as_tensor = _on_stand_in(_tensor), _on_stand_in(_as_tensor)
    try:
        with _Generators(), _Factories():
            yield
    finally:
        torch.Generator = _Generator  # type: ignore[misc]
        torch.tensor, torch.as_tensor = _tensor, _as_tensor


def to_accelerator(value: Any) -> Any:
    """A tensor (or a dict / list of them) moved to the stand-in device; other values unchanged."""
    if isinstance(value, torch.Tensor):
        with torch.no_grad():
            return Accelerated(value.detach().clone()).requires_grad_(value.requires_grad)
    if isinstance(value, dict):
        return {k: to_accelerator(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_accelerator(v) for v in value)
    return value


def module_to_accelerator(module: torch.nn.Module) -> torch.nn.Module:
    """Every parameter and buffer of `module` on the stand-in device (what `module.to("cuda")` does)."""
    for sub in module.modules():
        for name, parameter in list(sub._parameters.items()):
            if parameter is not None:
                sub._parameters[name] = torch.nn.Parameter(
                    to_accelerator(parameter), requires_grad=parameter.requires_grad
                )
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None:
                sub._buffers[name] = to_accelerator(buffer)
    return module


def on_accelerator(value: torch.Tensor) -> bool:
    return isinstance(value, Accelerated)
