"""The batched executor on a :class:`~.population.Population`: vectorized passes over the clients one
call trains, built when the call comes.

:class:`~.batched.BatchedClients` concatenates every client's samples once; a population's clients
exist only while in use. :class:`CohortBatched` builds a ``BatchedClients`` over the clients of a
gradient call (a round's cohort: built once per round, reused by its local steps; under full
participation, consecutive blocks of ``population.cache`` clients (as given), streamed) and hands it the
clients' own generators (:class:`~.population.LazyGenerators`), so each client draws the batches it
would draw in the batched executor over the whole list. A client's gradient there is a function of
its own batch and the call, never of which clients share its pass (``BatchedClients._gradients``), so
the training is the list run's bit for bit (tests/test_population.py, float64; in float32 the
torch.func path can differ in a last bit with a row's position in its pass, as the list run's own
passes do: tests/test_engine_batched_metric.py's xfail). The metric pass streams blocks of ``population.cache``
clients, each continuing the same sums of the clients' losses and gradients in client order (the list
run's order, :mod:`.row_sum`): with one block (N <= the cache) it is the list run's pass bit for bit;
with more, a block's padding takes that block's longest client (the list run's, every client's).

On a rank of the distributed executor (``shard``: its first client, the run's N and a MAX all-reduce)
a cohort and a block pad as one process's do: a cohort to the longest client of the whole cohort (one
all-reduce per call), full participation and the metric pass in one process's blocks (of the run's
clients, cut to the rank's), each to the longest client of the whole block (agreed once per run:
every client of the rank is built once more, to read its size, before the first such call).
"""

from __future__ import annotations

import time
from typing import Callable, ClassVar, Optional

import torch
from torch import nn

import fedkernels as fk

from .base import ClientSet
from .data import client_data
from .population import PROBE_CLIENTS, LazyGenerators, Population
from .probe import check_population
from .row_sum import RowSum

__all__ = ["CohortBatched"]


