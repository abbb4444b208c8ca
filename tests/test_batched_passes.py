"""The batched executor's passes do no work beyond what the clients need.

Load-independent checks (no timings): how many rows the vectorized passes compute, and which
allocations a gradient call makes. Results are checked against plain per-client autograd on the
same minibatches (the clients' generators, drawn as the sequential executor draws them).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from python_algos.clients import BatchedClients, client_generators

FEATURES, CLASSES, BATCH = 16, 3, 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _net():
    """Three layers of similar size: no single parameter is near the whole flat vector, so a
    ``[rows, d]`` allocation can only be a gradient stack."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, CLASSES)).double()


def _clients(n, samples=20):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(samples, FEATURES, generator=g, dtype=torch.float64) + 0.1 * i,
             torch.randint(CLASSES, (samples,), generator=g)) for i in range(n)]


def _count_rows(cs):
    """Record the rows of every vectorized pass of ``cs``."""
    rows = []
    inner = cs._fwd_bwd

    def counting(rows_, xb, *args, **kw):
        rows.append(int(rows_.shape[0]))  # clients in the pass (xb may be every client's samples)
        return inner(rows_, xb, *args, **kw)

    cs._fwd_bwd = counting
    return rows


@pytest.mark.parametrize("n, most, want", [(7, 3, [3, 2, 2]), (5, 4, [3, 2]), (6, 3, [3, 3]), (100, 33, [25] * 4)])
def test_each_client_is_computed_once_in_near_equal_passes(n, most, want):
    """A group cut by the per-pass limit must not end in a lone client, which a pass would compute
    twice (a pass never has one row): 100 clients at 33 per pass are 4 x 25, not 33+33+33+1."""
    clients = _clients(n)
    cs = BatchedClients(_net(), F.cross_entropy, clients, batch_size=BATCH, seed=3, chunk_clients=most)
    rows = _count_rows(cs)
    X = cs.new_stack(cs.flat.params.detach())
    G = cs.new_stack()
    cs.gradients_(X, G)
    assert rows == want
    # ground truth: plain autograd on each client's minibatch, drawn from its own generator
    gens = client_generators(3, n)
    ref = _net()
    for i, (Xi, yi) in enumerate(clients):
        idx = torch.randperm(Xi.shape[0], generator=gens[i])[:BATCH]
        ref.zero_grad()
        F.cross_entropy(ref(Xi[idx]), yi[idx]).backward()
        want_g = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
        assert float((G[i] - want_g).norm() / want_g.norm()) < 1e-12


def test_a_gradient_call_allocates_no_gradient_sized_temporary():
    """The per-client gradients go straight into the rows of G: no op of a gradient call allocates
    a block as large as a pass's ``[rows, d]`` gradients (a fresh one per local step costs its page
    faults, ~10 % of an MLP round on CPU)."""
    cs = BatchedClients(_net(), F.cross_entropy, _clients(8), batch_size=BATCH, chunk_clients=4)
    X = cs.new_stack(cs.flat.params.detach())
    G = cs.new_stack()
    cs.gradients_(X, G)  # first call: the gathered-batch buffers are allocated once
    stack_bytes = 4 * cs.dim * G.element_size()
    assert max(p.numel() for p in cs.model.parameters()) < cs.dim // 2
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        cs.gradients_(X, G)
    big = [(e.name, e.self_cpu_memory_usage) for e in prof.events() if e.self_cpu_memory_usage >= stack_bytes]
    assert big == []


def test_metric_pass_computes_each_client_once():
    """The metric pass's blocks of clients are cut like the gradient passes: 7 clients at most 3
    per block are 3+2+2, not 3+3+1 with the lone client computed on a duplicated row."""
    clients = _clients(7)
    cs = BatchedClients(_net(), F.cross_entropy, clients, chunk_clients=3)
    rows = _count_rows(cs)
    x = cs.flat.params.detach().clone()
    g = torch.empty_like(x)
    f = cs.full_objective_(x, g)
    assert rows == [3, 2, 2]
    # ground truth: the mean of the clients' full-data losses, plain autograd
    ref = _net()
    want_f = sum(F.cross_entropy(ref(X), y) for X, y in clients) / len(clients)
    want_g = torch.cat([q.reshape(-1) for q in torch.autograd.grad(want_f, list(ref.parameters()))])
    assert f == pytest.approx(want_f.item(), rel=1e-12)
    assert float((g - want_g).norm() / want_g.norm()) < 1e-12
