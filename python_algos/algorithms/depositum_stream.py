"""DEPOSITUM's round streamed through the executor in chunks of clients (docs/population.md).

With ``simulate(..., state="ram"|"disk")`` DEPOSITUM's four ``[N, d]`` stacks are stores
(:class:`~python_algos.clients.state_store.ClientStateStore`) and :func:`streamed_round` runs
``DEPOSITUM.round`` C clients at a time (the chunks of :func:`~python_algos.clients.state_plan.stream_chunks`,
as :mod:`.streamed` asks them):

1. per chunk: the fused step (10)/(11)/(12a) on its rows; x̃ written over x, m over m;
2. per chunk (a gossip iteration): x_i = Σ_j w_ij x̃_j from the rows that hold x̃ still, then the fresh
   gradients (``clients.gradients_`` on the chunk's ids: each client's own generator, as the full call
   draws), ỹ written over y, g over g; on a local iteration steps 1 and 2 are one pass, with no mixing;
3. per chunk (a gossip iteration): y_i = Σ_j w_ij ỹ_j.

The mix is the in-process ``clients.gossip_``'s product ``torch.mm(W, X)`` with W sparse COO: CPU torch
computes each output row from zero by one axpy per stored entry of that row, in column order. A chunk's
rows are the rows of W's chunk × (the columns they read), the columns split into pieces of at most
:data:`PIECE` chunks' rows and added piece after piece (``addmm`` with beta = 1 continues the same
axpys), so every row gets the dense product's products in its order: the same bits, however the
columns are cut. A dense W (``torch.mm`` is a BLAS gemm: its order is the library's) is refused by
``DEPOSITUM.stream_refusal``.

The mix reads the pre-mix rows: those of later chunks are in the store still; a row of an earlier chunk
was overwritten, so before a chunk writes its rows it copies those a later chunk reads (the boundary
rows: 2 on a ring, about 2√N on a torus, every row of the complete graph) into a store beside the
state's (RAM, or a file beside a disk store's), in a slot freed again once its last reader is mixed:
the store has as many rows as are kept at once. Working memory: a few chunks' rows (the chunk's
stacks, its mix and :data:`PIECE` chunks' gathered columns), whatever N and the topology.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

import fedkernels as fk

from ..clients.row_sum import RowSum, sum_rows
from ..clients.state_plan import StreamCost, stream_chunks, stream_rows
from ..clients.state_store import ClientStateStore
from . import streamed

__all__ = ["streamed_round", "stream_cost", "row_mean", "row_sq_dev_mean", "PIECE"]

PIECE = 2  # columns a mix gathers at a time, in chunks' rows: a ring's chunk of C rows reads C + 2
_STACKS = 4  # DEPOSITUMState's client fields: x, y, m, g
STREAM_STACKS = _STACKS + PIECE + 1  # rows a chunk's clients hold: the stacks, the mix's columns and its output
_METRIC_STACKS = 2  # stacks a metric pass holds a chunk of (the rows, their deviations)
_SIDES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # a state's x store -> its kept rows' store


class _Chunk(NamedTuple):
    ids: torch.Tensor  # the chunk's clients a..b-1
    pieces: tuple  # ((slots, cols, W[a:b, columns] sparse COO), ...): columns below a from the kept rows' slots
    keep: torch.Tensor  # its clients whose pre-mix row a later chunk reads
    keep_slots: torch.Tensor  # where they are kept


class _Plan(NamedTuple):
    chunks: tuple  # _Chunk, in order
    width: int  # the most columns a piece gathers
    slots: int  # the most rows kept at once
    degree: float  # W's off-diagonal non-zeros over N: the d-vectors a gossip sends (and receives) per client


def streamed_round(alg, state, clients, reg):
    """One DEPOSITUM iteration over every client, chunk after chunk (module docstring)."""
    X, Y, M, G_old, t = state
    chunks = stream_chunks(clients, STREAM_STACKS, X.dim, torch.empty((), dtype=X.dtype).element_size())
    comm = alg.communicates(t)
    plan = _plan(alg, clients, chunks) if comm else None
    with torch.no_grad():
        for a, b in chunks:
            ids = torch.arange(a, b)
            x, m, y = (s.gather_(ids, clients.workspace("_rows:" + f, b - a))
                       for s, f in ((X, "x"), (M, "m"), (Y, "y")))
            fk.fused.depositum_step_(x, m, y, alg.alpha, alg.beta, reg, alg.step, momentum=alg.momentum,
                                     normalized=alg.normalized, fast=True)
            M.scatter_(ids, m)
            X.scatter_(ids, x)  # x̃ (the mix below reads it), or x on a local iteration
            if not comm:
                _track(alg, clients, ids, x, Y, G_old)
        if comm:
            side = _side(X, plan.slots)
            _count(clients, plan.degree)  # x̃ to and from each neighbour
            for chunk in plan.chunks:
                x = _mix(X, side, chunk, clients, plan.width)
                X.scatter_(chunk.ids, x)
                _track(alg, clients, chunk.ids, x, Y, G_old)  # ỹ written over y
            _count(clients, plan.degree)  # ỹ
            for chunk in plan.chunks:
                Y.scatter_(chunk.ids, _mix(Y, side, chunk, clients, plan.width))
    return state._replace(t=t + 1)


def stream_cost(alg, clients, dim: int, itemsize: int) -> StreamCost:
    """A gossip iteration of :func:`streamed_round` on ``clients``, in the chunks the round runs
    (:func:`~python_algos.clients.state_plan.stream_chunks`), for the up-front estimate. Rows moved: the
    step reads x, m, y and writes m, x (5 n); each of the two mixes reads its chunks' columns (Σ over
    chunks of the columns its rows read: the earlier chunks' from the kept rows), reads each row a later
    chunk reads and writes it beside (2 a kept row) and writes x or y (n); the tracking reads y, g and
    writes g, y (4 n): a ring's ~13 n (a local iteration: 9 n). Kept: the slots :func:`_plan` gives the
    pre-mix rows (:func:`_keep_slots`, the same computation)."""
    n = clients.num_clients
    chunks = stream_chunks(clients, STREAM_STACKS, dim, itemsize)
    r, c = alg.mixing_matrix(n).coalesce().indices()
    q, keep, _, slots = _keep_slots(r, c, n, chunks)
    columns = torch.unique(q[r] * n + c).numel()  # (chunk, column) pairs
    return StreamCost(max(b - a for a, b in chunks), STREAM_STACKS, 11 * n + 2 * (columns + 2 * keep.numel()), slots)


def _keep_slots(r, c, n: int, chunks) -> tuple:
    """The pre-mix rows a later chunk reads, from W's entries (rows ``r``, columns ``c``) and the round's
    chunks: ``(q, keep, slot_of, slots)``, each client's chunk, the kept rows (ascending), each kept row's
    slot (``slot_of[j]``; -1: not kept) and the slots used. A row of chunk q read last by chunk q' > q is
    held from q to q': its slot is freed once chunk q' is mixed, and taken again (the last freed first)
    by the rows chunk q' keeps (it reads the kept rows before it keeps its own)."""
    m = len(chunks)
    q = torch.repeat_interleave(torch.arange(m), torch.tensor([b - a for a, b in chunks]))
    last = torch.full((n,), -1, dtype=torch.long).scatter_reduce_(0, c, r, "amax")  # the last row reading j
    keep = torch.nonzero(q[last.clamp(min=0)] > q).flatten()
    end = q[last[keep]]
    starts = keep.split(torch.bincount(q[keep], minlength=m).tolist())
    ends = keep[torch.argsort(end, stable=True)].split(torch.bincount(end, minlength=m).tolist())
    slot_of, free, used = torch.full((n,), -1, dtype=torch.long), [], 0
    for i in range(m):
        free += slot_of[ends[i]].tolist()  # read by no later chunk
        for j in starts[i].tolist():
            if free:
                slot_of[j] = free.pop()
            else:
                slot_of[j], used = used, used + 1
    return q, keep, slot_of, max(used, 1)


