"""A client stack's rows cut and joined by client range, for checkpoints re-cut across world sizes.

A checkpoint written by P processes holds each rank's rows of every client stack; a resume on
another number of processes (one included) takes rows ``[a, b)`` of each writer's piece and joins
them in client order (python_algos/experiments/launch.py). A stack is a dense ``[n, d]`` tensor, a
RAM store's :class:`~.state_store.StoredRows` (its row table and written rows: a cut keeps only the
written rows of its range), or a disk store's :class:`~.state_log.LoggedRows` (a record of the
writer's own row log in ``<state_folder>/rank<q>``): its cut is a :class:`~.state_log.LogCut`, which
names the writer's log and the range and reads no row; the reader's store reads the written rows of
its range from each writer's log, a chunk at a time, and starts its own log at its next checkpoint
(:meth:`~.state_store.ClientStateStore.from_log`). So neither a cut nor a join builds an ``[n, d]`` stack.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Optional

import torch

from .state_log import LogCut, LoggedRows
from .state_store import StoredRows

__all__ = ["cut_rows", "join_rows", "remove_other_writers"]

_MIXED = ("a checkpoint's pieces of one client stack mix dense rows and a store's rows: its shards come from "
          "different runs; restore the run's own checkpoint.pt.shards folder from a copy")
_OTHER_RUNS = ("a checkpoint's pieces of one client stack start from different initial rows: its shards come from "
               "different runs; restore the run's own checkpoint.pt.shards folder from a copy")

_RANK = re.compile(r"^rank\d+$")
_STORE_FILES = re.compile(r"^(rows\.bin|index\.bin|log-\d+\.bin)$")


def cut_rows(v, a: int, b: int, writer: str = ""):
    """Rows ``a .. b - 1`` of ``v`` (a tensor: a copy; StoredRows: the range's table and written rows;
    LoggedRows: a :class:`LogCut` of the log in ``<state_folder>/<writer>/``, ``writer`` ``rank<q>`` or ``""``)."""
    if isinstance(v, LoggedRows):
        return LogCut(((writer, v, a, b),), "", None, b - a, v.initial)
    if not isinstance(v, StoredRows):
        return v[a:b].clone()
    table = v.table[a:b]
    written = table > 0
    slots = table[written]
    new = torch.zeros_like(table)
    new[written] = torch.arange(1, slots.numel() + 1, dtype=table.dtype)
    return StoredRows(new, torch.cat([v.block[:1], v.block.index_select(0, slots)]))


def join_rows(pieces: list, reader: str = "", kept: Optional[str] = None):
    """The pieces' rows one after another: a tensor from tensors, StoredRows from StoredRows, a
    :class:`LogCut` read into ``<state_folder>/<reader>/`` from LogCuts (``kept``: the log the checkpoint
    names in that folder, or None); every piece of one stack starts from the same initial row; a mix of
    forms is refused."""
    if len(pieces) == 1 and not isinstance(pieces[0], LogCut):  # one writer's whole piece, read where it was
        return pieces[0]
    if any(isinstance(p, (LogCut, LoggedRows)) for p in pieces):
        return _join_cuts(pieces, reader, kept)
    if all(isinstance(p, torch.Tensor) for p in pieces):
        return torch.cat(pieces)
    if not all(isinstance(p, StoredRows) for p in pieces):
        raise ValueError(_MIXED)
    first = pieces[0].block[:1]
    if not all(torch.equal(p.block[:1], first) for p in pieces):
        raise ValueError(_OTHER_RUNS)
    tables, blocks, used = [], [first], 0
    for p in pieces:
        t = p.table.clone()
        t[t > 0] += used
        tables.append(t)
        blocks.append(p.block[1:])
        used += p.block.shape[0] - 1
    return StoredRows(torch.cat(tables), torch.cat(blocks))


def _join_cuts(pieces: list, reader: str, kept: Optional[str]):
    if not all(isinstance(p, LogCut) for p in pieces):
        raise ValueError(_MIXED)
    first = pieces[0].initial
    if not all(p.initial.dtype == first.dtype and torch.equal(p.initial, first) for p in pieces):
        raise ValueError(_OTHER_RUNS)
    parts = tuple(x for p in pieces for x in p.pieces)
    if len(parts) == 1 and parts[0][0] == reader and parts[0][2:] == (0, parts[0][1].rows):
        return parts[0][1]  # one writer's whole log, read in its own folder
    return LogCut(parts, reader, kept, sum(p.rows for p in pieces), first)


def remove_other_writers(state_folder: Optional[str], world: Optional[int]) -> None:
    """Remove the state folders under ``state_folder`` of processes other than those of a run on ``world``
    ranks (``<state_folder>/rank<r>``; None: one process, ``<state_folder>/<field>``): the row logs of the
    processes that wrote a checkpoint this run resumed on another number of processes, once the run's
    own checkpoint has replaced it. Only folders that hold nothing but a store's files go."""
    if state_folder is None or not os.path.isdir(state_folder):
        return
    for name in os.listdir(state_folder):
        path = os.path.join(state_folder, name)
        mine = (_RANK.match(name) and int(name[4:]) < world) if world is not None else not _RANK.match(name)
        if mine or not os.path.isdir(path):
            continue
        stores = [os.path.join(path, f) for f in os.listdir(path)] if _RANK.match(name) else [path]
        if all(os.path.isdir(p) and all(_STORE_FILES.match(f) for f in os.listdir(p)) for p in stores):
            shutil.rmtree(path, ignore_errors=True)
