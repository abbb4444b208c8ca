"""Fused federated updates that take a Regularizer (what the algorithms call).

Each function runs one fused kernel when the regularizer is separable with scalar parameters
(``reg.spec(step)`` is not None); otherwise (tensor box bounds, l2 ball, group lasso, per-parameter
penalties) it runs the same kernel with the identity prox and then ``reg.prox_`` on the result,
which gives the same values.

Every argument is checked before anything is written, in one place (``_plan``): the update's own
arguments by the kernel's entry point, which checks them all before it launches, and, for the
two-pass form, the prox's by ``reg.check_prox_`` before the update runs. A rejected call leaves
every buffer as it was.

``fast=True`` takes the low-overhead path (``fedkernels.raw``), ``fast=False`` the registered
torch ops (``fedkernels.ops``), which ``torch.compile`` can trace.
"""

from __future__ import annotations

import torch

from . import ops, raw
from .regularizers import Regularizer

__all__ = ["prox_", "prox_grad_step_", "normal_map_step_", "za1_step_", "depositum_step_"]


def _impl(fast: bool):
    return raw if fast else ops


def _check_reg(reg) -> Regularizer:
    if not isinstance(reg, Regularizer):
        raise TypeError(f"reg must be a fedkernels Regularizer (e.g. fk.L1(0.1)), got {type(reg).__name__}")
    return reg


def _plan(reg, x: torch.Tensor, step):
    """The single-kernel form ``(kind, step, p1, p2)`` of prox_{step reg} on x, or None for the
    two-pass form, whose prox arguments are then checked here, before the update writes anything."""
    spec = _check_reg(reg).spec(step)
    if spec is None:
        reg.check_prox_(x, step)
    return spec


def prox_(x: torch.Tensor, reg: Regularizer, step: float, *, fast: bool = False) -> torch.Tensor:
    """x <- prox_{step h}(x), in place."""
    spec = _plan(reg, x, step)
    if spec is None:
        return reg.prox_(x, step, fast=fast)
    if spec[0] == "zero":  # identity: skip the pass over memory (after the checks of every prox)
        reg.check_prox_(x, step)
        return x
    return _impl(fast).prox_(x, *spec)


def prox_grad_step_(x: torch.Tensor, g: torch.Tensor, lr: float, reg: Regularizer, step: float, *,
                    fast: bool = False) -> torch.Tensor:
    """x <- prox_{step h}(x - lr g), in place."""
    spec = _plan(reg, x, step)
    if spec is None:
        _impl(fast).prox_grad_step_(x, g, lr, "zero", 0.0)
        return reg.prox_(x, step, fast=fast)
    return _impl(fast).prox_grad_step_(x, g, lr, *spec)


def normal_map_step_(z: torch.Tensor, x: torch.Tensor, g: torch.Tensor, c: torch.Tensor, eta: float,
                     lam: float, reg: Regularizer, *, fast: bool = False):
    """z <- z - eta (g + c + (z - x)/lam); x <- prox_{lam h}(z), in place."""
    spec = _plan(reg, x, lam)
    if spec is None:
        _impl(fast).normal_map_step_(z, x, g, c, eta, lam, "zero", 0.0)
        reg.prox_(x, lam, fast=fast)
        return z, x
    return _impl(fast).normal_map_step_(z, x, g, c, eta, lam, *spec)


def za1_step_(zhat: torch.Tensor, z: torch.Tensor, g: torch.Tensor, c: torch.Tensor, eta: float,
              reg: Regularizer, step: float, *, fast: bool = False):
    """zhat <- zhat - eta (g + c); z <- prox_{step h}(zhat), in place."""
    spec = _plan(reg, z, step)
    if spec is None:
        _impl(fast).za1_step_(zhat, z, g, c, eta, "zero", 0.0)
        reg.prox_(z, step, fast=fast)
        return zhat, z
    return _impl(fast).za1_step_(zhat, z, g, c, eta, *spec)


def depositum_step_(x: torch.Tensor, m: torch.Tensor, y: torch.Tensor, alpha: float, beta: float,
                    reg: Regularizer, step: float, *, momentum: str = "shb", normalized: bool = True,
                    fast: bool = False):
    """DEPOSITUM momentum + direction + prox_{step h}, in place on x and m."""
    spec = _plan(reg, x, step)
    if spec is None:
        _impl(fast).depositum_step_(x, m, y, alpha, beta, "zero", 0.0, momentum=momentum, normalized=normalized)
        reg.prox_(x, step, fast=fast)
        return x, m
    return _impl(fast).depositum_step_(x, m, y, alpha, beta, *spec, momentum=momentum, normalized=normalized)
