"""Partial participation (docs/algorithms.md §1.4): sampled client sets, stale state, rejection.

The sampled sets are recorded by the closed-form client backend of ``_problems``; every supported
algorithm is then checked against a plain-torch reference that uses the same sets (closed-form
gradients, heterogeneous least squares, N = 6, d = 20, float64).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from _problems import LeastSquares, soft

import fedkernels as fk
import python_algos as pa
from python_algos.algorithms.registry import ALGORITHMS, make
from python_algos.runfolder.callbacks import Checkpoint

KAPPA = 0.3
N = 6


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def problem():
    return LeastSquares(n=N)


def run(problem, alg, rounds, reg=None, fast=True, **kw):
    """simulate(); returns (History, reports after every round, the client set)."""
    if reg is None:
        reg = fk.L1(KAPPA)
    made, reports = [], []

    def backend(*a, **k):
        made.append(problem.backend(*a, **k) if fast else pa.SequentialClients(*a, **k))
        return made[-1]

    cb = lambda t, s, m: reports.append(alg.report(s, reg).clone())  # noqa: E731
    kw.setdefault("metrics_every", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hist = pa.simulate(alg, problem.model(), problem.loss, problem.data, rounds, reg, backend=backend,
                           callbacks=[cb, *kw.pop("callbacks", ())], **kw)
    return hist, reports, made[0]


def max_rel_diff(a_list, b_list):
    assert len(a_list) == len(b_list) > 0
    return max(float((a - b).norm() / (1.0 + b.norm())) for a, b in zip(a_list, b_list))


# --------------------------------------------------------------------------- who supports it


FULL_ONLY = ["fedcanon", "fedcanon2", "fednmap", "za1", "scaffnew", "prox_fedavg", "depositum"]
SAMPLED = ["fedmid", "fedda", "fastfedda", "fedavg", "scaffold", "fedprox", "feddr", "fedadmm"]


def test_every_algorithm_declares_participation():
    assert sorted(FULL_ONLY + SAMPLED) == sorted(ALGORITHMS)
    for name in SAMPLED:
        assert ALGORITHMS[name].cls.partial_participation
    for name in FULL_ONLY:
        assert not ALGORITHMS[name].cls.partial_participation


@pytest.mark.parametrize("name", FULL_ONLY)
def test_full_participation_algorithms_reject_sampling(problem, name):
    alg = make(name, lr=0.02, local_steps=2)
    with pytest.raises(ValueError, match=f"{alg.name} does not support partial participation .3 of 6"):
        run(problem, alg, 1, participation=0.5)
    with pytest.raises(ValueError, match="does not support partial participation"):
        run(problem, alg, 1, clients_per_round=5)
    hist, _, cs = run(problem, alg, 1, clients_per_round=N)  # k = N is full participation
    assert cs.clients_per_round is None and len(hist.metrics) == 1


def test_participation_arguments(problem):
    alg = pa.FedMiD(lr_client=0.02, local_steps=1)
    for kw in (dict(participation=0.0), dict(participation=1.5), dict(participation=True),
               dict(clients_per_round=0), dict(clients_per_round=N + 1), dict(clients_per_round=2.0),
               dict(participation=0.5, clients_per_round=3)):
        with pytest.raises(ValueError):
            run(problem, alg, 1, **kw)
    for p, k in ((0.5, 3), (0.01, 1), (0.99, None), (1.0, None)):
        _, _, cs = run(problem, alg, 1, participation=p)
        assert cs.clients_per_round == k


# --------------------------------------------------------------------------- sampling


def test_sampling_is_reproducible_by_seed(problem):
    alg = pa.FedDR(eta=0.5, lr_local=0.05, local_steps=2)
    a = run(problem, alg, 8, clients_per_round=3, seed=1)
    b = run(problem, alg, 8, clients_per_round=3, seed=1)
    c = run(problem, alg, 8, clients_per_round=3, seed=2)
    sets_a, sets_b, sets_c = (r[2].sampled for r in (a, b, c))
    assert len(sets_a) == 8
    for s in sets_a:
        assert s.dtype == torch.int64 and len(s) == 3 and len(set(s.tolist())) == 3
        assert s.tolist() == sorted(s.tolist()) and 0 <= int(s.min()) and int(s.max()) < N
    assert all(torch.equal(u, v) for u, v in zip(sets_a, sets_b)) and torch.equal(a[0].params, b[0].params)
    assert any(not torch.equal(u, v) for u, v in zip(sets_a, sets_c)) and not torch.equal(a[0].params, c[0].params)
    assert len({tuple(s.tolist()) for s in sets_a}) > 1  # a new set every round
    # the minibatch generators are not consumed by sampling: a different stream (2) of the seed
    assert "participation_rng" in a[2].rng_state() and "generators" in a[2].rng_state()


def test_resume_continues_the_same_sample_sequence(problem):
    """The participant generator is part of the client set's checkpointed RNG state."""
    alg = pa.SCAFFOLD(lr_local=0.03, local_steps=2)
    snaps = {}
    ckpt = lambda snap: snaps.setdefault(snap["round"], copy.deepcopy(snap))  # noqa: E731
    full, _, cs_full = run(problem, alg, 10, reg=fk.Zero(), clients_per_round=2, seed=4,
                           callbacks=[Checkpoint(ckpt, 5)])
    resumed, _, cs_res = run(problem, alg, 10, reg=fk.Zero(), clients_per_round=2, seed=4, resume=snaps[5])
    assert [s.tolist() for s in cs_res.sampled] == [s.tolist() for s in cs_full.sampled[5:]]
    assert torch.equal(full.params, resumed.params)


