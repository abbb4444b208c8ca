"""SCAFFOLD, option II — docs/algorithms.md §5.6 (EXACT, standard; seed 003 eq. 14). A smooth method.

Karimireddy et al., ICML 2020:

    init: c = 0, c_i = 0
    client i:  receive (x, c)
               y_i = x;  for k < K:  y_i <- y_i − η_l ( g_i(y_i) − c_i + c )
               c_i^+ = c_i − c + (x − y_i)/(K η_l)                            # option II
               upload (dy_i, dc_i) = (y_i − x, c_i^+ − c_i);  c_i <- c_i^+
    server:    x <- x + η_g (1/N) Σ_i dy_i;   c <- c + (1/N) Σ_i dc_i          -> broadcast (x, c)

Per round: up 2 (dy, dc), down 2 (x, c); no prox; K gradients. Partial participation (the spec's sampled
set S, ``simulate(..., clients_per_round=k)``): only the participants run and update c_i (the
others keep theirs); x averages their model updates, c <- c + (1/N) Σ_{i∈S} (c_i^+ − c_i).
With h = 0 and full participation,
SCAFFOLD, FedCanon (η_l = β, η_g = α/(βK)) and FedNMap (η_l = η, η_g = γ_s) produce identical
iterates (§7.3). With a nonzero regularizer the update ignores h (a warning is issued).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, positive, positive_int
from .steps import load_rows_, warn_smooth

__all__ = ["SCAFFOLD", "SCAFFOLDState"]


class SCAFFOLDState(NamedTuple):
    x: torch.Tensor  # [d] server model x
    c: torch.Tensor  # [d] server control variate c
    c_i: torch.Tensor  # [N, d] client control variates c_i
    t: int  # rounds done
    client_fields = ("c_i",)  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class SCAFFOLD(ServerClientAlgorithm):
    """SCAFFOLD option II. ``lr_local``: η_l; ``lr_global``: η_g; ``local_steps``: K."""

    lr_local: float
    local_steps: int
    lr_global: float = 1.0

    name = "SCAFFOLD"
    spec = "docs/algorithms.md §5.6"
    status = "EXACT"
    reports = "x (the server model)"
    composite = False
    partial_participation = True

    def __post_init__(self):
        positive("lr_local", self.lr_local)
        positive("lr_global", self.lr_global)
        positive_int("local_steps", self.local_steps)

    def validate(self, reg):
        super().validate(reg)
        warn_smooth(self.name, reg)

    def costs(self, num_clients):
        return Costs(client_prox=0, server_prox=0, up=2, down=2, grads=self.local_steps)

    def metric_step(self):
        return self.lr_global * self.lr_local * self.local_steps

    def init(self, x0, clients):
        return SCAFFOLDState(x=clients.new_vector(x0), c=clients.new_vector(), c_i=clients.new_stack(), t=0)

    def messages(self):
        # c averages over all N clients: a non-participant's c_i did not change (dc_i = 0)
        return Messages(up=("dy", "dc"), down=("x", "c"), up_over_all=("dc",))

    def download(self, state, rng=None):
        return {"x": state.x, "c": state.c}

    def client_update(self, state, down, clients, reg, ids):
        eta_l, K = self.lr_local, self.local_steps
        x, c, Ci = down["x"], down["c"], state.c_i  # Ci: the participants' rows
        k = clients.active_rows(ids)
        Y, G, corr = clients.workspace("y", k), clients.workspace("g", k), clients.workspace("corr", k)
        torch.sub(c, Ci, out=corr)  # c − c_i, fixed during the round
        load_rows_(Y, x)  # y_i = x
        for _ in range(K):
            clients.gradients_(Y, G, ids)
            fk.raw.cv_step_(Y, G, corr, eta_l)  # y_i <- y_i − η_l (g_i − c_i + c)
        dy = Y.sub_(x)  # y_i − x
        dc = torch.div(dy, -K * eta_l, out=corr).sub_(c)  # c_i^+ − c_i = −c + (x − y_i)/(K η_l)
        Ci.add_(dc)  # c_i <- c_i^+
        return {"dy": dy, "dc": dc}

    def server_update(self, state, up, down, reg):
        x, c = state.x, state.c
        x.add_(up["dy"], alpha=self.lr_global)  # x <- x + η_g (1/|S|) Σ_{i∈S} (y_i − x)
        c.add_(up["dc"])  # c <- c + (1/N) Σ_{i∈S} (c_i^+ − c_i)
        return state._replace(t=state.t + 1), {"x": x, "c": c}

    def report(self, state, reg):
        return state.x
