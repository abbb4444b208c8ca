"""GroupLasso (block soft-thresholding over the rows or columns of a matrix): the kernel against
the closed form written in plain torch and against the optimality condition of the prox, on
matrices, stacks of matrices and matrices inside flat vectors / client stacks; the CUDA thread
bodies (host emulation) and every CPU variant against the CPU backend, bit for bit."""

import pytest
import torch

import fedkernels as fk
from fedkernels._backend import _C

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def closed_form(X: torch.Tensor, t: float, groups: str) -> torch.Tensor:
    """prox of t * sum_g ||X_g||, plain torch, in float64: X_g * max(0, 1 - t / ||X_g||)."""
    X = X.double()
    dim = -1 if groups == "rows" else -2
    norm = X.norm(dim=dim, keepdim=True)
    scale = torch.where(norm > t, 1 - t / torch.where(norm > 0, norm, torch.ones_like(norm)), torch.zeros_like(norm))
    return X * scale


def rnd(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("groups", ["rows", "cols"])
@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (7, 5), (3, 300), (300, 3), (4, 5, 6), (2, 1, 9000)])
@pytest.mark.parametrize("fast", [True, False])
def test_matches_closed_form(shape, groups, dtype, fast):
    X = rnd(*shape, dtype=dtype)
    lam, step = 0.7, 1.3
    # a threshold between the smallest and largest group norms, so some groups vanish and some shrink
    t = float(X.double().norm(dim=-1 if groups == "rows" else -2).median())
    lam = t / step
    want = closed_form(X, step * lam, groups)
    got = X.clone()
    (fk.raw if fast else fk.ops).group_lasso_(got, lam, step, groups)
    torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("groups", ["rows", "cols"])
def test_optimality_condition(groups, dtype):
    """0 ∈ (p - x)/step + lam ∂||p_g||: p_g = x_g - step lam p_g/||p_g|| where p_g != 0, and
    ||x_g|| <= step lam where p_g = 0."""
    scale = torch.tensor([0.1, 2.0] * 5, dtype=torch.float64)[:9, None] if groups == "rows" else \
        torch.tensor([0.1, 2.0] * 6, dtype=torch.float64)[None, :11]
    X = (rnd(9, 11, seed=3) * scale).to(dtype)  # small groups vanish, large ones shrink
    lam, step = 0.9, 2.0
    P = X.clone()
    fk.GroupLasso(lam, groups).prox_(P, step)
    dim = -1 if groups == "rows" else -2
    Xd, Pd = X.double(), P.double()
    pn = Pd.norm(dim=dim, keepdim=True)
    xn = Xd.norm(dim=dim, keepdim=True)
    zero = (pn == 0).expand_as(Pd)
    resid = (Pd - Xd) / step + lam * Pd / torch.where(pn > 0, pn, torch.ones_like(pn))
    assert resid[~zero].abs().max() < 10 * TOL[dtype] * (1 + Xd.abs().max())
    assert bool((xn[pn == 0] <= step * lam * (1 + TOL[dtype])).all())
    assert 0 < int((pn == 0).sum()) < pn.numel()  # both cases occur


def test_zero_groups_threshold_ties_and_identity():
    X = torch.tensor([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]], dtype=torch.float64)
    P = X.clone()
    fk.raw.group_lasso_(P, 2.5, 2.0, "rows")  # threshold 5 = ||row 1|| exactly
    assert torch.equal(P[0], torch.zeros(2, dtype=torch.float64))  # a zero group stays 0 (no NaN)
    assert torch.equal(P[1], torch.zeros(2, dtype=torch.float64))  # at the threshold: exactly 0
    torch.testing.assert_close(P[2], X[2] * 0.5)
    Q = X.clone()
    fk.raw.group_lasso_(Q, 2.5, 0.0, "cols")  # step 0: the identity
    assert torch.equal(Q, X)
    just_above = torch.tensor([[3.0, 4.0 + 1e-9]], dtype=torch.float64)
    fk.raw.group_lasso_(just_above, 2.5, 2.0, "rows")
    assert bool((just_above != 0).all())


