"""The algorithm interface: frozen hyper-parameters + ``init`` / ``round`` / ``report``.

Every algorithm file subclasses :class:`Algorithm`, reaches its clients only through a
:class:`~python_algos.clients.ClientSet`, and updates ``[n, d]`` stacks with fused kernels
(the shared step helpers are in :mod:`python_algos.algorithms.steps`).

Every server–client algorithm subclasses :class:`ServerClientAlgorithm`: it is written as one
program per side (``client_update`` / ``server_update`` / ``client_receive``, the messages named
by ``messages()``), and its ``round`` is composed from them once, here, for every executor.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import ClassVar, NamedTuple, Optional

import numpy as np
import torch

import fedkernels as fk

from ..clients.base import ClientSet
from ..clients.state_store import read_ahead
from .steps import put_rows_, rows_
from .streamed import is_streamed, streamed_round

__all__ = ["Algorithm", "ServerClientAlgorithm", "Messages", "Costs", "positive", "positive_int", "one_of",
           "check_prox_step"]


class Costs(NamedTuple):
    """Declared per-round costs (docs/algorithms.md §0), for N clients with full participation."""

    client_prox: int  # prox evaluations on clients, all clients together
    server_prox: int  # prox evaluations on the server
    up: int  # d-vectors each client sends (DEPOSITUM: 2·deg, the mean over clients for irregular graphs)
    down: int  # d-vectors each client receives
    grads: float  # stochastic gradients per client (expected value 1/p for SCAFFNEW)
    comm_every: int = 1  # up/down as declared every comm_every-th round, none in between (DEPOSITUM: τ)


class Algorithm(abc.ABC):
    """An algorithm = hyper-parameters + ``init`` + ``round`` + ``report``.

    Subclasses are frozen dataclasses of hyper-parameters (spec symbols) and define:

    * ``init(x0, clients) -> State``: a NamedTuple named after the algorithm, whose class attribute
      ``client_fields`` names its per-client ``[N, d]`` stacks (``()`` if none): a distributed run
      shards, re-cuts and all-reduces exactly these (a 2-D server field may have N rows too).
    * ``round(state, clients, reg, rng) -> State``: one communication round (composed from the
      client and server programs by :class:`ServerClientAlgorithm`). Tensors of the
      state are updated in place (the returned NamedTuple holds the same buffers, with the
      round counter advanced); ``rng`` is the run's server-side ``torch.Generator``.
    * ``report(state, reg) -> [d]``: the model the algorithm outputs (docs/algorithms.md §3 M7).
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
    spec: ClassVar[str]  # the docs/algorithms.md section implemented
    status: ClassVar[str]  # EXACT / HC-RECON / RECONSTRUCTED (docs/algorithms.md §0)
    reports: ClassVar[str]  # which variable ``report`` returns
    switches: ClassVar[tuple[str, ...]] = ()  # reconstruction switches (field names)
    composite: ClassVar[bool] = True  # False: h never enters the update (smooth method)
    partial_participation: ClassVar[bool] = False  # True: round() works on a sampled client set
    participation_note: ClassVar[str] = "it is defined for full participation only (docs/algorithms.md §1.4)"

    def __init_subclass__(cls, **kwargs):
        """A user's class may leave out the descriptive attributes: the class name names it."""
        super().__init_subclass__(**kwargs)
        if any(getattr(v, "__isabstractmethod__", False) for v in vars(cls).values()):
            return  # an interface (ServerClientAlgorithm), not an algorithm
        for attr, default in (("name", cls.__name__), ("spec", "its own"), ("status", "USER"),
                              ("reports", "report(state)")):
            if not hasattr(cls, attr):
                setattr(cls, attr, default)

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

    def stream_refusal(self, num_clients: int) -> str:
        """Why a full-participation round over ``num_clients`` clients cannot stream them in chunks (a store
        under full participation, python_algos/algorithms/streamed.py), or "" when it can."""
        return (f"{self.name}'s round works on all N clients' [N, d] stacks at once (it is not written as client "
                f"and server programs), so its clients cannot stream in chunks: use state='dense'")


