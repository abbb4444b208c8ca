"""The client-state store (python_algos/clients/state_store.py) and simulate's ``state=`` (state_plan.py):
the store's rows against a dense [N, d] reference under random gathers / scatters / checkpoints; every
partial-participation algorithm on each store backend against the dense run, bit for bit; a population of
10^5 clients storing only the rows it touched; and a run that cannot fit refused, not killed."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import warnings
from unittest import mock

import numpy as np
import pytest
import torch
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms import SCAFFOLD
from python_algos.algorithms.registry import ALGORITHMS, make
from python_algos.algorithms.scaffold import SCAFFOLDState
from python_algos.clients import row_file
from python_algos.clients.state_plan import StateEstimate
from python_algos.clients.state_store import ClientStateStore, LoggedRows, StoredRows
from python_algos.runfolder import checkpoint as ckpt
from python_algos.runfolder.callbacks import Checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTIAL = [n for n, e in ALGORITHMS.items() if e.cls.partial_participation]


def _takes_o_direct() -> bool:
    """Whether the temporary folder (pytest's tmp_path is in it) takes O_DIRECT writes (ext4 does; tmpfs
    before Linux 6.6 does not): where it does not, a disk store copies its rows through the mapping."""
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "probe"), "wb").close()
        fd = row_file._direct_fd(os.path.join(tmp, "probe"))
        if fd is not None:
            os.close(fd)
        return fd is not None


DIRECT = _takes_o_direct()
STATEFUL = [n for n in PARTIAL if any(getattr(v, "client_fields", ()) for k, v in  # per-client stacks in their State
                                      vars(sys.modules[ALGORITHMS[n].cls.__module__]).items() if k.endswith("State"))]


# -- the store against a dense reference ------------------------------------------------------------------
def _fuzz_one(seed: int, folder: str) -> None:
    """Seeds 1 and 3 mod 4 run a disk store; 3 mod 4 with its rows padded to whole pages and written with
    O_DIRECT by the row file's thread (row_file.PAD_SHARE = 0: any row, however small)."""
    with mock.patch.object(row_file, "PAD_SHARE", 0 if seed % 4 == 3 else row_file.PAD_SHARE):
        _fuzz_store(seed, folder)


def _fuzz_store(seed: int, folder: str) -> None:
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 60)), int(rng.integers(1, 9))
    dtype = torch.float64 if rng.random() < 0.8 else torch.float32
    backend = ("ram", "disk")[seed % 2]
    g = torch.Generator().manual_seed(seed)
    init = None if rng.random() < 0.5 else torch.randn(d, generator=g, dtype=dtype)
    ref = torch.zeros(n, d, dtype=dtype) if init is None else init.expand(n, d).clone()
    store = ClientStateStore(n, d, dtype, init, backend=backend,
                             folder=os.path.join(folder, str(seed)) if backend == "disk" else None)
    assert backend == "ram" or store._file.direct == (seed % 4 == 3 and DIRECT), seed
    touched: set = set()
    last = None  # disk: the last checkpoint (its record, the rows and the rows written then)
    for _ in range(int(rng.integers(1, 12))):
        k = int(rng.integers(0, n + 1))
        ids = torch.from_numpy(rng.permutation(n)[:k]).long()
        op = rng.random()
        if op < 0.45:
            out = torch.full((k, d), float("nan"), dtype=dtype)
            store.gather_(ids, out)
            assert torch.equal(out, ref[ids]), seed
        elif op < 0.9:
            rows = torch.randn(k, d, generator=g, dtype=dtype)
            store.scatter_(ids, rows)
            ref[ids] = rows
            touched.update(ids.tolist())
        elif backend == "ram":  # a checkpoint and back: the same rows, the same table
            store = ClientStateStore.from_stored_rows(ckpt.decode(ckpt.encode(store.stored_rows())))
        else:  # a checkpoint (the rows since the last one appended to the log); then, half the time, a kill
            last = (ckpt.decode(ckpt.encode(store.checkpoint())), ref.clone(), set(touched))
            if rng.random() < 0.5:
                store, ref, touched = _killed_and_resumed(store, last, rng, g)
        size = int(rng.integers(1, n + 2))
        got = [(first, rows.clone()) for first, rows in store.chunks(size)]
        assert [f for f, _ in got] == list(range(0, n, size)) and all(r.shape[0] <= size for _, r in got)
        assert torch.equal(torch.cat([r for _, r in got]), ref), seed
        assert store.rows_written == len(touched), seed
    assert torch.equal(store.to_dense(), ref) and store.to_dense().dtype == dtype
    if backend == "disk" and last is not None:  # the last checkpoint still reads back, whatever came after it
        store, ref, touched = _killed_and_resumed(store, last, rng, g)
        assert torch.equal(store.to_dense(), ref) and store.rows_written == len(touched), seed


