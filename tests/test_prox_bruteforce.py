"""Every prox against brute-force 1-D minimisation of step*p(u) + (u - v)^2 / 2 (docs/algorithms.md §2.9),
in every regime the kernels cover, float64 tight and float32 loose; 16-bit storage against the
float32 computation rounded once."""

import functools
import math

import pytest
import torch
from _reference import brute_force_prox, objective

import fedkernels as fk

V = torch.linspace(-6, 6, 601, dtype=torch.float64)

# (kind, p1, p2, steps): steps cover the valid regime, the boundary, and the extension regime.
CASES = []
for kappa in (0.5, 1.3):
    CASES.append(("l1", kappa, 0.0, [0.0, 0.1, 1.0, 2.5]))
for l1, l2 in ((0.5, 0.2), (1.0, 1.0), (0.3, 2.0)):
    CASES.append(("elastic_net", l1, l2, [0.0, 0.1, 1.0, 3.0]))
for lam, gamma in ((1.0, 3.0), (0.7, 1.5), (2.0, 2.0), (0.3, 8.0), (0.5, 1.2)):
    # firm (s < gamma), close to the boundary, exactly at it (hard threshold), and far past it
    CASES.append(("mcp", lam, gamma, [0.0, 0.1, 0.5 * gamma, 0.9 * gamma, gamma, 1.5 * gamma, 4.0 * gamma]))
for lam, a in ((1.0, 3.7), (0.5, 2.2), (1.2, 5.0), (0.4, 10.0), (1.5, 2.5)):
    am1 = a - 1.0
    CASES.append(("scad", lam, a, [0.0, 0.1, 1.0, 0.5 * am1, 0.9 * am1, am1, 1.5 * am1, 3.0 * am1]))
for lo, hi in ((-1.0, 2.0), (-0.25, 0.75), (-3.0, -1.0)):
    CASES.append(("box", lo, hi, [0.0, 1.0]))
CASES.append(("nonneg", 0.0, 0.0, [0.0, 1.0]))
CASES.append(("zero", 0.0, 0.0, [0.0, 1.0]))

PARAMS = [pytest.param(k, p1, p2, s, id=f"{k}-{p1:g}-{p2:g}-s{s:g}") for k, p1, p2, steps in CASES for s in steps]


INDICATORS = ("box", "nonneg")


@functools.lru_cache(maxsize=None)
def _brute(kind, p1, p2, s):
    return brute_force_prox(kind, V, s, p1, p2)


def _check(kind, p1, p2, s, dtype, obj_tol, x_tol):
    x = fk.raw.prox(V.to(dtype), kind, s, p1, p2).to(torch.float64)
    if s == 0.0 and kind not in INDICATORS:
        # step 0 is the identity (FedDA's first local step relies on it); an indicator's prox is
        # the projection for every step, 0 included, so iterates stay feasible.
        assert torch.equal(x, V.to(dtype).to(torch.float64))
        return
    if s == 0.0:
        s = 1.0  # the projection does not depend on the step; check it as such
    u_bf, obj_bf, obj_far = _brute(kind, p1, p2, s)
    vv = V.to(dtype).to(torch.float64)  # the input the kernel actually saw
    obj_cf = objective(kind, x, vv, s, p1, p2)
    # (1) global optimality: never worse than the brute-force minimum
    assert (obj_cf <= obj_bf + obj_tol * (1 + vv.abs() ** 2)).all(), (obj_cf - obj_bf).max()
    # (2) where the minimizer is unique and well separated, the closed form finds it
    separated = obj_far > obj_bf + 1e-3
    err = (x - u_bf).abs()[separated]
    assert err.numel() > 0
    assert err.max() <= x_tol, err.max()


@pytest.mark.parametrize("kind,p1,p2,s", PARAMS)
def test_prox_matches_brute_force_float64(kind, p1, p2, s):
    _check(kind, p1, p2, s, torch.float64, obj_tol=1e-11, x_tol=2e-5)


@pytest.mark.parametrize("kind,p1,p2,s", PARAMS)
def test_prox_matches_brute_force_float32(kind, p1, p2, s):
    _check(kind, p1, p2, s, torch.float32, obj_tol=2e-6, x_tol=2e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind,p1,p2,s", [p for p in PARAMS if p.values[3] > 0][::3])
def test_16bit_is_float32_rounded_once(kind, p1, p2, s, dtype):
    v = (torch.randn(4097) * 3).to(dtype)
    got = fk.raw.prox(v, kind, s, p1, p2)
    want = fk.raw.prox(v.float(), kind, s, p1, p2).to(dtype)
    assert got.dtype == dtype
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_extension_regimes_differ_from_valid_formula_outside_range():
    """Control (§2.9): the valid-regime formula used past its range is wrong; ours is not."""
    v = torch.linspace(-6, 6, 601, dtype=torch.float64)
    lam, gamma, s = 1.0, 3.0, 4.0
    naive_mid = torch.sign(v) * (v.abs() - s * lam) / (1 - s / gamma)
    naive = torch.where(v.abs() <= s * lam, torch.zeros_like(v), torch.where(v.abs() <= gamma * lam, naive_mid, v))
    ours = fk.raw.prox(v, "mcp", s, lam, gamma)
    assert (objective("mcp", ours, v, s, lam, gamma) <= objective("mcp", naive, v, s, lam, gamma) + 1e-12).all()
    assert (ours - naive).abs().max() > 1.0


def test_ties_resolve_to_smaller_magnitude():
    # MCP hard threshold: at |v| = lam*sqrt(s*gamma) both 0 and v minimise; 0 is returned.
    lam, gamma, s = 1.0, 2.0, 8.0
    thr = lam * math.sqrt(s * gamma)
    v = torch.tensor([thr, -thr], dtype=torch.float64)
    assert torch.equal(fk.raw.prox(v, "mcp", s, lam, gamma), torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind,p1,p2,s", [
    ("l1", 0.5, 0, 1.0), ("elastic_net", 0.5, 1.0, 1.0), ("mcp", 1.0, 3.0, 1.0), ("mcp", 1.0, 3.0, 5.0),
    ("scad", 1.0, 3.7, 1.0), ("scad", 1.0, 3.7, 5.0), ("box", -1.0, 2.0, 1.0), ("nonneg", 0, 0, 1.0),
    ("zero", 0, 0, 1.0)])
def test_nan_and_inf_policy(kind, p1, p2, s, dtype):
    """Documented policy: NaN propagates; +-Inf maps to the formula's limit; never a crash."""
    v = torch.tensor([math.nan, math.inf, -math.inf, 0.0, 1.0], dtype=dtype)
    out = fk.raw.prox(v, kind, s, p1, p2)
    assert torch.isnan(out[0])
    if kind == "box":
        assert out[1] == p2 and out[2] == p1
    elif kind == "nonneg":
        assert out[1] == math.inf and out[2] == 0
    else:
        assert out[1] == math.inf and out[2] == -math.inf


def test_degenerate_box_is_a_point():
    v = torch.linspace(-3, 3, 101, dtype=torch.float64)
    assert torch.equal(fk.raw.prox(v, "box", 1.0, 0.5, 0.5), torch.full_like(v, 0.5))
