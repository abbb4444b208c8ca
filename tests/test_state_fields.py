"""Which state fields are per-client stacks: declared by each State class (``client_fields``),
never guessed from shapes (a server-side 2-D field may have N rows too)."""

from __future__ import annotations

import warnings
from typing import NamedTuple

import pytest
import torch
from torch import nn

import python_algos as pa
from python_algos.algorithms.registry import ALGORITHMS, make
from python_algos.experiments import launch


def _clients(n=5):
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (6,), generator=g))
            for _ in range(n)]
    torch.manual_seed(0)
    return pa.SequentialClients(nn.Linear(3, 2).double(), nn.functional.cross_entropy, data)  # d = 8 != N


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_declared_client_fields_are_exactly_the_client_stacks(name):
    clients = _clients()
    alg = make(name, lr=0.05, local_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = alg.init(clients.flat.params.detach().clone(), clients)
    stacks = {k for k, v in state._asdict().items()
              if isinstance(v, torch.Tensor) and tuple(v.shape) == (clients.num_clients, clients.dim)}
    assert set(type(state).client_fields) == stacks
    assert "client_fields" not in state._fields


class ServerMatrixState(NamedTuple):
    """A state whose server-side [N, 3] sketch has as many rows as there are clients."""
    stack: torch.Tensor  # [N, d] per client
    sketch: torch.Tensor  # [N, 3] server side, replicated (N rows by coincidence)
    t: int
    client_fields = ("stack",)


class UndeclaredState(NamedTuple):
    stack: torch.Tensor
    t: int


def _snapshot(state):
    return {"round": 2, "state": state, "client_rng": {}, "metrics": []}


def test_a_server_matrix_with_n_rows_is_not_sharded(tmp_path, monkeypatch):
    n, d = 7, 4
    stack = torch.arange(n * d, dtype=torch.float64).reshape(n, d)
    sketch = torch.randn(n, 3, dtype=torch.float64)
    path = str(tmp_path / "checkpoint.pt")
    launch.ShardedCheckpointer(path, n)(_snapshot(ServerMatrixState(stack, sketch, 2)))  # one process's shard
    monkeypatch.setenv("RANK", "1")  # resumed as rank 1 of 2: rows 3..6
    monkeypatch.setenv("WORLD_SIZE", "2")
    got = launch.load_checkpoint(path, n)["state"]
    assert torch.equal(got.stack, stack[3:])
    assert torch.equal(got.sketch, sketch)  # the server's matrix, whole


def test_a_single_file_checkpoint_recut_keeps_the_server_matrix(tmp_path, monkeypatch):
    n, d = 7, 4
    stack = torch.arange(n * d, dtype=torch.float64).reshape(n, d)
    sketch = torch.randn(n, 3, dtype=torch.float64)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    got = launch.local_rows(_snapshot(ServerMatrixState(stack, sketch, 2)), "c.pt", n)["state"]
    assert torch.equal(got.stack, stack[:3]) and torch.equal(got.sketch, sketch)


def test_an_undeclared_state_with_a_matrix_is_refused_naming_the_fix(tmp_path):
    path = str(tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match="client_fields = .* UndeclaredState"):
        launch.ShardedCheckpointer(path, 5)(_snapshot(UndeclaredState(torch.zeros(5, 2), 1)))
    with pytest.raises(ValueError, match="'nope', which is not one of its fields"):
        class Bad(NamedTuple):
            stack: torch.Tensor
            client_fields = ("nope",)

        launch.ShardedCheckpointer(path, 5)(_snapshot(Bad(torch.zeros(5, 2))))
