"""The algorithm interface: frozen hyper-parameters + ``init`` / ``round`` / ``report``.

Every algorithm file subclasses :class:`Algorithm`, reaches its clients only through a
:class:`~python_algos.clients.ClientSet`, and updates ``[n, d]`` stacks with fused kernels
(the shared step helpers are in :mod:`python_algos.algorithms.steps`).
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

__all__ = ["Algorithm", "Costs", "positive", "positive_int", "one_of", "check_prox_step"]


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
    * ``round(state, clients, reg, rng) -> State``: one communication round. Tensors of the
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
    and (1/(1 - step rho))-Lipschitz only when step * rho < 1, docs/algorithms.md §1.3).

    ``what`` names the step in the algorithm's symbols (e.g. "alpha"), ``rule`` the spec rule. A
    per-parameter h (``fk.PerParameter``) is checked segment by segment, and the error names the
    parameters whose penalty breaks the rule.
    """
    parts = reg.parts() if isinstance(reg, fk.PerParameter) else [(None, reg)]
    for where, part in parts:
        _check_one_prox_step(algorithm, part, step, what, rule, where)


def _check_one_prox_step(algorithm, reg, step, what, rule, where) -> None:
    rho = float(getattr(reg, "rho", 0.0))
    if rho > 0 and step * rho >= 1.0:
        on = f" (the penalty of {where})" if where else ""
        raise ValueError(
            f"{algorithm}: {what} = {step:g} violates {rule}: {reg!r}{on} is rho-weakly convex with "
            f"rho = {rho:g}, so the prox step must satisfy step * rho < 1 (step < 1/rho = {1.0 / rho:g}); "
            f"got step * rho = {step * rho:g}. The prox of a weakly convex h is unique and Lipschitz only "
            f"in that regime (docs/algorithms.md §1.3, §7.4)."
        )

