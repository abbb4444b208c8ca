"""The low-overhead path: validated kernel calls without the torch dispatcher.

Every function here checks its arguments exactly like the registered ops (``fedkernels.ops``)
and then calls the compiled kernel directly, skipping ``torch.library`` dispatch (about 25 us per
call) for a few microseconds of Python. Use it in hot loops, e.g. thousands of small client steps
per round; use ``fedkernels.ops`` (or the regularizer objects) where ``torch.compile`` or autograd
tracing must see the call. Results are identical: the ops' implementations are these functions.

Conventions: penalties are named by ``kind`` (``"zero"``, ``"l1"``, ``"elastic_net"``, ``"mcp"``,
``"scad"``, ``"box"``, ``"nonneg"``) with parameters ``p1, p2`` (kappa; l1, l2; lam, gamma;
lam, a; lo, hi) and an effective prox ``step`` >= 0 (``step = 0`` is the identity). A target may
be any contiguous tensor (one flat model) or a 2-D ``[N, d]`` stack; operands marked
"row-broadcast" may be a single ``[d]`` row shared by all N rows.
"""

from __future__ import annotations

import torch

from . import _validate as V
from ._backend import _C, DTYPE_CODES, backend_for
from ._gathered import linear_gathered, linear_gathered_weight_grad
from ._huge_pages import huge_page_copy, huge_page_empty
from .profiling import run_counted

# Bumps autograd's version counter of tensors written here, as torch's own in-place ops do: a
# tensor saved for backward and then changed through fk.raw makes backward() raise instead of
# returning wrong gradients. One call for all written tensors (~1 us); inference tensors have no
# counter and are skipped by torch.
_written = torch._C._increment_version

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
    "linear_gathered",
    "linear_gathered_weight_grad",
    "huge_page_copy",
    "huge_page_empty",
]


def _penalty(kind, step, p1, p2):
    code = V.kind_code(kind)
    p1, p2 = V.prox_params(kind, p1, p2)
    return code, V.nonneg("step", step), p1, p2


def _launch(t: torch.Tensor):
    b, dev, stream = backend_for(t)
    rows, cols = V.extent(t)
    return b, DTYPE_CODES[t.dtype], dev, stream, rows, cols


def _prox_into(x: torch.Tensor, out: torch.Tensor, kind, step, p1, p2) -> None:
    code, step, p1, p2 = _penalty(kind, step, p1, p2)
    b, dt, dev, stream, rows, cols = _launch(out)
    run_counted(rows if code else 0, _C.prox, b, dt, dev, stream, rows, cols, x.data_ptr(), cols, out.data_ptr(), cols,
                code, step, p1, p2)


def prox_(x: torch.Tensor, kind: str, step: float, p1: float = 0.0, p2: float = 0.0) -> torch.Tensor:
    """In place: x <- prox_{step * p}(x). Returns x."""
    V.mutable("x", x)
    _prox_into(x, x, kind, step, p1, p2)
    _written((x,))
    return x


