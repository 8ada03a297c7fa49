# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""Attention as energy minimisation: the modern Hopfield energy, a gradient-descent minimiser, `EnergyAttention`.

Ramsauer et al., *Hopfield Networks is All You Need* (ICLR 2021, arXiv:2008.02217), Eq. (2): for state
patterns ξ_i (queries) and stored patterns X = (x_1 … x_N) (keys) at inverse temperature β,

    E(ξ) = Σ_i [ −β⁻¹ log Σ_j exp(β x_j·ξ_i) + ½ ‖ξ_i‖² + β⁻¹ log N + ½ M² ],   M = max_j ‖x_j‖.

The last two terms are constants: they make E ≥ ½(‖ξ_i‖ − M)² ≥ 0 per state (the paper's Lemma A1 bounds it by
2M² on the patterns' convex hull) and do not change the gradient

    ∇_{ξ_i} E = ξ_i − Σ_j softmax_j(β x_j·ξ_i) x_j,

so one gradient step of size 1 is ξ_i ← Σ_j softmax_j(β x_j·ξ_i) x_j: softmax attention with keys = values = X
(the paper's update rule, Eq. (3)). With several heads the energy is the sum of one such energy per head
subspace; a boolean mask removes stored patterns from a state's sum (padding, causality), and a state with no
stored pattern left is not part of the system (its terms are zero, so it does not move).

Step-size bound. The Hessian of each term is I − β Cov_p(X) with p = softmax(β X ξ_i) and Cov_p ⪰ 0, so its
largest eigenvalue is at most 1 for every β and X: the gradient of E is "1-smooth from above". The descent
lemma then gives E(ξ − η∇E) ≤ E(ξ) − η(1 − η/2)‖∇E‖², so gradient descent never increases the energy for any
step size 0 < η ≤ 2 (`HOPFIELD_STEP_SIZE_BOUND`); η = 1 is the paper's update (also the concave–convex
procedure). Above 2 the energy can increase (far from the patterns E is ≈ ½‖ξ‖² and η > 2 overshoots).

Projections: `EnergyAttention` descends on the energy of the queries q = W_Q r against the keys K = W_K y, per
head, and maps the final state through the output projection. As in the paper's Hopfield layer (Eq. (10),
V = K W_V), the value projection acts on the retrieved key-space pattern, so it is folded into `o_proj`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .mim import is_integer

# Gradient descent on the Hopfield energy is monotone for every step size in (0, HOPFIELD_STEP_SIZE_BOUND].
HOPFIELD_STEP_SIZE_BOUND = 2.0


