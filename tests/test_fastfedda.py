"""Fast-FedDA (docs/algorithms.md §5.5, from the authors' code) against a float64 transcription of its
rules written here in plain torch, on the authors' Lasso generator at a small size, and against a spec
identity: with μ = 0 and γ = 1/η_c its primal is FedDA's (η_s = 1) model.

The transcription follows ``LassoRun.m`` (repository MingruiLiu-ML-Lab/Federated-Sparse-Learning,
commit 48230c3, section "Fast FedDualAvg with strong convexity"), independently of python_algos and
fedkernels: closed-form least-squares gradients, soft-thresholding written here.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import fedkernels as fk
import python_algos as pa
from python_algos.algorithms.registry import make

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def soft(v, t):
    return v.sign() * (v.abs() - t).clamp_min(0)


class AuthorsLasso:
    """The authors' Lasso generator, scaled down: client means μ_i ~ N(0, I), samples x = μ_i + δ with
    δ ~ N(0, Σ), Σ_jk = 0.5^|j−k|, y = xᵀw* + ε, ε ~ N(0, 1), w* = 1 on the first half of the
    coordinates; f_i(w) = (1/(2m)) ||X_i w − y_i||² (their ``loss_grad``)."""

    def __init__(self, n=8, m=12, d=16, seed=0):
        g = torch.Generator().manual_seed(seed)
        idx = torch.arange(d, dtype=torch.float64)
        cov = 0.5 ** (idx[:, None] - idx[None, :]).abs()
        chol = torch.linalg.cholesky(cov)
        self.w_star = (idx < d // 2).double()
        self.data = []
        for _ in range(n):
            mean = torch.randn(d, generator=g, dtype=torch.float64)
            X = mean + torch.randn(m, d, generator=g, dtype=torch.float64) @ chol.T
            y = X @ self.w_star + torch.randn(m, generator=g, dtype=torch.float64)
            self.data.append((X, y))
        self.n, self.m, self.d = n, m, d
        self.x0 = torch.randn(d, generator=g, dtype=torch.float64)  # the same random initial point for all

    def grad_i(self, i, w):
        X, y = self.data[i]
        return X.T @ (X @ w - y) / self.m

    def model(self):
        model = nn.Linear(self.d, 1, bias=False).double()
        with torch.no_grad():
            model.weight.copy_(self.x0.reshape(1, -1))
        return model

    @staticmethod
    def loss(out, y):
        return 0.5 * torch.nn.functional.mse_loss(out.reshape(-1), y)


def transcription(p, sets, mu, gamma, K, lam):
    """§5.5 line by line: the models w after every round, for the sampled client sets."""
    def primal(G, X, t):
        a = G / t - (mu / 2) * X / t - gamma * p.x0 / t
        b = mu / 2 + gamma / t
        return soft(-a / b, lam / b)

    G, X, w, out = torch.zeros(p.d, dtype=torch.float64), p.x0.clone(), p.x0.clone(), []
    for r, S in enumerate(sets, 1):
        Gs, Xs = [], []
        for i in S:
            Gi, Xi, v = G.clone(), X.clone(), w.clone()
            for k in range(1, K + 1):
                t = (r - 1) * K + k
                Gi = Gi + p.grad_i(i, v)
                v = primal(Gi, Xi, t)
                Xi = Xi + v
            Gs.append(Gi)
            Xs.append(Xi)
        G, X = torch.stack(Gs).mean(0), torch.stack(Xs).mean(0)
        w = primal(G, X, r * K)
        X = X + w
        out.append(w)
    return out


def run(p, alg, rounds, reg, **kw):
    reports = []
    cb = lambda t, s, m: reports.append(alg.report(s, reg).clone())  # noqa: E731
    hist = pa.simulate(alg, p.model(), p.loss, p.data, rounds, reg, callbacks=[cb], metrics_every=0, **kw)
    return hist, reports


def max_rel_diff(a_list, b_list):
    assert len(a_list) == len(b_list) > 0
    return max(float((a - b).norm() / (1.0 + b.norm())) for a, b in zip(a_list, b_list))


@pytest.fixture(scope="module")
def lasso():
    return AuthorsLasso()


@pytest.mark.parametrize("mu,gamma", [(0.1, 5.5), (0.0, 3.0), (2.0, 0.7)])
def test_matches_the_transcription_full_participation(lasso, mu, gamma):
    K, T, lam = 3, 12, 0.5 ** 5
    _, ours = run(lasso, pa.FastFedDA(gamma=gamma, mu=mu, local_steps=K), T, fk.L1(lam))
    ref = transcription(lasso, [range(lasso.n)] * T, mu, gamma, K, lam)
    assert max_rel_diff(ours, ref) < 1e-10


def test_matches_the_transcription_with_sampled_clients(lasso):
    """10 of 64 in the authors' experiment; here 3 of 8, the sets recorded by the run."""
    K, T, lam, mu, gamma = 2, 10, 0.5 ** 5, 0.1, 5.5
    sets = []

    def backend(*a, **k):
        cs = pa.SequentialClients(*a, **k)
        draw = cs.participants

        def participants():
            ids = draw()
            sets.append(ids.tolist())
            return ids
        cs.participants = participants
        return cs

    _, ours = run(lasso, pa.FastFedDA(gamma=gamma, mu=mu, local_steps=K), T, fk.L1(lam), clients_per_round=3,
                  seed=5, backend=backend)
    assert len(sets) == T and all(len(s) == 3 for s in sets) and len({tuple(s) for s in sets}) > 1
    assert max_rel_diff(ours, transcription(lasso, sets, mu, gamma, K, lam)) < 1e-10


