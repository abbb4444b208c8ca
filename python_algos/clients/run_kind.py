"""The loss's kind and the samples' coupling (:func:`.separable.separability`) judged on a run's clients from a few of
them, for an executor that holds only some: a population's block, a rank's shard.

Whether a batch may be padded follows the labels (a chosen ``ignore_index`` some client holds, a class-weighted
callable): judged on the clients one executor holds, a block or a shard whose own labels look plain would pad where
one process over every client computes every batch whole (the same loss, other last bits). So blocks and shards
judge it as one process over the run's clients does (a population's cohort: on the cohort's). :func:`separability`
reads, besides the model's coupling, only: the probe samples of clients 0, the first largest, the first smallest and
the last, one row of each of the first few label values met in client order, and whether a label equals
``ignore_index``. So the clients :func:`witnesses` names (those, each client holding a label value none before it
holds until that many values are met, and the first client holding ``ignore_index``) give the same answer as every
client: a client past them adds no label value the probe would take and is no first largest or smallest.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from .losses import ignore_index_of
from .separable import Separability, separability

__all__ = ["candidates", "run_separability", "witnesses"]

LABEL_VALUES = 8  # as many label values as the probe takes (separable's rows of distinct labels)


def candidates(labels: Sequence[torch.Tensor], loss_fn: Callable) -> list:
    """0/1 per client of ``labels`` (one tensor each, in client order): 1 where the client may decide the loss's
    kind (a label value none before it holds, until :data:`LABEL_VALUES` are met; the first holding
    ``ignore_index``). Computed on any consecutive part of the run, the parts' flags together hold the run's."""
    ignore, seen, held, out = ignore_index_of(loss_fn), set(), False, []
    for y in labels:
        flag = 0
        if not y.is_floating_point():
            if ignore is not None and not held and bool((y == ignore).any()):
                flag, held = 1, True
            if y.dim() == 1 and len(seen) < LABEL_VALUES:
                new = set(y.unique().tolist()) - seen
                flag, seen = flag or int(bool(new)), seen | new
        out.append(flag)
    return out


def witnesses(sizes: Sequence[int], flags: Sequence[int]) -> list:
    """The run ids of the clients whose data decide the run's separability (module docstring)."""
    n = len(sizes)
    picks = {0, n - 1, max(range(n), key=sizes.__getitem__), min(range(n), key=sizes.__getitem__)}
    return sorted(picks | {i for i, f in enumerate(flags) if f})


def run_separability(model: nn.Module, loss_fn: Callable, sizes: Sequence[int], flags: Sequence[int],
                     build: Callable) -> Separability:
    """:func:`separability` over the run's clients, from the clients :func:`witnesses` names, ``build(i)`` giving
    client ``i``'s data (every rank builds the same ones, so every rank judges alike)."""
    return separability(model, loss_fn, [build(i) for i in witnesses(sizes, flags)])
