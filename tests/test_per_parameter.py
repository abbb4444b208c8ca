"""Per-parameter regularizers (fk.PerParameter, regularizer mappings in simulate and ProxSGD):
every segment's prox against each penalty applied to its own parameter in plain torch, values
summed, the matching rules, step-rule checks per segment, prox counting, and simulate with a
mapping against simulate with a hand-written composite regularizer."""

import pytest
import torch
from torch import nn

import fedkernels as fk
import python_algos as pa
from python_algos.algorithms.base import check_prox_step


def make_model(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).to(dtype)  # 0.weight [5, 6], 0.bias, 2.*


def offsets(model):
    out, o = {}, 0
    for n, p in model.named_parameters():
        out[n] = (o, o + p.numel(), tuple(p.shape))
        o += p.numel()
    return out, o


# plain-torch proxes and values, one parameter at a time
def soft(x, t):
    return torch.sign(x) * torch.clamp(x.abs() - t, min=0)


def group(X, t, groups):
    dim = -1 if groups == "rows" else -2
    n = X.norm(dim=dim, keepdim=True)
    return X * torch.where(n > t, 1 - t / torch.where(n > 0, n, torch.ones_like(n)), torch.zeros_like(n))


def mcp_prox(x, step, lam, gamma):  # firm threshold, step < gamma
    t = x.abs()
    firm = torch.sign(x) * torch.clamp(t - step * lam, min=0) / (1 - step / gamma)
    return torch.where(t <= gamma * lam, firm, x)


MAPPING = {"0.weight": fk.GroupLasso(0.3, groups="cols"), "*.bias": None, "*": fk.MCP(0.2, gamma=4.0)}


def reference_prox(x, step, off):
    """MAPPING applied to each parameter of a [d] vector or [N, d] stack, in plain torch."""
    out = x.clone()
    a, b, shape = off["0.weight"]
    out[..., a:b] = group(x[..., a:b].reshape(*x.shape[:-1], *shape), step * 0.3, "cols").reshape(*x.shape[:-1], -1)
    a, b, _ = off["2.weight"]
    out[..., a:b] = mcp_prox(x[..., a:b], step, 0.2, 4.0)
    return out


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("rows", [None, 1, 4])
def test_prox_equals_each_penalty_on_its_own_parameter(rows, fast):
    model = make_model()
    off, d = offsets(model)
    reg = fk.PerParameter(model, MAPPING)
    x = torch.randn(d if rows is None else (rows, d), dtype=torch.float64)
    got = reg.prox_(x.clone(), 0.7, fast=fast)
    torch.testing.assert_close(got, reference_prox(x, 0.7, off), rtol=1e-12, atol=1e-12)
    # biases untouched, bit for bit
    for name in ("0.bias", "2.bias"):
        a, b, _ = off[name]
        assert torch.equal(got[..., a:b], x[..., a:b])
    torch.testing.assert_close(reg.prox(x, 0.7, fast=fast), got)


def test_value_is_the_sum_over_parameters_and_rho_the_max():
    model = make_model()
    off, d = offsets(model)
    reg = fk.PerParameter(model, MAPPING)
    x = torch.randn(d, dtype=torch.float64)
    a, b, shape = off["0.weight"]
    want = 0.3 * x[a:b].reshape(shape).norm(dim=0).sum()
    a, b, _ = off["2.weight"]
    t = x[a:b].abs()
    want = want + torch.where(t <= 0.8, 0.2 * t - t * t / 8, torch.full_like(t, 0.5 * 4 * 0.04)).sum()
    torch.testing.assert_close(reg.value(x), want)
    assert reg.rho == 0.25
    assert fk.PerParameter(model, {"*.bias": None}).rho == 0.0


def test_scaled_group_lasso_uses_the_scaled_step():
    model = make_model()
    off, d = offsets(model)
    x = torch.randn(3, d, dtype=torch.float64)
    got = fk.PerParameter(model, {"0.weight": 2.0 * fk.GroupLasso(0.3, groups="rows")}).prox_(x.clone(), 0.5, fast=True)
    a, b, shape = off["0.weight"]
    want = group(x[:, a:b].reshape(3, *shape), 0.3, "rows").reshape(3, -1)
    torch.testing.assert_close(got[:, a:b], want, rtol=1e-12, atol=1e-12)
    assert torch.equal(got[:, b:], x[:, b:])


def test_segments_merge_equal_separable_penalties_only():
    model = make_model()
    _, d = offsets(model)
    merged = fk.PerParameter(model, {"*": fk.L1(0.1)})
    assert [(s.start, s.stop) for s in merged.segments] == [(0, d)]
    twins = fk.PerParameter(model, {"*.weight": fk.L1(0.1), "*.bias": fk.L1(0.1)})  # equal, separate objects
    assert [(s.start, s.stop) for s in twins.segments] == [(0, d)]
    split = fk.PerParameter(model, {"*.weight": fk.L1(0.1), "*.bias": fk.L1(0.2)})
    assert len(split.segments) == 4
    balls = fk.PerParameter(model, {"*": fk.L2Ball(1.0)})  # each parameter in its own ball
    assert len(balls.segments) == 4
    x = torch.randn(d, dtype=torch.float64) * 5
    balls.prox_(x, 1.0)
    for s in balls.segments:
        assert abs(float(x[s.start:s.stop].norm()) - 1.0) < 1e-12


