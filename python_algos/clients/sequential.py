"""The sequential executor: every client in this process, one after another, on one module."""

from __future__ import annotations

import functools
import sys
import time
from typing import Callable, Optional, Sequence

import torch
from torch import nn

import fedkernels as fk

from .base import ClientSet
from .data import LoaderData, TensorData, client_data
from .losses import LossKind, classify_loss, ignore_index_of
from .population import PROBE_CLIENTS, LazyClients, LazyGenerators, Population
from .probe import check_clients, check_population
from .separable import separability, side_effect_free

__all__ = ["SequentialClients"]
ROW_ALIGN = 64  # bytes: where a row's gradient is computed (SequentialClients._aligned)


class SequentialClients(ClientSet):
    """In-process simulator: all N clients, evaluated one after another on one shared module.

    Args:
        model: the ``nn.Module``; wrapped in ``fk.FlatParams`` (its parameters become views).
        loss_fn: ``loss_fn(model(X_batch), y_batch)`` -> scalar mean loss.
        data: one client each: an ``(X, y)`` pair of tensors, a ``Dataset`` (read lazily: a batch
            fetches only its own samples) or a ``DataLoader`` (its own batches; see
            :mod:`python_algos.clients.data` for what that means for reproducibility); or a
            :class:`~python_algos.clients.population.Population`, whose clients are built on demand.
        batch_size: ``None`` (or >= a client's size) for full local gradients; otherwise each
            gradient call samples ``batch_size`` indices without replacement, using the client's
            own ``torch.Generator`` (seeded from ``seed`` and the client index).
        seed: the run's seed.
        chunk: full-data passes are split into chunks of at most this many samples (a chunk
            weighted by its share of the data, so the result is the same mean loss). Only when
            that is exact: if the model or the loss couples the samples of a batch (a BatchNorm in
            training mode, ``reduction="sum"``, a class-weighted mean;
            :func:`~python_algos.clients.separable.separability`, decided before the first split),
            a batch is always one pass.
        flat: an existing ``fk.FlatParams(model)`` to reuse.
        first_client: the global index of ``data[0]`` when this process holds a shard of the
            federation (client i's generator is seeded by its global index).
        check_data: run :func:`~python_algos.clients.probe.check_clients` on the data (default);
            ``False`` only where the same data already passed it (a deployed node's later rounds).

    Module buffers (e.g. BatchNorm running statistics) are shared by all clients here.
    ``grad_seconds`` / ``grad_evals`` accumulate the time in, and number of, gradient calls
    (binding the row, batch sampling, forward, backward); ``fwd_bwd_seconds`` the forward and
    backward passes alone.
    """

    executor = "sequential"

    def __init__(self, model: nn.Module, loss_fn: Callable, data: Sequence, batch_size: Optional[int] = None,
                 seed: int = 0, chunk: int = 2048, flat: Optional[fk.FlatParams] = None, first_client: int = 0,
                 check_data: bool = True):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1):
            raise ValueError(f"batch_size must be None or a positive int, got {batch_size!r}")
        if len(data) == 0:
            raise ValueError("need at least one client")
        self.model = model
        self.loss_fn = loss_fn
        self.flat = flat if flat is not None else fk.FlatParams(model)
        self.dim = self.flat.numel
        self.dtype = self.flat.params.dtype
        self.device = self.flat.params.device
        lazy = isinstance(data, Population)  # clients built on demand (only the ones a round or a pass reads)
        self.clients = LazyClients(data, self.dtype, self.device) if lazy else \
            [client_data(c, self.dtype, self.device) for c in data]
        self.num_clients = self.rows = len(self.clients)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.chunk = int(chunk)
        self.generators = LazyGenerators(seed, self.num_clients, first_client)  # created when first drawn from
        # the clients the start-up checks read: a population's first few (module population's docstring)
        self.probed = [self.clients[i] for i in range(min(PROBE_CLIENTS, self.rows))] if lazy else self.clients
        self._params = [p for p in model.parameters() if p.requires_grad]  # FlatParams' order
        if [p.numel() for p in self._params] != list(self.flat.sizes):
            raise ValueError("flat must be fk.FlatParams(model) of this model")
        self._binders: dict[tuple, Callable[[int], None]] = {}
        self.coupled: Optional[str] = None  # why samples are coupled ("": they are not); probed when first needed
        self._ignore: Optional[int] = None  # the loss's ignore_index, when a batch is coupled by that alone (_coupled)
        self.loss_kind = None  # a population's, decided once for every client (probe.check_population)
        self._scratch: Optional[torch.Tensor] = None
        self._row: Optional[torch.Tensor] = None  # a misaligned row's aligned copy (_aligned)
        if check_data and lazy:  # before the run starts; what only a client's data can tell, when it is built
            check = check_population(model, loss_fn, self.probed, self.batch_size, first_client)
            self.clients.guard, self.loss_kind = check.guard, check.kind
        elif check_data:
            check_clients(model, loss_fn, self.probed, self.batch_size, first_client)  # before the run starts

    def set_participation(self, clients_per_round, seed=0):
        super().set_participation(clients_per_round, seed)
        if isinstance(self.clients, LazyClients):  # a round's local steps reread its cohort: keep it built
            self.clients.population.reserve(self.clients_per_round or 0)

    def stream_chunks(self, size):
        if isinstance(self.clients, LazyClients):  # a chunk's local steps reread its clients: as many as stay built
            size = min(size, self.clients.population.cache)
        return super().stream_chunks(size)

    # -- client-local work ------------------------------------------------------------
    def gradients_(self, X, G, ids=None):
        binder = self._binder(X)
        for j, i in enumerate(range(self.rows) if ids is None else ids.tolist()):
            x, bind = X[j], None if binder is None else functools.partial(binder, j)
            if x.data_ptr() % ROW_ALIGN:
                x, bind = self._aligned(x)
            self.local_gradient_(i, x, G[j], bind=bind)
        return G

    def _aligned(self, x: torch.Tensor) -> tuple:
        """A copy of row x at a ``ROW_ALIGN``-byte boundary and its bind(). Kernels on the parameter views
        (BLAS's product of a one-sample batch) peel to the vector width, so a row elsewhere in a stack (row j
        of N, of a streamed chunk, of a rank's shard) got other last bits: the gradient is the row's, wherever
        it lies. A fresh tensor starts at such a boundary (torch's CPU allocator aligns to 64 bytes)."""
        if self._row is None or self._row.shape[1] != x.numel() or self._row.dtype != x.dtype:
            self._row = torch.empty(1, x.numel(), dtype=x.dtype, device=x.device)
        self._row[0].copy_(x)
        return self._row[0], functools.partial(self._binder(self._row), 0)

    def _binder(self, X: torch.Tensor) -> Optional[Callable[[int], None]]:
        """``fk.FlatParams.row_binder`` of the stack X (per-row parameter views built once), cached
        per stack: algorithms reuse the same state / workspace stacks every step. A cached binder
        keeps its stack alive, so its address cannot be reused by another stack while cached."""
        if X.dim() != 2 or not X.is_contiguous():
            return None
        key = (X.data_ptr(), tuple(X.shape), X.dtype)
        binder = self._binders.get(key)
        if binder is None:
            if len(self._binders) >= 32:  # stacks that are gone (e.g. per-round copies): drop them
                self._binders.clear()
            binder = self._binders[key] = self.flat.row_binder(X)
        return binder

    def local_gradient_(self, i: int, x: torch.Tensor, g: torch.Tensor,
                        bind: Optional[Callable[[], None]] = None) -> torch.Tensor:
        """``g <- g_i(x)`` for client i, ``x`` and ``g`` being ``[d]`` rows (no parameter copy).
        ``bind()`` points the module's parameters at x (a row binder's ``bind(j)``; default
        ``fk.FlatParams.bind_(x)``)."""
        t0 = time.perf_counter()
        client = self.clients[i]
        if isinstance(client, LoaderData) and self.batch_size is None:  # one whole pass of the loader
            self.flat.bind_(x, g)
            g.zero_()
            t1 = time.perf_counter()
            with torch.enable_grad():
                _, count = self._loader_pass(client)
            g.div_(count)
            t2 = time.perf_counter()
            self.fwd_bwd_seconds += t2 - t1
            self.grad_seconds += time.perf_counter() - t0
            self.grad_evals += 1
            return g
        if isinstance(client, TensorData):  # in memory: the batch is an index into the tensors
            Xi, yi = client.X, client.y
            idx = client.draw(self.batch_size, self._generator(i))
            if idx is not None:
                idx = idx.to(self.device)
                Xi, yi = Xi[idx], yi[idx]
            pieces = [(Xi, yi, 1.0)] if Xi.shape[0] <= self.chunk else None
        else:
            pieces = list(client.batches(self.batch_size, self._generator(i), self._piece_size(client)))
        if pieces is not None and len(pieces) == 1:
            Xi, yi, _ = pieces[0]
            # One pass: parameters re-pointed at row x, gradients returned by autograd and
            # written into g by one cat (cheaper than zeroing g and accumulating into it).
            if bind is not None:
                bind()
            else:
                self.flat.bind_(x)
            t1 = time.perf_counter()
            with torch.enable_grad():
                grads = torch.autograd.grad(self.loss_fn(self.model(Xi), yi), self._params,
                                            allow_unused=True, materialize_grads=True)
            t2 = time.perf_counter()
            torch.cat([q.reshape(-1) for q in grads], out=g)
        else:  # a large batch, or a Dataset's batch in pieces: chunked backward, accumulating into g
            self.flat.bind_(x, g)
            g.zero_()
            t1 = time.perf_counter()
            with torch.enable_grad():
                if pieces is None:
                    self._accumulate(Xi, yi, 1.0)
                else:
                    for Xp, yp, w in pieces:
                        self._accumulate(Xp, yp, w)
            t2 = time.perf_counter()
        self.fwd_bwd_seconds += t2 - t1
        self.grad_seconds += time.perf_counter() - t0
        self.grad_evals += 1
        return g

    def _generator(self, i: int) -> Optional[torch.Generator]:
        """Client i's minibatch generator; None for full batches, which draw nothing (a population's
        generators are created when first read: 5 kB each, never for a full-batch run)."""
        return None if self.batch_size is None else self.generators[i]

    def _coupled(self, y: Optional[torch.Tensor] = None) -> bool:
        """Whether the samples of a batch with labels ``y`` (None: not read) are coupled: by the model, or by a
        loss that is not a per-sample mean (decided once, before the first split, without reading every label),
        or by a label equal to a class-index loss's ``ignore_index`` in this batch, which that loss leaves out
        of its mean. Judged batch by batch, as a list's clients and a population's built on demand both can
        be, so a population splits the batches its list splits: a list once read every label and split no
        batch if any was ignored, while a population, whose labels are not read, split none at all."""
        if self.coupled is None:
            kind = self.loss_kind or separability(self.model, self.loss_fn, self.probed, every_label=False).loss
            unread = kind.mean is None and classify_loss(self.loss_fn, [torch.zeros(0, dtype=torch.long)])
            self._ignore = ignore_index_of(self.loss_fn) if unread and unread.mean else None
            self.coupled = separability(self.model, self.loss_fn, self.probed,
                                        kind=LossKind(True) if self._ignore is not None else kind).coupled
        if self.coupled or self._ignore is None:
            return bool(self.coupled)
        return y is None or (not y.is_floating_point() and bool((y == self._ignore).any()))

    def _piece_size(self, client) -> int:
        """Samples per piece of a Dataset client's batch: ``chunk``, or no split when coupled."""
        n = getattr(client, "n", None)
        if n is not None and n > self.chunk and self._coupled():
            return sys.maxsize
        return self.chunk

    def _accumulate(self, X, y, weight: float) -> float:
        """Backward of ``weight * loss`` over (X, y), in chunks (weighted by their share, when
        the loss is a mean of independent per-sample losses; one pass otherwise); gradients
        accumulate into the bound grad buffer. Returns the weighted loss."""
        n = X.shape[0]
        step = self.chunk if n <= self.chunk or not self._coupled(y) else n
        total = 0.0
        for s in range(0, n, step):
            Xc, yc = X[s : s + step], y[s : s + step]
            w = weight if Xc.shape[0] == n else weight * Xc.shape[0] / n
            loss = self.loss_fn(self.model(Xc), yc)
            if w != 1.0:
                loss = loss * w
            loss.backward()
            total += float(loss.detach())
        return total

    def _loader_pass(self, client: LoaderData) -> tuple[float, int]:
        """One pass over a DataLoader client, batch b's loss weighted by ``len(b)``; gradients
        accumulate into the bound grad buffer. Returns (weighted loss sum, samples yielded): the
        client's mean is both divided by the count, known only at the end of the pass."""
        f, count = 0.0, 0
        for Xp, yp in client.full_pass():
            f += self._accumulate(Xp, yp, float(Xp.shape[0]))
            count += int(Xp.shape[0])
        return f, count

    # -- aggregation ------------------------------------------------------------------
    def _broadcast(self, v):
        return v

    # -- evaluation -------------------------------------------------------------------
    def full_objective_(self, x, grad_out, *, start: Optional[float] = None, total: Optional[int] = None):
        """f(x) and its gradient (see :meth:`ClientSet.full_objective_`): the module in the mode
        the user left it in (the objective the gradient calls optimise), its buffers and torch's
        random state restored afterwards. A shard of ``total`` clients continues the sums of the
        clients before it: ``grad_out`` holds their gradient sum and ``start`` their loss sum
        (the distributed executor's metric pass, added client after client as one process does)."""
        x = x.detach().clone()
        N = self.num_clients if total is None else int(total)
        with side_effect_free(self.model, self.device):
            self.flat.bind_(x, grad_out)
            if start is None:
                grad_out.zero_()
            f = 0.0 if start is None else float(start)
            with torch.enable_grad():
                for client in self.clients:
                    if isinstance(client, TensorData):
                        f += self._accumulate(client.X, client.y, 1.0 / N)
                    elif isinstance(client, LoaderData):  # its own mean: weights known at the end of the pass
                        if self._scratch is None:
                            self._scratch = torch.empty_like(grad_out)
                        self.flat.bind_(x, self._scratch)
                        self._scratch.zero_()
                        fi, count = self._loader_pass(client)
                        grad_out.add_(self._scratch, alpha=1.0 / (N * count))
                        f += fi / (N * count)
                        self.flat.bind_(x, grad_out)
                    else:
                        for Xp, yp, w in client.batches(None, None, self._piece_size(client)):
                            f += self._accumulate(Xp, yp, w / N)
        return f
