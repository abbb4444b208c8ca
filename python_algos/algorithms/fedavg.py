"""FedAvg — docs/algorithms.md §5.1 (EXACT, standard). A smooth method (h = 0).

    client i:  x_i^{t,0} = x^t;   x_i^{t,k+1} = x_i^{t,k} − η_l g_i(x_i^{t,k}),  k < K
               upload x_i^{t,K} − x^t
    server:    x^{t+1} = x^t + η_g (1/N) Σ_i (x_i^{t,K} − x^t)      (η_g = 1: plain averaging)

Per round: up 1, down 1, no prox. Partial participation (the spec's sampled set S,
``simulate(..., clients_per_round=k)``): the server averages the k participants' updates.
With a nonzero regularizer the update ignores h (a warning is
issued); the metrics still report f + h of x.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Algorithm, Costs, positive, positive_int
from .steps import load_rows_, sgd_step_, warn_smooth

__all__ = ["FedAvg", "FedAvgState"]


class FedAvgState(NamedTuple):
    x: torch.Tensor  # [d] server model x^t
    t: int  # rounds done
    client_fields = ()  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class FedAvg(Algorithm):
    """FedAvg. ``lr_local``: η_l; ``lr_global``: η_g; ``local_steps``: K."""

    lr_local: float
    local_steps: int
    lr_global: float = 1.0

    name = "FedAvg"
    spec = "docs/algorithms.md §5.1"
    status = "EXACT"
    reports = "x (the server model)"
    composite = False
    partial_participation = True

    def __post_init__(self):
        positive("lr_local", self.lr_local)
        positive("lr_global", self.lr_global)
        positive_int("local_steps", self.local_steps)

    def validate(self, reg):
        super().validate(reg)
        warn_smooth(self.name, reg)

    def costs(self, num_clients):
        return Costs(client_prox=0, server_prox=0, up=1, down=1, grads=self.local_steps)

    def metric_step(self):
        return self.lr_global * self.lr_local * self.local_steps

    def init(self, x0, clients):
        return FedAvgState(x=clients.new_vector(x0), t=0)

    def round(self, state, clients, reg, rng=None):
        x = state.x
        ids = clients.participants()  # None: all N clients
        k = clients.active_rows(ids)
        X, G = clients.workspace("x", k), clients.workspace("g", k)
        with torch.no_grad():
            load_rows_(X, x)  # x_i^{t,0} = x^t
            for _ in range(self.local_steps):
                clients.gradients_(X, G, ids)
                sgd_step_(X, G, self.lr_local)  # x_i <- x_i − η_l g_i
            neg_delta = fk.raw.normalized_delta_(X, x, 1.0, 1)  # x^t − x_i^{t,K}
            sgd_step_(x, clients.mean(neg_delta, ids), self.lr_global)  # x <- x + η_g mean(x_i^{t,K} − x^t)
            x = clients.broadcast(x)
        return FedAvgState(x=x, t=state.t + 1)

    def report(self, state, reg):
        return state.x
