"""ZA1 (Zhang–Hu–Johansson composite FL) — docs/algorithms.md §4.3 (HC-RECON).

Each client keeps a pre-proximal model ẑ (corrected gradient steps, never proxed) and evaluates
gradients at the post-proximal model z = prox_{(t+1)η h}(ẑ); the server does one prox-SGD step:

    client i (client_update):   ẑ_{i,0}^r = z_{i,0}^r = x^r
               ẑ_{i,t+1}^r = ẑ_{i,t}^r − η ( g_i(z_{i,t}^r) + c_i^r )        t < τ
               z_{i,t+1}^r = prox_{(t+1)η h}( ẑ_{i,t+1}^r )
               upload ẑ_{i,τ}^r
    server (server_update):     x̂^{r+1} = x^r + η_g ( (1/N) Σ_i ẑ_{i,τ}^r − x^r )
               x^{r+1}  = prox_{η_g η τ h}( x̂^{r+1} );   broadcast x̂^{r+1}
    client i (client_receive):  x^{r+1}   = prox_{η_g η τ h}( x̂^{r+1} )        (recomputed locally)
               c_i^{r+1} = c_i^r + (ẑ_{i,τ}^r − x^r)/(η τ) − (x̂^{r+1} − x^r)/(η_g η τ)

Implementation notes:

* z_{i,τ} is never used, so the last local step does no prox: N(τ − 1) local prox evaluations
  plus N for the clients' recomputation of x^{r+1}, i.e. **τ per client**, and 1 on the server
  (FedCanon's Table III counts N(K+1)+1 because it also counts the unused z_{i,τ}).
* The control update is written as ``c_i <- c_i + d̄ − d_i`` with d_i = (x^r − ẑ_{i,τ})/(ητ) and
  d̄ = (x^r − x̂^{r+1})/(η_g ητ), the same algebra as the spec line, using each client's own copy
  of x^r.
* x̂^1 (reconstruction uncertainty in §4.3) never influences the iterates here: round 1 starts
  from x^1 = the initial model, which every client holds; ``state.xhat`` starts equal to x^1.

Validity (§7.4, only when h is weakly convex; the paper assumes convex h): the largest local prox
step τη and the server step η_g η τ must satisfy step · ρ < 1.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, check_prox_step, positive, positive_int
from .steps import load_rows_, prox_

__all__ = ["ZA1", "ZA1State"]


class ZA1State(NamedTuple):
    x: torch.Tensor  # [d] server's post-prox global model x^r
    xhat: torch.Tensor  # [d] server's pre-prox global model x̂^r (x^r = prox_{η_g η τ h}(x̂^r) for r >= 2)
    x_clients: torch.Tensor  # [N, d] each client's copy of x^r (recomputed locally from x̂^r)
    c: torch.Tensor  # [N, d] corrections c_i^r, sum_i c_i = 0
    t: int  # rounds done
    client_fields = ("x_clients", "c")  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class ZA1(ServerClientAlgorithm):
    """ZA1. ``eta``: local step η; ``eta_g``: global step η_g; ``local_steps``: τ."""

    eta: float
    local_steps: int
    eta_g: float = 1.0

    name = "ZA1"
    spec = "docs/algorithms.md §4.3"
    status = "HC-RECON"
    reports = "x (the post-prox global model)"
    participation_note = ("its control variates keep the invariant sum_i c_i = 0 only when every client "
                          "updates every round; naive sampling breaks it (docs/algorithms.md §1.4, §7.2)")

    def __post_init__(self):
        positive("eta", self.eta)
        positive("eta_g", self.eta_g)
        positive_int("local_steps", self.local_steps)

    @property
    def server_step(self) -> float:
        """η_g η τ, the server's (and the recomputation's) prox step."""
        return self.eta_g * self.eta * self.local_steps

    def validate(self, reg):
        super().validate(reg)
        rule = "tau*eta < 1/rho and eta_g*eta*tau < 1/rho (docs/algorithms.md §4.3/§7.4)"
        check_prox_step(self.name, reg, self.local_steps * self.eta, "tau*eta (largest local prox step)", rule,
                        ("eta", "local_steps"))
        check_prox_step(self.name, reg, self.server_step, "eta_g*eta*tau (server prox step)", rule,
                        ("eta_g", "eta", "local_steps"))

    def costs(self, num_clients):
        return Costs(client_prox=num_clients * self.local_steps, server_prox=1, up=1, down=1, grads=self.local_steps)

    def metric_step(self):
        return self.server_step

    def normal_map_point(self, state):
        return state.xhat, self.server_step

    def init(self, x0, clients):
        x = clients.new_vector(x0)  # x^1 = the initial post-prox model
        return ZA1State(x=x, xhat=x.clone(), x_clients=clients.new_stack(x0), c=clients.new_stack(), t=0)

    def messages(self):
        return Messages(up=("zhat",), down=("xhat",))

    def download(self, state, rng=None):
        return {}  # every client starts from its own copy of x^r

    def client_update(self, state, down, clients, reg, ids):
        eta, tau, xc, c = self.eta, self.local_steps, state.x_clients, state.c
        k = clients.active_rows(ids)
        Zhat, Z, G = clients.workspace("zhat", k), clients.workspace("z", k), clients.workspace("g", k)
        load_rows_(Zhat, xc)  # ẑ_{i,0} = z_{i,0} = x^r
        load_rows_(Z, xc)
        for t in range(tau):
            clients.gradients_(Z, G, ids)  # g_i(z_{i,t}) at the post-prox point
            if t < tau - 1:  # ẑ <- ẑ − η(g + c_i);  z <- prox_{(t+1)η h}(ẑ)
                fk.fused.za1_step_(Zhat, Z, G, c, eta, reg, (t + 1) * eta, fast=True)
            else:  # z_{i,τ} is never used: no prox
                fk.raw.cv_step_(Zhat, G, c, eta)
        return {"zhat": Zhat}  # upload ẑ_{i,τ}

    def server_update(self, state, up, down, reg):
        x = state.x
        xhat = torch.lerp(x, up["zhat"], self.eta_g)  # x̂^{r+1} = x^r + η_g (mean ẑ − x^r)
        x.copy_(xhat)
        prox_(x, reg, self.server_step)  # x^{r+1} = prox_{η_g η τ h}(x̂^{r+1})
        return state._replace(xhat=xhat, t=state.t + 1), {"xhat": xhat}

    def client_receive(self, state, down, up, clients, reg, ids):
        eta, tau, xc, xhat = self.eta, self.local_steps, state.x_clients, down["xhat"]
        # c_i^{r+1} = c_i + d̄ − d_i, with its own copy x^r
        d = fk.raw.normalized_delta_(up["zhat"], xc, eta, tau)  # d_i = (x^r − ẑ_{i,τ}) / (ητ)
        G = clients.workspace("g", clients.active_rows(ids))
        dbar = fk.raw.normalized_delta_(load_rows_(G, xhat), xc, self.eta_g * eta, tau)  # (x^r − x̂^{r+1})/(η_g ητ)
        fk.raw.control_update_(state.c, dbar, d)
        prox_(load_rows_(xc, xhat), reg, self.server_step)  # x^{r+1} = prox_{η_g η τ h}(x̂^{r+1}), recomputed locally

    def report(self, state, reg):
        return state.x