class CohortBatched(ClientSet):
    """``BatchedClients``' work on a population, one call's clients at a time (module docstring).
    Arguments as :class:`~.batched.BatchedClients`' (``options``: its ``memory_budget``,
    ``chunk_clients``, ``chunk``)."""

    executor: ClassVar[str] = "batched"
    shard: Optional[tuple] = None  # (first client, the run's N, MAX all-reduce of an int64 tensor): on a rank

    def __init__(self, model: nn.Module, loss_fn: Callable, data: Population, batch_size: Optional[int] = None,
                 seed: int = 0, flat: Optional[fk.FlatParams] = None, first_client: int = 0, *,
                 vectorized: type, **options):
        super().__init__()
        self.model, self.loss_fn, self.population, self.options = model, loss_fn, data, options
        self.vectorized = vectorized  # BatchedClients, which hands a population to this class (no import cycle)
        self.batch_size = batch_size
        self.flat = flat if flat is not None else fk.FlatParams(model)
        self.dim, self.dtype, self.device = self.flat.numel, self.flat.params.dtype, self.flat.params.device
        self.num_clients = self.rows = len(data)
        self.generators = LazyGenerators(seed, self.num_clients, first_client)
        self._key: Optional[tuple] = None
        self._inner = None
        self._pads: Optional[list] = None  # per block of _blocks(), its padding: a rank's, agreed (module docstring)
        self.block = data.cache  # clients per block: the cache as given (reserve() raises it for a cohort, the
        # probe below for its clients: blocks that followed it would depend on the calls before, and a rank's)
        # the loss's kind, decided once for every client from the first few (a cohort's passes are not refused
        # mid-run for a client past them), and what a client's data must hold when it is built
        first = [client_data(data[i], self.dtype, self.device) for i in range(min(PROBE_CLIENTS, self.num_clients))]
        self.check = check_population(model, loss_fn, first, batch_size, first_client)
        self.probe = self._over(list(range(len(first))))  # the vectorized pass's own start-up checks
        self.coupled = self.probe.coupled
        self.first_layer, self.first_layer_source = self.probe.first_layer, self.probe.first_layer_source

    def _over(self, ids: list):
        """The ``BatchedClients`` over clients ``ids`` (the last one is kept: a round's local steps reuse it)."""
        # a range by its ends (a full-participation block), other ids listed: tagged, so that ids [0, 4] are
        # not taken for the range of 4 clients from 0
        key = ("range", ids[0], len(ids)) if ids == list(range(ids[0], ids[0] + len(ids))) else ("ids", *ids)
        if key != self._key:
            self.population.reserve(len(ids))
            clients = [self.population[i] for i in ids]
            for i, c in zip(ids, clients):
                self.check.guard(i, c)
            self._inner = self.vectorized(self.model, self.loss_fn, clients, self.batch_size, flat=self.flat,
                                          loss_kind=self.check.kind, **self.options)
            self._inner.generators = [self.generators[i] for i in ids]  # each client's own, as in the list run
            self._key = key
        return self._inner

    def set_participation(self, clients_per_round, seed=0):
        super().set_participation(clients_per_round, seed)
        self.population.reserve(self.clients_per_round or 0)

    def _blocks(self) -> list:
        """Consecutive blocks of ``block`` clients; on a rank, one process's blocks of the run's
        clients that hold some of the rank's, cut to those (module docstring)."""
        step = self.block
        lo, total = (0, self.num_clients) if self.shard is None else self.shard[:2]
        first = lo // step * step
        return [list(range(max(a, lo) - lo, min(a + step, total, lo + self.num_clients) - lo))
                for a in range(first, lo + self.num_clients, step)]

    def _padded(self, blocks: list) -> list:
        """``(block, pad_to)`` for each block: None (its own longest client), or on a rank the longest
        client of one process's whole block, agreed over the ranks once per run (module docstring)."""
        if self.shard is None:
            return [(b, None) for b in blocks]
        self.agree_pads()
        return list(zip(blocks, self._pads))

    def agree_pads(self) -> None:
        """On a rank: agree with the other ranks (a collective: every rank calls it, in the same order) on the
        padding of one process's blocks, unless already agreed. Before a chained metric pass (distributed)."""
        if self.shard is None or self._pads is not None:
            return
        lo, total, agree = self.shard
        step = self.block
        most = torch.zeros(-(-total // step), dtype=torch.int64)
        for b in self._blocks():
            most[(lo + b[0]) // step] = max(client_data(self.population[i], self.dtype, self.device).X.shape[0]
                                            for i in b)
        self._pads = agree(most)[(lo // step):].tolist()

    def stream_chunks(self, size):
        """Its blocks of ``population.cache`` clients, whatever ``size``: a chunk is then a full-participation
        call's block, run by the same ``BatchedClients`` (padding to a block's longest batch: the same bits)."""
        return [(b[0], b[-1] + 1) for b in self._blocks()]

    def gradients_(self, X, G, ids=None):
        t0 = time.perf_counter()
        if ids is not None and self.shard is not None:  # the whole cohort's longest client, agreed by every rank
            inner = self._over(ids.tolist()) if ids.numel() else None
            pad = self.shard[2](torch.tensor([max(inner.sizes) if inner is not None else 0]))
            parts = [(ids.tolist(), slice(None), int(pad))] if inner is not None else []
        elif ids is not None:
            parts = [(ids.tolist(), slice(None), None)]
        else:
            parts = [(b, slice(b[0], b[-1] + 1), pad) for b, pad in self._padded(self._blocks())]
        for members, rows, pad in parts:
            inner = self._over(members)
            inner.pad_to = pad
            fb, n = inner.fwd_bwd_seconds, inner.grad_evals
            inner.gradients_(X[rows], G[rows])
            self.fwd_bwd_seconds += inner.fwd_bwd_seconds - fb
            self.grad_evals += inner.grad_evals - n
        self.grad_seconds += time.perf_counter() - t0
        return G

    def clients_per_pass(self) -> float:
        """What ``executor="auto"`` weighs: the probed clients' (a cohort's passes hold as many as the budget)."""
        return self.probe.clients_per_pass()

    def _broadcast(self, v):
        return v

    def full_objective_(self, x, grad_out, *, start: Optional[tuple] = None, total: Optional[int] = None):
        """f(x) and its gradient over every client: each block continues the sums ``start`` (module docstring;
        ``start`` / ``total`` as :meth:`BatchedClients.full_objective_`'s)."""
        sums = start if start is not None else (RowSum(1, torch.float64, self.device),
                                                RowSum(self.dim, self.dtype, self.device))
        N = self.num_clients if total is None else int(total)
        f = 0.0
        for members, pad in self._padded(self._blocks()):  # each writes the sums so far into grad_out: the last
            inner = self._over(members)  # one's are the result
            inner.pad_to = pad
            f = inner.full_objective_(x, grad_out, start=sums, total=N)
        return f
