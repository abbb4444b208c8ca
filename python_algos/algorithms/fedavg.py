"""FedAvg — docs/algorithms.md §5.1 (EXACT, standard). A smooth method (h = 0).

    client i:  receive x^t
               x_i^{t,0} = x^t;   x_i^{t,k+1} = x_i^{t,k} − η_l g_i(x_i^{t,k}),  k < K
               upload dx_i = x^t − x_i^{t,K}
    server:    x^{t+1} = x^t − η_g (1/N) Σ_i dx_i      (η_g = 1: plain averaging)  -> broadcast x

Per round: up 1 (dx), down 1 (x), no prox. Partial participation (the spec's sampled set S,
``simulate(..., clients_per_round=k)``): the server averages the k participants' updates.
With a nonzero regularizer the update ignores h (a warning is
issued); the metrics still report f + h of x.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, positive, positive_int
from .steps import load_rows_, sgd_step_, warn_smooth

__all__ = ["FedAvg", "FedAvgState"]


class FedAvgState(NamedTuple):
    x: torch.Tensor  # [d] server model x^t
    t: int  # rounds done
    client_fields = ()  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class FedAvg(ServerClientAlgorithm):
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

    def messages(self):
        return Messages(up=("dx",), down=("x",))

    def download(self, state, rng=None):
        return {"x": state.x}

    def client_update(self, state, down, clients, reg, ids):
        x = down["x"]
        k = clients.active_rows(ids)
        X, G = clients.workspace("x", k), clients.workspace("g", k)
        load_rows_(X, x)  # x_i^{t,0} = x^t
        for _ in range(self.local_steps):
            clients.gradients_(X, G, ids)
            sgd_step_(X, G, self.lr_local)  # x_i <- x_i − η_l g_i
        return {"dx": fk.raw.normalized_delta_(X, x, 1.0, 1)}  # x^t − x_i^{t,K}

    def server_update(self, state, up, down, reg):
        x = state.x
        sgd_step_(x, up["dx"], self.lr_global)  # x <- x + η_g mean(x_i^{t,K} − x^t)
        return state._replace(t=state.t + 1), {"x": x}

    def report(self, state, reg):
        return state.x
