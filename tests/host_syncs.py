"""Host-device synchronisations a CUDA run would make, found on CPU with `device_proxy`'s stand-in device.

`counting_host_syncs()` is `device_proxy.accelerator()` plus a record of every point where a CUDA run would wait for
the device or copy through pageable host memory:

* a device value read on the host: `.item()`, `bool()`, `int()`, `float()` (`aten._local_scalar_dense`), `.tolist()`,
  `torch.equal`;
* an output whose shape depends on device values: `nonzero`, boolean-mask indexing and assignment, `masked_select`,
  `unique`, `repeat_interleave` without an output size;
* a host→device copy of a host tensor: `torch.tensor(data, device=)` / `torch.as_tensor(data, device=)`,
  `.to(device)` of a CPU tensor, `device_tensor.copy_(cpu_tensor)`, indexing with CPU indices (moved to the device
  first); and a device→host copy (`.cpu()`).

A 0-dim CPU tensor beside device tensors is no sync (CUDA passes it as a kernel argument), nor is a factory on the
device (`torch.zeros(..., device=)`, `torch.full((), value, device=)`). What the stand-in cannot see (its docstring):
branches taken only on `device.type == "cuda"`, compiled code, and the kernels themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from device_proxy import STAND_IN, Accelerated, accelerator, on_accelerator
from fixtures import DispatchedOps
from torch.utils._pytree import tree_flatten

_aten = torch.ops.aten
# ops that read a device value on the host, or whose output shape depends on device values
_READS = {
    _aten._local_scalar_dense.default: "item/bool/int/float",
    _aten.nonzero.default: "nonzero",
    _aten.masked_select.default: "masked_select",
    _aten._unique2.default: "unique",
    _aten.unique_dim.default: "unique",
    _aten.unique_consecutive.default: "unique",
    _aten.repeat_interleave.Tensor: "repeat_interleave",
    _aten.equal.default: "equal",
}
_INDEXING = {
    _aten.index.Tensor,
    _aten.index_put.default,
    _aten.index_put_.default,
    _aten._index_put_impl_.default,
}
_ROOT = Path(__file__).resolve().parents[1]
_PACKAGE_DIRS = tuple(
    str(_ROOT / name) for name in ("modeling", "energyformers", "configuration", "training")
)


@dataclasses.dataclass(frozen=True)
class Sync:
    kind: str
    where: str  # the innermost package frames, `file:line` ← caller

    def __str__(self) -> str:
        return f"{self.kind} at {self.where}"


def _call_site() -> str:
    frames = [f for f in traceback.extract_stack() if f.filename.startswith(_PACKAGE_DIRS)]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} ({f.name})" for f in frames[-2:][::-1]) or "?"


def _boolean_index(indices: Any) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _host_index(indices: Any) -> bool:
    return any(isinstance(i, torch.Tensor) and not on_accelerator(i) for i in indices or ())


class HostSyncs(DispatchedOps):
    """The syncs seen (`found`), and every aten op seen (`DispatchedOps`: `ops` shows that the probe saw the
    backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[Sync] = []

    def record(self, kind: str) -> None:
        self.found.append(Sync(kind, _call_site()))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        on_device = any(
            on_accelerator(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        )
        device = kwargs.get("device")
        if on_device and func in _READS:
            self.record(_READS[func])
        elif on_device and func in _INDEXING and _boolean_index(args[1]):
            self.record("boolean-mask indexing")
        elif on_device and func in _INDEXING and _host_index(args[1]):
            self.record("host-to-device copy (CPU index)")  # indexing moves CPU indices to the device first
        elif func is _aten._to_copy.default and device is not None:
            source_on_device, target = on_accelerator(args[0]), torch.device(device)
            if target == STAND_IN and not source_on_device:
                self.record("host-to-device copy")
            elif target.type == "cpu" and source_on_device:
                self.record("device-to-host copy")
        elif func is _aten.copy_.default and on_accelerator(args[0]) != on_accelerator(args[1]):
            self.record("host-to-device copy" if on_accelerator(args[0]) else "device-to-host copy")
        return super().__torch_dispatch__(func, types, args, kwargs)


@contextlib.contextmanager
def counting_host_syncs() -> Iterator[HostSyncs]:
    """`device_proxy.accelerator()` with the syncs of the block recorded in the `HostSyncs` it yields."""
    probe = HostSyncs()
    with accelerator():
        # the stand-in's `torch.tensor` / `torch.as_tensor` and `tolist` run below the dispatcher: wrapped here
        factories, tolist = (torch.tensor, torch.as_tensor), Accelerated.tolist

        def copying(factory: Any) -> Any:
            def create(data: Any, *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
                if device is not None and torch.device(device) == STAND_IN and not on_accelerator(data):
                    probe.record("host-to-device copy (torch.tensor(data, device=))")
                return factory(data, *args, device=device, **kwargs)

            return create

        def reading(tensor: Accelerated) -> Any:
            probe.record("tolist")
            return tolist(tensor)

        torch.tensor, torch.as_tensor = (copying(factory) for factory in factories)
        Accelerated.tolist = reading  # type: ignore[method-assign]
        try:
            with probe:
                yield probe
        finally:
            torch.tensor, torch.as_tensor = factories
            Accelerated.tolist = tolist  # type: ignore[method-assign]
