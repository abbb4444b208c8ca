"""DEPOSITUM (docs/algorithms.md §4.5) and the topologies of python_algos.algorithms.topology.

Heterogeneous least squares (N = 6, d = 20, float64, full gradients unless stated). References are
plain torch: the server form of DEPOSITUM (W = J, τ = 1, paper Remark 3) with closed-form gradients,
and the centralized proximal-gradient solutions of f + h and γf + h. Long runs use the closed-form
client backend of ``_problems`` (same algorithm code, batched closed-form gradients).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from _problems import LeastSquares, soft

import fedkernels as fk
import python_algos as pa
from python_algos.algorithms import topology as topo

KAPPA = 0.3


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def problem():
    return LeastSquares()


@pytest.fixture(scope="module")
def x_star(problem):
    return problem.solution(KAPPA)


def run(problem, alg, rounds, reg=None, fast=False, **kw):
    """simulate(); returns (History, [x̄ after every round])."""
    if reg is None:
        reg = fk.L1(KAPPA)
    reports = []
    cb = lambda t, state, m: reports.append(alg.report(state, reg).clone())  # noqa: E731
    if fast:
        kw["backend"] = problem.backend
    kw.setdefault("metrics_every", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hist = pa.simulate(alg, problem.model(), problem.loss, problem.data, rounds, reg,
                           callbacks=[cb, *kw.pop("callbacks", ())], **kw)
    return hist, reports


# --------------------------------------------------------------------------- topologies


def test_metropolis_hastings_weights():
    W = topo.ring(6).W
    for i in range(6):
        assert W[i, (i + 1) % 6] == W[i, (i - 1) % 6] == pytest.approx(1 / 3)
        assert W[i, i] == pytest.approx(1 / 3)
    assert np.count_nonzero(W) == 18
    np.testing.assert_array_equal(topo.complete(5).W, np.full((5, 5), 0.2))  # MH on K_n is J exactly
    S = topo.star(5)
    assert list(S.degrees) == [4, 1, 1, 1, 1] and S.mean_degree == pytest.approx(8 / 5)
    np.testing.assert_allclose(S.W[0, 1:], 0.2)  # 1/(1 + max(4, 1))
    np.testing.assert_allclose(S.W[1:, 1:], np.diag([0.8] * 4))
    T = topo.torus(12)  # 3 x 4
    assert list(T.degrees) == [4] * 12 and T.num_nodes == 12
    for t in (topo.ring(7), S, T, topo.erdos_renyi(9, p=0.4, seed=3)):
        W = t.W
        np.testing.assert_allclose(W, W.T, atol=0)
        np.testing.assert_allclose(W.sum(0), 1, atol=1e-15)
        np.testing.assert_allclose(W.sum(1), 1, atol=1e-15)
        assert (W >= 0).all() and t.lambda_w < 1


def test_erdos_renyi_is_seeded_and_connected():
    a, b, c = (topo.erdos_renyi(12, p=0.25, seed=s) for s in (5, 5, 6))
    assert a == b and hash(a) == hash(b) and a != c
    assert a.lambda_w < 1  # connected (validated) and aperiodic
    assert topo.erdos_renyi(10).name == "erdos_renyi"  # default p = 2 ln(n)/n


def test_user_adjacency_and_matrix():
    A = np.zeros((4, 4), dtype=int)
    for i, j in ((0, 1), (1, 2), (2, 3)):  # a path
        A[i, j] = A[j, i] = 1
    t = topo.canonical(A)  # a 0/1 zero-diagonal matrix is an adjacency: MH weights
    assert t.name == "custom" and list(t.degrees) == [1, 2, 2, 1]
    assert t.W[0, 1] == pytest.approx(1 / 3) and t.W[0, 0] == pytest.approx(2 / 3)
    W = t.W.copy()
    assert topo.canonical(torch.tensor(W)) == t  # anything else is W itself
    alg = pa.DEPOSITUM(alpha=0.1, topology=W)
    assert alg.topology == t and alg.hparams()["topology"]["W"] == W.tolist()
    assert alg == pa.DEPOSITUM(alpha=0.1, topology=t.W) and hash(alg) == hash(pa.DEPOSITUM(alpha=0.1, topology=W))
    with pytest.raises(ValueError, match="4 nodes but there are 6 clients"):
        topo.build(t, 6)


@pytest.mark.parametrize(
    "W, match",
    [
        ([[0.5, 0.5], [0.4, 0.6]], "symmetric"),
        ([[0.6, 0.5], [0.5, 0.6]], "doubly stochastic"),
        ([[1.2, -0.2], [-0.2, 1.2]], "non-negative"),
        (np.eye(4), "connected.*2|connected.*4 components"),
        ([[0.0, 1.0], [1.0, 0.0]], r"\|\|W - J\|\|_2"),  # bipartite, zero self-weights: eigenvalue -1
        (np.ones((2, 3)) / 3, "square"),
    ],
)
def test_bad_mixing_matrices(W, match):
    with pytest.raises(ValueError, match=match):
        topo.from_matrix(W)


def test_bad_topology_arguments():
    with pytest.raises(ValueError, match="unknown topology"):
        pa.DEPOSITUM(alpha=0.1, topology="hypercube")
    with pytest.raises(TypeError):
        pa.DEPOSITUM(alpha=0.1, topology=3)
    with pytest.raises(ValueError, match="connected"):
        pa.DEPOSITUM(alpha=0.1, topology=np.array([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]))
    with pytest.raises(ValueError, match="divisor"):
        topo.torus(12, rows=5)
    with pytest.raises(ValueError, match="increase p"):
        topo.erdos_renyi(30, p=0.01, seed=0, max_tries=5)


# --------------------------------------------------------------------------- spec identities


def server_form(problem, alpha, gamma, beta, T, momentum, step, kappa=KAPPA):
    """DEPOSITUM with W = J and τ = 1 (every client identical): one vector each, plain torch."""
    x = problem.x0.clone()
    m, y, g_old = (torch.zeros_like(x) for _ in range(3))
    out = []
    for _ in range(T):
        m_new = beta * m + (1 - beta) * y
        direction = m_new if momentum == "shb" else beta * m_new + (1 - beta) * y
        m = m_new
        x = soft(x - alpha * direction, step * kappa)
        g = problem.grad(x)
        y = y + gamma * (g - g_old)
        g_old = g
        out.append(x)
    return out


@pytest.mark.parametrize("momentum", ["shb", "snag"])
@pytest.mark.parametrize("prox_step", ["alpha", "alpha*gamma"])
def test_complete_graph_equals_server_form(problem, momentum, prox_step):
    """W = J (complete graph, MH weights), τ = 1: x̄ follows the server form (Remark 3); real clients."""
    alpha, gamma, beta, T = 0.08, 1.5, 0.6, 25
    alg = pa.DEPOSITUM(alpha=alpha, gamma=gamma, beta=beta, period=1, momentum=momentum, topology="complete",
                       prox_step=prox_step)
    hist, ours = run(problem, alg, T)
    ref = server_form(problem, alpha, gamma, beta, T, momentum, alg.step)
    err = max(float((a - b).norm() / (1 + b.norm())) for a, b in zip(ours, ref))
    assert err < 1e-12, err
    X = hist.state.x
    assert float((X - X.mean(0)).abs().max()) < 1e-13  # every client holds the same model


@pytest.mark.parametrize("momentum", ["shb", "snag"])
def test_ring_with_period_converges_to_x_star(problem, x_star, momentum):
    """γ = 1, ring of 6, τ = 4, full gradients: x̄ -> x* of the convex L1 problem (§7.3), consensus."""
    alg = pa.DEPOSITUM(alpha=0.1, gamma=1.0, beta=0.5, period=4, momentum=momentum, topology="ring")
    hist, xbar = run(problem, alg, 800, fast=True, metrics_every=800)
    err = float((xbar[-1] - x_star).norm())
    assert err < 1e-10, err
    assert torch.equal(xbar[-1] == 0, x_star == 0)  # exact support... of the average
    m = hist.last
    assert m["grad_map_sq"] < 1e-20 and m["consensus_x"] < 1e-20 and m["consensus_y"] < 1e-20
    assert m["grad_est_err"] < 1e-20 and m["tracking_gap_rel"] < 1e-12
    assert (hist.state.x == 0).sum() == 6 * int((x_star == 0).sum())  # every client's prox output is sparse


def test_gamma_and_prox_step_switch(problem, x_star):
    """A3: with γ != 1, prox_step="alpha" converges to the stationary point of γf + h, while
    prox_step="alpha*gamma" converges to that of f + h (§4.5, §7.3)."""
    gamma = 2.0
    x_gamma = problem.solution(KAPPA, gamma=gamma)
    assert float((x_gamma - x_star).norm()) > 0.05  # the two problems differ
    targets = {"alpha": x_gamma, "alpha*gamma": x_star}
    for prox_step, target in targets.items():
        alg = pa.DEPOSITUM(alpha=0.05, gamma=gamma, beta=0.5, period=2, topology="ring", prox_step=prox_step)
        _, xbar = run(problem, alg, 800, fast=True)
        err = float((xbar[-1] - target).norm())
        assert err < 1e-10, (prox_step, err)


def test_tracking_invariant_with_minibatches(problem):
    """mean_i y_i = γ mean_i g_i after every iteration (Remark 1, §7.2), stochastic gradients, τ = 3."""
    gamma = 0.7
    alg = pa.DEPOSITUM(alpha=0.05, gamma=gamma, beta=0.8, period=3, momentum="snag", topology="ring")
    gaps = []

    def check(t, state, m):
        target = gamma * state.g.mean(0)
        gaps.append(float((state.y.mean(0) - target).norm() / target.norm()))

    hist, _ = run(problem, alg, 12, batch_size=10, callbacks=[check], metrics_every=3)
    assert len(gaps) == 12 and max(gaps) < 1e-13
    assert all(m["tracking_gap_rel"] < 1e-13 for m in hist.metrics if "tracking_gap_rel" in m)
    assert hist.metrics[0]["grad_evals"] == 6 and hist.metrics[0]["prox_evals"] == 6


def test_gossip_counts_and_sparse_mixing(problem):
    """Gossip every τ-th round only: 2·deg vectors each way (mean degree on a star); a sparse W gives
    the same iterates as the dense one."""
    base = dict(alpha=0.05, beta=0.5, period=3)
    dense, sparse = (pa.DEPOSITUM(**base, topology="star", mixing=m) for m in ("dense", "sparse"))
    h_dense, a = run(problem, dense, 9)
    h_sparse, b = run(problem, sparse, 9)
    assert sparse.mixing_matrix(6).layout == torch.sparse_coo and dense.mixing_matrix(6).layout == torch.strided
    assert pa.DEPOSITUM(alpha=0.1).mixing_matrix(6).layout == torch.strided  # auto: dense for small N
    assert pa.DEPOSITUM(alpha=0.1).mixing_matrix(100).layout == torch.sparse_coo  # ring of 100: 3% dense
    assert max(float((u - v).norm()) for u, v in zip(a, b)) < 1e-13
    star = 2 * 10 / 6  # mean degree of a 6-star is 10/6; x̃ and ỹ each way
    assert h_dense.series("up") == pytest.approx([0, 0, star] * 3)
    assert h_dense.series("down") == h_dense.series("up")
    assert pa.DEPOSITUM(**base, topology="star").costs(6).up == pytest.approx(star)


def test_first_iteration_is_a_pure_prox_step(problem):
    """A4 default: m⁰ = y⁰ = g⁰ = 0, so x¹ = prox_{αh}(x⁰); ``tracker_init="gradient"`` moves at once."""
    reg = fk.L1(KAPPA)
    _, a = run(problem, pa.DEPOSITUM(alpha=0.1, beta=0.5), 1, reg)
    torch.testing.assert_close(a[0], soft(problem.x0, 0.1 * KAPPA), rtol=0, atol=1e-15)
    _, b = run(problem, pa.DEPOSITUM(alpha=0.1, beta=0.5, tracker_init="gradient", topology="complete"), 1, reg)
    # y⁰ = g_i(x⁰): x̃_i = prox(x⁰ − α (1 − β) g_i(x⁰)), then averaged (τ = 1, W = J)
    moved = torch.stack([soft(problem.x0 - 0.1 * 0.5 * problem.grad_i(i, problem.x0), 0.1 * KAPPA)
                         for i in range(problem.n)]).mean(0)
    torch.testing.assert_close(b[0], moved, rtol=0, atol=1e-13)


def test_unnormalized_momentum(problem):
    """A1 switch: m = β m + y (no 1 − β) — the server form with w = 1 (W = J, τ = 1)."""
    alpha, beta, T = 0.02, 0.5, 10
    _, ours = run(problem, pa.DEPOSITUM(alpha=alpha, beta=beta, topology="complete", normalized=False), T)
    x = problem.x0.clone()
    m, y, g_old = (torch.zeros_like(x) for _ in range(3))
    for t in range(T):
        m = beta * m + y
        x = soft(x - alpha * m, alpha * KAPPA)
        g = problem.grad(x)
        y, g_old = y + (g - g_old), g
        assert float((ours[t] - x).norm()) < 1e-12


# --------------------------------------------------------------------------- validation


def test_depositum_validation():
    reg = fk.MCP(0.1, gamma=3.0)  # 1/rho = 3
    pa.DEPOSITUM(alpha=2.9).validate(reg)
    with pytest.raises(ValueError, match=r"alpha \(prox step\).*1/rho"):
        pa.DEPOSITUM(alpha=3.0).validate(reg)
    pa.DEPOSITUM(alpha=2.0, gamma=2.0).validate(reg)  # literal prox step α = 2
    with pytest.raises(ValueError, match=r"alpha\*gamma"):
        pa.DEPOSITUM(alpha=2.0, gamma=2.0, prox_step="alpha*gamma").validate(reg)  # αγ = 4
    for kw in (dict(beta=1.0), dict(beta=-0.1), dict(period=0), dict(momentum="adam"), dict(prox_step="gamma"),
               dict(gamma=0.0), dict(tracker_init="ones"), dict(mixing="csr"), dict(normalized=1)):
        with pytest.raises(ValueError):
            pa.DEPOSITUM(alpha=0.1, **kw)
    with pytest.raises(ValueError):
        pa.DEPOSITUM(alpha=-0.1)
