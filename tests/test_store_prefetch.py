"""A disk store's read-ahead of the next cohort's rows (issue 39 item 6).

``ServerClientAlgorithm.round`` asks the client set for the next round's cohort (``ClientSet.upcoming``: a
copy of the participation generator draws it) and each disk store starts reading those of its rows that
were written (``ClientStateStore.prefetch`` -> ``RowFile.prefetch``: posix_fadvise(WILLNEED) on their
ranges) while the round computes. Ground truth: a dense float64 reference written in the test, the dense
run (no store, no read-ahead) and the cohorts it draws, and the uninterrupted run for a resume."""

from __future__ import annotations

import os
import warnings
from unittest import mock

import numpy as np
import pytest
import torch
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms.registry import make
from python_algos.clients import row_file
from python_algos.clients.base import ClientSet
from python_algos.clients.distributed import DistributedClients
from python_algos.clients.state_store import ClientStateStore
from python_algos.runfolder import checkpoint as ckpt
from python_algos.runfolder.callbacks import Checkpoint

ADVISES = hasattr(os, "posix_fadvise")


def _direct(tmp_path) -> bool:
    """Whether a store in ``tmp_path`` writes its rows with O_DIRECT (ext4 does; old tmpfs does not)."""
    with mock.patch.object(row_file, "PAD_SHARE", 0):
        return ClientStateStore(2, 1, backend="disk", folder=str(tmp_path / "probe"))._file.direct


@pytest.mark.skipif(not ADVISES, reason="no posix_fadvise on this system: a prefetch is a no-op")
def test_a_prefetch_asks_the_kernel_for_exactly_the_written_rows_of_its_ids(tmp_path):
    """Rows 3, 4, 5, 10 take slots 1-4, rows 20, 30 slots 5-6, row 7 slot 7; a prefetch of rows 30, 4, 3,
    0, 7, 5, 49 asks for slots 1-3 and 6-7 (two ranges of consecutive slots), nothing for the rows never
    written; a RAM store, no ids, or no written row asks for nothing."""
    s = ClientStateStore(50, 512, torch.float64, backend="disk", folder=str(tmp_path / "s"))  # one page a row
    for ids in ([3, 4, 5, 10], [20, 30], [7]):
        s.scatter_(torch.tensor(ids), torch.ones(len(ids), 512, dtype=torch.float64))
    asked, real = [], os.posix_fadvise

    def spy(fd, offset, length, advice):
        asked.append((offset, length, advice))
        return real(fd, offset, length, advice)

    page = s._file.stride
    assert page == 4096
    with mock.patch.object(row_file.os, "posix_fadvise", spy):
        s.prefetch(torch.tensor([30, 4, 3, 0, 7, 5, 49]))
        assert sorted(asked) == [(1 * page, 3 * page, os.POSIX_FADV_WILLNEED), (6 * page, 2 * page,
                                                                              os.POSIX_FADV_WILLNEED)]
        asked.clear()
        s.prefetch(torch.tensor([0, 1, 49]))
        s.prefetch(None)
        ram = ClientStateStore(50, 512, torch.float64)
        ram.scatter_(torch.tensor([3]), torch.ones(1, 512, dtype=torch.float64))
        ram.prefetch(torch.tensor([3]))
        assert asked == []
    with pytest.raises(ValueError, match=r"ids must be row numbers in \[0, 50\)"):
        s.prefetch(torch.tensor([50]))


@pytest.mark.parametrize("direct", [True, False])
def test_a_row_written_after_its_prefetch_reads_back_as_written(direct, tmp_path):
    """Cohorts that meet clients of the last one (clients met in consecutive rounds): each round reads its
    cohort, prefetches the next one's rows, then writes its own rows (some of them in the next cohort,
    prefetched before this write) and rows of the next cohort outside its own (written after their
    prefetch too); the next round reads the values written last, against a dense reference. Rows of
    whole pages written with O_DIRECT by the row file's thread, and rows copied through the mapping."""
    if direct and not _direct(tmp_path):
        pytest.skip("the temporary folder's file system refuses O_DIRECT")
    n, d = 40, 6
    with mock.patch.object(row_file, "PAD_SHARE", 0 if direct else row_file.PAD_SHARE):
        s = ClientStateStore(n, d, torch.float64, backend="disk", folder=str(tmp_path / "s"))
    assert s._file.direct == direct
    g = torch.Generator().manual_seed(5)
    ref = torch.zeros(n, d, dtype=torch.float64)
    cur, stale = torch.randperm(n, generator=g)[:8], 0
    for r in range(30):
        again = cur[torch.randperm(8, generator=g)[:3]]  # three clients of this cohort again
        fresh = torch.randperm(n, generator=g)
        nxt = torch.cat([again, fresh[~torch.isin(fresh, again)][:5]])
        assert torch.equal(s.gather_(cur, torch.empty(8, d, dtype=torch.float64)), ref[cur]), r
        s.prefetch(nxt)
        before = (ref[nxt] != 0).any(1)  # rows the prefetch reads from the file
        rows = torch.randn(8, d, generator=g, dtype=torch.float64)
        s.scatter_(cur, rows)
        ref[cur] = rows
        other = nxt[~torch.isin(nxt, cur)][:2]
        rows = -torch.rand(other.numel(), d, generator=g, dtype=torch.float64)
        s.scatter_(other, rows)
        ref[other] = rows
        stale += int((before & (torch.isin(nxt, cur) | torch.isin(nxt, other))).sum())  # then written again
        cur = nxt
    assert stale > 30  # the test met what it is about
    assert torch.equal(s.to_dense(), ref)


