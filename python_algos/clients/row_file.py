"""The row file of a disk-backed client-state store (``rows.bin``): read through a memory mapping,
written through it or, for rows of whole pages, with ``O_DIRECT`` by a writer thread.

A round writes its cohort's new rows into parts of the file never written before: 44 MB a stack for
100 rows of the MNIST MLP (d = 109,386). Copied through a mapping, each new page is a page fault and
a new page of the page cache; on a virtual machine whose free memory went back to its host (virtio
free page reporting, as on the machine of docs/performance.md), a fault in the host too: ~100 ms a
stack, against ~3 ms for the same copy into pages touched before, which is what a dense in-RAM stack
does. Rows that take whole pages (a row padded to a multiple of 4 KiB, where that costs at most
1/16 of it) are instead copied into a staging buffer whose pages every round reuses (~5 ms), and a
thread writes them to the disk with ``O_DIRECT`` (no page cache: ~20 ms a stack, mostly waiting, ~2
ms of CPU) while the round goes on. A read of rows that write holds, and every write, waits for it
first (:meth:`RowFile.settle`; a cohort of clients new to the store reads none of them), so the rows
read back through the mapping are the bits written (the kernel drops the cached pages of a range
written directly, and a padded row shares no page with another). Smaller rows, or a file system that
refuses ``O_DIRECT``, are copied through the mapping.

A row read back comes from the disk then: a client that a cohort meets again, ~7 ms for an MLP row on
the machine of docs/performance.md, 40 ms of FedDR's round (three stacks, ~6 such rows). So while a
round computes, :meth:`RowFile.prefetch` asks the kernel to read the next cohort's written rows into the
page cache (``posix_fadvise(WILLNEED)``, which returns at once; the store knows the cohort ahead,
``ClientSet.upcoming``), and the next round's read finds them there (~0.1 ms a row). The kernel keeps
the page cache coherent with both kinds of write (a write through the mapping is to those pages; a
direct write drops the range's cached pages), so a row written after its prefetch reads back as written.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Optional

import numpy as np
import torch

__all__ = ["RowFile", "slot_runs"]

PAGE = 4096  # O_DIRECT's alignment of offsets, lengths and buffers (a multiple of every block size up to it)
PAD_SHARE = 16  # rows are padded to whole pages only where that adds at most 1/16 of a row (0: any row)
STAGE_BYTES = 1 << 26  # the staging buffer: at most 64 MiB of rows at a time
_ADVISE = hasattr(os, "posix_fadvise")  # Linux, not macOS: a prefetch is a no-op without it
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


class _Pending:
    """The write in flight (a thread), the slots it writes (``[first, end)`` pairs as two tensors) and the
    first error a write met (kept: every later access raises it)."""

    def __init__(self):
        self.thread: Optional[threading.Thread] = None
        self.first, self.end = torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
        self.error: Optional[BaseException] = None


class RowFile:
    """``path``, ``cap`` rows of ``dim`` numbers (``dtype``), row i at ``i * stride`` bytes; ``block``: the
    ``[cap, dim]`` mapped view to read from (after :meth:`settle`). ``direct``: rows are written with
    O_DIRECT (padded to whole pages), else copied into ``block``."""

    def __init__(self, path: str, dim: int, dtype: torch.dtype, cap: int):
        self.path, self.dim, self.dtype = path, dim, dtype
        row = dim * torch.empty((), dtype=dtype).element_size()
        padded = -(-row // PAGE) * PAGE
        self._pending, self._fd, self._stage = _Pending(), None, None
        with open(path, "ab"):
            pass
        self._read_fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)) if _ADVISE else None
        if (padded - row) * PAD_SHARE <= row:
            self._fd = _direct_fd(path)
        self.direct = self._fd is not None
        self.stride = padded if self.direct else row
        self.block = self.grow(cap)
        # at exit too: the write ends before the fds close
        weakref.finalize(self, _close, self._pending, self._fd, self._read_fd)

    def grow(self, cap: int) -> torch.Tensor:
        """The file ``cap`` rows long (the rows written kept: the file only grows), mapped again."""
        with open(self.path, "ab") as f:
            f.truncate(max(os.path.getsize(self.path), cap * self.stride))
        width = self.stride // torch.empty((), dtype=self.dtype).element_size()
        mapped = np.memmap(self.path, _NUMPY[self.dtype], "r+", shape=(cap, width))
        self.block = torch.from_numpy(mapped)[:, : self.dim]
        return self.block

    @property
    def nbytes(self) -> int:
        return self.block.shape[0] * self.stride

    def write(self, runs: list, rows: torch.Tensor) -> None:
        """``rows[at : at + n]`` to slots ``slot .. slot + n - 1`` for each ``(at, slot, n)`` of ``runs``: copied
        into ``block``, or (``direct``) staged and written by a thread, 64 MiB at a time."""
        self.settle()
        if not self.direct:
            for at, slot, n in runs:
                self.block[slot:slot + n].copy_(rows[at:at + n])
            return
        per, piece, staged = max(1, STAGE_BYTES // self.stride), [], 0
        for at, slot, n in runs:
            while n:
                m = min(n, per - staged)
                piece.append((at, slot, m))
                at, slot, n, staged = at + m, slot + m, n - m, staged + m
                if staged == per:
                    self._submit(piece, rows, staged)
                    piece, staged = [], 0
        if piece:
            self._submit(piece, rows, staged)

    def settle(self, slots: Optional[torch.Tensor] = None) -> None:
        """Wait for the write in flight (only if it writes one of ``slots``, when given); raise if a write
        failed (then the rows it held are lost: every later call raises too)."""
        thread, p = self._pending.thread, self._pending
        if thread is not None and (slots is None or not thread.is_alive() or bool(
                ((slots[:, None] >= p.first) & (slots[:, None] < p.end)).any())):
            thread.join()
            self._pending.thread = None
        if self._pending.error is not None:
            raise OSError(f"writing client-state rows to {self.path} failed: {self._pending.error!r}; the "
                          f"store's rows are incomplete (resume from the last checkpoint)") from self._pending.error

    def prefetch(self, slots: torch.Tensor) -> None:
        """Start reading the rows of ``slots`` (sorted or not, repeats allowed) from the disk into the page
        cache and return at once (``posix_fadvise(WILLNEED)``, one range per run of consecutive slots; a
        no-op where the system has no posix_fadvise): a later read through ``block`` finds them there
        instead of waiting on the disk. A write in flight to one of them is waited for first."""
        if self._read_fd is None or not slots.numel():
            return
        self.settle(slots)
        for _, first, n in slot_runs(torch.unique(slots), every=True):
            os.posix_fadvise(self._read_fd, first * self.stride, n * self.stride, os.POSIX_FADV_WILLNEED)

    def _submit(self, piece: list, rows: torch.Tensor, count: int) -> None:
        self.settle()  # the staging buffer is free again
        if self._stage is None or self._stage.shape[0] < count:
            width = self.stride // rows.element_size()
            memory = mmap.mmap(-1, count * self.stride)  # page-aligned, as O_DIRECT needs
            self._stage = torch.from_numpy(np.frombuffer(memory, _NUMPY[self.dtype]).reshape(count, width))
        jobs, k = [], 0
        for at, slot, n in piece:
            self._stage[k:k + n, : self.dim].copy_(rows[at:at + n])
            jobs.append((slot * self.stride, k * self.stride, n * self.stride))
            k += n
        buffer = memoryview(self._stage.numpy()).cast("B")
        self._pending.first = torch.tensor([slot for _, slot, _ in piece])
        self._pending.end = self._pending.first + torch.tensor([n for _, _, n in piece])
        self._pending.thread = threading.Thread(target=_write, args=(self._fd, buffer, jobs, self._pending),
                                                name="fedkernels-rows")
        self._pending.thread.start()


def slot_runs(slots: torch.Tensor, every: bool = False) -> Optional[list]:
    """``slots`` as runs of consecutive slots, ``(position, first slot, length)`` each, when there are
    few (at most 1 + n / 8) or ``every``, else None: a slice copy per run does what index_copy_ /
    index_select do, ~3x faster (11,000 rows of 992 bytes: 0.7 against 2.3 ms), and a cohort of new
    rows with a few written before is a few runs (its new rows take consecutive slots)."""
    n = slots.numel()
    if n == 0:
        return []
    starts = torch.nonzero(slots.diff() != 1).flatten().add_(1)
    if starts.numel() > n // 8 and not every:
        return None
    cuts = [0, *starts.tolist(), n]
    return [(a, int(slots[a]), b - a) for a, b in zip(cuts, cuts[1:])]


def _write(fd: int, buffer: memoryview, jobs: list, pending: _Pending) -> None:
    """The writer thread: each ``(offset in the file, offset in buffer, length)``, whole (a short write goes on)."""
    try:
        for offset, start, length in jobs:
            view = buffer[start:start + length]
            while len(view):
                done = os.pwrite(fd, view, offset)
                if done <= 0:
                    raise OSError(f"pwrite wrote {done} bytes")
                view, offset = view[done:], offset + done
    except BaseException as e:  # reported by the next settle(), in the thread that uses the store
        pending.error = e


def _direct_fd(path: str) -> Optional[int]:
    """``path`` opened for O_DIRECT writes, or None where the system or the file system refuses them (a
    page written at offset 0 from a page-aligned buffer: O_DIRECT's alignment checked, not assumed)."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if os.pwrite(fd, mmap.mmap(-1, PAGE), 0) == PAGE:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _close(pending: _Pending, fd: Optional[int], read_fd: Optional[int]) -> None:
    if pending.thread is not None:
        pending.thread.join()
    for f in (fd, read_fd):
        if f is not None:
            os.close(f)
