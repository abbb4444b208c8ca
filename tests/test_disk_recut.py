"""A ``state='disk'`` checkpoint resumed on another number of processes (issue 39 items 2 and 5).

Each rank of a disk run keeps its rows' log in ``<state_folder>/rank<r>/<field>`` (one process:
``<state_folder>/<field>``). A resume on Q processes of a checkpoint that P wrote re-cuts it: each new
process reads the written rows of its client range from every writer's log (a
:class:`~python_algos.clients.state_log.LogCut`, python_algos/experiments/launch.py) into its own store.

Here, in one process: P writers' stores (random rows written over several checkpoints, a compaction
among them) re-cut for Q readers hold the rows of a dense ``[N, d]`` reference (float64, bit for bit)
and only the written ones; the writers' logs stay as they were until each reader's next checkpoint
is written, and a kill (an exception at a write point) anywhere in the re-cut or that checkpoint
leaves the old checkpoint readable on any number of processes; a missing log or one of another run is
refused before the reader writes anything. The command-line runs on 1, 2 and 4 ranks are in
tests/test_disk_recut_workers.py (``processes``).
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from python_algos.clients.shard_rows import cut_rows, join_rows, remove_other_writers
from python_algos.clients.state_log import LogCut, LoggedRows
from python_algos.clients.state_store import ClientStateStore

N, D, FIELD = 13, 3, "c_i"


def bounds_of(n: int, world: int) -> list:
    return [(r * n // world, (r + 1) * n // world) for r in range(world)]


def folder_of(root, who: str) -> str:
    return os.path.join(root, who, FIELD)


def write_run(root, world: int, seed: int):
    """``world`` writers' disk stores (folder ``rank<q>``, or ``""`` for one process) of one [N, D] stack, random
    rows written over 6 checkpoints; returns (their LoggedRows at the last, the dense reference)."""
    g = torch.Generator().manual_seed(seed)
    initial = torch.randn(D, generator=g, dtype=torch.float64)
    dense = initial.repeat(N, 1)
    names = [""] if world == 1 and seed % 2 else [f"rank{q}" for q in range(world)]
    stores = [ClientStateStore(hi - lo, D, torch.float64, initial, backend="disk", folder=folder_of(root, name))
              for name, (lo, hi) in zip(names, bounds_of(N, world))]
    for _ in range(6):
        ids = torch.randperm(N, generator=g)[: int(torch.randint(0, 5, (), generator=g))]
        rows = torch.randn(ids.numel(), D, generator=g, dtype=torch.float64)
        dense[ids] = rows
        for s, (lo, hi) in zip(stores, bounds_of(N, world)):
            mine = (ids >= lo) & (ids < hi)
            s.scatter_(ids[mine] - lo, rows[mine])
        recs = [s.checkpoint() for s in stores]
    return names, recs, dense


def recut(names: list, recs: list, world: int, q_world: int, r: int):
    """What launch.local_rows makes of the writers' records for reader ``r`` of ``q_world`` (``q_world`` None: one
    process, folder ``""``)."""
    lo, hi = bounds_of(N, q_world or 1)[r]
    reader = f"rank{r}" if q_world else ""
    pieces, kept = [], None
    for name, rec, (a0, b0) in zip(names, recs, bounds_of(N, world)):
        if name == reader:
            kept = rec.log
        a, b = max(lo, a0), min(hi, b0)
        if a < b:
            pieces.append(cut_rows(rec, a - a0, b - a0, name))
    return reader, join_rows(pieces, reader, kept)


def log_files(root) -> dict:
    return {p: open(p, "rb").read() for p in (os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
            if os.path.basename(p).startswith("log-")}


@pytest.mark.parametrize("world, q_world", [(2, None), (2, 1), (2, 4), (4, 2), (1, 3), (3, 2), (2, 2)])
def test_a_disk_checkpoint_recut_for_another_world_size_holds_the_dense_rows(tmp_path, world, q_world):
    for seed in range(3):
        root = tmp_path / f"s{seed}"
        names, recs, dense = write_run(root, world, seed)
        before = log_files(root)
        readers = []
        for r in range(q_world or 1):
            reader, cut = recut(names, recs, world, q_world, r)
            same = world == (q_world or 1) and names[0] == ("rank0" if q_world else "")
            assert isinstance(cut, LoggedRows if same else LogCut)
            readers.append(ClientStateStore.from_log(cut, folder_of(root, reader)))
        for s, (lo, hi) in zip(readers, bounds_of(N, q_world or 1)):
            assert torch.equal(s.to_dense(), dense[lo:hi]), (seed, lo)
            assert s.rows_written == int((dense[lo:hi] != s.initial).any(1).sum())  # only the written rows
        assert log_files(root) == before  # the writers' logs as they were
        for s in readers:
            s.checkpoint()  # the first checkpoint: the writers' logs stay until it is written
        assert all(open(p, "rb").read() == b for p, b in before.items())
        for s in readers:
            s.checkpoint()  # the next one: the logs in a reader's own folder are gone
        remove_other_writers(str(root), q_world)  # the launcher's, once that first checkpoint replaced the old
        left = log_files(root)
        assert not set(before) & set(left), sorted(set(before) & set(left))
        mine = sorted(f"rank{r}" for r in range(q_world)) if q_world else [FIELD]
        assert sorted(os.listdir(root)) == mine


@pytest.mark.parametrize("world, q_world", [(2, None), (2, 4), (4, 2)])
def test_a_kill_anywhere_in_the_recut_leaves_the_checkpoint_resumable_on_any_world_size(tmp_path, write_points,
                                                                                        world, q_world):
    names, recs, dense = write_run(tmp_path, world, 1)
    before = log_files(tmp_path)
    calls = write_points.record()

    def resume(q: int | None, check: bool = True) -> None:
        stores = [ClientStateStore.from_log(recut(names, recs, world, q, r)[1],
                                            folder_of(tmp_path, f"rank{r}" if q else "")) for r in range(q or 1)]
        for s in stores:
            s.checkpoint()
        for s, (lo, hi) in zip(stores, bounds_of(N, q or 1)) if check else ():
            assert torch.equal(s.to_dense(), dense[lo:hi]), (q, lo)

    resume(q_world, check=False)
    n = len(calls)
    assert calls.count("state re-cut") >= 2 and "state log append" in calls, calls
    for at in range(1, n + 1):
        write_points.kill_at(at)
        with pytest.raises(write_points.Killed):
            resume(q_world)
        write_points.off()
        assert all(open(p, "rb").read() == b for p, b in before.items()), at  # the old checkpoint's logs
        for q in (q_world, world if world > 1 else None, 3):  # resumed again: as the killed one, as written, other
            resume(q)


def test_a_missing_or_foreign_writer_log_is_refused_before_anything_is_written(tmp_path):
    names, recs, _ = write_run(tmp_path / "a", 2, 0)
    os.remove(os.path.join(folder_of(tmp_path / "a", "rank1"), recs[1].log))
    reader, cut = recut(names, recs, 2, None, 0)
    with pytest.raises(ValueError, match=r"rank1.*is missing.*another machine's disk.*--workers P"):
        ClientStateStore.from_log(cut, folder_of(tmp_path / "a", reader))
    assert not os.path.exists(folder_of(tmp_path / "a", reader))  # nothing written
    for other_world, seed in ((1, 1), (2, 4)):  # another run's logs: one process's (rows of all N), or 2 ranks'
        b, c = tmp_path / f"b{seed}", tmp_path / f"c{seed}"
        names, recs, _ = write_run(b, 2, 2)
        others = write_run(c, other_world, seed)
        for q, rec in enumerate(recs):
            other = others[1][min(q, other_world - 1)]
            shutil.copyfile(os.path.join(folder_of(c, others[0][min(q, other_world - 1)]), other.log),
                            os.path.join(folder_of(b, f"rank{q}"), rec.log))
        # the checkpoint's own records, the log files of the other run (counted to their length, or cut to its count)
        for forged in ([rec._replace(records=o.records) for rec, o in zip(recs, others[1] * 2)], recs):
            reader, cut = recut(names, forged, 2, 3, 2)
            with pytest.raises(ValueError, match=r"(is not the log it counts.*another run|holds \d+ bytes, fewer).*"
                                                 r"another machine's disk.*--workers P"):
                ClientStateStore.from_log(cut, folder_of(b, reader))
        assert not os.path.exists(folder_of(b, reader))
