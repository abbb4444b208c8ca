"""The client interface: what an algorithm may ask of its clients, whatever executes them.

An algorithm never touches a model, a data set or a loop over parameters. It sees:

* **client stacks**: per-client state is an ``[n, d]`` tensor, one row per client held by this
  process (all ``N`` clients in one process; a shard of them per rank when distributed).
  Per-round state updates are single fused ``fedkernels`` calls on those stacks.
* a :class:`ClientSet`, which does the things that cross the client / server boundary:

  ============================  ==========================================================
  ``clients.gradients_(X, G)``  client-local work: ``G[i] <- g_i(X[i])``, a fresh minibatch
                                per call (full local gradient when ``batch_size=None``)
  ``clients.mean(S)``           uplink + aggregation: ``(1/N) sum_i S[i]`` -> ``[d]``
  ``clients.broadcast(v)``      downlink: the server's ``[d]`` vector as the clients see it
  ``clients.gossip_(X, W)``     decentralized: ``X <- W X``, each client averaging its
                                neighbours' rows (no server; DEPOSITUM)
  ``clients.participants()``    this round's sampled client set S (partial participation)
  ============================  ==========================================================

  plus buffer allocation (``new_stack``, ``workspace``). Executors differ only in how they answer
  these: :class:`~python_algos.clients.SequentialClients` evaluates one client after another,
  :class:`~python_algos.clients.BatchedClients` all of them in vectorized passes. ``mean`` and
  ``broadcast`` count d-vectors per client (``clients.comm``), so the communication column of
  docs/algorithms.md is measured, not just declared.

**Partial participation** (docs/algorithms.md, "Partial participation").
``simulate(..., participation=0.5)`` or ``clients_per_round=k`` makes ``clients.participants()``
draw, once per round, k clients uniformly without replacement (``randperm(N)[:k]``; from N = 2^16 with
k <= N/16, the first k distinct of uniform draws: :func:`distinct_draws`) from the client set's own generator
(``participation_rng``, seeded from the run's seed, stream 2, so it is saved by ``rng_state`` with
the minibatch generators). It returns their sorted ids (a LongTensor), or ``None`` under full
participation. An algorithm that supports it works on *compact* ``[k, d]`` stacks whose row j is
client ``ids[j]``: ``gradients_(X, G, ids)``, ``mean(S, ids)`` = ``(1/k) sum_j S[j]`` (or
``(1/N) sum_j S[j]`` with ``divisor=N``, e.g. SCAFFOLD's server control variate and FedDR's
running average of the latest uploads), ``workspace(name, rows=k)``, and ``rows_`` / ``put_rows_``
(:mod:`python_algos.algorithms.steps`) to gather / scatter the participants' rows of per-client
state; the other clients' state stays as it was (stale). With ``ids = None`` every helper is the
full-participation path, bit for bit. ``up``/``down`` count d-vectors per *participating* client.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, Optional

import numpy as np
import torch
import torch.utils.data

from .row_sum import sum_rows
from .state_plan import LazyRow, check_dense_fits

__all__ = ["ClientSet", "CommCounter", "client_generators", "seeds"]


@dataclasses.dataclass
class CommCounter:
    """d-dimensional vectors sent per client: ``up`` (client -> server), ``down`` (server -> client);
    and, for executors that move data between processes (``ClientSet.measures_bytes``), the bytes
    this process sent / received for the algorithm."""

    up: int = 0
    down: int = 0
    sent_bytes: int = 0
    recv_bytes: int = 0


class ClientSet(abc.ABC):
    """What an algorithm may ask of its clients (see the module docstring).

    Attributes:
        num_clients: N, the number of clients in the federation.
        rows: the number of client rows held by this process (N for the in-process simulator).
        dim: d, the flat model size.
        dtype, device: of every stack and vector.
        comm: CommCounter, incremented by ``mean`` (up) and ``broadcast`` (down).
    """

    executor: ClassVar[str] = "custom"  # the name simulate() records (History.executor, summary.json)
    measures_bytes: ClassVar[bool] = False  # True: comm.sent_bytes / recv_bytes are real network bytes
    world_size: int = 1  # processes sharing the clients (DistributedClients: the ranks)
    lazy_stacks: bool = False  # new_stack gives stride-0 views (a store's init: state_plan.StatePlan.init)
    num_clients: int
    rows: int
    dim: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def unsupported(cls, model) -> str:
        """Why this executor cannot run ``model`` ("" if it can): ``executor="auto"`` skips it,
        and asking for it by name raises ``ValueError`` with this text."""
        return ""

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
        self.participation_rng = torch.Generator().manual_seed(seeds(seed, 1, stream=2)[0])

    def participants(self) -> Optional[torch.Tensor]:
        """This round's participating clients: sorted ids (LongTensor, ``clients_per_round`` of them,
        uniformly without replacement), or None under full participation. Call once per round."""
        if self.clients_per_round is None:
            return None
        return self._draw(self.participation_rng).to(self.device)

    def upcoming(self) -> Optional[torch.Tensor]:
        """The next round's participants as :meth:`participants` will draw them, in this process's rows
        (:meth:`held`), drawn from a copy of the generator (which does not move, so the run's draws are
        unchanged); None under full participation. A disk store reads their rows ahead (state_store.prefetch)."""
        if self.clients_per_round is None:
            return None
        ahead = torch.Generator()
        ahead.set_state(self.participation_rng.get_state())
        return self.held(self._draw(ahead))

    def held(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows, in this process's stacks, of the clients ``ids`` that it holds (all, here; a rank's own)."""
        return ids

    def _draw(self, generator: torch.Generator) -> torch.Tensor:
        n, k = self.num_clients, self.clients_per_round
        if n >= DRAW_DISTINCT_MIN and 16 * k <= n:  # randperm is O(N): 69 ms a round at N = 10^6
            return distinct_draws(n, k, generator).sort().values
        return torch.randperm(n, generator=generator)[:k].sort().values

    def stream_chunks(self, size: int) -> list:
        """The ``(first, end)`` ranges of clients a streamed round runs one after another
        (python_algos/algorithms/streamed.py): ``size`` consecutive clients each."""
        return [(a, min(a + size, self.rows)) for a in range(0, self.rows, size)]

    def active_rows(self, ids: Optional[torch.Tensor]) -> int:
        """Rows of a compact participant stack: ``len(ids)``, or ``rows`` when ids is None."""
        return self.rows if ids is None else int(ids.numel())

    # -- aggregation ------------------------------------------------------------------
    def mean(self, S: torch.Tensor, ids: Optional[torch.Tensor] = None, *,
             divisor: Optional[int] = None) -> torch.Tensor:
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

    def _mean(self, S: torch.Tensor, divisor: Optional[int] = None) -> torch.Tensor:
        """The rows' sum in :mod:`.row_sum`'s fixed order, over ``divisor`` or the rows: a round that
        streams its clients in chunks (the same order, chunk after chunk) gives these bits."""
        return sum_rows(S).div_(S.shape[0] if divisor is None else divisor)

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
        """A new ``[rows, d]`` client stack: zeros, a constant, or every row a copy of a ``[d]`` tensor.
        While ``lazy_stacks`` (a run with a client-state store, :mod:`.state_plan`, during ``init``):
        a read-only stride-0 view of that one row, which the store takes over without an [N, d] copy."""
        if self.lazy_stacks:  # one row: a LazyRow, so that a write is refused as with more rows
            lazy = self._new((self.dim,), fill).expand(self.rows, self.dim)
            return lazy if self.rows > 1 else lazy.as_subclass(LazyRow)
        if torch.device(self.device).type == "cpu":  # host memory (a GPU's allocator names its own limit)
            check_dense_fits(self.rows * self.dim * torch.empty((), dtype=self.dtype).element_size(),
                             f"a dense [{self.rows}, {self.dim}] client stack")
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
        """States of every ``torch.Generator`` this client set owns, for checkpoints: a participant
        sampler's; the minibatch samplers' (``population.LazyGenerators``) of the clients that drew
        one, by global client index, so the checkpoint grows with the clients trained, not with N; a
        list's (a deployed node's one client)."""
        out = {}
        for name, v in vars(self).items():
            if isinstance(v, torch.Generator):
                out[name] = v.get_state()
            elif isinstance(v, (list, tuple)) and v and all(isinstance(g, torch.Generator) for g in v):
                out[name] = [g.get_state() for g in v]
            elif hasattr(v, "touched_states"):  # generators created when first used (population.LazyGenerators)
                out[name] = v.touched_states()
        return out

    def set_rng_state(self, states: dict) -> None:
        """Restore what :meth:`rng_state` returned."""
        for name, st in states.items():
            v = getattr(self, name)
            if isinstance(v, torch.Generator):
                v.set_state(st)
            elif hasattr(v, "set_touched_states"):
                v.set_touched_states(st)
            else:
                if len(v) != len(st):
                    raise ValueError(f"{name}: {len(st)} saved generator states for {len(v)} generators")
                for g, s in zip(v, st):
                    g.set_state(s)

    # -- evaluation (outside the algorithm) ------------------------------------------------
    def report(self, algorithm, state, reg) -> "torch.Tensor":
        """``algorithm.report(state, reg)``, the model on which metrics are taken (a sharded
        executor reduces what it reads from client stacks over all ranks)."""
        return algorithm.report(state, reg)

    def state_metrics(self, algorithm, state) -> dict:
        """``algorithm.state_metrics(state, self)`` (reduced over ranks by a sharded executor)."""
        return algorithm.state_metrics(state, self)

    def any_rank(self, flag: bool) -> bool:
        """``flag``, agreed by every process sharing the clients (true if true anywhere), so that
        a decision to stop is taken by all of them together."""
        return bool(flag)

    @abc.abstractmethod
    def full_objective_(self, x: torch.Tensor, grad_out: torch.Tensor) -> float:
        """Metric pass: returns f(x) = (1/N) sum_i f_i(x) on all training data and writes
        the full gradient of f into ``grad_out``. Not counted as communication.

        f is the objective the algorithm optimises: the module runs in the mode the user left it
        in (normally training mode, as in every gradient call: a BatchNorm normalises by each
        client's batch statistics), and each client's f_i is its loss over all its samples. The
        pass has no side effects: module buffers (BatchNorm running statistics,
        ``num_batches_tracked``) and torch's global random state are restored afterwards, so taking
        metrics, or how often, never changes the run; nor does the executor's evaluation chunk."""



