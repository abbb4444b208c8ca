"""A full-participation round streamed through the executor in chunks of clients (docs/population.md).

Under full participation a server–client round reads and writes every client's rows. With
``simulate(..., state="ram"|"disk")`` the client stacks are stores
(:class:`~python_algos.clients.state_store.ClientStateStore`), and :func:`streamed_round` runs the
round ``ServerClientAlgorithm.round`` composes, C clients at a time (C from
:func:`~python_algos.clients.state_plan.stream_chunks`, so a chunk's ``[C, d]`` working stacks stay
within a fixed budget whatever N is):

1. per chunk: gather its rows, ``client_update`` on its ids, add its uploads to one running sum per
   message (:class:`~python_algos.clients.row_sum.RowSum`: the order every executor's ``mean`` sums
   in, so the mean over all N is the dense run's bit for bit), keep them, scatter its rows back;
2. ``server_update`` once on the means, the download broadcast once;
3. per chunk: gather its rows again and its kept uploads, ``client_receive``, scatter.

``client_receive`` needs each client's own upload (FedCanon's ``c_i += Δ̄ − Δ_i``). The uploads are
kept, not recomputed (recomputing would redo the local work with the generators already advanced):
an upload that is one of the chunk's client rows (FedNMap's ``d``) is read back from that row; any
other is written to a store of its own beside the state's (RAM or a temporary file, as the state's),
N rows per message. The replicated client state (``client_copies``, one ``[d]`` copy in a
simulation) is restored before each chunk's call, as each deployed client holds its own copy.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from typing import Optional

import torch

from ..clients.row_sum import RowSum
from ..clients.state_plan import stream_chunks
from ..clients.state_store import ClientStateStore

__all__ = ["streamed_round", "is_streamed", "store_beside"]

_UPLOADS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # a state's store -> its upload stores


def is_streamed(state, ids) -> bool:
    """Whether this round streams: full participation (``ids`` None) on client stacks held in stores."""
    fields = type(state).client_fields
    return ids is None and bool(fields) and isinstance(getattr(state, fields[0]), ClientStateStore)


def streamed_round(alg, state, clients, reg, rng):
    """One round of the server–client ``alg`` over every client, chunk after chunk (module docstring)."""
    fields, msgs = type(state).client_fields, alg.messages()
    stores = {f: getattr(state, f) for f in fields}
    first = stores[fields[0]]
    chunks = stream_chunks(clients, len(fields) + len(msgs.up), first.dim,
                           torch.empty((), dtype=first.dtype).element_size())
    sums = {m: RowSum(first.dim, first.dtype) for m in msgs.up}
    kept = _UPLOADS.setdefault(first, {})
    with torch.no_grad():
        down = alg.download(state, rng)
        copies = _copies(state)
        for n, (a, b) in enumerate(chunks):
            ids, local = _gathered(state, stores, a, b, clients, copies if n else None)
            up = alg.client_update(local, down, clients, reg, ids)
            for m in msgs.up:
                sums[m].add_(up[m])
                _keep(kept, m, up[m], local, fields, first, ids)
            _scattered(local, stores, ids)
        clients.comm.up += len(msgs.up)  # one upload per message and client, as clients.mean counts
        means = {m: sums[m].sum().div_(clients.num_clients) for m in msgs.up}
        state, sent = alg.server_update(state, means, down, reg)
        for f, v in stores.items():
            if getattr(state, f) is not v:
                raise RuntimeError(f"{type(alg).__name__}.server_update replaced the client field {f!r}: the server "
                                   f"updates its own fields only")
        sent = {name: clients.broadcast(sent[name]) for name in msgs.down}
        copies = _copies(state)
        for n, (a, b) in enumerate(chunks):
            ids, local = _gathered(state, stores, a, b, clients, copies if n else None)
            up = {m: getattr(local, kept[m]) if isinstance(kept[m], str) else
                  kept[m].gather_(ids, clients.workspace("_up:" + m, b - a)) for m in msgs.up}
            alg.client_receive(local, sent, up, clients, reg, ids)
            _scattered(local, stores, ids)
    return state


def _copies(state) -> dict:
    """The replicated client state (``client_copies``) as every client holds it now (copies)."""
    return {f: getattr(state, f).clone() for f in getattr(type(state), "client_copies", ())
            if getattr(state, f) is not None}


def _gathered(state, stores, a: int, b: int, clients, copies):
    """Clients a..b-1: their ids and the state with their rows gathered (and the replicated client
    state restored to ``copies``, when given)."""
    for f, v in (copies or {}).items():
        getattr(state, f).copy_(v)
    ids = torch.arange(a, b)
    return ids, state._replace(**{f: s.gather_(ids, clients.workspace("_rows:" + f, b - a))
                                  for f, s in stores.items()})


def _scattered(local, stores, ids) -> None:
    for f, s in stores.items():
        s.scatter_(ids, getattr(local, f))


def _keep(kept: dict, m: str, up: torch.Tensor, local, fields, first: ClientStateStore, ids) -> None:
    """Keep the chunk's upload ``m`` for ``client_receive``: the name of the client field it is
    (read back from that field's rows), else its rows in a store of its own."""
    for f in fields:
        row = getattr(local, f)
        if up.data_ptr() == row.data_ptr() and up.shape == row.shape and up.stride() == row.stride():
            kept[m] = f
            return
        if up.untyped_storage().data_ptr() == row.untyped_storage().data_ptr():
            raise RuntimeError(f"the upload {m!r} is a part of the client field {f!r}'s rows: a streamed round "
                               f"keeps an upload that is a whole client field, or a stack of its own")
    if not isinstance(kept.get(m), ClientStateStore):
        kept[m] = store_beside(first)
    kept[m].scatter_(ids, up)


def store_beside(like: ClientStateStore, rows: Optional[int] = None) -> ClientStateStore:
    """A store of ``rows`` (default N) rows like ``like``'s, in RAM or in a temporary folder beside its files
    (removed with the new store): one message's uploads here, DEPOSITUM's kept pre-mix rows
    (:mod:`.depositum_stream`)."""
    rows = like.rows if rows is None else rows
    if like.backend == "ram":
        return ClientStateStore(rows, like.dim, like.dtype)
    folder = tempfile.mkdtemp(prefix="uploads-", dir=os.path.dirname(os.path.abspath(like.folder)))
    store = ClientStateStore(rows, like.dim, like.dtype, backend="disk", folder=folder)
    weakref.finalize(store, shutil.rmtree, folder, True)
    return store
