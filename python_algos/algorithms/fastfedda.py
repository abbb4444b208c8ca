"""Fast-FedDA — docs/algorithms.md §5.5 (FROM-CODE: the authors' released code).

Bao, Crawshaw, Luo, Liu, "Fast Composite Optimization and Statistical Recovery in Federated
Learning", ICML 2022 (arXiv:2207.08204). The paper's Algorithm 1 text was not reachable; the rules
below are transcribed from the authors' public MATLAB code: repository
``MingruiLiu-ML-Lab/Federated-Sparse-Learning``, file ``LassoRun.m`` at commit ``48230c3``, section
"Fast FedDualAvg with strong convexity (Our proposal)". Every step is weighted equally, as there (a
third-party port weights them by (t + a)², so the paper's weighting is not confirmed).

Dual averaging with a strongly convex lower model: μ is the assumed strong-convexity modulus of f,
γ > 0 the weight of the prox centre x₀ (the initial model).

    primal(G, X, t) = prox_{h/b}(−a/b),  a = G/t − (μ/2) X/t − γ x₀/t,  b = μ/2 + γ/t
    server state: x₀ (fixed), G (sum of averaged gradients, 0), X (sum of primal iterates, x₀), w (x₀)
    round r = 1, 2, …, sampled clients S_r:
      client i:  G_i ← G;  X_i ← X;  v ← w
          for k = 1..K:  t = (r−1)K + k
              G_i ← G_i + ∇f_i(v);  v ← primal(G_i, X_i, t);  X_i ← X_i + v
          upload G_i, X_i
      server:  G ← mean G_i;  X ← mean X_i;  w ← primal(G, X, rK);  X ← X + w

−a/b is computed as (μ/2 · X − G + γ x₀) / (t μ/2 + γ) (the same value, one division). The server
keeps and sends the means (G, X) before its last two lines: w = primal(G, X, rK) and the sum X + w
are recomputed by each participant from the download (as the authors note, 2 vectors down instead
of 3). In round 1, w = x₀ goes through a prox of step 0 (the identity, one kernel evaluation), so
every round counts the same. Per round: C·K + 1 prox evaluations (the +1: w, once in a simulation,
where every participant gets the same download; once per participant when deployed), up 2 (G_i,
X_i), down 2; ``report`` recomputes w from the server's (G, X).

Validity: μ ≥ 0, γ > 0. The prox step 1/b = t/(tμ/2 + γ) grows with t towards 2/μ (without bound
when μ = 0): with a weakly convex h (MCP, SCAD) it passes the penalty's convexity limit 1/ρ, where
the exact prox kernels still return a global minimiser; ``validate`` warns once when that happens.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import NamedTuple

import torch

import fedkernels as fk

from .base import Costs, Messages, ServerClientAlgorithm, positive, positive_int
from .steps import load_rows_, prox_

__all__ = ["FastFedDA", "FastFedDAState"]


class FastFedDAState(NamedTuple):
    x0: torch.Tensor  # [d] prox centre: the initial model (fixed)
    G: torch.Tensor  # [d] the mean of the participants' gradient sums
    X: torch.Tensor  # [d] the mean of the participants' iterate sums (x0 before round 1), before X + w
    t: int  # rounds done
    client_fields = ()  # no per-client state: every participant starts from (G, X)


@dataclasses.dataclass(frozen=True)
class FastFedDA(ServerClientAlgorithm):
    """Fast-FedDA. ``mu``: μ (assumed strong convexity of f, ≥ 0); ``gamma``: γ (weight of the prox
    centre x₀, > 0); ``local_steps``: K."""

    gamma: float
    local_steps: int
    mu: float = 0.0

    name = "Fast-FedDA"
    spec = "docs/algorithms.md §5.5"
    status = "FROM-CODE"
    reports = "w = primal(G, X, rK) (the server's dual-averaging primal)"
    partial_participation = True

    def __post_init__(self):
        positive("gamma", self.gamma)
        positive_int("local_steps", self.local_steps)
        if isinstance(self.mu, bool) or not isinstance(self.mu, (int, float)) or not math.isfinite(self.mu) \
                or self.mu < 0:
            raise fk.ParameterError(f"mu must be a finite number >= 0, got {self.mu!r}", "mu")

    def step(self, t: int) -> float:
        """The prox step 1/b = t / (t μ/2 + γ) of primal(·, ·, t)."""
        return t / (t * self.mu / 2 + self.gamma)

    def validate(self, reg):
        super().validate(reg)
        rho = max([float(getattr(p, "rho", 0.0)) for _, p in reg.parts()] if isinstance(reg, fk.PerParameter)
                  else [float(getattr(reg, "rho", 0.0))])
        if rho > self.mu / 2:  # sup_t 1/b = 2/μ passes 1/ρ: t/(tμ/2 + γ) = 1/ρ at t = γ/(ρ − μ/2)
            t = math.ceil(self.gamma / (rho - self.mu / 2))
            warnings.warn(f"Fast-FedDA: the prox step 1/b = t/(t·mu/2 + gamma) reaches the weakly convex penalty's "
                          f"limit 1/rho = {1.0 / rho:g} at local step t ≈ {t} (mu = {self.mu:g}, gamma = "
                          f"{self.gamma:g}); from there the prox is not unique and the kernels return a global "
                          f"minimiser (docs/algorithms.md §5.5). Raise mu above 2·rho to stay below it.",
                          stacklevel=2)

    def costs(self, num_clients):
        return Costs(client_prox=num_clients * self.local_steps + 1, server_prox=0, up=2, down=2,
                     grads=self.local_steps)

    def metric_step(self):
        return self.step(1)

    def primal_(self, out, G, X, x0, t: int, reg):
        """out <- primal(G, X, t) (rows of a stack, or one vector)."""
        torch.mul(X, self.mu / 2, out=out).sub_(G).add_(x0, alpha=self.gamma).div_(t * self.mu / 2 + self.gamma)
        return prox_(out, reg, self.step(t))

    def model_(self, out, G, X, x0, r: int, reg):
        """out <- w after r rounds: primal(G, X, rK), or x0 (through a prox of step 0) before round 1."""
        if r == 0:
            return prox_(out.copy_(x0), reg, 0.0)
        return self.primal_(out, G, X, x0, r * self.local_steps, reg)

    def init(self, x0, clients):
        x0 = clients.new_vector(x0)
        return FastFedDAState(x0=x0, G=clients.new_vector(), X=x0.clone(), t=0)

    def messages(self):
        return Messages(up=("G", "X"), down=("G", "X"))

    def download(self, state, rng=None):
        return {"G": state.G, "X": state.X}

    def client_update(self, state, down, clients, reg, ids):
        n, K, r, x0 = clients.active_rows(ids), self.local_steps, state.t, state.x0
        w = self.model_(clients.workspace("w", 1)[0], down["G"], down["X"], x0, r, reg)  # the server's model
        Gs, Xs = load_rows_(clients.workspace("G", n), down["G"]), load_rows_(clients.workspace("X", n), down["X"])
        if r > 0:
            Xs.add_(w)  # the server's X <- X + w
        V, grad = load_rows_(clients.workspace("v", n), w), clients.workspace("g", n)
        for k in range(1, K + 1):
            clients.gradients_(V, grad, ids)
            Gs.add_(grad)
            self.primal_(V, Gs, Xs, x0, r * K + k, reg)
            Xs.add_(V)
        return {"G": Gs, "X": Xs}

    def server_update(self, state, up, down, reg):
        G, X = state.G.copy_(up["G"]), state.X.copy_(up["X"])
        return state._replace(t=state.t + 1), {"G": G, "X": X}

    def report(self, state, reg):
        return self.model_(torch.empty_like(state.x0), state.G, state.X, state.x0, state.t, reg)