def _killed_and_resumed(store, last, rng, g):
    """Rounds past the checkpoint ``last`` write rows (the store's files run ahead of it), the log may
    get a torn record past its count (a kill mid-append), and the store is read back from the log."""
    rec, ref, touched = last
    n, d = ref.shape
    later = torch.from_numpy(rng.permutation(n)[: int(rng.integers(0, n + 1))]).long()
    store.scatter_(later, torch.randn(later.numel(), d, generator=g, dtype=ref.dtype))
    if rng.random() < 0.5:
        with open(os.path.join(store.folder, rec.log), "ab") as f:
            f.write(b"\x7f" * int(rng.integers(1, 8 + 8 * d)))
    store = ClientStateStore.from_log(rec, store.folder)
    assert store.backend == "disk" and torch.equal(store.to_dense(), ref)
    return store, ref.clone(), set(touched)


def test_store_rows_equal_a_dense_reference(fuzz_budget, tmp_path):
    first, n = fuzz_budget(1000)
    for seed in range(first, first + n):
        _fuzz_one(seed, str(tmp_path))


def test_store_holds_the_table_and_the_written_rows_only(tmp_path):
    for backend in ("ram", "disk"):
        s = ClientStateStore(10**6, 124, torch.float32, backend=backend,
                             folder=str(tmp_path / backend) if backend == "disk" else None)
        ids = torch.arange(0, 10**6, 10**4)  # 100 rows
        s.scatter_(ids, torch.ones(100, 124))
        assert s.rows_written == 100
        assert s.nbytes <= 8 * 10**6 + 2 * 101 * 124 * 4  # the row table + at most 1.5x the written rows
    assert os.path.getsize(tmp_path / "disk" / "rows.bin") <= 2 * 101 * 124 * 4


def test_a_growing_ram_store_touches_each_new_page_once():
    """The block grows without copying the rows written: page faults over 30 scatters of 64 new rows
    stay near one per new page (a block grown by copies faulted ~3 per page)."""
    import resource

    s, d = ClientStateStore(10**5, 4096, torch.float32), 4096  # a row: 4 pages of 4 KiB
    rows, perm = torch.randn(64, d), torch.randperm(10**5, generator=torch.Generator().manual_seed(0))
    faults = 0
    for r in range(30):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        s.scatter_(perm[64 * r:64 * (r + 1)], rows)
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    pages = 30 * 64 * d * 4 // resource.getpagesize()
    assert faults < 1.6 * pages, (faults, pages)
    assert torch.equal(s.gather_(perm[:64], torch.empty(64, d)), rows)


