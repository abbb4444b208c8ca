"""FedNMap (normal-map composite FL) — docs/algorithms.md §4.4 (RECONSTRUCTED).

The server variable z is the normal-map variable, the model is x = prox_{λh}(z); clients run Q
corrected steps on the (unbiased) stochastic normal map g_i(x) + (z − x)/λ:

    server -> client i: z^t and (t >= 1) d̄^{t−1}
    client i (client_update):
      (4)  c_i^t = c_i^{t−1} + d̄^{t−1} − d_i^{t−1}           (t >= 1;  c_i^0 = 0)
           z_i^{t,0} = z^t
           for q < Q:
      (5a)     x_i^{t,q}   = prox_{λh}( z_i^{t,q} )
      (5b)     z_i^{t,q+1} = z_i^{t,q} − η ( g_i(x_i^{t,q}) + (z_i^{t,q} − x_i^{t,q})/λ + c_i^t )
      (6)  d_i^t = (z^t − z_i^{t,Q}) / (η Q)                   -> upload d_i (one vector)
    server (server_update):
      (7)  d̄^t = (1/N) Σ_i d_i^t;   z^{t+1} = z^t − α d̄^t,   α = γ_s η Q   -> broadcast z (and d̄)
    client i (client_receive): keep d̄^t for (4) of the next round
    output x^t = prox_{λh}(z^t)

(5b) and the next step's (5a) are one fused kernel (``fk.fused.normal_map_step_``); the last
step's (5a) output x_i^{t,Q} is never used and is not computed, so a round costs N·Q prox
evaluations on clients and 0 on the server (the reported x = prox_{λh}(z) is computed outside the
round, +1 if a server reports it).

Reconstructed details and their switches (§4.4 R1–R3):

* ``c_update_at`` (R1), default ``"round_start"`` (the spec's form): the client applies (4) at
  the start of round t with the previous round's d̄ and d_i. ``"round_end"`` applies the same
  update right after the server step (FedCanon's placement). With full participation the two give
  bitwise identical iterates; they differ in what a client keeps between rounds (``round_start``
  keeps d_i and needs d̄^{t−1} in the next downlink) and will differ under partial participation.
* ``downlink`` (communication form of d̄), default ``"z_dbar"``: the server sends z^t and
  d̄^{t−1} (down 2). ``"z"``: it sends only z^t (down 1) and the client recovers
  d̄^{t−1} = (z^{t−1} − z^t)/α from two consecutive broadcasts (same values up to round-off;
  requires ``c_update_at="round_start"``).
* ``server_scale`` γ_s (R3), default 1 (plain averaging: z^{t+1} = mean_i z_i^{t,Q}).
* R2 (upload d_i rather than z_i^{t,Q}) is equivalent and has no switch.

Validity (§7.4): λ < 1/ρ — the normal map needs a single-valued prox_{λh}, so a weakly convex h
with λρ >= 1 is rejected. With h = 0 the iterates equal SCAFFOLD option II with η_l = η,
η_g = γ_s (§7.3).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, check_prox_step, one_of, positive, positive_int
from .steps import load_rows_, prox, prox_

__all__ = ["FedNMap", "FedNMapState"]

_ZERO = fk.Zero()


class FedNMapState(NamedTuple):
    z: torch.Tensor  # [d] server normal-map variable z^t (the model is prox_{λh}(z^t))
    c: torch.Tensor  # [N, d] corrections c_i, sum_i c_i = 0
    d: torch.Tensor  # [N, d] each client's last uplink d_i^{t−1}
    dbar: torch.Tensor  # [d] the clients' copy of d̄^{t−1}
    z_prev: Optional[torch.Tensor]  # [d] the clients' copy of z^{t−1} (downlink="z" only)
    t: int  # rounds done
    client_fields = ("c", "d")  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)
    client_copies = ("dbar", "z_prev")  # client state identical on every client: one [d] copy here, each client its own


@dataclasses.dataclass(frozen=True)
class FedNMap(ServerClientAlgorithm):
    """FedNMap. ``lam``: λ; ``eta``: η; ``local_steps``: Q; ``server_scale``: γ_s (α = γ_s η Q)."""

    lam: float
    eta: float
    local_steps: int
    server_scale: float = 1.0
    c_update_at: str = "round_start"
    downlink: str = "z_dbar"

    name = "FedNMap"
    spec = "docs/algorithms.md §4.4"
    status = "RECONSTRUCTED"
    reports = "x = prox_{λh}(z)"
    participation_note = ("its control variates keep the invariant sum_i c_i = 0 only when every client "
                          "updates every round; naive sampling breaks it (docs/algorithms.md §1.4, §7.2)")
    switches = ("c_update_at", "downlink", "server_scale")

    def __post_init__(self):
        positive("lam", self.lam)
        positive("eta", self.eta)
        positive("server_scale", self.server_scale)
        positive_int("local_steps", self.local_steps)
        one_of("c_update_at", self.c_update_at, ("round_start", "round_end"))
        one_of("downlink", self.downlink, ("z_dbar", "z"))
        if self.downlink == "z" and self.c_update_at != "round_start":
            raise fk.ParameterError('downlink="z" recovers d̄^{t−1} at the start of round t, '
                                    'so it needs c_update_at="round_start"', "downlink", "c_update_at")

    @property
    def alpha(self) -> float:
        """The effective server step α = γ_s η Q."""
        return self.server_scale * self.eta * self.local_steps

    def validate(self, reg):
        super().validate(reg)
        check_prox_step(self.name, reg, self.lam, "lam",
                        "lam < 1/rho (the normal map needs a unique prox_{lam h}; docs/algorithms.md §4.4/§7.4)",
                        ("lam",))

    def costs(self, num_clients):
        down = 2 if self.downlink == "z_dbar" else 1
        return Costs(client_prox=num_clients * self.local_steps, server_prox=0, up=1, down=down, grads=self.local_steps)

    def metric_step(self):
        return self.lam

    def normal_map_point(self, state):
        return state.z, self.lam

    def init(self, x0, clients):
        z = clients.new_vector(x0)  # z^0 = the initial model (reported model: prox_{λh}(z^0))
        z_prev = z.clone() if self.downlink == "z" else None
        return FedNMapState(z=z, c=clients.new_stack(), d=clients.new_stack(), dbar=clients.new_vector(),
                            z_prev=z_prev, t=0)

    def messages(self):
        return Messages(up=("d",), down=("z", "dbar") if self.downlink == "z_dbar" else ("z",))

    def download(self, state, rng=None):
        return {"z": state.z}

    def client_update(self, state, down, clients, reg, ids):
        lam, eta, Q = self.lam, self.eta, self.local_steps
        z, c, D, dbar = down["z"], state.c, state.d, state.dbar
        k = clients.active_rows(ids)
        X, G = clients.workspace("x", k), clients.workspace("g", k)
        if state.t >= 1 and self.c_update_at == "round_start":
            if self.downlink == "z":  # d̄^{t−1} = (z^{t−1} − z^t)/α from two broadcasts
                dbar.copy_(fk.raw.normalized_delta(state.z_prev, z, self.server_scale * eta, Q))
            fk.raw.control_update_(c, dbar, D)  # (4) c_i^t = c_i^{t−1} + d̄^{t−1} − d_i^{t−1}
        if self.downlink == "z":
            state.z_prev.copy_(z)  # the client keeps z^t to recover d̄^t next round
        Z = load_rows_(D, z)  # z_i^{t,0} = z^t  (D's buffer is free once (4) has used it)
        prox_(load_rows_(X, z), reg, lam)  # (5a) x_i^{t,0} = prox_{λh}(z_i^{t,0})
        for q in range(Q):
            clients.gradients_(X, G, ids)
            # (5b) z <- z − η(g + c + (z − x)/λ), fused with (5a) x <- prox_{λh}(z) of the next step
            fk.fused.normal_map_step_(Z, X, G, c, eta, lam, reg if q < Q - 1 else _ZERO, fast=True)
        return {"d": fk.raw.normalized_delta_(Z, z, eta, Q)}  # (6) d_i = (z^t − z_i^{t,Q}) / (ηQ), kept in state.d

    def server_update(self, state, up, down, reg):
        z, dbar = state.z, up["d"]  # (7) d̄^t
        z.sub_(dbar, alpha=self.alpha)  # z^{t+1} = z^t − α d̄^t
        return state._replace(t=state.t + 1), ({"z": z, "dbar": dbar} if self.downlink == "z_dbar" else {"z": z})

    def client_receive(self, state, down, up, clients, reg, ids):
        if self.downlink == "z_dbar":
            state.dbar.copy_(down["dbar"])  # the client's copy of d̄^t
        if self.c_update_at == "round_end":
            fk.raw.control_update_(state.c, down["dbar"], up["d"])  # (4) applied right away

    def report(self, state, reg):
        return prox(state.z, reg, self.lam)
