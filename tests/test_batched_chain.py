"""The batched executor's explicit path for Linear/activation chains under cross-entropy
(python_algos.clients.chain): which models take it, and that it computes what plain autograd
computes on the same minibatches (each client's generator, drawn as the sequential executor draws).
Models that only look like chains must be left to torch.func, and still be right."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from python_algos.clients import BatchedClients, SequentialClients

FEATURES, CLASSES, BATCH = 12, 4, 5

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Flat(nn.Module):
    """Logistic regression on 2-D inputs, flattened in forward (as the benchmark's LogReg)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        return self.lin(torch.flatten(x, 1))


class Reversed(nn.Module):
    """Registered in chain order, applied in another: a chain only by its module list."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(FEATURES, FEATURES)
        self.b = nn.Linear(FEATURES, FEATURES)
        self.out = nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        return self.out(torch.tanh(self.a(torch.tanh(self.b(torch.flatten(x, 1))))))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(FEATURES, FEATURES)
        self.act = nn.ReLU()
        self.out = nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.out(x + self.act(self.a(x)))


def _models():
    return {
        "logreg-flatten": (Flat, True),
        "relu-mlp": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 8),
                                           nn.ReLU(), nn.Linear(8, CLASSES)), True),
        "tanh-sigmoid": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 8),
                                               nn.Sigmoid(), nn.Linear(8, CLASSES, bias=False)), True),
        "reversed-order": (Reversed, False),
        "residual": (Residual, False),
    }


def _clients(n=7):
    g = torch.Generator().manual_seed(0)
    sizes = [3, 9, 9, 14, 9, 20, 6][:n]  # unequal: padded passes and clients smaller than the batch
    return [(torch.randn(m, 3, 4, generator=g, dtype=torch.float64) + 0.2 * i,
             torch.randint(CLASSES, (m,), generator=g)) for i, m in enumerate(sizes)]


def _net(make):
    torch.manual_seed(1)
    return make().double()


@pytest.mark.parametrize("name", list(_models()))
@pytest.mark.parametrize("batch_size", [BATCH, 2, None], ids=["minibatch", "minibatch-every-client", "full"])
def test_gradients_equal_sequential(name, batch_size):
    """``batch_size=2`` is below every client's size: one [c, B] block of indices, never padded."""
    make, chain = _models()[name]
    clients = _clients()
    bc = BatchedClients(_net(make), F.cross_entropy, clients, batch_size=batch_size, seed=2, chunk_clients=3)
    sc = SequentialClients(_net(make), F.cross_entropy, clients, batch_size=batch_size, seed=2)
    assert (bc.chain is not None) == chain
    assert bc.rows_in_place == chain  # the first layer reads the samples in place (fedkernels.raw.linear_gathered)
    torch.manual_seed(5)
    X = bc.new_stack(bc.flat.params.detach()) + 0.1 * torch.randn(len(clients), bc.dim, dtype=torch.float64)
    Gb, Gs = bc.new_stack(), sc.new_stack()
    for _ in range(3):  # three draws: every client's generator must advance as the sequential one's
        bc.gradients_(X, Gb)
        sc.gradients_(X, Gs)
        for i in range(len(clients)):
            assert float((Gb[i] - Gs[i]).norm() / Gs[i].norm()) < 1e-12, (name, i)
    ids = torch.tensor([1, 4, 5])  # partial participation: rows not consecutive
    bc.gradients_(X[ids], Gb[:3], ids)
    sc.gradients_(X[ids], Gs[:3], ids)
    assert float((Gb[:3] - Gs[:3]).norm() / Gs[:3].norm()) < 1e-12


@pytest.mark.parametrize("name", ["relu-mlp", "tanh-sigmoid"])
def test_metric_pass_equals_sequential(name):
    make, _ = _models()[name]
    clients = _clients()
    bc = BatchedClients(_net(make), nn.CrossEntropyLoss(), clients, chunk_clients=2)
    sc = SequentialClients(_net(make), nn.CrossEntropyLoss(), clients)
    assert bc.chain is not None
    x = bc.flat.params.detach().clone()
    gb, gs = torch.empty_like(x), torch.empty_like(x)
    assert bc.full_objective_(x, gb) == pytest.approx(sc.full_objective_(x, gs), rel=1e-13)
    assert float((gb - gs).norm() / gs.norm()) < 1e-12


@pytest.mark.parametrize("loss_fn", [nn.CrossEntropyLoss(label_smoothing=0.1), nn.CrossEntropyLoss(reduction="sum"),
                                     lambda out, y: F.cross_entropy(out, y) * 2.0])
def test_other_losses_are_left_to_torch_func(loss_fn):
    clients = _clients()
    bc = BatchedClients(_net(_models()["relu-mlp"][0]), loss_fn, clients)  # full batches: a sum loss is allowed
    sc = SequentialClients(_net(_models()["relu-mlp"][0]), loss_fn, clients)
    assert bc.chain is None
    X = bc.new_stack(bc.flat.params.detach())
    Gb, Gs = bc.new_stack(), sc.new_stack()
    bc.gradients_(X, Gb)
    sc.gradients_(X, Gs)
    assert float((Gb - Gs).norm() / Gs.norm()) < 1e-12


def test_labels_out_of_range_are_left_to_torch_func():
    clients = _clients()
    clients[3] = (clients[3][0], torch.full_like(clients[3][1], -100))  # cross-entropy's ignore_index
    bc = BatchedClients(_net(_models()["relu-mlp"][0]), F.cross_entropy, clients)  # minibatches: refused
    assert bc.chain is None