def _fuzz_one(seed: int, folder: str) -> None:
    """Random gathers, scatters, prefetches (ids written or not, repeated or not) and checkpoints with a
    resume from the log, on a disk store whose rows are written directly (odd seeds: row_file.PAD_SHARE = 0)
    or through the mapping, against a dense reference."""
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 40)), int(rng.integers(1, 7))
    dtype = torch.float64 if rng.random() < 0.7 else torch.float32
    g = torch.Generator().manual_seed(seed)
    where = os.path.join(folder, str(seed))
    with mock.patch.object(row_file, "PAD_SHARE", 0 if seed % 2 else row_file.PAD_SHARE):
        store = ClientStateStore(n, d, dtype, backend="disk", folder=where)
        ref = torch.zeros(n, d, dtype=dtype)
        for _ in range(int(rng.integers(1, 16))):
            ids = torch.from_numpy(rng.permutation(n)[: int(rng.integers(0, n + 1))]).long()
            op = rng.random()
            if op < 0.3:
                assert torch.equal(store.gather_(ids, torch.empty(ids.numel(), d, dtype=dtype)), ref[ids]), seed
            elif op < 0.6:
                rows = torch.randn(ids.numel(), d, generator=g, dtype=dtype)
                store.scatter_(ids, rows)
                ref[ids] = rows
            elif op < 0.92:
                store.prefetch(torch.from_numpy(rng.integers(0, n, int(rng.integers(0, 2 * n + 1)))).long())
            else:
                rec = ckpt.decode(ckpt.encode(store.checkpoint()))
                store = ClientStateStore.from_log(rec, where)
        assert torch.equal(store.to_dense(), ref), seed


def test_prefetches_among_gathers_scatters_and_resumes_equal_a_dense_reference(fuzz_budget, tmp_path):
    first, n = fuzz_budget(150)
    for seed in range(first, first + n):
        _fuzz_one(seed, str(tmp_path))


def _problem(n_clients=6):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(5, 4, generator=g, dtype=torch.float64) + 0.3 * i, torch.arange(5) % 3)
            for i in range(n_clients)]


