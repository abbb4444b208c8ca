"""No silent wrong results from the client executors (python_algos.clients).

Ground truth everywhere is independent of the code path under test: the same samples given as
plain ``(X, y)`` tensors, the sequential executor (one plain autograd pass per client), or a plain
PyTorch computation.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Sampler, SequentialSampler, SubsetRandomSampler, TensorDataset

import fedkernels as fk
import python_algos as pa
from python_algos.algorithms.registry import make
from python_algos.clients import BatchedClients, SequentialClients, resolve_executor

FEATURES, CLASSES = 4, 3


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def net(dtype=torch.float64, seed=1, extra=None):
    torch.manual_seed(seed)
    layers = [nn.Linear(FEATURES, 6)] + ([extra] if extra is not None else []) + [nn.Tanh(), nn.Linear(6, CLASSES)]
    return nn.Sequential(*layers).to(dtype)


def data(sizes, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, FEATURES, generator=g, dtype=dtype) + 0.3 * i, torch.randint(CLASSES, (n,), generator=g))
            for i, n in enumerate(sizes)]


def sim(clients, rounds=3, batch_size=None, executor="sequential", model=None, loss=F.cross_entropy, **opts):
    alg = make("fedcanon", lr=0.05, local_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pa.simulate(alg, model if model is not None else net(), loss, clients, rounds, fk.L1(0.01),
                           batch_size=batch_size, seed=2, metrics_every=1, executor=executor,
                           executor_options=opts)


def rel(a, b):
    return float((a - b).norm() / b.norm())


# -- 1. DataLoader clients: the mean over the samples the loader yields ---------------------------

class EveryOther(Sampler):
    """A custom sampler without ``__len__``: the even indices of a dataset."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(0, self.n, 2))


FULL = data([40])[0]  # one shared dataset; each client sees a part of it through its loader
SUBSETS = [torch.arange(0, 40, 10), torch.tensor([3, 5, 7, 11, 13, 17, 19]), torch.arange(20, 26)]


def _loader_cases():
    ds = TensorDataset(*FULL)
    X, y = FULL
    seq10 = TensorDataset(X[:10], y[:10])
    return {
        # (loaders, the samples each one yields in one pass, as tensors)
        "SubsetRandomSampler": ([DataLoader(ds, batch_size=3, sampler=SubsetRandomSampler(i.tolist(),
                                 generator=torch.Generator().manual_seed(k))) for k, i in enumerate(SUBSETS)],
                                [(X[i], y[i]) for i in SUBSETS]),
        "SequentialSampler+drop_last": ([DataLoader(seq10, batch_size=4, sampler=SequentialSampler(seq10),
                                                    drop_last=True),
                                         DataLoader(ds, batch_size=7, drop_last=True)],
                                        [(X[:8], y[:8]), (X[:35], y[:35])]),
        "custom Sampler without __len__": ([DataLoader(ds, batch_size=5, sampler=EveryOther(40))],
                                           [(X[0:40:2], y[0:40:2])]),
        "batch_sampler": ([DataLoader(ds, batch_sampler=BatchSampler(SubsetRandomSampler(SUBSETS[1].tolist(),
                           generator=torch.Generator().manual_seed(3)), 2, drop_last=False))],
                          [(X[SUBSETS[1]], y[SUBSETS[1]])]),
    }


@pytest.mark.parametrize("case", list(_loader_cases()))
def test_loader_client_is_the_mean_over_the_samples_it_yields(case):
    loaders, tensors = _loader_cases()[case]
    # ClientSet level: objective and full gradient against the same samples as tensors
    a, b = SequentialClients(net(), F.cross_entropy, loaders), SequentialClients(net(), F.cross_entropy, tensors)
    x = a.flat.params.detach().clone()
    ga, gb = torch.empty_like(x), torch.empty_like(x)
    fa, fb = a.full_objective_(x, ga), b.full_objective_(x, gb)
    assert fa == pytest.approx(fb, rel=1e-12) and rel(ga, gb) < 1e-12
    # one client's full local gradient (gradients_ with batch_size None)
    Xs = x.expand(len(loaders), -1).clone()
    Ga, Gb = torch.empty_like(Xs), torch.empty_like(Xs)
    a.gradients_(Xs, Ga)
    b.gradients_(Xs, Gb)
    assert rel(Ga, Gb) < 1e-12
    # through simulate: the f metric and the final parameters after a few rounds
    loaders, tensors = _loader_cases()[case]
    got, ref = sim(loaders), sim(tensors)
    assert rel(got.params, ref.params) < 1e-12
    for mg, mr in zip(got.metrics, ref.metrics):
        assert mg["f"] == pytest.approx(mr["f"], rel=1e-12)