def test_counts_are_per_participating_client(problem):
    """Real clients: only the k participants compute; up/down count vectors per participant."""
    K, k = 3, 2
    hist, _, _ = run(problem, pa.FedMiD(lr_client=0.02, local_steps=K), 3, fast=False, clients_per_round=k)
    assert hist.series("grad_evals") == [k * K] * 3
    assert hist.series("prox_evals") == [k * K + 1] * 3
    assert hist.series("up") == [1] * 3 and hist.series("down") == [1] * 3
    hist, _, _ = run(problem, pa.SCAFFOLD(lr_local=0.02, local_steps=K), 2, reg=fk.Zero(), fast=False,
                     participation=0.5)
    assert hist.series("grad_evals") == [3 * K] * 2 and hist.series("up") == [2, 2]


# --------------------------------------------------------------------------- references with the same sets


def fedmid_reference(problem, sets, eta_c, K, eta_s=1.0):
    x, out = problem.x0.clone(), []
    for S in sets:
        ends = []
        for i in S.tolist():
            y = x.clone()
            for _ in range(K):
                y = soft(y - eta_c * problem.grad_i(i, y), eta_c * KAPPA)
            ends.append(y)
        x = soft(x + eta_s * (torch.stack(ends).mean(0) - x), eta_s * eta_c * K * KAPPA)
        out.append(x)
    return out


def fedda_reference(problem, sets, eta_c, K, eta_s=1.0):
    z, out = problem.x0.clone(), []
    for r, S in enumerate(sets):
        deltas = []
        for i in S.tolist():
            zi = z.clone()
            for k in range(K):
                zi = zi - eta_c * problem.grad_i(i, soft(zi, (eta_s * eta_c * r * K + eta_c * k) * KAPPA))
            deltas.append(zi - z)
        z = z + eta_s * torch.stack(deltas).mean(0)
        out.append(soft(z, eta_s * eta_c * (r + 1) * K * KAPPA))
    return out


def fastfedda_reference(problem, sets, gamma, mu, K):
    """§5.5 with h = KAPPA ||x||_1: primal(G, X, t) = soft(−a/b, KAPPA/b)."""
    def primal(G, X, t):
        b = mu / 2 + gamma / t
        return soft(-(G / t - mu / 2 * X / t - gamma * problem.x0 / t) / b, KAPPA / b)

    G, X, w, out = torch.zeros_like(problem.x0), problem.x0.clone(), problem.x0.clone(), []
    for r, S in enumerate(sets):
        Gs, Xs = [], []
        for i in S.tolist():
            Gi, Xi, v = G.clone(), X.clone(), w.clone()
            for k in range(1, K + 1):
                Gi = Gi + problem.grad_i(i, v)
                v = primal(Gi, Xi, r * K + k)
                Xi = Xi + v
            Gs.append(Gi)
            Xs.append(Xi)
        G, X = torch.stack(Gs).mean(0), torch.stack(Xs).mean(0)
        w = primal(G, X, (r + 1) * K)
        X = X + w
        out.append(w)
    return out


def fedprox_reference(problem, sets, lr, K, mu):
    x, out = problem.x0.clone(), []
    for S in sets:
        ends = []
        for i in S.tolist():
            xi = x.clone()
            for _ in range(K):
                xi = xi - lr * (problem.grad_i(i, xi) + mu * (xi - x))
            ends.append(xi)
        x = torch.stack(ends).mean(0)
        out.append(x)
    return out


def scaffold_reference(problem, sets, eta_l, K, eta_g=1.0):
    x = problem.x0.clone()
    c = torch.zeros_like(x)
    c_i = [torch.zeros_like(x) for _ in range(problem.n)]
    out = []
    for S in sets:
        dys, dcs = [], []
        for i in S.tolist():
            y = x.clone()
            for _ in range(K):
                y = y - eta_l * (problem.grad_i(i, y) - c_i[i] + c)
            c_plus = c_i[i] - c + (x - y) / (K * eta_l)
            dys.append(y - x)
            dcs.append(c_plus - c_i[i])
            c_i[i] = c_plus
        x = x + eta_g * torch.stack(dys).mean(0)
        c = c + torch.stack(dcs).sum(0) / problem.n
        out.append(x)
    return out


