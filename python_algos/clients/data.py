"""One client's data, whatever the user handed in: tensors, a ``Dataset`` read lazily, or a
``DataLoader`` with its own batching.

Every executor asks a client for the batch of one gradient call through :meth:`ClientData.batches`:
pieces ``(X, y, w)`` whose weighted mean losses add up to the client's mean loss over the batch
(one piece, ``w = 1``, unless the batch is larger than ``chunk`` samples).

=====================  =====================================================================
client given as        a gradient call's batch
=====================  =====================================================================
``(X, y)`` tensors,    ``B`` indices ``randperm(n)[:B]`` from the client's own generator (all
``TensorDataset``      samples when ``B`` is None or ``>= n``)
``Dataset``            the same indices, the items fetched one by one (``ds[j]``) and collated
                       with ``default_collate`` — nothing is stacked up front, so a Dataset that
                       reads files or decodes images only touches the samples a batch needs
``DataLoader``         the loader's next batch (its own sampler, batch size and workers; a new
                       pass starts when it is exhausted); full gradients (``B`` None): one whole
                       pass over the loader (:meth:`LoaderData.full_pass`)
=====================  =====================================================================

A DataLoader client's objective is the mean loss over the samples one pass of the loader
*yields*: with a ``sampler`` (e.g. ``SubsetRandomSampler`` over a shared dataset), a
``batch_sampler`` or ``drop_last=True`` that is not ``loader.dataset``, so a full pass weights each
batch by its share of the samples counted during that pass, never by ``len(loader.dataset)``.

Reproducibility: tensor and Dataset clients draw from generators seeded by the run's seed and
saved in checkpoints, so a run is repeatable and resumes bit-identically. A DataLoader's order
comes from the loader (seed its ``generator=`` for repeatable runs); its position is not saved in a
checkpoint, so a resumed run starts each client's loader afresh and does not repeat the
uninterrupted run's batches.

Before a run, the executor reads each client's first few samples once (:meth:`ClientData.first`;
a DataLoader's: the first items of ``loader.dataset``, never a batch of the loader, whose sampler
would advance) to check that the model and the loss take them (:mod:`.probe`); that is the only
read outside the batches.
"""

from __future__ import annotations

import abc
from typing import Iterator, Optional, Sequence

import torch
import torch.utils.data
from torch.utils.data import default_collate

__all__ = ["ClientData", "TensorData", "DatasetData", "LoaderData", "client_data", "check_finite"]


def _cast(t, dtype, device) -> torch.Tensor:
    t = torch.as_tensor(t)
    return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)


class ClientData(abc.ABC):
    """One client's samples. ``n``: how many (a DataLoader's: how many one pass yields, when known)."""

    n: int
    reproducible: bool = True  # minibatches come from the run's generators (resumable bit for bit)

    @abc.abstractmethod
    def batches(self, batch_size: Optional[int], generator: Optional[torch.Generator], chunk: int) -> Iterator[tuple]:
        """The pieces ``(X, y, w)`` of one gradient call's batch (``w``: the piece's share of it)."""

    def draw(self, batch_size: Optional[int], generator: torch.Generator) -> Optional[torch.Tensor]:
        """This call's sample indices (``None``: every sample), drawn as the sequential executor
        draws them: ``randperm(n)[:B]`` when ``B < n``."""
        if batch_size is not None and batch_size < self.n:
            return torch.randperm(self.n, generator=generator)[:batch_size]
        return None

    def _pieces(self, idx: Optional[torch.Tensor], chunk: int) -> Iterator[tuple]:
        m = self.n if idx is None else int(idx.numel())
        for s in range(0, m, chunk):
            part = (torch.arange(s, min(s + chunk, m)) if idx is None else idx[s : s + chunk])
            X, y = self.take(part if (idx is not None or m > chunk) else None)
            yield X, y, (1.0 if m <= chunk else X.shape[0] / m)

    def take(self, idx: Optional[torch.Tensor]) -> tuple:
        """``(X, y)`` of the samples ``idx`` (all when None)."""
        raise NotImplementedError

    def first(self, k: int) -> Optional[tuple]:
        """``(X, y)`` of the client's first ``k`` samples (all if it has fewer), for the checks
        before round 1 (:mod:`.probe`); None when they cannot be read without consuming anything."""
        return self.take(torch.arange(min(int(k), self.n)))

    def describe(self, X: torch.Tensor) -> str:
        """What ``X`` (returned by :meth:`first`) is, for error messages."""
        return f"its first {X.shape[0]} samples: X of shape {tuple(X.shape)}"


