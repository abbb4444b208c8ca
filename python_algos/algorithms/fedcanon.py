"""FedCanon, Algorithm 1 — docs/algorithms.md §4.1 (EXACT, seed 003).

Clients run K control-variate SGD steps and never touch h; the server takes one proximal
gradient step per round with the averaged normalized update as its gradient estimate:

    client i:  x̂_i^{t,0} = z^t
               x̂_i^{t,k+1} = x̂_i^{t,k} − β ( g_i(x̂_i^{t,k}) + c_i^t ),   k < K
               Δ_i^{t+1} = (z^t − x̂_i^{t,K}) / (β K)                        -> upload
    server:    Δ̄^{t+1} = (1/N) Σ_i Δ_i^{t+1}
               z^{t+1} = prox_{α h}( z^t − α Δ̄^{t+1} )                       -> broadcast (Δ̄, z)
    client i:  c_i^{t+1} = c_i^t + Δ̄^{t+1} − Δ_i^{t+1}

Output z^T. Per round: 1 prox (server), 0 on clients; up 1, down 2; K gradients per client.
Validity (Theorem 1, §7.4): α < 1/ρ — the server prox must be unique and Lipschitz (Lemma 5),
so a weakly convex h with α ρ >= 1 is rejected even though the kernels' MCP/SCAD prox is exact
there. With h = 0 this is SCAFFOLD option II with η_l = β, η_g = α/(βK) (§7.3).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Algorithm, Costs, check_prox_step, positive, positive_int
from .steps import load_rows_

__all__ = ["FedCanon", "FedCanonState"]


class FedCanonState(NamedTuple):
    z: torch.Tensor  # [d] global model z^t (held by the server and, after broadcast, by every client)
    c: torch.Tensor  # [N, d] client control variates c_i^t, sum_i c_i = 0
    t: int  # rounds done
    client_fields = ("c",)  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class FedCanon(Algorithm):
    """FedCanon (Alg. 1). ``alpha``: server step = prox step; ``beta``: local step; ``local_steps``: K."""

    alpha: float
    beta: float
    local_steps: int

    name = "FedCanon"
    spec = "docs/algorithms.md §4.1"
    status = "EXACT"
    reports = "z (the server model, a prox output)"
    participation_note = ("its control variates keep the invariant sum_i c_i = 0 only when every client "
                          "updates every round; naive sampling breaks it (docs/algorithms.md §1.4, §7.2)")

    def __post_init__(self):
        positive("alpha", self.alpha)
        positive("beta", self.beta)
        positive_int("local_steps", self.local_steps)

    def validate(self, reg):
        super().validate(reg)
        check_prox_step(self.name, reg, self.alpha, "alpha", "alpha < 1/rho (FedCanon Theorem 1, docs/algorithms.md §4.1/§7.4)")

    def costs(self, num_clients):
        return Costs(client_prox=0, server_prox=1, up=1, down=2, grads=self.local_steps)

    def metric_step(self):
        return self.alpha

    def init(self, x0, clients):
        z = clients.new_vector(x0)  # z^0; all clients receive z^0
        c = clients.new_stack()  # c_i^0 = 0, so sum_i c_i^0 = 0
        return FedCanonState(z=z, c=c, t=0)

    def round(self, state, clients, reg, rng=None):
        alpha, beta, K = self.alpha, self.beta, self.local_steps
        z, c = state.z, state.c
        X, G = clients.workspace("x"), clients.workspace("g")
        with torch.no_grad():
            # client i: x̂_i^{t,0} = z^t; K control-variate steps
            load_rows_(X, z)
            for _ in range(K):
                clients.gradients_(X, G)
                fk.raw.cv_step_(X, G, c, beta)  # x̂ <- x̂ − β (g + c_i)
            Delta = fk.raw.normalized_delta_(X, z, beta, K)  # Δ_i = (z − x̂_i^{t,K}) / (βK), in place
            # server
            dbar = clients.mean(Delta)  # Δ̄ = (1/N) Σ Δ_i
            fk.fused.prox_grad_step_(z, dbar, alpha, reg, alpha, fast=True)  # z <- prox_{αh}(z − α Δ̄)
            dbar = clients.broadcast(dbar)
            z = clients.broadcast(z)
            # client i
            fk.raw.control_update_(c, dbar, Delta)  # c_i <- c_i + Δ̄ − Δ_i
        return FedCanonState(z=z, c=c, t=state.t + 1)

    def report(self, state, reg):
        return state.z