# -- 2. batched executor: samples coupled within a batch ------------------------------------------

class Centre(nn.Module):
    """Mixes the samples of a batch: each output depends on the batch mean."""

    def forward(self, x):
        return x - x.mean(0)


def sum_loss(out, y):
    return F.cross_entropy(out, y, reduction="sum")


COUPLED = {
    "BatchNorm1d(track_running_stats=False)": (lambda: net(extra=nn.BatchNorm1d(6, track_running_stats=False).double()),
                                               F.cross_entropy),
    "x - x.mean(0)": (lambda: net(extra=Centre()), F.cross_entropy),
    "reduction='sum'": (net, sum_loss),
}


@pytest.mark.parametrize("batch_size", [None, 10], ids=["full", "minibatch"])
@pytest.mark.parametrize("case", list(COUPLED))
def test_batched_equals_sequential_when_samples_are_coupled(case, batch_size):
    model, loss = COUPLED[case]
    clients = data([3, 30, 300])
    # refused: minibatches of a sum (python_algos.clients.probe)
    if case == "reduction='sum'" and batch_size is not None:
        for executor in ("sequential", "batched"):
            with pytest.raises(ValueError, match="loss_fn is not the mean of per-sample losses"):
                sim(clients, batch_size=batch_size, model=model(), loss=loss, rounds=2, executor=executor)
        return
    seq = sim(clients, batch_size=batch_size, model=model(), loss=loss, rounds=2)
    bat = sim(clients, batch_size=batch_size, model=model(), loss=loss, rounds=2, executor="batched")
    assert bat.executor == "batched"
    assert rel(bat.params, seq.params) < 1e-12
    for mb, ms in zip(bat.metrics, seq.metrics):
        assert mb["f"] == pytest.approx(ms["f"], rel=1e-12)


@pytest.mark.parametrize("case", list(COUPLED))
def test_coupling_is_detected_and_named(case):
    model, loss = COUPLED[case]
    cs = BatchedClients(model(), loss, data([3, 30, 300]))
    assert cs.coupled and ("BatchNorm1d" in cs.coupled if "Batch" in case else True)
    assert ("loss_fn" in cs.coupled) == (case == "reduction='sum'")
    assert not BatchedClients(net(), F.cross_entropy, data([3, 30])).coupled  # a per-sample mean: padding is exact


def test_sequential_does_not_split_a_coupled_batch():
    """A batch beyond ``chunk`` samples is split in weighted pieces only when that is exact."""
    clients = data([50, 20])
    want = SequentialClients(net(), sum_loss, clients)  # chunk 2048: one pass per client
    got = SequentialClients(net(), sum_loss, clients, chunk=8)
    x = want.flat.params.detach().clone()
    gw, gg = torch.empty_like(x), torch.empty_like(x)
    assert got.full_objective_(x, gg) == pytest.approx(want.full_objective_(x, gw), rel=1e-12)
    assert rel(gg, gw) < 1e-12


# -- 5. metric passes leave the model's buffers alone ---------------------------------------------

def _bn_net(dtype=torch.float64):
    return net(dtype, extra=nn.BatchNorm1d(6).to(dtype))


def test_metric_pass_leaves_buffers_and_does_not_depend_on_chunk():
    clients = data([7, 12, 20])
    model = _bn_net()
    cs = SequentialClients(model, F.cross_entropy, clients)
    before = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "batches" in k}
    x = cs.flat.params.detach().clone()
    g = torch.empty_like(x)
    f = cs.full_objective_(x, g)
    after = {k: v for k, v in model.state_dict().items() if k in before}
    assert all(torch.equal(before[k], after[k]) for k in before)
    # ground truth: train-mode BatchNorm over each client's whole data, plain autograd
    ref_model = _bn_net()
    params = [p for p in ref_model.parameters()]
    want_f = sum(F.cross_entropy(ref_model(X), y) for X, y in clients) / len(clients)
    want_g = torch.cat([q.reshape(-1) for q in torch.autograd.grad(want_f, params)])
    assert f == pytest.approx(want_f.item(), rel=1e-12) and rel(g, want_g) < 1e-12
    # the evaluation chunk does not change it
    g2 = torch.empty_like(x)
    f2 = SequentialClients(_bn_net(), F.cross_entropy, clients, chunk=5).full_objective_(x, g2)
    assert f2 == pytest.approx(f, rel=1e-12) and rel(g2, g) < 1e-12


