"""MCP and SCAD at the edge of their regimes (issue 35, defect 11): as the step nears gamma (MCP) or
a - 1 (SCAD), the middle piece's slope gamma / (gamma - s) or s / (a - 1 - s) grows without bound,
and a float32 threshold off by one rounding moved the result by the slope times that rounding (up to
~0.1), and MCP outputs exceeded their inputs. Every result must be within 2 float32 ulps of the
exact prox of the same (float32) input, computed here in float64 from the closed forms of
tests/_reference.py, on every CPU variant and on the CUDA thread bodies (host emulation)."""

import contextlib

import pytest
import torch
from _reference import prox as reference_prox

import fedkernels as fk
from fedkernels import _C

VARIANTS = _C.cpu_isa_variants().split(",")
BACKENDS = [f"cpu-{v}" for v in VARIANTS] + ["cuda-emulated"]


@contextlib.contextmanager
def backend(name):
    if name == "cuda-emulated":
        with fk.emulate_cuda():
            yield
        return
    _C.set_cpu_isa(name[len("cpu-"):])
    try:
        yield
    finally:
        _C.set_cpu_isa("auto")


def _edge_inputs(thresholds, gen):
    """float32 values on both sides of each threshold (its float32 neighbours), and spread across all
    pieces, with both signs."""
    vals = []
    for t in thresholds:
        f = torch.tensor(t, dtype=torch.float32)
        near = [f]
        up, down = f.clone(), f.clone()
        for _ in range(6):
            up = torch.nextafter(up, torch.tensor(float("inf")))
            down = torch.nextafter(down, torch.tensor(0.0))
            near += [up, down]
        vals.append(torch.stack(near))
        vals.append(torch.tensor(t) * (1 + torch.linspace(-0.01, 0.01, 41, dtype=torch.float64)).float())
    top = max(thresholds) * 1.5
    vals.append((torch.rand(400, generator=gen, dtype=torch.float64) * top).float())
    v = torch.cat(vals)
    return torch.cat([v, -v])


# (kind, lam, p2, steps): steps from 2^-6 to 2^-22 of the edge away, below it, at it and just past it
CASES = []
for lam, gamma in ((1.0, 3.0), (0.37, 1.7)):
    steps = [gamma * (1 - 2.0**-k) for k in (6, 12, 16, 20, 22)]
    CASES.append(("mcp", lam, gamma, steps + [gamma, gamma * (1 + 2**-20)]))
for lam, a in ((1.0, 3.7), (0.6, 2.3)):
    am1 = a - 1
    CASES.append(("scad", lam, a, [am1 * (1 - 2.0**-k) for k in (6, 12, 16, 20, 22)] + [am1, am1 * (1 + 2**-20)]))
PARAMS = [pytest.param(k, lam, p2, s, id=f"{k}-{lam}-{p2}-s{s:.9g}") for k, lam, p2, steps in CASES for s in steps]


def _thresholds(kind, lam, p2, s):
    if kind == "mcp":
        return [s * lam, p2 * lam, lam * (s * p2) ** 0.5]
    return [s * lam, (1 + s) * lam, p2 * lam]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("kind,lam,p2,s", PARAMS)
def test_float32_is_within_a_few_ulps_of_the_exact_prox(kind, lam, p2, s, name):
    v = _edge_inputs(_thresholds(kind, lam, p2, s), torch.Generator().manual_seed(7))
    exact = reference_prox(kind, v.double(), s, lam, p2)  # the float32 inputs are exact in float64
    with backend(name):
        got32 = fk.raw.prox(v, kind, s, lam, p2)
        got64 = fk.raw.prox(v.double(), kind, s, lam, p2)
    # float64 kernel: the reference itself (both in double)
    assert (got64 - exact).abs().max() <= 1e-9 * (1 + exact.abs().max())
    # float32 kernel: the exact value rounded, give or take an ulp (2 eps relative: 1 to 2 ulps); 0 exactly
    # where the exact prox is 0
    ulp = torch.finfo(torch.float32).eps
    tol = 2 * ulp * exact.abs() + 1e-38
    err = (got32.double() - exact).abs()
    worst = int(err.sub(tol).argmax())
    assert bool((err <= tol).all()), (f"{name}: prox({v[worst].item()!r}) = {got32[worst].item()!r}, exact "
                                      f"{exact[worst].item()!r}: off by {err[worst].item():.3g}")
    if kind == "mcp":  # the firm / hard threshold never increases |v|
        assert bool((got32.abs() <= v.abs()).all()) and bool((got64.abs() <= v.double().abs()).all())