def _split_heads(tensor: torch.Tensor, num_heads: int, name: str) -> torch.Tensor:
    """`(B, N, H·d_h)` → `(B, H, N, d_h)`."""
    if tensor.ndim != 3:
        raise ValueError(f"{name} must have shape (batch, length, width); got {tuple(tensor.shape)}.")
    batch, length, width = tensor.shape
    if width % num_heads:
        raise ValueError(f"{name} width {width} is not divisible by num_heads={num_heads}.")
    return tensor.view(batch, length, num_heads, width // num_heads).transpose(1, 2)


def _check_num_heads(num_heads: int) -> int:
    """`num_heads` as an int, or a ValueError naming it."""
    if not is_integer(num_heads) or num_heads < 1:
        raise ValueError(f"num_heads must be an integer >= 1; got {num_heads!r}.")
    return int(num_heads)


def _check_beta(beta: float | torch.Tensor, num_heads: int) -> None:
    """β is a finite number > 0, or a tensor of such: 0-d (one for all heads) or `(num_heads,)` (one per head)."""
    if isinstance(beta, torch.Tensor):
        if beta.dtype == torch.bool or beta.is_complex():
            raise ValueError(f"beta must be a real tensor; got dtype {beta.dtype}.")
        if beta.ndim != 0 and tuple(beta.shape) != (num_heads,):
            raise ValueError(
                f"a beta tensor must be 0-d (one beta for all heads) or of shape (num_heads,) = ({num_heads},) "
                f"(one beta per head); got shape {tuple(beta.shape)}."
            )
        bad = ~(torch.isfinite(beta) & (beta > 0))
        if bool(bad.any()):
            raise ValueError(
                f"beta must be finite and > 0 (inverse temperature); got a tensor holding "
                f"{beta.detach()[bad].flatten()[0].item()!r}."
            )
    elif (
        isinstance(beta, bool)
        or not isinstance(beta, (int, float))
        or not beta > 0
        or not math.isfinite(beta)
    ):
        raise ValueError(f"beta must be a finite number > 0 (inverse temperature); got {beta!r}.")


def _head_beta(beta: float | torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """β broadcastable to `(B, H, N_q)`: a 0-d tensor, or `(H, 1)` for one β per head."""
    beta = torch.as_tensor(beta, dtype=reference.dtype, device=reference.device)
    # (H,) → (H, 1): one β per head, broadcast over the batch in front and the queries behind
    return beta.view(-1, 1) if beta.ndim == 1 else beta


def _bool_mask(
    mask: torch.Tensor, shape: tuple[int, int, int, int], name: str, key_padding: bool
) -> torch.Tensor:
    """`mask` checked and as bool `(B|1, H|1, N_q|1, N_k|1)` for `shape` = (B, H, N_q, N_k).

    Accepted: 4-D `(B, H, N_q, N_k)`, and with `key_padding` also 2-D `(B, N_k)` (a key padding mask); any size
    may be 1 to broadcast; bool (True: the pair interacts) or 0/1 of any dtype (1: the pair interacts). Other ranks
    are refused rather than broadcast, since a 2-D or 3-D mask reads differently depending on which sizes happen to
    coincide ((N_q, N_k) vs (B, N_k), (B, N_q, N_k) vs (H, N_q, N_k)); a float mask holding other values (an
    additive one) is refused because 0 means "attend" in an additive mask and "masked" in a 0/1 one.
    """
    batch, keys = shape[0], shape[3]
    forms = f"4-D (batch, heads, queries, keys) = {shape}"
    if key_padding:
        forms = f"2-D key padding (batch, keys) = ({batch}, {keys}) or " + forms
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, {forms}; got {type(mask).__name__}.")
    # the models' mask check (one wording of the refusal for the models and this module), imported here so that
    # this torch-only module loads transformers and the Hyper-SET model file only on its first masked call
    from .modeling.modeling_hyperset import check_keep_mask

    check_keep_mask(mask, name, read_values=False)  # the dtype, before the shape; the values after it
    expected = (batch, keys) if mask.ndim == 2 and key_padding else shape if mask.ndim == 4 else None
    if expected is None or any(size not in (1, full) for size, full in zip(mask.shape, expected)):
        padding = "" if key_padding else f", a (batch, keys) key padding mask as {name}[:, None, None, :]"
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} is not {forms} (any size may be 1 to broadcast). A "
            f"(queries, keys) mask such as a causal one goes in as {name}[None, None], a (batch, queries, keys) one "
            f"as {name}[:, None]{padding}."
        )
    mask = check_keep_mask(mask, name)
    return mask[:, None, None, :] if mask.ndim == 2 else mask