def test_mu_zero_is_fedda(lasso):
    """Spec identity: with μ = 0, primal(G, X, t) = prox_{(t/γ) h}(x₀ − G/γ), which is FedDA's
    (η_s = 1, η_c = 1/γ) primal of the dual z = x₀ − η_c Σ g at the elapsed step η_c t."""
    K, T, eta = 3, 8, 0.05
    _, fast = run(lasso, pa.FastFedDA(gamma=1 / eta, mu=0.0, local_steps=K), T, fk.L1(0.05))
    _, fedda = run(lasso, pa.FedDA(lr_client=eta, lr_server=1.0, local_steps=K), T, fk.L1(0.05))
    assert max_rel_diff(fast, fedda) < 1e-12


def test_declared_costs(lasso):
    K, T = 3, 4
    alg = pa.FastFedDA(gamma=4.0, mu=0.1, local_steps=K)
    hist, _ = run(lasso, alg, T, fk.MCP(0.01, 50.0))
    c = alg.costs(lasso.n)
    assert (c.client_prox, c.server_prox, c.up, c.down) == (lasso.n * K + 1, 0, 2, 2)
    for m in hist.metrics:
        assert (m["prox_evals"], m["up"], m["down"], m["grad_evals"]) == (lasso.n * K + 1, 2, 2, lasso.n * K)


@pytest.mark.parametrize("kw,match", [(dict(gamma=0.0, local_steps=2), "gamma must be a finite number > 0"),
                                      (dict(gamma=1.0, local_steps=0), "local_steps must be an int >= 1"),
                                      (dict(gamma=1.0, local_steps=2, mu=-0.1), "mu must be a finite number >= 0"),
                                      (dict(gamma=1.0, local_steps=2, mu=float("nan")), "mu must be")])
def test_bad_hyper_parameters_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        pa.FastFedDA(**kw)


def test_weakly_convex_penalty_past_its_limit_warns_once():
    """MCP(λ, γ_mcp) is 1/γ_mcp-weakly convex: with μ = 0 the step t/γ passes γ_mcp at some t."""
    with pytest.warns(UserWarning, match=r"reaches the weakly convex penalty's limit 1/rho = 2 at local step t ≈ 6"):
        pa.FastFedDA(gamma=3.0, local_steps=2).validate(fk.MCP(0.1, 2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pa.FastFedDA(gamma=3.0, mu=1.5, local_steps=2).validate(fk.MCP(0.1, 2.0))  # 2/μ < γ_mcp: never
        pa.FastFedDA(gamma=3.0, local_steps=2).validate(fk.L1(0.1))


def test_registry_name_and_common_parameterization():
    alg = make("fastfedda", lr=0.02, local_steps=4)
    assert (alg.gamma, alg.mu, alg.local_steps) == (50.0, 0.0, 4)
    assert alg.status == "FROM-CODE" and alg.partial_participation
