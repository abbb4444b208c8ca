"""Regularizer objects: value and rho against the independent formulas, prox through the registered
ops equal to the raw kernels, scaling, repr, tensor-bound boxes and the l2 ball."""

import math

import pytest
import torch
from _reference import penalty
from conftest import REGULARIZERS

import fedkernels as fk

KINDS = {
    "zero": ("zero", 0.0, 0.0), "l1": ("l1", 0.3, 0.0), "elastic_net": ("elastic_net", 0.3, 0.5),
    "mcp": ("mcp", 0.5, 1.5), "scad": ("scad", 0.5, 3.7), "box": ("box", -0.5, 0.7), "nonneg": ("nonneg", 0.0, 0.0),
}


@pytest.mark.parametrize("name", sorted(REGULARIZERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prox_methods_equal_raw_kernel(name, dtype):
    reg = REGULARIZERS[name]()
    kind, p1, p2 = KINDS[name]
    x = torch.randn(2, 500, dtype=dtype) * 2
    for step in (0.0, 0.4, 5.0):
        want = fk.raw.prox(x, kind, step, p1, p2)
        assert torch.equal(reg.prox(x, step), want)
        y = x.clone()
        assert reg.prox_(y, step) is y
        assert torch.equal(y, want)


@pytest.mark.parametrize("name", ["l1", "elastic_net", "mcp", "scad"])
def test_value_matches_reference_and_is_differentiable(name):
    reg = REGULARIZERS[name]()
    kind, p1, p2 = KINDS[name]
    x = (torch.randn(1000, dtype=torch.float64) * 3).requires_grad_()
    v = reg.value(x)
    torch.testing.assert_close(v, penalty(kind, x.detach(), p1, p2).sum())
    v.backward()
    assert torch.isfinite(x.grad).all()


def test_indicator_values():
    x = torch.tensor([0.1, 0.5])
    assert fk.Box(0, 1).value(x) == 0 and fk.Box(0, 0.2).value(x) == math.inf
    assert fk.NonNeg().value(x) == 0 and fk.NonNeg().value(-x) == math.inf
    assert fk.L2Ball(1.0).value(x) == 0 and fk.L2Ball(0.1).value(x) == math.inf
    assert fk.Zero().value(x) == 0


def test_weak_convexity_moduli_numerically():
    """rho = -min p'' estimated by finite differences of the independent penalty formula."""
    u = torch.linspace(-10, 10, 200001, dtype=torch.float64)
    h = float(u[1] - u[0])
    for reg, kind, p1, p2 in [(fk.MCP(1.0, 3.0), "mcp", 1.0, 3.0), (fk.SCAD(1.0, 3.7), "scad", 1.0, 3.7)]:
        p = penalty(kind, u, p1, p2)
        second = (p[2:] - 2 * p[1:-1] + p[:-2]) / h**2
        assert abs(-float(second.min()) - reg.rho) < 1e-3
    assert fk.L1(1.0).rho == 0 and fk.ElasticNet(1, 1).rho == 0 and fk.Box().rho == 0


def test_scaled_regularizer():
    base = fk.SCAD(1.0, 3.7)
    reg = 0.25 * base
    x = torch.randn(300, dtype=torch.float64) * 3
    assert reg.rho == pytest.approx(0.25 * base.rho)
    torch.testing.assert_close(reg.value(x), 0.25 * base.value(x))
    assert torch.equal(reg.prox(x, 2.0), base.prox(x, 0.5))
    assert reg.spec(2.0) == ("scad", 0.5, 1.0, 3.7)
    assert repr(reg) == "0.25 * SCAD(lam=1, a=3.7)"
    # kappa * MCP(lam, gamma) = MCP(kappa lam, gamma / kappa)  (docs/algorithms.md §2.3)
    torch.testing.assert_close((2.0 * fk.MCP(0.5, 3.0)).prox(x, 0.7), fk.MCP(1.0, 1.5).prox(x, 0.7))


def test_reprs():
    assert repr(fk.L1(0.5)) == "L1(kappa=0.5)"
    assert repr(fk.MCP(1, 3)) == "MCP(lam=1, gamma=3)"
    assert repr(fk.ElasticNet(0.1, 0.2)) == "ElasticNet(l1=0.1, l2=0.2)"
    assert repr(fk.Box(-1, 1)) == "Box(lo=-1, hi=1)"
    assert "tensor" in repr(fk.Box(torch.zeros(3), torch.ones(3)))
    assert repr(fk.L2Ball(2.0)) == "L2Ball(radius=2, center=0)"
    assert repr(fk.Zero()) == "Zero()" and repr(fk.NonNeg()) == "NonNeg()"


def test_box_with_tensor_bounds_and_row_broadcast():
    lo, hi = -torch.rand(40), torch.rand(40)
    reg = fk.Box(lo, hi)
    X = torch.randn(3, 40) * 3
    want = torch.maximum(torch.minimum(X, hi), lo)
    assert torch.equal(reg.prox(X, 1.0), want)
    assert reg.spec(1.0) is None
    one_sided = fk.Box(lo=torch.zeros(40))
    assert torch.equal(one_sided.prox(X[0], 1.0), X[0].clamp(min=0))


def test_l2_ball_with_center():
    c = torch.randn(20, dtype=torch.float64)
    x = c + 5 * torch.randn(20, dtype=torch.float64)
    p = fk.L2Ball(2.0, c).prox(x, 1.0)
    torch.testing.assert_close((p - c).norm(), torch.tensor(2.0, dtype=torch.float64))
    torch.testing.assert_close((p - c) / (p - c).norm(), (x - c) / (x - c).norm())


def test_zero_prox_is_identity_copy():
    x = torch.randn(10)
    y = fk.Zero().prox(x, 3.0)
    assert torch.equal(x, y) and y.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("name", sorted(REGULARIZERS))
def test_fast_path_equals_registered_op_path(name):
    reg = REGULARIZERS[name]()
    x = torch.randn(300, dtype=torch.float64) * 2
    assert torch.equal(reg.prox(x, 0.8, fast=True), reg.prox(x, 0.8))
    y = x.clone()
    reg.prox_(y, 0.8, fast=True)
    assert torch.equal(y, reg.prox(x, 0.8))
    box = fk.Box(-torch.ones(300, dtype=torch.float64), torch.ones(300, dtype=torch.float64))
    for extra in (box, fk.L2Ball(2.0), 0.5 * reg):
        assert torch.equal(extra.prox(x, 0.8, fast=True), extra.prox(x, 0.8))


@pytest.mark.parametrize("centered", [False, True])
def test_l2_ball_value_agrees_with_prox_on_row_stacks(centered):
    """prox_ projects each row of a [N, d] stack; value() is 0 exactly for the stacks prox_ leaves
    in place (every row inside), even when the stack as one vector is outside the ball."""
    center = torch.randn(5, dtype=torch.float64) if centered else None
    ball = fk.L2Ball(1.0, center)
    c = 0 if center is None else center
    rows = torch.randn(4, 5, dtype=torch.float64)
    X = c + 0.9 * rows / rows.norm(dim=1, keepdim=True)  # every row at distance 0.9
    assert float((X - c).norm()) > 1.0  # the whole stack is not
    assert ball.value(X) == 0
    assert torch.equal(ball.prox(X, 1.0), X)
    X[2] = c + 1.1 * rows[2] / rows[2].norm()
    assert ball.value(X) == math.inf
    assert ball.value(ball.prox(X, 1.0)) == 0
