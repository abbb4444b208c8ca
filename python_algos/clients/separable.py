"""Is a client's loss a mean of independent per-sample losses?  And a guard for side-effect-free passes.

Two shortcuts of the executors are exact only when ``loss_fn(model(X), y)`` is the *mean* of
per-sample losses and each sample's output depends on that sample alone:

* the batched executor pads a short batch with zero-weight copies of one sample, so that clients
  of unequal batch sizes share one vectorized pass;
* both executors split a batch too large for one pass into pieces weighted by their share.

A BatchNorm in training mode (batch statistics, with or without running statistics), a layer such
as ``x - x.mean(0)``, a ``reduction="sum"`` loss or a class-weighted mean couple the samples of a
batch: padding or splitting would then change the loss. :func:`coupling` finds them before any
round, by the module types and by a cheap probe on a few real samples, and the executors then
compute every batch whole, exactly as ``loss_fn(model(X), y)`` is written (never a silent change
of the objective).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch
from torch import nn

__all__ = ["coupling", "loss_is_mean", "side_effect_free", "training_side_effects"]

_BATCH_STAT_NORMS = (nn.modules.batchnorm._BatchNorm,)  # BatchNorm1d/2d/3d, SyncBatchNorm, Lazy*
_PROBE_RTOL = 1e-4  # coupling effects are O(1); float32 rounding of a same-shape pass is ~1e-7


@contextlib.contextmanager
def side_effect_free(model: nn.Module, device: torch.device):
    """Run passes that must leave no trace: every module buffer (BatchNorm running statistics,
    ``num_batches_tracked``) is restored afterwards, and so is torch's global random state (a
    dropout layer in a metric pass must not shift the random numbers of the training that follows)."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-30) if a.numel() else 1.0
    return a.shape == b.shape and bool(((a - b).abs() <= _PROBE_RTOL * scale).all())


def coupling(model: nn.Module, loss_fn: Callable, X: torch.Tensor, y: torch.Tensor) -> str:
    """Why samples of a batch are coupled ("" if they are not), from ``X, y`` (a few real samples).

    Checks, in order: (1) a BatchNorm module in training mode; (2) the model on the probe batch:
    row i of ``model(X)`` must not change when another sample is altered or dropped; (3) the loss:
    ``loss_fn(out, y)`` must equal the mean of ``loss_fn(out[i:i+1], y[i:i+1])`` (a sum, or a
    class-weighted mean, does not), on the model's outputs and on perturbed ones (a loss that is
    zero on the probe would prove nothing). The passes run without side effects and without grad."""
    for name, m in model.named_modules():
        if isinstance(m, _BATCH_STAT_NORMS) and m.training:
            return (f"module {name or 'model'!r} ({type(m).__name__}) normalises each batch by its own statistics "
                    f"in training mode, so a sample's output depends on the other samples of its batch")
    k = min(4, int(X.shape[0]))
    if k < 2:
        return ""
    X, y = X[:k], y[:k]
    p = next(model.parameters(), None)
    device = p.device if p is not None else X.device

    def fwd(inp):
        torch.manual_seed(0)  # the same dropout mask for the same shape: only coupling can differ
        return model(inp)

    with side_effect_free(model, device), torch.no_grad():
        try:
            out = fwd(X)
            if not isinstance(out, torch.Tensor) or out.shape[:1] != X.shape[:1]:
                return "the model's output is not one row per sample"
            Xq = X.clone()
            Xq[-1] = X[0] * 1.5 + 1.0 if X.is_floating_point() else X[0]
            alone = _close(fwd(Xq)[:-1], out[:-1]) and _close(fwd(X[:-1]), out[:-1])
        except Exception as e:  # noqa: BLE001 -- cannot show independence: treat as coupled
            return f"the model could not be probed on a few samples ({type(e).__name__}: {e})"
        if not alone:
            return ("the model's output for one sample changes with the other samples of its batch "
                    "(a layer mixes samples, e.g. a batch statistic)")
        is_mean, why = loss_is_mean(loss_fn, out, y)
        if not is_mean:
            return why
    return ""