class TensorData(ClientData):
    """``(X, y)`` tensors already in memory (the fast path of every executor)."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor):
        self.X, self.y, self.n = X, y, int(X.shape[0])

    def take(self, idx):
        if idx is None:
            return self.X, self.y
        idx = idx.to(self.X.device)
        return self.X[idx], self.y[idx]

    def batches(self, batch_size, generator, chunk):
        return self._pieces(self.draw(batch_size, generator), chunk)

    def first(self, k):
        return self.X[: int(k)], self.y[: int(k)]

    def describe(self, X):
        if X.shape[0] == self.n:
            return f"X of shape {tuple(X.shape)}"
        return f"X of shape {tuple(self.X.shape)}, probed on its first {X.shape[0]} samples"


class DatasetData(ClientData):
    """A ``torch.utils.data.Dataset`` read lazily: items fetched (``ds[j]``) and collated per batch."""

    def __init__(self, ds, dtype, device):
        self.ds, self.dtype, self.device = ds, dtype, device
        self.n = len(ds)

    def take(self, idx):
        rows = range(self.n) if idx is None else idx.tolist()
        X, y = default_collate([tuple(self.ds[j])[:2] for j in rows])
        return _cast(X, self.dtype, self.device), _cast(y, self.dtype, self.device)

    def batches(self, batch_size, generator, chunk):
        return self._pieces(self.draw(batch_size, generator), chunk)


class LoaderData(ClientData):
    """A ``torch.utils.data.DataLoader``: its own batches, sampler and workers.

    ``n`` is not used for weighting: a full pass (:meth:`full_pass`) counts the samples it yields,
    and the caller divides by that count, so a sampler over a subset of ``loader.dataset``,
    ``drop_last`` or a ``batch_sampler`` give the mean over exactly the samples the client sees."""

    reproducible = False

    def __init__(self, loader, dtype, device):
        self.loader, self.dtype, self.device = loader, dtype, device
        self.n = None  # unknown until a pass has been counted (a sampler may have no __len__)
        self._it = None

    def _next(self):
        for _ in range(2):
            if self._it is None:
                self._it = iter(self.loader)
            try:
                return next(self._it)
            except StopIteration:
                self._it = None
        raise ValueError("a client's DataLoader yielded no batch")

    def _cast(self, batch):
        X, y = tuple(batch)[:2]
        return _cast(X, self.dtype, self.device), _cast(y, self.dtype, self.device)

    def batches(self, batch_size, generator, chunk):
        """The loader's next minibatch (its own batch size), whatever ``batch_size`` is; full passes
        go through :meth:`full_pass`, whose weights are only known at its end."""
        X, y = self._cast(self._next())
        yield X, y, 1.0

    def full_pass(self) -> Iterator[tuple]:
        """One pass over the loader: its batches ``(X, y)``. The caller weights batch b by
        ``len(b)`` and divides by the total it counted (the mean over the samples yielded)."""
        count = 0
        for b in self.loader:
            X, y = self._cast(b)
            count += int(X.shape[0])
            yield X, y
        if count == 0:
            raise ValueError("a client's DataLoader yielded no sample in a full pass")
        self.n = count

    def draw(self, batch_size, generator):
        raise TypeError("DataLoader clients choose their own batches")

    def first(self, k):
        """The first ``k`` items of ``loader.dataset``, collated by the loader's ``collate_fn``
        (not necessarily samples this client's sampler yields, but the same kind of batch):
        drawing a batch from the loader itself would consume its sampler's random numbers and
        shift the run's batches. None for an ``IterableDataset`` (reading it consumes it)."""
        ds = self.loader.dataset
        if isinstance(ds, torch.utils.data.IterableDataset):
            return None
        try:
            m = min(int(k), len(ds))
        except TypeError:  # no __len__
            return None
        if m == 0:
            return None
        return self._cast(self.loader.collate_fn([ds[j] for j in range(m)]))

    def describe(self, X):
        return f"the first {X.shape[0]} samples of its DataLoader's dataset: X of shape {tuple(X.shape)}"


def client_data(client, dtype: torch.dtype, device) -> ClientData:
    """Wrap what the user gave for one client; floating-point data take the model's dtype."""
    if isinstance(client, torch.utils.data.DataLoader):
        return LoaderData(client, dtype, device)
    if isinstance(client, (tuple, list)) and len(client) == 2:
        X, y = client
    elif isinstance(client, torch.utils.data.TensorDataset):
        X, y = client.tensors[0], client.tensors[1]
    elif isinstance(client, torch.utils.data.Dataset):
        if len(client) == 0:
            raise ValueError("client data must be non-empty (got an empty Dataset)")
        return DatasetData(client, dtype, device)
    else:
        raise TypeError(f"a client must be an (X, y) pair of tensors, a torch Dataset or a DataLoader, "
                        f"got {type(client).__name__}")
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    if X.shape[0] != y.shape[0] or X.shape[0] == 0:
        raise ValueError(f"client data must be non-empty with matching lengths, got X {tuple(X.shape)}, "
                         f"y {tuple(y.shape)}")
    return TensorData(_cast(X, dtype, device), _cast(y, dtype, device))


def check_finite(clients: Sequence, first_client: int = 0) -> None:
    """Refuse (``ValueError``), naming the first client and row, in-memory client data (a
    :class:`TensorData` or an ``(X, y)`` pair of tensors) that hold a NaN or an infinity: every
    gradient of a batch that draws the row, and f, would be nan or inf, and the run would end with
    f+h = nan. Lazy clients (a Dataset, a DataLoader) are not read here."""
    bad = []
    for j, c in enumerate(clients):
        pair = (c.X, c.y) if isinstance(c, TensorData) else c if isinstance(c, (tuple, list)) and len(c) == 2 else ()
        for name, t in zip(("X", "y"), pair):
            if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                rows = (~torch.isfinite(t.reshape(t.shape[0], -1))).any(1).nonzero()[:, 0]
                bad.append((first_client + j, name, rows))
    if bad:
        i, name, rows = bad[0]
        more = f"; {len(bad) - 1} more client(s) too: " + ", ".join(str(b[0]) for b in bad[1:6]) if len(bad) > 1 else ""
        raise ValueError(f"clients: client {i}: row {int(rows[0])} of its {name} holds a NaN or an infinity "
                         f"({rows.numel()} such row(s){more}); every gradient that reads it, and f, would be nan or "
                         f"inf: remove or impute those samples")
