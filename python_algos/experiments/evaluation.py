"""The ``eval_fn`` of a command-line run: accuracy and loss on held-out data, support recovery."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from .losses import loss_function

__all__ = ["make_eval"]


def make_eval(ds, model: nn.Module, extra: Optional[Callable] = None, chunk: int = 4096) -> Callable:
    """``eval_fn(params)`` for simulate: test (or, without a test set, train) accuracy and loss;
    with a known ``x_true`` and a linear model, the support F1 score and ||w − x_true||²."""
    X, y, prefix = (ds.X_test, ds.y_test, "test") if ds.X_test is not None else (ds.X, ds.y, "train")
    loss_fn = loss_function(ds.task)
    p0 = next(model.parameters())
    X = X.to(device=p0.device, dtype=p0.dtype)
    y = y.to(device=p0.device)
    x_true = ds.x_true

    def eval_fn(params: torch.Tensor) -> dict:
        out = {}
        with torch.no_grad():
            loss, correct = 0.0, 0
            for s in range(0, X.shape[0], chunk):
                o = model(X[s : s + chunk])
                yc = y[s : s + chunk]
                loss += float(loss_fn(o, yc)) * yc.shape[0]
                if ds.task == "multiclass":
                    correct += int((o.argmax(1) == yc).sum())
                elif ds.task == "binary":
                    correct += int(((o > 0).long() == yc).sum())
            out[f"{prefix}_loss"] = loss / X.shape[0]
            if ds.task != "regression":
                out[f"{prefix}_acc"] = correct / X.shape[0]
            if x_true is not None and params.numel() == x_true.numel() + 1:  # linear model: [w, b]
                w = params[: x_true.numel()].detach().cpu().to(x_true.dtype)
                est, true = w != 0, x_true != 0
                tp = int((est & true).sum())
                out["support_f1"] = 2 * tp / max(int(est.sum()) + int(true.sum()), 1)
                out["dist_to_truth"] = float((w - x_true).pow(2).sum())
            if extra is not None:
                out.update(extra(params))
        return out

    return eval_fn
