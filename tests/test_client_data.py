"""Clients given as a lazily read ``Dataset`` or a ``DataLoader`` (python_algos.clients.data).

Ground truth: the same clients as in-memory ``(X, y)`` tensors (the sequential executor's
original path), and plain ``torch.autograd`` on the loader's own batches.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import fedkernels as fk
import python_algos as pa
from python_algos.algorithms.registry import make
from python_algos.clients import BatchedClients, SequentialClients, resolve_executor

FEATURES, CLASSES = 4, 3
SIZES = [9, 14, 6]


class CountingDataset(Dataset):
    """A map-style Dataset that records which items were read (as a file-backed one would)."""

    def __init__(self, X, y):
        self.X, self.y, self.reads = X, y, []

    def __len__(self):
        return self.X.shape[0]

    def __getitem__(self, j):
        self.reads.append(j)
        return self.X[j], self.y[j]


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, FEATURES, generator=g, dtype=torch.float64) + i,
             torch.randint(CLASSES, (n,), generator=g)) for i, n in enumerate(SIZES)]


def net():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(FEATURES, 6), nn.Tanh(), nn.Linear(6, CLASSES)).double()


def run(data, batch_size, executor="sequential", rounds=5):
    alg = make("fedcanon", lr=0.05, local_steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pa.simulate(alg, net(), F.cross_entropy, data, rounds, fk.L1(0.01), batch_size=batch_size, seed=2,
                           metrics_every=1, executor=executor)


@pytest.mark.parametrize("batch_size", [None, 4, 100], ids=["full", "minibatch", "batch>client"])
def test_dataset_clients_follow_the_tensor_run_bit_for_bit(batch_size):
    ref = run(tensors(), batch_size)
    lazy = run([CountingDataset(X, y) for X, y in tensors()], batch_size)
    assert torch.equal(lazy.params, ref.params)
    assert [m["f"] for m in lazy.metrics] == [m["f"] for m in ref.metrics]


def test_a_dataset_is_never_read_up_front_and_a_batch_reads_only_its_samples():
    ds = [CountingDataset(X, y) for X, y in tensors()]
    cs = SequentialClients(net(), F.cross_entropy, ds, batch_size=4, seed=0)
    # building the clients stacked nothing: only the first samples of each were read, once, to
    # check that the model and the loss take them (python_algos.clients.probe)
    assert all(d.reads == list(range(4)) for d in ds)
    for d in ds:
        d.reads.clear()
    X = cs.flat.params.detach().expand(len(ds), -1).clone()
    cs.gradients_(X, torch.empty_like(X))
    assert [len(d.reads) for d in ds] == [4, 4, 4]
    assert all(len(set(d.reads)) == 4 for d in ds)  # without replacement


def test_dataloader_client_uses_the_loaders_batches():
    (X, y), = tensors()[:1]
    loader = DataLoader(TensorDataset(X, y), batch_size=4, shuffle=False)
    model = net()
    cs = SequentialClients(model, F.cross_entropy, [loader], batch_size=1, seed=0)  # B: "one loader batch"
    x = cs.flat.params.detach().clone()
    ref_model = net()
    params = list(ref_model.parameters())
    # 9 samples in batches 4, 4, 1; then a new pass starts
    for s, e in [(0, 4), (4, 8), (8, 9), (0, 4)]:
        g = torch.empty_like(x)
        cs.gradients_(x.unsqueeze(0).clone(), g.unsqueeze(0))
        want = torch.autograd.grad(F.cross_entropy(ref_model(X[s:e]), y[s:e]), params)
        want = torch.cat([w.reshape(-1) for w in want])
        assert torch.allclose(g, want, rtol=1e-12, atol=1e-14), (s, e)


def test_dataloader_full_gradient_is_one_pass_weighted_by_batch_size():
    ref = run(tensors(), None, rounds=3)
    loaders = [DataLoader(TensorDataset(X, y), batch_size=4) for X, y in tensors()]
    got = run(loaders, None, rounds=3)
    assert torch.allclose(got.params, ref.params, rtol=1e-12, atol=1e-14)
    assert got.metrics[-1]["f"] == pytest.approx(ref.metrics[-1]["f"], rel=1e-12)


def test_batched_refuses_lazy_clients_and_auto_falls_back():
    ds = [CountingDataset(X, y) for X, y in tensors()] * 30  # enough clients for auto to want batched
    with pytest.raises(ValueError, match=r"executor 'batched' cannot run these clients: client 0 is a "
                                         r"CountingDataset.*executor='sequential'"):
        BatchedClients(net(), F.cross_entropy, ds, batch_size=4)
    cs = resolve_executor("auto", net())(net(), F.cross_entropy, ds, batch_size=4, seed=0)
    assert cs.executor == "sequential" and "cannot run these clients" in cs.auto_reason
    assert all(set(d.reads) <= set(range(4)) for d in ds)  # the checks' probe of the first samples, no more


def test_bad_client_type_names_the_accepted_forms():
    with pytest.raises(TypeError, match="an \\(X, y\\) pair of tensors, a torch Dataset or a DataLoader, got int"):
        SequentialClients(net(), F.cross_entropy, [3])
    with pytest.raises(ValueError, match="non-empty"):
        SequentialClients(net(), F.cross_entropy, [CountingDataset(torch.zeros(0, FEATURES), torch.zeros(0))])
