"""What :func:`~python_algos.simulate.simulate` refuses of a model (and its regularizer) before it builds
anything: trainable parameters of several dtypes (:func:`check_one_dtype`), a bare ``fk.GroupLasso``
applied to the flat vector of all parameters (:func:`check_group_lasso`)."""

from __future__ import annotations

import torch
from torch import nn

import fedkernels as fk

__all__ = ["check_group_lasso", "check_one_dtype"]


def check_group_lasso(regularizer, model: nn.Module) -> None:
    """A bare ``fk.GroupLasso`` (or a multiple of one) has no matrix to group: applied to the flat
    [d] model it fails with a shape error once the run has started, and to an [N, d] stack of
    client models (DEPOSITUM) it silently runs with the wrong groups: each client's whole model
    (rows), or one coordinate across the clients (cols). The per-parameter form knows each
    parameter's shape."""
    kappa, base = 1.0, regularizer
    while isinstance(base, fk.Scaled):
        kappa, base = kappa * base.kappa, base.base
    if not isinstance(base, fk.GroupLasso):
        return
    mats = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    head = (f"regularizer: {regularizer!r} needs a matrix (its rows or columns are the groups), and a bare "
            f"regularizer is applied to the flat vector of all the model's parameters")
    if not mats:
        raise ValueError(f"{head}; this model has no trainable parameter with 2 or more dimensions, so there is "
                         f"nothing to group: use a separable penalty such as fk.L1")
    lam = kappa * base.lam
    shown = ", ".join(f"{n!r} {s}" for n, s in mats[:6]) + (", ..." if len(mats) > 6 else "")
    raise ValueError(f"{head}; give it per parameter, e.g. regularizer={{{mats[0][0]!r}: fk.GroupLasso({lam!r}, "
                     f"groups={base.groups!r})}} (groups='cols' of the first layer's weight selects input features; "
                     f"the model's parameters with 2 or more dimensions: {shown})")


def check_one_dtype(model: nn.Module) -> None:
    """One flat buffer of one dtype holds every trainable parameter (``fk.FlatParams``, whose default
    dtype is the first parameter's): a model mixing dtypes would have some parameters silently cast,
    and leave the run with another model than the user built."""
    by_dtype: dict = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            by_dtype.setdefault(p.dtype, []).append(name)
    if len(by_dtype) > 1:
        parts = [f"{str(dt).replace('torch.', '')} ({', '.join(repr(n) for n in names[:3])}"
                 f"{', ...' if len(names) > 3 else ''})" for dt, names in by_dtype.items()]
        widest = max(by_dtype, key=lambda dt: torch.finfo(dt).bits if dt.is_floating_point else 0)
        raise ValueError(f"model: its trainable parameters have several dtypes: {'; '.join(parts)}; simulate keeps "
                         f"them in one flat buffer of one dtype, so some would be silently cast: call "
                         f"model.to({widest}) (or another one dtype) first")
