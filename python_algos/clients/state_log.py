"""The checkpoint log of a disk-backed client-state store: the rows written since the last checkpoint.

A ``backend="disk"`` :class:`~.state_store.ClientStateStore` writes its rows in place (``rows.bin``),
so after a kill its files hold rounds past the last checkpoint. Its checkpoint is therefore a log in
the store's folder, ``log-<g>.bin``: fixed-size records (the row's id as int64, then its d numbers),
to which each checkpoint appends the rows written since the previous one (flushed and fsynced before
the checkpoint file that counts them is written), and a :class:`LoggedRows` record in the checkpoint
file: the log's name and how many of its records the checkpoint counts, never a row. The rows at
the checkpoint are the last record of each id among those; records past the count (rounds after the
checkpoint, or an append a kill cut short) are never read. When the log would hold more than twice
the rows written, the checkpoint starts the next log (``g + 1``) with the live rows alone. A log is
appended to only by the process that started it: a resumed store starts the next one, so the log of
the checkpoint it resumed from is never written again. At each checkpoint every log but the one the
last checkpoint named is removed (a checkpoint older than that is refused on resume, naming the log).
The record also holds a digest of the last record it counts (:func:`tail`), so another run's log is refused.
A resume on another number of processes (:class:`LogCut`) reads the written rows of its clients from the
log of every process that wrote the checkpoint (:func:`cut_chunks`), a chunk at a time, and writes none of them.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Iterator, NamedTuple, Optional

import numpy as np
import torch

from ..runfolder import faults

__all__ = ["LoggedRows", "LogCut", "record_dtype", "append", "start_log", "last_records", "cut_chunks", "as_cut",
           "tail", "remove_other_logs", "log_bytes"]

_NAME = re.compile(r"^log-(\d+)\.bin$")


class LoggedRows(NamedTuple):
    """A disk store's checkpoint form: its rows are the first ``records`` records of the log ``log``
    in the store's folder (the last record of each id); ``rows`` N; ``initial`` the [d] value of a row
    never written; ``check`` 0.0, or NaN when a row logged for this checkpoint holds NaN/Inf (so the
    checkpoint's NaN/Inf check sees the rows, which the file itself does not hold); ``tail`` the
    :func:`tail` of the log's last record it counts, so that a resume refuses another run's log ("": none)."""

    log: str
    records: int
    rows: int
    initial: torch.Tensor
    check: float
    tail: str = ""


class LogCut(NamedTuple):
    """A disk store's rows at a checkpoint that another number of processes wrote (a resume re-cut for
    this process's clients, python_algos/experiments/launch.py): ``pieces`` in order, each ``(writer, rec,
    a, b)``, rows ``a .. b - 1`` of the :class:`LoggedRows` ``rec``, whose log is in the writer's folder
    ``<state_folder>/<writer>/<field>`` (``writer`` ``rank<q>``, or ``""`` for one process); ``reader``
    this process's folder likewise; ``log`` the log that the checkpoint names in the reader's own folder
    (a writer's of the same rank: kept until this store's next checkpoint is written), or None;
    ``rows``, ``initial`` as :class:`LoggedRows`'s. No row is read until :func:`cut_chunks`."""

    pieces: tuple
    reader: str
    log: Optional[str]
    rows: int
    initial: torch.Tensor


def record_dtype(dim: int, dtype: torch.dtype) -> np.dtype:
    """One record: the row's id (int64) and its ``dim`` numbers, packed (8 + d × itemsize bytes)."""
    return np.dtype([("id", "<i8"), ("row", {torch.float32: "<f4", torch.float64: "<f8"}[dtype], (dim,))])


def _records(ids: torch.Tensor, rows: torch.Tensor) -> np.ndarray:
    out = np.empty(ids.numel(), record_dtype(rows.shape[1], rows.dtype))
    out["id"], out["row"] = ids.numpy(), rows.numpy()
    return out


