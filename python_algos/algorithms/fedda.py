"""FedDA / FedDualAvg (Euclidean) — docs/algorithms.md §5.4 (EXACT, public code).

Yuan, Zaheer, Reddi, ICML 2021. Dual states are averaged (no "curse of primal averaging"):

    init: z_0 = x_0
    round r, client m:  receive z_r;  z_{r,0}^m = z_r
        for k < K:
            η̃_{r,k}    = η_s η_c r K + η_c k
            x_{r,k}^m   = prox_{η̃_{r,k} h}( z_{r,k}^m )          # retrieve primal
            z_{r,k+1}^m = z_{r,k}^m − η_c g_m(x_{r,k}^m)           # dual SGD step
        upload Δ_r^m = z_{r,K}^m − z_{r,0}^m
    server: z_{r+1} = z_r + η_s (1/N) Σ_m Δ_r^m  -> broadcast z;   output x_{r+1} = prox_{η_s η_c (r+1) K h}( z_{r+1} )

The dual step and the next primal retrieval are one fused kernel (``fk.fused.za1_step_`` with a
zero correction); the primal after the last dual step is never used and is not computed. Per
round: N·K client prox evaluations (the one at η̃_{0,0} = 0 is the identity but still a kernel
evaluation) + 1 on the server (the output); up 1, down 1 (plus the scalar elapsed step, which
every party can compute from r). Partial participation (the spec's sampled set S,
``simulate(..., clients_per_round=k)``): z averages the k participants' Δ, k·K + 1 prox.

No step-size rule is enforced: the cumulative prox step η̃ grows without bound, so no constraint
can hold for all rounds (§7.4). FedDA does not rely on a unique prox; for MCP/SCAD past
step = γ (a − 1) the kernels use the exact extension formulas of §2.3/§2.4 (hard thresholding /
best of two candidates), never the invalid closed form.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, positive, positive_int
from .steps import load_rows_, prox_

__all__ = ["FedDA", "FedDAState"]


class FedDAState(NamedTuple):
    z: torch.Tensor  # [d] server dual state z_r
    x: torch.Tensor  # [d] primal output x_r = prox_{η_s η_c r K h}(z_r)
    t: int  # rounds done (r)
    client_fields = ()  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class FedDA(ServerClientAlgorithm):
    """FedDA. ``lr_client``: η_c; ``lr_server``: η_s; ``local_steps``: K."""

    lr_client: float
    local_steps: int
    lr_server: float = 1.0

    name = "FedDA"
    spec = "docs/algorithms.md §5.4"
    status = "EXACT"
    reports = "x = prox(z) (the primal of the server's dual state)"
    partial_participation = True

    def __post_init__(self):
        positive("lr_client", self.lr_client)
        positive("lr_server", self.lr_server)
        positive_int("local_steps", self.local_steps)

    def elapsed(self, r: int, k: int = 0) -> float:
        """η̃_{r,k} = η_s η_c r K + η_c k, the cumulative prox step."""
        return self.lr_server * self.lr_client * r * self.local_steps + self.lr_client * k

    def validate(self, reg):
        super().validate(reg)  # deliberately no step check: see the module docstring

    def costs(self, num_clients):
        return Costs(client_prox=num_clients * self.local_steps, server_prox=1, up=1, down=1, grads=self.local_steps)

    def metric_step(self):
        return self.lr_server * self.lr_client * self.local_steps

    def normal_map_point(self, state):
        lam = self.elapsed(state.t)
        return (state.z, lam) if lam > 0 else None

    def init(self, x0, clients):
        z = clients.new_vector(x0)  # z_0 = x_0
        return FedDAState(z=z, x=z.clone(), t=0)

    def messages(self):
        return Messages(up=("delta",), down=("z",))

    def download(self, state, rng=None):
        return {"z": state.z}  # with the round r (state.t), which sets the elapsed step η̃

    def client_update(self, state, down, clients, reg, ids):
        eta_c, K, r, z = self.lr_client, self.local_steps, state.t, down["z"]
        n = clients.active_rows(ids)
        Z, X, G = clients.workspace("z", n), clients.workspace("x", n), clients.workspace("g", n)
        no_correction = torch.zeros_like(z)
        load_rows_(Z, z)  # z_{r,0}^m = z_r
        prox_(load_rows_(X, Z), reg, self.elapsed(r, 0))  # x_{r,0}^m = prox_{η̃_{r,0} h}(z_{r,0}^m)
        for k in range(K):
            clients.gradients_(X, G, ids)  # g_m(x_{r,k})
            if k < K - 1:  # z <- z − η_c g;  x <- prox_{η̃_{r,k+1} h}(z)
                fk.fused.za1_step_(Z, X, G, no_correction, eta_c, reg, self.elapsed(r, k + 1), fast=True)
            else:
                fk.raw.cv_step_(Z, G, no_correction, eta_c)
        return {"delta": Z.sub_(z)}  # Δ_r^m = z_{r,K}^m − z_{r,0}^m

    def server_update(self, state, up, down, reg):
        z, x, r = state.z, state.x, state.t
        z.add_(up["delta"], alpha=self.lr_server)  # z_{r+1} = z_r + η_s mean Δ
        prox_(x.copy_(z), reg, self.elapsed(r + 1))  # x_{r+1} = prox_{η_s η_c (r+1) K h}(z_{r+1})
        return state._replace(t=r + 1), {"z": z}

    def report(self, state, reg):
        return state.x
