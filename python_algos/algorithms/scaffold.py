"""SCAFFOLD, option II — docs/algorithms.md §5.6 (EXACT, standard; seed 003 eq. 14). A smooth method.

Karimireddy et al., ICML 2020:

    init: c = 0, c_i = 0
    client i:  y_i = x;  for k < K:  y_i <- y_i − η_l ( g_i(y_i) − c_i + c )
               c_i^+ = c_i − c + (x − y_i)/(K η_l)                            # option II
               upload (y_i − x, c_i^+ − c_i);  c_i <- c_i^+
    server:    x <- x + η_g (1/N) Σ_i (y_i − x);   c <- c + (1/N) Σ_i (c_i^+ − c_i)

Per round: up 2, down 2 (x, c); no prox; K gradients. Partial participation (the spec's sampled
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

from .base import Algorithm, Costs, positive, positive_int
from .steps import load_rows_, put_rows_, rows_, warn_smooth

__all__ = ["SCAFFOLD", "SCAFFOLDState"]


class SCAFFOLDState(NamedTuple):
    x: torch.Tensor  # [d] server model x
    c: torch.Tensor  # [d] server control variate c
    c_i: torch.Tensor  # [N, d] client control variates c_i
    t: int  # rounds done
    client_fields = ("c_i",)  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class SCAFFOLD(Algorithm):
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

    def round(self, state, clients, reg, rng=None):
        eta_l, eta_g, K = self.lr_local, self.lr_global, self.local_steps
        x, c, c_i = state.x, state.c, state.c_i
        ids = clients.participants()  # None: all N clients
        k = clients.active_rows(ids)
        Y, G, corr = clients.workspace("y", k), clients.workspace("g", k), clients.workspace("corr", k)
        Ci = rows_(c_i, ids, clients.workspace("c_i", k))  # the participants' c_i (c_i itself when all)
        with torch.no_grad():
            torch.sub(c, Ci, out=corr)  # c − c_i, fixed during the round
            load_rows_(Y, x)  # y_i = x
            for _ in range(K):
                clients.gradients_(Y, G, ids)
                fk.raw.cv_step_(Y, G, corr, eta_l)  # y_i <- y_i − η_l (g_i − c_i + c)
            dy = Y.sub_(x)  # y_i − x
            dc = torch.div(dy, -K * eta_l, out=corr).sub_(c)  # c_i^+ − c_i = −c + (x − y_i)/(K η_l)
            put_rows_(c_i, ids, Ci.add_(dc))  # c_i <- c_i^+
            # server
            x.add_(clients.mean(dy, ids), alpha=eta_g)  # x <- x + η_g (1/|S|) Σ_{i∈S} (y_i − x)
            n_all = None if ids is None else clients.num_clients
            c.add_(clients.mean(dc, ids, divisor=n_all))  # c <- c + (1/N) Σ_{i∈S} (c_i^+ − c_i)
            x, c = clients.broadcast(x), clients.broadcast(c)
        return SCAFFOLDState(x=x, c=c, c_i=c_i, t=state.t + 1)

    def report(self, state, reg):
        return state.x
