"""The interface between an algorithm and its clients, and the pieces every algorithm shares.

An algorithm (one file per algorithm in this package) never touches a model, a data set or a
loop over parameters. It sees:

* **client stacks**: per-client state is an ``[n, d]`` tensor, one row per client held by this
  process (all ``N`` clients in the in-process simulator, one in a future one-process-per-client
  backend). Per-round state updates are single fused ``fedkernels`` calls on those stacks.
* a :class:`ClientSet`, which does the three things that cross the client / server boundary:

  ============================  ==========================================================
  ``clients.gradients_(X, G)``  client-local work: ``G[i] <- g_i(X[i])``, a fresh minibatch
                                per call (full local gradient when ``batch_size=None``)
  ``clients.mean(S)``           uplink + aggregation: ``(1/N) sum_i S[i]`` -> ``[d]``
  ``clients.broadcast(v)``      downlink: the server's ``[d]`` vector as the clients see it
  ``clients.gossip_(X, W)``     decentralized: ``X <- W X``, each client averaging its
                                neighbours' rows (no server; DEPOSITUM)
  ``clients.participants()``    this round's sampled client set S (partial participation)
  ============================  ==========================================================

  plus buffer allocation (``new_stack``, ``workspace``). A torch.distributed backend implements
  ``mean`` with an all-reduce and ``broadcast`` with a broadcast from the server rank; a vmap
  backend implements ``gradients_`` with ``torch.func``; the algorithm files do not change.
  ``mean`` and ``broadcast`` count d-vectors per client (``clients.comm``), so the README's
  communication column is measured, not just declared.

:class:`SequentialClients` is the first backend: every client in this process, one after the
other, sharing one ``nn.Module`` whose parameters are re-pointed at the stack row being evaluated
(``fk.FlatParams.row_binder``, one cached binder per stack), so no parameters are copied.

**Partial participation** (ALGORITHMS.md §1.4). ``simulate(..., participation=0.5)`` or
``clients_per_round=k`` makes ``clients.participants()`` draw, once per round, k clients uniformly
without replacement from the client set's own generator (``participation_rng``, seeded from the
run's seed, stream 2, so it is saved by ``rng_state`` with the minibatch generators). It returns
their sorted ids (a LongTensor), or ``None`` under full participation. An algorithm that supports
it works on *compact* ``[k, d]`` stacks whose row j is client ``ids[j]``:
``gradients_(X, G, ids)``, ``mean(S, ids)`` = ``(1/k) sum_j S[j]`` (or ``(1/N) sum_j S[j]`` with
``divisor=N``, e.g. SCAFFOLD's server control variate and FedDR's running average of the latest
uploads), ``workspace(name, rows=k)``, and :func:`rows_` / :func:`put_rows_` to gather / scatter
the participants' rows of per-client state; the other clients' state stays as it was (stale).
With ``ids = None`` every helper is the full-participation path, bit for bit. Algorithms declare
``partial_participation = True``; ``simulate`` rejects a sampled run for the others with a
``ValueError`` giving ``participation_note``. ``up``/``down`` count d-vectors per *participating*
client.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
import time
import warnings
from typing import Callable, ClassVar, NamedTuple, Optional, Sequence

import numpy as np
import torch
import torch.utils.data
from torch import nn

import fedkernels as fk

__all__ = [
    "ClientSet",
    "SequentialClients",
    "CommCounter",
    "Costs",
    "Algorithm",
    "check_prox_step",
    "is_zero",
    "prox",
    "prox_",
    "sgd_step_",
    "load_rows_",
    "rows_",
    "put_rows_",
    "damped_step_",
    "warn_smooth",
]


# --------------------------------------------------------------------------- #
# Client / aggregation interface
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class CommCounter:
    """d-dimensional vectors sent per client: ``up`` (client -> server), ``down`` (server -> client)."""

    up: int = 0
    down: int = 0


class ClientSet(abc.ABC):
    """What an algorithm may ask of its clients (see the module docstring).

    Attributes:
        num_clients: N, the number of clients in the federation.
        rows: the number of client rows held by this process (N for the in-process simulator).
        dim: d, the flat model size.
        dtype, device: of every stack and vector.
        comm: CommCounter, incremented by ``mean`` (up) and ``broadcast`` (down).
    """

    num_clients: int
    rows: int
    dim: int
    dtype: torch.dtype
    device: torch.device

    def __init__(self):
        self.comm = CommCounter()
        self.grad_seconds = 0.0  # time in gradient calls (binding, batch sampling, forward, backward)
        self.fwd_bwd_seconds = 0.0  # of which forward + backward passes only
        self.grad_evals = 0  # number of per-client gradient calls
        self._workspace: dict[tuple, torch.Tensor] = {}
        self.clients_per_round: Optional[int] = None  # k < N: partial participation (set_participation)

    # -- client-local work ------------------------------------------------------------
    @abc.abstractmethod
    def gradients_(self, X: torch.Tensor, G: torch.Tensor, ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``G[j] <- g_i(X[j])`` with i = ``ids[j]`` (i = j for every row held here when ``ids`` is
        None), a fresh minibatch per call. Returns G."""

    # -- participation ------------------------------------------------------------------
    def set_participation(self, clients_per_round: Optional[int], seed: int = 0) -> None:
        """Sample ``clients_per_round`` clients per round (None or N: full participation), from a
        generator seeded by (``seed``, stream 2)."""
        n = self.num_clients
        if clients_per_round is None or clients_per_round == n:
            self.clients_per_round = None
            return
        if isinstance(clients_per_round, bool) or not isinstance(clients_per_round, (int, np.integer)) \
                or not 1 <= clients_per_round <= n:
            raise ValueError(f"clients_per_round must be an int in [1, N = {n}], got {clients_per_round!r}")
        self.clients_per_round = int(clients_per_round)
        self.participation_rng = torch.Generator().manual_seed(_seeds(seed, 1, stream=2)[0])

    def participants(self) -> Optional[torch.Tensor]:
        """This round's participating clients: sorted ids (LongTensor, ``clients_per_round`` of them,
        uniformly without replacement), or None under full participation. Call once per round."""
        if self.clients_per_round is None:
            return None
        perm = torch.randperm(self.num_clients, generator=self.participation_rng)
        return perm[: self.clients_per_round].sort().values.to(self.device)

    def active_rows(self, ids: Optional[torch.Tensor]) -> int:
        """Rows of a compact participant stack: ``len(ids)``, or ``rows`` when ids is None."""
        return self.rows if ids is None else int(ids.numel())

    # -- aggregation ------------------------------------------------------------------
    def mean(self, S: torch.Tensor, ids: Optional[torch.Tensor] = None, *, divisor: Optional[int] = None) -> torch.Tensor:
        """Uplink of one d-vector per (participating) client and their uniform average
        ``(1/n) sum_j S[j]`` over the n rows of S, or ``(1/divisor) sum_j S[j]`` (e.g. divisor = N
        with a participant stack: the server's update of an average over all clients)."""
        self.comm.up += 1
        return self._mean(S, divisor)

    def broadcast(self, v: torch.Tensor) -> torch.Tensor:
        """Downlink of one d-vector (the server's ``v``) to every (participating) client; returns the clients' copy."""
        self.comm.down += 1
        return self._broadcast(v)

    def gossip_(self, X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """Decentralized mixing, in place: ``X <- W X`` over the ``[N, d]`` client stack (W dense or
        sparse COO, ``[N, N]``). Client i sends its row to, and receives the rows of, its deg(i)
        neighbours: ``up``/``down`` grow by the mean degree."""
        self.comm.up += self._mean_degree(W)
        self.comm.down += self._mean_degree(W)
        return self._gossip_(X, W)

    @abc.abstractmethod
    def _mean(self, S: torch.Tensor, divisor: Optional[int] = None) -> torch.Tensor: ...

    @abc.abstractmethod
    def _broadcast(self, v: torch.Tensor) -> torch.Tensor: ...

    def _gossip_(self, X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """In-process mixing: one (sparse or dense) matrix product over the stack."""
        if self.rows != self.num_clients:
            raise NotImplementedError(f"{type(self).__name__} holds {self.rows} of {self.num_clients} clients: "
                                      f"gossip needs a neighbour exchange, which this backend does not implement")
        buf = self.workspace("_gossip")
        torch.mm(W, X, out=buf)
        return X.copy_(buf)

    def _mean_degree(self, W: torch.Tensor) -> float:
        n = W.shape[0]
        if W.layout == torch.sparse_coo:
            vals = W._values()
            nnz = int(torch.count_nonzero(vals))
            diag = W._indices()
            nnz_diag = int(torch.count_nonzero(vals[diag[0] == diag[1]]))
        else:
            nnz = int(torch.count_nonzero(W))
            nnz_diag = int(torch.count_nonzero(torch.diagonal(W)))
        deg = (nnz - nnz_diag) / n
        return int(deg) if deg == int(deg) else deg

    # -- buffers ----------------------------------------------------------------------
    def new_vector(self, fill: Optional[torch.Tensor | float] = None) -> torch.Tensor:
        """A new ``[d]`` vector: zeros, a constant, or a copy of a ``[d]`` tensor."""
        return self._new((self.dim,), fill)

    def new_stack(self, fill: Optional[torch.Tensor | float] = None) -> torch.Tensor:
        """A new ``[rows, d]`` client stack: zeros, a constant, or every row a copy of a ``[d]`` tensor."""
        return self._new((self.rows, self.dim), fill)

    def workspace(self, name: str, rows: Optional[int] = None) -> torch.Tensor:
        """A cached ``[rows, d]`` scratch stack (contents undefined), reused across rounds; ``rows``
        defaults to the rows held here (a participant stack: ``active_rows(ids)``)."""
        rows = self.rows if rows is None else int(rows)
        buf = self._workspace.get((name, rows))
        if buf is None:
            buf = self._workspace[(name, rows)] = torch.empty(rows, self.dim, dtype=self.dtype, device=self.device)
        return buf

    def _new(self, shape, fill):
        out = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if fill is not None:
            if isinstance(fill, torch.Tensor):
                out.copy_(fill.to(dtype=self.dtype, device=self.device).expand(shape))
            else:
                out.fill_(float(fill))
        return out

    # -- checkpointing ------------------------------------------------------------------
    def rng_state(self) -> dict:
        """States of every ``torch.Generator`` this client set owns (attributes holding one or a
        list of them: minibatch samplers, participant samplers), for checkpoints."""
        out = {}
        for name, v in vars(self).items():
            if isinstance(v, torch.Generator):
                out[name] = v.get_state()
            elif isinstance(v, (list, tuple)) and v and all(isinstance(g, torch.Generator) for g in v):
                out[name] = [g.get_state() for g in v]
        return out

    def set_rng_state(self, states: dict) -> None:
        """Restore what :meth:`rng_state` returned."""
        for name, st in states.items():
            v = getattr(self, name)
            if isinstance(v, torch.Generator):
                v.set_state(st)
            else:
                if len(v) != len(st):
                    raise ValueError(f"{name}: {len(st)} saved generator states for {len(v)} generators")
                for g, s in zip(v, st):
                    g.set_state(s)

    # -- evaluation (outside the algorithm) ------------------------------------------------
    @abc.abstractmethod
    def full_objective_(self, x: torch.Tensor, grad_out: torch.Tensor) -> float:
        """Metric pass: returns f(x) = (1/N) sum_i f_i(x) on all training data and writes
        the full gradient of f into ``grad_out``. Not counted as communication."""


def _as_tensors(client, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X, y)`` tensors from a pair or a Dataset; floating-point data take the model's dtype."""
    if isinstance(client, (tuple, list)) and len(client) == 2:
        X, y = client
    elif isinstance(client, torch.utils.data.TensorDataset):
        X, y = client.tensors[0], client.tensors[1]
    elif isinstance(client, torch.utils.data.Dataset):
        items = [client[j] for j in range(len(client))]
        X = torch.stack([torch.as_tensor(a) for a, _ in items])
        y = torch.stack([torch.as_tensor(b) for _, b in items])
    else:
        raise TypeError(f"a client must be an (X, y) pair of tensors or a torch Dataset, got {type(client).__name__}")
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    if X.shape[0] != y.shape[0] or X.shape[0] == 0:
        raise ValueError(f"client data must be non-empty with matching lengths, got X {tuple(X.shape)}, y {tuple(y.shape)}")
    X = X.to(device=device, dtype=dtype if X.is_floating_point() else X.dtype)
    y = y.to(device=device, dtype=dtype if y.is_floating_point() else y.dtype)
    return X, y


def _seeds(seed: int, n: int, stream: int = 0) -> list[int]:
    """n independent 63-bit seeds derived from (``seed``, ``stream``); stable across runs and
    backends. Stream 0: the clients' minibatch generators; stream 1: the server's generator."""
    ss = np.random.SeedSequence([int(stream), int(seed)])
    return [int(s) for s in ss.generate_state(n, dtype=np.uint64) >> np.uint64(1)]


class SequentialClients(ClientSet):
    """In-process simulator: all N clients, evaluated one after another on one shared module.

    Args:
        model: the ``nn.Module``; wrapped in ``fk.FlatParams`` (its parameters become views).
        loss_fn: ``loss_fn(model(X_batch), y_batch)`` -> scalar mean loss.
        data: one ``(X, y)`` pair (or Dataset) per client.
        batch_size: ``None`` (or >= a client's size) for full local gradients; otherwise each
            gradient call samples ``batch_size`` indices without replacement, using the client's
            own ``torch.Generator`` (seeded from ``seed`` and the client index).
        seed: the run's seed.
        chunk: full-data passes are split into chunks of at most this many samples (a chunk
            weighted by its share of the data, so the result is the same mean loss).
        flat: an existing ``fk.FlatParams(model)`` to reuse.

    Module buffers (e.g. BatchNorm running statistics) are shared by all clients here.
    ``grad_seconds`` / ``grad_evals`` accumulate the time in, and number of, gradient calls
    (binding the row, batch sampling, forward, backward); ``fwd_bwd_seconds`` the forward and
    backward passes alone.
    """

    def __init__(self, model: nn.Module, loss_fn: Callable, data: Sequence, batch_size: Optional[int] = None,
                 seed: int = 0, chunk: int = 2048, flat: Optional[fk.FlatParams] = None):
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
        self.data = [_as_tensors(c, self.dtype, self.device) for c in data]
        self.num_clients = self.rows = len(self.data)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.chunk = int(chunk)
        self.generators = [torch.Generator().manual_seed(s) for s in _seeds(seed, self.num_clients)]
        self._params = [p for p in model.parameters() if p.requires_grad]  # FlatParams' order
        if [p.numel() for p in self._params] != list(self.flat.sizes):
            raise ValueError("flat must be fk.FlatParams(model) of this model")
        self._binders: dict[tuple, Callable[[int], None]] = {}

    # -- client-local work ------------------------------------------------------------
    def gradients_(self, X, G, ids=None):
        binder = self._binder(X)
        for j, i in enumerate(range(self.rows) if ids is None else ids.tolist()):
            self.local_gradient_(i, X[j], G[j], bind=None if binder is None else functools.partial(binder, j))
        return G

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
        Xi, yi = self.data[i]
        n = Xi.shape[0]
        if self.batch_size is not None and self.batch_size < n:
            idx = torch.randperm(n, generator=self.generators[i])[: self.batch_size].to(self.device)
            Xi, yi = Xi[idx], yi[idx]
        if Xi.shape[0] <= self.chunk:
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
        else:  # large full batch: chunked backward, accumulating into g
            self.flat.bind_(x, g)
            g.zero_()
            t1 = time.perf_counter()
            with torch.enable_grad():
                self._accumulate(Xi, yi, 1.0)
            t2 = time.perf_counter()
        self.fwd_bwd_seconds += t2 - t1
        self.grad_seconds += time.perf_counter() - t0
        self.grad_evals += 1
        return g

    def _accumulate(self, X, y, weight: float) -> float:
        """Backward of ``weight * mean loss`` over (X, y), in chunks; gradients accumulate into
        the bound grad buffer. Returns the weighted loss."""
        n = X.shape[0]
        total = 0.0
        for s in range(0, n, self.chunk):
            Xc, yc = X[s : s + self.chunk], y[s : s + self.chunk]
            w = weight if Xc.shape[0] == n else weight * Xc.shape[0] / n
            loss = self.loss_fn(self.model(Xc), yc)
            if w != 1.0:
                loss = loss * w
            loss.backward()
            total += float(loss.detach())
        return total

    # -- aggregation ------------------------------------------------------------------
    def _mean(self, S, divisor=None):
        return S.mean(dim=0) if divisor is None else S.sum(dim=0).div_(divisor)

    def _broadcast(self, v):
        return v

    # -- evaluation -------------------------------------------------------------------
    def full_objective_(self, x, grad_out):
        x = x.detach().clone()
        self.flat.bind_(x, grad_out)
        grad_out.zero_()
        f = 0.0
        with torch.enable_grad():
            for Xi, yi in self.data:
                f += self._accumulate(Xi, yi, 1.0 / self.num_clients)
        return f


# --------------------------------------------------------------------------- #
# Algorithm base
# --------------------------------------------------------------------------- #


class Costs(NamedTuple):
    """Declared per-round costs (ALGORITHMS.md §0), for N clients with full participation."""

    client_prox: int  # prox evaluations on clients, all clients together
    server_prox: int  # prox evaluations on the server
    up: int  # d-vectors each client sends (DEPOSITUM: 2·deg, the mean over clients for irregular graphs)
    down: int  # d-vectors each client receives
    grads: float  # stochastic gradients per client (expected value 1/p for SCAFFNEW)
    comm_every: int = 1  # up/down as declared every comm_every-th round, none in between (DEPOSITUM: τ)


class Algorithm(abc.ABC):
    """An algorithm = hyper-parameters + ``init`` + ``round`` + ``report``.

    Subclasses are frozen dataclasses of hyper-parameters (spec symbols) and define:

    * ``init(x0, clients) -> State``: a NamedTuple named after the algorithm.
    * ``round(state, clients, reg, rng) -> State``: one communication round. Tensors of the
      state are updated in place (the returned NamedTuple holds the same buffers, with the
      round counter advanced); ``rng`` is the run's server-side ``torch.Generator``.
    * ``report(state, reg) -> [d]``: the model the algorithm outputs (ALGORITHMS.md §3 M7).
    * ``validate(reg)``: raise ``ValueError`` citing the spec rule if (hyper-parameters, h) are
      outside the algorithm's validity range (§7.4).
    * ``costs(N)``: declared per-round prox counts and communication (checked by the tests).
    * ``metric_step()``: default step s of the prox-gradient mapping G_s (§3 M1).
    * ``normal_map_point(state)``: ``(z, lam)`` if the state holds a normal-map variable z with
      model ``prox_{lam h}(z)`` (§3 M3), else None.
    * ``state_metrics(state, clients)``: algorithm-specific metrics of the state (e.g. DEPOSITUM's
      consensus errors, §3 M5), merged into the metrics on metric rounds; default none.

    ``partial_participation``: True if ``round`` samples ``clients.participants()`` (§1.4);
    otherwise ``simulate`` rejects ``participation`` / ``clients_per_round`` citing
    ``participation_note``.
    """

    name: ClassVar[str]
    spec: ClassVar[str]  # the ALGORITHMS.md section implemented
    status: ClassVar[str]  # EXACT / HC-RECON / RECONSTRUCTED (ALGORITHMS.md §0)
    reports: ClassVar[str]  # which variable ``report`` returns
    switches: ClassVar[tuple[str, ...]] = ()  # reconstruction switches (field names)
    composite: ClassVar[bool] = True  # False: h never enters the update (smooth method)
    partial_participation: ClassVar[bool] = False  # True: round() works on a sampled client set
    participation_note: ClassVar[str] = "the spec defines it for full participation only (ALGORITHMS.md §1.4)"

    @abc.abstractmethod
    def init(self, x0: torch.Tensor, clients: ClientSet): ...

    @abc.abstractmethod
    def round(self, state, clients: ClientSet, reg: fk.Regularizer, rng: Optional[torch.Generator] = None): ...

    @abc.abstractmethod
    def report(self, state, reg: fk.Regularizer) -> torch.Tensor: ...

    @abc.abstractmethod
    def costs(self, num_clients: int) -> Costs: ...

    @abc.abstractmethod
    def metric_step(self) -> float: ...

    def validate(self, reg: fk.Regularizer) -> None:
        if not isinstance(reg, fk.Regularizer):
            raise TypeError(f"regularizer must be a fedkernels Regularizer (e.g. fk.L1(0.1)), got {type(reg).__name__}")

    def normal_map_point(self, state):
        return None

    def state_metrics(self, state, clients: ClientSet) -> dict:
        return {}

    def hparams(self) -> dict:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- #
# Shared checks and small fused helpers
# --------------------------------------------------------------------------- #


def positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def one_of(name: str, value, options) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value


def check_prox_step(algorithm: str, reg: fk.Regularizer, step: float, what: str, rule: str) -> None:
    """Reject a prox step with ``step * rho >= 1`` (the prox of a rho-weakly convex h is unique
    and (1/(1 - step rho))-Lipschitz only when step * rho < 1, ALGORITHMS.md §1.3).

    ``what`` names the step in the algorithm's symbols (e.g. "alpha"), ``rule`` the spec rule.
    """
    rho = float(getattr(reg, "rho", 0.0))
    if rho > 0 and step * rho >= 1.0:
        raise ValueError(
            f"{algorithm}: {what} = {step:g} violates {rule}: {reg!r} is rho-weakly convex with "
            f"rho = {rho:g}, so the prox step must satisfy step * rho < 1 (step < 1/rho = {1.0 / rho:g}); "
            f"got step * rho = {step * rho:g}. The prox of a weakly convex h is unique and Lipschitz only "
            f"in that regime (ALGORITHMS.md §1.3, §7.4)."
        )


def is_zero(reg: fk.Regularizer) -> bool:
    """True for h = 0 (its prox is the identity and is skipped)."""
    return isinstance(reg, fk.Zero) or (isinstance(reg, fk.Scaled) and (reg.kappa == 0 or is_zero(reg.base)))


def prox_(X: torch.Tensor, reg: fk.Regularizer, step: float) -> torch.Tensor:
    """In place ``X <- prox_{step h}(X)`` (each row of a stack); nothing to do for h = 0."""
    if not is_zero(reg):
        fk.fused.prox_(X, reg, step, fast=True)
    return X


def prox(x: torch.Tensor, reg: fk.Regularizer, step: float) -> torch.Tensor:
    """Out of place ``prox_{step h}(x)`` through the low-overhead kernel path."""
    out = x.detach().clone(memory_format=torch.contiguous_format)
    if not is_zero(reg):
        fk.fused.prox_(out, reg, step, fast=True)
    return out


def sgd_step_(X: torch.Tensor, G: torch.Tensor, lr: float) -> torch.Tensor:
    """In place ``X <- X - lr G`` (G may be one [d] row shared by all rows of X)."""
    return fk.raw.prox_grad_step_(X, G, lr, "zero", 0.0)


def load_rows_(X: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Every row of the stack X <- v (a [d] vector), or X <- v for a same-shape v."""
    return X.copy_(v.expand_as(X))


def rows_(T: torch.Tensor, ids: Optional[torch.Tensor], out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The participants' rows of a per-client stack (a gathered copy, into ``out`` if given), or
    T itself under full participation (``ids`` None)."""
    if ids is None:
        return T
    return torch.index_select(T, 0, ids, out=out) if out is not None else T.index_select(0, ids)


def put_rows_(T: torch.Tensor, ids: Optional[torch.Tensor], V: torch.Tensor) -> torch.Tensor:
    """Write a participant stack V back into rows ``ids`` of T (nothing to do when ids is None:
    V is T)."""
    if ids is not None:
        T.index_copy_(0, ids, V)
    return T


def damped_step_(X: torch.Tensor, G: torch.Tensor, C: torch.Tensor, lr: float, mu: float) -> torch.Tensor:
    """In place ``X <- X − lr (G + C + mu X)`` = ``(1 − lr mu) X − lr (G + C)``: a gradient step on
    ``f_i(x) + <C, x> + (mu/2)||x||²`` — the proximal-point local solvers of FedDR, FedADMM and
    FedProx, whose anchor term ``mu (x − a)`` is ``mu x + C`` with ``C = −mu a`` (+ duals) fixed
    for the round. Two passes (a scale and the fused control-variate step)."""
    if mu != 0.0:
        X.mul_(1.0 - lr * mu)
    return fk.raw.cv_step_(X, G, C, lr)


def warn_smooth(algorithm: str, reg: fk.Regularizer) -> None:
    """Smooth methods (FedAvg, SCAFFOLD, SCAFFNEW) never apply h; say so when h is not zero."""
    if not is_zero(reg):
        warnings.warn(
            f"{algorithm} is a smooth method: its update ignores the regularizer {reg!r}; "
            f"the metrics still report f + h of its model (ALGORITHMS.md §5)",
            UserWarning,
            stacklevel=3,
        )