def feddr_reference(problem, sets, eta, alpha, lr, K):
    """FedDR with warm-started local GD (the code's solver), paper init, stale x̂ for non-sampled."""
    n, x0 = problem.n, problem.x0

    def local(i, x, y):
        for _ in range(K):
            x = x - lr * (problem.grad_i(i, x) + (x - y) / eta)
        return x

    y = [x0.clone() for _ in range(n)]
    x = [local(i, x0.clone(), y[i]) for i in range(n)]
    xhat = [2 * x[i] - y[i] for i in range(n)]
    xbar, out = x0.clone(), []
    for S in sets:
        for i in S.tolist():
            y[i] = y[i] + alpha * (xbar - x[i])
            x[i] = local(i, x[i], y[i])
            xhat[i] = 2 * x[i] - y[i]
        xbar = soft(torch.stack(xhat).mean(0), eta * KAPPA)  # latest x̂ of ALL clients
        out.append(xbar)
    return out


def fedadmm_reference(problem, sets, eta, lr, K):
    n, x0 = problem.n, problem.x0
    z = [torch.zeros_like(x0) for _ in range(n)]
    xhat = [x0.clone() for _ in range(n)]
    xbar, out = x0.clone(), []
    for S in sets:
        for i in S.tolist():
            xi = xbar.clone()
            for _ in range(K):
                xi = xi - lr * (problem.grad_i(i, xi) + z[i] + (xi - xbar) / eta)
            z[i] = z[i] + (xi - xbar) / eta
            xhat[i] = xi + eta * z[i]
        xbar = soft(torch.stack(xhat).mean(0), eta * KAPPA)
        out.append(xbar)
    return out


CASES = {
    "fedmid": (pa.FedMiD(lr_client=0.04, lr_server=0.8, local_steps=3), fk.L1(KAPPA),
               lambda p, S: fedmid_reference(p, S, 0.04, 3, 0.8)),
    "fedda": (pa.FedDA(lr_client=0.04, lr_server=0.8, local_steps=3), fk.L1(KAPPA),
              lambda p, S: fedda_reference(p, S, 0.04, 3, 0.8)),
    "fastfedda": (pa.FastFedDA(gamma=8.0, mu=0.2, local_steps=3), fk.L1(KAPPA),
                  lambda p, S: fastfedda_reference(p, S, 8.0, 0.2, 3)),
    "fedavg": (pa.FedAvg(lr_local=0.04, local_steps=3), fk.Zero(), lambda p, S: fedprox_reference(p, S, 0.04, 3, 0.0)),
    "fedprox": (pa.FedProx(lr_local=0.04, local_steps=3, mu=0.3), fk.Zero(),
                lambda p, S: fedprox_reference(p, S, 0.04, 3, 0.3)),
    "scaffold": (pa.SCAFFOLD(lr_local=0.04, lr_global=0.9, local_steps=3), fk.Zero(),
                 lambda p, S: scaffold_reference(p, S, 0.04, 3, 0.9)),
    "feddr": (pa.FedDR(eta=0.4, alpha=1.2, lr_local=0.05, local_steps=3), fk.L1(KAPPA),
              lambda p, S: feddr_reference(p, S, 0.4, 1.2, 0.05, 3)),
    "fedadmm": (pa.FedADMM(eta=0.4, lr_local=0.05, local_steps=3), fk.L1(KAPPA),
                lambda p, S: fedadmm_reference(p, S, 0.4, 0.05, 3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sampled_rounds_match_reference(problem, name):
    alg, reg, reference = CASES[name]
    assert sorted(CASES) == sorted(SAMPLED)
    _, ours, cs = run(problem, alg, 15, reg, clients_per_round=2, seed=7)
    assert len(cs.sampled) == 15 and all(s is not None for s in cs.sampled)
    assert max_rel_diff(ours, reference(problem, cs.sampled)) < 1e-12


def test_non_participants_keep_stale_state(problem):
    """FedDR: the rows of y, x, x̂ of clients outside S_k do not change in round k."""
    alg = pa.FedDR(eta=0.4, lr_local=0.05, local_steps=2)
    snaps = []
    cb = lambda t, s, m: snaps.append((s.y.clone(), s.xhat.clone()))  # noqa: E731
    _, _, cs = run(problem, alg, 6, clients_per_round=2, callbacks=[cb])
    for k in range(1, 6):
        S = set(cs.sampled[k].tolist())
        for i in range(N):
            same = torch.equal(snaps[k][0][i], snaps[k - 1][0][i]) and torch.equal(snaps[k][1][i], snaps[k - 1][1][i])
            assert same == (i not in S)


@pytest.mark.parametrize("alg", [pa.FedDR(eta=0.5, lr_local=0.08, local_steps=5),
                                 pa.FedADMM(eta=0.5, lr_local=0.08, local_steps=5)], ids=lambda a: a.name)
def test_primal_dual_converge_under_partial_participation(problem, alg):
    """Randomized (block-coordinate) FedDR / FedADMM still reach x* with half the clients per round."""
    x_star = problem.solution(KAPPA)
    _, ours, _ = run(problem, alg, 500, participation=0.5, seed=3)
    assert float((ours[-1] - x_star).norm()) < 1e-9
