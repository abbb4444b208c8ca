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

__all__ = ["MODES", "standardize", "client_scales", "scaled"]

MODES = ("global", "local", "none")


def client_scales(features: list, mode: str = "global") -> list:
    """``[(mean_i, std_i)]`` (float64, flattened features; None for ``none``) that scale client i's features."""
    if mode not in MODES:
        raise ValueError(f"standardize mode must be one of {', '.join(MODES)}, got {mode!r}")
    flat = [X.reshape(len(X), -1).double() for X in features]
    moments = [(len(X), X.mean(0), ((X - X.mean(0)) ** 2).sum(0)) for X in flat]  # what each client shares
    if mode != "global":
        return [(m, _std(q / n)) if mode == "local" else (None, None) for n, m, q in moments]
    n = sum(c for c, _, _ in moments)
    mean = sum(c * m for c, m, _ in moments) / n
    return [(mean, _std(sum(q + c * (m - mean) ** 2 for c, m, q in moments) / n))] * len(features)


def _std(var: torch.Tensor) -> torch.Tensor:
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
