"""Small fused steps shared by the algorithm files (one formula each, one place).

Each is one or two calls of the low-overhead kernel path on ``[n, d]`` client stacks or ``[d]``
vectors; per-client state of a partial-participation round is gathered with :func:`rows_` and
written back with :func:`put_rows_`.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch

import fedkernels as fk

from ..clients.state_store import ClientStateStore

__all__ = ["is_zero", "prox_", "prox", "sgd_step_", "load_rows_", "rows_", "put_rows_", "damped_step_", "warn_smooth"]


def is_zero(reg: fk.Regularizer) -> bool:
    """True for h = 0 (its prox is the identity and is skipped); a per-parameter h that penalizes
    no parameter is zero too."""
    return (isinstance(reg, fk.Zero) or (isinstance(reg, fk.Scaled) and (reg.kappa == 0 or is_zero(reg.base)))
            or (isinstance(reg, fk.PerParameter) and not reg.segments))


def prox_(X: torch.Tensor, reg: fk.Regularizer, step: float) -> torch.Tensor:
    """In place ``X <- prox_{step h}(X)`` (each row of a stack); nothing to do for h = 0."""
    if not is_zero(reg):
        fk.fused.prox_(X, reg, step, fast=True)
    return X


def prox(x: torch.Tensor, reg: fk.Regularizer, step: float) -> torch.Tensor:
    """Out of place ``prox_{step h}(x)`` through the low-overhead kernel path."""
    out = x.detach().clone(memory_format=torch.contiguous_format)
    if not is_zero(reg):
        fk.fused.prox_(out, reg, step, fast=True)
    return out


def sgd_step_(X: torch.Tensor, G: torch.Tensor, lr: float) -> torch.Tensor:
    """In place ``X <- X - lr G`` (G may be one [d] row shared by all rows of X)."""
    return fk.raw.prox_grad_step_(X, G, lr, "zero", 0.0)


def load_rows_(X: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Every row of the stack X <- v (a [d] vector), or X <- v for a same-shape v."""
    return X.copy_(v.expand_as(X))


def rows_(T: torch.Tensor, ids: Optional[torch.Tensor], out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The participants' rows of a per-client stack (a gathered copy, into ``out`` if given), or
    T itself under full participation (``ids`` None). A :class:`ClientStateStore` (``simulate``'s
    ``state="ram"|"disk"``) gathers them in one call (all its rows when ``ids`` is None)."""
    if isinstance(T, ClientStateStore):
        return T.gather_(ids, out if out is not None else torch.empty(
            T.rows if ids is None else ids.numel(), T.dim, dtype=T.dtype))
    if ids is None:
        return T
    return torch.index_select(T, 0, ids, out=out) if out is not None else T.index_select(0, ids)


def put_rows_(T: torch.Tensor, ids: Optional[torch.Tensor], V: torch.Tensor) -> torch.Tensor:
    """Write a participant stack V back into rows ``ids`` of T (nothing to do when ids is None:
    V is T). A :class:`ClientStateStore` takes them in one call."""
    if isinstance(T, ClientStateStore):
        T.scatter_(ids, V)
    elif ids is not None:
        T.index_copy_(0, ids, V)
    return T


def damped_step_(X: torch.Tensor, G: torch.Tensor, C: torch.Tensor, lr: float, mu: float) -> torch.Tensor:
    """In place ``X <- X − lr (G + C + mu X)`` = ``(1 − lr mu) X − lr (G + C)``: a gradient step on
    ``f_i(x) + <C, x> + (mu/2)||x||²`` — the proximal-point local solvers of FedDR, FedADMM and
    FedProx, whose anchor term ``mu (x − a)`` is ``mu x + C`` with ``C = −mu a`` (+ duals) fixed
    for the round. Two passes (a scale and the fused control-variate step)."""
    if mu != 0.0:
        X.mul_(1.0 - lr * mu)
    return fk.raw.cv_step_(X, G, C, lr)


def warn_smooth(algorithm: str, reg: fk.Regularizer) -> None:
    """Smooth methods (FedAvg, SCAFFOLD, SCAFFNEW) never apply h; say so when h is not zero."""
    if not is_zero(reg):
        warnings.warn(
            f"{algorithm} is a smooth method: its update ignores the regularizer {reg!r}; "
            f"the metrics still report f + h of its model (docs/algorithms.md §5)",
            UserWarning,
            stacklevel=3,
        )

