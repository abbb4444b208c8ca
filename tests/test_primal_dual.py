"""FedDR (§5.8), FedADMM (§5.9) and FedProx (§5.10) against plain-torch references.

Heterogeneous least squares (N = 6, d = 20, float64, full gradients), h = KAPPA ||x||_1. The
references use the *exact* local solutions (closed-form prox of f_i / augmented-Lagrangian argmin,
by a linear solve), independently of python_algos; the algorithms reach them with many warm-started
local gradient steps. Fixed-point checks run the real autograd clients; long runs use the
closed-form client backend of ``_problems``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _problems import LeastSquares, soft

import fedkernels as fk
import python_algos as pa

KAPPA = 0.3


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def problem():
    return LeastSquares()


@pytest.fixture(scope="module")
def x_star(problem):
    return problem.solution(KAPPA)


def run(problem, alg, rounds, reg=None, fast=True, **kw):
    if reg is None:
        reg = fk.L1(KAPPA)
    reports = []

    def cb(t, state, m):
        reports.append(alg.report(state, reg).clone())

    if fast:
        kw["backend"] = problem.backend
    kw.setdefault("metrics_every", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hist = pa.simulate(alg, problem.model(), problem.loss, problem.data, rounds, reg,
                           callbacks=[cb, *kw.pop("callbacks", ())], **kw)
    return hist, reports


def local_lr(problem, eta):
    """1/(L_i + 1/η): the local objective's smoothness constant over all clients."""
    return 1.0 / (float(torch.linalg.eigvalsh(problem.H).max()) + 1.0 / eta)


# --------------------------------------------------------------------------- references (exact local solves)


def feddr_reference(problem, eta, alpha, T, init="paper"):
    n, x0 = problem.n, problem.x0
    if init == "paper":
        y = [x0.clone() for _ in range(n)]
        x = [problem.prox_f_i(i, y[i], eta) for i in range(n)]
        xhat = [2 * x[i] - y[i] for i in range(n)]
    else:
        y = [torch.zeros_like(x0) for _ in range(n)]
        x = [x0.clone() for _ in range(n)]
        xhat = [torch.zeros_like(x0) for _ in range(n)]
    xbar, out = x0.clone(), []
    for _ in range(T):
        for i in range(n):
            y[i] = y[i] + alpha * (xbar - x[i])
            x[i] = problem.prox_f_i(i, y[i], eta)
            xhat[i] = 2 * x[i] - y[i]
        xbar = soft(torch.stack(xhat).mean(0), eta * KAPPA)
        out.append(xbar)
    return out


def fedadmm_reference(problem, eta, T):
    n, d, x0 = problem.n, problem.d, problem.x0
    z = [torch.zeros_like(x0) for _ in range(n)]
    xhat = [x0.clone() for _ in range(n)]
    xbar, out = x0.clone(), []
    eye = torch.eye(d, dtype=torch.float64)
    for _ in range(T):
        for i in range(n):  # argmin f_i(x) + <z_i, x − x̄> + ||x − x̄||²/(2η)
            xi = torch.linalg.solve(problem.H[i] + eye / eta, problem.q[i] - z[i] + xbar / eta)
            z[i] = z[i] + (xi - xbar) / eta
            xhat[i] = xi + eta * z[i]
        xbar = soft(torch.stack(xhat).mean(0), eta * KAPPA)
        out.append(xbar)
    return out


def fedprox_reference(problem, lr, K, mu, T, server_step=None):
    x, out = problem.x0.clone(), []
    for _ in range(T):
        ends = []
        for i in range(problem.n):
            xi = x.clone()
            for _ in range(K):
                xi = xi - lr * (problem.grad_i(i, xi) + mu * (xi - x))
            ends.append(xi)
        x = torch.stack(ends).mean(0)
        if server_step is not None:
            x = soft(x, server_step * KAPPA)
        out.append(x)
    return out


def max_rel_diff(a_list, b_list):
    assert len(a_list) == len(b_list) > 0
    return max(float((a - b).norm() / (1.0 + b.norm())) for a, b in zip(a_list, b_list))


