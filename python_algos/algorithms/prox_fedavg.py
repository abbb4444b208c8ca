"""Prox-FedAvg, as written in FedCanon eq. (3) — docs/algorithms.md §5.2 (EXACT, seed 003).

FedMiD in Euclidean geometry, the composite strawman FedCanon argues against: clients take
proximal SGD steps, the server a proximal step on the averaged (unnormalized) client update:

    client i:  receive z^t
               x̂_i^{t,0} = z^t;   x̂_i^{t,k+1} = prox_{β h}( x̂_i^{t,k} − β g_i(x̂_i^{t,k}) ),  k < K
               upload Δ_i = z^t − x̂_i^{t,K}
    server:    Δ̄^t = (1/N) Σ_i Δ_i;   z^{t+1} = prox_{α h}( z^t − α Δ̄^t )      -> broadcast z

Output z. Per round: N·K prox on clients + 1 on the server; up 1, down 1. Note Δ̄ is not divided
by βK here (eq. 3 as printed), so α = 1 means "take the averaged client model" before the prox.
Validity: β < 1/ρ and α < 1/ρ (both proxes must be unique and Lipschitz, as for FedCanon/FedMiD).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, check_prox_step, positive, positive_int
from .steps import load_rows_

__all__ = ["ProxFedAvg", "ProxFedAvgState"]


class ProxFedAvgState(NamedTuple):
    z: torch.Tensor  # [d] global model z^t
    t: int  # rounds done
    client_fields = ()  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class ProxFedAvg(ServerClientAlgorithm):
    """Prox-FedAvg (FedCanon eq. 3). ``alpha``: server step = server prox step; ``beta``: local
    step = client prox step; ``local_steps``: K."""

    alpha: float
    beta: float
    local_steps: int

    name = "Prox-FedAvg"
    spec = "docs/algorithms.md §5.2"
    status = "EXACT"
    reports = "z (the server model, a prox output)"
    participation_note = ("FedCanon eq. (3) averages all N clients (docs/algorithms.md §5.2); FedMiD (§5.3) "
                          "is the same scheme with a sampled set S")

    def __post_init__(self):
        positive("alpha", self.alpha)
        positive("beta", self.beta)
        positive_int("local_steps", self.local_steps)

    def validate(self, reg):
        super().validate(reg)
        rule = ("beta < 1/rho and alpha < 1/rho (unique, Lipschitz client and server prox; "
                "docs/algorithms.md §5.2, §1.3)")
        check_prox_step(self.name, reg, self.beta, "beta (client prox step)", rule, ("beta",))
        check_prox_step(self.name, reg, self.alpha, "alpha (server prox step)", rule, ("alpha",))

    def costs(self, num_clients):
        return Costs(client_prox=num_clients * self.local_steps, server_prox=1, up=1, down=1, grads=self.local_steps)

    def metric_step(self):
        return self.alpha

    def init(self, x0, clients):
        return ProxFedAvgState(z=clients.new_vector(x0), t=0)

    def messages(self):
        return Messages(up=("delta",), down=("z",))

    def download(self, state, rng=None):
        return {"z": state.z}

    def client_update(self, state, down, clients, reg, ids):
        beta, z = self.beta, down["z"]
        k = clients.active_rows(ids)
        X, G = clients.workspace("x", k), clients.workspace("g", k)
        load_rows_(X, z)  # x̂_i^{t,0} = z^t
        for _ in range(self.local_steps):
            clients.gradients_(X, G, ids)
            fk.fused.prox_grad_step_(X, G, beta, reg, beta, fast=True)  # x̂ <- prox_{βh}(x̂ − β g)
        return {"delta": fk.raw.normalized_delta_(X, z, 1.0, 1)}  # z^t − x̂_i^{t,K}

    def server_update(self, state, up, down, reg):
        z = state.z
        fk.fused.prox_grad_step_(z, up["delta"], self.alpha, reg, self.alpha, fast=True)  # z <- prox_{αh}(z − α Δ̄)
        return state._replace(t=state.t + 1), {"z": z}

    def report(self, state, reg):
        return state.z
