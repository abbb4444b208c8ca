"""SCAD's small-step map (s < a - 1; csrc/math/prox.h, kScadSmall and kScadSmallEdge) against its exact
value, the closed form evaluated in long double on the same input, on every CPU variant and on the CUDA
thread bodies (host emulation), which must also agree bit for bit (issue 40 item 2: the formula was
rewritten for speed, so it is held to error bounds, not to an earlier formula's bits).

The bound (u the unit roundoff, 2^-24 in float32, 2^-53 in float64; c3 = s / (a - 1 - s)):
    |got - exact| <= (3 s + 3) u |exact| + u (s lam + c3 a lam)   one-term thresholds (float64; float32 with c3 a <= 1)
    |got - exact| <= (3 s + 3) u |exact| + u^2 (s lam + c3 a lam) two-term thresholds (float32, c3 a > 1)
the first term from rounding c3, the difference and the FMA, the rest from rounding the thresholds s lam
and a lam to the dtype: once (the soft threshold then is L1's, and for c3 a <= 1 the middle piece is off
by less than an ulp), or to within the rest's own rounding. A float32 kernel that took the one-term
thresholds past c3 a = 1, lost a rest, or rounded the product and the sum apart fails it; a variant that
rounds differently from the others fails the bitwise check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fedkernels as fk
from fedkernels import _C
from fedkernels._backend import KIND_CODES

VARIANTS = _C.cpu_isa_variants().split(",")
LD = np.longdouble
pytestmark = pytest.mark.skipif(np.finfo(LD).nmant < 63, reason="needs an 80-bit long double for the reference")


def _exact(t: np.ndarray, s: float, lam: float, a: float) -> np.ndarray:
    """The prox of |v| = t, t >= 0, in long double from the double parameters (t exact in it)."""
    t = t.astype(LD)
    sl, al, c3 = LD(s) * LD(lam), LD(a) * LD(lam), LD(s) / (LD(a) - 1 - LD(s))
    mid = t - c3 * (al - t)
    return np.where(t <= sl, LD(0), np.where(t <= sl + LD(lam), t - sl, np.where(t <= al, mid, t)))


def _inputs(T, s, lam, a, gen):
    ends = [s * lam, (1 + s) * lam, a * lam]
    near = []
    for e in ends:
        up = down = T(e)
        near.append(up)
        for _ in range(8):
            up, down = np.nextafter(up, T(np.inf)), np.nextafter(down, T(0))
            near += [up, down]
    rand = np.concatenate([gen.uniform(0, 1.3 * a * lam, 3000), np.abs(gen.normal(0, 2 * a * lam, 1000))])
    v = np.concatenate([np.array(near, dtype=T), rand.astype(T), [np.finfo(T).tiny, np.finfo(T).tiny / 4]])
    return np.concatenate([v, -v])


def _params(gen):
    """(s, lam, a): steps across (0, a - 1), a quarter of them with c3 a within 1 % of 1 (where the
    kernels switch), a quarter within 10^-3 .. 10^-9 (relative) of the regime edge a - 1."""
    for i in range(32):
        a = 2.0 + gen.uniform(0.01, 8.0)
        if i % 4 == 0:  # c3 a = r: s = r (a - 1) / (a + r)
            r = gen.uniform(0.99, 1.01)
            s = r * (a - 1.0) / (a + r)
        elif i % 4 == 1:
            s = (a - 1.0) * (1 - 10.0 ** -gen.uniform(3, 9))
        else:
            s = (a - 1.0) * gen.uniform(0.001, 0.999)
        yield s, 10.0 ** gen.uniform(-4, 2), a


def _run(v, s, lam, a, backend):
    x = torch.from_numpy(v)
    if backend == "cuda-emulated":
        with fk.emulate_cuda():
            return fk.raw.prox(x, "scad", s, lam, a).numpy()
    _C.set_cpu_isa(backend)
    try:
        return fk.raw.prox(x, "scad", s, lam, a).numpy()
    finally:
        _C.set_cpu_isa("auto")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scad_small_step_is_within_its_error_bound_and_alike_everywhere(dtype):
    gen = np.random.default_rng(5)
    u = LD(np.finfo(dtype).eps) / 2
    bits = np.uint32 if dtype == np.float32 else np.uint64
    for s, lam, a in _params(gen):
        c3 = s / (a - 1.0 - s)
        one_term = _C.plan_prox(KIND_CODES["scad"], s, lam, a)[0] == 5
        assert one_term == (c3 * a <= 1.0), (s, lam, a)
        v = _inputs(dtype, s, lam, a, gen)
        got = {b: _run(v, s, lam, a, b) for b in VARIANTS + ["cuda-emulated"]}
        first = got[VARIANTS[0]]
        for b, g in got.items():
            bad = np.flatnonzero(g.view(bits) != first.view(bits))
            assert bad.size == 0, (b, VARIANTS[0], s, lam, a, v[bad[:3]], g[bad[:3]], first[bad[:3]])
        exact = _exact(np.abs(v), s, lam, a)
        rest = (LD(s) * LD(lam) + LD(c3) * LD(a) * LD(lam)) * (u if one_term or dtype == np.float64 else u * u)
        tol = (3 * LD(s) + 3) * u * exact + rest
        err = np.abs(np.abs(first).astype(LD) - exact)
        worst = int(np.argmax(err - tol))
        assert err[worst] <= tol[worst], (f"s={s!r} lam={lam!r} a={a!r} ({'one' if one_term else 'two'}-term): "
                                          f"prox({v[worst]!r}) = {first[worst]!r}, exact {exact[worst]!r}")
        assert np.array_equal(np.signbit(first), np.signbit(v))  # the sign of v back, on 0 too


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scad_small_step_special_values(dtype):
    v = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -float("nan")], dtype=dtype)
    for s in (0.5, 2.0):  # one-term and two-term thresholds (a = 3.7)
        for b in VARIANTS + ["cuda-emulated"]:
            got = torch.from_numpy(_run(v.numpy(), s, 1.0, 3.7, b))
            assert torch.equal(got[:4], v[:4]) and torch.equal(torch.signbit(got[:4]), torch.signbit(v[:4])), b
            assert bool(got[4:].isnan().all()), b
