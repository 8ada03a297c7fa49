"""CPU stand-ins for accelerators: catch the device mix-ups that only a GPU run would show.

`Accelerated` wraps a real CPU tensor and reports a `meta` device, so code that follows its inputs' device
(`torch.zeros(..., device=x.device)`, `.to(x.device)`, `new_zeros`, `torch.Generator(x.device)`) produces
`Accelerated` tensors, while a tensor created without `device=` stays a plain CPU tensor. Every op then checks what
CUDA checks: a CPU tensor with dimensions beside accelerator tensors is an error (a 0-dim CPU tensor is allowed,
as on CUDA; so are CPU indices of an indexing op and the source of a copy), so are tensors of two accelerators in
one op (a copy between them is allowed), a CPU generator cannot draw an accelerator tensor, and `.numpy()` /
`np.asarray` need `.cpu()` first. The arithmetic runs on the wrapped CPU tensors, so values, `.item()`,
data-dependent shapes and autograd behave as on a real device.

One accelerator: `to_accelerator` / `module_to_accelerator` put tensors on `meta` (what `.to("cuda")` does).
Several (a model split by `device_map="auto"` over N GPUs): `meta:i` is accelerator i (`meta` is accelerator 0, as
`cuda` is `cuda:0`), and `place` puts each entry of a device map there under accelerate's own `dispatch_model`
hooks, which move each module's inputs with `.to(meta:i)` as they would to `cuda:i`.

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

STAND_IN = torch.device("meta")  # the one accelerator, or accelerator 0 of several
_aten = torch.ops.aten
# ops that take CPU index tensors for a device tensor, as CUDA does (the indices are moved for the kernel)
_INDEX_OPS = {
    _aten.index.Tensor,
    _aten.index_put_.default,
    _aten.index_put.default,
    _aten._index_put_impl_.default,
}
_ANY_SOURCE = {_aten._to_copy.default, _aten.copy_.default}  # a cross-device copy is allowed


def device(index: int) -> torch.device:
    """Stand-in accelerator `index` of several."""
    return torch.device("meta", index)


def _stand_in(where: Any) -> torch.device | None:
    """The stand-in device a `device=` argument names, or None."""
    if where is None or torch.device(where).type != "meta":
        return None
    return torch.device(where)


def _slot(where: torch.device) -> int:
    """Which accelerator a stand-in device is: `meta` and `meta:0` are one."""
    return where.index or 0


class DeviceMismatch(RuntimeError):
    """What CUDA would raise: a CPU tensor or generator used with accelerator tensors, or two accelerators mixed."""


class Accelerated(torch.Tensor):
    """A CPU tensor standing in for an accelerator tensor (reports `meta`, or `meta:index`)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int | None = None) -> Accelerated:
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            device=STAND_IN if index is None else device(index), requires_grad=elem.requires_grad,
        )  # fmt: skip
        wrapper.elem = elem
        return wrapper

    def __repr__(self) -> str:
        where = "" if self.device.index is None else f", {self.device.index}"
        return f"Accelerated({self.elem!r}{where})"

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
    devices = [t.device for t in flat if isinstance(t, Accelerated)]
    requested = kwargs.get("device")
    target = _stand_in(requested)
    if (devices or target is not None) and func not in _ANY_SOURCE:
        checked = flat
        if func in _INDEX_OPS:  # self and values must be on the device; the indices (args[1]) may be on CPU
            checked = [args[0], *args[2:]]
        for t in checked:
            if isinstance(t, torch.Tensor) and not isinstance(t, Accelerated) and t.dim() > 0:
                raise DeviceMismatch(
                    f"{func}: a CPU tensor of shape {tuple(t.shape)} ({t.dtype}) beside accelerator tensors"
                )
        slots = {_slot(where) for where in (*devices, *([target] if target is not None else []))}
        if len(slots) > 1:
            raise DeviceMismatch(f"{func}: tensors of accelerators {sorted(slots)} in one op")
    if target is not None:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    if func is _aten._to_copy.default and requested is not None and target is None:
        return out  # .cpu(), .to("cpu"): a plain CPU tensor
    if not devices and target is None:
        return out
    if not func._schema.returns:
        return None  # in place on lists of tensors (`torch._foreach_copy_`, ...): the op returns nothing
    if func is _aten.copy_.default or (func._schema.is_mutable and func.__name__.split(".")[0].endswith("_")):
        return args[0]  # in place: the wrapper whose contents changed
    index = (target if target is not None else devices[0]).index
    return tree_map(lambda t: Accelerated(t, index) if type(t) is torch.Tensor else t, out)