def _track(alg, clients, ids, x, Y, G_old) -> None:
    """The chunk's g^{t+1} at its x (written to G_old) and ỹ = y + γ (g^{t+1} − g^t) (to Y), as the dense round."""
    k = ids.numel()
    G, dG = clients.workspace("g", k), clients.workspace("dg", k)
    clients.gradients_(x, G, ids)
    y, g_old = Y.gather_(ids, clients.workspace("_rows:y", k)), G_old.gather_(ids, clients.workspace("_rows:g", k))
    y.add_(torch.sub(G, g_old, out=dG), alpha=alg.gamma)
    G_old.scatter_(ids, G)
    Y.scatter_(ids, y)


def _mix(src: ClientStateStore, side: ClientStateStore, chunk: _Chunk, clients, width: int) -> torch.Tensor:
    """W[a:b] @ (the pre-mix rows), ``width`` columns at most at a time: columns below a from their
    slots in ``side`` (their rows were overwritten), the others from ``src``; then the chunk's rows a
    later chunk reads are kept in ``side``."""
    out = clients.workspace("_mix", chunk.ids.numel())
    out.zero_()
    ext = clients.workspace("_mix_cols", width)
    for slots, cols, Wp in chunk.pieces:
        e, below = ext[: slots.numel() + cols.numel()], slots.numel()
        if below:
            side.gather_(slots, e[:below])
        if cols.numel():
            src.gather_(cols, e[below:])
        torch.addmm(out, Wp, e, out=out)  # beta = 1: each row's axpys continue, in column order
    if chunk.keep.numel():
        side.scatter_(chunk.keep_slots, src.gather_(chunk.keep, ext[: chunk.keep.numel()]))
    return out


