"""Standardising federated data without pooling it (``--standardize global|local|none``).

    clients = standardize(clients, mode="global")              # [(X_i, y_i)] -> the same, standardised
    clients, test = standardize(clients, "global", test=(X_t, y_t))

``global`` scales every client by the pooled mean and standard deviation, computed from what a
deployment can share: each client's count n_i, sum and sum of squares about its own mean, combined as
Chan et al. do (M2 = Σ M2_i + Σ n_i (mean_i − mean)²; a raw sum of squares loses digits when the mean
is large against the spread). ``local`` scales each client by its own statistics (under label skew
this alone can ruin a model). A constant feature is only centred. Statistics in float64.
"""

from __future__ import annotations

import torch

__all__ = ["MODES", "standardize", "client_scales", "client_moments", "combine_moments", "std_of", "scaled"]

MODES = ("global", "local", "none")


def client_moments(X: torch.Tensor) -> tuple:
    """What one client shares for ``global``: ``(n, mean, M2)`` of its rows (flattened features,
    float64; M2 the sum of squares about its own mean). A Flower node computes it on its own rows."""
    flat = X.reshape(len(X), -1).double()
    mean = flat.mean(0)
    return len(flat), mean, ((flat - mean) ** 2).sum(0)


def combine_moments(moments: list) -> tuple:
    """The pooled ``(mean, std)`` of the clients' :func:`client_moments` (Chan et al.; see the module):
    the server's side of ``global``, with no row of any client."""
    n = sum(c for c, _, _ in moments)
    mean = sum(c * m for c, m, _ in moments) / n
    return mean, std_of(sum(q + c * (m - mean) ** 2 for c, m, q in moments) / n)


def client_scales(features: list, mode: str = "global") -> list:
    """``[(mean_i, std_i)]`` (float64, flattened features; None for ``none``) that scale client i's features."""
    if mode not in MODES:
        raise ValueError(f"standardize mode must be one of {', '.join(MODES)}, got {mode!r}")
    moments = [client_moments(X) for X in features]  # what each client shares
    if mode != "global":
        return [(m, std_of(q / n)) if mode == "local" else (None, None) for n, m, q in moments]
    return [combine_moments(moments)] * len(features)


def std_of(var: torch.Tensor) -> torch.Tensor:
    """The standard deviation of variances ``var``, 1 where it is 0 (a constant feature is only centred)."""
    std = var.clamp_min(0).sqrt()
    return torch.where(std > 0, std, torch.ones_like(std))


def scaled(X: torch.Tensor, mean, std) -> torch.Tensor:
    """``(X - mean) / std`` row-wise, computed in float64, in ``X``'s dtype (``X`` itself for None)."""
    return X if mean is None else ((X.reshape(len(X), -1).double() - mean) / std).reshape(X.shape).to(X.dtype)


def standardize(clients: list, mode: str = "global", test=None):
    """``clients`` ``[(X_i, y_i)]`` with standardised features (see the module); with a pooled test set
    ``test=(X, y)``, ``(clients, test)``, the test rows scaled by the pooled statistics (``local`` is
    refused then: a pooled test row belongs to no client)."""
    scales = client_scales([X for X, _ in clients], mode)
    out = [(scaled(X, *s), y) for (X, y), s in zip(clients, scales)]
    if test is None:
        return out
    if mode == "local":
        raise ValueError("standardize(mode='local', test=...): a pooled test set's rows belong to no client; use "
                         "mode='global', or scale each client's test rows with client_scales")
    return out, (scaled(test[0], *scales[0]), test[1])
