"""FedDR (randomized Douglas–Rachford splitting) — docs/algorithms.md §5.8 (EXACT, public code).

Tran-Dinh, Pham, Phan, Nguyen, NeurIPS 2021 (arXiv:2103.03452); code ``unc-optimization/FedDR``.
Round k with participating set S_k (all N clients under full participation):

    client i ∈ S_k:  receive x̄
                     y_i <- y_i + α ( x̄ − x_i )
                     x_i ≈ prox_{η f_i}(y_i) = argmin_x f_i(x) + ||x − y_i||²/(2η)
                     x̂_i = 2 x_i − y_i                                 -> upload dxhat_i = x̂_i − x̂_i^old
    server:          x̃ <- x̃ + (1/N) Σ_{i ∈ S_k} Δx̂_i      (x̃ = mean of the latest x̂_i of ALL clients,
                                                              stale values for non-sampled ones)
                     x̄ = prox_{η h}( x̃ )                                 -> broadcast

The inexact local prox is ``local_steps`` gradient steps on the perturbed loss, as the code's
``PerturbedGradientDescent`` (``var -= lr (grad + (var − y_i)/η)``), warm-started at the client's
previous x_i, as the code does. A fixed point of this inexact scheme is exact: the warm start
does not move iff x_i = prox_{η f_i}(y_i).

Initialization (``init_from``; §5.8 notes the paper and the code differ):

* ``"paper"`` (default, Algorithm 1 of the paper): y_i = x⁰, x_i ≈ prox_{η f_i}(x⁰) (the same
  local solver from x⁰; its gradients are spent in ``init``), x̂_i = 2x_i − y_i, x̄ = x⁰;
* ``"code"``: y_i = 0, x_i = x̄ = x⁰, x̂_i = 0 (the first y-update is then 0).

Either way the server starts from x̃ = (1/N) Σ_i x̂_i, so the invariant x̃ = mean_i x̂_i holds every
round (asserted in the tests, up to the round-off of the running sum). Aggregation weights are
uniform 1/N (§1.4; the code weights by sample counts). Per round: up 1, down 1; 1 prox of h on the
server (step η); K gradients per participating client. The paper assumes a convex h; for a
ρ-weakly convex h ``validate`` requires η ρ < 1 (unique server prox). Partial participation:
supported (``simulate(..., clients_per_round=k)``).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, check_prox_step, one_of, positive, positive_int
from .steps import damped_step_, prox_

__all__ = ["FedDR", "FedDRState"]


class FedDRState(NamedTuple):
    y: torch.Tensor  # [N, d] DR variables y_i (client side)
    x: torch.Tensor  # [N, d] local solutions x_i ≈ prox_{η f_i}(y_i)
    xhat: torch.Tensor  # [N, d] x̂_i = 2 x_i − y_i, the latest upload of each client
    xtilde: torch.Tensor  # [d] server average x̃ = (1/N) Σ_i x̂_i
    xbar: torch.Tensor  # [d] server model x̄ = prox_{η h}(x̃)
    t: int  # rounds done
    client_fields = ("y", "x", "xhat")  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class FedDR(ServerClientAlgorithm):
    """FedDR. ``eta``: η (prox parameter of f_i and of h); ``alpha``: α_DR (relaxation, in (0, 2));
    ``lr_local``: inner step; ``local_steps``: inner steps K; ``init_from``: "paper" | "code"."""

    eta: float
    lr_local: float
    local_steps: int
    alpha: float = 0.9
    init_from: str = "paper"

    name = "FedDR"
    spec = "docs/algorithms.md §5.8"
    status = "EXACT"
    reports = "x̄ (the server model, a prox output)"
    switches = ("init_from",)
    partial_participation = True

    def __post_init__(self):
        positive("eta", self.eta)
        positive("lr_local", self.lr_local)
        positive_int("local_steps", self.local_steps)
        positive("alpha", self.alpha)
        if not self.alpha < 2:
            raise fk.ParameterError(f"alpha (the DR relaxation) must be in (0, 2), got {self.alpha!r}", "alpha")
        one_of("init_from", self.init_from, ("paper", "code"))

    def validate(self, reg):
        super().validate(reg)
        check_prox_step(self.name, reg, self.eta, "eta (server prox step)",
                        "eta < 1/rho (docs/algorithms.md §5.8, §2.8)", ("eta",))

    def costs(self, num_clients):
        return Costs(client_prox=0, server_prox=1, up=1, down=1, grads=self.local_steps)

    def metric_step(self):
        return self.eta

    def _local_prox_(self, X, Y, C, G, clients, ids):
        """X <- K steps of x − lr (g_i(x) + (x − y_i)/η) from X (warm start); C is scratch."""
        torch.mul(Y, -1.0 / self.eta, out=C)  # the anchor term (x − y)/η = x/η + C
        for _ in range(self.local_steps):
            clients.gradients_(X, G, ids)
            damped_step_(X, G, C, self.lr_local, 1.0 / self.eta)

    def init(self, x0, clients):
        y, x = clients.new_stack(), clients.new_stack(x0)
        xhat = clients.new_stack()
        with torch.no_grad():
            if self.init_from == "paper":  # y_i = x⁰, x_i ≈ prox_{η f_i}(x⁰), x̂_i = 2 x_i − y_i
                y.copy_(x)
                self._local_prox_(x, y, clients.workspace("c"), clients.workspace("g"), clients, None)
                torch.sub(x, y, out=xhat).add_(x)
            xtilde = clients.mean(xhat)  # the server's x̃ = (1/N) Σ x̂_i
        return FedDRState(y=y, x=x, xhat=xhat, xtilde=xtilde, xbar=clients.new_vector(x0), t=0)

    def messages(self):
        # x̃ is the mean of the latest x̂_i of ALL clients: a non-participant's x̂_i did not move
        return Messages(up=("dxhat",), down=("xbar",), up_over_all=("dxhat",))

    def download(self, state, rng=None):
        return {"xbar": state.xbar}

    def client_update(self, state, down, clients, reg, ids):
        Y, X, Xh, xb = state.y, state.x, state.xhat, down["xbar"]  # the participants' rows
        k = clients.active_rows(ids)
        C, G, D = clients.workspace("c", k), clients.workspace("g", k), clients.workspace("d", k)
        fk.raw.cv_step_(Y, X, -xb, self.alpha)  # y_i <- y_i − α (x_i − x̄)
        self._local_prox_(X, Y, C, G, clients, ids)  # x_i ≈ prox_{η f_i}(y_i)
        torch.sub(X, Y, out=C).add_(X)  # x̂_i^new = 2 x_i − y_i
        torch.sub(C, Xh, out=D)  # Δx̂_i
        Xh.copy_(C)
        return {"dxhat": D}

    def server_update(self, state, up, down, reg):
        xtilde, xbar = state.xtilde, state.xbar
        xtilde.add_(up["dxhat"])  # x̃ += (1/N) Σ_{i∈S} Δx̂_i (mean of Δx̂ under full participation)
        prox_(xbar.copy_(xtilde), reg, self.eta)  # x̄ = prox_{ηh}(x̃)
        return state._replace(t=state.t + 1), {"xbar": xbar}

    def report(self, state, reg):
        return state.xbar
