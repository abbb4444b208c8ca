"""FedCanon, Algorithm 1 — docs/algorithms.md §4.1 (EXACT, seed 003).

Clients run K control-variate SGD steps and never touch h; the server takes one proximal
gradient step per round with the averaged normalized update as its gradient estimate:

    client i (client_update):   x̂_i^{t,0} = z^t
               x̂_i^{t,k+1} = x̂_i^{t,k} − β ( g_i(x̂_i^{t,k}) + c_i^t ),   k < K
               Δ_i^{t+1} = (z^t − x̂_i^{t,K}) / (β K)                        -> upload Δ_i
    server (server_update):     Δ̄^{t+1} = (1/N) Σ_i Δ_i^{t+1}
               z^{t+1} = prox_{α h}( z^t − α Δ̄^{t+1} )                       -> broadcast (Δ̄, z)
    client i (client_receive):  c_i^{t+1} = c_i^t + Δ̄^{t+1} − Δ_i^{t+1}
                                (a deployed client: at the start of its next round)

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

from .base import Costs, Messages, ServerClientAlgorithm, check_prox_step, positive, positive_int
from .steps import load_rows_

__all__ = ["FedCanon", "FedCanonState"]


class FedCanonState(NamedTuple):
    z: torch.Tensor  # [d] global model z^t (held by the server and, after broadcast, by every client)
    c: torch.Tensor  # [N, d] client control variates c_i^t, sum_i c_i = 0
    t: int  # rounds done
    client_fields = ("c",)  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class FedCanon(ServerClientAlgorithm):
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
        check_prox_step(self.name, reg, self.alpha, "alpha",
                        "alpha < 1/rho (FedCanon Theorem 1, docs/algorithms.md §4.1/§7.4)", ("alpha",))

    def costs(self, num_clients):
        return Costs(client_prox=0, server_prox=1, up=1, down=2, grads=self.local_steps)

    def metric_step(self):
        return self.alpha

    def init(self, x0, clients):
        z = clients.new_vector(x0)  # z^0; all clients receive z^0
        c = clients.new_stack()  # c_i^0 = 0, so sum_i c_i^0 = 0
        return FedCanonState(z=z, c=c, t=0)

    def messages(self):
        return Messages(up=("delta",), down=("dbar", "z"))

    def download(self, state, rng=None):
        return {"z": state.z}

    def client_update(self, state, down, clients, reg, ids):
        beta, K, z, c = self.beta, self.local_steps, down["z"], state.c
        k = clients.active_rows(ids)
        X, G = clients.workspace("x", k), clients.workspace("g", k)
        load_rows_(X, z)  # x̂_i^{t,0} = z^t; K control-variate steps
        for _ in range(K):
            clients.gradients_(X, G, ids)
            fk.raw.cv_step_(X, G, c, beta)  # x̂ <- x̂ − β (g + c_i)
        return {"delta": fk.raw.normalized_delta_(X, z, beta, K)}  # Δ_i = (z − x̂_i^{t,K}) / (βK), in place

    def server_update(self, state, up, down, reg):
        z, dbar = state.z, up["delta"]  # Δ̄ = (1/N) Σ Δ_i
        fk.fused.prox_grad_step_(z, dbar, self.alpha, reg, self.alpha, fast=True)  # z <- prox_{αh}(z − α Δ̄)
        return state._replace(t=state.t + 1), {"dbar": dbar, "z": z}

    def client_receive(self, state, down, up, clients, reg, ids):
        fk.raw.control_update_(state.c, down["dbar"], up["delta"])  # c_i <- c_i + Δ̄ − Δ_i

    def report(self, state, reg):
        return state.z
