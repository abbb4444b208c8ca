"""DEPOSITUM (decentralized proximal stochastic gradient tracking with momentum) — docs/algorithms.md §4.5
(RECONSTRUCTED; seed 002, formulas stripped).

Zhou, Shi, Li, Zhong, Wen, Cao, arXiv:2504.12742. No server: N clients on an undirected connected
graph with a symmetric doubly-stochastic mixing matrix W (:mod:`python_algos.algorithms.topology`), which
is used every ``period`` = τ iterations (W_t = W if (t + 1) mod τ == 0, else I). Iteration
t = 0..T−1, every client i (adapt-then-combine):

    (10)  SHB : m_i^{t+1} = β m_i^t + (1 − β) y_i^t ;   dir_i^{t+1} = m_i^{t+1}
    (11)  SNAG: m_i^{t+1} = β m_i^t + (1 − β) y_i^t ;   dir_i^{t+1} = β m_i^{t+1} + (1 − β) y_i^t
    (12a) x̃_i^{t+1} = prox_{s h}( x_i^t − α dir_i^{t+1} ) ;   x_i^{t+1} = Σ_j [W_t]_ij x̃_j^{t+1}
          g_i^{t+1} = g_i(x_i^{t+1})                                             (fresh minibatch)
    (12b) ỹ_i^{t+1} = y_i^t + γ ( g_i^{t+1} − g_i^t ) ;        y_i^{t+1} = Σ_j [W_t]_ij ỹ_j^{t+1}

Initialization x_i^0 = x^0, m_i^0 = y_i^0 = g_i^0 = 0 (so the first iteration is a pure prox
step). Invariant (Remark 1, §7.2): mean_i y_i^t = γ mean_i g_i^t for every t. Output: the client
average x̄^T. With W = J (complete graph, Metropolis–Hastings weights) and τ = 1 every row is the
same and this is the server form (Remark 3).

**One ``simulate`` round is one iteration**: ``rounds`` counts iterations, the gossip happens on
rounds r = t + 1 that are multiples of τ, and ``grad_evals`` / ``prox_evals`` are N per round.
Momentum, direction and prox are one fused kernel call on the ``[N, d]`` stacks
(``fk.fused.depositum_step_``); each gossip is one (dense or sparse COO) matrix product
(``clients.gossip_``). With the stacks in a client-state store (``state="ram"|"disk"``) the round
streams the clients in chunks, the same bits (:mod:`.depositum_stream`). Per communication
iteration a client sends its x̃ and ỹ rows to each of its deg(i) neighbours and receives theirs:
``up = down = 2 deg`` (mean degree for irregular graphs), 0 on local iterations.

Reconstruction switches (§4.5 ambiguities):

* A1 ``normalized``: momentum ``m = β m + (1 − β) y`` (True, chosen) or ``m = β m + y``.
* A2 ``momentum``: ``"shb"`` (OPTION I) or ``"snag"`` (OPTION II, the normalized Nesterov form).
* A3 ``prox_step``: ``"alpha"`` (literal, s = α: since m ≈ γ∇f the fixed point is stationary for
  **γ f + h**) or ``"alpha*gamma"`` (s = αγ: stationary for f + h). Identical when γ = 1.
* A4 ``tracker_init``: ``"zero"`` (the seed: g⁰ = y⁰ = 0) or ``"gradient"`` (g⁰ = g(x⁰),
  y⁰ = γ g⁰; gradients computed in ``init``).
* A5 (phase of W_t): fixed to (t + 1) mod τ == 0; it only shifts which iterations communicate.

Validity (§7.4): s ρ < 1 for the prox step s (α, or αγ). Partial participation is not defined
(no server samples clients; every client takes every iteration).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

import fedkernels as fk

from . import topology as topo
from .base import Algorithm, Costs, Messages, check_prox_step, one_of, positive, positive_int
from .depositum_stream import row_mean, row_sq_dev_mean, stream_cost, streamed_round
from .streamed import is_streamed

__all__ = ["DEPOSITUM", "DEPOSITUMState"]


class DEPOSITUMState(NamedTuple):
    x: torch.Tensor  # [N, d] client models x_i^t
    y: torch.Tensor  # [N, d] gradient trackers y_i^t, mean_i y_i = γ mean_i g_i
    m: torch.Tensor  # [N, d] momenta m_i^t
    g: torch.Tensor  # [N, d] the previous stochastic gradients g_i^t
    t: int  # iterations done
    client_fields = ("x", "y", "m", "g")  # the per-client [N, d] stacks (sharded checkpoints, distributed metrics)


@dataclasses.dataclass(frozen=True)
class DEPOSITUM(Algorithm):
    """DEPOSITUM. ``alpha``: α (step; prox step α or αγ); ``gamma``: γ (tracking scale);
    ``beta``: β ∈ [0, 1) (momentum, 0 = none); ``period``: τ (gossip every τ iterations);
    ``momentum``: "shb" | "snag"; ``topology``: a name ("ring", "complete", "star", "torus",
    "erdos_renyi"), a :class:`~python_algos.algorithms.topology.Topology`, an adjacency matrix (0/1, zero
    diagonal; Metropolis–Hastings weights) or a mixing matrix W; ``prox_step``: "alpha" |
    "alpha*gamma"; ``normalized``: momentum normalization (A1); ``tracker_init``: "zero" |
    "gradient" (A4); ``mixing``: W's layout, "auto" | "dense" | "sparse"."""

    alpha: float
    gamma: float = 1.0
    beta: float = 0.9
    period: int = 1
    momentum: str = "shb"
    topology: Any = "ring"
    prox_step: str = "alpha"
    normalized: bool = True
    tracker_init: str = "zero"
    mixing: str = "auto"

    name = "DEPOSITUM"
    spec = "docs/algorithms.md §4.5"
    status = "RECONSTRUCTED"
    reports = "x̄ (the client average)"
    switches = ("momentum", "prox_step", "normalized", "tracker_init")
    participation_note = ("it is decentralized: no server samples clients, every client takes every iteration "
                          "and gossips with its neighbours (docs/algorithms.md §4.5)")

    def __post_init__(self):
        positive("alpha", self.alpha)
        positive("gamma", self.gamma)
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not 0 <= self.beta < 1:
            raise fk.ParameterError(f"beta must be in [0, 1), got {self.beta!r}", "beta")
        positive_int("period", self.period)
        one_of("momentum", self.momentum, ("shb", "snag"))
        one_of("prox_step", self.prox_step, ("alpha", "alpha*gamma"))
        if not isinstance(self.normalized, bool):
            raise fk.ParameterError(f"normalized must be a bool, got {self.normalized!r}", "normalized")
        one_of("tracker_init", self.tracker_init, ("zero", "gradient"))
        one_of("mixing", self.mixing, ("auto", "dense", "sparse"))
        try:  # validates a given W now; the error names the field like every other check here
            object.__setattr__(self, "topology", topo.canonical(self.topology))
        except (ValueError, TypeError) as e:
            kind = fk.ParameterTypeError if isinstance(e, TypeError) else fk.ParameterError
            raise kind(str(e), "topology") from None
        object.__setattr__(self, "_matrices", {})  # W as a torch tensor, per (N, dtype, device): not state
        object.__setattr__(self, "_stream_plans", {})  # a streamed round's pieces of W, per (N, dtype, chunks)

    @property
    def step(self) -> float:
        """The prox step s: α (``prox_step="alpha"``) or αγ."""
        return self.alpha if self.prox_step == "alpha" else self.alpha * self.gamma

    def hparams(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if isinstance(self.topology, topo.Topology):
            out["topology"] = self.topology.spec()
        return out

    def validate(self, reg):
        super().validate(reg)
        what = "alpha (prox step)" if self.prox_step == "alpha" else "alpha*gamma (prox step)"
        check_prox_step(self.name, reg, self.step, what,
                        "alpha < 1/rho, or alpha*gamma < 1/rho with prox_step='alpha*gamma' "
                        "(docs/algorithms.md §4.5/§7.4)",
                        ("alpha",) if self.prox_step == "alpha" else ("alpha", "gamma", "prox_step"))

    def graph(self, num_clients: int) -> topo.Topology:
        """The topology on ``num_clients`` nodes."""
        return topo.build(self.topology, num_clients)

    def mixing_matrix(self, num_clients: int, dtype=torch.float64, device=None) -> torch.Tensor:
        """W for ``clients.gossip_``: dense, or sparse COO (``mixing``). A constant of the
        hyper-parameters, built (and validated) once and cached here rather than kept in the state."""
        key = (num_clients, dtype, str(device))
        W = self._matrices.get(key)
        if W is None:
            W = self._matrices[key] = self.graph(num_clients).matrix(dtype, device, layout=self.mixing)
        return W

    def costs(self, num_clients):
        vectors = 2 * self.graph(num_clients).mean_degree  # x̃ and ỹ to / from each neighbour
        vectors = int(vectors) if vectors == int(vectors) else vectors
        return Costs(client_prox=num_clients, server_prox=0, up=vectors, down=vectors, grads=1,
                     comm_every=self.period)

    def metric_step(self):
        return self.step

    def init(self, x0, clients):
        self.mixing_matrix(clients.num_clients, clients.dtype, clients.device)  # build + validate now
        x = clients.new_stack(x0)  # x_i^0 = x^0 (consensus)
        y, m, g = clients.new_stack(), clients.new_stack(), clients.new_stack()  # m^0 = y^0 = g^0 = 0
        if self.tracker_init == "gradient":  # A4 alternative: g^0 = g_i(x^0), y^0 = γ g^0
            with torch.no_grad():
                clients.gradients_(x, g)
                y.copy_(g).mul_(self.gamma)
        return DEPOSITUMState(x=x, y=y, m=m, g=g, t=0)

    def communicates(self, t: int) -> bool:
        """W_t = W at iteration t (0-based) iff (t + 1) mod τ == 0 (A5)."""
        return (t + 1) % self.period == 0

    def stream_refusal(self, num_clients: int) -> str:
        """Streams (:mod:`.depositum_stream`) with a sparse W, whose product adds each row's entries in
        column order; a dense W's product is a BLAS gemm, whose order only the library knows."""
        if self.mixing_matrix(num_clients).layout == torch.sparse_coo:
            return ""
        graph = self.graph(num_clients)
        why = ("mixing='dense'" if self.mixing == "dense" else
               f"mixing='auto' keeps W dense when it has N^2/{round(1 / topo.SPARSE_DENSITY)} entries or more: "
               f"{graph.nnz} of {num_clients ** 2}")
        return (f"DEPOSITUM's mixing matrix W of the {graph.name!r} topology on {num_clients} clients is dense "
                f"({why}), and a dense product W X reads the whole [N, d] stack at once in the BLAS's order, so "
                f"its clients cannot stream in chunks: use state='dense', or mixing='sparse' (W's product then "
                f"streams, reading each client's neighbours)")

    def stream_cost(self, clients, dim: int, itemsize: int):
        """A streamed round's rows moved and kept on the executor ``clients``, for the up-front estimate
        (:func:`.depositum_stream.stream_cost`)."""
        return stream_cost(self, clients, dim, itemsize)

    def messages(self):
        """None: no server (the state store's estimate asks; a streamed round keeps no uploads)."""
        return Messages(up=(), down=())

    def round(self, state, clients, reg, rng=None):
        if is_streamed(state, None):  # the stacks are stores: chunk after chunk, the same bits
            return streamed_round(self, state, clients, reg)
        X, Y, M, G_old, t = state
        W = self.mixing_matrix(clients.num_clients, clients.dtype, clients.device)
        G, dG = clients.workspace("g"), clients.workspace("dg")
        comm = self.communicates(t)
        with torch.no_grad():
            # (10)/(11) + (12a): m <- β m + (1−β) y; dir; x̃ <- prox_{s h}(x − α dir), one fused call
            fk.fused.depositum_step_(X, M, Y, self.alpha, self.beta, reg, self.step, momentum=self.momentum,
                                     normalized=self.normalized, fast=True)
            if comm:
                clients.gossip_(X, W)  # x_i = Σ_j w_ij x̃_j
            clients.gradients_(X, G)  # g_i^{t+1} = g_i(x_i^{t+1})
            Y.add_(torch.sub(G, G_old, out=dG), alpha=self.gamma)  # ỹ = y + γ (g^{t+1} − g^t)
            G_old.copy_(G)
            if comm:
                clients.gossip_(Y, W)  # y_i = Σ_j w_ij ỹ_j
        return DEPOSITUMState(x=X, y=Y, m=M, g=G_old, t=t + 1)

    def report(self, state, reg):
        return row_mean(state.x)  # x̄ (metrics only: no party computes it in a decentralized run)

    def state_metrics(self, state, clients):
        """§3 M5: consensus errors (1/N) Σ_i ||v_i − v̄||² of x, y, m; the gradient-estimation error
        (1/N) Σ_i ||m_i − γ ∇f(x̄)||² (one extra full-gradient pass); and the tracking invariant
        ``tracking_gap`` = ||ȳ − γ ḡ|| (0 up to round-off), with its relative size."""
        X, Y, M, G = state.x, state.y, state.m, state.g
        out, means = {}, {}
        with torch.no_grad():  # the client sums in one order, so a streamed run's (stores) are the dense run's
            for key, V in (("consensus_x", X), ("consensus_y", Y), ("consensus_m", M)):
                means[key] = row_mean(V)
                out[key] = row_sq_dev_mean(V, means[key])
            xbar = means["consensus_x"]
            grad = torch.empty_like(xbar)
            clients.full_objective_(xbar, grad)
            out["grad_est_err"] = row_sq_dev_mean(M, self.gamma * grad)
            target = self.gamma * row_mean(G)
            gap = float((means["consensus_y"] - target).norm())
            out["tracking_gap"] = gap
            out["tracking_gap_rel"] = gap / max(float(target.norm()), 1e-300)
        return out
