"""Randomized properties: every op against its plain-PyTorch reference (float64, written from the
update rules; the prox from _reference.py) over shapes (empty, one element, odd sizes, [N, d]
stacks with row-broadcast operands), every dtype, steps in every prox regime, aliasing patterns
(an input that is the written buffer itself, disjoint slices of one storage, non-contiguous
inputs) and both entry points (fk.raw and the registered fk.ops).

The default run is derandomized (the same examples every run, so CI never flakes on an input that
lands within rounding of a prox threshold) and small; FK_PROPERTY_EXAMPLES=500 and
FK_PROPERTY_RANDOM=1 explore further.
"""

import os

import torch
from _reference import prox as ref_prox
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedkernels as fk

PROFILE = settings(
    max_examples=int(os.environ.get("FK_PROPERTY_EXAMPLES", "100")),
    deadline=None,
    derandomize=not os.environ.get("FK_PROPERTY_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-2, torch.bfloat16: 1e-1}
PATHS = {"raw": fk.raw, "ops": fk.ops}
LAYOUTS = ["fresh", "one_storage", "noncontiguous"]


# --- strategies ---------------------------------------------------------------------------------


@st.composite
def shapes(draw):
    if draw(st.booleans()):
        return (draw(st.sampled_from([0, 1, 2, 3, 5, 17, 257, 1001])),)
    return (draw(st.sampled_from([0, 1, 2, 3, 6])), draw(st.sampled_from([0, 1, 2, 7, 31, 33, 129])))


@st.composite
def penalties(draw):
    """(kind, step, p1, p2) with the step in each regime of the penalty (both MCP and SCAD
    regimes, step 0 = identity)."""
    kind = draw(st.sampled_from(["zero", "l1", "elastic_net", "mcp", "scad", "box", "nonneg"]))
    u = draw(st.floats(0.05, 0.95))
    big = draw(st.floats(1.0, 3.0))
    small_regime = draw(st.booleans())
    step = draw(st.sampled_from([0.0, 0.3, 1.0, 2.5]))
    p1 = p2 = 0.0
    if kind == "l1":
        p1 = draw(st.floats(0.0, 2.0))
    elif kind == "elastic_net":
        p1, p2 = draw(st.floats(0.0, 2.0)), draw(st.floats(0.0, 2.0))
    elif kind == "mcp":
        p1, p2 = draw(st.floats(0.05, 2.0)), draw(st.floats(0.2, 4.0))
        step = p2 * (u if small_regime else big)
    elif kind == "scad":
        p1, p2 = draw(st.floats(0.05, 2.0)), draw(st.floats(2.1, 5.0))
        step = (p2 - 1) * (u if small_regime else big)
    elif kind == "box":
        p1 = draw(st.floats(-2.0, 1.0))
        p2 = p1 + draw(st.floats(0.0, 2.0))
    return kind, step, p1, p2


@st.composite
def cases(draw):
    return {
        "dtype": draw(st.sampled_from(DTYPES)),
        "shape": draw(shapes()),
        "scale": draw(st.sampled_from([0.1, 1.0, 4.0])),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "layout": draw(st.sampled_from(LAYOUTS)),
        "path": draw(st.sampled_from(list(PATHS))),
    }


# --- tensors ------------------------------------------------------------------------------------


class Maker:
    """Makes a case's tensors: full-shaped ones (written or read) and row-broadcast ones."""

    def __init__(self, case, count=8):
        self.dtype, self.shape, self.scale = case["dtype"], case["shape"], case["scale"]
        self.layout = case["layout"]
        self.gen = torch.Generator().manual_seed(case["seed"])
        self.storage = self._randn((count, *self.shape)) if self.layout == "one_storage" else None
        self.used = 0

    def _randn(self, shape):
        return (torch.randn(shape, generator=self.gen, dtype=torch.float64) * self.scale).to(self.dtype)

    def written(self):
        if self.storage is not None:  # disjoint contiguous slices of one storage
            self.used += 1
            return self.storage[self.used - 1]
        return self._randn(self.shape)

    def read(self):
        if self.layout == "noncontiguous" and len(self.shape) == 2:
            return self._randn(self.shape[::-1]).T  # copied by the op, then read
        if self.layout == "noncontiguous":
            return self._randn((2 * self.shape[0],))[::2]
        return self.written()

    def row(self, broadcast):
        """A read operand: one row shared by all rows of a stack, or full-shaped."""
        if broadcast and len(self.shape) == 2:
            return self._randn(self.shape[-1:])
        return self.read()


def up(t):
    return t.detach().to(torch.float64).clone()


def check(got, want, case):
    dtype = case["dtype"]
    assert got.dtype == dtype and got.shape == want.shape
    tol = TOL[dtype] * max(1.0, case["scale"])
    torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=tol, equal_nan=True)


# --- properties ---------------------------------------------------------------------------------


@PROFILE
@given(case=cases(), pen=penalties(), form=st.sampled_from(["inplace", "out_of_place", "out="]))
def test_prox(case, pen, form):
    kind, step, p1, p2 = pen
    mk = Maker(case)
    x = mk.written() if form == "inplace" else mk.read()
    want = ref_prox(kind, up(x), step, p1, p2)
    m = PATHS[case["path"]]
    if form == "inplace":
        got = m.prox_(x, kind, step, p1, p2)
        assert got is x
    elif form == "out=":
        got = fk.raw.prox(x, kind, step, p1, p2, out=mk.written())
    else:
        got = m.prox(x, kind, step, p1, p2)
    check(got, want, case)


@PROFILE
@given(case=cases(), pen=penalties(), broadcast=st.booleans(), alias=st.booleans(),
       lr=st.floats(0.0, 2.0))
def test_prox_grad_step(case, pen, broadcast, alias, lr):
    kind, step, p1, p2 = pen
    mk = Maker(case)
    x = mk.written()
    g = x if alias else mk.row(broadcast)
    want = ref_prox(kind, up(x) - lr * up(g), step, p1, p2)
    PATHS[case["path"]].prox_grad_step_(x, g, lr, kind, step, p1, p2)
    check(x, want, case)


@PROFILE
@given(case=cases(), broadcast=st.booleans(), alias=st.sampled_from(["none", "g", "c"]),
       beta=st.floats(0.0, 2.0))
def test_cv_step(case, broadcast, alias, beta):
    mk = Maker(case)
    x = mk.written()
    g = x if alias == "g" else mk.read()
    c = x if alias == "c" else mk.row(broadcast)
    want = up(x) - beta * (up(g) + up(c))
    PATHS[case["path"]].cv_step_(x, g, c, beta)
    check(x, want, case)


@PROFILE
@given(case=cases(), broadcast=st.booleans(), inplace=st.booleans(), alias=st.booleans(),
       beta=st.floats(0.05, 1.0), K=st.integers(1, 5))
def test_normalized_delta(case, broadcast, inplace, alias, beta, K):
    mk = Maker(case)
    x = mk.written() if inplace else mk.read()
    z = x if alias and inplace else mk.row(broadcast)
    want = (up(z) - up(x)) / (beta * K)
    m = PATHS[case["path"]]
    if inplace:
        m.normalized_delta_(x, z, beta, K)
        got = x
    else:
        got = m.normalized_delta(z, x, beta, K)
    check(got, want, case)


@PROFILE
@given(case=cases(), broadcast=st.booleans(), alias=st.booleans())
def test_control_update(case, broadcast, alias):
    mk = Maker(case)
    c = mk.written()
    dbar = mk.row(broadcast)
    d = c if alias else mk.read()
    want = up(c) + (up(dbar) - up(d))
    PATHS[case["path"]].control_update_(c, dbar, d)
    check(c, want, case)


@PROFILE
@given(case=cases(), pen=penalties(), broadcast=st.booleans(), alias=st.sampled_from(["none", "g=z", "c=x"]),
       eta=st.floats(0.0, 1.0), lam=st.floats(0.1, 3.0))
def test_normal_map_step(case, pen, broadcast, alias, eta, lam):
    kind, step, p1, p2 = pen
    mk = Maker(case)
    z, x = mk.written(), mk.written()
    g = z if alias == "g=z" else mk.read()
    c = x if alias == "c=x" else mk.row(broadcast)
    z_new = up(z) - eta * (up(g) + up(c) + (up(z) - up(x)) / lam)
    x_new = ref_prox(kind, z_new, step, p1, p2)
    PATHS[case["path"]].normal_map_step_(z, x, g, c, eta, lam, kind, step, p1, p2)
    check(z, z_new, case)
    check(x, x_new, case)


@PROFILE
@given(case=cases(), pen=penalties(), broadcast=st.booleans(), alias=st.sampled_from(["none", "g=zhat", "c=z"]),
       eta=st.floats(0.0, 1.0))
def test_za1_step(case, pen, broadcast, alias, eta):
    kind, step, p1, p2 = pen
    mk = Maker(case)
    zhat, z = mk.written(), mk.written()
    g = zhat if alias == "g=zhat" else mk.read()
    c = z if alias == "c=z" else mk.row(broadcast)
    pre = up(zhat) - eta * (up(g) + up(c))
    want_z = ref_prox(kind, pre, step, p1, p2)
    PATHS[case["path"]].za1_step_(zhat, z, g, c, eta, kind, step, p1, p2)
    check(zhat, pre, case)
    check(z, want_z, case)


@PROFILE
@given(case=cases(), pen=penalties(), broadcast=st.booleans(), alias=st.sampled_from(["none", "y=x", "y=m"]),
       alpha=st.floats(0.0, 1.0), beta=st.floats(0.0, 0.99), momentum=st.sampled_from(["shb", "snag"]),
       normalized=st.booleans())
def test_depositum_step(case, pen, broadcast, alias, alpha, beta, momentum, normalized):
    kind, step, p1, p2 = pen
    mk = Maker(case)
    x, m = mk.written(), mk.written()
    y = x if alias == "y=x" else (m if alias == "y=m" else mk.row(broadcast))
    w = 1 - beta if normalized else 1.0
    m_new = beta * up(m) + w * up(y)
    direction = m_new if momentum == "shb" else beta * m_new + w * up(y)
    x_new = ref_prox(kind, up(x) - alpha * direction, step, p1, p2)
    PATHS[case["path"]].depositum_step_(x, m, y, alpha, beta, kind, step, p1, p2,
                                        momentum=momentum, normalized=normalized)
    check(m, m_new, case)
    check(x, x_new, case)


@PROFILE
@given(case=cases(), broadcast=st.booleans(), inplace=st.booleans())
def test_box_tensor(case, broadcast, inplace):
    mk = Maker(case)
    x = mk.written() if inplace else mk.read()
    a, b = mk.row(broadcast), mk.row(broadcast)
    lo = torch.minimum(a, b)
    hi = torch.maximum(a, b)
    want = torch.maximum(torch.minimum(up(x), up(hi)), up(lo))
    m = PATHS[case["path"]]
    got = m.box_tensor_(x, lo, hi) if inplace else m.box_tensor(x, lo, hi)
    check(got, want, case)


@PROFILE
@given(case=cases(), centered=st.booleans(), broadcast=st.booleans(), shrink=st.floats(0.1, 2.0))
def test_l2_ball(case, centered, broadcast, shrink):
    mk = Maker(case)
    x = mk.written()
    c = mk.row(broadcast) if centered else None
    diff = up(x) - (up(c) if centered else 0.0)
    rows = diff if x.dim() == 2 else diff.reshape(1, -1)
    norms = rows.norm(dim=1, keepdim=True)
    radius = shrink * (float(norms.max()) if norms.numel() else 1.0)  # some rows inside, some not
    scale = torch.where(norms <= radius, torch.ones_like(norms), torch.full_like(norms, radius) / norms)
    want = ((up(c) if centered else 0.0) + (rows * scale).reshape(x.shape)) if x.numel() else up(x)
    PATHS[case["path"]].l2_ball_(x, radius, c)
    check(x, want.reshape(x.shape), case)
