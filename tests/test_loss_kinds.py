"""The static classification of known losses (python_algos.clients.losses.classify_loss) against
the definition, checked here in float64: a loss is a per-sample mean when its value on a batch
equals the mean of its values on each sample, on batches of several labels."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from python_algos.clients.losses import classify_loss, per_sample_mean

K, B = 3, 7
W = torch.tensor([0.3, 1.0, 4.0], dtype=torch.float64)


def _id(loss_fn) -> str:
    """A stable test id (a function's repr holds its address, which differs between xdist workers)."""
    return getattr(loss_fn, "__name__", None) or repr(loss_fn)


def _is_mean(loss_fn, out, y) -> bool:
    """The definition, on a few random batches (never the library's probe)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        o = out + torch.randn(out.shape, generator=g, dtype=torch.float64)
        whole = loss_fn(o, y)
        try:
            each = torch.stack([loss_fn(o[i : i + 1], y[i : i + 1]) for i in range(o.shape[0])])
        except RuntimeError:  # weights by position in the batch: no per-sample value
            return False
        if whole.numel() != 1 or not torch.allclose(whole, each.mean(), rtol=1e-12, atol=0):
            return False
    return True


def _class_losses():
    for cls, weight, ignore, smooth, red in itertools.product(
            (nn.CrossEntropyLoss, nn.NLLLoss), (None, W), (-100, 1), (0.0, 0.1), ("mean", "sum")):
        if cls is nn.NLLLoss and smooth:
            continue
        kw = {"label_smoothing": smooth} if cls is nn.CrossEntropyLoss else {}
        yield cls(weight=weight, ignore_index=ignore, reduction=red, **kw)
    yield F.cross_entropy
    yield F.nll_loss


@pytest.mark.parametrize("loss_fn", list(_class_losses()), ids=_id)
def test_class_losses_are_classified_as_the_definition_says(loss_fn):
    out = torch.randn(B, K, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 1, 0, 2, 1])  # every class, and the ignored one where there is one
    kind = classify_loss(loss_fn, labels=y, out=out)
    assert kind.mean == _is_mean(loss_fn, out, y), kind
    if kind.mean is False:
        assert kind.why.startswith("loss_fn is not the mean of per-sample losses")
    plain = type(loss_fn) is nn.CrossEntropyLoss and loss_fn.weight is None and loss_fn.reduction == "mean" \
        and loss_fn.label_smoothing == 0 and loss_fn.ignore_index < 0
    assert kind.plain_ce == (loss_fn is F.cross_entropy or plain)


def test_an_ignore_index_no_label_takes_is_a_plain_mean_and_unknown_labels_are_unknown():
    out, y = torch.randn(B, K, dtype=torch.float64), torch.tensor([0, 2, 2, 0, 0, 2, 0])
    assert classify_loss(nn.CrossEntropyLoss(ignore_index=1), labels=y, out=out).plain_ce
    assert classify_loss(nn.CrossEntropyLoss(ignore_index=1), labels=None, out=out).mean is None


@pytest.mark.parametrize("loss_fn", [
    nn.MSELoss(), nn.L1Loss(), nn.HuberLoss(delta=0.3), nn.SmoothL1Loss(beta=0.5), nn.MSELoss(reduction="sum"),
    nn.BCEWithLogitsLoss(), nn.BCEWithLogitsLoss(pos_weight=W), nn.BCEWithLogitsLoss(weight=W),
    nn.BCEWithLogitsLoss(weight=W.unsqueeze(0)), nn.BCEWithLogitsLoss(weight=torch.rand(B, 1, dtype=torch.float64)),
    nn.BCEWithLogitsLoss(reduction="sum"), F.mse_loss, F.l1_loss, F.binary_cross_entropy_with_logits,
    nn.CrossEntropyLoss(weight=W)], ids=_id)
def test_elementwise_losses_are_classified_as_the_definition_says(loss_fn):
    out = torch.randn(B, K, dtype=torch.float64)
    y = (torch.rand(B, K, dtype=torch.float64) > 0.5).double()  # targets, also class probabilities for CE
    if isinstance(loss_fn, nn.CrossEntropyLoss):
        y = torch.softmax(y, 1)
    kind = classify_loss(loss_fn, labels=y, out=out)
    assert kind.mean == _is_mean(loss_fn, out, y), kind


def test_an_unknown_callable_is_left_to_the_probe_unless_marked():
    def mine(o, y):
        return F.mse_loss(o, y)
    assert classify_loss(mine) is None
    assert classify_loss(per_sample_mean(mine)).mean is True
