"""Executors against the sequential one: every registered algorithm must follow the same trajectory
whichever executor computes the clients' gradients (only the floating-point summation order may
differ), and the batched executor must say clearly what it cannot run.

The reference is ``SequentialClients`` (one client after another, plain autograd on one module);
the problem is a small tanh network on clients of unequal sizes (float64), so padding/masking,
full batches, minibatches larger than a client, and partial participation are all exercised.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedkernels as fk
import python_algos as pa
from python_algos.algorithms.registry import ALGORITHMS, make
from python_algos.clients import BatchedClients, SequentialClients, resolve_executor
from python_algos.runfolder.callbacks import Checkpoint

SIZES = [7, 12, 20, 33, 9, 16]  # unequal clients: B = 10 is larger than two of them
FEATURES, CLASSES = 5, 3
ROUNDS = 10


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def clients(dtype=torch.float64, sizes=SIZES, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(sizes):
        X = torch.randn(n, FEATURES, generator=g, dtype=dtype) + 0.3 * i  # heterogeneous clients
        y = torch.randint(CLASSES, (n,), generator=g)
        out.append((X, y))
    return out


def net(dtype=torch.float64, seed=1):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, CLASSES)).to(dtype)


def run(key, executor, batch_size, dtype=torch.float64, participation=None, reg=None, model=None,
        data=None, **opts):
    if reg is None:
        reg = fk.L1(0.01)
    alg = make(key, lr=0.05, local_steps=3)
    reports = []
    cb = lambda t, s, m: reports.append(alg.report(s, reg).clone())  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # smooth methods warn that they ignore h
        hist = pa.simulate(alg, model if model is not None else net(dtype), F.cross_entropy,
                           data if data is not None else clients(dtype), ROUNDS, reg, batch_size=batch_size, seed=3,
                           callbacks=[cb], metrics_every=5, executor=executor, executor_options=opts,
                           clients_per_round=participation)
    return hist, reports


def rel_dev(a_list, b_list):
    assert len(a_list) == len(b_list) > 0
    return max(float((a - b).norm() / b.norm()) for a, b in zip(a_list, b_list))


@pytest.mark.parametrize("batch_size", [None, 10], ids=["full", "minibatch"])
@pytest.mark.parametrize("key", list(ALGORITHMS))
def test_batched_follows_sequential(key, batch_size):
    seq, seq_reports = run(key, "sequential", batch_size)
    bat, bat_reports = run(key, "batched", batch_size)
    assert seq.executor == "sequential" and bat.executor == "batched"
    assert rel_dev(bat_reports, seq_reports) < 1e-10
    # The metric pass (f and ||G_s||² use the full gradient of f) agrees too.
    for ms, mb in zip(seq.metrics, bat.metrics):
        for k in ("f", "grad_map_sq"):
            if k in ms:
                assert mb[k] == pytest.approx(ms[k], rel=1e-10, abs=1e-14)
    # Same number of client gradient calls and the same communication.
    assert [m["grad_evals"] for m in bat.metrics] == [m["grad_evals"] for m in seq.metrics]
    assert [(m["up"], m["down"]) for m in bat.metrics] == [(m["up"], m["down"]) for m in seq.metrics]


@pytest.mark.parametrize("key", [k for k, e in ALGORITHMS.items() if e.cls.partial_participation])
def test_batched_follows_sequential_partial_participation(key):
    seq, seq_reports = run(key, "sequential", 10, participation=3)
    bat, bat_reports = run(key, "batched", 10, participation=3)
    assert rel_dev(bat_reports, seq_reports) < 1e-10


@pytest.mark.parametrize("opts", [dict(chunk_clients=2), dict(memory_budget=1)], ids=["2-client chunks", "tiny budget"])
def test_chunking_does_not_change_the_result(opts):
    """Chunks of clients, and a single client's batch split into sample pieces (a budget too small
    for even one sample), give the sequential result."""
    seq, seq_reports = run("fedcanon", "sequential", None)
    bat, bat_reports = run("fedcanon", "batched", None, **opts)
    assert rel_dev(bat_reports, seq_reports) < 1e-10
    assert bat.metrics[-1]["f"] == pytest.approx(seq.metrics[-1]["f"], rel=1e-10)


def test_float32_close_to_sequential():
    seq, seq_reports = run("fedavg", "sequential", 10, dtype=torch.float32)
    bat, bat_reports = run("fedavg", "batched", 10, dtype=torch.float32)
    assert rel_dev(bat_reports, seq_reports) < 1e-5


def test_conv_model_follows_sequential():
    class SmallCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 3, 3)
            self.fc = nn.Linear(3 * 4 * 4, CLASSES)

        def forward(self, x):
            return self.fc(F.relu(self.conv(x)).flatten(1))

    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(n, 1, 6, 6, generator=g, dtype=torch.float64), torch.randint(CLASSES, (n,), generator=g))
            for n in SIZES]

    def model():
        torch.manual_seed(2)
        return SmallCNN().double()

    seq, seq_reports = run("fedmid", "sequential", 10, model=model(), data=data)
    bat, bat_reports = run("fedmid", "batched", 10, model=model(), data=data)
    assert rel_dev(bat_reports, seq_reports) < 1e-10


def test_batchnorm_is_refused_by_name_and_auto_falls_back():
    model = nn.Sequential(nn.Linear(FEATURES, 8), nn.BatchNorm1d(8), nn.Linear(8, CLASSES)).double()
    with pytest.raises(ValueError, match=r"'1' \(BatchNorm1d\).*running statistics.*executor='sequential'"):
        run("fedavg", "batched", 10, model=model)
    hist, _ = run("fedavg", "auto", 10, model=model)
    assert hist.executor == "sequential"
    # Without running statistics there is nothing per client to keep: batched runs it.
    free = nn.Sequential(nn.Linear(FEATURES, 8), nn.BatchNorm1d(8, track_running_stats=False),
                         nn.Linear(8, CLASSES)).double()
    assert not BatchedClients.unsupported(free)


def test_untraceable_model_is_refused_and_auto_falls_back():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(FEATURES, CLASSES)

        def forward(self, x):
            if float(x.sum()) > 0:  # Python control flow on data: vmap cannot batch it
                return self.lin(x)
            return -self.lin(x)

    torch.manual_seed(0)
    with pytest.raises(ValueError, match="executor 'batched' cannot run this model.*executor='sequential'"):
        run("fedavg", "batched", 10, model=DataDependent().double())
    hist, _ = run("fedavg", "auto", 10, model=DataDependent().double())
    assert hist.executor == "sequential"


class _Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 2, 3)
        self.lin = nn.Linear(2 * (FEATURES - 2), CLASSES)

    def forward(self, x):
        return self.lin(torch.tanh(self.conv(x.unsqueeze(1))).flatten(1))


@pytest.mark.parametrize("n_clients, model, expected", [
    (len(SIZES), net, "sequential"),  # few clients: a vectorized pass does not pay
    (64, net, "batched"),  # many clients, no convolution
    (64, lambda: _Conv().double(), "sequential"),  # a convolution: slower under vmap on CPU
])
def test_auto_follows_its_rule_the_same_way_every_time(n_clients, model, expected):
    """auto is a rule, not a timing: the same command must pick the same executor (two executors
    differ in summation order, so a timed choice would change the bits from one run to the next)."""
    data = clients(sizes=[6] * n_clients)
    picked = []
    for _ in range(3):
        cs = resolve_executor("auto", model())(model(), F.cross_entropy, data, batch_size=4, seed=0)
        picked.append((cs.executor, cs.auto_reason))
    assert picked[0][0] == expected and len(set(picked)) == 1, picked
    assert picked[0][1]


def test_auto_keeps_the_trajectory_and_resume_keeps_the_executor():
    """A run under auto equals the same run under the executor it picked (SCAFFNEW also draws a
    server coin from torch's RNG), and a snapshot resumed under auto reuses the snapshot's executor."""
    data = clients(sizes=[6] * 64)
    picked, picked_reports = run("scaffnew", "batched", 4, data=data)
    auto, auto_reports = run("scaffnew", "auto", 4, data=data)
    assert auto.executor == "batched"
    assert rel_dev(auto_reports, picked_reports) == 0.0
    snaps = []
    alg = make("fedavg", lr=0.05, local_steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pa.simulate(alg, net(), F.cross_entropy, data, 4, batch_size=4, seed=3, executor="sequential",
                    callbacks=[Checkpoint(snaps.append, 2)])
        resumed = pa.simulate(alg, net(), F.cross_entropy, data, 6, batch_size=4, seed=3, executor="auto",
                              resume=snaps[1])
    assert snaps[1]["executor"] == "sequential" and resumed.executor == "sequential"


def test_dropout_draws_per_client():
    """Dropout under the batched executor: independent masks per client (not the sequential
    executor's random numbers), so runs differ from sequential but stay finite and seeded."""
    def model():
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(FEATURES, 8), nn.Dropout(0.5), nn.Linear(8, CLASSES)).double()

    torch.manual_seed(5)
    a, _ = run("fedavg", "batched", 10, model=model())
    assert torch.isfinite(a.params).all()


@pytest.mark.parametrize("bad, match", [
    (dict(executor="vectorized"), "executor must be one of auto, sequential, batched"),
    (dict(executor_options=dict(memory_budget=-1)), "memory_budget must be None or a positive int"),
    (dict(executor_options=dict(chunk_clients=0)), "chunk_clients must be None or a positive int"),
])
def test_bad_executor_arguments(bad, match):
    model = net()
    before = [p.detach().clone() for p in model.parameters()]
    kw = dict(executor="batched")
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        pa.simulate(make("fedavg", lr=0.1, local_steps=1), model, F.cross_entropy, clients(), 1, **kw)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_executors_registry_resolves():
    m = net()
    assert resolve_executor("sequential", m) is SequentialClients
    assert resolve_executor("BATCHED", m) is BatchedClients