def test_matching_rules():
    model = make_model()
    # an exact name wins over an earlier pattern
    reg = fk.PerParameter(model, {"*": fk.L1(0.1), "0.bias": None})
    assert reg.regularizer_of("0.bias") is None and isinstance(reg.regularizer_of("2.bias"), fk.L1)
    # among patterns, the first in order wins
    reg = fk.PerParameter(model, {"2.*": fk.L1(0.2), "*": fk.L1(0.1)})
    assert reg.regularizer_of("2.weight").kappa == 0.2 and reg.regularizer_of("0.weight").kappa == 0.1
    # unmatched parameters get no penalty; Zero is no penalty
    reg = fk.PerParameter(model, {"0.weight": fk.L1(0.1), "2.weight": fk.Zero()})
    assert reg.regularizer_of("0.bias") is None and reg.regularizer_of("2.weight") is None
    assert [s.names for s in reg.segments] == [("0.weight",)]


@pytest.mark.parametrize("mapping,exc,match", [
    ({"1.weight": fk.L1(0.1)}, ValueError, "'1.weight' matches no parameter"),
    ({"*": fk.L1(0.1), "*.bias": None}, ValueError, "put '\\*.bias' before '\\*'"),
    ({"0.bias": fk.GroupLasso(0.1)}, ValueError, "2 or more dimensions"),
    ({"0.weight": 0.1}, TypeError, "'0.weight'"),
    ([("0.weight", fk.L1(0.1))], TypeError, "mapping"),
])
def test_bad_mappings_raise_naming_the_key(mapping, exc, match):
    with pytest.raises(exc, match=match):
        fk.PerParameter(make_model(), mapping)


def test_wrong_vector_raises_before_writing():
    reg = fk.PerParameter(make_model(), MAPPING)
    x = torch.randn(7, dtype=torch.float64)
    with pytest.raises(ValueError, match="expected"):
        reg.prox_(x, 0.1)
    with pytest.raises(ValueError, match="step"):
        reg.prox_(torch.zeros(reg.numel, dtype=torch.float64), -1.0)


def test_step_rule_checked_per_segment_and_named():
    reg = fk.PerParameter(make_model(), {"0.weight": fk.L1(0.1), "2.weight": fk.MCP(0.1, gamma=2.0)})
    check_prox_step("FedCanon", reg, 1.9, "alpha", "alpha < 1/rho")
    with pytest.raises(ValueError, match="2.weight"):
        check_prox_step("FedCanon", reg, 2.5, "alpha", "alpha < 1/rho")


def test_prox_stats_count_one_evaluation_per_row():
    reg = fk.PerParameter(make_model(), MAPPING)
    X = torch.randn(4, reg.numel, dtype=torch.float64)
    with fk.prox_stats() as stats:
        reg.prox_(X, 0.1, fast=True)
    assert stats.evaluations == 4 and stats.calls == 1


# ---- simulate: a mapping against a hand-written composite ----------------------------------------


class ManualComposite(fk.Regularizer):
    """MAPPING written by hand in plain torch (no fedkernels kernel)."""

    def __init__(self, model):
        self.off, self.d = offsets(model)
        self.rho = 0.25

    def prox_(self, x, step, *, fast=False):
        x.copy_(reference_prox(x, step, self.off))
        return x

    def prox(self, x, step, *, fast=False):
        return reference_prox(x.clone(), step, self.off)

    def value(self, x):
        return x.new_zeros(())  # not compared (metrics_every=0)


def _clients(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(20, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (20,), generator=g))
            for _ in range(n)]


@pytest.mark.parametrize("algorithm", [
    lambda: pa.FedMiD(lr_client=0.05, lr_server=1.0, local_steps=3),
    lambda: pa.FedCanon(alpha=0.1, beta=0.05, local_steps=3),
])
def test_simulate_with_a_mapping_equals_a_manual_composite(algorithm):
    clients = _clients()
    runs = []
    for reg in ("mapping", "manual"):
        model = make_model(seed=1)
        h = dict(MAPPING) if reg == "mapping" else ManualComposite(model)
        hist = pa.simulate(algorithm(), model, nn.functional.cross_entropy, clients, rounds=3, regularizer=h,
                           metrics_every=0)
        runs.append(hist.params)
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-12, atol=1e-12)


def test_simulate_mapping_error_names_the_pattern():
    with pytest.raises(ValueError, match="'9.weight'"):
        pa.simulate(pa.FedMiD(lr_client=0.05, lr_server=1.0, local_steps=1), make_model(),
                    nn.functional.cross_entropy, _clients(), rounds=1, regularizer={"9.weight": fk.L1(0.1)})


# ---- ProxSGD ------------------------------------------------------------------------------------------


def test_proxsgd_with_a_mapping_equals_sgd_then_each_prox():
    model, ref = make_model(seed=2), make_model(seed=2)
    X, y = torch.randn(16, 6, dtype=torch.float64), torch.randint(0, 3, (16,))
    opt = fk.optim.ProxSGD(model.named_parameters(), lr=0.3, regularizer=MAPPING)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.3)
    for _ in range(3):
        for m, o in ((model, opt), (ref, sgd)):
            o.zero_grad()
            nn.functional.cross_entropy(m(X), y).backward()
            o.step()
        with torch.no_grad():
            ref[0].weight.copy_(group(ref[0].weight, 0.3 * 0.3, "cols"))
            ref[2].weight.copy_(mcp_prox(ref[2].weight, 0.3, 0.2, 4.0))
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


def test_proxsgd_mapping_needs_names():
    with pytest.raises(TypeError, match="named_parameters"):
        fk.optim.ProxSGD(make_model().parameters(), lr=0.1, regularizer={"*": fk.L1(0.1)})
