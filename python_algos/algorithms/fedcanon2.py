"""FedCanon II, Algorithm 2 — docs/algorithms.md §4.2 (EXACT, seed 003).

The prox moves from the server to the clients, so only Δ̄ is broadcast. Every client keeps its
own replica x̂_i^{t,0} of the global model z^t (bitwise identical across clients):

    client i (client_update):   x̂_i^{t,k+1} = x̂_i^{t,k} − β ( g_i(x̂_i^{t,k}) + c_i^t ),   k < K
               Δ_i^{t+1} = (x̂_i^{t,0} − x̂_i^{t,K}) / (β K)                   -> upload Δ_i
    server (server_update):     Δ̄^{t+1} = (1/N) Σ_i Δ_i^{t+1}                 -> broadcast Δ̄ only
    client i (client_receive):  x̂_i^{t+1,0} = prox_{α h}( x̂_i^{t,0} − α Δ̄^{t+1} )
               c_i^{t+1}   = c_i^t + Δ̄^{t+1} − Δ_i^{t+1}

Identical iterates to Algorithm 1 (§7.3). Per round: N prox (1 per client), 0 on the server;
up 1, down 1. Validity: α < 1/ρ as for FedCanon; the replicas stay equal because every client
runs the same deterministic kernel on identical inputs (ties of the MCP/SCAD prox resolve the same
way everywhere).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, check_prox_step, positive, positive_int
from .steps import load_rows_

__all__ = ["FedCanonII", "FedCanonIIState"]


class FedCanonIIState(NamedTuple):
    xhat0: torch.Tensor  # [N, d] each client's replica x̂_i^{t,0} of the global model z^t
    c: torch.Tensor  # [N, d] control variates c_i^t, sum_i c_i = 0
    t: int  # rounds done
    client_fields = ("xhat0", "c")  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class FedCanonII(ServerClientAlgorithm):
    """FedCanon II (Alg. 2). Same hyper-parameters as :class:`FedCanon`."""

    alpha: float
    beta: float
    local_steps: int

    name = "FedCanon II"
    spec = "docs/algorithms.md §4.2"
    status = "EXACT"
    reports = "z (the clients' common replica x̂_i^{t,0}, a prox output)"
    participation_note = ("its control variates keep the invariant sum_i c_i = 0 only when every client "
                          "updates every round; naive sampling breaks it (docs/algorithms.md §1.4, §7.2)")

    def __post_init__(self):
        positive("alpha", self.alpha)
        positive("beta", self.beta)
        positive_int("local_steps", self.local_steps)

    def validate(self, reg):
        super().validate(reg)
        check_prox_step(self.name, reg, self.alpha, "alpha",
                        "alpha < 1/rho (FedCanon Theorem 1, docs/algorithms.md §4.2/§7.4)", ("alpha",))

    def costs(self, num_clients):
        return Costs(client_prox=num_clients, server_prox=0, up=1, down=1, grads=self.local_steps)

    def metric_step(self):
        return self.alpha

    def init(self, x0, clients):
        xhat0 = clients.new_stack(x0)  # x̂_i^{0,0} = z^0 for every i, bitwise identical
        c = clients.new_stack()  # c_i^0 = 0
        return FedCanonIIState(xhat0=xhat0, c=c, t=0)

    def messages(self):
        return Messages(up=("delta",), down=("dbar",))

    def download(self, state, rng=None):
        return {}  # every client starts from its own replica x̂_i^{t,0}

    def client_update(self, state, down, clients, reg, ids):
        beta, K, xhat0, c = self.beta, self.local_steps, state.xhat0, state.c
        k = clients.active_rows(ids)
        X, G = clients.workspace("x", k), clients.workspace("g", k)
        load_rows_(X, xhat0)  # K control-variate steps from its replica
        for _ in range(K):
            clients.gradients_(X, G, ids)
            fk.raw.cv_step_(X, G, c, beta)  # x̂ <- x̂ − β (g + c_i)
        return {"delta": fk.raw.normalized_delta_(X, xhat0, beta, K)}  # Δ_i = (x̂_i^{t,0} − x̂_i^{t,K}) / (βK)

    def server_update(self, state, up, down, reg):
        return state._replace(t=state.t + 1), {"dbar": up["delta"]}  # average only

    def client_receive(self, state, down, up, clients, reg, ids):
        dbar = down["dbar"]  # local prox-gradient step on the replica, then the control update
        fk.fused.prox_grad_step_(state.xhat0, dbar, self.alpha, reg, self.alpha, fast=True)  # prox_{αh}(x̂^{t,0} − αΔ̄)
        fk.raw.control_update_(state.c, dbar, up["delta"])  # c_i <- c_i + Δ̄ − Δ_i

    def report(self, state, reg):
        return state.xhat0[0]