def _run(name, rounds, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    alg = make(name, lr=0.05, local_steps=2, **({"init_from": "code"} if name == "feddr" else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate(alg, model, nn.functional.cross_entropy, _problem(), rounds, fk.L1(0.01) if alg.composite
                        else fk.Zero(), batch_size=3, seed=2, clients_per_round=3, **kw)


class _Spy:
    """Records the cohorts drawn (``participants``), the cohorts read ahead (``upcoming``) and, per prefetch,
    how many of its rows were written (the rows the store asks the disk for)."""

    def __init__(self):
        self.drawn, self.ahead, self.written = [], [], []

    def __enter__(self):
        part, up, pre = ClientSet.participants, ClientSet.upcoming, ClientStateStore.prefetch

        def participants(cs):
            ids = part(cs)
            self.drawn.append(ids.clone())
            return ids

        def upcoming(cs):
            ids = up(cs)
            self.ahead.append(ids.clone())
            return ids

        def prefetch(store, ids):
            self.written.append(int((store._table[ids] != 0).sum()))
            return pre(store, ids)

        self._patches = [mock.patch.object(ClientSet, "participants", participants),
                         mock.patch.object(ClientSet, "upcoming", upcoming),
                         mock.patch.object(ClientStateStore, "prefetch", prefetch)]
        for p in self._patches:
            p.start()
        return self

    def __exit__(self, *exc):
        for p in self._patches:
            p.stop()


def _fields(state):
    return {f: v.to_dense() if isinstance(v, ClientStateStore) else v
            for f, v in state._asdict().items() if f in type(state).client_fields}


@pytest.mark.parametrize("name", ["feddr", "scaffold"])
def test_a_disk_run_reads_each_next_cohort_ahead_and_equals_the_dense_run(name, tmp_path):
    """3 of 6 clients a round (clients met in consecutive rounds most rounds), rows written directly where
    the file system takes it: every round reads the next round's cohort ahead, which is the cohort the next
    round draws, the cohorts are the dense run's, and the model, metrics and rows are the dense run's bits."""
    with _Spy() as dense:
        want = _run(name, 10)
    with _Spy() as spy, mock.patch.object(row_file, "PAD_SHARE", 0):
        got = _run(name, 10, state="disk", state_folder=str(tmp_path / "s"))
    assert dense.ahead == []  # no store, no read-ahead
    assert len(spy.drawn) == 10 and all(torch.equal(a, b) for a, b in zip(spy.drawn, dense.drawn))
    assert len(spy.ahead) == 10 and all(torch.equal(a, b) for a, b in zip(spy.ahead, spy.drawn[1:]))
    assert sum(spy.written) >= 10  # rows written before were read ahead
    assert torch.equal(got.params, want.params) and got.series("f+h") == want.series("f+h")
    assert all(torch.equal(v, _fields(want.state)[f]) for f, v in _fields(got.state).items())


def test_a_disk_run_resumed_with_its_read_ahead_equals_the_uninterrupted_run(tmp_path):
    """FedDR on disk (rows written directly), stopped one round past a checkpoint: the resumed run reads
    its cohorts ahead as the uninterrupted one does and ends with its model, metrics, rows and cohorts."""
    with _Spy() as full_spy:
        full = _run("feddr", 12)
    ck, where = str(tmp_path / "ck.pt"), str(tmp_path / "s")
    with mock.patch.object(row_file, "PAD_SHARE", 0):
        _run("feddr", 12, state="disk", state_folder=where,
             callbacks=[lambda t, s, m: t == 8, Checkpoint(ckpt.Checkpointer(ck), 3)])
        snap = ckpt.load(ck)
        assert snap["round"] == 6
        with _Spy() as spy:
            resumed = _run("feddr", 12, state="disk", state_folder=where, resume=ckpt.load(ck))
    assert len(spy.drawn) == 6 and all(torch.equal(a, b) for a, b in zip(spy.drawn, full_spy.drawn[6:]))
    assert all(torch.equal(a, b) for a, b in zip(spy.ahead, spy.drawn[1:])) and sum(spy.written) > 0
    assert torch.equal(resumed.params, full.params) and resumed.series("f+h") == full.series("f+h")[6:]
    assert all(torch.equal(v, _fields(full.state)[f]) for f, v in _fields(resumed.state).items())


def test_a_rank_reads_ahead_only_its_own_rows():
    """Under the distributed executor a rank's stores hold its shard's rows, numbered from its first client:
    ``held`` keeps the next cohort's clients of the shard [lo, hi) as those rows (``participants`` keeps
    this round's likewise)."""
    cs = DistributedClients.__new__(DistributedClients)
    cs.lo, cs.hi = 4, 9
    assert cs.held(torch.tensor([0, 3, 4, 6, 8, 9, 12])).tolist() == [0, 2, 4]
    assert cs.held(torch.tensor([0, 9], dtype=torch.long)).tolist() == []


def test_the_estimate_counts_the_rows_read_ahead_and_refuses_a_run_they_do_not_fit(tmp_path, monkeypatch):
    """At most a cohort's rows of each stack are read ahead, as the row file lays them out: 2 stacks of
    5 rows of 1,024 float32 (one page each, written directly) take 40 KiB, of 124 float32 (496 B, through
    the mapping) 4,960 B; a disk run whose working stacks and staged rows
    fit but not with the rows read ahead is refused naming clients_per_round."""
    from python_algos.clients import state_plan

    est = state_plan.StateEstimate(20, 1024, 4, 2, cohort=5, rounds=2)
    assert est.ahead_bytes == 2 * 5 * 4096
    assert state_plan.StateEstimate(20, 124, 4, 2, cohort=5, rounds=2).ahead_bytes == 2 * 5 * 496
    plan = state_plan.StatePlan("disk", str(tmp_path / "run"), 5)
    ram = est.working_bytes + est.stage_bytes + est.ahead_bytes // 2
    monkeypatch.setattr(state_plan, "memory_available", lambda: int(ram / state_plan.RAM_SHARE))
    with pytest.raises(state_plan.DoesNotFit, match=r"read ahead \(3\.81e-05 GiB\).*clients_per_round"):
        plan.choose_backend(est)
    monkeypatch.setattr(state_plan, "memory_available", lambda: int((ram + est.ahead_bytes) / state_plan.RAM_SHARE))
    assert plan.choose_backend(est) == "disk"


def test_the_population_benchmark_times_the_state_phases_when_asked(tmp_path):
    """``python -m bench.population --phases`` (one configuration, in this process, scaled down): FedDR's
    disk run records each phase's ms a round (gathers, scatters, read-ahead, clients built) and puts the timed
    functions back; without the flag nothing is timed."""
    import python_algos.algorithms.base as ab
    from bench import population as bench

    before = (ab.rows_, ab.put_rows_, ab.read_ahead)
    cfg = {"workload": "mlp", "algorithm": "FedDR", "N": 300, "lazy": True, "state": "disk", "cohort": 5,
           "rounds": 3, "K": 1, "phases": True}
    got = bench.one(cfg)["phases_ms"]
    assert (ab.rows_, ab.put_rows_, ab.read_ahead) == before
    assert set(got) == {"gather", "scatter", "read_ahead", "build"} and all(v > 0 for v in got.values()), got
    assert bench.one({**cfg, "N": 20, "lazy": False, "state": "dense", "phases": False})["phases_ms"] is None
    note = bench._phases_note([{**cfg, "phases_ms": got}])
    assert "FedDR N = 300 disk: gather" in note and "read_ahead" in note