# --------------------------------------------------------------------------- exact local solves


@pytest.mark.parametrize("init", ["paper", "code"])
def test_feddr_matches_exact_reference_and_converges(problem, x_star, init):
    eta, alpha, T = 0.5, 0.9, 100
    alg = pa.FedDR(eta=eta, alpha=alpha, lr_local=local_lr(problem, eta), local_steps=150, init_from=init)
    _, ours = run(problem, alg, T)
    ref = feddr_reference(problem, eta, alpha, T, init)
    assert max_rel_diff(ours, ref) < 1e-9
    assert float((ref[-1] - x_star).norm()) < 1e-10  # DR with exact prox converges to x*
    assert float((ours[-1] - x_star).norm()) < 1e-10


def test_fedadmm_matches_exact_reference_and_converges(problem, x_star):
    eta, T = 0.5, 100
    alg = pa.FedADMM(eta=eta, lr_local=local_lr(problem, eta), local_steps=150)
    _, ours = run(problem, alg, T)
    ref = fedadmm_reference(problem, eta, T)
    assert max_rel_diff(ours, ref) < 1e-9
    assert float((ref[-1] - x_star).norm()) < 1e-10
    assert float((ours[-1] - x_star).norm()) < 1e-10


@pytest.mark.parametrize(
    "make_alg",
    [lambda lr: pa.FedDR(eta=0.5, lr_local=lr, local_steps=5),
     lambda lr: pa.FedDR(eta=0.5, alpha=1.5, lr_local=lr, local_steps=2),
     lambda lr: pa.FedADMM(eta=0.5, lr_local=lr, local_steps=5)],
    ids=["feddr-K5", "feddr-alpha1.5-K2", "fedadmm-K5"],
)
def test_inexact_local_solves_still_reach_x_star(problem, x_star, make_alg):
    """A few local steps: the fixed point of the inexact scheme is still x* (warm starts; §5.8)."""
    alg = make_alg(local_lr(problem, 0.5))
    hist, ours = run(problem, alg, 400, metrics_every=400)
    assert float((ours[-1] - x_star).norm()) < 1e-10
    assert torch.equal(ours[-1] == 0, x_star == 0)
    assert hist.last["grad_map_sq"] < 1e-20


# --------------------------------------------------------------------------- fixed points (real clients)


def test_feddr_fixed_point(problem, x_star):
    """Start at x* with consistent DR variables (y_i = x* + η ∇f_i(x*)): FedDR stays at x*."""
    eta = 0.5
    alg = pa.FedDR(eta=eta, lr_local=local_lr(problem, eta), local_steps=3)
    clients = problem.clients()
    reg = fk.L1(KAPPA)
    state = alg.init(problem.x0, clients)
    G = torch.stack([problem.grad_i(i, x_star) for i in range(problem.n)])
    state.y.copy_(x_star + eta * G)
    state.x.copy_(x_star.expand_as(G))
    state.xhat.copy_(2 * state.x - state.y)
    state.xtilde.copy_(state.xhat.mean(0))
    state.xbar.copy_(x_star)
    for _ in range(20):
        state = alg.round(state, clients, reg)
    assert float((state.xbar - x_star).norm()) < 1e-13
    assert float((state.x - x_star).abs().max()) < 1e-13
    assert torch.equal(state.xbar == 0, x_star == 0)


def test_fedadmm_fixed_point(problem, x_star):
    """Start at x* with consistent duals (z_i = −∇f_i(x*)): FedADMM stays at x*."""
    eta = 0.5
    alg = pa.FedADMM(eta=eta, lr_local=local_lr(problem, eta), local_steps=3)
    clients = problem.clients()
    reg = fk.L1(KAPPA)
    state = alg.init(problem.x0, clients)
    G = torch.stack([problem.grad_i(i, x_star) for i in range(problem.n)])
    state.z.copy_(-G)
    state.xhat.copy_(x_star - eta * G)
    state.xtilde.copy_(state.xhat.mean(0))
    state.xbar.copy_(x_star)
    for _ in range(20):
        state = alg.round(state, clients, reg)
    assert float((state.xbar - x_star).norm()) < 1e-13
    assert float((state.z + G).abs().max()) < 1e-12