class Messages(NamedTuple):
    """The d-vectors that travel in one round (``Costs.up`` / ``Costs.down`` count them).

    ``up``: the names of the ``[k, d]`` stacks ``client_update`` returns, one d-vector per
    participating client each, averaged in this order. ``down``: the names of the ``[d]`` vectors
    ``server_update`` returns, broadcast to the (participating) clients. ``up_over_all``: the up
    names whose average under partial participation is ``(1/N) Σ_{i∈S}`` (the non-participants
    contribute zero: a running average over all clients, e.g. SCAFFOLD's c, FedDR's x̃) instead of
    ``(1/|S|) Σ_{i∈S}``; under full participation both are the plain mean.
    """

    up: tuple
    down: tuple
    up_over_all: tuple = ()


class ServerClientAlgorithm(Algorithm):
    """An algorithm with a server, written as one program per side (docs/algorithms.md §0.1).

    The state stays one NamedTuple: its ``client_fields`` (``[N, d]`` stacks, one row per client)
    are the clients' state, and so are the ``[d]`` fields its class names in ``client_copies``
    (default none): client state that is identical on every client, kept once in a simulation and
    once per client when deployed (FedNMap's copies of d̄^{t−1} and z^{t−1}). The other fields are
    the server's. A round is

    1. ``down = download(state, rng)``: what the clients start from, read from the server's state
       (vectors that ``server_update`` sent at the end of the previous round, or ``init`` made
       known to all; non-tensor entries are round settings such as SCAFFNEW's local iteration
       count, drawn by the server);
    2. ``up = client_update(state, down, clients, reg, ids)``: every participant's work between
       two communications, ending with its upload (``messages().up``, each a ``[k, d]`` stack);
    3. ``server_update(state, mean_up, down, reg) -> (state, sent)``: from the means of the uploads
       (``aggregate``) to the next download ``sent`` (``messages().down``, each a ``[d]`` vector);
    4. ``client_receive(state, sent, up, clients, reg, ids)``: what a client does with that
       download and its own last upload (FedCanon: ``c_i += Δ̄ − Δ_i``; default nothing). A
       deployed client runs it at the start of its next round, one message late: its state lags,
       the server's trajectory does not.

    Inside ``client_update`` / ``client_receive`` the state's client fields hold the participants'
    rows only (row j is client ``ids[j]``; all rows when ``ids`` is None), updated **in place**;
    ``ids`` serves only to ask ``clients.gradients_`` for the right clients' gradients. So the same
    two functions run on all N rows (sequential, batched executors), on a rank's shard (distributed:
    ``clients.mean`` is then one all-reduce), or on one client's 1-row stacks (a deployed client).
    ``server_update`` returns the new state (the server's fields, ``t``) and must leave the client
    fields as they are.
    """

    @abc.abstractmethod
    def messages(self) -> Messages: ...

    @abc.abstractmethod
    def download(self, state, rng: Optional[torch.Generator] = None) -> dict: ...

    @abc.abstractmethod
    def client_update(self, state, down: dict, clients: ClientSet, reg: fk.Regularizer,
                      ids: Optional[torch.Tensor]) -> dict: ...

    @abc.abstractmethod
    def server_update(self, state, up: dict, down: dict, reg: fk.Regularizer): ...

    def client_receive(self, state, down: dict, up: dict, clients: ClientSet, reg: fk.Regularizer,
                       ids: Optional[torch.Tensor]) -> None:
        """Nothing to do: the download is used only at the start of the next ``client_update``."""

    def aggregate(self, up: dict, clients: ClientSet, ids: Optional[torch.Tensor]) -> dict:
        """The server's view of the uploads: one ``clients.mean`` per named vector (one all-reduce
        when distributed), ``(1/|S|) Σ_{i∈S}``, or ``(1/N) Σ_{i∈S}`` for ``up_over_all``."""
        m = self.messages()
        n_all = None if ids is None else clients.num_clients
        return {name: clients.mean(up[name], ids, divisor=n_all if name in m.up_over_all else None)
                for name in m.up}

    def stream_refusal(self, num_clients: int) -> str:
        for name in ("round", "aggregate"):
            if getattr(type(self), name) is not getattr(ServerClientAlgorithm, name):
                return (f"{type(self).__name__} overrides {name}: a round that streams its clients in chunks composes "
                        f"the client and server programs itself, so its clients cannot stream: use state='dense'")
        return ""

    def round(self, state, clients, reg, rng=None):
        """One communication round, composed from the two programs (the class docstring); under full
        participation on client stacks in stores, streamed in chunks of clients (:mod:`.streamed`)."""
        ids = clients.participants() if self.partial_participation else None
        if is_streamed(state, ids):
            return streamed_round(self, state, clients, reg, rng)
        k = clients.active_rows(ids)
        full = {f: getattr(state, f) for f in type(state).client_fields}
        rows = {f: rows_(v, ids, clients.workspace("_rows:" + f, k)) for f, v in full.items()}
        local = state._replace(**rows) if rows else state  # the participants' rows (gathered copies)
        if ids is not None:  # a disk store reads the next cohort's rows from the disk while this round computes
            read_ahead(full.values(), clients.upcoming)
        with torch.no_grad():
            down = self.download(local, rng)
            up = self.client_update(local, down, clients, reg, ids)
            local, sent = self.server_update(local, self.aggregate(up, clients, ids), down, reg)
            for f, v in rows.items():
                if getattr(local, f) is not v:
                    raise RuntimeError(f"{type(self).__name__}.server_update replaced the client field {f!r}: the "
                                       f"server updates its own fields only (the clients' rows are updated in place "
                                       f"by client_update / client_receive), or the clients' state would be lost")
            sent = {name: clients.broadcast(sent[name]) for name in self.messages().down}
            self.client_receive(local, sent, up, clients, reg, ids)
        for f, v in full.items():
            put_rows_(v, ids, getattr(local, f))  # non-participants keep their rows
        return local._replace(**full) if full else local