def _heads_and_mask(
    state: torch.Tensor, stored: torch.Tensor, num_heads: int, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """States and patterns per head `(B, H, N, d_h)`, and the mask as bool `(B|1, H|1, N_q|1, N_k|1)`."""
    xi, patterns = _split_heads(state, num_heads, "state"), _split_heads(stored, num_heads, "stored")
    if xi.shape[0] != patterns.shape[0] or xi.shape[-1] != patterns.shape[-1]:
        raise ValueError(
            f"state {tuple(state.shape)} and stored {tuple(stored.shape)} must share batch size and width."
        )
    if mask is not None:
        shape = (xi.shape[0], num_heads, xi.shape[2], patterns.shape[2])
        mask = _bool_mask(mask, shape, "mask", key_padding=False)
    return xi, patterns, mask


def _scores(
    xi: torch.Tensor, patterns: torch.Tensor, beta: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """β ξ·x `(B, H, N_q, N_k)` with masked pairs at −inf, and which states see at least one pattern.

    A state that sees no pattern gets all-zero scores instead of all −inf (finite logsumexp and softmax, NaN-free
    gradients); the callers zero its terms with the returned `(B, H, N_q)` bool (None: no mask).
    """
    scores = beta[..., None] * (xi @ patterns.transpose(-1, -2))
    if mask is None:
        return scores, None
    present = mask.any(-1).expand(scores.shape[:-1])
    scores = scores.masked_fill(~mask, float("-inf")).masked_fill(~present[..., None], 0.0)
    return scores, present


def _outside_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """A block where an enclosing autocast (bf16 training) is off on `device`, so products run in their inputs'
    dtype; a no-op where autocast is not on (or not available for the device type)."""
    kind = device.type
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()


def hopfield_energy(
    state: torch.Tensor,
    stored: torch.Tensor,
    beta: float | torch.Tensor = 1.0,
    num_heads: int = 1,
    mask: torch.Tensor | None = None,
    constants: bool = True,
) -> torch.Tensor:
    """The modern Hopfield energy E(ξ) per sample, `(B,)` (Ramsauer et al. 2021, Eq. (2); module docstring).

    state: ξ `(B, N_q, H·d_h)`; stored: X `(B, N_k, H·d_h)`; beta: inverse temperature, a finite number > 0 or
    a tensor of them, 0-d or one per head `(H,)`; mask: 4-D `(B, H, N_q, N_k)`, any size may be 1 to broadcast,
    bool (True where state i sees pattern j) or 0/1 of any dtype — other ranks and additive masks are refused,
    a key padding mask `(B, N_k)` goes in as `mask[:, None, None, :]`; constants: include β⁻¹ log N + ½ M²
    (N, M over the patterns each state sees), so that E >= 0.
    """
    num_heads = _check_num_heads(num_heads)
    _check_beta(beta, num_heads)
    with _outside_autocast(state.device):  # an energy is a measurement: in the inputs' dtype, not autocast's
        return _hopfield_energy(state, stored, beta, num_heads, mask, constants)


def _hopfield_energy(
    state: torch.Tensor,
    stored: torch.Tensor,
    beta: float | torch.Tensor,
    num_heads: int,
    mask: torch.Tensor | None,
    constants: bool,
) -> torch.Tensor:
    xi, patterns, mask = _heads_and_mask(state, stored, num_heads, mask)
    beta = _head_beta(beta, xi)
    scores, present = _scores(xi, patterns, beta, mask)
    per_state = -scores.logsumexp(-1) / beta + 0.5 * xi.pow(2).sum(-1)  # (B, H, N_q)
    if constants:
        norms = patterns.pow(2).sum(-1)[:, :, None, :].expand(scores.shape)  # ‖x_j‖² for every pair
        if mask is None:
            count = torch.full_like(per_state, scores.shape[-1])
        else:
            count = mask.expand(scores.shape).sum(-1).to(xi.dtype)
            norms = norms.masked_fill(~mask, 0.0)
        per_state = per_state + count.clamp_min(1).log() / beta + 0.5 * norms.amax(-1)
    if present is not None:
        per_state = per_state * present.to(per_state.dtype)
    return per_state.sum((1, 2))


def hopfield_gradient(
    state: torch.Tensor,
    stored: torch.Tensor,
    beta: float | torch.Tensor = 1.0,
    num_heads: int = 1,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """∇_ξ E in closed form, `(B, N_q, H·d_h)`, and the attention weights softmax(β X ξ) `(B, H, N_q, N_k)`.

    ∇_{ξ_i} E = ξ_i − Σ_j p_ij x_j; a state that sees no pattern has zero gradient (and zero weights). The
    arguments are those of `hopfield_energy`.
    """
    num_heads = _check_num_heads(num_heads)
    _check_beta(beta, num_heads)
    xi, patterns, mask = _heads_and_mask(state, stored, num_heads, mask)
    scores, present = _scores(xi, patterns, _head_beta(beta, xi), mask)
    weights = scores.softmax(-1)
    gradient = xi - weights @ patterns  # (B, H, N_q, d_h)
    if present is not None:
        weights = weights * present[..., None].to(weights.dtype)
        gradient = gradient * present[..., None].to(gradient.dtype)
    batch, heads, length, head_dim = gradient.shape
    return gradient.transpose(1, 2).reshape(batch, length, heads * head_dim), weights  # (B, N_q, H·d_h)


@dataclass
class DescentResult:
    """What `minimize_energy` returns.

    state: the final state; trajectory: `(steps + 1, *state.shape)` every iterate from the initial state on
    (None with `record_trajectory=False`); energies: `(steps + 1, *energy.shape)` the energy at every iterate;
    steps: gradient steps taken; converged: whether the tolerance was reached before `max_steps`.
    """

    state: torch.Tensor
    trajectory: torch.Tensor | None
    energies: torch.Tensor
    steps: int
    converged: bool


def minimize_energy(
    energy_fn: Callable[[torch.Tensor], torch.Tensor],
    initial: torch.Tensor,
    step_size: float = 1.0,
    max_steps: int = 10,
    tolerance: float | None = None,
    record_trajectory: bool = True,
) -> DescentResult:
    """Gradient descent x ← x − η ∇E(x) with `torch.autograd`, usable inside `torch.no_grad()` and
    `torch.inference_mode()` code.

    energy_fn maps a state like `initial` to an energy (a scalar or one per sample; the sum is differentiated,
    so per-sample energies descend independently). Gradients are enabled locally and the iterates are detached:
    nothing is recorded for backpropagation through the descent. Inside `torch.inference_mode()`, where autograd
    cannot be switched back on for tensors made there (the stored patterns, a model's outputs), the gradient comes
    from `torch.func.grad` instead, so energy_fn must then be a function `torch.func` can transform (no in-place
    changes to tensors it did not create). Stops after `max_steps`, or earlier once the
    largest step ‖x_{t+1} − x_t‖ (per sample, over all but the first axis) is at most `tolerance`.
    For the Hopfield energy any 0 < η ≤ 2 is monotone (module docstring); for another energy with an
    L-Lipschitz gradient, η ≤ 2/L.
    """
    # NaN or inf: a step that makes every iterate non-finite, a tolerance no step can meet
    if (
        isinstance(step_size, bool)
        or not isinstance(step_size, (int, float))
        or not math.isfinite(step_size)
        or not step_size > 0
    ):
        raise ValueError(f"step_size must be a finite number > 0; got {step_size!r}.")
    if not is_integer(max_steps) or max_steps < 0:
        raise ValueError(f"max_steps must be an integer >= 0; got {max_steps!r}.")
    max_steps = int(max_steps)
    if tolerance is not None and (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, (int, float))
        or not math.isfinite(tolerance)
        or tolerance < 0
    ):
        raise ValueError(f"tolerance must be None or a finite number >= 0; got {tolerance!r}.")

    def summed(point: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        energy = energy_fn(point)
        return energy.sum(), energy.detach()

    def evaluate(point: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.is_inference_mode_enabled():
            # enable_grad does not reach tensors made in inference mode, and such tensors cannot be saved for
            # backward even with inference mode switched off; torch.func.grad differentiates through them
            gradient, energy = torch.func.grad(summed, has_aux=True)(point)
            return energy, gradient
        with torch.enable_grad():
            point = point.detach().requires_grad_(True)
            total, energy = summed(point)
            (gradient,) = torch.autograd.grad(total, point)
        return energy, gradient

    state = initial.detach()
    energy, gradient = evaluate(state)
    trajectory, energies = [state], [energy]
    converged, steps = False, 0
    while steps < max_steps:
        steps += 1
        new_state = state - step_size * gradient
        change = (  # (B,): the step's length per batch item; a single unbatched state gives one
            (new_state - state).flatten(1).norm(dim=1)
            if state.ndim > 1
            else (new_state - state).norm().reshape(1)
        )
        state = new_state
        energy, gradient = evaluate(state)
        energies.append(energy)
        if record_trajectory:
            trajectory.append(state)
        if tolerance is not None and bool(change.max() <= tolerance):
            converged = True
            break
    return DescentResult(
        state=state,
        trajectory=torch.stack(trajectory) if record_trajectory else None,
        energies=torch.stack(energies),
        steps=steps,
        converged=converged,
    )


class EnergyAttention(nn.Module):
    """Attention as k gradient steps on the multi-head Hopfield energy (Ramsauer et al. 2021).

    The state starts at the queries q = W_Q r and descends ξ ← ξ − η ∇E(ξ) on the energy of the keys
    K = W_K y (y = r for self-attention, the encoder states for cross-attention); the output is
    `o_proj(ξ_k)`. With `num_steps=1, step_size=1` this is exactly multi-head softmax attention
    softmax(β q Kᵀ) V with V = K W_V (W_V folded into `o_proj`, the paper's Eq. (10)); more steps retrieve
    the stored pattern more sharply. β defaults to 1/√d_h, the Transformer's temperature.

    Args:
        hidden_size: width of the inputs r and of the output.
        num_heads: heads H; hidden_size must be divisible by it.
        num_steps: gradient steps k (>= 1).
        step_size: η, in (0, 2] (the monotone range, module docstring).
        beta: inverse temperature, a finite number > 0 or a tensor of them, 0-d (one for all heads) or
            `(num_heads,)` (one per head); None: 1/√d_h. A tensor is kept as a non-persistent buffer (it moves
            and casts with the module, and is not in the state dict), an `nn.Parameter` as a parameter.
        key_value_size: width of the cross-attention inputs y (None: hidden_size).
        bias: biases in the projections.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int = 1,
        num_steps: int = 1,
        step_size: float = 1.0,
        beta: float | torch.Tensor | None = None,
        key_value_size: int | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads), ("num_steps", num_steps)):
            if not is_integer(value) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}.")
        hidden_size, num_heads, num_steps = int(hidden_size), int(num_heads), int(num_steps)
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}.")
        if (
            isinstance(step_size, bool)
            or not isinstance(step_size, (int, float))
            or not 0 < step_size <= HOPFIELD_STEP_SIZE_BOUND
        ):
            raise ValueError(
                f"step_size must be in (0, {HOPFIELD_STEP_SIZE_BOUND}] (larger steps can increase the energy); "
                f"got {step_size!r}."
            )
        self.num_heads, self.num_steps, self.step_size = num_heads, num_steps, float(step_size)
        self.head_dim = hidden_size // num_heads
        beta = 1.0 / math.sqrt(self.head_dim) if beta is None else beta
        _check_beta(beta, num_heads)
        if isinstance(beta, torch.Tensor) and not isinstance(beta, nn.Parameter):
            # a buffer, so β follows the module's `.to()` / `.double()` / `.cuda()` as its weights do; not
            # persistent, as a number β is not: the state dict holds the weights only
            self.register_buffer("beta", beta, persistent=False)
        else:  # a number, or an nn.Parameter (which assignment registers, so β can be learnt)
            self.beta = beta
        key_value_size = hidden_size if key_value_size is None else key_value_size
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.k_proj = nn.Linear(key_value_size, hidden_size, bias=bias)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        num_steps: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the output `(B, N_q, hidden_size)` and the energy trace `(B, k + 1)` (detached).

        attention_mask: bool (True: attend) or 0/1 of any dtype (1: attend), either a key padding mask `(B, N_k)` —
        a 2-D mask is always read as one, also when its shape matches (N_q, N_k) — or 4-D `(B, H, N_q, N_k)`; any
        size may be 1 to broadcast. Other ranks and additive masks are refused. num_steps: overrides k for
        this call.
        """
        steps = self.num_steps if num_steps is None else num_steps
        if not is_integer(steps) or steps < 1:
            raise ValueError(f"num_steps must be an integer >= 1; got {steps!r}.")
        steps = int(steps)
        source = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        for name, tensor in (("hidden_states", hidden_states), ("encoder_hidden_states", source)):
            if tensor.ndim != 3:
                raise ValueError(f"{name} must have shape (batch, length, width); got {tuple(tensor.shape)}.")
        mask = attention_mask
        if mask is not None:
            shape = (hidden_states.shape[0], self.num_heads, hidden_states.shape[1], source.shape[1])
            mask = _bool_mask(mask, shape, "attention_mask", key_padding=True)
        state, keys = self.q_proj(hidden_states), self.k_proj(source)
        # the trace in at least float32 whatever autocast made of the projections (half-precision energies lose
        # the small decreases the trace is there to show)
        precision = torch.promote_types(keys.dtype, torch.float32)
        stored = keys.detach().to(precision)

        def energy(state: torch.Tensor) -> torch.Tensor:
            return hopfield_energy(state.detach().to(precision), stored, self.beta, self.num_heads, mask)

        trace = [energy(state)]
        for _ in range(steps):
            gradient, _ = hopfield_gradient(state, keys, self.beta, self.num_heads, mask)
            state = state - self.step_size * gradient
            trace.append(energy(state))
        return self.o_proj(state), torch.stack(trace, dim=1)


__all__ = [
    "HOPFIELD_STEP_SIZE_BOUND",
    "DescentResult",
    "EnergyAttention",
    "hopfield_energy",
    "hopfield_gradient",
    "minimize_energy",
]
