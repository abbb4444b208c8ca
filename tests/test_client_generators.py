"""A checkpoint's client minibatch generators grow with the clients that drew a minibatch, not with N
(issue 39 item 2): every executor creates a client's generator when first read
(``population.LazyGenerators``), so a partial-participation run's checkpoint holds rounds x cohort
states (5 kB each) where it held all N. Ground truth: the generator count is bounded by the clients
the run sampled (recorded by a callback, not by the code under test); resuming equals the
uninterrupted run bit for bit; the states carried across executors are the ones the other executor
reaches uninterrupted; a checkpoint re-cut for 1 or 3 ranks hands each rank exactly the written
states of its clients; a checkpoint of the older format (a list of N states) is refused."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from python_algos import simulate
from python_algos.algorithms import SCAFFOLD
from python_algos.clients import ClientSet, process_group
from python_algos.clients.population import LazyGenerators
from python_algos.experiments import launch
from python_algos.runfolder.callbacks import Checkpoint
from python_algos.runfolder.files import RunFolderError
from python_algos.runfolder.records import FORMAT_KEY, check_format

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _clients(n: int, samples: int = 6):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(n, samples, 3, generator=g, dtype=torch.float64)
    y = (torch.rand(n, samples, 1, generator=g, dtype=torch.float64) > 0.5).double()
    return [(X[i], y[i]) for i in range(n)]


def _run(clients, rounds, executor="sequential", **kw):
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    return simulate(SCAFFOLD(lr_local=0.1, local_steps=2), model, F.binary_cross_entropy_with_logits, clients,
                    rounds, clients_per_round=5, batch_size=2, executor=executor, metrics_every=0, **kw)


def _keep(snaps: list):
    return Checkpoint(lambda s: snaps.append(copy.deepcopy(s)), 1)  # the snapshot holds live references


@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_a_checkpoint_holds_the_sampled_clients_generators_and_resumes_bit_for_bit(executor, monkeypatch):
    n, rounds = 2000, 3
    clients = _clients(n)
    full = _run(clients, 5, executor)
    sampled: set = set()
    draw = ClientSet.participants

    def participants(self):  # the cohorts, as the run draws them
        ids = draw(self)
        sampled.update(ids.tolist())
        return ids

    monkeypatch.setattr(ClientSet, "participants", participants)
    snaps: list = []
    _run(clients, rounds, executor, callbacks=[_keep(snaps)])
    monkeypatch.undo()
    snap = snaps[-1]
    assert snap["round"] == rounds and 5 < len(sampled) <= rounds * 5
    gens = snap["client_rng"]["generators"]
    assert isinstance(gens, dict) and set(gens) == sampled, len(gens)  # base 17ffd32: a list of 2,000 states
    resumed = _run(clients, 5, executor, resume=snap)
    assert torch.equal(resumed.params, full.params)


@pytest.mark.parametrize("first,then", [("sequential", "batched"), ("batched", "sequential")])
def test_the_generators_carry_across_executors(first, then):
    """A checkpoint of one executor resumed by the other: the generators reach the states the other
    executor's uninterrupted run reaches (both draw ``randperm(n_i)[:B]`` from client i's), and the
    model is the uninterrupted run's up to the summation order."""
    clients = _clients(40)
    snaps: list = []
    _run(clients, 2, first, callbacks=[_keep(snaps)])
    ref: list = []
    full = _run(clients, 5, then, callbacks=[_keep(ref)])
    with pytest.warns(UserWarning, match="not bit-identical"):
        got: list = []
        resumed = _run(clients, 5, then, resume=snaps[-1], callbacks=[_keep(got)])
    want, have = ref[-1]["client_rng"]["generators"], got[-1]["client_rng"]["generators"]
    assert want.keys() == have.keys() and all(torch.equal(want[i], have[i]) for i in want)
    assert torch.allclose(resumed.params, full.params, rtol=1e-10, atol=1e-12)


def test_a_checkpoint_is_re_cut_by_client_index_for_any_world_size(tmp_path, monkeypatch):
    """Written by 2 ranks (each its shard's states), read on 1 and on 3: each rank gets exactly the
    saved states of its own clients, and the replicated participant sampler as written."""
    n = 12
    snaps: list = []
    _run(_clients(n), 3, callbacks=[_keep(snaps)])
    snap = snaps[-1]
    gens = snap["client_rng"]["generators"]
    assert len(gens) > 3
    fields = process_group.client_fields(snap["state"], n)
    path = str(tmp_path / "checkpoint.pt")
    for r in (1, 0):  # rank 0 writes the manifest last, as under torchrun
        lo, hi = process_group.bounds(n, 2)[r]
        monkeypatch.setattr(launch, "rank", lambda r=r: r)
        monkeypatch.setattr(launch, "world_size", lambda: 2)
        mine = dict(snap, state=snap["state"]._replace(**{k: getattr(snap["state"], k)[lo:hi] for k in fields}),
                    client_rng={**snap["client_rng"], "generators": {i: s for i, s in gens.items() if lo <= i < hi}})
        launch.ShardedCheckpointer(path, n)(mine)
    for world in (1, 3):
        seen: dict = {}
        for r, (lo, hi) in enumerate(process_group.bounds(n, world)):
            monkeypatch.setattr(launch, "distributed", lambda w=world: w > 1)
            monkeypatch.setattr(launch, "rank", lambda r=r: r)
            monkeypatch.setattr(launch, "world_size", lambda w=world: w)
            local = launch.load_checkpoint(path, n)
            got = local["client_rng"]["generators"]
            assert sorted(got) == sorted(i for i in gens if lo <= i < hi)
            assert all(torch.equal(got[i], gens[i]) for i in got)
            assert torch.equal(local["client_rng"]["participation_rng"], snap["client_rng"]["participation_rng"])
            for k in fields:
                assert torch.equal(getattr(local["state"], k), getattr(snap["state"], k)[lo:hi])
            seen.update(got)
        assert seen.keys() == gens.keys()


def test_a_checkpoint_of_the_older_format_is_refused(tmp_path):
    """Format 2 kept a list of N states: a run folder of it is refused by the format check, a snapshot
    given to simulate by the generators' restore, before anything runs."""
    clients = _clients(8)
    snaps: list = []
    _run(clients, 2, callbacks=[_keep(snaps)])
    old = copy.deepcopy(snaps[-1])
    fresh = torch.Generator().get_state()
    old["client_rng"]["generators"] = [old["client_rng"]["generators"].get(i, fresh) for i in range(8)]
    with pytest.raises(ValueError, match="client generators are a list.*older version.*start the run again"):
        _run(clients, 4, resume=old)
    with pytest.raises(RunFolderError, match="run-folder format 2, this version continues format 3"):
        check_format(str(tmp_path), {FORMAT_KEY: 2})


def test_restoring_states_of_clients_outside_the_set_is_refused():
    gens = LazyGenerators(0, 10, first_client=20)
    gens[3].manual_seed(5)
    with pytest.raises(ValueError, match=r"clients \[3\] outside this set's 20..29"):
        gens.set_touched_states({3: torch.Generator().get_state()})
    assert torch.equal(gens[3].get_state(), torch.Generator().manual_seed(5).get_state())  # nothing restored
    with pytest.raises(IndexError):
        gens[10]
