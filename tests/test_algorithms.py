"""Algorithm-level checks of python_algos against independent ground truth (docs/algorithms.md §7.3).

Deterministic: float64, full local gradients. The problem is a heterogeneous least-squares one
(N = 6 clients, d = 20, client-specific solutions), f_i(x) = mean_j (a_j·x − b_j)^2, so every
reference below (centralized prox-gradient x*, SCAFFOLD option II, FedMiD, FedDA) is written
here in plain torch with closed-form gradients, independently of python_algos and fedkernels.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import fedkernels as fk
import python_algos as pa
from python_algos.algorithms.registry import ALGORITHMS, make

N, D, M = 6, 20, 40
KAPPA = 0.3


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --------------------------------------------------------------------------- problem


class LeastSquares:
    """Heterogeneous least squares with closed-form gradients (the reference side)."""

    def __init__(self, seed=0, n=N, d=D, m=M, spread=0.5):
        g = torch.Generator().manual_seed(seed)
        x_true = torch.randn(d, generator=g, dtype=torch.float64) * (torch.rand(d, generator=g) < 0.5)
        self.data = []
        for _ in range(n):
            A = torch.randn(m, d, generator=g, dtype=torch.float64)
            x_i = x_true + spread * torch.randn(d, generator=g, dtype=torch.float64)  # client-specific optimum
            b = A @ x_i + 0.1 * torch.randn(m, generator=g, dtype=torch.float64)
            self.data.append((A, b))
        self.n, self.d, self.m = n, d, m
        H = sum(2.0 / m * A.T @ A for A, _ in self.data) / n
        self.L = float(torch.linalg.eigvalsh(H).max())
        torch.manual_seed(seed + 1)
        self.x0 = nn.Linear(d, 1, bias=False).double().weight.detach().reshape(-1).clone()

    def grad_i(self, i, x):
        A, b = self.data[i]
        return 2.0 / self.m * A.T @ (A @ x - b)

    def grad(self, x):
        return sum(self.grad_i(i, x) for i in range(self.n)) / self.n

    def model(self):
        model = nn.Linear(self.d, 1, bias=False).double()
        with torch.no_grad():
            model.weight.copy_(self.x0.reshape(1, -1))
        return model

    @staticmethod
    def loss(out, y):
        return nn.functional.mse_loss(out.squeeze(-1), y)


def soft(v, t):
    return v.sign() * (v.abs() - t).clamp_min(0)


@pytest.fixture(scope="module")
def problem():
    return LeastSquares()


@pytest.fixture(scope="module")
def x_star(problem):
    """Centralized proximal gradient on f + KAPPA ||x||_1, run to machine precision."""
    x = torch.zeros(problem.d, dtype=torch.float64)
    s = 1.0 / problem.L
    for _ in range(5000):
        x_new = soft(x - s * problem.grad(x), s * KAPPA)
        if torch.equal(x_new, x):
            break
        x = x_new
    G = (x - soft(x - s * problem.grad(x), s * KAPPA)) / s
    assert float(G.norm()) < 1e-12
    assert int((x == 0).sum()) > 0  # the L1 solution is sparse
    return x


def run(problem, alg, rounds, reg, **kw):
    """simulate() and the reported model after every round."""
    reports = []
    cb = lambda t, state, m: reports.append(alg.report(state, reg).clone())  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hist = pa.simulate(alg, problem.model(), problem.loss, problem.data, rounds, reg,
                           callbacks=[cb], metrics_every=kw.pop("metrics_every", 0), **kw)
    return hist, reports


# --------------------------------------------------------------------------- references


def scaffold_reference(problem, eta_l, eta_g, K, T):
    """SCAFFOLD option II (§5.6), plain torch, closed-form gradients."""
    x = problem.x0.clone()
    c = torch.zeros_like(x)
    c_i = [torch.zeros_like(x) for _ in range(problem.n)]
    out = []
    for _ in range(T):
        dys, dcs = [], []
        for i in range(problem.n):
            y = x.clone()
            for _ in range(K):
                y = y - eta_l * (problem.grad_i(i, y) - c_i[i] + c)
            c_plus = c_i[i] - c + (x - y) / (K * eta_l)
            dys.append(y - x)
            dcs.append(c_plus - c_i[i])
            c_i[i] = c_plus
        x = x + eta_g * torch.stack(dys).mean(0)
        c = c + torch.stack(dcs).mean(0)
        out.append(x)
    return out


def fedmid_reference(problem, eta_c, eta_s, K, T, kappa):
    """FedMiD (§5.3) with h = kappa ||x||_1, plain torch."""
    x = problem.x0.clone()
    out = []
    for _ in range(T):
        ends = []
        for i in range(problem.n):
            y = x.clone()
            for _ in range(K):
                y = soft(y - eta_c * problem.grad_i(i, y), eta_c * kappa)
            ends.append(y)
        delta = torch.stack(ends).mean(0) - x
        x = soft(x + eta_s * delta, eta_s * eta_c * K * kappa)
        out.append(x)
    return out


def fedda_reference(problem, eta_c, eta_s, K, T, kappa):
    """FedDA (§5.4) with h = kappa ||x||_1, plain torch."""
    z = problem.x0.clone()
    out = []
    for r in range(T):
        deltas = []
        for i in range(problem.n):
            zi = z.clone()
            for k in range(K):
                step = eta_s * eta_c * r * K + eta_c * k
                xi = soft(zi, step * kappa)
                zi = zi - eta_c * problem.grad_i(i, xi)
            deltas.append(zi - z)
        z = z + eta_s * torch.stack(deltas).mean(0)
        out.append(soft(z, eta_s * eta_c * (r + 1) * K * kappa))
    return out


def pairs(a_list, b_list):
    assert len(a_list) == len(b_list) > 0
    return zip(a_list, b_list)


def max_rel_diff(a_list, b_list):
    return max(float((a - b).norm() / (1.0 + b.norm())) for a, b in pairs(a_list, b_list))


# --------------------------------------------------------------------------- §7.3 identities


def test_scaffold_matches_reference(problem):
    T, K = 25, 4
    _, ours = run(problem, pa.SCAFFOLD(lr_local=0.04, lr_global=0.7, local_steps=K), T, fk.Zero())
    ref = scaffold_reference(problem, 0.04, 0.7, K, T)
    assert max_rel_diff(ours, ref) < 1e-12


def test_fedcanon_h0_equals_scaffold(problem):
    """FedCanon(α, β, K) with h = 0 is SCAFFOLD-II with η_l = β, η_g = α/(βK) (§4.1, §7.3)."""
    alpha, beta, K, T = 0.3, 0.02, 5, 30
    _, ours = run(problem, pa.FedCanon(alpha=alpha, beta=beta, local_steps=K), T, fk.Zero())
    ref = scaffold_reference(problem, beta, alpha / (beta * K), K, T)
    assert max_rel_diff(ours, ref) < 1e-12


@pytest.mark.parametrize("server_scale", [1.0, 0.6])
def test_fednmap_h0_equals_scaffold(problem, server_scale):
    """FedNMap(λ, η, Q, γ_s) with h = 0 is SCAFFOLD-II with η_l = η, η_g = γ_s (§4.4, §7.3)."""
    eta, Q, T = 0.03, 4, 30
    _, ours = run(problem, pa.FedNMap(lam=0.2, eta=eta, local_steps=Q, server_scale=server_scale), T, fk.Zero())
    ref = scaffold_reference(problem, eta, server_scale, Q, T)
    assert max_rel_diff(ours, ref) < 1e-12


@pytest.mark.parametrize("reg", [fk.L1(KAPPA), fk.MCP(0.3, 3.0), fk.SCAD(0.3)], ids=repr)
def test_fedcanon_i_and_ii_identical(problem, reg):
    alg1 = pa.FedCanon(alpha=0.2, beta=0.02, local_steps=5)
    alg2 = pa.FedCanonII(alpha=0.2, beta=0.02, local_steps=5)
    _, z1 = run(problem, alg1, 20, reg)
    h2, z2 = run(problem, alg2, 20, reg)
    assert all(torch.equal(a, b) for a, b in pairs(z1, z2))
    replicas = h2.state.xhat0
    assert torch.equal(replicas, replicas[:1].expand_as(replicas))  # §7.2: all replicas identical


@pytest.mark.parametrize(
    "alg, field",
    [
        (pa.FedCanon(alpha=0.2, beta=0.03, local_steps=4), "c"),
        (pa.FedCanonII(alpha=0.2, beta=0.03, local_steps=4), "c"),
        (pa.ZA1(eta=0.04, eta_g=0.7, local_steps=4), "c"),
        (pa.FedNMap(lam=0.2, eta=0.04, local_steps=4, server_scale=0.8), "c"),
        (pa.SCAFFNEW(lr=0.04, p=0.3), "e"),
    ],
    ids=lambda v: getattr(v, "name", v),
)
def test_control_variates_sum_to_zero(problem, alg, field):
    """Σ_i c_i = 0 after every round (§7.2), relative to the size of the c_i."""
    worst = []

    def check(t, state, m):
        c = getattr(state, field)
        worst.append(float(c.sum(0).norm()) / (1e-30 + float(c.norm())))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pa.simulate(alg, problem.model(), problem.loss, problem.data, 15, fk.L1(KAPPA),
                    callbacks=[check], metrics_every=0)
    assert len(worst) == 15 and max(worst) < 1e-13


def test_fedmid_matches_reference(problem):
    T, K = 15, 4
    _, ours = run(problem, pa.FedMiD(lr_client=0.04, lr_server=0.8, local_steps=K), T, fk.L1(KAPPA))
    assert max_rel_diff(ours, fedmid_reference(problem, 0.04, 0.8, K, T, KAPPA)) < 1e-12


def test_fedda_matches_reference(problem):
    T, K = 15, 4
    _, ours = run(problem, pa.FedDA(lr_client=0.04, lr_server=0.8, local_steps=K), T, fk.L1(KAPPA))
    assert max_rel_diff(ours, fedda_reference(problem, 0.04, 0.8, K, T, KAPPA)) < 1e-12


# --------------------------------------------------------------------------- convergence to x*


@pytest.mark.parametrize(
    "alg, rounds",
    [
        (pa.ZA1(eta=0.05, local_steps=5), 110),
        (pa.ZA1(eta=0.05, eta_g=0.5, local_steps=5), 220),
        (pa.FedNMap(lam=0.25, eta=0.05, local_steps=5), 110),
        (pa.FedNMap(lam=0.1, eta=0.05, local_steps=5, downlink="z"), 110),
    ],
    ids=lambda v: repr(v) if isinstance(v, pa.Algorithm) else str(v),
)
def test_exact_convergence_to_x_star(problem, x_star, alg, rounds):
    """ZA1 and FedNMap with full gradients converge to x* of the heterogeneous L1 problem (§7.3)."""
    hist, reports = run(problem, alg, rounds, fk.L1(KAPPA), metrics_every=rounds)
    err = float((reports[-1] - x_star).norm())
    assert err < 1e-10, err
    assert torch.equal(reports[-1] == 0, x_star == 0)  # exact support
    assert hist.last["grad_map_sq"] < 1e-18
    if alg.normal_map_point(hist.state) is not None:
        assert hist.last["normal_map_sq"] < 1e-18


def test_fedcanon_bias_shrinks_with_beta_k(problem, x_star):
    """FedCanon does not converge to x*: it keeps a bias that shrinks with βK (§4.1, §7.3)."""
    K, rounds = 5, 150
    errs, steps = {}, {}
    for beta_k in (0.25 / problem.L, 2.5 / problem.L):
        alg = pa.FedCanon(alpha=0.2, beta=beta_k / K, local_steps=K)
        _, reports = run(problem, alg, rounds, fk.L1(KAPPA))
        errs[beta_k] = float((reports[-1] - x_star).norm())
        steps[beta_k] = float((reports[-1] - reports[-2]).norm())
    small, large = sorted(errs)
    assert all(s < 1e-12 for s in steps.values())  # converged: a fixed point, not slowness
    assert 1e-4 < errs[small] < errs[large]
    assert errs[large] > 3 * errs[small]


@pytest.mark.parametrize("alg", [pa.FedMiD(lr_client=0.05, local_steps=5), pa.FedDA(lr_client=0.05, local_steps=5)],
                         ids=lambda a: a.name)
def test_primal_dual_averaging_plateau(problem, x_star, alg):
    """FedMiD / FedDA stall at a point away from x* under heterogeneity (client drift)."""
    _, reports = run(problem, alg, 120, fk.L1(KAPPA))
    err = float((reports[-1] - x_star).norm())
    assert err > 1e-2
    assert float((reports[-1] - reports[-40]).norm()) < 1e-3 * err  # a plateau, not slow progress


# --------------------------------------------------------------------------- prox counts


def test_fedcanon_one_server_prox_per_round(problem):
    T = 7
    alg = pa.FedCanon(alpha=0.2, beta=0.02, local_steps=5)
    with fk.prox_stats() as st:
        hist, _ = run(problem, alg, T, fk.SCAD(0.3))
    assert st.evaluations == T and st.calls == T  # one [d] prox per round: none on the N clients
    assert hist.series("prox_evals") == [1] * T


def test_fedmid_prox_count(problem):
    T, K = 4, 5
    alg = pa.FedMiD(lr_client=0.02, local_steps=K)
    with fk.prox_stats() as st:
        hist, _ = run(problem, alg, T, fk.MCP(0.3, 3.0))
    assert st.evaluations == T * (N * K + 1)
    assert hist.series("prox_evals") == [N * K + 1] * T


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_declared_costs_are_measured(problem, name):
    """prox evaluations, gradient calls and d-vectors up/down per round equal the declared Costs."""
    K, T = 3, 3
    alg = make(name, lr=0.02, local_steps=K)
    hist, _ = run(problem, alg, T, fk.L1(KAPPA))
    c = alg.costs(N)
    for t, m in enumerate(hist.metrics, 1):
        assert m["prox_evals"] == c.client_prox + c.server_prox
        communicates = t % c.comm_every == 0  # DEPOSITUM gossips every τ-th round only
        assert (m["up"], m["down"]) == ((c.up, c.down) if communicates else (0, 0))
        if name == "scaffnew":
            assert m["grad_evals"] % N == 0 and m["grad_evals"] >= N
        else:
            assert m["grad_evals"] == N * c.grads
    assert sum(hist.series("prox_evals")) == (c.client_prox + c.server_prox) * T


def test_zero_regularizer_counts_no_prox(problem):
    hist, _ = run(problem, make("fedmid", lr=0.02, local_steps=3), 2, fk.Zero())
    assert hist.series("prox_evals") == [0, 0]


# --------------------------------------------------------------------------- switches


def test_fednmap_c_update_at_is_a_placement_switch(problem):
    """R1: applying (4) at round start (spec) or right after the server step gives the same iterates."""
    base = dict(lam=0.2, eta=0.04, local_steps=4)
    _, a = run(problem, pa.FedNMap(**base), 12, fk.L1(KAPPA))
    _, b = run(problem, pa.FedNMap(**base, c_update_at="round_end"), 12, fk.L1(KAPPA))
    assert all(torch.equal(u, v) for u, v in pairs(a, b))


def test_fednmap_single_downlink(problem):
    base = dict(lam=0.2, eta=0.04, local_steps=4)
    h1, a = run(problem, pa.FedNMap(**base), 12, fk.L1(KAPPA))
    h2, b = run(problem, pa.FedNMap(**base, downlink="z"), 12, fk.L1(KAPPA))
    assert max_rel_diff(a, b) < 1e-12  # same algorithm, d̄ recovered from two broadcasts
    assert h1.series("down") == [2] * 12 and h2.series("down") == [1] * 12
    with pytest.raises(ValueError, match="round_start"):
        pa.FedNMap(**base, downlink="z", c_update_at="round_end")


# --------------------------------------------------------------------------- validation


def test_fedcanon_rejects_mcp_alpha_at_least_gamma():
    reg = fk.MCP(0.1, gamma=3.0)
    for alpha in (3.0, 3.5):
        with pytest.raises(ValueError, match=r"alpha.*1/rho"):
            pa.FedCanon(alpha=alpha, beta=0.01, local_steps=2).validate(reg)
    pa.FedCanon(alpha=2.9, beta=0.01, local_steps=2).validate(reg)
    pa.FedCanon(alpha=100.0, beta=0.01, local_steps=2).validate(fk.L1(1.0))  # convex h: any alpha
    with pytest.raises(ValueError, match="rho"):  # 2 * MCP(gamma=3) has rho = 2/3
        pa.FedCanon(alpha=1.6, beta=0.01, local_steps=2).validate(2.0 * reg)


def test_simulate_validates_before_running(problem):
    with pytest.raises(ValueError, match="1/rho"):
        pa.simulate(pa.FedCanon(alpha=4.0, beta=0.01, local_steps=2), problem.model(), problem.loss,
                    problem.data, 1, fk.SCAD(0.1, a=3.7))


@pytest.mark.parametrize(
    "alg",
    [
        pa.FedCanonII(alpha=3.0, beta=0.01, local_steps=2),
        pa.ZA1(eta=0.7, local_steps=5),  # τη = 3.5 >= γ
        pa.ZA1(eta=0.5, eta_g=2.0, local_steps=5),  # τη = 2.5 ok, η_g η τ = 5 >= γ
        pa.FedNMap(lam=3.0, eta=0.01, local_steps=2),
        pa.ProxFedAvg(alpha=3.0, beta=0.01, local_steps=2),
        pa.ProxFedAvg(alpha=1.0, beta=3.0, local_steps=2),
        pa.FedMiD(lr_client=3.0, local_steps=1),
        pa.FedMiD(lr_client=1.0, lr_server=1.0, local_steps=3),  # server step η_s η_c K = 3
    ],
    ids=repr,
)
def test_step_rules_rejected(alg):
    with pytest.raises(ValueError, match="rho"):
        alg.validate(fk.MCP(0.1, gamma=3.0))


def test_fedda_not_rejected_and_uses_exact_extension(problem):
    """FedDA's cumulative step passes γ after a few rounds: it is allowed, and the iterates match
    the plain-torch reference with the exact MCP prox (hard threshold past s = γ, §2.3)."""
    lam, gamma = 0.3, 0.5
    reg = fk.MCP(lam, gamma)
    alg = pa.FedDA(lr_client=0.05, local_steps=4)
    alg.validate(reg)
    assert alg.elapsed(10) > gamma

    def mcp_prox(v, s):
        t = v.abs()
        if s < gamma:
            firm = v.sign() * (t - s * lam).clamp_min(0) / (1 - s / gamma)
            return torch.where(t > gamma * lam, v, torch.where(t <= s * lam, torch.zeros_like(v), firm))
        return torch.where(t > lam * math.sqrt(s * gamma), v, torch.zeros_like(v))

    z = problem.x0.clone()
    ref = []
    for r in range(10):
        deltas = []
        for i in range(problem.n):
            zi = z.clone()
            for k in range(4):
                zi = zi - 0.05 * problem.grad_i(i, mcp_prox(zi, alg.elapsed(r, k)))
            deltas.append(zi - z)
        z = z + torch.stack(deltas).mean(0)
        ref.append(mcp_prox(z, alg.elapsed(r + 1)))
    _, ours = run(problem, alg, 10, reg)
    assert max_rel_diff(ours, ref) < 1e-12


@pytest.mark.parametrize("name", ["fedavg", "scaffold", "scaffnew"])
def test_smooth_methods_warn_about_h(name):
    alg = make(name, lr=0.01, local_steps=2)
    with pytest.warns(UserWarning, match="ignores the regularizer"):
        alg.validate(fk.L1(0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alg.validate(fk.Zero())


@pytest.mark.parametrize(
    "factory, kwargs",
    [
        (pa.FedCanon, dict(alpha=-1.0, beta=0.1, local_steps=2)),
        (pa.FedCanon, dict(alpha=0.1, beta=0.1, local_steps=0)),
        (pa.ZA1, dict(eta=0.1, local_steps=2.5)),
        (pa.FedNMap, dict(lam=0.0, eta=0.1, local_steps=2)),
        (pa.FedNMap, dict(lam=0.1, eta=0.1, local_steps=2, c_update_at="later")),
        (pa.SCAFFNEW, dict(lr=0.1, p=0.0)),
        (pa.SCAFFNEW, dict(lr=0.1, p=1.5)),
        (pa.FedDA, dict(lr_client=float("nan"), local_steps=2)),
    ],
)
def test_bad_hyperparameters(factory, kwargs):
    with pytest.raises(ValueError):
        factory(**kwargs)
