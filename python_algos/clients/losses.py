"""Is ``loss_fn`` a mean of independent per-sample losses?  Decided from what is known, probed only when not.

Three shortcuts of the executors are exact only for a per-sample mean: padding a short batch with
zero-weight samples (batched executor), splitting a batch too large for one pass into weighted
pieces (both executors), and training on minibatches (the minibatch gradient then estimates the
gradient of the reported f). A loss is one of

* a **per-sample mean** (``mean=True``): the value on a batch is the average of its values on the
  batch's samples, whatever the samples;
* **not a mean** (``mean=False``): a ``reduction="sum"``, or a **weighted mean** whose divisor is a
  property of the batch (class ``weight=`` of cross-entropy / NLL, labels equal to ``ignore_index``:
  the mean divides by the sum of the batch's weights, so a split or a minibatch changes it), or
  weights indexed by a sample's position in the batch;
* **unknown** (``mean=None``): it cannot be evaluated on one sample, or (lazy clients) the labels
  it depends on were not all read. The executors then take the exact path (a batch is computed
  whole, never padded nor split); minibatches are refused only for a loss shown not to be a mean.

:func:`classify_loss` knows torch's losses by their type and options (``nn.CrossEntropyLoss``,
``nn.NLLLoss``, ``nn.MSELoss``, ``nn.L1Loss``, ``nn.HuberLoss``, ``nn.SmoothL1Loss``,
``nn.BCEWithLogitsLoss`` and their ``torch.nn.functional`` forms called with defaults) and
callables marked by :func:`per_sample_mean` (the command line's losses). Any other callable is
probed (:func:`probe_loss`) on copies of the outputs of samples chosen to expose coupling (several
labels, several clients, the largest and the smallest one), in float64 where the loss takes it,
with a tolerance scaled by the dtype it ran in.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LossKind", "classify_loss", "ignore_index_of", "probe_loss", "loss_kind", "per_sample_mean"]

_MARK = "__python_algos_per_sample_mean__"
_ELEMENTWISE = (nn.MSELoss, nn.L1Loss, nn.HuberLoss, nn.SmoothL1Loss)
_F_MEAN = (F.mse_loss, F.l1_loss, F.huber_loss, F.smooth_l1_loss, F.binary_cross_entropy_with_logits)
_NOT_MEAN = ("loss_fn is not the mean of per-sample losses ({}): its value on a batch is not the average of its "
             "values on the batch's samples")


@dataclasses.dataclass(frozen=True)
class LossKind:
    """``mean``: True (a per-sample mean), False (shown not to be), None (unknown); ``why``: the
    reason when not True; ``plain_ce``: the unweighted mean cross-entropy over class indices with
    no label equal to ``ignore_index`` (what :mod:`.chain` computes)."""

    mean: Optional[bool]
    why: str = ""
    plain_ce: bool = False


def per_sample_mean(fn: Callable) -> Callable:
    """Mark ``fn`` as a mean of independent per-sample losses: the executors then trust it
    without a probe (for losses the library defines itself, e.g. the command line's)."""
    setattr(fn, _MARK, True)
    return fn


def _ignored(ignore_index: int, labels) -> Optional[bool]:
    """Whether a label equals ``ignore_index`` (None: not every label is known)."""
    if labels is None:
        return None
    return any(bool((t == ignore_index).any()) for t in _parts(labels) if not t.is_floating_point())


def _parts(labels) -> list:
    """``labels``: a tensor, or one per client (never concatenated: segmentation masks can be large)."""
    return [labels] if isinstance(labels, torch.Tensor) else list(labels)


def _class_loss(weight, ignore_index: int, reduction: str, labels, smoothing: float = 0.0) -> LossKind:
    if reduction == "sum":
        return LossKind(False, _NOT_MEAN.format("reduction='sum'"))
    if reduction != "mean":
        return LossKind(None, f"reduction={reduction!r} does not return one value per batch")
    if labels is not None and any(t.is_floating_point() for t in _parts(labels)):  # class probabilities: a mean
        return LossKind(True)
    if weight is not None:
        return LossKind(False, _NOT_MEAN.format("a class-weighted mean: weight= divides by the sum of the batch's "
                                                "weights"))
    hit = _ignored(ignore_index, labels)
    if hit:
        return LossKind(False, _NOT_MEAN.format(f"labels equal to ignore_index={ignore_index} are left out of the "
                                                f"mean, whose divisor then depends on the batch"))
    if hit is None:
        return LossKind(None, f"not every label was read, so whether one equals ignore_index={ignore_index} is "
                              f"unknown")
    return LossKind(True, plain_ce=smoothing == 0.0)


def classify_loss(loss_fn: Callable, labels: Optional[torch.Tensor] = None,
                  out: Optional[torch.Tensor] = None) -> Optional[LossKind]:
    """The kind of a loss known by its type and options, None for a callable it does not know.
    ``labels``: every client's labels, a tensor or one per client (None when not all are in
    memory); ``out``: the model's
    output on a few samples (its shape tells a per-class ``weight`` from a per-position one)."""
    if getattr(loss_fn, _MARK, False):
        return LossKind(True)
    if loss_fn is F.cross_entropy:
        return _class_loss(None, -100, "mean", labels)
    if loss_fn is F.nll_loss:  # of the model's outputs as log-probabilities: not the chain's cross-entropy
        return dataclasses.replace(_class_loss(None, -100, "mean", labels), plain_ce=False)
    if any(loss_fn is f for f in _F_MEAN):
        return LossKind(True)
    kind = type(loss_fn)
    if kind is nn.CrossEntropyLoss:
        return _class_loss(loss_fn.weight, loss_fn.ignore_index, loss_fn.reduction, labels, loss_fn.label_smoothing)
    if kind is nn.NLLLoss:
        k = _class_loss(loss_fn.weight, loss_fn.ignore_index, loss_fn.reduction, labels)
        return dataclasses.replace(k, plain_ce=False)
    if kind in _ELEMENTWISE or kind is nn.BCEWithLogitsLoss:
        if loss_fn.reduction != "mean":
            return _class_loss(None, 0, loss_fn.reduction, None)
        w = getattr(loss_fn, "weight", None)
        if w is not None and (out is None or not _per_element(w, out)):
            return LossKind(False, _NOT_MEAN.format("weight= is indexed by a sample's position in the batch")
                            if out is not None else "weight= may be indexed by a sample's position in the batch")
        return LossKind(True)
    return None


def ignore_index_of(loss_fn: Callable) -> Optional[int]:
    """The ``ignore_index`` of a known class-index loss (cross-entropy, NLL), None for any other loss."""
    if loss_fn is F.cross_entropy or loss_fn is F.nll_loss:
        return -100  # their default, which labels of -100 hit
    if type(loss_fn) in (nn.CrossEntropyLoss, nn.NLLLoss):
        return int(loss_fn.ignore_index)
    return None


def _per_element(w: torch.Tensor, out: torch.Tensor) -> bool:
    """``w`` broadcasts over the batch dimension: the same weights for every sample."""
    lead = w.dim() - (out.dim() - 1)
    return lead <= 0 or all(s == 1 for s in w.shape[:lead])


def _tolerance(dtype: torch.dtype) -> float:
    if dtype == torch.float64:
        return 1e-9  # the rounding of a mean of a few values is ~1e-16; coupling effects are O(1)
    if dtype == torch.float32:
        return 1e-4
    return 32 * torch.finfo(dtype).eps if dtype.is_floating_point else 1e-4


def _mean_gap(loss_fn: Callable, o: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float]:
    """(|loss on the batch - mean of per-sample losses| / scale, the two values)."""
    whole = loss_fn(o, y)
    if not isinstance(whole, torch.Tensor) or whole.numel() != 1:
        raise _NotScalar()
    each = torch.stack([loss_fn(o[i : i + 1], y[i : i + 1]).reshape(()) for i in range(o.shape[0])])
    w, m = float(whole), float(each.mean())
    scale = max(abs(w), abs(m), float(each.abs().max()), 1e-30)
    return abs(w - m) / scale, w, m


class _NotScalar(Exception):
    pass


def _every_class(out: torch.Tensor, y: torch.Tensor) -> Optional[torch.Tensor]:
    """Labels 0, 1, .., C-1, 0, .. for class-index labels ``y`` of outputs ``out`` of C classes (None
    for other labels): a loss whose weights depend on the class then shows it, whichever classes the
    probed clients hold."""
    if y.dim() != 1 or y.is_floating_point() or y.dtype == torch.bool or out.dim() != 2 or out.shape[1] < 2:
        return None
    return torch.arange(y.shape[0], device=y.device).remainder_(out.shape[1]).to(y.dtype)


def probe_loss(loss_fn: Callable, out: torch.Tensor, y: torch.Tensor, every_class: bool = False) -> LossKind:
    """Whether ``loss_fn`` is a per-sample mean, shown on copies of ``out`` (the model's outputs on
    samples chosen to expose coupling) and of ``y``, and on perturbed outputs (a loss that is zero
    on the probe would prove nothing). Runs in float64 when the loss takes it, else in the data's
    dtype with a tolerance scaled by it. ``every_class``: also on labels of every class (a
    population's, whose other clients may hold labels the probed ones lack; a list's probe already
    holds a sample of each label). Call without grad."""
    k = int(out.shape[0])
    if k < 2:
        return LossKind(None, "a single sample cannot show a loss to be a mean")
    g = torch.Generator().manual_seed(0)
    tries = [torch.float64] if out.is_floating_point() and out.dtype != torch.float64 else []
    for dtype in [*tries, out.dtype]:
        o = out.detach().to(dtype=dtype, copy=True)
        noise = torch.randn(o.shape, generator=g, dtype=torch.float64).to(o) if o.is_floating_point() else 0
        try:
            gaps = [_mean_gap(loss_fn, p, y.clone()) for p in (o, o + noise)]
        except _NotScalar:
            return LossKind(False, "loss_fn does not return one value per batch")
        except Exception as e:  # noqa: BLE001 -- another dtype may work; else it cannot be taken per sample
            why = f"loss_fn cannot be evaluated on one sample ({type(e).__name__}: {e})"
            continue
        classes = _every_class(o, y) if every_class else None
        if classes is not None:
            try:
                gaps.append(_mean_gap(loss_fn, o + noise, classes))
            except Exception:  # noqa: BLE001 -- labels the loss does not take prove nothing
                pass
        bad = next((gp for gp in gaps if not gp[0] <= _tolerance(dtype)), None)
        if bad is None:
            return LossKind(True)
        return LossKind(False, _NOT_MEAN.format("e.g. reduction='sum', or a weighted mean") +
                        f" (on {k} samples: {bad[1]:.6g}, the average of its per-sample values {bad[2]:.6g})")
    return LossKind(None, why)


def loss_kind(loss_fn: Callable, out: Optional[torch.Tensor], y: Optional[torch.Tensor],
              labels, every_class: bool = False) -> LossKind:
    """:func:`classify_loss`, else :func:`probe_loss` on ``out, y`` (None: nothing to probe on)."""
    known = classify_loss(loss_fn, labels, out)
    if known is not None:
        return known
    if out is None or not isinstance(out, torch.Tensor) or out.dim() < 1:
        return LossKind(None, "the model's outputs could not be probed")
    return probe_loss(loss_fn, out, y, every_class)
