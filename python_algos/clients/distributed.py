"""The distributed executor: the N clients split over torch.distributed ranks (``torchrun``).

Each of the P ranks holds a contiguous shard of the clients, ``[r N / P, (r + 1) N / P)``: the rows
of every ``[n_rank, d]`` client stack (or its own store of them: state_plan), and those clients'
data (of a :class:`~.population.Population`, its own clients, built when sampled). Its clients'
gradients are computed by an ordinary in-process executor over the shard (``inner="sequential"``
or ``"batched"``), whose clients keep the minibatch generators of their *global* index, so the run
draws the same minibatches as one process. The algorithm files are unchanged: they see a :class:`ClientSet`
whose answers cross ranks where the spec crosses the client / server boundary:

======================  ===================================================================
``mean(S, ids)``        a chained sum of the ranks' rows in client order (below), divided
                        by N, by the round's participant count k, or by ``divisor``
``broadcast(v)``        nothing to send: the server state is replicated (below)
``gossip_(X, W)``       neighbour exchange: each rank sends, point to point, only the rows
                        another rank's clients have as neighbours (never the whole stack),
                        then mixes its rows with one process's product (see ``_plan``)
``participants()``      every rank replays the same draw from the run's seed and keeps the
                        sampled clients it holds, as *local* row indices (see below)
``full_objective_``     the loss and gradient sums chained the same way (either inner)
======================  ===================================================================

**One process's bits.** A mean adds the rows in one process's order (:mod:`.row_sum`, which any cut
of the rows keeps): rank r receives ranks 0..r - 1's running sum, adds its own rows and hands it on;
the last rank broadcasts the sum. The metric pass continues the gradient and loss sums the same
way (the sequential inner executor's client after client, the batched one's in row_sum's blocks);
a batched inner pads a client's batch up to the run's longest client, not its shard's, and only where the
run's clients make that exact (:mod:`.run_kind`), not its shard's; the gossip
adds each row's products in one process's order. So a run equals the one-process run of its inner
executor bit for bit, on any number of ranks; the price is latency, the ranks adding one after
another (a sum of the ranks' partial sums, one all-reduce, would add in another order).

**The server state is replicated.** Every rank applies the same server update (the same fused,
deterministic kernels) to the same broadcast vector, so every rank holds bit-identical server
state without a broadcast from rank 0. This saves a d-vector broadcast and a synchronization per
round (a rank-0 server would serialize the server step while the other ranks wait), and every
rank needs the new server vector anyway for its clients' next round. Our kernels have no
run-to-run nondeterminism on a given device type; :meth:`check_replicas` compares
a checksum of the reported model across ranks (the experiment runner calls it at the end of a run).

**Partial participation.** Every rank draws the round's k sampled clients from the same generator
(seeded by the run's seed, exactly as one process does) and answers ``participants()`` with the
sampled clients of its own shard, as indices into its rows; a compact participant stack on rank r
is that rank's slice of the global ``[k, d]`` participant stack, and ``mean(S, ids)`` divides by
the global k. The draw is uniform, so a rank holds k·n_rank/N sampled clients on average; the
per-round imbalance (hypergeometric) is recorded in ``participant_loads`` and discussed in the
docs/scaling-out.md. Rebalancing would change which rank computes which client, not the result.

**Metrics.** ``algorithm.report`` and ``state_metrics`` may read client stacks (DEPOSITUM reports
the client average x̄): :meth:`report` / :meth:`state_metrics` hand them the rank's rows wrapped
(:class:`_ClientRows`) so that a mean or sum over the client dimension is torch's on the full
stack, bit for bit: the ranks' rows are gathered on rank 0 (an ``[N, ...]`` stack there for the
moment of the reduction), which reduces and broadcasts; ``sum_rows()`` adds them in row_sum's
order, chained as a mean is (no stack gathered). The metric pass runs on every rank, chained as
above: a metric equals the one-process run's bit for bit.

**Communication counters.** ``comm.up`` / ``comm.down`` count d-vectors per client exactly as the
in-process executors do (the algorithm's declared costs); ``comm.sent_bytes`` / ``comm.recv_bytes``
count the bytes this rank hands to / receives from torch.distributed for the algorithm: the running
sums and the broadcast of every mean, and the gossip rows sent to and received from other ranks.
The metric pass is counted apart
(``metric_bytes``).

Errors: a construction error on any rank (bad data in its shard, too few clients) is raised on
every rank with that rank's number and message (:func:`.process_group.agree`); see
:mod:`.process_group` for the timeouts of a peer that stops answering.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

import fedkernels as fk

from . import process_group
from .base import ClientSet
from .data import client_data
from .population import Population
from .registry import LOCAL_EXECUTORS, resolve_local
from .row_sum import BLOCK, RowSum, block_sums
from .run_kind import candidates, run_separability

__all__ = ["DistributedClients", "ShardPopulation"]


class ShardPopulation(Population):
    """Clients ``lo .. hi - 1`` of a :class:`Population`, as a population of ``hi - lo`` (client j is
    the population's client ``lo + j``, built on demand by the population itself, so a build or a
    refusal names the global id)."""

    def __init__(self, population: Population, lo: int, hi: int):
        super().__init__(hi - lo, population.make_client, cache=population.cache, recipe=population.recipe)
        self.population, self.lo = population, int(lo)

    def build(self, i: int):
        return self.population.build(self.lo + self.index(i))


class DistributedClients(ClientSet):
    """N clients sharded over the ranks of the default torch.distributed process group.

    Besides the arguments every executor takes (``model, loss_fn, data, batch_size, seed, flat``):

    Args:
        data: all N clients' data (every rank gets the full list; a rank converts and keeps only
            its shard, so a lazy sequence loads only the shard).
        inner: the executor that runs this rank's clients: ``"sequential"``, ``"batched"`` or
            ``"auto"`` (default: a fixed rule, not a timing, chosen as one process with all N
            clients would; see :func:`python_algos.clients.registry.resolve_local`).
        inner_options: keyword arguments for the inner executor.
        timeout: seconds a collective waits for a silent peer (default: ``PYTHON_ALGOS_DIST_TIMEOUT``
            or 300); used when this call creates the process group.
    """

    executor = "distributed"
    measures_bytes = True

    @classmethod
    def unsupported(cls, model) -> str:
        if not dist.is_available():
            return "torch.distributed is not available in this torch build"
        return _running_stats_issue(model, process_group.world_size())

    def __init__(self, model: nn.Module, loss_fn: Callable, data: Sequence, batch_size: Optional[int] = None,
                 seed: int = 0, flat: Optional[fk.FlatParams] = None, *, inner: str = "auto",
                 inner_options: Optional[dict] = None, timeout: Optional[float] = None):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(inner, str) or (inner.lower() != "auto" and inner.lower() not in LOCAL_EXECUTORS):
            names = ", ".join(["auto", *LOCAL_EXECUTORS])
            raise ValueError(f"inner (the executor of each rank's clients) must be one of {names}, got {inner!r}")
        first = next(iter(model.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
        # the collectives below use the default group without holding it: a reference kept here would keep its gloo
        # threads and store server alive past destroy_process_group (see process_group._unbind_world_defaults)
        process_group.ensure_group(device, timeout)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        n = len(data)
        self.num_clients = n
        self.bounds = process_group.bounds(n, self.world_size)
        self.lo, self.hi = self.bounds[self.rank]
        self.rows = self.hi - self.lo
        self.metric_bytes = 0
        self.participant_loads: list[list[int]] = []  # sampled clients per rank, one list per round
        self._k = None  # this round's global participant count
        self._plans: list = []  # (copy of W, gossip plan), newest first: see _plan
        err = None
        try:
            if n < self.world_size:
                raise ValueError(f"{n} clients cannot be split over {self.world_size} ranks: every rank needs at "
                                 f"least one client (use at most {n} processes)")
            why = _running_stats_issue(model, self.world_size)
            if why:
                raise ValueError(why)
            cls = resolve_local(inner, model)
            # a population: this rank's clients, built on demand by their global ids (never another rank's)
            shard = ShardPopulation(data, self.lo, self.hi) if isinstance(data, Population) else \
                [data[i] for i in range(self.lo, self.hi)]
            opts = dict(inner_options or {})
            if inner.lower() == "auto":  # choose as one process with all N clients would, on every rank
                opts["total_clients"] = n
            self.inner = cls(model, loss_fn, shard, batch_size=batch_size, seed=seed, flat=flat,
                             first_client=self.lo, **opts)
        except Exception as e:  # noqa: BLE001 - re-raised on every rank by agree()
            err = e
        process_group.agree(err)
        self.inner_executor = self.inner.executor
        if hasattr(self.inner, "longest_client"):  # a batched inner pads batches up to the run's longest client
            longest = torch.tensor([self.inner.longest_client()], device=self._collective_device(device))
            if self.world_size > 1:
                dist.all_reduce(longest, op=dist.ReduceOp.MAX)
            self.inner.pad_to = int(longest)  # as one process does: not its shard's, which would change the bits
            # every client's size, to lay a pass out as one process's, and the clients that may decide the
            # loss's kind, so a rank pads batches as one process over every client (run_kind: the few clients it
            # names are read on every rank, another rank's too)
            both = torch.zeros(2, n, dtype=torch.int64, device=longest.device)
            both[0, self.lo : self.hi] = torch.tensor(self.inner.sizes, device=longest.device)
            both[1, self.lo : self.hi] = torch.tensor(candidates(self.inner.labels(), loss_fn),
                                                      device=longest.device)
            if self.world_size > 1:
                dist.all_reduce(both, op=dist.ReduceOp.MAX)
            self.inner.run_sizes = both[0].tolist()
            self.inner.judge(run_separability(model, loss_fn, self.inner.run_sizes, both[1].tolist(),
                                              lambda i: client_data(data[i], self.inner.dtype, self.inner.device)))
        elif hasattr(self.inner, "shard"):  # a population's batched inner: agrees on its pads (cohort_batched)
            self.inner.shard = (self.lo, n, self._agree_max)
        # the inner batched executor's first-layer path, recorded in the run's setup as one process records its
        # own: each rank calibrates on its own shard, and "auto" only picks among paths with the same bits
        self.first_layer = getattr(self.inner, "first_layer", None)
        self.first_layer_source = getattr(self.inner, "first_layer_source", None)
        self.flat, self.dim = self.inner.flat, self.inner.dim
        self.dtype, self.device = self.inner.dtype, self.inner.device
        self._itemsize = torch.empty((), dtype=self.dtype).element_size()

    # -- timing counters: those of the inner executor ---------------------------------------
    grad_seconds = property(lambda self: self.inner.grad_seconds if hasattr(self, "inner") else 0.0,
                            lambda self, v: None)
    fwd_bwd_seconds = property(lambda self: self.inner.fwd_bwd_seconds if hasattr(self, "inner") else 0.0,
                               lambda self, v: None)
    grad_evals = property(lambda self: self.inner.grad_evals if hasattr(self, "inner") else 0, lambda self, v: None)

    clients = property(lambda self: self.inner.clients)  # this rank's clients (a store's estimate reads them)

    # -- client-local work ------------------------------------------------------------
    def gradients_(self, X, G, ids=None):
        if ids is not None and ids.numel() == 0 and getattr(self.inner, "shard", None) is None:
            return G  # none of the round's cohort is here (a population's batched inner agrees on its padding)
        return self.inner.gradients_(X, G, ids)

    # -- participation ------------------------------------------------------------------
    def participants(self):
        ids = super().participants()  # the same global draw on every rank
        if ids is None:
            self._k = None
            if hasattr(self.inner, "run_sizes"):
                self.inner.cohort = None
            return None
        self._k = int(ids.numel())
        if hasattr(self.inner, "run_sizes"):  # a batched inner lays its passes out over the whole cohort
            self.inner.cohort = ids
        edges = torch.tensor([hi for _, hi in self.bounds], device=ids.device)
        self.participant_loads.append(torch.bincount(torch.bucketize(ids, edges, right=True),
                                                     minlength=self.world_size).tolist())
        mine = ids[(ids >= self.lo) & (ids < self.hi)]
        return mine - self.lo

    def held(self, ids):
        """This rank's rows of the clients ``ids``: its shard's, less its first client (a disk store's
        read-ahead of the next cohort reads only the rank's own rows)."""
        return ids[(ids >= self.lo) & (ids < self.hi)] - self.lo

    # -- aggregation ------------------------------------------------------------------
    def mean(self, S, ids=None, *, divisor=None):
        self.comm.up += 1
        held = self.rows if ids is None else self.participant_loads[-1][self.rank]
        if S.dim() != 2 or S.shape[0] != held:
            raise ValueError(f"mean(S, ids): S must hold one row per {'client' if ids is None else 'participant'} "
                             f"of this rank ({held} rows), got shape {tuple(S.shape)}")
        first = self.lo if ids is None else sum(self.participant_loads[-1][: self.rank])  # S[0]'s place in order
        n = divisor if divisor is not None else (self.num_clients if ids is None else self._k)
        return self._row_sum(S, first).div_(n)

    def _row_sum(self, S: torch.Tensor, first: int, metric: bool = False) -> torch.Tensor:
        """The sum of every rank's rows in client order, added as one process adds them (:mod:`.row_sum`:
        blocks of BLOCK rows from the first, each summed row after row, the block sums added in order;
        any cut of the rows keeps it). This rank's whole blocks are summed before anything arrives;
        then it takes ranks 0..r - 1's running sum (the finished blocks' total, the open block's sum and
        its row count < BLOCK, exact in any float dtype: 2d + 1 numbers), closes the open block with its
        first rows, adds its block sums and its last rows, and hands it on; the last rank broadcasts.
        ``metric``: the bytes count as the metrics' (``metric_bytes``), not the algorithm's."""
        d, last, m = S.shape[1], self.world_size - 1, S.shape[0]
        acc = RowSum(d, S.dtype, S.device)
        head = min((-first) % BLOCK, m)  # the rows that close the block ranks 0..r - 1 left open
        whole = (m - head) // BLOCK * BLOCK
        sums = block_sums(S[head : head + whole]) if whole else None  # RowSum.add_'s, before anything arrives
        buf = torch.empty(2 * d + 1, dtype=S.dtype, device=S.device) if self.world_size > 1 else None  # state()
        if self.rank > 0:
            dist.recv(buf, src=self.rank - 1)
            self._count(0, buf, metric)
            acc.load(buf)
        acc.add_(S[:head])
        for s in sums if sums is not None else ():
            acc.total.add_(s)
        acc.add_(S[head + whole :])
        if self.world_size == 1:
            return acc.sum()
        if self.rank < last:
            acc.state(buf)
            dist.send(buf, dst=self.rank + 1)
            self._count(buf, 0, metric)
        out = acc.sum() if self.rank == last else torch.empty(d, dtype=S.dtype, device=S.device)
        dist.broadcast(out, src=last)
        if self.rank == last:
            self._count(out, 0, metric)
        else:
            self._count(0, out, metric)
        return out

    def _count(self, sent, received, metric: bool) -> None:
        """Bytes of the tensors ``sent`` / ``received`` (0: none) in the algorithm's counters, or the metrics'."""
        sent, received = (t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0 for t in (sent, received))
        if metric:
            self.metric_bytes += sent + received
        else:
            self.comm.sent_bytes += sent
            self.comm.recv_bytes += received

    def _mean(self, S, divisor=None):  # not reached: mean() is overridden
        raise AssertionError("DistributedClients.mean does the reduction")

    def _broadcast(self, v):
        return v  # replicated server state (module docstring)

    # -- gossip ---------------------------------------------------------------------------
    def _gossip_(self, X, W):
        plan = self._plan(W)
        ext = plan["ext"]
        ext[plan["own"] : plan["own"] + self.rows].copy_(X)
        if self.world_size > 1 and plan["ops"]:
            got = self.workspace("_gossip_recv", rows=plan["m"]) if plan["m"] else None
            ops = []
            for q, send_idx, off, cnt in plan["ops"]:
                if send_idx.numel():
                    buf = X.index_select(0, send_idx)
                    ops.append(dist.P2POp(dist.isend, buf, q))
                    self.comm.sent_bytes += buf.numel() * self._itemsize
                if cnt:
                    ops.append(dist.P2POp(dist.irecv, got[off : off + cnt], q))
                    self.comm.recv_bytes += cnt * self.dim * self._itemsize
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            if got is not None:
                ext.index_copy_(0, plan["at"], got)
        if plan["W"].layout != torch.sparse_coo:  # every client's row of W X: one process's product (see _plan)
            out = self.workspace("_gossip_all", rows=self.num_clients)
            torch.mm(plan["W"], ext, out=out)
            return X.copy_(out[self.lo : self.hi])
        out = self.workspace("_gossip")
        torch.mm(plan["W"], ext, out=out)
        return X.copy_(out)

    _PLANS_KEPT = 4  # mixing matrices whose plans are cached (an algorithm uses one per run)

    def _plan(self, W: torch.Tensor) -> dict:
        """Who needs which rows of whom, for the mixing matrix W, and the product that mixes them.

        The rank's rows of W·X use the columns of W's rows lo..hi with a nonzero entry; the ones
        outside the shard are received from their owners (``m`` rows), into the extended stack
        ``ext`` with the local rows, *in client order*. Symmetrically, a row is sent to rank q when
        one of q's rows of W uses it. One process's bits: a sparse W's product adds each row's
        terms in the order of their columns, so the local rows of W, their columns renumbered in
        that order, add the same terms in the same order; a dense W's product (BLAS) adds in an
        order that depends on the matrices' shapes, so every rank computes one process's whole
        ``[N, N] x [N, d]`` product, ``ext`` holding every client's row (zeros where a row is
        not read: those entries of W are 0) and keeps its rows of the result: an ``[N, d]`` stack
        and the full product on every rank (a dense W is for small or dense graphs).

        Cached by W's *content*: each plan keeps a copy of the W it was built from and is reused
        only for an equal matrix (same layout, dtype, shape, indices and values), so a W changed
        in place, a new W at a reused address or a transposed view never gets a stale plan. The
        comparison reads W once (O(nnz), as the mean-degree count of every gossip does)."""
        for snapshot, plan in self._plans:
            if _same_matrix(snapshot, W):
                return plan
        Wc = W.coalesce() if W.layout == torch.sparse_coo else None
        if Wc is not None:
            r, c = Wc.indices().cpu()
            v = Wc.values()
            nz = v.cpu() != 0
            r, c, v = r[nz], c[nz], v[nz.to(v.device)]
        else:
            r, c = torch.nonzero(W.cpu(), as_tuple=True)
        edges = torch.tensor([hi for _, hi in self.bounds])
        owner, row_owner = torch.bucketize(c, edges, right=True), torch.bucketize(r, edges, right=True)
        mine = row_owner == self.rank
        read = torch.zeros(self.num_clients, dtype=torch.bool)
        read[self.lo : self.hi] = True
        if Wc is None:
            read[:] = True  # the whole product (docstring)
        else:
            read[c[mine]] = True
        pos = torch.cumsum(read, 0) - 1  # global column -> row of ext, in client order
        ops, at, m = [], [], 0
        for q in range(self.world_size):
            if q == self.rank:
                continue
            need = torch.unique(c[mine & (owner == q)])  # sorted rows of q this rank mixes in
            give = torch.unique(c[(row_owner == q) & (owner == self.rank)])  # rows q mixes in
            if need.numel() or give.numel():
                ops.append((q, (give - self.lo).to(self.device), m, int(need.numel())))
            at.append(pos[need])
            m += need.numel()
        snapshot = (Wc if Wc is not None else W).detach().clone()
        if Wc is None:
            Wloc = snapshot
        else:
            idx = torch.stack([r[mine] - self.lo, pos[c[mine]]]).to(self.device)
            Wloc = torch.sparse_coo_tensor(idx, v[mine.to(v.device)].to(self.dtype).to(self.device),
                                           (self.rows, int(read.sum()))).coalesce()
        plan = {"W": Wloc, "ops": ops, "m": m, "at": torch.cat(at).to(self.device) if at else None,
                "own": int(pos[self.lo]), "ext": torch.zeros(int(read.sum()), self.dim, dtype=self.dtype,
                                                             device=self.device)}
        self._plans = [(snapshot, plan), *self._plans][: self._PLANS_KEPT]
        return plan

    # -- evaluation ---------------------------------------------------------------------
    def full_objective_(self, x, grad_out):
        """The metric pass as one process adds it, client after client: rank r receives the sums of ranks
        0..r - 1 (gradient and loss), continues them over its own clients and hands them on; the last
        rank's f and gradient are sent to every rank. The ranks run one after another (a sum of their
        partial sums would add in another order, and the metrics would differ from one process in their
        last bits). The sums are the inner executor's: the sequential one's running sums (d + 1 numbers),
        the batched one's :class:`~.row_sum.RowSum` of the losses and of the gradients (their
        :meth:`~.row_sum.RowSum.state`, 3 + 2d + 1 numbers); sent as float64, exact for float32 too."""
        d, last, batched = self.dim, self.world_size - 1, self.inner_executor == "batched"
        if hasattr(self.inner, "agree_pads"):  # a collective, so not while the ranks wait on each other below
            self.inner.agree_pads()
        buf = torch.zeros(3 + 2 * d + 1 if batched else d + 1, dtype=torch.float64, device=self.device)
        if self.rank > 0:
            dist.recv(buf, src=self.rank - 1)
            self.metric_bytes += buf.numel() * buf.element_size()
        if batched:
            sums = (RowSum(1, torch.float64, self.device), RowSum(d, self.dtype, self.device))  # losses, grads
            if self.rank > 0:
                sums[0].load(buf[:3])
                sums[1].load(buf[3:])
            f = self.inner.full_objective_(x, grad_out, start=sums, total=self.num_clients)
            sums[0].state(buf[:3])
            sums[1].state(buf[3:])
        else:
            if self.rank > 0:
                grad_out.copy_(buf[:d])
            f = self.inner.full_objective_(x, grad_out, start=float(buf[d]) if self.rank > 0 else None,
                                           total=self.num_clients)
            buf[:d].copy_(grad_out)
            buf[d] = f
        if self.world_size == 1:
            return f
        if self.rank < last:
            dist.send(buf, dst=self.rank + 1)
            self.metric_bytes += buf.numel() * buf.element_size()
        out = torch.empty(d + 1, dtype=torch.float64, device=self.device)
        if self.rank == last:
            out[:d].copy_(grad_out)
            out[d] = f
        dist.broadcast(out, src=last)
        self.metric_bytes += out.numel() * out.element_size()
        grad_out.copy_(out[:d])
        return float(out[d])

    def report(self, algorithm, state, reg):
        with self._rows_view(state) as st:
            x = algorithm.report(st, reg)
        return _plain(x, "report")

    def state_metrics(self, algorithm, state) -> dict:
        with self._rows_view(state) as st:
            out = algorithm.state_metrics(st, self)
        return {k: float(_plain(v, k)) if isinstance(v, torch.Tensor) else v for k, v in out.items()}

    @contextlib.contextmanager
    def _rows_view(self, state):
        """The state with its client stacks (the fields its class declares in ``client_fields``) as
        :class:`_ClientRows` (reductions over the clients: every rank's rows)."""
        if not hasattr(state, "_replace"):
            yield state
            return
        wrap = {k: getattr(state, k).as_subclass(_ClientRows) for k in process_group.client_fields(state, self.rows)
                if isinstance(getattr(state, k), torch.Tensor)}  # a store's rows are not read by metrics
        token = _ClientRows.context.get()
        _ClientRows.context.set((self.rows, self.num_clients, self))
        try:
            yield state._replace(**wrap) if wrap else state
        finally:
            _ClientRows.context.set(token)

    def _gather_rows(self, rows: torch.Tensor) -> Optional[torch.Tensor]:
        """Every rank's rows (``rows``: this rank's, ``[n_rank, ...]``), in client order, on rank 0 (None
        on the others): a metric's reduction over the clients (_reduce_over_clients)."""
        nbytes = rows.numel() * rows.element_size()
        if self.rank > 0:
            dist.send(rows.contiguous(), dst=0)
            self.metric_bytes += nbytes
            return None
        full = torch.empty((self.num_clients, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        full[: self.hi].copy_(rows)
        for q, (lo, hi) in enumerate(self.bounds[1:], start=1):
            dist.recv(full[lo:hi], src=q)
        self.metric_bytes += full.numel() * full.element_size() - nbytes
        return full

    def _global_row(self, rows: torch.Tensor, i: int) -> torch.Tensor:
        """Row of global client i (e.g. FedCanonII reports client 0's replica), sent by its owner."""
        i = i + self.num_clients if i < 0 else i
        if not 0 <= i < self.num_clients:
            raise IndexError(f"client {i} out of range for {self.num_clients} clients")
        owner = next(r for r, (lo, hi) in enumerate(self.bounds) if lo <= i < hi)
        with torch._C.DisableTorchFunctionSubclass():
            plain = rows.as_subclass(torch.Tensor)
            row = plain[i - self.lo].clone() if owner == self.rank else torch.empty_like(plain[0])
        if self.world_size > 1:
            dist.broadcast(row, src=owner)
        self.metric_bytes += row.numel() * row.element_size()
        return row

    def any_rank(self, flag: bool) -> bool:
        return process_group.any_rank(flag, self._collective_device(self.device))

    def _agree_max(self, t: torch.Tensor) -> torch.Tensor:
        """The element-wise maximum of ``t`` (int64, on the CPU) over the ranks."""
        if self.world_size > 1:
            out = t.to(self._collective_device(self.device))
            dist.all_reduce(out, op=dist.ReduceOp.MAX)
            return out.cpu()
        return t

    @staticmethod
    def _collective_device(device: torch.device) -> torch.device:
        return device if device.type == "cuda" else torch.device("cpu")

    def check_replicas(self, x: torch.Tensor, what: str = "the model") -> None:
        """Raise if ``x`` (a replicated [d] vector) differs between ranks (a checksum of its bytes)."""
        if self.world_size == 1:
            return
        digest = hashlib.sha1(x.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
        got = [None] * self.world_size
        dist.all_gather_object(got, digest)
        if len(set(got)) != 1:
            raise RuntimeError(f"{what} differs between ranks ({', '.join(g[:8] for g in got)}): the replicated server "
                               f"state diverged (different devices or a nondeterministic kernel)")

    # -- checkpointing ----------------------------------------------------------------------
    def rng_state(self) -> dict:
        """The participant sampler (replicated) and the inner executor's generators (this shard)."""
        return {**self.inner.rng_state(), **super().rng_state()}

    def set_rng_state(self, states: dict) -> None:
        own = {k: v for k, v in states.items() if k in vars(self)}
        super().set_rng_state(own)
        self.inner.set_rng_state({k: v for k, v in states.items() if k not in own})

    def shard_info(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "lo": self.lo, "hi": self.hi,
                "num_clients": self.num_clients}


def _running_stats_issue(model: nn.Module, world: int) -> str:
    """Why ``model`` cannot be split over ``world`` > 1 processes exactly, or "".

    A BatchNorm / InstanceNorm in training mode with running statistics updates its buffers in
    every forward pass, from the batches of the clients this process runs. Over several ranks each
    rank's statistics would come from its own shard only, and the model saved or checkpointed
    (rank 0's buffers) would differ from a one-process run's; training itself uses batch
    statistics, so nothing else shows it. Merging them exactly would need every forward pass's
    batch statistics from every rank, in client order."""
    if world <= 1:
        return ""
    from .batched import STATEFUL_NORMS

    for name, m in model.named_modules():
        if isinstance(m, STATEFUL_NORMS) and m.track_running_stats and m.training:
            return (f"module {name or 'model'!r} ({type(m).__name__}) updates running statistics in every forward "
                    f"pass; split over {world} processes each would hold statistics of its own clients only, and the "
                    f"saved model (rank 0's) would differ from a one-process run: use GroupNorm / LayerNorm, "
                    f"track_running_stats=False, or run in one process")
    return ""


def _same_matrix(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` (a coalesced or dense snapshot) and ``b`` are the same matrix, entry for entry."""
    if a.layout != b.layout or a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if b.layout == torch.sparse_coo:
        b = b.coalesce()  # a no-op for the coalesced W the topologies build
        return bool(torch.equal(a.indices(), b.indices()) and torch.equal(a.values(), b.values()))
    return bool(torch.equal(a, b))


def _plain(v, what: str):
    if isinstance(v, _ClientRows):
        raise NotImplementedError(f"{what} is per-client (not reduced over the clients): the distributed executor "
                                  f"cannot return a rank's rows as a global value")
    return v.as_subclass(torch.Tensor) if isinstance(v, torch.Tensor) and type(v) is not torch.Tensor else v


_REDUCTIONS = {torch.Tensor.mean: "mean", torch.mean: "mean", torch.Tensor.sum: "sum", torch.sum: "sum"}
_TO_PYTHON = {torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__, torch.Tensor.item,
              torch.Tensor.tolist, torch.Tensor.numpy}


def _funcs(*names, modules=(torch, torch.Tensor)):
    return {f: n for n in names for m in modules for f in [getattr(m, n, None)] if f is not None}


# Reductions, scans and sorts other than mean / sum, by the position of their ``dim`` argument
# (after the tensor) and what an absent dim means ("all": every dimension; else a default dim).
# Over the client dimension they would need another collective (max, a norm, a median, ...) or
# a global order (cumsum, sort): refused, instead of a rank's partial answer.
_DIM_ARG = {}
for _names, _pos, _default in (
        (("amax", "amin", "aminmax", "prod", "nansum", "nanmean", "logsumexp", "count_nonzero", "any", "all",
          "max", "min", "argmax", "argmin", "median", "nanmedian", "mode", "var", "std", "var_mean", "std_mean"),
         0, "all"),
        (("norm", "quantile", "nanquantile", "kthvalue"), 1, "all"),
        (("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "softmax", "log_softmax", "sort", "argsort",
          "msort", "flip", "roll", "diff", "unique_consecutive"), 0, -1),
        (("topk",), 1, -1)):
    for _f in _funcs(*_names):
        _DIM_ARG[_f] = (_pos, _default)
for _f, _spec in {torch.linalg.vector_norm: (1, "all"), torch.linalg.norm: (1, "all"),
                  torch.nn.functional.softmax: (0, -1), torch.nn.functional.log_softmax: (0, -1),
                  torch.nn.functional.normalize: (1, 1)}.items():
    _DIM_ARG[_f] = _spec
_DIM_ARG.update({f: (0, "all") for f in _funcs("flip", "unique")})  # flip(dims), unique(): every dim
# Ops that move the client dimension (or contract it, as the right operand of a product).
_MOVES = _funcs("t", "transpose", "swapaxes", "swapdims", "permute", "movedim", "moveaxis", "einsum",
                "tensordot", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "inner", "outer", "kron")
_MOVES.update({torch.Tensor.T.__get__: "T", torch.Tensor.mT.__get__: "mT", torch.Tensor.H.__get__: "H",
               torch.Tensor.mH.__get__: "mH"})


def _norm_dims(dim, ndim: int):
    """``dim`` as torch reads it, as a sorted tuple of non-negative dims (None, () and []: all)."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int):
            raise NotImplementedError(f"dim={dim!r} on a rank's client rows: give dims as ints")
        if not -ndim <= d < ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {d})")
        if d % ndim in out:
            raise RuntimeError(f"dim {d % ndim} appears multiple times in the list of dims")
        out.append(d % ndim)
    return tuple(sorted(out))


def _reduce_over_clients(func, args, kwargs, ctx):
    """``func`` (``mean`` / ``sum``) of a rank's rows as torch computes it on the full [N, ...] stack,
    or None when dim 0 is not reduced (a per-client value: computed locally). Torch's own: every
    rank's rows are gathered in client order on rank 0, which calls ``func`` with the caller's
    arguments and broadcasts the result, so the bits are one process's (torch's order of adding
    depends on the stack's length: no sum of the ranks' partial sums gives them). Signatures:
    ``sum(input, dim=None, keepdim=False, *, dtype=None)`` (mean alike; ``dtype`` also positional
    in ``sum(input, dtype)``)."""
    t = args[0]
    rest, kw = list(args[1:]), dict(kwargs)
    kw.pop("dtype", None)
    if rest and isinstance(rest[0], torch.dtype):
        rest.pop(0)
    dim = kw.pop("dim", rest.pop(0) if rest else None)
    kw.pop("keepdim", rest.pop(0) if rest else None)
    if rest or kw:
        raise NotImplementedError(f"{_REDUCTIONS[func]} of a rank's client rows with {sorted(kw) or rest}: only dim, "
                                  f"keepdim and dtype are supported")
    if 0 not in _norm_dims(dim, t.dim()):
        return None
    cs = ctx[2]
    with torch._C.DisableTorchFunctionSubclass():
        plain = t.as_subclass(torch.Tensor)
        out = func(plain, *args[1:], **kwargs)  # on every rank, before any message: torch's errors, the result's shape
        if cs.world_size > 1:
            full = cs._gather_rows(plain)
            if full is not None:
                out = func(full, *args[1:], **kwargs)
            dist.broadcast(out, src=0)
            cs.metric_bytes += out.numel() * out.element_size()
        return out


def _moves_clients(func, args, kwargs) -> bool:
    """True if ``func`` (one of _MOVES) moves or contracts dimension 0 of a _ClientRows argument."""
    name = _MOVES[func]
    t = args[0] if args else None
    if name in ("transpose", "swapaxes", "swapdims") and isinstance(t, _ClientRows):
        a = list(args[1:]) + [kwargs.get(k) for k in ("dim0", "dim1", "axis0", "axis1") if k in kwargs]
        return any(isinstance(d, int) and d % t.dim() == 0 for d in a[:2])
    if name == "permute" and isinstance(t, _ClientRows):
        dims = args[1] if len(args) == 2 and not isinstance(args[1], int) else args[1:] or kwargs.get("dims")
        return dims[0] % t.dim() != 0
    if name in ("matmul", "__matmul__", "mm", "bmm", "inner") and not isinstance(t, _ClientRows):
        return True  # the rows are the right operand: a product over the clients
    if name in ("matmul", "__matmul__", "mm", "bmm", "inner"):
        other = args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("mat2"))
        return isinstance(other, _ClientRows) or t.dim() == 1
    if name == "__rmatmul__":
        return True
    if name in ("T", "mT", "H", "mH", "t"):
        return t.dim() >= 2
    return True  # movedim, einsum, tensordot, outer, kron: not analysed


def _touches_clients(func, args, kwargs) -> bool:
    """True if the reduction / scan ``func`` (one of _DIM_ARG) works along dimension 0 of its input."""
    pos, default = _DIM_ARG[func]
    t = args[0]
    rest = list(args[1:])
    dim = kwargs.get("dim", kwargs.get("dims", kwargs.get("axis", rest[pos] if len(rest) > pos else default)))
    if isinstance(dim, torch.Tensor) or (not isinstance(dim, (int, tuple, list)) and dim not in (None, "all")):
        return func not in _funcs("max", "min")  # max(a, b): element-wise
    if dim == "all":
        return True
    try:
        return 0 in _norm_dims(dim, t.dim())
    except (IndexError, RuntimeError, NotImplementedError):
        return True


class _ClientRows(torch.Tensor):
    """A rank's rows of a client stack, seen by metric code (``report``, ``state_metrics``) only.

    Dimension 0 is the client dimension. ``mean`` / ``sum`` whose dims include it (an int, a tuple,
    negative dims, none: all) return an ordinary tensor, torch's on the full [N, ...] stack bit for bit
    (gathered on rank 0, :func:`_reduce_over_clients`), ``keepdim`` and ``dtype`` included;
    :meth:`sum_rows` is :func:`.row_sum.sum_rows` of the full stack. Element-wise arithmetic and reductions
    over the other dimensions keep the rows (still ``_ClientRows``); ``x[i]`` is global client i's
    row. Anything else that would turn a rank's rows into a global value (another reduction or scan
    along the clients, a transpose or product over them, ``float()``) raises
    ``NotImplementedError`` rather than return a partial answer."""

    context = contextvars.ContextVar("client_rows", default=None)  # (rows, N, DistributedClients)

    def sum_rows(self) -> torch.Tensor:
        """``row_sum.sum_rows`` of the full [N, ...] stack (every rank's rows, in :mod:`.row_sum`'s order,
        chained over the ranks as a mean is), a plain tensor: for metric code that sums a plain stack so."""
        rows, _, cs = self.context.get()
        with torch._C.DisableTorchFunctionSubclass():
            plain = self.as_subclass(torch.Tensor)
            return cs._row_sum(plain.reshape(rows, -1), cs.lo, metric=True).view(plain.shape[1:])

    @property
    def num_clients(self) -> int:
        """N, the clients of the full stack (``shape[0]`` is this rank's rows)."""
        return self.context.get()[1]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ctx = cls.context.get()
        has_rows = any(isinstance(a, _ClientRows) for a in args) or \
            any(isinstance(a, _ClientRows) for a in kwargs.values())
        name = getattr(func, "__name__", str(func))
        if ctx is not None and func in _REDUCTIONS and isinstance(args[0], _ClientRows):
            out = _reduce_over_clients(func, args, kwargs, ctx)
            if out is not None:
                return out
        elif ctx is not None and has_rows and func in _DIM_ARG and isinstance(args[0], _ClientRows) \
                and _touches_clients(func, args, kwargs):
            raise NotImplementedError(f"{name} along the client dimension (dim 0) of a rank's client rows: the "
                                      f"distributed executor reduces over the clients with mean / sum only")
        elif ctx is not None and has_rows and func in _MOVES and _moves_clients(func, args, kwargs):
            raise NotImplementedError(f"{_MOVES[func]} moves or contracts the client dimension (dim 0) of a rank's "
                                      f"client rows; the distributed executor cannot evaluate it (reduce over the "
                                      f"clients with mean / sum first)")
        if ctx is not None and func is torch.Tensor.__getitem__ and isinstance(args[0], _ClientRows) \
                and isinstance(args[1], int):  # one client's row, by its global index: from its owner
            return ctx[2]._global_row(args[0], args[1])
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if not has_rows or ctx is None:
            return out
        if func in _TO_PYTHON:
            raise NotImplementedError(f"{name} of a rank's client rows: reduce over the "
                                      f"clients (mean / sum over dim 0) first")
        if isinstance(out, torch.Tensor):
            if out.dim() >= 1 and out.shape[0] == ctx[0]:
                return out.as_subclass(_ClientRows)
            raise NotImplementedError(f"{name} over a rank's client rows is not a per-client "
                                      f"value or a mean / sum over the clients; the distributed executor cannot "
                                      f"evaluate it")
        return out
