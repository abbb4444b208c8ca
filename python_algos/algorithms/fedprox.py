"""FedProx — docs/algorithms.md §5.10 (EXACT, standard), with an optional server prox (**our composite
extension**, not part of the original method).

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020 (arXiv:1812.06127). Round t with
participating set S_t (all N clients under full participation):

    client i ∈ S_t:  receive x^t
                     x_i = x^t;  K steps  x_i <- x_i − η ( g_i(x_i) + μ (x_i − x^t) )
                     upload dx_i = x^t − x_i
    server:          x^{t+1} = x^t − (1/|S_t|) Σ_{i ∈ S_t} dx_i     (the average model)  -> broadcast x
    composite extension (``server_prox=True``):
                     x^{t+1} = prox_{s h}( x^t + (1/|S_t|) Σ_{i ∈ S_t} (x_i − x^t) ),
                     s = ``server_prox_step``, default η K (the clients' total step, as FedMiD's
                     server prox η_s η_c K with η_s = 1)

Uniform weights (§1.4; the original weights by sample counts). μ = 0 gives FedAvg. Per round:
up 1, down 1; no prox (extension: 1 on the server); K gradients per participating client. The
original method is smooth: with ``server_prox=False`` and h ≠ 0 the update ignores h (a warning
is issued) and the metrics still report f + h. Partial participation: supported.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Optional

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, check_prox_step, positive, positive_int
from .steps import damped_step_, load_rows_, sgd_step_, warn_smooth

__all__ = ["FedProx", "FedProxState"]


class FedProxState(NamedTuple):
    x: torch.Tensor  # [d] server model x^t
    t: int  # rounds done
    client_fields = ()  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class FedProx(ServerClientAlgorithm):
    """FedProx. ``lr_local``: η; ``local_steps``: K; ``mu``: μ >= 0 (proximal weight);
    ``server_prox``: apply prox_{s h} to the average (our composite extension);
    ``server_prox_step``: s (default η K)."""

    lr_local: float
    local_steps: int
    mu: float = 0.01
    server_prox: bool = False
    server_prox_step: Optional[float] = None

    name = "FedProx"
    spec = "docs/algorithms.md §5.10"
    status = "EXACT"
    reports = "x (the server model; a prox output with server_prox)"
    switches = ("server_prox",)
    partial_participation = True

    def __post_init__(self):
        positive("lr_local", self.lr_local)
        positive_int("local_steps", self.local_steps)
        if (isinstance(self.mu, bool) or not isinstance(self.mu, (int, float)) or not math.isfinite(self.mu)
                or self.mu < 0):
            raise fk.ParameterError(f"mu must be a finite number >= 0, got {self.mu!r}", "mu")
        if not isinstance(self.server_prox, bool):
            raise fk.ParameterError(f"server_prox must be a bool, got {self.server_prox!r}", "server_prox")
        if self.server_prox_step is not None:
            positive("server_prox_step", self.server_prox_step)
            if not self.server_prox:
                raise fk.ParameterError("server_prox_step is only used with server_prox=True", "server_prox_step",
                                        "server_prox")

    @property
    def composite(self) -> bool:  # the original FedProx is smooth; the extension applies h
        return self.server_prox

    @property
    def step(self) -> float:
        """The server prox step s (extension): ``server_prox_step`` or η K."""
        return self.server_prox_step if self.server_prox_step is not None else self.lr_local * self.local_steps

    def validate(self, reg):
        super().validate(reg)
        if self.server_prox:
            made_of = ("server_prox_step",) if self.server_prox_step is not None else ("lr_local", "local_steps")
            check_prox_step(self.name, reg, self.step, "server_prox_step (server prox step s)",
                            "s < 1/rho (composite extension of docs/algorithms.md §5.10)", (*made_of, "server_prox"))
        else:
            warn_smooth(self.name, reg)

    def costs(self, num_clients):
        return Costs(client_prox=0, server_prox=int(self.server_prox), up=1, down=1, grads=self.local_steps)

    def metric_step(self):
        return self.step

    def init(self, x0, clients):
        return FedProxState(x=clients.new_vector(x0), t=0)

    def messages(self):
        return Messages(up=("dx",), down=("x",))

    def download(self, state, rng=None):
        return {"x": state.x}

    def client_update(self, state, down, clients, reg, ids):
        eta, mu, x = self.lr_local, self.mu, down["x"]
        k = clients.active_rows(ids)
        X, G = clients.workspace("x", k), clients.workspace("g", k)
        anchor = torch.mul(x, -mu)  # μ (x_i − x^t) = μ x_i + anchor
        load_rows_(X, x)  # x_i = x^t
        for _ in range(self.local_steps):
            clients.gradients_(X, G, ids)
            damped_step_(X, G, anchor, eta, mu)  # x_i <- x_i − η (g_i + μ (x_i − x^t))
        return {"dx": fk.raw.normalized_delta_(X, x, 1.0, 1)}  # x^t − x_i

    def server_update(self, state, up, down, reg):
        x, avg = state.x, up["dx"]  # x^t − (average client model)
        if self.server_prox:
            fk.fused.prox_grad_step_(x, avg, 1.0, reg, self.step, fast=True)  # prox_{s h}(average)
        else:
            sgd_step_(x, avg, 1.0)  # x^{t+1} = average
        return state._replace(t=state.t + 1), {"x": x}

    def report(self, state, reg):
        return state.x
