"""SCAD past s = a - 1 picks one of two candidates per element, x1 = clip(t - s lam, 0, lam) up to a
tie point t* and x3 = max(t, a lam) above it; csrc/math/prox.h plans t* once per call (the largest
float32 / float64 value whose x1 objective is not above x3's). Here t* is found independently, in
exact rational arithmetic over the dtype's values, and the kernel must pick x1 at it and x3 at the
next value up (either one at an exact tie), for parameters on both sides of s = a + 1, where the
closed form the planner starts its search from changes."""

import math
import struct
from fractions import Fraction

import pytest
import torch

import fedkernels as fk

# (lam, a, s) with s >= a - 1: at the edge, between a - 1 and a + 1, past a + 1, far past it
CASES = [(1.0, 3.7, 2.7), (1.0, 3.7, 3.0), (0.6, 2.3, 1.3 * (1 + 2**-20)), (0.37, 3.0, 2.5), (0.37, 3.0, 3.9),
         (1e-3, 3.7, 5.0), (2.0, 2.5, 10.0), (0.05, 4.0, 4.9), (0.05, 4.0, 5.1), (1.7, 2.1, 1e4), (3e-5, 2.2, 1.2)]
FORMATS = {torch.float32: ("<f", "<I", 0x7F7FFFFF), torch.float64: ("<d", "<Q", 0x7FEFFFFFFFFFFFFF)}


def _gap(t: Fraction, s: Fraction, lam: Fraction, a: Fraction) -> Fraction:
    """[s p(x1) + (x1 - t)^2 / 2] - [s p(x3) + (x3 - t)^2 / 2], exactly (p(x1) = lam x1 as x1 <= lam)."""
    x1 = min(max(t - s * lam, Fraction(0)), lam)
    x3 = max(t, a * lam)
    return (s * lam * x1 + (x1 - t) ** 2 / 2) - (s * lam * lam * (a + 1) / 2 + (x3 - t) ** 2 / 2)


def _exact_tie(dtype, s, lam, a):
    """The largest finite dtype value t >= 0 with gap(t) <= 0 (bisection over the ordered bit patterns)."""
    ffmt, ifmt, top = FORMATS[dtype]
    value = lambda bits: struct.unpack(ffmt, struct.pack(ifmt, bits))[0]  # noqa: E731
    fs, fl, fa = Fraction(s), Fraction(lam), Fraction(a)
    rises = lambda bits: _gap(Fraction(value(bits)), fs, fl, fa) > 0  # noqa: E731
    assert not rises(0) and rises(top)
    lo, hi = 0, top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if rises(mid) else (mid, hi)
    return value(lo), value(hi), _gap(Fraction(value(lo)), fs, fl, fa) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("lam,a,s", CASES)
def test_large_step_scad_switches_candidates_exactly_at_the_tie(lam, a, s, dtype):
    last_x1, first_x3, exact_tie = _exact_tie(dtype, s, lam, a)
    v = torch.tensor([last_x1, first_x3, -last_x1, -first_x3], dtype=dtype)
    out = fk.raw.prox(v, "scad", s, lam, a).abs().double()
    picks_x1 = out <= lam * (1 + 1e-6)  # x1 <= lam < a lam <= x3
    assert bool(picks_x1[[1, 3]].logical_not().all()), f"x1 above the tie {last_x1!r}: {out.tolist()}"
    if not exact_tie:
        assert bool(picks_x1[[0, 2]].all()), f"x3 at {last_x1!r}, below the tie: {out.tolist()}"
    # and each candidate is itself right: x3 = t above a lam, x1 = clip(t - s lam, 0, lam)
    assert out[1].item() == first_x3
    x1 = min(max(last_x1 - s * lam, 0.0), lam)
    assert math.isclose(out[0].item(), x1, rel_tol=4 * torch.finfo(dtype).eps, abs_tol=1e-300) or not picks_x1[0]