def _resident_bytes(name: str) -> int:
    """Bytes of this process's mappings of files named ``name`` that are in RAM (``Rss`` in /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping: range perms offset dev inode [path]
                inside = len(head) == 6 and os.path.basename(head[5]) == name
            elif inside and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


@pytest.mark.skipif(not DIRECT, reason="the temporary folder's file system refuses O_DIRECT")
def test_a_disk_store_of_page_sized_rows_writes_them_directly_and_reads_them_back(tmp_path):
    """Rows of 16,500 float32 (66,000 B, padded to 69,632) take the O_DIRECT path: the rows written are
    not in the process's memory (copied through the mapping, they were), rows read while
    the next cohort is being written and rows of that cohort are the rows written, and the file holds
    the padded rows."""
    d, n = 16_500, 2_000
    s = ClientStateStore(n, d, torch.float32, backend="disk", folder=str(tmp_path / "s"))
    assert s._file.direct and s._file.stride == 17 * 4096
    g, ref, cohorts = torch.Generator().manual_seed(3), torch.zeros(n, d), []
    for r in range(6):
        ids = torch.randperm(n, generator=g)[:40]
        if cohorts:
            ids[:3] = cohorts[-1][:3]  # clients of the last cohort
        rows = torch.randn(40, d, generator=g)
        s.scatter_(ids, rows)
        ref[ids] = rows
        older = cohorts[-2][3:5] if len(cohorts) > 1 else torch.tensor([7, 8])  # not in flight: read at once
        for some in (older, ids[:2]):  # then two of the rows in flight: read once written
            assert torch.equal(s.gather_(some, torch.empty(some.numel(), d)), ref[some]), r
        cohorts.append(ids)
    # in RAM: the rows read back since the file was last mapped again (at most 9 and slot 0), never the
    # last cohort's 37 new rows, which a copy through the mapping leaves there
    assert _resident_bytes("rows.bin") <= 20 * 17 * 4096, _resident_bytes("rows.bin")
    assert torch.equal(s.to_dense(), ref)
    assert os.path.getsize(tmp_path / "s" / "rows.bin") == s._file.block.shape[0] * 17 * 4096


@pytest.mark.skipif(not DIRECT, reason="the temporary folder's file system refuses O_DIRECT")
def test_a_direct_store_streamed_chunk_after_chunk_equals_a_dense_reference(tmp_path):
    """A streamed round's pattern on rows written directly: each chunk read while the previous chunk's
    rows are being written, then written back changed, three sweeps."""
    with mock.patch.object(row_file, "PAD_SHARE", 0):
        s = ClientStateStore(300, 5, torch.float64, backend="disk", folder=str(tmp_path / "s"))
        assert s._file.direct
        ref = torch.randn(300, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        s.scatter_(None, ref)
        for _ in range(3):
            for first, rows in s.chunks(37):
                assert torch.equal(rows, ref[first:first + rows.shape[0]]), first
                ref[first:first + rows.shape[0]] = rows * 2 + 1
                s.scatter_(torch.arange(first, first + rows.shape[0]), rows * 2 + 1)
        assert torch.equal(s.to_dense(), ref)


@pytest.mark.skipif(not DIRECT, reason="the temporary folder's file system refuses O_DIRECT")
def test_a_failed_direct_write_is_raised_by_every_later_access_and_a_dropped_store_ends_its_thread(tmp_path):
    def full(fd, data, offset):
        raise OSError(28, "No space left on device")

    with mock.patch.object(row_file, "PAD_SHARE", 0):
        bad = ClientStateStore(8, 3, torch.float64, backend="disk", folder=str(tmp_path / "a"))
        with mock.patch.object(row_file.os, "pwrite", full):
            bad.scatter_(torch.tensor([2, 5]), torch.ones(2, 3, dtype=torch.float64))
            bad._file._pending.thread.join()
        for read in (lambda: bad.gather_(torch.tensor([2]), torch.empty(1, 3, dtype=torch.float64)),
                     lambda: bad.gather_(torch.tensor([1]), torch.empty(1, 3, dtype=torch.float64)), bad.to_dense):
            with pytest.raises(OSError, match=r"writing client-state rows to .*rows.bin failed: .*No space left"):
                read()
        s = ClientStateStore(8, 3, torch.float64, backend="disk", folder=str(tmp_path / "b"))
        s.scatter_(torch.tensor([1]), torch.ones(1, 3, dtype=torch.float64))
        thread = s._file._pending.thread
        del s
        gc.collect()
        assert thread is not None and not thread.is_alive()  # joined by the row file's finalizer
    assert not [t for t in threading.enumerate() if t.name == "fedkernels-rows"]


@pytest.mark.parametrize("backend", ["ram", "disk"])
def test_cohorts_of_new_rows_among_written_ones_equal_a_dense_reference(backend, tmp_path):
    """Cohorts of 100 whose new rows take consecutive slots between rows written before (a few runs of
    slots, each written and read as a slice) against a dense float64 reference."""
    g = torch.Generator().manual_seed(1)
    s = ClientStateStore(100_000, 7, backend=backend, folder=str(tmp_path / "s") if backend == "disk" else None)
    ref, last = torch.zeros(100_000, 7, dtype=torch.float64), torch.empty(0, dtype=torch.int64)
    for r in range(12):
        ids = torch.randperm(100_000, generator=g)
        if r:  # 2 to 5 clients of the last cohort among the others
            ids = ids[~torch.isin(ids, last)]
            ids[torch.randperm(100, generator=g)[: 2 + r % 4]] = last[: 2 + r % 4]
        ids = ids[:100]
        rows = torch.randn(100, 7, generator=g, dtype=torch.float64)
        s.scatter_(ids, rows)
        ref[ids] = rows
        out = torch.full((100, 7), float("nan"), dtype=torch.float64)
        assert torch.equal(s.gather_(ids, out), ref[ids]) and torch.equal(s.to_dense(), ref)
        last = ids


def test_bad_input_is_refused_and_leaves_the_store_as_it_was(tmp_path):
    s = ClientStateStore(5, 3, torch.float64, torch.ones(3))
    s.scatter_(torch.tensor([1]), torch.full((1, 3), 7.0, dtype=torch.float64))
    before = s.to_dense()
    bad = [((torch.tensor([2, 2]), torch.zeros(2, 3, dtype=torch.float64)), "ids must be distinct"),
           ((torch.tensor([5]), torch.zeros(1, 3, dtype=torch.float64)), r"ids must be row numbers in \[0, 5\)"),
           ((torch.tensor([0]), torch.zeros(1, 3)), "rows must be a .1, 3. torch.float64"),
           ((torch.tensor([0.0]), torch.zeros(1, 3, dtype=torch.float64)), "ids must be a 1-D int64")]
    for args, msg in bad:
        with pytest.raises(ValueError, match=msg):
            s.scatter_(*args)
    with pytest.raises(ValueError, match="out must be"):
        s.gather_(torch.tensor([0, 1]), torch.empty(3, 3, dtype=torch.float64))
    assert torch.equal(s.to_dense(), before) and s.rows_written == 1
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        ClientStateStore(2, 2, torch.float16)
    ClientStateStore(2, 2, backend="disk", folder=str(tmp_path / "f"))
    with pytest.raises(FileExistsError, match="already holds a state store"):
        ClientStateStore(2, 2, backend="disk", folder=str(tmp_path / "f"))


# -- simulate(state=...) against the dense run ----------------------------------------------------------------
def _problem(n_clients=9, dim_in=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    clients = [(torch.randn(6, dim_in, generator=g, dtype=torch.float64) + 0.3 * i, torch.arange(6) % 3)
               for i in range(n_clients)]
    return clients


def _model(dim_in=4):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(dim_in, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def _alg(name):
    return make(name, lr=0.05, local_steps=2, **({"init_from": "code"} if name == "feddr" else {}))


def _run(name, **kw):
    reg = fk.L1(0.01) if _alg(name).composite else fk.Zero()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate(_alg(name), _model(), nn.functional.cross_entropy, _problem(), 5, reg, batch_size=4, seed=2,
                        clients_per_round=3, **kw)


def _dense_fields(state):
    return {f: (v.to_dense() if isinstance(v, ClientStateStore) else v)
            for f, v in state._asdict().items() if f in type(state).client_fields}


@pytest.mark.parametrize("executor", ["sequential", "batched"])
@pytest.mark.parametrize("name", PARTIAL)
def test_every_partial_participation_algorithm_on_a_store_equals_the_dense_run(name, executor, tmp_path):
    dense = _run(name, executor=executor)
    for state in ("ram", "disk", "auto"):
        got = _run(name, executor=executor, state=state, **({"state_folder": str(tmp_path / name)}
                                                              if state == "disk" else {}))
        assert torch.equal(got.params, dense.params), state
        assert got.series("f+h") == dense.series("f+h"), state
        want, have = _dense_fields(dense.state), _dense_fields(got.state)
        assert want.keys() == have.keys() and all(torch.equal(have[f], want[f]) for f in want), state
        fields = type(got.state).client_fields
        assert all(isinstance(getattr(got.state, f), ClientStateStore) for f in fields), state
        assert all(getattr(got.state, f).backend == ("disk" if state == "disk" else "ram") for f in fields)


def test_a_ram_store_resumes_from_a_checkpoint_file_bit_identically(tmp_path):
    full = _run("scaffold", state="ram")
    saver = ckpt.Checkpointer(tmp_path / "ck.pt")
    _run("scaffold", state="ram", callbacks=[lambda t, s, m: t == 4, Checkpoint(saver, 3)])
    snap = ckpt.load(tmp_path / "ck.pt")
    assert isinstance(snap["state"].c_i, StoredRows) and snap["state"].c_i.block.shape[0] <= 10  # rows written + 1
    for state in ("ram", "dense"):  # a store's snapshot resumes into either form, the same rows
        resumed = _run("scaffold", state=state, resume=ckpt.load(tmp_path / "ck.pt"))
        assert torch.equal(resumed.params, full.params), state
        assert torch.equal(_dense_fields(resumed.state)["c_i"], full.state.c_i.to_dense()), state


def _run_cast(name, dtype, rounds, **kw):
    """:func:`_run` in ``dtype`` for ``rounds`` rounds."""
    alg = _alg(name)
    reg = fk.L1(0.01) if alg.composite else fk.Zero()
    clients = [(X.to(dtype), y) for X, y in _problem()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate(alg, _model().to(dtype), nn.functional.cross_entropy, clients, rounds, reg, batch_size=4,
                        seed=2, clients_per_round=3, **kw)


@pytest.mark.parametrize("executor, dtype", [("sequential", torch.float64), ("batched", torch.float64),
                                             ("sequential", torch.float32), ("batched", torch.float32)])
@pytest.mark.parametrize("name", STATEFUL)
def test_a_disk_store_resumes_from_its_checkpoints_bit_identically(name, executor, dtype, tmp_path):
    """Stopped one round past a checkpoint (its files ahead of it), a state='disk' run resumes from the
    checkpoint file (which holds the log's record, no row) to the uninterrupted run's model, metrics and
    rows, twice (the second into a folder the first resume wrote past it); its logs are compacted."""
    rounds, kw = 12, {"executor": executor, "state": "disk"}
    full = _run_cast(name, dtype, rounds, executor=executor)
    stops = [3, 8, 11] if (executor, dtype) == ("sequential", torch.float64) else [8 + STATEFUL.index(name) % 3]
    for stop in stops:
        where, ck = str(tmp_path / f"state{stop}"), str(tmp_path / f"ck{stop}.pt")
        saver = ckpt.Checkpointer(ck)
        _run_cast(name, dtype, rounds, state_folder=where, callbacks=[lambda t, s, m, stop=stop: t == stop,
                                                                      Checkpoint(saver, 2)], **kw)
        snap = ckpt.load(ck)
        fields = type(snap["state"]).client_fields
        assert snap["round"] == stop - 1 - (stop - 1) % 2  # rounds past it wrote the store's files
        assert all(isinstance(getattr(snap["state"], f), LoggedRows) for f in fields)
        for again in range(2):
            resumed = _run_cast(name, dtype, rounds, state_folder=where, resume=ckpt.load(ck), **kw)
            assert torch.equal(resumed.params, full.params), (stop, again)
            assert resumed.series("f+h") == full.series("f+h")[snap["round"]:], (stop, again)
            want, have = _dense_fields(full.state), _dense_fields(resumed.state)
            assert all(torch.equal(have[f], want[f]) for f in want), (stop, again)
    if len(stops) > 1:  # 12 rounds of 3 of 9 clients, a checkpoint every 2: the log outgrew twice the rows
        assert int(getattr(snap["state"], fields[0]).log.split("-")[1].split(".")[0]) >= 2


def test_a_disk_checkpoint_refuses_a_missing_log_and_flags_nan_rows(tmp_path):
    s = ClientStateStore(6, 2, torch.float64, backend="disk", folder=str(tmp_path / "a"))
    s.scatter_(torch.tensor([1, 4]), torch.tensor([[1.0, 2.0], [float("nan"), 0.0]], dtype=torch.float64))
    rec = s.checkpoint()
    assert rec.records == 2 and rec.check != rec.check  # NaN: a checkpoint of this state is refused ...
    with pytest.raises(ckpt.Diverged, match="'c_i' holds NaN/Inf"):
        ckpt.Checkpointer(tmp_path / "ck.pt")({"round": 1, "state": SCAFFOLDState(torch.zeros(2), torch.zeros(2),
                                                                                   rec, 1)})
    assert not (tmp_path / "ck.pt").exists()  # ... before the file is written
    with pytest.raises(ValueError, match="row log .*log-1.bin holds 10 bytes, fewer than the 2 records"):
        with open(tmp_path / "a" / rec.log, "r+b") as f:
            f.truncate(10)
        ClientStateStore.from_log(rec, str(tmp_path / "a"))
    with pytest.raises(ValueError, match="row log .*log-1.bin is missing"):
        ClientStateStore.from_log(rec, str(tmp_path / "elsewhere"))


def test_an_append_cut_short_by_an_error_is_cut_off_by_the_next_checkpoint(tmp_path, monkeypatch):
    from python_algos.runfolder import faults

    s = ClientStateStore(8, 3, torch.float64, backend="disk", folder=str(tmp_path / "a"))
    s.scatter_(torch.tensor([0, 5]), torch.ones(2, 3, dtype=torch.float64))
    s.checkpoint()
    s.scatter_(torch.tensor([2]), torch.full((1, 3), 2.0, dtype=torch.float64))

    def fail(name):
        raise OSError(28, "No space left on device")  # half of the record written, then the disk is full
    monkeypatch.setattr(faults, "point", fail)
    with pytest.raises(OSError):
        s.checkpoint()
    monkeypatch.setattr(faults, "point", lambda name: None)
    s.scatter_(torch.tensor([7]), torch.full((1, 3), 3.0, dtype=torch.float64))
    rec = s.checkpoint()  # the torn half-record is cut off, not read as the start of the next one
    assert rec.records == 4 and os.path.getsize(tmp_path / "a" / rec.log) == 4 * (8 + 3 * 8)
    assert torch.equal(ClientStateStore.from_log(rec, str(tmp_path / "a"), "ram").to_dense(), s.to_dense())


def test_state_options_are_checked_before_the_run():
    with pytest.raises(ValueError, match="state must be one of"):
        _run("scaffold", state="memmap")
    with pytest.raises(ValueError, match="state='disk' with checkpoints .or resume. needs state_folder"):
        _run("scaffold", state="disk", callbacks=[Checkpoint(lambda snap: None, 1)])
    with pytest.raises(ValueError, match="state_folder is where state='disk' keeps its rows"):
        _run("scaffold", state="ram", state_folder="x")
    with pytest.raises(ValueError, match="state='ram' runs on the sequential, batched and distributed executors only"):
        _run("scaffold", state="ram", backend=lambda *a, **kw: None)  # refused before the backend is called
    full = simulate(SCAFFOLD(lr_local=0.05, local_steps=2), _model(), nn.functional.cross_entropy, _problem(), 2,
                    state="auto")  # full participation: auto keeps the dense stack
    assert isinstance(full.state.c_i, torch.Tensor) and full.state.c_i.shape == (9, 43)


def test_an_init_that_writes_every_clients_row_is_refused_naming_state_dense():
    alg = make("feddr", lr=0.05, local_steps=2)  # init_from="paper": x_i ≈ prox_{η f_i}(x⁰) for every client
    with pytest.raises(ValueError, match=r"FedDR.init writes every client's row .* use state='dense'"):
        simulate(alg, _model(), nn.functional.cross_entropy, _problem(), 2, clients_per_round=3, state="ram")


# -- a large population stores only the rows it touched ----------------------------------------------------
@pytest.mark.parametrize("n_clients", [20_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_scaffold_on_a_large_population_stores_only_the_cohorts_rows(n_clients):
    """d = 124 (a9a's linear model), cohort 10, 3 rounds, clients given as a list (every client's tensors
    built and probed), so 10^5 (slow) / 2·10^4; tests/test_population.py runs 10^6 built on demand."""
    X, y = torch.randn(n_clients, 1, 123), torch.randn(n_clients, 1, 1)
    torch.manual_seed(0)
    hist = simulate(SCAFFOLD(lr_local=0.05, local_steps=2), nn.Linear(123, 1), nn.functional.mse_loss,
                    [(X[i], y[i]) for i in range(n_clients)], 3, clients_per_round=10, state="ram", metrics_every=0)
    store = hist.state.c_i
    # every client that trained has a nonzero control variate, the others none: the rows written
    assert 25 <= store.rows_written == int((store.to_dense() != 0).any(1).sum()) <= 30
    rows = (1 + store.rows_written) * 124 * 4
    assert store.nbytes - 8 * n_clients <= 1.5 * rows + 16 * 124 * 4  # not N x d: 10^5 x 124 x 4 = 49.6 MB
    assert StateEstimate(n_clients, 124, 4, 1, 10, 3).store_bytes == 8 * n_clients + 31 * 124 * 4


REFUSAL = textwrap.dedent("""
    import resource, sys, torch
    from torch import nn
    from python_algos import simulate
    from python_algos.algorithms import SCAFFOLD
    from python_algos.clients.state_plan import DoesNotFit
    with open("/proc/self/status") as f:
        vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + 600 * 2**20, resource.RLIM_INFINITY))
    x, y = torch.randn(1, 50_000, dtype=torch.float64), torch.randn(1, 1, dtype=torch.float64)
    clients = [(x, y)] * 2000  # one sample each, shared: the [2000, 50001] float64 state is 0.75 GiB
    model = nn.Linear(50_000, 1).double()
    for state, k in [("dense", 10), ("ram", 1500), ("auto", 1500), ("ram", 10)]:
        try:
            h = simulate(SCAFFOLD(lr_local=0.05, local_steps=1), model, nn.functional.mse_loss, clients, 2,
                         clients_per_round=k, state=state, metrics_every=0)
            print(state, k, "ran", 0 < h.state.c_i.rows_written <= 20)
        except DoesNotFit as e:
            print(state, k, "refused:", e)
