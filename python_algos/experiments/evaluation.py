"""The ``eval_fn`` of a command-line run: accuracy and loss on held-out data, support recovery."""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch
from torch import nn

from .losses import concordance_index, loss_function

__all__ = ["make_eval", "eval_mode"]


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """``model`` in ``eval()`` mode inside the block, every submodule's own mode restored after it.

    Test metrics measure the model, they must not change it: in train mode BatchNorm would normalize
    each chunk by that chunk's statistics (so the loss would depend on the chunk size) and fold the
    test set into its running statistics (which the training then uses), and Dropout would drop units.
    Each submodule's flag is restored, not just the top one's, so a model the caller had put partly
    in eval mode comes back exactly as it was."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


def _batch_dependent(model: nn.Module) -> list:
    """Submodules whose eval-mode output still depends on the other samples of the batch."""
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats]


def make_eval(ds, model: nn.Module, extra: Optional[Callable] = None, chunk: int = 4096,
              loss_fn: Optional[Callable] = None) -> Callable:
    """``eval_fn(params)`` for simulate: test (or, without a test set, train) accuracy and loss;
    with a known ``x_true`` and a linear model, the support F1 score and ||w − x_true||².

    The model runs in ``eval()`` mode (see :func:`eval_mode`) and under ``no_grad``, so the metrics do
    not depend on ``chunk`` (up to floating-point summation order) and no buffer of the model changes.
    A BatchNorm without running statistics normalizes by the batch even in eval mode, so its metrics
    would depend on ``chunk``: such a model is refused."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}")
    bad = _batch_dependent(model)
    if bad:
        raise ValueError(f"model: {', '.join(bad)} is a BatchNorm with track_running_stats=False, whose output "
                         f"depends on the other samples of a batch even in eval mode, so test metrics would "
                         f"depend on the evaluation chunk size; use track_running_stats=True (or another norm "
                         f"layer, e.g. GroupNorm / LayerNorm)")
    X, y, prefix = (ds.X_test, ds.y_test, "test") if ds.X_test is not None else (ds.X, ds.y, "train")
    loss_fn = loss_fn or loss_function(ds.task)  # the run's own loss (:func:`.api.compare`) or the task's
    p0 = next(model.parameters())
    X = X.to(device=p0.device, dtype=p0.dtype)
    y = y.to(device=p0.device)
    x_true = ds.x_true

    def eval_fn(params: torch.Tensor) -> dict:
        out = {}
        with torch.no_grad(), eval_mode(model):
            if ds.task == "survival":  # the loss and the C-index couple all samples: one pass over the scores
                scores = torch.cat([model(X[s : s + chunk]).reshape(-1) for s in range(0, X.shape[0], chunk)])
                return {f"{prefix}_loss": float(loss_fn(scores, y)), f"{prefix}_cindex": concordance_index(scores, y),
                        **(extra(params) if extra is not None else {})}
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
