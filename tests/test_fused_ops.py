"""Every fused op against a plain-PyTorch composition written here (reference prox from
_reference.py), on 1-D buffers and [N, d] stacks with row-broadcast operands, every dtype."""

import pytest
import torch
from _reference import prox as ref_prox

import fedkernels as fk

PENALTIES = [
    ("zero", 0.0, 0.0), ("l1", 0.3, 0.0), ("elastic_net", 0.3, 0.5), ("mcp", 0.5, 1.5),
    ("scad", 0.5, 3.7), ("box", -0.5, 0.7), ("nonneg", 0.0, 0.0),
]
# steps in the valid regime and, for MCP/SCAD, past gamma / a - 1
STEPS = [0.2, 4.0]
SHAPES = [(1000,), (5, 333)]
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 1e-1}


def rnd(shape, dtype):
    return (torch.randn(shape, dtype=torch.float64) * 2).to(dtype)


def assert_close(got, want, dtype):
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want.double(), rtol=TOL[dtype], atol=TOL[dtype])


def up(t):
    return t.double()


def row(shape, dtype, broadcast):
    """An operand that is either full-shaped or one row shared by every row of a stack."""
    return rnd(shape[-1:] if broadcast and len(shape) == 2 else shape, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind,p1,p2", PENALTIES)
@pytest.mark.parametrize("step", STEPS)
def test_prox_grad_step(kind, p1, p2, step, shape, dtype):
    x, g = rnd(shape, dtype), rnd(shape, dtype)
    want = ref_prox(kind, up(x) - 0.3 * up(g), step, p1, p2)
    fk.raw.prox_grad_step_(x, g, 0.3, kind, step, p1, p2)
    assert_close(x, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("broadcast", [False, True])
def test_cv_step(shape, dtype, broadcast):
    x, g, c = rnd(shape, dtype), rnd(shape, dtype), row(shape, dtype, broadcast)
    want = up(x) - 0.1 * (up(g) + up(c))
    fk.raw.cv_step_(x, g, c, 0.1)
    assert_close(x, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_normalized_delta_and_control_update(shape, dtype):
    z = row(shape, dtype, True)  # the server model, broadcast against the client stack
    x = rnd(shape, dtype)
    beta, K = 0.05, 7
    want = (up(z) - up(x)) / (beta * K)
    d = fk.raw.normalized_delta(z, x, beta, K)
    assert_close(d, want, dtype)
    fk.raw.normalized_delta_(x, z, beta, K)
    assert_close(x, want, dtype)

    c = rnd(shape, dtype)
    dbar = d.mean(0) if d.dim() == 2 else d.clone()
    want_c = up(c) + up(dbar) - up(d)
    fk.raw.control_update_(c, dbar, d)
    assert_close(c, want_c, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind,p1,p2", PENALTIES)
@pytest.mark.parametrize("lam", [0.4, 3.0])
def test_normal_map_step(kind, p1, p2, lam, shape, dtype):
    z, x, g, c = rnd(shape, dtype), rnd(shape, dtype), rnd(shape, dtype), row(shape, dtype, True)
    eta = 0.07
    z_new = up(z) - eta * (up(g) + up(c) + (up(z) - up(x)) / lam)
    x_new = ref_prox(kind, z_new, lam, p1, p2)
    fk.raw.normal_map_step_(z, x, g, c, eta, lam, kind, lam, p1, p2)
    assert_close(z, z_new, dtype)
    assert_close(x, x_new, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind,p1,p2", PENALTIES)
@pytest.mark.parametrize("step", STEPS)
def test_za1_step(kind, p1, p2, step, shape, dtype):
    zhat, z, g, c = rnd(shape, dtype), rnd(shape, dtype), rnd(shape, dtype), rnd(shape, dtype)
    eta = 0.05
    pre = up(zhat) - eta * (up(g) + up(c))
    fk.raw.za1_step_(zhat, z, g, c, eta, kind, step, p1, p2)
    assert_close(zhat, pre, dtype)
    assert_close(z, ref_prox(kind, pre, step, p1, p2), dtype)


@pytest.mark.parametrize("shape, offset", [((4_195_307,), 5), ((3, 1_400_001), 0)])
def test_za1_step_on_a_z_streamed_to_memory(shape, offset):
    # 16 MiB or more of z: the CPU backend streams z with non-temporal stores (kStreamMinBytes);
    # offset 5: z does not start on a cache line
    dtype = torch.float32
    zhat, g, c = rnd(shape, dtype), rnd(shape, dtype), rnd(shape, dtype)
    z = torch.full((zhat.numel() + offset,), 7.0, dtype=dtype)[offset:].view(shape)
    eta, (kind, p1, p2) = 0.05, PENALTIES[4]
    pre = up(zhat) - eta * (up(g) + up(c))
    fk.raw.za1_step_(zhat, z, g, c, eta, kind, 0.2, p1, p2)
    assert_close(zhat, pre, dtype)
    assert_close(z, ref_prox(kind, pre, 0.2, p1, p2), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind,p1,p2", PENALTIES)
@pytest.mark.parametrize("momentum", ["shb", "snag"])
@pytest.mark.parametrize("normalized", [True, False])
def test_depositum_step(kind, p1, p2, momentum, normalized, shape, dtype):
    x, m, y = rnd(shape, dtype), rnd(shape, dtype), rnd(shape, dtype)
    alpha, beta, step = 0.1, 0.8, 0.1
    w = 1 - beta if normalized else 1.0
    m_new = beta * up(m) + w * up(y)
    direction = m_new if momentum == "shb" else beta * m_new + w * up(y)
    x_new = ref_prox(kind, up(x) - alpha * direction, step, p1, p2)
    fk.raw.depositum_step_(x, m, y, alpha, beta, kind, step, p1, p2, momentum=momentum, normalized=normalized)
    assert_close(m, m_new, dtype)
    assert_close(x, x_new, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("broadcast", [False, True])
def test_box_tensor(shape, dtype, broadcast):
    x = rnd(shape, dtype)
    lo = row(shape, dtype, broadcast).abs().neg()
    hi = row(shape, dtype, broadcast).abs()
    want = torch.maximum(torch.minimum(up(x), up(hi)), up(lo))
    assert_close(fk.raw.box_tensor(x, lo, hi), want, dtype)
    fk.raw.box_tensor_(x, lo, hi)
    assert_close(x, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("center", [False, True])
def test_l2_ball(shape, dtype, center):
    x = rnd(shape, dtype)
    c = row(shape, dtype, True) if center else None
    radius = 3.0
    diff = up(x) - (up(c) if center else 0.0)
    norms = diff.norm(dim=-1, keepdim=True)
    want = (up(c) if center else 0.0) + diff * torch.clamp(radius / norms, max=1.0)
    fk.raw.l2_ball_(x, radius, c)
    assert_close(x, want, dtype)
    inside = rnd(shape, dtype) * 1e-3
    before = inside.clone()
    fk.raw.l2_ball_(inside, radius)
    assert torch.equal(inside, before)  # already inside: untouched


def test_l2_ball_nan_row_becomes_nan_other_rows_fine():
    x = torch.randn(3, 50, dtype=torch.float64) * 10
    x[1, 7] = float("nan")
    want0 = x[0] * min(1.0, 2.0 / float(x[0].norm()))
    fk.raw.l2_ball_(x, 2.0)
    assert torch.isnan(x[1]).all()
    torch.testing.assert_close(x[0], want0)


def test_fused_regularizer_fallback_matches_two_step():
    """Non-separable regularizers (tensor box, l2 ball) go through identity kernel + reg.prox_."""
    x, g = torch.randn(200, dtype=torch.float64), torch.randn(200, dtype=torch.float64)
    lo, hi = -torch.rand(200, dtype=torch.float64), torch.rand(200, dtype=torch.float64)
    for reg in (fk.Box(lo, hi), fk.L2Ball(1.5)):
        a = x.clone()
        fk.fused.prox_grad_step_(a, g, 0.2, reg, 0.2, fast=True)
        b = reg.prox(x - 0.2 * g, 0.2)
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("fast", [True, False])
def test_fused_module_matches_raw(fast):
    reg = 0.5 * fk.SCAD(1.0, 3.7)
    z, x, g, c = (torch.randn(300, dtype=torch.float64) for _ in range(4))
    z2, x2 = z.clone(), x.clone()
    fk.fused.normal_map_step_(z, x, g, c, 0.1, 0.8, reg, fast=fast)
    fk.raw.normal_map_step_(z2, x2, g, c, 0.1, 0.8, "scad", 0.8 * 0.5, 1.0, 3.7)
    assert torch.equal(z, z2) and torch.equal(x, x2)


def test_zero_length_tensors():
    for shape in [(0,), (3, 0), (0, 5)]:
        x = torch.empty(shape)
        fk.raw.prox_(x, "scad", 1.0, 1.0, 3.7)
        fk.raw.cv_step_(x, torch.empty(shape), torch.empty(shape), 0.1)
        fk.raw.l2_ball_(x, 1.0)
        assert fk.raw.prox(x, "l1", 1.0, 1.0).shape == x.shape


def test_prox_into_out_buffer():
    x = torch.randn(3, 40, dtype=torch.float64)
    out = torch.empty_like(x)
    assert fk.raw.prox(x, "scad", 0.7, 1.0, 3.7, out=out) is out
    torch.testing.assert_close(out, ref_prox("scad", x, 0.7, 1.0, 3.7))
    with pytest.raises(ValueError, match="out and x share memory"):
        fk.raw.prox(x, "l1", 1.0, 1.0, out=x)
    with pytest.raises(ValueError, match="x has shape"):
        fk.raw.prox(x[0], "l1", 1.0, 1.0, out=out)


# Issue 35, defect 8: with a regularizer that has no single-kernel form the fused ops ran the update,
# then the regularizer's prox, whose checks raised after the update was written (16 of 16 combinations).
TWO_PASS = {
    "GroupLasso": lambda d: fk.GroupLasso(0.1, "cols"),
    "tensor Box": lambda d: fk.Box(-torch.ones(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64)),
    "L2Ball": lambda d: fk.L2Ball(1.0, torch.zeros(d, dtype=torch.float64)),
    "PerParameter": lambda d: fk.PerParameter([("w", (2, d // 2))], {"w": fk.GroupLasso(0.1)}),
}
FUSED = {
    "prox_grad_step_": lambda t, reg, step: fk.fused.prox_grad_step_(t[0], t[1], 0.1, reg, step),
    "normal_map_step_": lambda t, reg, step: fk.fused.normal_map_step_(t[0], t[1], t[2], t[3], 0.1, step, reg),
    "za1_step_": lambda t, reg, step: fk.fused.za1_step_(t[0], t[1], t[2], t[3], 0.1, reg, step),
    "depositum_step_": lambda t, reg, step: fk.fused.depositum_step_(t[0], t[1], t[2], 0.1, 0.9, reg, step),
}


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("op", sorted(FUSED))
@pytest.mark.parametrize("reg", sorted(TWO_PASS))
def test_two_pass_fused_ops_check_the_prox_before_writing(reg, op, fast):
    d = 8
    bad = {  # an argument only the prox pass checks
        "negative step": (lambda: TWO_PASS[reg](d), -0.5),
        "the regularizer does not fit x": (lambda: TWO_PASS[reg](d + 2), 0.5),
    }
    for what, (make, step) in bad.items():
        misfit = reg == "GroupLasso" and what.startswith("the regularizer")  # any matrix fits: give a vector
        tensors = [torch.randn(*((2 * d,) if misfit else (2, d)), dtype=torch.float64) for _ in range(4)]
        before = [t.clone() for t in tensors]
        with pytest.raises(ValueError):
            FUSED[op](tensors, make(), step)
        for t, b in zip(tensors, before):
            assert torch.equal(t, b), f"{what}: a buffer was written before the error"
    tensors = [torch.randn(2, d, dtype=torch.float64) for _ in range(4)]
    FUSED[op](tensors, TWO_PASS[reg](d), 0.5)  # and a valid call runs
