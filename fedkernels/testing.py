"""Checks a user runs on their own penalty before trusting its curves.

:func:`check_regularizer` holds a :class:`~fedkernels.Regularizer` (a built-in, or a subclass with
its own ``prox_`` / ``value``) to what every algorithm assumes of it:

* **the prox minimises** ``step * h(u) + ||u - v||^2 / 2``. A separable penalty (h a sum over
  elements) is held to brute-force 1-D minimisation of that objective on a fine grid, computed from
  ``value`` alone, so the check does not trust the prox it checks; any other penalty is held to
  its objective at random perturbations of the answer, at the input, and at zero;
* **``value``** is a 0-d tensor of the input's dtype, finite where the prox lands;
* **the in-place contract**: ``prox_`` writes into ``x`` and returns it, touches no other tensor;
  ``prox`` leaves its input unchanged and agrees with ``prox_``; step 0 is the identity wherever h
  is finite;
* **``rho``** (0, convex, unless declared): ``h + rho/2 ||.||^2`` is convex on the brute-force grid
  (separable penalties) and along random lines, so a non-convex penalty that declares ``rho = 0``
  (or too small a ``rho``) fails;
* **float32 and float64** both work, float32 close to float64.

Each failure is listed with what is wrong and where (step, dtype, the element and its value)::

    import fedkernels as fk
    from fedkernels.testing import check_regularizer
    check_regularizer(fk.SCAD(0.5, a=3.7), steps=[0.1, 1.0, 2.7, 10.0])   # cover every regime

A check that fails raises :class:`RegularizerCheckError`; one that passes returns a short report.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

__all__ = ["check_regularizer", "RegularizerCheckError"]

GRID_POINTS = 24001  # brute-force grid: spacing (hi - lo) / 24000


class RegularizerCheckError(AssertionError):
    """A penalty broke what the algorithms rely on; ``failures`` lists each broken rule and where."""

    def __init__(self, name: str, failures: list):
        self.failures = failures
        super().__init__(f"{name} failed {len(failures)} check(s):\n" + "\n".join(f"  - {f}" for f in failures))


def check_regularizer(reg, *, steps: Sequence[float] = (0.1, 1.0, 4.0), values: Optional[torch.Tensor] = None,
                      shape: Optional[Sequence[int]] = None, separable: Optional[bool] = None,
                      seed: int = 0) -> str:
    """Check ``reg`` (see the module docstring); raise :class:`RegularizerCheckError` naming every failure.

    Args:
        reg: the penalty, a ``fedkernels.Regularizer``.
        steps: prox steps to check, positive; list one per regime of your prox (for a non-convex
            penalty, steps on both sides of any threshold where its formula changes).
        values: the inputs v (float64, 1-D) for the separable check; default 241 points on [-6, 6].
        shape: the shape of the inputs for the other checks, e.g. ``(8, 5)`` for a penalty on the
            rows of a matrix; default a vector of 64 elements.
        separable: whether h(x) is the sum of h over x's elements; default: detected from ``value``.
        seed: for the random inputs and directions.
    """
    gen = torch.Generator().manual_seed(seed)
    for s in steps:
        if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
            raise ValueError(f"steps must be positive finite numbers, got {s!r}")
    shape = tuple(shape or (64,))
    v = (values if values is not None else torch.linspace(-6, 6, 241, dtype=torch.float64)).to(torch.float64)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    failures: list = []
    name = repr(reg) if type(reg).__repr__ is not object.__repr__ else type(reg).__name__
    _check_value(reg, x, failures)
    if failures:  # nothing else can be judged without a working value
        raise RegularizerCheckError(name, failures)
    if separable is None:
        separable = _looks_separable(reg, x)
    for dtype in (torch.float64, torch.float32):
        _check_in_place(reg, x.to(dtype), steps, failures)
    grid, h = _grid_values(reg, v) if separable else (None, None)
    for s in steps:
        if separable:
            _check_against_brute_force(reg, v, s, grid, h, failures)
        else:
            _check_local_minimum(reg, x, s, gen, failures)
        _check_float32(reg, x, s, failures)
    # Always, rho = 0 included: a penalty that declares itself convex (the default) must be, since
    # the algorithms' step rules (alpha * rho < 1) take the declared value at its word.
    if separable:
        _check_weak_convexity_1d(reg, grid, h, failures)
    _check_weak_convexity(reg, x, gen, failures)
    if failures:
        raise RegularizerCheckError(name, failures)
    kind = "brute-force 1-D minimisation" if separable else "random perturbations"
    return f"{name}: ok at steps {list(steps)} (prox against {kind}; float32 and float64; in place)"


def _value(reg, u: torch.Tensor) -> float:
    return float(reg.value(u))


def _check_value(reg, x, failures) -> None:
    for dtype in (torch.float64, torch.float32):
        try:
            h = reg.value(x.to(dtype))
        except Exception as e:  # the user's code: report, don't crash the check
            failures.append(f"value(x) raised {type(e).__name__}: {e} (dtype {dtype})")
            continue
        if not isinstance(h, torch.Tensor) or h.dim() != 0:
            failures.append(f"value(x) must return a 0-d tensor, got {type(h).__name__} "
                            f"{tuple(h.shape) if isinstance(h, torch.Tensor) else h!r} (dtype {dtype})")
        elif h.dtype != dtype:
            failures.append(f"value(x) returned dtype {h.dtype} for an input of dtype {dtype}")


def _looks_separable(reg, x) -> bool:
    """h(x) == sum_i h(x_i) on a random input (to float64 rounding), when h takes a 1-element input."""
    flat = x.reshape(-1)[:16]
    try:
        whole = _value(reg, flat.clone())
        parts = sum(_value(reg, flat[i:i + 1].clone()) for i in range(flat.numel()))
    except Exception:
        return False
    return math.isfinite(whole) and abs(whole - parts) <= 1e-9 * max(1.0, abs(whole))


def _check_in_place(reg, x, steps, failures) -> None:
    where = f"dtype {x.dtype}"
    for s in (0.0, *steps):
        before = x.clone()
        try:
            out_of_place = reg.prox(x, s)
            unchanged = torch.equal(x, before)
            target = x.clone()
            returned = reg.prox_(target, s)
        except Exception as e:
            failures.append(f"prox raised {type(e).__name__}: {e} (step {s:g}, {where})")
            continue
        if not unchanged:
            failures.append(f"prox(x, {s:g}) changed its input x ({where}): only prox_ works in place")
        if returned is not target:
            failures.append(f"prox_(x, {s:g}) must return x itself, the tensor it was given ({where})")
        if out_of_place.dtype != x.dtype or out_of_place.shape != x.shape:
            failures.append(f"prox(x, {s:g}) returned {out_of_place.dtype} {tuple(out_of_place.shape)} for "
                            f"{x.dtype} {tuple(x.shape)}")
        elif not torch.equal(out_of_place, target):
            i = int((out_of_place != target).reshape(-1).nonzero()[0])
            failures.append(f"prox and prox_ disagree at step {s:g} ({where}), element {i}: "
                            f"{float(out_of_place.reshape(-1)[i])!r} vs {float(target.reshape(-1)[i])!r}")
        if s == 0.0 and math.isfinite(_value(reg, before)) and not torch.equal(target, before):
            failures.append(f"prox_(x, 0) must leave x unchanged where h(x) is finite ({where})")


def _grid_values(reg, v) -> tuple:
    """A fine grid around the inputs and h at each point, from ``value`` of that point alone."""
    lo, hi = float(v.min()) - 2.0, float(v.max()) + 2.0
    grid = torch.linspace(lo, hi, GRID_POINTS, dtype=torch.float64)
    return grid, _elementwise_values(reg, grid)


def _elementwise_values(reg, u) -> torch.Tensor:
    """h of each element alone: one vectorized call where ``value`` is plain torch code, else a loop."""
    try:
        got = torch.func.vmap(reg.value)(u[:, None].clone())
        if got.shape == u.shape:
            return got.to(torch.float64)
    except Exception:  # value uses Python control flow on the data (float(), .item(), bool()): loop
        pass
    return torch.tensor([_value(reg, u[i:i + 1].clone()) for i in range(u.numel())], dtype=torch.float64)


def _check_against_brute_force(reg, v, s, grid, h, failures) -> None:
    """The prox's objective against the grid's minimum: a grid minimum is never below the true
    minimum, so an exact prox is never worse than it, whatever the spacing; the slack is rounding."""
    obj = s * h[None, :] + 0.5 * (grid[None, :] - v[:, None]) ** 2
    best = obj.min(dim=1).values
    got = reg.prox(v.clone(), s)
    obj_got = s * _elementwise_values(reg, got) + 0.5 * (got - v) ** 2
    bad = ~(obj_got <= best + 1e-10 * (1 + best.abs()))
    if bad.any():
        i = int(bad.nonzero()[0])
        u_best = float(grid[obj[i].argmin()])
        failures.append(f"prox at step {s:g} does not minimise step*h(u) + (u - v)^2/2: at v = {float(v[i]):.6g} "
                        f"it returns u = {float(got[i]):.6g} (objective {float(obj_got[i]):.9g}), but "
                        f"u = {u_best:.6g} gives {float(best[i]):.9g} (brute force over {GRID_POINTS} points; "
                        f"{int(bad.sum())} of {v.numel()} inputs)")


def _objective(reg, u, v, s) -> float:
    return s * _value(reg, u) + 0.5 * float(((u - v) ** 2).sum())


def _check_local_minimum(reg, x, s, gen, failures) -> None:
    """For a non-separable h: the answer is no worse than the input, zero, or small moves around it."""
    got = reg.prox(x.clone(), s)
    f_got = _objective(reg, got, x, s)
    tol = 1e-9 * max(1.0, abs(f_got))
    rivals = {"the input v": x, "zero": torch.zeros_like(x)}
    for eps in (1e-1, 1e-2, 1e-3):
        for k in range(8):
            rivals[f"u + {eps:g} * a random direction ({k})"] = got + eps * torch.randn(x.shape, generator=gen,
                                                                                          dtype=x.dtype)
    for label, u in rivals.items():
        f = _objective(reg, u, x, s)
        if f < f_got - tol:
            failures.append(f"prox at step {s:g} does not minimise step*h(u) + ||u - v||^2/2: {label} gives "
                            f"{f:.9g} < {f_got:.9g} at the prox's answer u (input shape {tuple(x.shape)})")
            return


def _check_float32(reg, x, s, failures) -> None:
    want = reg.prox(x.clone(), s)
    got = reg.prox(x.to(torch.float32), s)
    err = (got.to(torch.float64) - want).abs()
    # float32 rounds the input (~6e-8 relative); a threshold may move an element across a kink
    ok = err <= 1e-4 * (1 + want.abs())
    if not ok.all() and ok.float().mean() < 0.95:
        i = int((~ok).reshape(-1).nonzero()[0])
        failures.append(f"float32 prox at step {s:g} differs from float64 at {int((~ok).sum())} elements, e.g. "
                        f"element {i}: {float(got.reshape(-1)[i]):.6g} vs {float(want.reshape(-1)[i]):.6g}")


def _declared(rho: float) -> str:
    if rho == 0:
        return "rho = 0 (declared convex, or rho not set) is wrong"
    return f"rho = {rho:g} is too small"


def _check_weak_convexity_1d(reg, grid, h, failures) -> None:
    """Separable h: h(u) + rho/2 u^2 has no negative second difference on the grid."""
    rho = float(getattr(reg, "rho", 0.0))
    g = h + 0.5 * rho * grid * grid
    second = g[:-2] + g[2:] - 2 * g[1:-1]
    bad = torch.isfinite(second) & (second < -1e-12 * (1 + g[1:-1].abs()))
    if bad.any():
        i = int(bad.nonzero()[0]) + 1
        failures.append(f"{_declared(rho)}: h(u) + rho/2 u^2 is not convex near u = {float(grid[i]):.6g} "
                        f"(second difference {float(second[i - 1]):.3g}; a weakly convex h needs rho at least "
                        f"its largest negative curvature: set the attribute rho)")


def _check_weak_convexity(reg, x, gen, failures) -> None:
    """h + rho/2 ||.||^2 convex: midpoint inequality along random segments."""
    rho = float(getattr(reg, "rho", 0.0))

    def g(u):
        return _value(reg, u) + 0.5 * rho * float((u * u).sum())

    for k in range(32):
        a = torch.randn(x.shape, generator=gen, dtype=torch.float64) * 3
        b = torch.randn(x.shape, generator=gen, dtype=torch.float64) * 3
        ga, gb, gm = g(a), g(b), g((a + b) / 2)
        if not (math.isfinite(ga) and math.isfinite(gb)):
            continue
        if gm > (ga + gb) / 2 + 1e-9 * max(1.0, abs(ga) + abs(gb)):
            failures.append(f"{_declared(rho)}: h + rho/2 ||u||^2 is not convex between two random points "
                            f"(segment {k}: midpoint {gm:.9g} > mean of ends {(ga + gb) / 2:.9g})")
            return