#: from this N on, a cohort of k <= N/16 is drawn as the first k distinct of uniform draws (O(k)), not by randperm
DRAW_DISTINCT_MIN = 1 << 16


def distinct_draws(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """k distinct ids in [0, n), uniformly without replacement: the first k distinct values of i.i.d.
    uniform draws (every k-subset equally likely, by symmetry), drawn in blocks from ``generator``."""
    got: dict = {}  # insertion-ordered: the first k distinct
    while len(got) < k:
        for v in torch.randint(n, (2 * (k - len(got)),), generator=generator).tolist():
            got.setdefault(v, None)
            if len(got) == k:
                break
    return torch.tensor(list(got), dtype=torch.long)


def seeds(seed: int, n: int, stream: int = 0) -> list[int]:
    """n independent 63-bit seeds derived from (``seed``, ``stream``); stable across runs and
    backends. Stream 0: the clients' minibatch generators; stream 1: the server's generator."""
    ss = np.random.SeedSequence([int(stream), int(seed)])
    return [int(s) for s in ss.generate_state(n, dtype=np.uint64) >> np.uint64(1)]



def client_generators(seed: int, n: int, first_client: int = 0) -> list:
    """The minibatch generators of clients ``first_client .. first_client + n - 1`` as a list: client
    i's is seeded by ``seeds(seed, ·)[i]`` (stream 0), whichever executor or shard holds it. The
    executors create theirs when first read (``population.LazyGenerators``, the same seeds); a list is
    for a deployed node's one client, whose node files keep its state as a list."""
    return [torch.Generator().manual_seed(s) for s in seeds(seed, first_client + n)[first_client:]]