def _plan(alg, clients, chunks) -> _Plan:
    """Each chunk's pieces of W, the rows it keeps and their slots (:func:`_keep_slots`); built once per
    (N, dtype, chunks) and cached on ``alg``."""
    n = clients.num_clients
    key = (n, clients.dtype, tuple(chunks))
    plan = alg._stream_plans.get(key)
    if plan is None:
        W = alg.mixing_matrix(n, clients.dtype, clients.device).coalesce()
        r, c = W.indices()
        v = W.values()
        q, keep, slot_of, slots = _keep_slots(r, c, n, chunks)
        kept = keep.split(torch.bincount(q[keep], minlength=len(chunks)).tolist())
        width = PIECE * max(b - a for a, b in chunks)
        out = tuple(_chunk(r, c, v, a, b, width, slot_of, k) for (a, b), k in zip(chunks, kept))
        deg = int(torch.count_nonzero(v[r != c])) / n  # as clients.gossip_ counts
        plan = alg._stream_plans[key] = _Plan(out, width, slots, int(deg) if deg == int(deg) else deg)
    return plan


def _chunk(r, c, v, a: int, b: int, width: int, slot_of, keep) -> _Chunk:
    """Chunk a..b-1: W's entries of its rows in pieces of at most ``width`` columns (ascending), and the rows
    ``keep`` it keeps with their slots."""
    s, e = (int(i) for i in torch.searchsorted(r, torch.tensor([a, b])))
    rc, cc, vc = r[s:e] - a, c[s:e], v[s:e]  # W's entries of rows a..b-1, (row, column) ascending
    cols = torch.unique(cc)
    pieces = []
    for p in range(0, cols.numel(), width):
        pc = cols[p : p + width]
        sel = (cc >= pc[0]) & (cc <= pc[-1])
        at = torch.stack([rc[sel], torch.searchsorted(pc, cc[sel])])  # column order kept: the entries stay sorted
        Wp = torch.sparse_coo_tensor(at, vc[sel], (b - a, pc.numel()), is_coalesced=True, check_invariants=True)
        pieces.append((slot_of[pc[pc < a]], pc[pc >= a], Wp))
    return _Chunk(torch.arange(a, b), tuple(pieces), keep, slot_of[keep])


def _side(like: ClientStateStore, slots: int) -> ClientStateStore:
    """The store of ``slots`` kept pre-mix rows, made once per state (its x store) and kept while it lives."""
    side = _SIDES.get(like)
    if side is None or side.rows < slots:
        side = _SIDES[like] = streamed.store_beside(like, slots)
    return side


def _count(clients, degree) -> None:
    """One gossip's d-vectors, as ``clients.gossip_`` counts them: the mean degree up and down."""
    clients.comm.up += degree
    clients.comm.down += degree



# -- metrics: client averages in one fixed order, dense or streamed -------------------------------------------


def row_mean(V) -> torch.Tensor:
    """``(1/N) Σ_i V[i]`` in :mod:`~python_algos.clients.row_sum`'s order, so a store's rows (summed chunk
    after chunk) give a dense stack's bits; a tensor subclass (the distributed executor's rows of a rank)
    by its ``sum_rows()``, every rank's rows in that order."""
    if isinstance(V, ClientStateStore):
        acc = RowSum(V.dim, V.dtype)
        for _, rows in V.chunks(_metric_rows(V)):
            acc.add_(rows)
        return acc.sum().div_(V.rows)
    if type(V) is not torch.Tensor:
        return V.sum_rows().div_(V.num_clients)
    return sum_rows(V).div_(V.shape[0])


def row_sq_dev_mean(V, center: torch.Tensor) -> float:
    """``(1/N) Σ_i ||V[i] − center||²``, the row sums over i in :func:`row_mean`'s order."""
    if isinstance(V, ClientStateStore):
        acc = RowSum(1, V.dtype)
        for _, rows in V.chunks(_metric_rows(V)):
            acc.add_((rows - center).pow(2).sum(dim=1, keepdim=True))
        return float(acc.sum()) / V.rows
    if type(V) is not torch.Tensor:
        return float((V - center).pow(2).sum(dim=1, keepdim=True).sum_rows()) / V.num_clients
    return float(sum_rows((V - center).pow(2).sum(dim=1, keepdim=True))) / V.shape[0]


def _metric_rows(V: ClientStateStore) -> int:
    return stream_rows(_METRIC_STACKS, V.dim, torch.empty((), dtype=V.dtype).element_size())
