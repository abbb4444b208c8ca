"""The batched executor on a :class:`~.population.Population`: vectorized passes over the clients one
call trains, built when the call comes.

:class:`~.batched.BatchedClients` concatenates every client's samples once; a population's clients
exist only while in use. :class:`CohortBatched` builds a ``BatchedClients`` over the clients of a
gradient call (a round's cohort: built once per round, reused by its local steps; under full
participation and in the metric pass, consecutive blocks of about ``population.cache`` clients, streamed)
and hands it the clients' own generators (:class:`~.population.LazyGenerators`), so each client draws the
batches it would draw in the batched executor over the whole list. A cohort's call is laid out as the
list run lays out the cohort's, and padded to the cohort's longest batch, as the list run pads a cohort's
call (:meth:`.batched.BatchedClients.gradients_`): so no client past the cohort is read.

Under full participation and in the metric pass a block's ``BatchedClients`` is told where its clients sit
in the run (``first_client``, every client's size ``run_sizes`` and the run's longest client ``pad_to``,
read once per run: every client is built once more, before the first such call), so it pads and lays its
passes out as the list run's call over every client (windows of ``pass_window()`` clients, the metric pass's
blocks), and a window or a metric block a block's edge cuts runs with the other clients' rows filled with
copies, their results dropped. Blocks end where the list run's windows (a multiple of W clients) and metric
blocks (as many whole ones as the cache holds) end, so on one process none is cut, unless the cache holds
less than one: then each block runs the whole passes of the window it meets (up to W / cache times the work;
a cache of W clients avoids it). Every block's pass sizes come from one memory budget (the probe's). So the
training and the metrics are the list run's bit for bit, float32 on the torch.func path too
(tests/test_population.py); the metric pass's blocks continue the same sums of the clients' losses and
gradients in client order (:mod:`.row_sum`). Whether a batch may be padded follows the labels (a chosen
``ignore_index`` some client holds, a class-weighted callable): every block is told the run's (:mod:`.run_kind`,
read with the sizes), as the list run judges it on every client's. A cohort's ``BatchedClients`` still judges it
on the cohort's clients (so that only they are built), where the list run judges it on every client's: under
such a loss a cohort may pad batches the list run computes whole, the same loss up to rounding.

On a rank of the distributed executor (``shard``: its first client, the run's N and a MAX all-reduce) the
clients' sizes are agreed once (:meth:`CohortBatched.agree_pads`), so a rank's blocks are laid out as one
process's (only the windows and metric blocks its shard's edges cut run masked), and a cohort pads to the
longest client of the whole cohort (one all-reduce per call).
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
from .run_kind import candidates, run_separability

__all__ = ["CohortBatched"]


class CohortBatched(ClientSet):
    """``BatchedClients``' work on a population, one call's clients at a time (module docstring).
    Arguments as :class:`~.batched.BatchedClients`' (``options``: its ``memory_budget``,
    ``chunk_clients``, ``chunk``)."""

    executor: ClassVar[str] = "batched"
    shard: Optional[tuple] = None  # (first client, the run's N, MAX all-reduce of an int64 tensor): on a rank
    cohort: Optional[torch.Tensor] = None  # this round's participants (None: full participation; a rank's: set
    # by the distributed executor)
    run_sizes: Optional[list] = None  # every client's samples in the run, read once (agree_pads)
    longest: Optional[int] = None  # the run's longest client (agree_pads)
    separable = None  # whether batches may be padded, judged on the run's clients (agree_pads, .run_kind)

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
        self.block = data.cache  # clients per block: the cache as given, down to whole windows once the run's
        # sizes are read (agree_pads; reserve() raises the cache for a cohort)
        # the loss's kind, decided once for every client from the first few (a cohort's passes are not refused
        # mid-run for a client past them), and what a client's data must hold when it is built
        first = [client_data(data[i], self.dtype, self.device) for i in range(min(PROBE_CLIENTS, self.num_clients))]
        self.check = check_population(model, loss_fn, first, batch_size, first_client)
        self.probed = len(first)
        self.probe = self._over(list(range(len(first))))  # the vectorized pass's own start-up checks (rebuilt
        # once the run's separability is read, agree_pads)
        # one memory budget for every block (a GPU's default is half its free memory, which changes): the passes'
        # sizes, so their bits, are then the same in every block
        self.options = {**options, "memory_budget": self.probe.memory_budget}
        self.coupled = self.probe.coupled
        self.first_layer, self.first_layer_source = self.probe.first_layer, self.probe.first_layer_source

    def _over(self, ids: list, run: bool = False):
        """The ``BatchedClients`` over clients ``ids`` (the last one is kept: a round's local steps reuse it);
        ``run``: laid out as one process's call over the run's clients (module docstring), else as a cohort's."""
        # a range by its ends, other ids listed: tagged, so that ids [0, 4] are not taken for the range of 4
        # clients from 0, nor a cohort for a block of the run
        ids = list(ids)
        key = (run, "range", ids[0], len(ids)) if ids == list(range(ids[0], ids[0] + len(ids))) else (run, *ids)
        if key != self._key:
            self.population.reserve(len(ids))
            clients = [self.population[i] for i in ids]
            for i, c in zip(ids, clients):
                self.check.guard(i, c)
            self._inner = self.vectorized(self.model, self.loss_fn, clients, self.batch_size, flat=self.flat,
                                          loss_kind=self.check.kind, separable=self.separable if run else None,
                                          **self.options)
            self._inner.generators = [self.generators[i] for i in ids]  # each client's own, as in the list run
            if run:
                self._inner.first_client = self._first() + ids[0]
                self._inner.run_sizes, self._inner.pad_to = self.run_sizes, self.longest
            self._key = key
        return self._inner

    def _first(self) -> int:
        """The run id of this process's client 0."""
        return 0 if self.shard is None else self.shard[0]

    def set_participation(self, clients_per_round, seed=0):
        super().set_participation(clients_per_round, seed)
        self.population.reserve(self.clients_per_round or 0)

    def participants(self):
        ids = super().participants()
        self.cohort = ids  # a call with ids is then the cohort's (gradients_)
        return ids

    def agree_pads(self) -> None:
        """Read every client's size and labels once (``run_sizes``; every client is built once more), and from
        them the run's longest client, the blocks' size and the run's separability (:mod:`.run_kind`: the few
        clients it names are built again, on a rank another rank's too). On a rank a collective (every rank calls
        it, in the same order): the ranks agree on the sizes and on those clients. Before a chained metric pass
        (distributed)."""
        if self.run_sizes is not None:
            return
        lo, total = (0, self.num_clients) if self.shard is None else self.shard[:2]
        sizes: list = []

        def labels():  # each client built once, in turn
            for i in range(self.num_clients):
                c = client_data(self.population[i], self.dtype, self.device)
                sizes.append(c.X.shape[0])
                yield c.y

        both = torch.zeros(2, total, dtype=torch.int64)  # sizes and the clients that may decide the kind
        both[1, lo : lo + self.num_clients] = torch.tensor(candidates(labels(), self.loss_fn))
        both[0, lo : lo + self.num_clients] = torch.tensor(sizes)
        both = both if self.shard is None else self.shard[2](both)
        self.run_sizes, flags = both[0].tolist(), both[1].tolist()
        run = getattr(self.population, "population", self.population)  # a rank's shard: the whole population
        self.separable = run_separability(self.model, self.loss_fn, self.run_sizes, flags,
                                          lambda i: client_data(run[i], self.dtype, self.device))
        self._key = None  # pass sizes as the run's separability makes them
        self.probe = self.vectorized(self.model, self.loss_fn, [self.population[i] for i in range(self.probed)],
                                     self.batch_size, flat=self.flat, loss_kind=self.check.kind,
                                     separable=self.separable, **self.options)
        self.coupled = self.probe.coupled
        self.first_layer, self.first_layer_source = self.probe.first_layer, self.probe.first_layer_source
        self.longest = max(self.run_sizes)
        B = self.batch_size
        W = self.probe.pass_window(self.longest if B is None else min(B, self.longest))
        if W is not None and self.block >= W:  # whole windows (fewer, the windows cut: pad and mask)
            self.block = self.block // W * W

    def _blocks(self, ids=None) -> list:
        """``(clients, rows)``: this process's clients (all, or ``ids``) in runs of consecutive ids cut at the run's
        multiples of ``block`` (whole windows), each a range of clients and the slice of the call's rows it takes."""
        self.agree_pads()
        if ids is None:
            runs = [(0, self.num_clients, 0)]
        else:
            v = ids.tolist()
            cuts = [0, *(j for j in range(1, len(v)) if v[j] != v[j - 1] + 1), len(v)]
            runs = [(v[a], v[a] + b - a, a) for a, b in zip(cuts, cuts[1:])]
        lo, step, out = self._first(), self.block, []
        for a, b, row in runs:
            for s in range((lo + a) // step * step, lo + b, step):
                c = range(max(s - lo, a), min(s + step - lo, b))
                out.append((c, slice(row + c.start - a, row + c.stop - a)))
        return out

    def stream_chunks(self, size):
        """Its blocks, whatever ``size``: a chunk is then a full-participation call's block, run by the same
        ``BatchedClients`` (module docstring)."""
        return [(c.start, c.stop) for c, _ in self._blocks()]

    def gradients_(self, X, G, ids=None):
        t0 = time.perf_counter()
        if ids is not None and self.cohort is not None:  # the cohort's call, as the list run's
            inner = self._over(ids.tolist()) if ids.numel() else None
            if self.shard is not None:  # the whole cohort's longest client, agreed by every rank
                pad = int(self.shard[2](torch.tensor([max(inner.sizes) if inner is not None else 0])))
            calls = [(inner, slice(None))] if inner is not None else []
            if inner is not None:
                inner.pad_to = None if self.shard is None else pad  # one process: the cohort's longest
        else:  # every client here, or a streamed chunk of them: blocks of one process's call over the run, each
            calls = ((self._over(c, run=True), rows) for c, rows in self._blocks(ids))  # built when its turn comes
        for inner, rows in calls:
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
        """f(x) and its gradient over every client, in the list run's metric blocks, as many whole ones per block
        as ``block`` holds: each continues the sums ``start`` (module docstring; ``start`` / ``total`` as
        :meth:`BatchedClients.full_objective_`'s)."""
        sums = start if start is not None else (RowSum(1, torch.float64, self.device),
                                                RowSum(self.dim, self.dtype, self.device))
        N = self.num_clients if total is None else int(total)
        self.agree_pads()
        lo, n = self._first(), self.num_clients
        groups: list = []
        for part in self.probe.metric_blocks(lo, lo + n, len(self.run_sizes), self.longest):
            a, b = max(part.start, lo) - lo, min(part.stop, lo + n) - lo  # a shard's edges cut its first and last
            if groups and b - groups[-1][0] <= self.block:
                groups[-1][1] = b
            else:  # a part past the cache is cut (pad and mask)
                groups += [[s, min(s + self.block, b)] for s in range(a, b, self.block)]
        f = 0.0
        for a, b in groups:  # each writes the sums so far into grad_out: the last one's are the result
            f = self._over(range(a, b), run=True).full_objective_(x, grad_out, start=sums, total=N)
        return f