def prox(x: torch.Tensor, kind: str, step: float, p1: float = 0.0, p2: float = 0.0, *,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """Out of place: returns prox_{step * p}(x), written into ``out`` if given (a contiguous
    tensor shaped like x, not overlapping it) or into a new contiguous tensor."""
    V.float_tensor("x", x)
    if out is None:
        x = x.contiguous()
        out = torch.empty_like(x)
    else:
        V.mutable("out", out)
        x, _ = V.operand("x", x, out, "out")
        V.distinct(out=out, x=x)
        _prox_into(x, out, kind, step, p1, p2)
        _written((out,))
        return out
    _prox_into(x, out, kind, step, p1, p2)
    return out


def _box_bounds(out, lo, hi):
    """Checked tensor bounds for a clip written into ``out``: (lo, lo row stride, hi, hi row stride)."""
    lo, ls = V.operand("lo", lo, out, "x", broadcast=True)
    hi, hs = V.operand("hi", hi, out, "x", broadcast=True)
    V.same_or_disjoint("x", out, "lo", lo, "hi", hi)
    return lo, ls, hi, hs


def _box_into(x, out, lo, hi):
    lo, ls, hi, hs = _box_bounds(out, lo, hi)
    b, dt, dev, stream, rows, cols = _launch(out)
    run_counted(rows, _C.box_tensor, b, dt, dev, stream, rows, cols, x.data_ptr(), cols, out.data_ptr(), cols,
                  lo.data_ptr(), ls, hi.data_ptr(), hs)


def box_tensor_(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """In place: x <- clip(x, lo, hi) with tensor bounds (row-broadcast allowed).

    ``lo <= hi`` is not re-checked here (that is a reduction); ``fedkernels.Box`` checks it once.
    """
    V.mutable("x", x)
    _box_into(x, x, lo, hi)
    _written((x,))
    return x


def box_tensor(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    V.float_tensor("x", x)
    x = x.contiguous()
    out = torch.empty_like(x)
    _box_into(x, out, lo, hi)
    return out


def _l2_ball_args(x, radius, center):
    """Every check of ``l2_ball_``: (radius, center, its row stride, whether there is one)."""
    V.mutable("x", x)
    radius = V.nonneg("radius", radius)
    if center is None:
        return radius, x, 0, False
    c, cs = V.operand("center", center, x, "x", broadcast=True)
    V.same_or_disjoint("x", x, "center", c)
    return radius, c, cs, True


def l2_ball_(x: torch.Tensor, radius: float, center: torch.Tensor | None = None) -> torch.Tensor:
    """In place: project x (each row of a 2-D stack) onto {u : ||u - center|| <= radius}.

    Two passes: a row reduction in float64, in one fixed summation order on every backend, thread
    count and CPU variant (so the result is bit-identical everywhere), which also computes each
    row's scale once; then a scale pass that reads it on the device (no host synchronisation). A
    row containing NaN or +-Inf becomes NaN.
    """
    radius, c, cs, has_center = _l2_ball_args(x, radius, center)
    b, dt, dev, stream, rows, cols = _launch(x)
    # One float64 buffer: per-row chunk sums of the reduction, then the per-row factors.
    scratch = torch.empty(_C.l2_ball_scratch_size(rows, cols) + rows, dtype=torch.float64, device=x.device)
    factors = scratch.data_ptr() + (scratch.numel() - rows) * 8
    run_counted(rows, _C.l2_ball, b, dt, dev, stream, rows, cols, x.data_ptr(), cols, c.data_ptr(), cs,
                has_center, scratch.data_ptr(), factors, radius)
    _written((x,))
    return x


GROUPS = ("rows", "cols")


def _group_lasso_layout(x, lam, step, groups, shape, start):
    """Every check of ``group_lasso_``: (lam, step, matrices n, rows R, cols C, row length of x)."""
    V.mutable("x", x)
    lam = V.nonneg("lam", lam)
    step = V.nonneg("step", step)
    if groups not in GROUPS:
        raise ValueError(f"groups must be one of {GROUPS}, got {groups!r}")
    if shape is None:
        if x.dim() not in (2, 3):
            raise ValueError(f"x must be a 2-D [R, C] matrix or a 3-D [N, R, C] stack of matrices, got shape "
                             f"{tuple(x.shape)} (for a matrix inside a flat vector pass shape=(R, C) and start)")
        if isinstance(start, bool) or not isinstance(start, int) or start != 0:
            raise ValueError(f"start must be 0 without shape, got {start!r}")
        n, (R, C) = (1 if x.dim() == 2 else x.shape[0]), tuple(x.shape[-2:])
        block = R * C
    else:
        if (not isinstance(shape, (tuple, list)) or len(shape) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in shape)):
            raise ValueError(f"shape must be a pair (R, C) of ints >= 0, got {shape!r}")
        if x.dim() not in (1, 2):
            raise ValueError(f"with shape, x must be a flat [d] vector or a [N, d] stack, got shape {tuple(x.shape)}")
        R, C = shape
        n, block = V.extent(x)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0 or start + R * C > block:
            raise ValueError(f"start must be an int with 0 <= start and start + R*C <= {block} (the row length of x), "
                             f"got start={start!r} for shape {tuple(shape)}")
    return lam, step, n, R, C, block


def group_lasso_(x: torch.Tensor, lam: float, step: float, groups: str = "rows",
                 shape: tuple[int, int] | None = None, start: int = 0) -> torch.Tensor:
    """Group lasso prox (block soft-thresholding), in place: every group x_g (a row or a column of a
    matrix) becomes x_g * max(0, 1 - step * lam / ||x_g||_2).

    Without ``shape``, x is one [R, C] matrix or a [N, R, C] stack of matrices (each on its own).
    With ``shape=(R, C)``, x is a flat [d] vector or a [N, d] stack of them and the matrix of each
    row is the R*C elements from ``start`` on, row-major: a 2-D parameter inside a flat parameter
    vector or client stack, reached without a copy. ``groups="cols"`` sums each column with stride C
    (no transposed copy; on the CPU 8 neighbouring columns at a time, so rows are read whole) and
    the scale pass runs in row-major order for both ([128, 784] float32, 1 thread: 21 us rows,
    33 us columns).

    Two passes, as ``l2_ball_``: a per-group sum of squares in float64 in the fixed order of every
    backend (bit-identical results everywhere), then a scale pass. A group whose norm is at most
    step * lam (an all-zero group included) becomes exactly 0; a group containing NaN becomes NaN.
    """
    lam, step, n, R, C, block = _group_lasso_layout(x, lam, step, groups, shape, start)
    if n * R * C == 0:
        _written((x,))
        return x
    # groups: rows (n * R of length C) or columns (n * C of length R) of the n matrices
    count, length = (n * R, C) if groups == "rows" else (n * C, R)
    b, dev, stream = backend_for(x)
    scratch = torch.empty(_C.l2_ball_scratch_size(count, length) + count, dtype=torch.float64, device=x.device)
    factors = scratch.data_ptr() + (scratch.numel() - count) * 8
    run_counted(n, _C.group_lasso, b, DTYPE_CODES[x.dtype], dev, stream, n, R, C,
                x.data_ptr() + start * x.element_size(), block, groups == "cols", scratch.data_ptr(), factors,
                step * lam)
    _written((x,))
    return x


def _prox_columns_(x: torch.Tensor, start: int, stop: int, kind, step, p1=0.0, p2=0.0) -> torch.Tensor:
    """In place on columns [start, stop) of every row of the [N, d] stack x: the separable prox of
    ``prox_`` on a strided block (rows d apart), without copying it out (fk.PerParameter)."""
    V.mutable("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be a [N, d] stack, got shape {tuple(x.shape)}")
    rows, d = x.shape
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop <= d):
        raise ValueError(f"need 0 <= start <= stop <= {d}, got start={start!r}, stop={stop!r}")
    code, step, p1, p2 = _penalty(kind, step, p1, p2)
    if code == 0 or rows * (stop - start) == 0:
        return x
    b, dev, stream = backend_for(x)
    ptr = x.data_ptr() + start * x.element_size()
    run_counted(rows, _C.prox, b, DTYPE_CODES[x.dtype], dev, stream, rows, stop - start, ptr, d, ptr, d,
                code, step, p1, p2)
    _written((x,))
    return x


def cv_step_(x: torch.Tensor, g: torch.Tensor, c: torch.Tensor, beta: float) -> torch.Tensor:
    """Control-variate local step, in place: x <- x - beta * (g + c). c may be row-broadcast."""
    V.mutable("x", x)
    g, gs = V.operand("g", g, x, "x", broadcast=True)
    c, cs = V.operand("c", c, x, "x", broadcast=True)
    V.same_or_disjoint("x", x, "g", g, "c", c)
    beta = V.nonneg("beta", beta)
    b, dt, dev, stream, rows, cols = _launch(x)
    _C.cv_step(b, dt, dev, stream, rows, cols, x.data_ptr(), cols, g.data_ptr(), gs, c.data_ptr(), cs, beta)
    _written((x,))
    return x


def _delta_into(out, z, x, beta, K):
    beta = V.positive("beta", beta)
    K = V.positive_int("K", K)
    z, zs = V.operand("z", z, out, "x", broadcast=True)
    V.same_or_disjoint("x", out, "z", z)
    b, dt, dev, stream, rows, cols = _launch(out)
    _C.normalized_delta(b, dt, dev, stream, rows, cols, out.data_ptr(), cols, z.data_ptr(), zs,
                        x.data_ptr(), cols, 1.0 / (beta * K))


def normalized_delta(z: torch.Tensor, x: torch.Tensor, beta: float, K: int) -> torch.Tensor:
    """FedCanon normalized update: returns (z - x) / (beta * K). z may be row-broadcast over x."""
    V.float_tensor("x", x)
    x = x.contiguous()
    out = torch.empty_like(x)
    _delta_into(out, z, x, beta, K)
    return out


def normalized_delta_(x: torch.Tensor, z: torch.Tensor, beta: float, K: int) -> torch.Tensor:
    """In place into the local model: x <- (z - x) / (beta * K). Returns x (now the delta)."""
    V.mutable("x", x)
    _delta_into(x, z, x, beta, K)
    _written((x,))
    return x


def control_update_(c: torch.Tensor, dbar: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Control-variate update, in place: c <- c + dbar - d. dbar may be row-broadcast."""
    V.mutable("c", c)
    dbar, dbs = V.operand("dbar", dbar, c, "c", broadcast=True)
    d, ds = V.operand("d", d, c, "c")
    V.same_or_disjoint("c", c, "dbar", dbar, "d", d)
    b, dt, dev, stream, rows, cols = _launch(c)
    _C.control_update(b, dt, dev, stream, rows, cols, c.data_ptr(), cols, dbar.data_ptr(), dbs, d.data_ptr(), ds)
    _written((c,))
    return c


def prox_grad_step_(x: torch.Tensor, g: torch.Tensor, lr: float, kind: str, step: float,
                    p1: float = 0.0, p2: float = 0.0) -> torch.Tensor:
    """Proximal gradient step, in place: x <- prox_{step * p}(x - lr * g). g may be row-broadcast.

    The FedCanon server step is ``prox_grad_step_(z, dbar, alpha, kind, alpha * kappa, ...)``.
    """
    V.mutable("x", x)
    g, gs = V.operand("g", g, x, "x", broadcast=True)
    V.same_or_disjoint("x", x, "g", g)
    lr = V.nonneg("lr", lr)
    code, step, p1, p2 = _penalty(kind, step, p1, p2)
    b, dt, dev, stream, rows, cols = _launch(x)
    run_counted(rows if code else 0, _C.prox_grad_step, b, dt, dev, stream, rows, cols, x.data_ptr(), cols,
                g.data_ptr(), gs, lr, code, step, p1, p2)
    _written((x,))
    return x


def normal_map_step_(z: torch.Tensor, x: torch.Tensor, g: torch.Tensor, c: torch.Tensor, eta: float,
                     lam: float, kind: str, step: float, p1: float = 0.0,
                     p2: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """FedNMap local step (5b) fused with the next step's prox (5a), in place on z and x:

        z <- z - eta * (g + c + (z - x) / lam);   x <- prox_{step * p}(z)

    ``lam`` is the normal map's prox parameter and ``step`` the effective step of prox_{lam h}:
    ``lam`` for h = p, ``lam * kappa`` for h = kappa * p. c may be row-broadcast.
    """
    V.mutable("z", z)
    V.mutable("x", x)
    V.distinct(z=z, x=x)
    x, _ = V.operand("x", x, z, "z")
    g, gs = V.operand("g", g, z, "z", broadcast=True)
    c, cs = V.operand("c", c, z, "z", broadcast=True)
    V.same_or_disjoint("z", z, "g", g, "c", c)
    V.same_or_disjoint("x", x, "g", g, "c", c)
    eta = V.nonneg("eta", eta)
    lam = V.positive("lam", lam)
    code, step, p1, p2 = _penalty(kind, step, p1, p2)
    b, dt, dev, stream, rows, cols = _launch(z)
    run_counted(rows if code else 0, _C.normal_map_step, b, dt, dev, stream, rows, cols, z.data_ptr(), cols,
                x.data_ptr(), cols, g.data_ptr(), gs, c.data_ptr(), cs, eta, 1.0 / lam, code, step, p1, p2)
    _written((z, x))
    return z, x


def za1_step_(zhat: torch.Tensor, z: torch.Tensor, g: torch.Tensor, c: torch.Tensor, eta: float,
              kind: str, step: float, p1: float = 0.0, p2: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """ZA1 local step, in place: zhat <- zhat - eta * (g + c); z <- prox_{step * p}(zhat).

    ZA1 uses step = (t + 1) * eta at local step t. c may be row-broadcast.
    """
    V.mutable("zhat", zhat)
    V.mutable("z", z)
    V.distinct(zhat=zhat, z=z)
    z, _ = V.operand("z", z, zhat, "zhat")
    g, gs = V.operand("g", g, zhat, "zhat", broadcast=True)
    c, cs = V.operand("c", c, zhat, "zhat", broadcast=True)
    V.same_or_disjoint("zhat", zhat, "g", g, "c", c)
    V.same_or_disjoint("z", z, "g", g, "c", c)
    eta = V.nonneg("eta", eta)
    code, step, p1, p2 = _penalty(kind, step, p1, p2)
    b, dt, dev, stream, rows, cols = _launch(zhat)
    run_counted(rows if code else 0, _C.za1_step, b, dt, dev, stream, rows, cols, zhat.data_ptr(), cols,
                z.data_ptr(), cols, g.data_ptr(), gs, c.data_ptr(), cs, eta, code, step, p1, p2)
    _written((zhat, z))
    return zhat, z


MOMENTUM = ("shb", "snag")


def depositum_step_(x: torch.Tensor, m: torch.Tensor, y: torch.Tensor, alpha: float, beta: float,
                    kind: str, step: float, p1: float = 0.0, p2: float = 0.0, *,
                    momentum: str = "shb", normalized: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """DEPOSITUM momentum + direction + prox (docs/algorithms.md §4.5, eqs. 10-12a before mixing):

        m <- beta * m + w * y          (w = 1 - beta if normalized, else 1; ambiguity A1)
        dir = m (SHB) | beta * m + w * y (SNAG)
        x <- prox_{step * p}(x - alpha * dir)

    In place on x and m; y may be row-broadcast. ``beta`` must lie in [0, 1).
    """
    V.mutable("x", x)
    V.mutable("m", m)
    V.distinct(x=x, m=m)
    m, _ = V.operand("m", m, x, "x")
    y, ys = V.operand("y", y, x, "x", broadcast=True)
    V.same_or_disjoint("x", x, "y", y)
    V.same_or_disjoint("m", m, "y", y)
    alpha = V.nonneg("alpha", alpha)
    beta = V.nonneg("beta", beta)
    if beta >= 1.0:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    if momentum not in MOMENTUM:
        raise ValueError(f"momentum must be one of {MOMENTUM}, got {momentum!r}")
    w = 1.0 - beta if normalized else 1.0
    code, step, p1, p2 = _penalty(kind, step, p1, p2)
    b, dt, dev, stream, rows, cols = _launch(x)
    run_counted(rows if code else 0, _C.depositum_step, b, dt, dev, stream, rows, cols, x.data_ptr(), cols,
                m.data_ptr(), cols, y.data_ptr(), ys, alpha, beta, w, momentum == "snag", code, step, p1, p2)
    _written((x, m))
    return x, m
