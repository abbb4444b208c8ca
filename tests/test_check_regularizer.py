"""fedkernels.testing.check_regularizer: every built-in passes it in every regime of its prox, and
it catches deliberately broken penalties (a wrong threshold, a prox wrong only past MCP's
boundary, a prox that is not in place, a rho too small, a value of the wrong shape), saying what
and where. Its ground truth is brute-force minimisation from ``value`` alone, not the kernels."""

import pytest
import torch

import fedkernels as fk
from fedkernels.testing import RegularizerCheckError, check_regularizer

BUILT_INS = [
    (fk.L1(0.5), (0.1, 1.0, 4.0), {}),
    (fk.ElasticNet(0.5, 0.2), (0.1, 1.0, 4.0), {}),
    (fk.MCP(1.0, 3.0), (0.1, 1.5, 3.0, 12.0), {}),  # firm below gamma, hard threshold from gamma on
    (fk.SCAD(0.5, 3.7), (0.1, 1.0, 2.7, 8.0), {}),  # three-piece below a - 1, two candidates past it
    (fk.Box(-1.0, 2.0), (0.5, 1.0), {}),
    (fk.NonNeg(), (1.0,), {}),
    (fk.Zero(), (1.0,), {}),
    (2.5 * fk.SCAD(0.3, 2.5), (0.1, 1.0), {}),
    (fk.GroupLasso(0.5), (0.1, 1.0, 4.0), {"shape": (8, 5)}),
    (fk.L2Ball(2.0), (1.0,), {"shape": (8, 5)}),
]


@pytest.mark.parametrize("reg,steps,kw", BUILT_INS, ids=[repr(r) for r, *_ in BUILT_INS])
def test_every_built_in_passes(reg, steps, kw):
    assert "ok" in check_regularizer(reg, steps=steps, **kw)


class WrongThreshold(fk.Regularizer):
    """kappa*|x| with the soft threshold at 2*step*kappa: a plausible bug."""

    def __init__(self, kappa):
        self.kappa = kappa

    def value(self, x):
        return self.kappa * x.abs().sum()

    def prox_(self, x, step, *, fast=False):
        return x.copy_(x.sign() * (x.abs() - 2 * step * self.kappa).clamp(min=0))

    def prox(self, x, step, *, fast=False):
        return self.prox_(x.clone(), step)


class FirmEverywhere(fk.MCP):
    """MCP's firm-threshold formula used past step = gamma too, where it is wrong."""

    def prox_(self, x, step, *, fast=False):
        lam, g = self.lam, self.gamma
        if step < g:
            return super().prox_(x, step)
        shrunk = x.sign() * (x.abs() - step * lam).clamp(min=0) / (1 - step / g + 1e-3)
        return x.copy_(torch.where(x.abs() > g * lam, x, shrunk))

    def prox(self, x, step, *, fast=False):
        return self.prox_(x.clone(), step)


class NotInPlace(fk.L1):
    def prox_(self, x, step, *, fast=False):
        return fk.L1(self.kappa).prox(x, step)


class SumPerElement(fk.L1):
    def value(self, x):
        return self.kappa * x.abs()


def test_a_wrong_threshold_is_caught_naming_the_step_and_input():
    with pytest.raises(RegularizerCheckError, match=r"prox at step 1 does not minimise .* at v = -6 it returns u = -5"):
        check_regularizer(WrongThreshold(0.5), steps=(1.0,))


def test_a_prox_wrong_only_past_the_boundary_is_caught_when_that_regime_is_listed():
    assert "ok" in check_regularizer(FirmEverywhere(1.0, 3.0), steps=(0.5, 2.0))  # right below gamma
    with pytest.raises(RegularizerCheckError, match="prox at step 6 does not minimise"):
        check_regularizer(FirmEverywhere(1.0, 3.0), steps=(0.5, 6.0))


def test_a_prox_that_is_not_in_place_is_caught():
    with pytest.raises(RegularizerCheckError, match=r"prox_\(x, 1\) must return x itself"):
        check_regularizer(NotInPlace(0.5), steps=(1.0,))


def test_a_rho_too_small_is_caught_naming_where():
    reg = fk.SCAD(1.0, 3.7)
    reg.rho = 0.2  # SCAD needs 1 / (a - 1) = 0.37
    with pytest.raises(RegularizerCheckError, match=r"rho = 0.2 is too small: .* near u = "):
        check_regularizer(reg, steps=(0.5,))


class McpClaimingConvex(fk.Regularizer):
    """An MCP-like penalty of one's own (exact prox: firm thresholding) that does not set rho, so it
    declares the default rho = 0: convex. FedCanon would then run steps that the true rho = 1/gamma
    refuses (issue 35: alpha * rho = 1.25)."""

    def __init__(self, lam=1.0, gamma=3.0):
        self.lam, self.gamma = lam, gamma

    def value(self, x):
        t = x.abs()
        return torch.where(t <= self.gamma * self.lam, self.lam * t - t * t / (2 * self.gamma),
                           torch.full_like(t, self.gamma * self.lam**2 / 2)).sum()

    def prox_(self, x, step, *, fast=False):
        return fk.MCP(self.lam, self.gamma).prox_(x, step)

    def prox(self, x, step, *, fast=False):
        return self.prox_(x.clone(), step)


def test_a_non_convex_penalty_declaring_rho_zero_is_caught():
    reg = McpClaimingConvex()
    assert reg.rho == 0.0
    said = r"rho = 0 \(declared convex, or rho not set\) is wrong: .* near u = "
    with pytest.raises(RegularizerCheckError, match=said):
        check_regularizer(reg, steps=(0.5, 2.0))
    reg.rho = 1 / 3  # the true modulus: everything else about it is right
    assert "ok" in check_regularizer(reg, steps=(0.5, 2.0))


def test_a_non_separable_non_convex_penalty_declaring_rho_zero_is_caught():
    class NegativeNorm(fk.Regularizer):  # -||x||: concave, its prox pushes away from 0
        def value(self, x):
            return -x.norm()

        def prox_(self, x, step, *, fast=False):
            n = x.norm()
            return x.mul_((n + step) / n)

        def prox(self, x, step, *, fast=False):
            return self.prox_(x.clone(), step)

    with pytest.raises(RegularizerCheckError, match=r"rho = 0 \(declared convex.* between two random points"):
        check_regularizer(NegativeNorm(), separable=False, steps=(0.5,))


def test_a_value_of_the_wrong_shape_is_caught_first():
    with pytest.raises(RegularizerCheckError, match=r"value\(x\) must return a 0-d tensor"):
        check_regularizer(SumPerElement(0.5))


def test_bad_steps_are_refused():
    with pytest.raises(ValueError, match="steps must be positive"):
        check_regularizer(fk.L1(0.5), steps=(0.0,))