# Every refusal of a hyper-parameter is an fk.ParameterError whose ``fields`` name the fields whose values
# break the rule (all of them, for a rule between fields): the command line names the flags that set
# them from that, never by trying values. A user's class may raise it too; a plain ValueError names none.


def positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise fk.ParameterError(f"{name} must be a finite number > 0, got {value!r}", name)
    return float(value)


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise fk.ParameterError(f"{name} must be an int >= 1, got {value!r}", name)
    return int(value)


def one_of(name: str, value, options) -> str:
    if value not in options:
        raise fk.ParameterError(f"{name} must be one of {options}, got {value!r}", name)
    return value


def check_prox_step(algorithm: str, reg: fk.Regularizer, step: float, what: str, rule: str,
                    fields: tuple = ()) -> None:
    """Reject a prox step with ``step * rho >= 1`` (the prox of a rho-weakly convex h is unique
    and (1/(1 - step rho))-Lipschitz only when step * rho < 1, docs/algorithms.md §1.3).

    ``what`` names the step in the algorithm's symbols (e.g. "alpha"), ``rule`` the spec rule,
    ``fields`` the hyper-parameters the step is made of (and those that choose it), which the error
    carries. A per-parameter h (``fk.PerParameter``) is checked segment by segment, and the error
    names the parameters whose penalty breaks the rule.
    """
    parts = reg.parts() if isinstance(reg, fk.PerParameter) else [(None, reg)]
    for where, part in parts:
        _check_one_prox_step(algorithm, part, step, what, rule, where, fields)


def _check_one_prox_step(algorithm, reg, step, what, rule, where, fields) -> None:
    rho = float(getattr(reg, "rho", 0.0))
    if rho > 0 and step * rho >= 1.0:
        on = f" (the penalty of {where})" if where else ""
        raise fk.ParameterError(
            f"{algorithm}: {what} = {step:g} violates {rule}: {reg!r}{on} is rho-weakly convex with "
            f"rho = {rho:g}, so the prox step must satisfy step * rho < 1 (step < 1/rho = {1.0 / rho:g}); "
            f"got step * rho = {step * rho:g}. The prox of a weakly convex h is unique and Lipschitz only "
            f"in that regime (docs/algorithms.md §1.3, §7.4).", *fields
        )

