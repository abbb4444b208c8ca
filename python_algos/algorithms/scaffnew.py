"""SCAFFNEW (ProxSkip applied to FL) — docs/algorithms.md §5.7 (EXACT, seed 003 eq. 15). A smooth method.

Mishchenko, Malinovsky, Stich, Richtárik, ICML 2022. Every iteration, every client:

    x̂_i = x_i − γ ( g_i(x_i) − h_i )
    with probability p (one coin shared by all clients):  x_i^+ = (1/N) Σ_j x̂_j   (communication)
    otherwise:                                             x_i^+ = x̂_i
    h_i <- h_i + (p/γ) ( x_i^+ − x̂_i )

As client and server programs, one communication per round: the server tosses the shared coin
until it comes up heads, which fixes n, the round's number of local iterations (sent with the
download as a round setting, a scalar; the generator is the run's server generator, so the
tosses are those of the per-iteration form, in the same order):

    client i (client_update):   n times  x_i <- x_i − γ ( g_i(x_i) + e_i );   upload x_i (= x̂_i)
    server (server_update):     x̄ = (1/N) Σ_i x̂_i                            -> broadcast x̄
    client i (client_receive):  e_i <- e_i − (p/γ) ( x̄ − x̂_i );   x_i <- x̄

The control variates h_i are stored as e_i = −h_i (seed 003's notation; it also keeps them apart
from the regularizer h), so the local step is the fused ``x̂ = x − γ (g + e)``. Σ_i e_i = 0.

One ``round`` is one **communication round**: local iterations are run until the shared coin
(drawn from the run's server generator) comes up heads, so a round has a Geometric(p) number of
local steps, 1/p on average (use p ≈ 1/K to match K local steps). Per communication: up 1,
down 1; no prox. Reported model: the average x̄ (every client holds it after a communication).
With a nonzero regularizer the update ignores h (SCAFFNEW is not a composite method; a warning is
issued).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, positive
from .steps import load_rows_, warn_smooth

__all__ = ["SCAFFNEW", "SCAFFNEWState"]


class SCAFFNEWState(NamedTuple):
    x: torch.Tensor  # [N, d] client models x_i
    e: torch.Tensor  # [N, d] e_i = −h_i (control variates), sum_i e_i = 0
    xbar: torch.Tensor  # [d] the model averaged at the last communication
    t: int  # communication rounds done
    iterations: int  # local iterations done
    client_fields = ("x", "e")  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class SCAFFNEW(ServerClientAlgorithm):
    """SCAFFNEW / ProxSkip-FL. ``lr``: γ; ``p``: communication probability."""

    lr: float
    p: float

    name = "SCAFFNEW"
    spec = "docs/algorithms.md §5.7"
    status = "EXACT"
    reports = "x̄ (the averaged model)"
    participation_note = ("every client takes every local step and each communication averages all N "
                          "clients, keeping sum_i h_i = 0 (ProxSkip, docs/algorithms.md §5.7)")
    composite = False

    def __post_init__(self):
        positive("lr", self.lr)
        if not (isinstance(self.p, (int, float)) and 0 < self.p <= 1):
            raise fk.ParameterError(f"p must be in (0, 1], got {self.p!r}", "p")

    def validate(self, reg):
        super().validate(reg)
        warn_smooth(self.name, reg)

    def costs(self, num_clients):
        return Costs(client_prox=0, server_prox=0, up=1, down=1, grads=1 / self.p)

    def metric_step(self):
        return self.lr / self.p

    def init(self, x0, clients):
        return SCAFFNEWState(x=clients.new_stack(x0), e=clients.new_stack(), xbar=clients.new_vector(x0), t=0,
                             iterations=0)

    def messages(self):
        return Messages(up=("x",), down=("xbar",))

    def download(self, state, rng=None):
        """The round setting: n local iterations, the tosses of the shared coin up to the first
        heads (each local iteration is followed by one toss; tails: x_i^+ = x̂_i, h_i unchanged)."""
        n = 1
        while not (self.p >= 1.0 or float(torch.rand((), generator=rng, dtype=torch.float64)) < self.p):
            n += 1
        return {"iterations": n}

    def client_update(self, state, down, clients, reg, ids):
        X, E = state.x, state.e
        G = clients.workspace("g", clients.active_rows(ids))
        for _ in range(down["iterations"]):
            clients.gradients_(X, G, ids)
            fk.raw.cv_step_(X, G, E, self.lr)  # x̂_i = x_i − γ (g_i − h_i)
        return {"x": X}

    def server_update(self, state, up, down, reg):
        xbar = state.xbar.copy_(up["x"])  # x_i^+ = (1/N) Σ_j x̂_j
        return state._replace(t=state.t + 1, iterations=state.iterations + down["iterations"]), {"xbar": xbar}

    def client_receive(self, state, down, up, clients, reg, ids):
        X, xbar = state.x, down["xbar"]
        D = fk.raw.normalized_delta_(X, xbar, self.lr / self.p, 1)  # (p/γ)(x_i^+ − x̂_i)
        fk.raw.control_update_(state.e, torch.zeros_like(xbar), D)  # e_i <- e_i − (p/γ)(x_i^+ − x̂_i)
        load_rows_(X, xbar)

    def report(self, state, reg):
        return state.xbar