@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_metric_pass_does_not_shift_the_random_numbers_of_training(executor):
    """Dropout in a metric pass draws random numbers; the run after it must not depend on whether
    metrics were taken."""
    def model():
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(FEATURES, 8), nn.Dropout(0.3), nn.Linear(8, CLASSES)).double()

    clients = data([7, 12, 20])
    alg = make("fedavg", lr=0.05, local_steps=2)
    out = []
    for every in (1, 0):
        torch.manual_seed(9)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append(pa.simulate(alg, model(), F.cross_entropy, clients, 3, batch_size=4, seed=2, executor=executor,
                                   metrics_every=every).params)
    assert torch.equal(out[0], out[1])


def test_batched_metric_pass_leaves_buffers_alone():
    """An eval-mode BatchNorm (running statistics read, never written) runs batched; its metric
    pass must leave the buffers as they were, whatever the chunk of clients."""
    clients = data([7, 12, 20])
    model = _bn_net().eval()
    model[1].running_mean.normal_()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fs = []
    for opts in (dict(chunk_clients=1), dict(chunk_clients=3)):
        cs = BatchedClients(model, F.cross_entropy, clients, **opts)
        x = cs.flat.params.detach().clone()
        g = torch.empty_like(x)
        fs.append((cs.full_objective_(x, g), g))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items() if k in before and "running" in k)
    assert fs[0][0] == fs[1][0] and torch.equal(fs[0][1], fs[1][1])


# -- 8. bits independent of the chunk of clients per pass -----------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [None, 10], ids=["full", "minibatch"])
def test_batched_bits_do_not_depend_on_the_chunking(batch_size):
    torch.set_num_threads(2)  # a lone matrix product may then split its work differently from a batched one
    clients = data([7, 12, 20, 33, 9, 16, 10], dtype=torch.float32)
    runs = [sim(clients, rounds=3, batch_size=batch_size, executor="batched", model=net(torch.float32), **opts)
            for opts in (dict(chunk_clients=1), dict(chunk_clients=3), dict(chunk_clients=7),
                         dict(memory_budget=1), dict(memory_budget=1 << 30))]
    for r in runs[1:]:
        assert torch.equal(r.params, runs[0].params)
        assert [m["f"] for m in r.metrics] == [m["f"] for m in runs[0].metrics]
        assert [m["grad_map_sq"] for m in r.metrics] == [m["grad_map_sq"] for m in runs[0].metrics]


# -- 9. auto never picks a batched executor that is slower by construction -------------------------

def test_auto_picks_sequential_when_the_budget_holds_one_client_per_pass():
    """A 6.3 M-parameter MLP: four gradient-sized buffers of one client exceed the 64 MiB CPU budget."""
    torch.manual_seed(0)
    big = nn.Sequential(nn.Linear(FEATURES, 2500), nn.Tanh(), nn.Linear(2500, 2500), nn.Linear(2500, CLASSES))
    assert sum(p.numel() for p in big.parameters()) > 6e6
    small = net(torch.float32)
    clients = data([6] * 64, dtype=torch.float32)
    cs = resolve_executor("auto", small)(small, F.cross_entropy, clients, batch_size=4, seed=0)
    assert cs.executor == "batched"
    cs = resolve_executor("auto", big)(big, F.cross_entropy, clients, batch_size=4, seed=0)
    assert cs.executor == "sequential" and "per pass" in cs.auto_reason


def test_auto_picks_sequential_when_coupled_clients_cannot_share_passes():
    model, loss = COUPLED["reduction='sum'"]
    clients = data(list(range(2, 66)))  # 64 clients, all of different sizes: full batches never share a pass
    cs = resolve_executor("auto", model())(model(), loss, clients, seed=0)
    assert cs.executor == "sequential" and "per pass" in cs.auto_reason
