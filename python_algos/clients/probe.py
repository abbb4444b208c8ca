"""Checks of the clients' data against the model and the loss, made once when an executor is built.

Without them, a client whose data the model cannot take (inputs of the wrong width, float labels
for a cross-entropy) fails with torch's bare message in the middle of the first metric pass or
round, naming no client; and a loss that is not a mean of per-sample losses (``reduction="sum"``)
trained on minibatches silently optimises another objective than the one reported: a minibatch
of B of a client's m samples has the gradient of a sum of B losses, (B/m)·∇f_i in expectation
with f_i the client's loss over its m samples, so the step sizes scale with B and the clients are
weighted by B/m_i, while ``f`` reports the per-client sums. With full batches the same loss is
consistent: every gradient is the gradient of the reported f (each client's whole data in one
pass, never padded or split, :mod:`.separable`).

:func:`check_clients` runs each client's first few samples (``min(4, n)``; once per distinct
sample shape and dtype, so N clients of one kind cost one forward pass) through ``model`` and
``loss_fn``, without grad and without side effects: module buffers, torch's (and Python's and
NumPy's) global random state are restored, and the clients' minibatch generators are not touched
(their first samples are sliced, not drawn), so the run's bits do not change. Every executor that
runs clients in a process (sequential, batched, and each rank's inner one of the distributed
executor) calls it from its constructor, before the run starts. Whether the loss is a per-sample
mean is decided by :mod:`.losses` (a known loss by its type, options and every client's labels;
another callable probed on samples of several clients and labels, :mod:`.separable`), and a NaN
or infinity in in-memory data is refused naming the client and row (:func:`.data.check_finite`).

A population's executors (clients built on demand, :mod:`.population`) call :func:`check_population`
instead, on its first few clients: the loss's kind is decided there once for every client, from what
is known without reading them all, so that nothing is refused mid-run but what only a client's data
can tell (:class:`PopulationCheck`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch import nn

from .data import ClientData, LoaderData, TensorData, check_finite
from .losses import LossKind, classify_loss, ignore_index_of
from .separable import PROBE_SAMPLES, all_labels, separability, side_effect_free

__all__ = ["PopulationCheck", "check_clients", "check_population"]


@contextlib.contextmanager
def _host_random_state_kept():
    """A Dataset's ``__getitem__`` may draw from Python's or NumPy's global generator (random
    augmentations): the probe's reads must not shift the numbers the run draws later."""
    py, npy = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)


def _minibatched(c: ClientData, batch_size: Optional[int]) -> str:
    """Why client ``c`` is trained on minibatches ("" when on all of its samples)."""
    if isinstance(c, LoaderData):
        return "is a DataLoader, whose batches are weighted as means of their samples"
    if batch_size is not None and batch_size < c.n:
        return f"is trained on minibatches (batch_size={batch_size} < its {c.n} samples)"
    return ""


def _run(model: nn.Module, loss_fn: Callable, X: torch.Tensor, y: torch.Tensor):
    """(output, loss, None) or (output or None, None, (what failed, exception))."""
    try:
        out = model(X)
    except Exception as e:  # noqa: BLE001 -- reported with the client it failed on
        return None, None, ("model", e)
    try:
        loss = loss_fn(out, y)
    except Exception as e:  # noqa: BLE001
        return out, None, ("loss", e)
    return out, loss, None


def _probe_client(model, loss_fn, c: ClientData, i: int, X, y, batch_size):
    """Run client ``i``'s probe batch; raise ``ValueError`` naming the client when it fails."""
    out, loss, err = _run(model, loss_fn, X, y)
    if err is not None and not isinstance(c, LoaderData):
        # the few samples may not be representative (a model that needs a whole batch): retry on
        # the first batch the client really trains on before refusing
        b = c.n if batch_size is None else min(int(batch_size), c.n)
        if b > X.shape[0]:
            X, y = c.first(b)
            out, loss, err = _run(model, loss_fn, X, y)
    if err is not None:
        what, e = err
        if what == "model":
            raise ValueError(f"client {i}: model(X) failed on its data ({c.describe(X)}): {e}") from e
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"client {i}: loss_fn(model(X), y) failed on its data ({c.describe(X)}; y of shape "
                         f"{tuple(y.shape)} and dtype {y.dtype}; model(X) of shape {shape}): {e}") from e
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = f"shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}"
        raise ValueError(f"loss_fn must return a scalar mean loss (one value for the batch: a tensor with "
                         f"reduction='mean'), got {got} on client {i}'s data ({c.describe(X)})")
    return out, y