@pytest.mark.parametrize("alg", [pa.FedDR(eta=0.4, lr_local=0.05, local_steps=3),
                                 pa.FedADMM(eta=0.4, lr_local=0.05, local_steps=3)], ids=lambda a: a.name)
def test_server_average_invariant(problem, alg):
    """x̃ = (1/N) Σ_i x̂_i every round (the running sum of uploaded changes), real clients."""
    gaps = []
    cb = lambda t, s, m: gaps.append(float((s.xtilde - s.xhat.mean(0)).norm() / s.xhat.norm()))  # noqa: E731
    run(problem, alg, 10, fast=False, callbacks=[cb])
    assert len(gaps) == 10 and max(gaps) < 1e-14


# --------------------------------------------------------------------------- FedProx


def test_fedprox_matches_reference(problem):
    lr, K, mu, T = 0.03, 4, 0.5, 12
    _, ours = run(problem, pa.FedProx(lr_local=lr, local_steps=K, mu=mu), T, reg=fk.Zero(), fast=False)
    assert max_rel_diff(ours, fedprox_reference(problem, lr, K, mu, T)) < 1e-12


def test_fedprox_composite_extension(problem):
    """Our extension: prox_{s h} of the averaged model on the server (s = η K by default)."""
    lr, K, mu, T = 0.03, 4, 0.5, 12
    for step, alg in ((lr * K, pa.FedProx(lr_local=lr, local_steps=K, mu=mu, server_prox=True)),
                      (0.05, pa.FedProx(lr_local=lr, local_steps=K, mu=mu, server_prox=True, server_prox_step=0.05))):
        hist, ours = run(problem, alg, T)
        assert max_rel_diff(ours, fedprox_reference(problem, lr, K, mu, T, server_step=step)) < 1e-12
        assert hist.series("prox_evals") == [1] * T and alg.costs(6).server_prox == 1
        assert (ours[-1] == 0).any()


def test_fedprox_mu_zero_is_fedavg(problem):
    _, a = run(problem, pa.FedProx(lr_local=0.03, local_steps=3, mu=0.0), 8, reg=fk.Zero())
    _, b = run(problem, pa.FedAvg(lr_local=0.03, local_steps=3), 8, reg=fk.Zero())
    assert max_rel_diff(a, b) < 1e-14


# --------------------------------------------------------------------------- validation


def test_primal_dual_validation():
    reg = fk.MCP(0.1, gamma=3.0)  # 1/rho = 3
    pa.FedDR(eta=2.9, lr_local=0.1, local_steps=1).validate(reg)
    for alg in (pa.FedDR(eta=3.0, lr_local=0.1, local_steps=1), pa.FedADMM(eta=3.5, lr_local=0.1, local_steps=1),
                pa.FedProx(lr_local=1.0, local_steps=3, server_prox=True)):
        with pytest.raises(ValueError, match="1/rho"):
            alg.validate(reg)
    pa.FedProx(lr_local=1.0, local_steps=3).validate(fk.Zero())
    with pytest.warns(UserWarning, match="ignores the regularizer"):
        pa.FedProx(lr_local=1.0, local_steps=3).validate(reg)  # the original FedProx is smooth
    for factory, kw in ((pa.FedDR, dict(eta=1.0, lr_local=0.1, local_steps=1, alpha=2.0)),
                        (pa.FedDR, dict(eta=1.0, lr_local=0.1, local_steps=1, init_from="zeros")),
                        (pa.FedDR, dict(eta=0.0, lr_local=0.1, local_steps=1)),
                        (pa.FedADMM, dict(eta=1.0, lr_local=0.1, local_steps=0)),
                        (pa.FedProx, dict(lr_local=0.1, local_steps=1, mu=-1.0)),
                        (pa.FedProx, dict(lr_local=0.1, local_steps=1, server_prox_step=0.1))):
        with pytest.raises(ValueError):
            factory(**kw)