def loss_is_mean(loss_fn: Callable, out: torch.Tensor, y: torch.Tensor) -> tuple[Optional[bool], str]:
    """Whether ``loss_fn(out, y)`` is the mean of its per-sample values ``loss_fn(out[i:i+1], y[i:i+1])``,
    on the outputs ``out`` of a few real samples and on perturbed ones (a loss that is zero on the
    probe would prove nothing): ``(True, "")``; ``(False, why)`` when it is shown not to be (a sum,
    a class-weighted mean); ``(None, why)`` when it cannot be evaluated on one sample. The one
    source of truth for both uses: padding and splitting batches (:func:`coupling`) and refusing
    minibatches of a loss that is not a mean (:func:`python_algos.clients.probe.check_clients`).
    Call it without grad, inside :func:`side_effect_free`."""
    k = int(out.shape[0])
    g = torch.Generator(device="cpu").manual_seed(0)
    noise = torch.randn(out.shape, generator=g, dtype=out.dtype).to(out.device) if out.is_floating_point() else 0
    for o in (out, out + noise):
        try:
            whole = loss_fn(o, y)
            each = torch.stack([loss_fn(o[i : i + 1], y[i : i + 1]).reshape(()) for i in range(k)])
        except Exception as e:  # noqa: BLE001 -- the loss cannot be taken per sample: cannot tell
            return None, f"loss_fn cannot be evaluated on one sample ({type(e).__name__}: {e})"
        if not isinstance(whole, torch.Tensor) or whole.numel() != 1:
            return False, "loss_fn does not return one value per batch"
        if not _close(whole.reshape(()), each.mean()):
            return False, (f"loss_fn is not the mean of per-sample losses (e.g. reduction='sum', or a weighted "
                           f"mean): its value on a batch is not the average of its values on the batch's samples "
                           f"(on {k} samples: {float(whole):.6g}, the average of its per-sample values "
                           f"{float(each.mean()):.6g})")
    return True, ""


def training_side_effects(model: nn.Module, X: torch.Tensor) -> str:
    """What a training-mode forward pass of ``model`` on ``X`` (a few real samples) does besides
    computing its output ("" if nothing): buffers it updates (BatchNorm running statistics) and
    random numbers it draws from torch's global generator (Dropout). In one process these are
    shared by every client in turn; a deployed client node would keep its own, so a deployment can
    only equal the simulation without them. The probe itself leaves no trace (``side_effect_free``)."""
    p = next(model.parameters(), None)
    device = p.device if p is not None else X.device
    owner = {f"{m_name}.{b_name}" if m_name else b_name: m_name
             for m_name, m in model.named_modules() for b_name, _ in m.named_buffers(recurse=False)}
    with side_effect_free(model, device), torch.no_grad():
        before = {n: b.detach().clone() for n, b in model.named_buffers()}
        rng = torch.get_rng_state()
        try:
            model(X)
        except Exception as e:  # noqa: BLE001 -- cannot show there is none: say so
            return f"the model could not be probed on a few samples ({type(e).__name__}: {e})"
        changed = [n for n, b in model.named_buffers() if n in before and not torch.equal(b, before[n])]
        drew = not torch.equal(rng, torch.get_rng_state())
    if changed:
        mods = dict.fromkeys(owner.get(n, "") for n in changed)
        kinds = {name: type(model.get_submodule(name)).__name__ if name else type(model).__name__ for name in mods}
        return ("a training pass updates module buffers (" + ", ".join(f"{n or 'model'!r} ({kinds[n]})" for n in mods)
                + f": {', '.join(changed[:4])}{', ...' if len(changed) > 4 else ''})")
    if drew:
        rand = [n for n, m in model.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.training]
        return ("a training pass draws random numbers from torch's global generator"
                + (f" ({', '.join(repr(n) for n in rand[:4])}: Dropout)" if rand else ""))
    return ""
