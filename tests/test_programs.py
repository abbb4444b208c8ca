"""Every server–client algorithm is one client program and one server program (docs/algorithms.md
§0.1): ``client_update`` (a client's work between two communications, ending with its upload),
``server_update`` (from the mean of the uploads to the next download), ``client_receive`` (what a
client does with that download), and the named messages.

The key property, the one a deployment with one process per client relies on: running the
client programs **one client at a time on 1-row stacks** (as a deployed node would, over its own
data), averaging the uploads here in the test and calling the server program, reproduces
``simulate``'s trajectory (float64, 1e-12), with minibatches, a regularizer and partial
participation.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _problems import LeastSquares

import fedkernels as fk
import python_algos as pa
from python_algos.algorithms.base import ServerClientAlgorithm
from python_algos.algorithms.registry import ALGORITHMS, make
from python_algos.testing import one_client_at_a_time

VARIANTS = [(name, {}) for name in ALGORITHMS if name != "depositum"] + [
    ("fednmap", {"downlink": "z"}), ("fednmap", {"c_update_at": "round_end"}),
    ("fedprox", {"server_prox": True}), ("feddr", {"init_from": "code"}),
]
CASES = [(name, ov, k) for name, ov in VARIANTS
         for k in ((None, 3) if ALGORITHMS[name].cls.partial_participation else (None,))]
SEED, ROUNDS, BATCH, REG = 11, 4, 5, fk.L1(0.05)


def _id(case):
    name, ov, k = case
    return "-".join([name, *(f"{a}={b}" for a, b in ov.items()), "all" if k is None else f"k={k}"])


@pytest.fixture(scope="module")
def problem():
    return LeastSquares(seed=5, n=6, d=10, m=15)


def _alg(name, ov):
    return make(name, lr=0.03, local_steps=3, **ov)


def test_every_algorithm_with_a_server_is_written_as_programs():
    for name, entry in ALGORITHMS.items():
        assert issubclass(entry.cls, ServerClientAlgorithm) == (name != "depositum"), name


@pytest.mark.parametrize("name,ov", VARIANTS, ids=[_id((n, o, None)) for n, o in VARIANTS])
def test_costs_count_the_named_messages(name, ov):
    alg = _alg(name, ov)
    m, c = alg.messages(), alg.costs(10)
    assert (c.up, c.down) == (len(m.up), len(m.down))
    assert set(m.up_over_all) <= set(m.up)


def _simulate(problem, alg, k):
    """simulate()'s state after every round (copies), sequential executor."""
    states = []

    def cb(t, state, m):
        states.append({f: (v.clone() if isinstance(v, torch.Tensor) else v) for f, v in state._asdict().items()})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pa.simulate(alg, problem.model(), problem.loss, problem.data, ROUNDS, REG, batch_size=BATCH, seed=SEED,
                    executor="sequential", clients_per_round=k, callbacks=[cb], metrics_every=0)
    return states


def _one_client_at_a_time(problem, alg, k):
    """The programs driven as a deployment would (python_algos.testing.one_client_at_a_time, the
    battery users run on their own algorithms): each client's programs on its own 1-row stacks, the
    uploads averaged there, the server program once per round."""
    clients = pa.SequentialClients(problem.model(), problem.loss, problem.data, batch_size=BATCH, seed=SEED)
    return one_client_at_a_time(alg, clients, REG, ROUNDS, clients_per_round=k, seed=SEED)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_one_client_at_a_time_reproduces_simulate(problem, case):
    name, ov, k = case
    want, got = _simulate(problem, _alg(name, ov), k), _one_client_at_a_time(problem, _alg(name, ov), k)
    assert len(got) == len(want) == ROUNDS
    for t, (a, b) in enumerate(zip(got, want), 1):
        assert a.keys() == b.keys()
        for f in a:
            if isinstance(b[f], torch.Tensor):
                scale = 1.0 + float(b[f].abs().max())
                assert float((a[f] - b[f]).abs().max()) <= 1e-12 * scale, (name, t, f)
            else:
                assert a[f] == b[f], (name, t, f)
    report = _alg(name, ov).report
    assert not torch.equal(report(_to_state(problem, name, ov, want[-1]), REG), problem.x0)  # it moved


def _to_state(problem, name, ov, fields):
    clients = problem.clients()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = _alg(name, ov).init(problem.x0.clone(), clients)
    return st._replace(**fields)


class _Bad(pa.FedAvg):
    """A server program that replaces a client field: the round would silently drop it."""

    def server_update(self, state, up, down, reg):
        state, sent = super().server_update(state, up, down, reg)
        return state._replace(x=state.x.clone()), sent


def test_a_server_program_may_not_replace_client_fields(problem):
    class State(type(_Bad(lr_local=0.1, local_steps=1).init(problem.x0.clone(), problem.clients()))):
        client_fields = ("x",)  # pretend x were per-client: [N, d] is not needed for the rule

    alg = _Bad(lr_local=0.1, local_steps=1)
    clients = problem.clients()
    st = alg.init(problem.x0.clone(), clients)
    with pytest.raises(RuntimeError, match="server_update.*client field 'x'"):
        alg.round(State(*st), clients, fk.Zero())
