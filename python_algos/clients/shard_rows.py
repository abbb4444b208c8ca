"""A client stack's rows cut and joined by client range, for checkpoints re-cut across world sizes.

A checkpoint written by P processes holds each rank's rows of every client stack; a resume on
another number of processes (one included) takes rows ``[a, b)`` of each writer's piece and joins
them in client order (python_algos/experiments/launch.py). A stack is a dense ``[n, d]`` tensor or a
RAM store's :class:`~.state_store.StoredRows` (its row table and written rows): a cut of a store
keeps only the written rows of its range, so neither a cut nor a join builds an ``[n, d]`` stack. A
disk store's checkpoint (:class:`~.state_log.LoggedRows`, a record of the rank's own row log) is
taken whole by the rank that wrote it, and refused for another number of processes.
"""

from __future__ import annotations

import torch

from .state_log import LoggedRows
from .state_store import StoredRows

__all__ = ["cut_rows", "join_rows"]

_LOGGED = ("a state='disk' checkpoint's client rows are in each process's own row log (state_folder/rank<r>), "
           "which cannot be re-cut for another number of processes: resume it on the number of processes that "
           "wrote it (--workers P / torchrun --nproc-per-node P)")


def cut_rows(v, a: int, b: int):
    """Rows ``a .. b - 1`` of ``v`` (a tensor: a copy; StoredRows: the range's table and written rows)."""
    if isinstance(v, LoggedRows):
        raise ValueError(_LOGGED)
    if not isinstance(v, StoredRows):
        return v[a:b].clone()
    table = v.table[a:b]
    written = table > 0
    slots = table[written]
    new = torch.zeros_like(table)
    new[written] = torch.arange(1, slots.numel() + 1, dtype=table.dtype)
    return StoredRows(new, torch.cat([v.block[:1], v.block.index_select(0, slots)]))


def join_rows(pieces: list):
    """The pieces' rows one after another: a tensor from tensors, StoredRows from StoredRows (every
    piece of one stack starts from the same initial row; a mix of forms is refused)."""
    if len(pieces) == 1:  # one writer's whole piece (a part of one is a cut, refused for a row log)
        return pieces[0]
    if any(isinstance(p, LoggedRows) for p in pieces):
        raise ValueError(_LOGGED)
    if all(isinstance(p, torch.Tensor) for p in pieces):
        return torch.cat(pieces)
    if not all(isinstance(p, StoredRows) for p in pieces):
        raise ValueError("a checkpoint's pieces of one client stack mix dense rows and a store's rows: its shards "
                         "come from different runs; restore the run's own checkpoint.pt.shards folder from a copy")
    first = pieces[0].block[:1]
    if not all(torch.equal(p.block[:1], first) for p in pieces):
        raise ValueError("a checkpoint's pieces of one client stack start from different initial rows: its shards "
                         "come from different runs; restore the run's own checkpoint.pt.shards folder from a copy")
    tables, blocks, used = [], [first], 0
    for p in pieces:
        t = p.table.clone()
        t[t > 0] += used
        tables.append(t)
        blocks.append(p.block[1:])
        used += p.block.shape[0] - 1
    return StoredRows(torch.cat(tables), torch.cat(blocks))
