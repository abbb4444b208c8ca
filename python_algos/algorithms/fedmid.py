"""FedMiD (Federated Mirror Descent, Euclidean mirror map) — docs/algorithms.md §5.3 (EXACT, public code).

Yuan, Zaheer, Reddi, "Federated Composite Optimization", ICML 2021:

    client m:  receive x_r
               x_{r,0}^m = x_r;   x_{r,k+1}^m = prox_{η_c h}( x_{r,k}^m − η_c g_m(x_{r,k}^m) ),  k < K
               upload dx_m = x_r − x_{r,K}^m  (= −Δ^m, the pseudo-gradient)
    server:    Δ_r = −(1/N) Σ_m dx_m;   x_{r+1} = prox_{η_s η_c K h}( x_r + η_s Δ_r )   -> broadcast x

As in the reference code (``fed_avg_schedule.py``), the server takes an SGD step with −Δ as the
gradient and learning rate η_s, then the prox with step η_s × (sum of client lrs) = η_s η_c K.
Per round: N·K + 1 prox evaluations; up 1, down 1. Partial participation (the spec's sampled
set S, ``simulate(..., clients_per_round=k)``): Δ_r averages the k participants, k·K + 1 prox.
Validity (§7.4): η_c < 1/ρ and η_s η_c K < 1/ρ.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, check_prox_step, positive, positive_int
from .steps import load_rows_

__all__ = ["FedMiD", "FedMiDState"]


class FedMiDState(NamedTuple):
    x: torch.Tensor  # [d] server model x_r
    t: int  # rounds done
    client_fields = ()  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class FedMiD(ServerClientAlgorithm):
    """FedMiD. ``lr_client``: η_c; ``lr_server``: η_s; ``local_steps``: K."""

    lr_client: float
    local_steps: int
    lr_server: float = 1.0

    name = "FedMiD"
    spec = "docs/algorithms.md §5.3"
    status = "EXACT"
    reports = "x (the server model, a prox output)"
    partial_participation = True

    def __post_init__(self):
        positive("lr_client", self.lr_client)
        positive("lr_server", self.lr_server)
        positive_int("local_steps", self.local_steps)

    @property
    def server_step(self) -> float:
        """η_s η_c K, the server's prox step."""
        return self.lr_server * self.lr_client * self.local_steps

    def validate(self, reg):
        super().validate(reg)
        rule = "eta_c < 1/rho and eta_s*eta_c*K < 1/rho (docs/algorithms.md §5.3/§7.4)"
        check_prox_step(self.name, reg, self.lr_client, "lr_client (client prox step eta_c)", rule, ("lr_client",))
        check_prox_step(self.name, reg, self.server_step, "lr_server*lr_client*K (server prox step)", rule,
                        ("lr_server", "lr_client", "local_steps"))

    def costs(self, num_clients):
        return Costs(client_prox=num_clients * self.local_steps, server_prox=1, up=1, down=1, grads=self.local_steps)

    def metric_step(self):
        return self.server_step

    def init(self, x0, clients):
        return FedMiDState(x=clients.new_vector(x0), t=0)

    def messages(self):
        return Messages(up=("dx",), down=("x",))

    def download(self, state, rng=None):
        return {"x": state.x}

    def client_update(self, state, down, clients, reg, ids):
        eta_c, x = self.lr_client, down["x"]
        k = clients.active_rows(ids)
        X, G = clients.workspace("x", k), clients.workspace("g", k)
        load_rows_(X, x)  # x_{r,0}^m = x_r
        for _ in range(self.local_steps):
            clients.gradients_(X, G, ids)
            fk.fused.prox_grad_step_(X, G, eta_c, reg, eta_c, fast=True)  # prox_{η_c h}(x − η_c g)
        return {"dx": fk.raw.normalized_delta_(X, x, 1.0, 1)}  # x_r − x_{r,K}^m = −Δ^m (the pseudo-gradient)

    def server_update(self, state, up, down, reg):
        x = state.x  # up["dx"] = −Δ_r
        fk.fused.prox_grad_step_(x, up["dx"], self.lr_server, reg, self.server_step, fast=True)  # prox(x_r + η_s Δ_r)
        return state._replace(t=state.t + 1), {"x": x}

    def report(self, state, reg):
        return state.x
