"""The registered torch ops (namespace ``fedkernels``), one ``torch.library.custom_op`` each.

Each op is declared once here, with its mutation in the schema (``mutates_args``) and its fake
kernel beside it, so ``torch.library.opcheck`` passes and ``torch.compile(fullgraph=True)`` traces
through without graph breaks. The implementations are the validated functions of
``fedkernels.raw``; the typed wrappers below add defaults and return the mutated tensors.

Calling a registered op costs roughly 25 us of dispatch; ``fedkernels.raw`` has the same
functions without it, for hot loops that need neither compile nor tracing.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import raw
from ._validate import ParameterTypeError, not_tracked

__all__ = [
    "prox_",
    "prox",
    "box_tensor_",
    "box_tensor",
    "l2_ball_",
    "group_lasso_",
    "cv_step_",
    "normalized_delta",
    "normalized_delta_",
    "control_update_",
    "prox_grad_step_",
    "normal_map_step_",
    "za1_step_",
    "depositum_step_",
]

_lib = "fedkernels::"


def _contiguous_like(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# --- prox ---------------------------------------------------------------------------------------


@torch.library.custom_op(_lib + "prox_", mutates_args=("x",))
def _prox_(x: Tensor, kind: str, step: float, p1: float, p2: float) -> None:
    raw.prox_(x, kind, step, p1, p2)


@_prox_.register_fake
def _(x, kind, step, p1, p2):
    return None


@torch.library.custom_op(_lib + "prox", mutates_args=())
def _prox(x: Tensor, kind: str, step: float, p1: float, p2: float) -> Tensor:
    return raw.prox(x, kind, step, p1, p2)


@_prox.register_fake
def _(x, kind, step, p1, p2):
    return _contiguous_like(x)


# The same op with the step as a 0-d tensor: an optimizer's tensor learning rate (what PyTorch
# recommends for compiled optimizers with LR schedulers) reaches the kernel without a float() in the
# traced code, which would break the graph. The kernel reads the value when the op runs.
@torch.library.custom_op(_lib + "prox_tensor_step_", mutates_args=("x",))
def _prox_tensor_step_(x: Tensor, kind: str, step: Tensor, p1: float, p2: float) -> None:
    raw.prox_(x, kind, step, p1, p2)


@_prox_tensor_step_.register_fake
def _(x, kind, step, p1, p2):
    return None


def prox_(x: Tensor, kind: str, step: float, p1: float = 0.0, p2: float = 0.0) -> Tensor:
    """In place: x <- prox_{step * p}(x) for the separable penalty ``kind``. Returns x. ``step`` may
    be a one-element tensor (kept a tensor through ``torch.compile``)."""
    not_tracked("x", x)
    if isinstance(step, Tensor):
        torch.ops.fedkernels.prox_tensor_step_(x, kind, step.reshape(()), p1, p2)
    else:
        torch.ops.fedkernels.prox_(x, kind, step, p1, p2)
    return x


def prox(x: Tensor, kind: str, step: float, p1: float = 0.0, p2: float = 0.0) -> Tensor:
    """Out of place: prox_{step * p}(x) as a new contiguous tensor."""
    return torch.ops.fedkernels.prox(x, kind, step, p1, p2)


# --- derivatives of the out-of-place ops ---------------------------------------------------------
# prox, box_tensor and normalized_delta are differentiable almost everywhere, and their derivatives
# are registered (in-place ops refuse tensors that require grad, see _validate.not_tracked). A
# separable prox is piecewise affine in each element: its derivative is the slope of the piece the
# input falls in (0 where the prox is constant, 1 where it is the identity or a shift), taken from the
# input, or from the output where the prox jumps (MCP past gamma, SCAD past a - 1: which candidate won).
# At the finitely many kinks either one-sided slope is returned.


def _prox_slope(x: Tensor, y: Tensor, kind: str, s: float, p1: float, p2: float) -> Tensor:
    t = x.abs()
    one, zero = torch.ones_like(t), torch.zeros_like(t)
    if kind == "zero":
        return one
    if kind == "l1":
        return (t > s * p1).to(t.dtype)
    if kind == "elastic_net":
        return (t > s * p1).to(t.dtype) / (1 + s * p2)
    if kind == "mcp":
        lam, gamma = p1, p2
        if s >= gamma:  # hard threshold: the identity where the output is not 0
            return (y != 0).to(t.dtype)
        return torch.where(t <= s * lam, zero, torch.where(t < gamma * lam, one * (gamma / (gamma - s)), one))
    if kind == "scad":
        lam, a = p1, p2
        if s >= a - 1:  # the winning candidate: x3 = max(t, a lam) or x1 = clip(t - s lam, 0, lam)
            x3 = y.abs() >= a * lam
            return torch.where(x3, (t > a * lam).to(t.dtype), ((t > s * lam) & (t < (1 + s) * lam)).to(t.dtype))
        mid = (a - 1) / (a - 1 - s)
        return torch.where(t <= s * lam, zero, torch.where(t <= (1 + s) * lam, one,
                                                            torch.where(t < a * lam, one * mid, one)))
    if kind == "box":
        return ((x > p1) & (x < p2)).to(t.dtype)
    if kind == "nonneg":
        return (x > 0).to(t.dtype)
    raise ValueError(f"kind must be one of the separable penalties, got {kind!r}")


def _prox_setup(ctx, inputs, output):
    x, kind, step, p1, p2 = inputs
    ctx.save_for_backward(x, output)
    ctx.args = (kind, float(step), float(p1), float(p2))


def _prox_backward(ctx, grad):
    x, y = ctx.saved_tensors
    slope = _prox_slope(x.detach(), y.detach(), *ctx.args)
    return grad * slope.to(grad.dtype), None, None, None, None


torch.library.register_autograd(_lib + "prox", _prox_backward, setup_context=_prox_setup)


def _unbroadcast(grad: Tensor, like: Tensor) -> Tensor:
    """grad of an operand that was read as one row of a stack (or whole): summed over the rows."""
    return grad.sum(0) if grad.dim() > like.dim() else grad


# --- box with tensor bounds, l2 ball ------------------------------------------------------------


@torch.library.custom_op(_lib + "box_tensor_", mutates_args=("x",))
def _box_tensor_(x: Tensor, lo: Tensor, hi: Tensor) -> None:
    raw.box_tensor_(x, lo, hi)


@_box_tensor_.register_fake
def _(x, lo, hi):
    return None


@torch.library.custom_op(_lib + "box_tensor", mutates_args=())
def _box_tensor(x: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    return raw.box_tensor(x, lo, hi)


@_box_tensor.register_fake
def _(x, lo, hi):
    return _contiguous_like(x)


def _box_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _box_backward(ctx, grad):
    # as torch.clamp: x's gradient where lo <= x <= hi, a bound's where it is the result
    x, lo, hi = ctx.saved_tensors
    inside = (x >= lo) & (x <= hi)
    gx = grad * inside.to(grad.dtype)
    glo = _unbroadcast(grad * (x < lo).to(grad.dtype), lo) if ctx.needs_input_grad[1] else None
    ghi = _unbroadcast(grad * (x > hi).to(grad.dtype), hi) if ctx.needs_input_grad[2] else None
    return gx, glo, ghi


torch.library.register_autograd(_lib + "box_tensor", _box_backward, setup_context=_box_setup)


def box_tensor_(x: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """In place: x <- clip(x, lo, hi) with tensor bounds."""
    not_tracked("x", x)
    torch.ops.fedkernels.box_tensor_(x, lo, hi)
    return x


def box_tensor(x: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    return torch.ops.fedkernels.box_tensor(x, lo, hi)


@torch.library.custom_op(_lib + "l2_ball_", mutates_args=("x",))
def _l2_ball_(x: Tensor, radius: float, center: Optional[Tensor]) -> None:
    raw.l2_ball_(x, radius, center)


@_l2_ball_.register_fake
def _(x, radius, center):
    return None


def l2_ball_(x: Tensor, radius: float, center: Optional[Tensor] = None) -> Tensor:
    """In place: project x (each row of a 2-D stack) onto the ball ||u - center|| <= radius."""
    not_tracked("x", x)
    torch.ops.fedkernels.l2_ball_(x, radius, center)
    return x


def _int(name: str, value):
    """``value`` unchanged, unless a bool: torch.ops turns a bool into the int its schema declares
    (True -> 1) before the raw call could refuse it, so it is refused here, as the raw call does."""
    if isinstance(value, bool):
        raise ParameterTypeError(f"{name} must be an int, got bool", name)
    return value


@torch.library.custom_op(_lib + "group_lasso_", mutates_args=("x",))
def _group_lasso_(x: Tensor, lam: float, step: float, groups: str, shape: Optional[list[int]], start: int) -> None:
    raw.group_lasso_(x, lam, step, groups, None if shape is None else tuple(shape), start)


@_group_lasso_.register_fake
def _(x, lam, step, groups, shape, start):
    return None


def group_lasso_(x: Tensor, lam: float, step: float, groups: str = "rows", shape=None, start: int = 0) -> Tensor:
    """In place: block soft-thresholding of the rows or columns of a matrix (see ``raw.group_lasso_``)."""
    not_tracked("x", x)
    shape = None if shape is None else [_int("shape", v) for v in shape]
    torch.ops.fedkernels.group_lasso_(x, lam, step, groups, shape, _int("start", start))
    return x


# --- fused federated updates --------------------------------------------------------------------


@torch.library.custom_op(_lib + "cv_step_", mutates_args=("x",))
def _cv_step_(x: Tensor, g: Tensor, c: Tensor, beta: float) -> None:
    raw.cv_step_(x, g, c, beta)


@_cv_step_.register_fake
def _(x, g, c, beta):
    return None


def cv_step_(x: Tensor, g: Tensor, c: Tensor, beta: float) -> Tensor:
    """x <- x - beta * (g + c), in place."""
    not_tracked("x", x)
    torch.ops.fedkernels.cv_step_(x, g, c, beta)
    return x


@torch.library.custom_op(_lib + "normalized_delta", mutates_args=())
def _normalized_delta(z: Tensor, x: Tensor, beta: float, K: int) -> Tensor:
    return raw.normalized_delta(z, x, beta, K)


@_normalized_delta.register_fake
def _(z, x, beta, K):
    return _contiguous_like(x)


@torch.library.custom_op(_lib + "normalized_delta_", mutates_args=("x",))
def _normalized_delta_(x: Tensor, z: Tensor, beta: float, K: int) -> None:
    raw.normalized_delta_(x, z, beta, K)


@_normalized_delta_.register_fake
def _(x, z, beta, K):
    return None


def _delta_setup(ctx, inputs, output):
    z, x, beta, K = inputs
    ctx.scale = 1.0 / (float(beta) * int(K))
    ctx.z_dim = z.dim()


def _delta_backward(ctx, grad):
    g = grad * ctx.scale
    gz = g.sum(0) if g.dim() > ctx.z_dim else g
    return gz, -g, None, None


torch.library.register_autograd(_lib + "normalized_delta", _delta_backward, setup_context=_delta_setup)


def normalized_delta(z: Tensor, x: Tensor, beta: float, K: int) -> Tensor:
    """(z - x) / (beta * K), out of place."""
    return torch.ops.fedkernels.normalized_delta(z, x, beta, _int("K", K))


def normalized_delta_(x: Tensor, z: Tensor, beta: float, K: int) -> Tensor:
    """x <- (z - x) / (beta * K), in place."""
    not_tracked("x", x)
    torch.ops.fedkernels.normalized_delta_(x, z, beta, _int("K", K))
    return x


@torch.library.custom_op(_lib + "control_update_", mutates_args=("c",))
def _control_update_(c: Tensor, dbar: Tensor, d: Tensor) -> None:
    raw.control_update_(c, dbar, d)


@_control_update_.register_fake
def _(c, dbar, d):
    return None


def control_update_(c: Tensor, dbar: Tensor, d: Tensor) -> Tensor:
    """c <- c + dbar - d, in place."""
    not_tracked("c", c)
    torch.ops.fedkernels.control_update_(c, dbar, d)
    return c


@torch.library.custom_op(_lib + "prox_grad_step_", mutates_args=("x",))
def _prox_grad_step_(x: Tensor, g: Tensor, lr: float, kind: str, step: float, p1: float, p2: float) -> None:
    raw.prox_grad_step_(x, g, lr, kind, step, p1, p2)


@_prox_grad_step_.register_fake
def _(x, g, lr, kind, step, p1, p2):
    return None


def prox_grad_step_(x: Tensor, g: Tensor, lr: float, kind: str, step: float, p1: float = 0.0,
                    p2: float = 0.0) -> Tensor:
    """x <- prox_{step * p}(x - lr * g), in place."""
    not_tracked("x", x)
    torch.ops.fedkernels.prox_grad_step_(x, g, lr, kind, step, p1, p2)
    return x


@torch.library.custom_op(_lib + "normal_map_step_", mutates_args=("z", "x"))
def _normal_map_step_(z: Tensor, x: Tensor, g: Tensor, c: Tensor, eta: float, lam: float, kind: str,
                      step: float, p1: float, p2: float) -> None:
    raw.normal_map_step_(z, x, g, c, eta, lam, kind, step, p1, p2)


@_normal_map_step_.register_fake
def _(z, x, g, c, eta, lam, kind, step, p1, p2):
    return None


def normal_map_step_(z: Tensor, x: Tensor, g: Tensor, c: Tensor, eta: float, lam: float, kind: str,
                     step: float, p1: float = 0.0, p2: float = 0.0) -> tuple[Tensor, Tensor]:
    """z <- z - eta (g + c + (z - x)/lam); x <- prox_{step * p}(z), in place."""
    not_tracked("z", z)
    not_tracked("x", x)
    torch.ops.fedkernels.normal_map_step_(z, x, g, c, eta, lam, kind, step, p1, p2)
    return z, x


@torch.library.custom_op(_lib + "za1_step_", mutates_args=("zhat", "z"))
def _za1_step_(zhat: Tensor, z: Tensor, g: Tensor, c: Tensor, eta: float, kind: str, step: float,
               p1: float, p2: float) -> None:
    raw.za1_step_(zhat, z, g, c, eta, kind, step, p1, p2)


@_za1_step_.register_fake
def _(zhat, z, g, c, eta, kind, step, p1, p2):
    return None


def za1_step_(zhat: Tensor, z: Tensor, g: Tensor, c: Tensor, eta: float, kind: str, step: float,
              p1: float = 0.0, p2: float = 0.0) -> tuple[Tensor, Tensor]:
    """zhat <- zhat - eta (g + c); z <- prox_{step * p}(zhat), in place."""
    not_tracked("zhat", zhat)
    not_tracked("z", z)
    torch.ops.fedkernels.za1_step_(zhat, z, g, c, eta, kind, step, p1, p2)
    return zhat, z


@torch.library.custom_op(_lib + "depositum_step_", mutates_args=("x", "m"))
def _depositum_step_(x: Tensor, m: Tensor, y: Tensor, alpha: float, beta: float, kind: str,
                     step: float, p1: float, p2: float, momentum: str, normalized: bool) -> None:
    raw.depositum_step_(x, m, y, alpha, beta, kind, step, p1, p2, momentum=momentum, normalized=normalized)


@_depositum_step_.register_fake
def _(x, m, y, alpha, beta, kind, step, p1, p2, momentum, normalized):
    return None


def depositum_step_(x: Tensor, m: Tensor, y: Tensor, alpha: float, beta: float, kind: str, step: float,
                    p1: float = 0.0, p2: float = 0.0, *, momentum: str = "shb",
                    normalized: bool = True) -> tuple[Tensor, Tensor]:
    """DEPOSITUM momentum + direction + prox, in place on x and m (see ``raw.depositum_step_``)."""
    not_tracked("x", x)
    not_tracked("m", m)
    torch.ops.fedkernels.depositum_step_(x, m, y, alpha, beta, kind, step, p1, p2, momentum, normalized)
    return x, m
