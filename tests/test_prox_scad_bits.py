"""SCAD's small-step map (csrc/math/prox.h, kScadSmall) gives the bits of its written formula, step
by step in numpy (issue 40 item 2: the kernel was reordered for speed, not one bit may move):

    u0 = (t - c0) - lo0,  q = min((t - c2) - lo2, 0),  r = max(max(t + c3 q, u0), 0),  sign of v back

with c0 = s lam, c2 = a lam, c3 = s / (a - 1 - s) rounded from double, lo the float32 rests (0 in
float64), every operation rounded to the dtype once (numpy's float32 / float64 arithmetic). Inputs
include ±0, ±Inf, NaN, subnormals and the values around each piece's ends; every CPU variant.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fedkernels as fk
from fedkernels import _C

VARIANTS = _C.cpu_isa_variants().split(",")


def _reference(v: np.ndarray, s: float, lam: float, a: float) -> np.ndarray:
    T = v.dtype.type
    c0, c2, c3 = s * lam, a * lam, s / (a - 1.0 - s)
    lo = (lambda c: T(np.float32(c - float(np.float32(c))))) if T is np.float32 else (lambda c: T(0))
    t = np.abs(v)
    with np.errstate(invalid="ignore", over="ignore"):
        u0 = (t - T(c0)) - lo(c0)
        q = (t - T(c2)) - lo(c2)
        q = np.where(T(0) < q, T(0), q)  # min(q, 0), a NaN q kept
        r = t + T(c3) * q
        r = np.where(u0 > r, u0, r)
        r = np.where(T(0) > r, T(0), r)
    return np.where(np.signbit(v), -r, r).astype(T)


def _inputs(dtype, s, lam, a, gen):
    T = np.float32 if dtype == torch.float32 else np.float64
    ends = [s * lam, (1 + s) * lam, a * lam]
    near = [np.nextafter(T(e), T(d)) for e in ends for d in (0, np.inf)] + [T(e) for e in ends]
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, np.finfo(T).tiny, np.finfo(T).tiny / 4, np.finfo(T).max]
    rand = np.concatenate([gen.normal(0, 2 * a * lam, 4000), gen.uniform(0, 1.2 * a * lam, 4000)])
    v = np.concatenate([np.array(near + special, dtype=T), rand.astype(T)])
    return np.concatenate([v, -v])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scad_small_step_gives_its_formulas_bits(variant, dtype):
    gen = np.random.default_rng(5)
    try:
        _C.set_cpu_isa(variant)
        for _ in range(40):
            a = 2.0 + gen.uniform(0.01, 3.0)
            s = (a - 1.0) * float(gen.choice([gen.uniform(0.01, 0.99), 1 - 10.0 ** -gen.uniform(3, 9)]))
            lam = 10.0 ** gen.uniform(-4, 2)
            v = _inputs(dtype, s, lam, a, gen)
            got = fk.raw.prox(torch.from_numpy(v), "scad", s, lam, a).numpy()
            want = _reference(v, s, lam, a)
            bits = np.uint32 if dtype == torch.float32 else np.uint64
            bad = np.flatnonzero(got.view(bits) != want.view(bits))
            assert bad.size == 0, (variant, s, lam, a, v[bad[:5]], got[bad[:5]], want[bad[:5]])
    finally:
        _C.set_cpu_isa("auto")
