"""`centers_scope`: HyperBF's centers cache (`cached_centers`) around a stretch of inference forwards (a pipeline
call, an evaluation pass), for any model or wrapper.

A module of its own, importing nothing but torch: the training loops open the scope in every evaluation, which runs
after the process group is up, and importing `transformers.pipelines` there (what `energyformers.pipelines` needs)
would load `torch.distributed.fsdp`, which, imported after `init_process_group`, keeps the group alive past
`destroy_process_group` (its threads then abort the process at exit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def centers_scope(model: nn.Module) -> Iterator[None]:
    """`model.cached_centers()` where the model has it (HyperBF), else nothing: for a stretch of no-grad eval
    forwards in which nothing writes the weights through `.data` (a pipeline call, an evaluation), so what the
    centers give is computed once for all of them instead of at every forward (the outputs are the same). Only this
    thread's no-grad eval forwards inside the block use the cache.

    iMixer's spectrally normalised weights are computed at every forward, here too: that is small next to the
    fixed-point solve, and `torch.nn.utils.parametrize.cached()` would cache them process-wide (every
    parametrized model in every thread: a reload missed, another thread's training step failing).

    A wrapper without `cached_centers` (DDP, `torch.compile`'s, a container of several models) is looked through:
    each outermost module inside it that has one (its scope covers every layer inside it) is scoped."""
    with contextlib.ExitStack() as scopes:
        for owner in _outermost_owners(model):
            scopes.enter_context(owner.cached_centers())
        yield


def _outermost_owners(module: nn.Module) -> list[nn.Module]:
    """`module` if it has `cached_centers`, else the outermost modules inside it that have it. Found by that method,
    not by class: a model loaded as remote code has its own copy of the classes."""
    if hasattr(module, "cached_centers"):
        return [module]
    return [owner for child in module.children() for owner in _outermost_owners(child)]