def check_clients(model: nn.Module, loss_fn: Callable, clients: Sequence[ClientData], batch_size: Optional[int],
                  first_client: int = 0, *, kind: Optional[LossKind] = None) -> None:
    """Refuse, with ``ValueError`` naming the client (its global index ``first_client + j``), data
    that ``model`` or ``loss_fn`` cannot take or a loss that does not return a scalar; and refuse
    a loss that is not a mean of per-sample losses when a client is trained on minibatches
    (``batch_size`` below its sample count, or a DataLoader client); refuse NaN / Inf data. See
    the module docstring. ``kind``: the loss's kind when the caller decided it for every client
    (a population's, :func:`check_population`), instead of these clients' labels."""
    check_finite(clients, first_client)
    p = next(model.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    seen, out = set(), None
    with side_effect_free(model, device), _host_random_state_kept(), torch.no_grad():
        for j, c in enumerate(clients):
            batch = c.first(PROBE_SAMPLES)
            if batch is None:
                continue
            X, y = batch
            form = (tuple(X.shape[1:]), X.dtype, tuple(y.shape[1:]), y.dtype)
            if form in seen:  # shape and dtype errors are the same for every client of a kind
                continue
            seen.add(form)
            o, _ = _probe_client(model, loss_fn, c, first_client + j, X, y, batch_size)
            out = o if out is None else out
        mini = next(((first_client + j, why) for j, c in enumerate(clients) if (why := _minibatched(c, batch_size))),
                    None)
        if mini is None:
            return
        # a known loss by its type, options and labels; any other callable probed (reads a few more samples)
        loss = classify_loss(loss_fn, all_labels(clients), out) if kind is None else kind
        loss = separability(model, loss_fn, clients).loss if loss is None else loss
    if loss.mean is False:  # shown not to be a mean (one whose kind is unknown is not refused)
        i, how = mini
        raise ValueError(f"{loss.why}; client {i} {how}, and a minibatch's gradient then follows another objective "
                         f"than the reported f (a sum of B losses scales every step by the batch size B, and weights "
                         f"client i by B/m_i; a weighted mean's minibatches divide by their own weights): make "
                         f"loss_fn a per-sample mean (reduction='mean'; for class weights w: "
                         f"(w[y] * F.cross_entropy(out, y, reduction='none')).mean()), or train on full batches "
                         f"(batch_size=None, with tensor or Dataset clients)")


_FIX = ("make loss_fn a per-sample mean (reduction='mean'; for class weights w: (w[y] * F.cross_entropy(out, y, "
        "reduction='none')).mean()), train on full batches (batch_size=None), or pass a list of clients (whose "
        "sizes and labels are read before the run)")


def _labels(client) -> Optional[torch.Tensor]:
    """A client's labels when they are in memory (an (X, y) pair, a TensorDataset, tensor data), else None."""
    if isinstance(client, TensorData):
        return client.y
    if isinstance(client, (tuple, list)) and len(client) == 2:
        return torch.as_tensor(client[1])
    if isinstance(client, torch.utils.data.TensorDataset):
        return client.tensors[1]
    return None


@dataclasses.dataclass(frozen=True)
class PopulationCheck:
    """What :func:`check_population` decided, once, for every client of a population: ``kind``, the
    loss's kind the executors assume (for padding, splitting, the chain); ``label``: a label no
    client may hold (the loss's default ``ignore_index`` under minibatches); ``loaders``: "" or why
    a DataLoader client is refused (a loss not a per-sample mean). :meth:`guard` checks a client
    when it is built: the data-dependent part, refused as a NaN is, naming the client and row."""

    kind: LossKind
    first_client: int = 0
    batch_size: Optional[int] = None
    label: Optional[int] = None
    loaders: str = ""

    def guard(self, j: int, client) -> None:
        """Refuse client ``j`` (its global id ``first_client + j``), built on demand, that breaks
        what the run assumed of every client (``client``: what make_client returned, or its ClientData)."""
        i = self.first_client + j
        if self.loaders and isinstance(client, (LoaderData, torch.utils.data.DataLoader)):
            raise ValueError(f"clients: client {i} (make_client({i})) is a DataLoader, whose batches are weighted as "
                             f"means of their samples, and {self.loaders}: {_FIX}")
        if self.label is None:
            return
        y = _labels(client)
        if y is None:
            what = type(getattr(client, "ds", getattr(client, "loader", client))).__name__  # the user's, not a wrapper
            raise ValueError(f"clients: client {i} (make_client({i})) is a {what}, whose labels are "
                             f"read batch by batch, so whether one equals ignore_index={self.label} (left out of "
                             f"loss_fn's mean, which minibatches then bias) cannot be checked; give (X, y) tensors, "
                             f"or {_FIX}")
        hit = (y == self.label).nonzero() if not y.is_floating_point() else y.new_zeros((0, 1))
        if hit.numel():
            raise ValueError(
                f"clients: client {i} (make_client({i})) holds label {self.label} at row {int(hit[0, 0])}, which "
                f"loss_fn's ignore_index={self.label} leaves out of its mean: a minibatch (batch_size="
                f"{self.batch_size}) then divides by its own count of kept labels and its gradient follows another "
                f"objective than the reported f. A population's labels are read as each client is built, so this "
                f"is refused now, not before the run: {_FIX}")


def check_population(model: nn.Module, loss_fn: Callable, probed: Sequence[ClientData], batch_size: Optional[int],
                     first_client: int = 0) -> PopulationCheck:
    """The start-up checks of a population's executor, on its first clients ``probed``: their data
    (as :func:`check_clients`), and the loss's kind decided once for every client from what is known
    without reading them all (its type and options; a callable probed on ``probed``'s samples and on
    labels of every class). Under minibatches (``batch_size`` set: any client may hold more samples,
    or a DataLoader client) a loss not a per-sample mean is refused here, before the run, naming the
    fix; so is one that leaves labels equal to a chosen ``ignore_index`` out of its mean. The default
    ignore_index (-100, not a class index) is instead refused in a client that holds it when it is
    built (:meth:`PopulationCheck.guard`, applied here to ``probed``), where clients are tensors."""
    check_clients(model, loss_fn, probed, batch_size, first_client, kind=LossKind(None))  # their data only
    kind = separability(model, loss_fn, probed, every_label=False).loss
    mini = batch_size is not None or any(isinstance(c, LoaderData) for c in probed)
    how = f"trained on minibatches ({f'batch_size={batch_size}' if batch_size is not None else 'a DataLoader client'})"
    if not mini:  # full batches: each client's loss is computed whole, as written, whatever its labels
        return PopulationCheck(kind, first_client, loaders=kind.why if kind.mean is False else "")
    if kind.mean is False:
        raise ValueError(f"{kind.why}; the clients are built on demand (a Population) and {how}, so any client "
                         f"with more samples is, and a minibatch's gradient then follows another objective than the "
                         f"reported f (a sum of B losses scales every step by B; a weighted mean's minibatches divide "
                         f"by their own weights): {_FIX}")
    ignore = ignore_index_of(loss_fn)
    # a per-sample mean; a callable whose kind is unknown; clients whose labels are read batch by batch (as in a
    # list of them: whether one is ignored is unknown, so every batch is computed whole, and nothing is refused)
    if kind.mean is not None or ignore is None or not all(isinstance(c, TensorData) for c in probed):
        return PopulationCheck(kind, first_client, batch_size)
    if ignore != -100:
        raise ValueError(f"loss_fn leaves labels equal to ignore_index={ignore} out of its mean, whose divisor then "
                         f"depends on the batch, and a population's labels are not read before the run; the clients "
                         f"are {how}, whose gradient would then follow another objective than the reported f: {_FIX}")
    # no label of -100 in any client (checked as each is built): then the loss is a per-sample mean
    check = PopulationCheck(classify_loss(loss_fn, [torch.zeros(0, dtype=torch.long)]), first_client, batch_size,
                            label=ignore)
    for j, c in enumerate(probed):
        check.guard(j, c)
    return check
