"""The loss of each task, ``loss_fn(model(X), y)`` -> scalar mean loss (what ``simulate`` minimizes)."""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F

__all__ = ["loss_function", "cross_entropy", "bce_with_logits", "mse"]


def cross_entropy(out, y):
    return F.cross_entropy(out, y)


def bce_with_logits(out, y):
    return F.binary_cross_entropy_with_logits(out, y.to(out.dtype))


def mse(out, y):
    return F.mse_loss(out, y.to(out.dtype))


def loss_function(task: str) -> Callable:
    return {"multiclass": cross_entropy, "binary": bce_with_logits, "regression": mse}[task]
