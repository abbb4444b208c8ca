"""Derivatives of the out-of-place registered ops (issue 35): ``fk.ops.prox``, ``box_tensor`` and
``normalized_delta`` return tensors whose ``backward()`` works and gives the almost-everywhere
derivative, checked against central finite differences (torch.autograd.gradcheck) at points away
from the prox's kinks, in every regime of every separable penalty; the in-place ops refuse inputs
that require grad, naming the fix."""

import pytest
import torch

import fedkernels as fk

# (kind, step, p1, p2): every regime of csrc/math/prox.h
PROX = [("zero", 1.0, 0.0, 0.0), ("l1", 0.7, 0.5, 0.0), ("elastic_net", 0.7, 0.5, 0.8), ("mcp", 0.5, 1.0, 3.0),
        ("mcp", 4.0, 1.0, 3.0), ("scad", 0.5, 1.0, 3.7), ("scad", 4.0, 1.0, 3.7), ("box", 0.0, -0.5, 1.0),
        ("nonneg", 0.0, 0.0, 0.0)]


def _away_from_kinks(kind, step, p1, p2, n=200):
    """Values on [-6, 6] at least 1e-3 from every point where the prox's slope changes."""
    import math
    kinks = {"l1": [step * p1], "elastic_net": [step * p1], "box": [p1, p2], "nonneg": [0.0], "zero": [],
             "mcp": [step * p1, p2 * p1, p1 * math.sqrt(step * p2)],
             "scad": [step * p1, (1 + step) * p1, p2 * p1]}[kind]
    v = torch.linspace(-6, 6, n, dtype=torch.float64) + 0.0123
    if kind == "scad" and step >= p2 - 1:  # the jump between the two candidates: keep off it too
        y = fk.ops.prox(v, kind, step, p1, p2)
        jump = (y.abs()[1:] >= p2 * p1) != (y.abs()[:-1] >= p2 * p1)
        kinks = kinks + v[1:][jump].abs().tolist()
    far = torch.ones_like(v, dtype=torch.bool)
    for k in kinks:
        far &= (v.abs() - k).abs() > 1e-3
    return v[far]


@pytest.mark.parametrize("kind,step,p1,p2", PROX, ids=[f"{k}-s{s}" for k, s, *_ in PROX])
def test_prox_derivative_matches_finite_differences(kind, step, p1, p2):
    v = _away_from_kinks(kind, step, p1, p2).requires_grad_()
    assert torch.autograd.gradcheck(lambda u: fk.ops.prox(u, kind, step, p1, p2), (v,), eps=1e-6, atol=1e-6)
    y = fk.ops.prox(v, kind, step, p1, p2)
    y.sum().backward()  # issue 35: this raised "... does not require grad" style errors before
    assert v.grad is not None and v.grad.shape == v.shape


def test_regularizer_prox_is_differentiable():
    x = torch.randn(3, 50, dtype=torch.float64, requires_grad=True)
    (fk.SCAD(0.5, 3.7).prox(x, 0.4) ** 2).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_box_tensor_derivative_matches_finite_differences():
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 30, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    lo = (-torch.rand(30, generator=gen, dtype=torch.float64) - 0.1).requires_grad_()  # one row for all 4
    hi = (torch.rand(4, 30, generator=gen, dtype=torch.float64) + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(fk.ops.box_tensor, (x, lo, hi), eps=1e-6, atol=1e-6)
    # the same gradients as torch.clamp's
    fk.ops.box_tensor(x, lo, hi).pow(2).sum().backward()
    want = [t.grad.clone() for t in (x, lo, hi)]
    for t in (x, lo, hi):
        t.grad = None
    torch.clamp(x, min=lo, max=hi).pow(2).sum().backward()
    for t, w in zip((x, lo, hi), want):
        assert torch.equal(t.grad, w)


def test_normalized_delta_derivative_matches_finite_differences():
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(20, generator=gen, dtype=torch.float64, requires_grad=True)  # one row for all 3
    x = torch.randn(3, 20, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: fk.ops.normalized_delta(a, b, 0.3, 4), (z, x), eps=1e-6, atol=1e-7)


def test_in_place_ops_refuse_inputs_that_require_grad():
    x = torch.randn(10, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"x requires grad; .* Call it under torch.no_grad\(\) or on x.detach\(\)"):
        fk.ops.prox_(x, "l1", 0.1, 1.0)
    with torch.no_grad():
        fk.ops.prox_(x, "l1", 0.1, 1.0)  # what the optimizers do