def test_nan_group_becomes_nan_others_unaffected():
    X = rnd(4, 6)
    X[1, 2] = float("nan")
    P = X.clone()
    fk.raw.group_lasso_(P, 0.1, 1.0, "rows")
    assert bool(torch.isnan(P[1]).all())
    rest = [0, 2, 3]
    torch.testing.assert_close(P[rest], closed_form(X[rest], 0.1, "rows"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("groups", ["rows", "cols"])
def test_matrix_inside_flat_vector_and_client_stack(groups, dtype):
    """shape=(R, C), start: the matrix inside each row of a [d] vector / [N, d] stack; nothing
    outside it changes."""
    R, C, start, d = 4, 6, 5, 40
    for x in (rnd(d, dtype=dtype), rnd(3, d, dtype=dtype)):
        got = x.clone()
        fk.raw.group_lasso_(got, 0.4, 2.0, groups, shape=(R, C), start=start)
        block = x[..., start:start + R * C].reshape(*x.shape[:-1], R, C)
        want = closed_form(block, 0.8, groups).reshape(*x.shape[:-1], R * C)
        torch.testing.assert_close(got[..., start:start + R * C].double(), want, rtol=TOL[dtype], atol=TOL[dtype])
        assert torch.equal(got[..., :start], x[..., :start])
        assert torch.equal(got[..., start + R * C:], x[..., start + R * C:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("groups", ["rows", "cols"])
@pytest.mark.parametrize("grid", [(3, 2, 32), (1, 1, 7)])
def test_cuda_emulation_bitwise(groups, grid, dtype):
    cases = [(rnd(5, 129, dtype=dtype), {}), (rnd(2, 9000, 3, dtype=dtype), {}),
             (rnd(3, 50, dtype=dtype), {"shape": (4, 10), "start": 7})]
    for x, where in cases:
        cpu, emu = x.clone(), x.clone()
        fk.raw.group_lasso_(cpu, 0.3, 1.0, groups, **where)
        with fk.emulate_cuda(*grid):
            fk.raw.group_lasso_(emu, 0.3, 1.0, groups, **where)
        assert torch.equal(cpu.contiguous().view(torch.uint8), emu.contiguous().view(torch.uint8))


def test_same_bits_for_every_cpu_variant_and_thread_count():
    x = rnd(3, 700, 40, dtype=torch.float32)  # > 2^15 elements: the parallel path
    ref = x.clone()
    fk.raw.group_lasso_(ref, 0.05, 1.0, "cols")
    threads = fk.get_num_threads()
    try:
        for isa in _C.cpu_isa_variants().split(","):
            for n in (1, 2, 3):
                _C.set_cpu_isa(isa)
                fk.set_num_threads(n)
                got = x.clone()
                fk.raw.group_lasso_(got, 0.05, 1.0, "cols")
                assert torch.equal(got.view(torch.int32), ref.view(torch.int32)), (isa, n)
    finally:
        _C.set_cpu_isa("auto")
        fk.set_num_threads(threads)


def test_regularizer_value_prox_and_repr():
    reg = fk.GroupLasso(0.5, groups="cols")
    X = rnd(4, 3)
    assert reg.rho == 0.0
    torch.testing.assert_close(reg.value(X), 0.5 * X.norm(dim=0).sum())
    S = rnd(2, 4, 3)
    torch.testing.assert_close(reg.value(S), 0.5 * S.norm(dim=1).sum())
    out = reg.prox(X, 1.0)
    torch.testing.assert_close(out, closed_form(X, 0.5, "cols"))
    assert torch.equal(reg.prox(X, 1.0, fast=True), out)
    X2 = X.clone()
    assert reg.prox_(X2, 1.0) is X2 and torch.equal(X2, out)
    torch.testing.assert_close((2 * reg).prox(X, 1.0), closed_form(X, 1.0, "cols"))  # scaling: step * kappa
    assert repr(reg) == "GroupLasso(lam=0.5, groups='cols')"


@pytest.mark.parametrize("call,match", [
    (lambda x: fk.raw.group_lasso_(x.reshape(-1), 0.1, 1.0), "2-D"),
    (lambda x: fk.raw.group_lasso_(x, 0.1, 1.0, "diagonals"), "groups"),
    (lambda x: fk.raw.group_lasso_(x, -0.1, 1.0), "lam"),
    (lambda x: fk.raw.group_lasso_(x, 0.1, -1.0), "step"),
    (lambda x: fk.raw.group_lasso_(x.t(), 0.1, 1.0), "contiguous"),
    (lambda x: fk.raw.group_lasso_(x.reshape(-1), 0.1, 1.0, shape=(4, 5), start=1), "start"),
    (lambda x: fk.raw.group_lasso_(x.reshape(-1), 0.1, 1.0, shape=(4,)), "shape"),
    (lambda x: fk.GroupLasso(0.1, "diag"), "groups"),
    (lambda x: fk.GroupLasso(-1.0), "lam"),
])
def test_bad_input_raises_before_writing(call, match):
    x = rnd(4, 5)
    before = x.clone()
    with pytest.raises(ValueError, match=match):
        call(x)
    assert torch.equal(x, before)