def append(path: str, records: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
    """Append the records of ``rows`` (row ``ids[j]`` is ``rows[j]``) to the log at ``path`` after its
    first ``records`` (a torn tail that an append cut short by an error left is cut off first), on
    disk before this returns. A kill half-way leaves a torn record past every count a checkpoint holds."""
    data = _records(ids, rows).tobytes()
    with open(path, "r+b") as f:
        f.truncate(records * record_dtype(rows.shape[1], rows.dtype).itemsize)
        f.seek(0, os.SEEK_END)
        f.write(data[: len(data) // 2])
        f.flush()
        faults.point("state log append")
        f.write(data[len(data) // 2:])
        f.flush()
        os.fsync(f.fileno())


def start_log(folder: str, chunks) -> tuple[str, int]:
    """A new log (the next generation in ``folder``) holding the records of ``chunks`` ((ids, rows)
    pairs); returns (its name, its records). Its name is new: no checkpoint counts on it yet."""
    gens = [int(m.group(1)) for n in os.listdir(folder) if (m := _NAME.match(n))]
    name = f"log-{max(gens, default=0) + 1}.bin"
    n = 0
    with open(os.path.join(folder, name), "xb") as f:
        for ids, rows in chunks:
            f.write(_records(ids, rows).tobytes())
            n += ids.numel()
            faults.point("state log append")
        f.flush()
        os.fsync(f.fileno())
    _sync_folder(folder)
    return name, n


def last_records(folder: str, rec: LoggedRows, dim: int, dtype: torch.dtype) -> tuple:
    """The rows ``rec`` counts: (ids ascending, their positions, the log memory-mapped): row ``ids[j]``
    is ``log["row"][positions[j]]``, its last record among the first ``rec.records``. Refuses a log that is missing or
    shorter than the count (one the run did not write: removed, or cut short outside the run)."""
    path = os.path.join(folder, rec.log)
    size = record_dtype(dim, dtype).itemsize
    have = os.path.getsize(path) if os.path.isfile(path) else None
    if have is None or have < rec.records * size:
        what = "is missing" if have is None else f"holds {have} bytes, fewer than the {rec.records} records it counts"
        raise ValueError(f"the checkpoint's row log {path} {what}: a checkpoint older than the state folder's last "
                         f"compaction, or a state_folder other than the run's; resume from the run's last checkpoint "
                         f"with its state_folder")
    if rec.tail and tail(path, rec.records, dim, dtype) != rec.tail:
        raise ValueError(f"the checkpoint's row log {path} is not the log it counts (its record {rec.records} is "
                         f"another): a log of another run; resume with the run's own state_folder")
    if rec.records == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), None
    log = np.memmap(path, record_dtype(dim, dtype), "r", shape=(rec.records,))
    ids = np.asarray(log["id"])
    if ids.min() < 0 or ids.max() >= rec.rows:
        raise ValueError(f"the checkpoint's row log {path} names rows outside [0, {rec.rows}): it is not this "
                         f"store's log; resume with the run's own state_folder")
    uniq, first_from_end = np.unique(ids[::-1], return_index=True)
    return uniq, rec.records - 1 - first_from_end, log


def cut_chunks(folder: str, cut: LogCut, step: int) -> Iterator[tuple]:
    """(ids, rows) of the written rows ``cut`` holds, at most ``step`` rows at a time, ids numbered from
    the cut's first row; ``folder``: the reading store's own, ``<state_folder>/<reader>/<field>``. Every
    writer's log is checked before this returns, so a refusal comes before the reader writes anything."""
    field, base = os.path.basename(folder), os.path.dirname(folder)
    if cut.reader and os.path.basename(base) != cut.reader:
        raise ValueError(f"the re-cut rows of {cut.reader} were given the folder {folder}, not one under "
                         f"<state_folder>/{cut.reader}/: give the run's own state_folder")
    root, sources, first = os.path.dirname(base) if cut.reader else base, [], 0
    dim, dtype = cut.initial.numel(), cut.initial.dtype
    for writer, rec, a, b in cut.pieces:
        try:
            ids, at, log = last_records(os.path.join(root, writer, field), rec, dim, dtype)
        except ValueError as e:
            if writer == cut.reader:
                raise
            raise ValueError(f"{e}. A resume on another number of processes reads every writer's row log "
                             f"(<state_folder>/rank<q>/): when a writer's state folder is on another machine's "
                             f"disk, copy it under this run's state_folder ({root}) first, or resume on the number "
                             f"of processes that wrote the checkpoint (--workers P / torchrun --nproc-per-node "
                             f"P)") from None
        keep = (ids >= a) & (ids < b)
        sources.append((ids[keep] - a + first, at[keep], log))
        first += b - a
    return _cut_rows(sources, step)


def as_cut(rec) -> LogCut:
    """``rec``, a :class:`LoggedRows` (the rows of the log in the reading store's own folder) or a :class:`LogCut`,
    as a cut."""
    return rec if isinstance(rec, LogCut) else LogCut((("", rec, 0, rec.rows),), "", rec.log, rec.rows, rec.initial)


def _cut_rows(sources: list, step: int) -> Iterator[tuple]:
    for ids, at, log in sources:
        for a in range(0, ids.size, step):
            faults.point("state re-cut")
            yield torch.from_numpy(ids[a:a + step]), torch.from_numpy(np.array(log["row"][at[a:a + step]]))


def tail(path: str, records: int, dim: int, dtype: torch.dtype) -> str:
    """A digest of record ``records`` (the last a checkpoint counts) of the log at ``path``; "" for none. Another
    run's log holds other rows there (one read of a record: a checkpoint's cost stays what it wrote)."""
    if records == 0:
        return ""
    size = record_dtype(dim, dtype).itemsize
    with open(path, "rb") as f:
        f.seek((records - 1) * size)
        return hashlib.blake2b(f.read(size), digest_size=8).hexdigest()


def remove_other_logs(folder: str, keep) -> None:
    """Remove every log in ``folder`` but ``keep`` (None: all)."""
    for n in os.listdir(folder):
        if _NAME.match(n) and n != keep:
            os.remove(os.path.join(folder, n))


def log_bytes(folder: str) -> int:
    """Bytes of the logs in ``folder``."""
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if _NAME.match(n))


def _sync_folder(folder: str) -> None:
    """The new log's name on disk (its directory entry), as its contents are."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
