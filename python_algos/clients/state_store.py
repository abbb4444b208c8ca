"""A client-state store: the rows of a per-client ``[N, d]`` stack, kept only where written.

A run touches at most rounds × cohort clients, so most rows of a per-client stack (SCAFFOLD's
control variates, FedDR's three stacks) keep their initial value for the whole run. A
:class:`ClientStateStore` holds N rows of d numbers as

* a **row table** ``[N]`` (int64): 0 for a row never written, else its slot in the block;
* a **block** ``[1 + written, d]`` whose slot 0 is the initial row (zeros or a given row), so a
  never-written row reads as the initial value without being stored.

``gather_(ids, out)`` is one ``index_select`` on the block (through the table), ``scatter_(ids,
rows)`` one ``index_copy_`` (new rows get slots first), each a few slice copies where the slots run
consecutively. The block lives in RAM (``backend="ram"``:
an anonymous memory file, memory-mapped) or in a file in a folder (``backend="disk"``: ``rows.bin``,
append-only, :mod:`.row_file`: mapped, and rows of whole pages written with O_DIRECT by a thread while
the round goes on; the table memory-mapped as ``index.bin``, a sparse file of zeros until rows are
written). Either grows by lengthening its file and mapping it again, never by copying the rows
written (a RAM block grown by a copy took 3 page faults per new row's page: 175 ms against 60 ms a
round for 100 MLP rows). Rows read back are the bits written: a run on a store equals the dense run
bit for bit.

:meth:`ClientStateStore.checkpoint` is what a checkpoint file holds of a store: a RAM store's table
and rows (:class:`StoredRows`), a disk store's record of its row log (:mod:`.state_log`: the rows
written since the last checkpoint are appended to a log in its folder; the file holds no row).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import weakref
from typing import Callable, Iterable, Iterator, NamedTuple, Optional, Union

import numpy as np
import torch

from . import state_log
from .row_file import RowFile, slot_runs
from .state_log import LogCut, LoggedRows

__all__ = ["ClientStateStore", "StoredRows", "LoggedRows", "BACKENDS", "DTYPES", "read_ahead"]

BACKENDS = ("ram", "disk")
DTYPES = (torch.float32, torch.float64)
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}
_CHUNK_BYTES = 1 << 26  # rows a checkpoint or a resume holds at a time: 64 MiB of them


class StoredRows(NamedTuple):
    """A RAM store's checkpoint form: ``table`` [N] (0: never written, else the row's slot) and
    ``block`` [1 + written, d] (slot 0: the initial row)."""

    table: torch.Tensor
    block: torch.Tensor


class ClientStateStore:
    """N rows of d numbers (``dtype`` float32 or float64), each its ``initial`` row (default zeros)
    until written. ``folder`` (disk only): where ``rows.bin`` / ``index.bin`` and the checkpoint logs
    go, an empty or new folder (default: a temporary one, removed with the store); ``keep_logs``: the
    folder's logs are those of the checkpoint this store resumes from (:meth:`from_log`), not refused."""

    def __init__(self, rows: int, dim: int, dtype: torch.dtype = torch.float64,
                 initial: Optional[torch.Tensor] = None, *, backend: str = "ram", folder: Optional[str] = None,
                 keep_logs: bool = False):
        for name, v in (("rows", rows), ("dim", dim)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if initial is not None and (not isinstance(initial, torch.Tensor) or initial.shape != (dim,)):
            raise ValueError(f"initial must be None or a [{dim}] tensor, got "
                             f"{tuple(initial.shape) if isinstance(initial, torch.Tensor) else type(initial).__name__}")
        if folder is not None and backend != "disk":
            raise ValueError(f"folder is for backend='disk' only, got backend={backend!r}")
        self.rows, self.dim, self.dtype, self.backend = int(rows), int(dim), dtype, backend
        self._written = 0  # rows written so far; slots 1..written of the block
        self._dirty = None  # disk: [N] bool, the rows scattered since the last checkpoint (N bytes)
        self._log, self._logged, self._appendable = None, 0, False  # the last checkpoint's log (state_log)
        self._memory = None  # RAM: the anonymous file the block maps, once it grew past its first rows
        self._file: Optional[RowFile] = None  # disk: rows.bin
        first = torch.zeros(1, self.dim, dtype=dtype)
        if initial is not None:
            first[0] = initial.detach().to(device="cpu", dtype=dtype)
        self.folder = None if backend == "ram" else _new_folder(self, folder, keep_logs)
        if backend == "ram":
            self._table = torch.zeros(self.rows, dtype=torch.int64)
            self._block = first
        else:
            self._table = torch.from_numpy(np.memmap(self._path("index.bin"), np.int64, "w+", shape=(self.rows,)))
            self._file = RowFile(self._path("rows.bin"), self.dim, dtype, 1)
            self._block = self._file.block
            self._file.write([(0, 0, 1)], first)

    # -- reading and writing rows ---------------------------------------------------------
    def gather_(self, ids: Optional[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """``out[j] <- row ids[j]`` (all rows in order when ``ids`` is None): one index_select,
        or a slice copy per run of consecutive slots when they are few (:func:`.row_file.slot_runs`)."""
        ids = self._checked_ids(ids, "ids")
        self._check_stack(out, ids.numel(), "out")
        slots = self._table.index_select(0, ids)
        self._settle(slots)
        runs = slot_runs(slots)
        if runs is None:
            return torch.index_select(self._block, 0, slots, out=out)
        for at, slot, n in runs:  # a streamed chunk, a cohort written together: one slice copy each
            out[at:at + n].copy_(self._block[slot:slot + n])
        return out

    def scatter_(self, ids: Optional[torch.Tensor], rows: torch.Tensor) -> None:
        """Row ``ids[j] <- rows[j]`` (``ids`` distinct; all rows when None): one index_copy_, or a
        slice copy per run of consecutive slots (:func:`.row_file.slot_runs`). Rows
        written for the first time get the next slots of the block (which grows first, so a
        failure leaves the store as it was)."""
        ids = self._checked_ids(ids, "ids")
        self._check_stack(rows, ids.numel(), "rows")
        if ids.numel() > 1 and torch.unique(ids).numel() != ids.numel():
            raise ValueError("ids must be distinct: two rows written to one client would leave it either one")
        slots = self._table.index_select(0, ids)
        new = ids[slots == 0]
        if new.numel():
            self._reserve(1 + self._written + new.numel())
            self._table.index_copy_(0, new, torch.arange(self._written + 1, self._written + 1 + new.numel()))
            self._written += int(new.numel())
            slots = self._table.index_select(0, ids)
        direct = self._file is not None and self._file.direct
        runs = slot_runs(slots, every=direct)
        if direct:  # staged and written by the file's thread
            self._file.write(runs, rows.to(device="cpu"))
        elif runs is None:
            self._block.index_copy_(0, slots, rows.to(device="cpu"))
        for at, slot, n in () if direct else runs or ():  # new rows get consecutive slots: one contiguous copy
            self._block[slot:slot + n].copy_(rows[at:at + n])
        if self.backend == "disk":
            if self._dirty is None:
                self._dirty = torch.zeros(self.rows, dtype=torch.bool)
            self._dirty[ids] = True

    def prefetch(self, ids: Optional[torch.Tensor]) -> None:
        """Start reading the written rows of ``ids`` from the disk while the caller computes (a disk
        store; :meth:`RowFile.prefetch`), so that a later :meth:`gather_` of them waits less. Never
        changes what a read returns: a row written after its prefetch reads back as written."""
        if self._file is None or ids is None:
            return
        slots = self._table.index_select(0, self._checked_ids(ids, "ids"))
        self._file.prefetch(slots[slots != 0])

    def chunks(self, size: int) -> Iterator[tuple[int, torch.Tensor]]:
        """``(first, rows[first : first + n])`` over all rows in order, ``n <= size`` (a fresh
        tensor each, so at most ``size`` rows are held at a time)."""
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"size must be an int >= 1, got {size!r}")
        for first in range(0, self.rows, int(size)):
            slots = self._table[first:first + int(size)]
            self._settle(slots)  # a caller may have written rows since the last chunk
            yield first, self._block.index_select(0, slots)

    def to_dense(self) -> torch.Tensor:
        """All rows as one ``[N, d]`` tensor (N × d memory: for tests and small populations)."""
        self._settle()
        return self._block.index_select(0, self._table)

    def __getitem__(self, i) -> torch.Tensor:
        """Row ``i`` (an int; a copy), as ``stack[i]`` reads one client's row (FedCanonII's report)."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -self.rows <= i < self.rows:
            raise IndexError(f"a store's row must be an int in [-{self.rows}, {self.rows}), got {i!r}")
        self._settle()
        return self._block[int(self._table[int(i)])].clone()

    @property
    def initial(self) -> torch.Tensor:
        """The value of a never-written row (a copy)."""
        self._settle()
        return self._block[0].clone()

    @property
    def rows_written(self) -> int:
        return self._written

    @property
    def nbytes(self) -> int:
        """Bytes the store holds: the row table plus the block as allocated (RAM, or the row file)."""
        held = self._file.nbytes if self._file is not None else self._block.numel() * self._block.element_size()
        return self._table.numel() * 8 + held

    def __repr__(self) -> str:
        return (f"ClientStateStore({self.rows} x {self.dim}, {str(self.dtype).replace('torch.', '')}, "
                f"{self.backend}, {self._written} rows written, {self.nbytes} bytes)")

    # -- checkpoints ------------------------------------------------------------------------------
    def checkpoint(self) -> Union[StoredRows, LoggedRows]:
        """What a checkpoint file holds of the store: RAM, :meth:`stored_rows`; disk, the rows written
        since the last checkpoint appended to its log, on disk before this returns, and the log's
        record (:mod:`.state_log`), which :meth:`from_log` reads back. Every log but the one the last
        checkpoint named is removed first: a caller takes the next checkpoint once it wrote the last."""
        if self.backend == "ram":
            return self.stored_rows()
        state_log.remove_other_logs(self.folder, self._log)
        self._settle()
        ids = torch.nonzero(self._dirty).flatten() if self._dirty is not None else torch.empty(0, dtype=torch.int64)
        bad: list = []  # the rows logged that hold NaN/Inf
        if not self._appendable or self._logged + ids.numel() > 2 * self._written:  # the next log: live rows
            live = torch.nonzero(self._table).flatten()
            self._log, self._logged = state_log.start_log(self.folder, self._row_chunks(live, bad))
            self._appendable = True
        elif ids.numel():
            for part, rows in self._row_chunks(ids, bad):
                state_log.append(self._path(self._log), self._logged, part, rows)
                self._logged += part.numel()
        self._dirty = None
        return LoggedRows(self._log, self._logged, self.rows, self._block[0].clone(), math.nan if bad else 0.0,
                          state_log.tail(self._path(self._log), self._logged, self.dim, self.dtype))

    @classmethod
    def from_log(cls, rec: Union[LoggedRows, LogCut], folder: str, backend: str = "disk") -> "ClientStateStore":
        """The store at the checkpoint ``rec`` (:meth:`checkpoint`), from the log in ``folder`` (a
        :class:`LogCut`: from the logs of the processes that wrote it, :func:`state_log.cut_chunks`): a
        ``backend="disk"`` store in ``folder`` (its rows.bin / index.bin, which rounds after the
        checkpoint may have written, are replaced), or a RAM one. Its next checkpoint starts a new log."""
        dim, dtype = rec.initial.numel(), rec.initial.dtype
        step = max(1, _CHUNK_BYTES // (dim * rec.initial.element_size()))
        chunks = state_log.cut_chunks(os.fspath(folder), state_log.as_cut(rec), step)  # every log checked first
        if backend == "disk":
            for name in ("rows.bin", "index.bin"):  # the rows of rounds past the checkpoint: the log is the truth
                if os.path.exists(os.path.join(folder, name)):
                    os.remove(os.path.join(folder, name))
        store = cls(rec.rows, dim, dtype, rec.initial, backend=backend,
                    folder=folder if backend == "disk" else None, keep_logs=True)
        for ids, rows in chunks:
            store.scatter_(ids, rows)
        if backend == "disk":
            store._log, store._dirty = rec.log, None  # kept until the new log's checkpoint is written
        return store

    def stored_rows(self) -> StoredRows:
        """A RAM store as a NamedTuple of tensors (the table and the written rows, references), which a
        checkpoint file holds as it holds any state (runfolder/checkpoint.py); :meth:`from_stored_rows`
        rebuilds it."""
        if self.backend != "ram":
            raise ValueError("a state='disk' store's checkpoint is its row log (checkpoint()), not its rows")
        return StoredRows(self._table, self._block[: 1 + self._written])

    @classmethod
    def from_stored_rows(cls, sr: StoredRows) -> "ClientStateStore":
        store = cls(sr.table.numel(), sr.block.shape[1], sr.block.dtype, sr.block[0])
        store._table, store._block, store._written = sr.table.clone(), sr.block.clone(), sr.block.shape[0] - 1
        return store

    def __reduce__(self):
        return (type(self).from_stored_rows, (self.stored_rows(),))


    # -- internals ----------------------------------------------------------------------------
    def _checked_ids(self, ids, name: str) -> torch.Tensor:
        if ids is None:
            return torch.arange(self.rows)
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype != torch.int64:
            raise ValueError(f"{name} must be a 1-D int64 tensor of row numbers, got "
                             f"{ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__}")
        ids = ids.to(device="cpu")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.rows):
            raise ValueError(f"{name} must be row numbers in [0, {self.rows}), got {int(ids.min())}..{int(ids.max())}")
        return ids

    def _check_stack(self, t, k: int, name: str) -> None:
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (k, self.dim) or t.dtype != self.dtype:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a [{k}, {self.dim}] {self.dtype} tensor, got {got}")

    def _reserve(self, need: int) -> None:
        """Room for ``need`` slots: the block's file grows to 1.5 × and is mapped again (the rows
        written stay in place). A RAM block's first growth moves its rows so far (slot 0, or a resumed
        block) into a new anonymous file."""
        cap = self._block.shape[0]
        if need <= cap:
            return
        cap = max(need, cap + cap // 2, 16)
        if self.backend == "disk":
            self._block = self._file.grow(cap)
            return
        first = self._memory is None
        memory = _memory_file() if first else self._memory
        memory.truncate(cap * self.dim * self._block_itemsize())
        block = torch.from_numpy(np.memmap(memory, _NUMPY[self.dtype], "r+", shape=(cap, self.dim)))
        if first:
            block[: 1 + self._written] = self._block[: 1 + self._written]
        self._block, self._memory = block, memory

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def _settle(self, slots: Optional[torch.Tensor] = None) -> None:
        """A disk store's rows written (:meth:`RowFile.settle`: all, or those of ``slots``) before they are read."""
        if self._file is not None:
            self._file.settle(slots)

    def _block_itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def _row_chunks(self, ids: torch.Tensor, bad: list):
        """(ids, their rows) in pieces of at most :data:`_CHUNK_BYTES`; a piece holding NaN/Inf is
        added to ``bad``."""
        step = max(1, _CHUNK_BYTES // (self.dim * self._block_itemsize()))
        for a in range(0, ids.numel(), step):
            rows = self._block.index_select(0, self._table.index_select(0, ids[a:a + step]))
            if not bool(torch.isfinite(rows).all()):
                bad.append(ids[a:a + step])
            yield ids[a:a + step], rows


def read_ahead(stacks: Iterable, upcoming: Callable[[], Optional[torch.Tensor]]) -> None:
    """Start reading the rows of the next round's cohort (``upcoming()``, called only when one of ``stacks``
    is a disk store) from every disk store among ``stacks`` (:meth:`ClientStateStore.prefetch`)."""
    stores = [s for s in stacks if isinstance(s, ClientStateStore) and s.backend == "disk"]
    ids = upcoming() if stores else None
    for s in stores:
        s.prefetch(ids)


def _memory_file():
    """An anonymous file in memory (Linux's memfd; elsewhere an unlinked temporary file), read-write."""
    if hasattr(os, "memfd_create"):
        return os.fdopen(os.memfd_create("fedkernels-rows", getattr(os, "MFD_CLOEXEC", 0)), "r+b")
    return tempfile.TemporaryFile()


def _new_folder(store: ClientStateStore, folder: Optional[str], keep_logs: bool) -> str:
    """The disk store's folder: ``folder`` (created, or empty), else a temporary one removed with the store."""
    if folder is None:
        path = tempfile.mkdtemp(prefix="fedkernels-state-")
        weakref.finalize(store, shutil.rmtree, path, True)
        return path
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    taken = [n for n in os.listdir(folder) if n in ("rows.bin", "index.bin")
             or (not keep_logs and n.startswith("log-") and n.endswith(".bin"))]
    if taken:
        raise FileExistsError(f"state_folder {folder!r} already holds a state store ({', '.join(taken)}): give an "
                              f"empty folder, or remove it first (a store never writes over another's rows)")
    return folder
