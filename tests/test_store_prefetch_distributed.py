"""A disk store's read-ahead under the distributed executor (issue 39 item 6): each rank reads ahead the
rows of its own shard only, numbered from its first client, which are its share of the next round's
cohort; the run equals the one-process dense run bit for bit. Ground truth: the one-process sequential
run with dense stacks and the cohorts it draws."""

from __future__ import annotations

import os
import warnings
from unittest import mock

import _dist_cases
import pytest
import torch
from torch import nn

N, COHORT, ROUNDS = 11, 4, 8


def _record(executor: str, folder: str) -> dict:
    """FedDR on N clients (rows written directly where the file system takes it), recording the cohorts
    drawn (this process's rows of them) and read ahead, and how many rows each prefetch found written."""
    import fedkernels as fk
    from python_algos import simulate
    from python_algos.algorithms.registry import make
    from python_algos.clients import row_file
    from python_algos.clients.base import ClientSet
    from python_algos.clients.distributed import DistributedClients
    from python_algos.clients.state_store import ClientStateStore

    got = {"drawn": [], "ahead": [], "written": [], "shard": (0, N)}
    cls = DistributedClients if executor == "distributed" else ClientSet
    part, up, pre = cls.participants, ClientSet.upcoming, ClientStateStore.prefetch

    def participants(cs):
        ids = part(cs)
        got["drawn"].append(ids.clone())
        got["shard"] = (getattr(cs, "lo", 0), getattr(cs, "hi", N))
        return ids

    def upcoming(cs):
        got["ahead"].append(up(cs).clone())
        return got["ahead"][-1]

    def prefetch(store, ids):
        got["written"].append(int((store._table[ids] != 0).sum()))
        return pre(store, ids)

    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(5, 4, generator=g, dtype=torch.float64) + 0.3 * i, torch.arange(5) % 3) for i in range(N)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    disk = {"state": "disk", "state_folder": os.path.join(folder, "s")} if executor == "distributed" else {}
    with mock.patch.object(cls, "participants", participants), mock.patch.object(ClientSet, "upcoming", upcoming), \
            mock.patch.object(ClientStateStore, "prefetch", prefetch), mock.patch.object(row_file, "PAD_SHARE", 0), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h = simulate(make("feddr", lr=0.05, local_steps=2, init_from="code"), model, nn.functional.cross_entropy,
                     clients, ROUNDS, fk.L1(0.01), batch_size=3, seed=2, clients_per_round=COHORT,
                     executor=executor, threads=1, **disk)
    return {**got, "params": h.params, "f": h.series("f+h")}


def rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from python_algos.experiments.launch import finish

    try:
        torch.save(_record("distributed", out_dir), os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        finish(ok=False)
        raise
    _dist_cases.finish_released()


@pytest.mark.processes
def test_each_rank_reads_ahead_its_own_share_of_the_next_cohort(tmp_path):
    import _dist_cases

    world = 2
    _dist_cases.spawn_ranks(rank_main, world, str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = _record("sequential", str(tmp_path))
    finally:
        torch.set_num_threads(n)
    assert ref["ahead"] == [] and len(ref["drawn"]) == ROUNDS  # dense: nothing read ahead
    for r, got in enumerate(ranks):
        lo, hi = got["shard"]
        assert torch.equal(got["params"], ref["params"]) and got["f"] == ref["f"], r
        assert len(got["ahead"]) == ROUNDS and all(torch.equal(a, b) for a, b in zip(got["ahead"], got["drawn"][1:]))
        assert all(a.numel() == 0 or (0 <= int(a.min()) and int(a.max()) < hi - lo) for a in got["ahead"]), r
    for t in range(ROUNDS - 1):  # the ranks' shares, in run ids, make the next cohort one process draws
        mine = torch.cat([got["ahead"][t] + got["shard"][0] for got in ranks])
        assert torch.equal(mine, ref["drawn"][t + 1]), t
    assert sum(sum(got["written"]) for got in ranks) >= ROUNDS  # rows written before were read ahead
