"""Independent plain-PyTorch references for the tests (written from docs/algorithms.md §2, not from
the C++ sources): penalty values and prox maps in every regime, in float64."""

from __future__ import annotations

import math

import torch


def penalty(kind: str, u: torch.Tensor, p1: float = 0.0, p2: float = 0.0) -> torch.Tensor:
    """Elementwise p(u) (not summed)."""
    t = u.abs()
    if kind == "zero":
        return torch.zeros_like(u)
    if kind == "l1":
        return p1 * t
    if kind == "elastic_net":
        return p1 * t + 0.5 * p2 * u * u
    if kind == "mcp":
        lam, gamma = p1, p2
        return torch.where(t <= gamma * lam, lam * t - t * t / (2 * gamma), torch.full_like(t, gamma * lam**2 / 2))
    if kind == "scad":
        lam, a = p1, p2
        mid = (2 * a * lam * t - t * t - lam**2) / (2 * (a - 1))
        return torch.where(t <= lam, lam * t, torch.where(t <= a * lam, mid, torch.full_like(t, lam**2 * (a + 1) / 2)))
    if kind == "box":
        inside = (u >= p1) & (u <= p2)
        return torch.where(inside, torch.zeros_like(u), torch.full_like(u, math.inf))
    if kind == "nonneg":
        return torch.where(u >= 0, torch.zeros_like(u), torch.full_like(u, math.inf))
    raise ValueError(kind)


def prox(kind: str, v: torch.Tensor, step: float, p1: float = 0.0, p2: float = 0.0) -> torch.Tensor:
    """Closed-form prox_{step p}(v) in every regime, written with torch.where (paper style)."""
    s = step
    t, sg = v.abs(), torch.sign(v)
    if kind == "zero":
        return v.clone()
    if kind == "l1":
        return sg * torch.clamp(t - s * p1, min=0)
    if kind == "elastic_net":
        return sg * torch.clamp(t - s * p1, min=0) / (1 + s * p2)
    if kind == "mcp":
        lam, gamma = p1, p2
        if s < gamma:
            mid = sg * (t - s * lam) / (1 - s / gamma)
            return torch.where(t <= s * lam, torch.zeros_like(v), torch.where(t <= gamma * lam, mid, v))
        return torch.where(t <= lam * math.sqrt(s * gamma), torch.zeros_like(v), v)
    if kind == "scad":
        lam, a = p1, p2
        if s < a - 1:
            soft = sg * (t - s * lam)
            mid = sg * ((a - 1) * t - s * a * lam) / (a - 1 - s)
            return torch.where(
                t <= s * lam, torch.zeros_like(v),
                torch.where(t <= (1 + s) * lam, soft, torch.where(t <= a * lam, mid, v)))
        x1 = torch.clamp(t - s * lam, 0, lam)
        x3 = torch.clamp(t, min=a * lam)
        o1 = s * lam * x1 + 0.5 * (x1 - t) ** 2
        o3 = s * lam**2 * (a + 1) / 2 + 0.5 * (x3 - t) ** 2
        return sg * torch.where(o1 <= o3, x1, x3)
    if kind == "box":
        return torch.clamp(v, p1, p2)
    if kind == "nonneg":
        return torch.clamp(v, min=0)
    raise ValueError(kind)


def brute_force_prox(kind: str, v: torch.Tensor, step: float, p1: float = 0.0, p2: float = 0.0,
                     lo: float = -8.0, hi: float = 8.0):
    """argmin_u step * p(u) + (u - v)^2 / 2 by a two-stage grid search, in float64.

    Stage 1: 16,001 points on [lo, hi]; stage 2: 4,001 points within +-1 coarse cell of the best
    point (spacing 5e-7). Returns (u*, objective at u*, best objective outside +-0.05 of u*),
    the last to tell a well-separated minimizer from a near-tie between two basins.
    """
    v = v.to(torch.float64)
    grid = torch.linspace(lo, hi, 16001, dtype=torch.float64)
    h = (hi - lo) / 16000

    def objective(u, vv):
        return step * penalty(kind, u, p1, p2) + 0.5 * (u - vv) ** 2

    obj = objective(grid[None, :], v[:, None])
    best = obj.argmin(dim=1)
    u0 = grid[best]
    fine = u0[:, None] + torch.linspace(-h, h, 4001, dtype=torch.float64)[None, :]
    fobj = objective(fine, v[:, None])
    fbest = fobj.argmin(dim=1)
    u_star = fine.gather(1, fbest[:, None])[:, 0]
    obj_star = fobj.gather(1, fbest[:, None])[:, 0]
    far = (grid[None, :] - u_star[:, None]).abs() > 0.05
    obj_far = torch.where(far, obj, torch.full_like(obj, math.inf)).min(dim=1).values
    return u_star, obj_star, obj_far


def objective(kind, u, v, step, p1=0.0, p2=0.0):
    u = u.to(torch.float64)
    v = v.to(torch.float64)
    return step * penalty(kind, u, p1, p2) + 0.5 * (u - v) ** 2
