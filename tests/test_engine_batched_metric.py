"""Defect 12: the batched executor's metric pass (f and its gradient) has the same bits whatever
the chunking (``chunk_clients``, ``memory_budget``), as its docstring promises.

Ground truth is the chunking itself: the same clients and point evaluated in one pass of all
clients must equal, bit for bit, every cut of them into smaller passes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from python_algos.clients import BatchedClients

FEATURES, CLASSES = 6, 3

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _problem(dtype, n=9):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, CLASSES)).to(dtype)
    g = torch.Generator().manual_seed(1)
    # unequal client sizes and losses of different magnitudes: the summation order shows in the last bit
    clients = [(torch.randn(5 + 3 * i, FEATURES, generator=g, dtype=dtype) * (1 + 7 * i),
                torch.randint(CLASSES, (5 + 3 * i,), generator=g)) for i in range(n)]
    return net, clients


def _generic_cross_entropy(out, y):
    """Cross-entropy the batched executor does not recognise: its torch.func path, not the chain path."""
    return F.cross_entropy(out, y)


def _metric(dtype, loss=F.cross_entropy, **chunking):
    net, clients = _problem(dtype)
    cs = BatchedClients(net, loss, clients, **chunking)
    assert (cs.chain is not None) == (loss is F.cross_entropy)  # which path this test holds
    x = cs.flat.params.detach().clone()
    g = torch.empty_like(x)
    f = cs.full_objective_(x, g)
    return f, g


CHUNKINGS = ({"chunk_clients": 2}, {"chunk_clients": 3}, {"chunk_clients": 4}, {"chunk_clients": 5},
             {"memory_budget": 1}, {"memory_budget": 20_000}, {"memory_budget": 2**30})


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_metric_f_bits_do_not_depend_on_the_chunking(dtype):
    """Failed before the fix (float64, chunk_clients=3: f off by 1 ulp): f was summed per chunk."""
    f0, _ = _metric(dtype, chunk_clients=9)  # all clients in one pass
    for chunking in CHUNKINGS:
        f, _ = _metric(dtype, **chunking)
        assert f == f0, (chunking, f, f0)


def test_metric_gradient_bits_do_not_depend_on_the_chunking_float64():
    _, g0 = _metric(torch.float64, chunk_clients=9)
    for chunking in CHUNKINGS:
        _, g = _metric(torch.float64, **chunking)
        assert torch.equal(g, g0), chunking


def test_metric_gradient_bits_do_not_depend_on_the_chunking_float32():
    """The chain path (Linear layers and activations under cross-entropy) starts every pass's buffers
    on 64-byte boundaries, so a client's float32 gradient does not depend on its row in the pass."""
    _, g0 = _metric(torch.float32, chunk_clients=9)
    for chunking in CHUNKINGS:
        _, g = _metric(torch.float32, **chunking)
        assert torch.equal(g, g0), chunking


@pytest.mark.xfail(strict=False, reason="float32 on CPU, torch.func path: a client's gradient in a vectorized pass can "
                   "differ in the last bit with its row's position in the pass (the gathered samples' memory "
                   "alignment picks another BLAS code path), so the split into passes shows; the sum order is fixed")
def test_metric_gradient_bits_do_not_depend_on_the_chunking_float32_torch_func():
    _, g0 = _metric(torch.float32, loss=_generic_cross_entropy, chunk_clients=9)
    for chunking in CHUNKINGS:
        _, g = _metric(torch.float32, loss=_generic_cross_entropy, **chunking)
        assert torch.equal(g, g0), chunking


def test_metric_f_bits_do_not_depend_on_the_chunking_float32_torch_func():
    """Defect 12 (issue 35): f moved by 2.4e-8 with ``chunk_clients`` on the torch.func path in
    float32 while the gradient did not: a client whose batch had its pass's length took loss_fn on
    the batch when all its pass-mates did too, and the padded (weighted per-sample) form when one
    of them was shorter. Unequal clients, every chunking against one pass of all of them."""
    g = torch.Generator().manual_seed(0)
    sizes = [30, 16, 15, 4, 26, 3, 9]
    clients = [(torch.randn(m, FEATURES, generator=g) * (1 + 5 * i), torch.randint(CLASSES, (m,), generator=g))
               for i, m in enumerate(sizes)]

    def metric(**chunking):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, CLASSES))
        cs = BatchedClients(net, _generic_cross_entropy, clients, **chunking)
        assert cs.chain is None
        x = cs.flat.params.detach().clone()
        return cs.full_objective_(x, torch.empty_like(x))

    f0 = metric(chunk_clients=len(sizes))
    assert [metric(chunk_clients=c) for c in range(2, len(sizes))] == [f0] * (len(sizes) - 2)