def _unwrap(value: Any) -> Any:
    return value.elem if isinstance(value, Accelerated) else value


class _Factories(TorchDispatchMode):
    """Routes ops on plain tensors that name a stand-in device (`torch.zeros(device=meta)`, `x.to(meta:1)`) to
    the stand-in."""

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
            if any(isinstance(t, Accelerated) for t in flat) or _stand_in(kwargs.get("device")) is not None:
                raise DeviceMismatch(
                    f"{func.__name__}: a {generator.device} generator draws an accelerator tensor"
                )
        return func(*args, **kwargs)


_Generator = torch.Generator
_tensor, _as_tensor = torch.tensor, torch.as_tensor


class _StandInGenerator(_Generator):
    """`torch.Generator(meta)`: a CPU generator that may draw stand-in tensors (a plain CPU one may not)."""

    def __new__(cls, device: Any = "cpu") -> torch.Generator:
        if _stand_in(device) is not None:
            return _Generator.__new__(cls, "cpu")
        return _Generator.__new__(_Generator, device)


def _on_stand_in(factory: Any) -> Any:
    """`torch.tensor` / `torch.as_tensor` build their data below the dispatcher: wrap what `device=meta` asks for."""

    def create(data: Any, *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        where = _stand_in(device)
        if where is not None:
            return to_accelerator(factory(data, *args, device="cpu", **kwargs), where.index)
        return factory(data, *args, device=device, **kwargs)

    return create


@contextlib.contextmanager
def accelerator() -> Iterator[None]:
    """Inside: `device=meta` (`meta:i`) creates stand-in tensors and `torch.Generator(meta)` a stand-in
    generator."""
    torch.Generator = _StandInGenerator  # type: ignore[misc]
    torch.tensor, torch.as_tensor = _on_stand_in(_tensor), _on_stand_in(_as_tensor)
    try:
        with _Generators(), _Factories():
            yield
    finally:
        torch.Generator = _Generator  # type: ignore[misc]
        torch.tensor, torch.as_tensor = _tensor, _as_tensor


def to_accelerator(value: Any, index: int | None = None) -> Any:
    """A tensor (or a dict / list of them) moved to the stand-in device (accelerator `index` of several); other
    values unchanged."""
    if isinstance(value, torch.Tensor):
        with torch.no_grad():
            return Accelerated(value.detach().clone(), index).requires_grad_(value.requires_grad)
    if isinstance(value, dict):
        return {k: to_accelerator(v, index) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_accelerator(v, index) for v in value)
    return value


def _move(module: torch.nn.Module, key: str, index: int | None) -> None:
    """`module`'s own parameter or buffer `key` onto the stand-in (accelerator `index` of several)."""
    if module._parameters.get(key) is not None:
        parameter = module._parameters[key]
        module._parameters[key] = torch.nn.Parameter(
            to_accelerator(parameter, index), requires_grad=parameter.requires_grad
        )
    elif module._buffers.get(key) is not None:
        module._buffers[key] = to_accelerator(module._buffers[key], index)


def module_to_accelerator(module: torch.nn.Module, index: int | None = None) -> torch.nn.Module:
    """Every parameter and buffer of `module` on the stand-in device (what `module.to("cuda")` does)."""
    for sub in module.modules():
        for key in (*sub._parameters, *sub._buffers):
            _move(sub, key, index)
    return module


def place(module: torch.nn.Module, device_map: dict[str, int]) -> torch.nn.Module:
    """Every parameter and buffer of each `device_map` entry (a module name, "" for the root, or a split module's own
    tensor) on its stand-in accelerator, then accelerate's `dispatch_model` hooks, as `from_pretrained(...,
    device_map=...)` attaches them for GPUs. Run the model inside `accelerator()`."""
    from accelerate import dispatch_model

    for name, index in device_map.items():
        owner, _, leaf = name.rpartition(".")
        parent = module.get_submodule(owner)
        if leaf in parent._parameters or leaf in parent._buffers:
            _move(parent, leaf, index)
        else:
            module_to_accelerator(module.get_submodule(name), index)
    stand_in = {name: device(index) for name, index in device_map.items()}
    return dispatch_model(module, device_map=stand_in, main_device=device(min(device_map.values())))


def on_accelerator(value: torch.Tensor) -> bool:
    return isinstance(value, Accelerated)
