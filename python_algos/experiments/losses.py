"""The loss of each task, ``loss_fn(model(X), y)`` -> scalar loss (what ``simulate`` minimizes), and the
survival task's metric."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..clients.losses import per_sample_mean

__all__ = ["loss_function", "cross_entropy", "bce_with_logits", "mse", "cox_breslow", "concordance_index"]

# torch's own function, not a wrapper: the executors know it (python_algos.clients.losses), and the
# batched executor's Linear-chain path takes it (a wrapper would leave the model to torch.func)
cross_entropy = F.cross_entropy


@per_sample_mean
def bce_with_logits(out, y):
    return F.binary_cross_entropy_with_logits(out, y.to(out.dtype))


@per_sample_mean
def mse(out, y):
    return F.mse_loss(out, y.to(out.dtype))


def cox_breslow(out, y):
    """The negative Cox partial log-likelihood with Breslow's ties, divided by the number of samples:
    ``(1/n) Σ_{i: E_i = 1} [log Σ_{j: T_j ≥ T_i} exp(η_j) − η_i]`` for risk scores η = ``out`` and
    ``y[:, 0]`` = E (1: event observed, 0: censored), ``y[:, 1]`` = T (time). Every event's term
    couples it with every sample still at risk, so this is not a mean of per-sample losses: the
    executors compute a client's batch whole (never padded nor split) and refuse minibatches."""
    eta, event, time = out.reshape(-1), y[:, 0].to(out.dtype), y[:, 1]
    order = torch.argsort(time, descending=True, stable=True)
    eta, event, time = eta[order], event[order], time[order]
    running = torch.logcumsumexp(eta, 0)  # log Σ exp over the samples with a later (or the same) time
    last_tie = torch.searchsorted(-time, -time, right=True) - 1  # Breslow: the risk set holds every tie
    return (event * (running[last_tie] - eta)).sum() / eta.numel()


def concordance_index(risk, y) -> float:
    """Harrell's C: over the pairs (i, j) with E_i = 1 and T_i < T_j, the fraction whose risks are in the
    same order (risk_i > risk_j; a tie counts 1/2). 0.5 is chance, 1 a perfect ranking."""
    risk, event, time = risk.reshape(-1).double(), y[:, 0] > 0, y[:, 1]
    pairs = event[:, None] & (time[:, None] < time[None, :])
    diff = risk[:, None] - risk[None, :]
    score = (diff > 0).double() + 0.5 * (diff == 0).double()
    n = int(pairs.sum())
    return float((score * pairs).sum()) / n if n else float("nan")


def loss_function(task: str) -> Callable:
    return {"multiclass": cross_entropy, "binary": bce_with_logits, "regression": mse, "survival": cox_breslow}[task]