""")


@pytest.mark.processes
def test_a_run_that_cannot_fit_is_refused_naming_the_option_under_an_address_space_limit():
    p = subprocess.run([sys.executable, "-c", REFUSAL], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert len(lines) == 4 and "DefaultCPUAllocator" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert lines[0].startswith("dense 10 refused: a dense [2000, 50001] client stack") and "state='ram'" in lines[0]
    for line in lines[1:3]:  # 1500 x 50001 working rows: no store helps
        assert line.split(" refused: ")[0] in ("ram 1500", "auto 1500") and "a smaller clients_per_round" in line
    assert lines[3] == "ram 10 ran True"



def test_auto_picks_ram_then_disk_from_the_estimate_and_refuses_what_fits_neither(monkeypatch):
    import python_algos.clients.state_plan as sp

    est = StateEstimate(10**6, 124, 4, 1, 100, 50)  # 8 MB of row table + 5,001 rows of 496 B; 248 KB working
    monkeypatch.setattr(sp, "memory_available", lambda: 2**40)
    monkeypatch.setattr(sp, "_free_disk", lambda folder: 2**40)
    assert sp.StatePlan("auto", None, 100).choose_backend(est) == "ram"
    monkeypatch.setattr(sp, "memory_available", lambda: 8 * 2**20)  # the stored rows no longer fit in RAM
    assert sp.StatePlan("auto", None, 100).choose_backend(est) == "disk"
    with pytest.raises(ValueError, match="fits only on disk, and state='disk' with checkpoints .* needs state_folder"):
        sp.StatePlan("auto", None, 100, logged=True).choose_backend(est)  # its log would go with a temporary folder
    monkeypatch.setattr(sp, "_free_disk", lambda folder: 12 * 2**20)  # the rows' 10.5 MB fit, with the log's 7.6 not
    assert sp.StatePlan("disk", "f", 100).choose_backend(est) == "disk"
    with pytest.raises(sp.DoesNotFit, match="give state_folder on a larger disk"):
        sp.StatePlan("disk", "f", 100, logged=True).choose_backend(est)
    monkeypatch.setattr(sp, "_free_disk", lambda folder: 2**40)
    with pytest.raises(sp.DoesNotFit, match="run with state='disk'"):
        sp.StatePlan("ram", None, 100).choose_backend(est)
    monkeypatch.setattr(sp, "_free_disk", lambda folder: 2**20)
    for mode in ("auto", "disk"):
        with pytest.raises(sp.DoesNotFit, match="give state_folder on a larger disk"):
            sp.StatePlan(mode, None, 100).choose_backend(est)


def test_the_mean_of_a_stores_start_view_equals_the_dense_mean():
    """torch sums a stride-0 view's 10^5 float32 rows in another order than a dense stack's (at the
    time of writing: off by an ulp); clients.mean sums a dense copy, as the dense run does."""
    from python_algos.clients import SequentialClients

    cs = SequentialClients(nn.Linear(6, 1), nn.functional.mse_loss, [(torch.randn(2, 6), torch.randn(2, 1))])
    row = torch.linspace(0.1, 3.7, 7)
    view, dense = row.expand(10**5, 7), row.expand(10**5, 7).contiguous()
    assert not torch.equal(view.mean(0), dense.mean(0))  # the case this test is about: torch's sums differ
    assert torch.equal(cs.mean(view), cs.mean(dense))
    assert torch.equal(cs.mean(view, divisor=3), cs.mean(dense, divisor=3))


@pytest.mark.slow
def test_fedadmm_on_a_float32_population_of_2e4_equals_the_dense_run():
    X, y = torch.randn(20_000, 2, 6), torch.randn(20_000, 2, 1)
    out = {}
    for state in ("dense", "ram"):
        torch.manual_seed(0)
        model = nn.Linear(6, 1)
        with torch.no_grad():
            model.weight.mul_(3.3)
        out[state] = simulate(make("fedadmm", lr=0.05, local_steps=2), model, nn.functional.mse_loss,
                              [(X[i], y[i]) for i in range(20_000)], 2, clients_per_round=10, state=state,
                              metrics_every=0)
    assert torch.equal(out["ram"].state.xtilde, out["dense"].state.xtilde)
    assert torch.equal(out["ram"].params, out["dense"].params)
