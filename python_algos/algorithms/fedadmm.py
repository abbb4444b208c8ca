"""FedADMM (Wang, Marella, Anderson) — docs/algorithms.md §5.9 (RECONSTRUCTED: standard consensus ADMM).

"FedADMM: A Federated Primal-Dual Algorithm Allowing Partial Participation", IEEE CDC 2022,
arXiv:2203.15104 (not the Gong–Li–Freris FedADMM, arXiv:2204.03529). The paper derives it from
FedDR applied to the dual problem; the form implemented here is **the standard consensus-ADMM
(augmented-Lagrangian) scheme** for

    min (1/N) Σ_i f_i(x_i) + h(x̄)   s.t.  x_i = x̄,   penalty 1/η,  multipliers z_i,

exactly as written in the spec (its sign and naming conventions were not checked against the
paper's Algorithm, which the spec flags). Round k with participating set S_k:

    client i ∈ S_k:  receive x̄
                     x_i ≈ argmin_x f_i(x) + <z_i, x − x̄> + ||x − x̄||²/(2η)     (local GD from x̄)
                     z_i <- z_i + (x_i − x̄)/η                                    (dual ascent)
                     x̂_i = x_i + η z_i                        -> upload dxhat_i = x̂_i − x̂_i^old
    server:          x̃ <- x̃ + (1/N) Σ_{i ∈ S_k} Δx̂_i      (= (1/N) Σ_i x̂_i over ALL clients, stale
                                                             for non-sampled)
                     x̄ = prox_{η h}( x̃ )                                      -> broadcast

The local solver is ``local_steps`` gradient steps ``x <- x − lr (g_i(x) + z_i + (x − x̄)/η)``
started at the received x̄. Initialization: z_i = 0, x̂_i = x⁰, x̃ = x̄ = x⁰. At a fixed point
x_i = x̄ = x* and z_i = −∇f_i(x*), so x̃ = x* − η∇f(x*) and x̄ = prox_{ηh}(x̃) = x* iff x* is
stationary for f + h. Per round: up 1, down 1; 1 prox of h on the server (step η); K gradients
per participating client. ``validate``: η ρ < 1 for a weakly convex h. Partial participation:
supported.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from .base import Costs, Messages, ServerClientAlgorithm, check_prox_step, positive, positive_int
from .steps import damped_step_, load_rows_, prox_

__all__ = ["FedADMM", "FedADMMState"]


class FedADMMState(NamedTuple):
    z: torch.Tensor  # [N, d] multipliers z_i of x_i = x̄
    xhat: torch.Tensor  # [N, d] x̂_i = x_i + η z_i, the latest upload of each client
    xtilde: torch.Tensor  # [d] server average x̃ = (1/N) Σ_i x̂_i
    xbar: torch.Tensor  # [d] server model x̄ = prox_{η h}(x̃)
    t: int  # rounds done
    client_fields = ("z", "xhat")  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class FedADMM(ServerClientAlgorithm):
    """FedADMM. ``eta``: η (1/penalty and server prox step); ``lr_local``: inner step;
    ``local_steps``: inner steps K."""

    eta: float
    lr_local: float
    local_steps: int

    name = "FedADMM"
    spec = "docs/algorithms.md §5.9"
    status = "RECONSTRUCTED"
    reports = "x̄ (the server model, a prox output)"
    partial_participation = True

    def __post_init__(self):
        positive("eta", self.eta)
        positive("lr_local", self.lr_local)
        positive_int("local_steps", self.local_steps)

    def validate(self, reg):
        super().validate(reg)
        check_prox_step(self.name, reg, self.eta, "eta (server prox step)",
                        "eta < 1/rho (docs/algorithms.md §5.9, §2.8)", ("eta",))

    def costs(self, num_clients):
        return Costs(client_prox=0, server_prox=1, up=1, down=1, grads=self.local_steps)

    def metric_step(self):
        return self.eta

    def init(self, x0, clients):
        xhat = clients.new_stack(x0)  # x_i = x⁰, z_i = 0
        with torch.no_grad():
            xtilde = clients.mean(xhat)
        return FedADMMState(z=clients.new_stack(), xhat=xhat, xtilde=xtilde, xbar=clients.new_vector(x0), t=0)

    def messages(self):
        # x̃ is the mean of the latest x̂_i of ALL clients: a non-participant's x̂_i did not move
        return Messages(up=("dxhat",), down=("xbar",), up_over_all=("dxhat",))

    def download(self, state, rng=None):
        return {"xbar": state.xbar}

    def client_update(self, state, down, clients, reg, ids):
        eta, Z, Xh, xb = self.eta, state.z, state.xhat, down["xbar"]  # the participants' rows
        k = clients.active_rows(ids)
        X, G, C, D = (clients.workspace(n, k) for n in ("x", "g", "c", "d"))
        torch.sub(Z, xb, alpha=1.0 / eta, out=C)  # z_i − x̄/η: gradient of the local model = g + C + x/η
        load_rows_(X, xb)  # local solver starts at x̄
        for _ in range(self.local_steps):
            clients.gradients_(X, G, ids)
            damped_step_(X, G, C, self.lr_local, 1.0 / eta)  # x <- x − lr (g + z_i + (x − x̄)/η)
        Z.add_(torch.sub(X, xb, out=D), alpha=1.0 / eta)  # z_i <- z_i + (x_i − x̄)/η
        torch.add(X, Z, alpha=eta, out=C)  # x̂_i^new = x_i + η z_i
        torch.sub(C, Xh, out=D)  # Δx̂_i
        Xh.copy_(C)
        return {"dxhat": D}

    def server_update(self, state, up, down, reg):
        xtilde, xbar = state.xtilde, state.xbar
        xtilde.add_(up["dxhat"])  # x̃ += (1/N) Σ_{i∈S} Δx̂_i
        prox_(xbar.copy_(xtilde), reg, self.eta)  # x̄ = prox_{ηh}(x̃)
        return state._replace(t=state.t + 1), {"xbar": xbar}

    def report(self, state, reg):
        return state.xbar
