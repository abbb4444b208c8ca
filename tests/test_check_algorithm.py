"""python_algos.testing.check_algorithm: every built-in passes it, and it catches deliberately
broken algorithms (declared costs that do not count the messages, a client program that reads
another client's rows, state kept outside the State, a per-client stack left undeclared), each
failure naming what is wrong. Its ground truth: ``simulate`` with the sequential executor."""

import dataclasses
from typing import NamedTuple

import pytest
import torch

import python_algos as pa
from python_algos.algorithms.base import Costs
from python_algos.algorithms.registry import ALGORITHMS, make
from python_algos.testing import AlgorithmCheckError, check_algorithm


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_built_in_passes(name):
    assert "ok" in check_algorithm(make(name, lr=0.03, local_steps=3))


@dataclasses.dataclass(frozen=True)
class MiscountedCosts(pa.FedAvg):
    def costs(self, num_clients):
        return Costs(client_prox=0, server_prox=0, up=2, down=1, grads=self.local_steps)


@dataclasses.dataclass(frozen=True)
class PeeksAtOthers(pa.FedAvg):
    """Scales its upload by the mean norm of the rows it was given: all clients' in one process, its
    own alone on a node."""

    def client_update(self, state, down, clients, reg, ids):
        up = super().client_update(state, down, clients, reg, ids)
        up["dx"] = up["dx"] * (1 + up["dx"].norm(dim=1).mean())  # one row alone: its own norm
        return up


@dataclasses.dataclass(frozen=True)
class HiddenCounter(pa.FedAvg):
    """Halves its step every round with a counter kept on the object, outside the State."""

    seen: dict = dataclasses.field(default_factory=dict, compare=False)

    def server_update(self, state, up, down, reg):
        self.seen["n"] = self.seen.get("n", 0) + 1
        return super().server_update(state, {"dx": up["dx"] * 0.5 ** self.seen["n"]}, down, reg)


def test_miscounted_costs_are_caught():
    with pytest.raises(AlgorithmCheckError, match=r"costs\(N\) declares up=2, down=1, but messages\(\) names 1 up"):
        check_algorithm(MiscountedCosts(lr_local=0.03, local_steps=3))


def test_a_client_reading_other_clients_is_caught():
    with pytest.raises(AlgorithmCheckError, match="one client at a time .* differ from simulate at round 1"):
        check_algorithm(PeeksAtOthers(lr_local=0.03, local_steps=3))


def test_state_outside_the_state_is_caught_by_the_resume_check():
    with pytest.raises(AlgorithmCheckError, match="resum"):
        check_algorithm(HiddenCounter(lr_local=0.03, local_steps=3))


class UndeclaredState(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor  # [N, d], per client, but not in client_fields
    t: int
    client_fields = ()


@dataclasses.dataclass(frozen=True)
class Undeclared(pa.FedAvg):
    def init(self, x0, clients):
        st = super().init(x0, clients)
        return UndeclaredState(st.x, x0.repeat(clients.num_clients, 1), st.t)


def test_an_undeclared_client_stack_is_caught():
    with pytest.raises(AlgorithmCheckError, match=r"client_fields must name exactly the \[N, d\] client stacks: "
                                                  r"declared \[\], found \['y'\]"):
        check_algorithm(Undeclared(lr_local=0.03, local_steps=3))


def test_something_that_is_not_an_algorithm_is_refused():
    with pytest.raises(AlgorithmCheckError, match="is not a python_algos Algorithm"):
        check_algorithm(object())
