"""Client partitions of a data set (docs/algorithms.md §1.4). Every function returns one sorted int64
index array per client, is seeded, and gives the same split for the same arguments.

* :func:`iid` — a random permutation cut into N near-equal parts.
* :func:`dirichlet` — label skew Dir(eta): for each class c, p_c ~ Dir(eta·1_N) and client i gets
  the share p_{c,i} of class c (FedCanon, DEPOSITUM). Small eta = strong heterogeneity. Every
  client gets at least ``min_size`` samples: the draw is repeated (with a warning saying how often)
  until that holds.
* :func:`label_shards` — sort by label, cut into contiguous chunks (FedNMap's split; with
  ``shards_per_client > 1``, McMahan et al.'s shards dealt at random).
* :func:`dirichlet` with ``labels=writer_ids`` — Dirichlet over writers (FEMNIST, FedCanon v2);
  :func:`by_group` — one client per writer/generating client (natural split).
* :func:`cyclic` — client i takes ``samples`` consecutive rows of a seeded permutation, wrapping
  around (clients overlap once N·samples > n): client i's rows depend on i and the seed alone.
* :func:`label_histograms` — per-client label counts, for reports.
"""

from __future__ import annotations

import warnings
from typing import Optional, Sequence

import numpy as np
import torch

__all__ = ["iid", "dirichlet", "label_shards", "by_group", "cyclic", "label_histograms", "PARTITIONS"]

PARTITIONS = ("iid", "dirichlet", "shards", "writers", "natural", "cyclic")


def _labels(labels) -> np.ndarray:
    a = labels.cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if a.ndim != 1:
        raise ValueError(f"labels must be 1-d, got shape {a.shape}")
    return a


def _check_n(num_clients, n):
    if isinstance(num_clients, bool) or int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
    if n < num_clients:
        raise ValueError(f"cannot split {n} samples over {num_clients} clients (partition 'cyclic' gives any number "
                         f"of clients rows of one shared copy, overlapping)")


def iid(n: int, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """Uniformly random split of ``range(n)`` into ``num_clients`` parts of size n//N or n//N + 1."""
    _check_n(num_clients, n)
    perm = np.random.default_rng([seed, 1]).permutation(n)
    return [np.sort(p).astype(np.int64) for p in np.array_split(perm, int(num_clients))]


def dirichlet(labels, num_clients: int, eta: float, seed: int = 0, min_size: int = 10, balance: bool = True,
              max_tries: int = 1000) -> list[np.ndarray]:
    """Dirichlet label skew Dir(eta) (docs/algorithms.md §1.4).

    For each class c (each distinct value of ``labels``; pass writer ids for FEMNIST's Dirichlet
    over writers), draw p_c ~ Dir(eta·1_N) and give client i the share p_{c,i} of that class's
    samples (rounded down at the cut points). With ``balance=True`` (as in NIID-Bench's
    ``partition_data``, the usual implementation) a client that already holds n/N samples gets no
    share of the classes drawn after it, which keeps sizes bounded for tiny eta. The whole draw is
    repeated until every client has at least ``min_size`` samples; if that took more than one
    draw a ``UserWarning`` says how many, and after ``max_tries`` a ``ValueError`` asks for a
    smaller ``min_size`` or a larger eta.
    """
    y = _labels(labels)
    n = y.shape[0]
    _check_n(num_clients, n)
    N = int(num_clients)
    if not eta > 0:
        raise ValueError(f"eta must be > 0 (Dir(eta); use partition 'iid' for eta = inf), got {eta!r}")
    if min_size * N > n:
        raise ValueError(f"min_size={min_size} x {N} clients exceeds the {n} samples")
    rng = np.random.default_rng([seed, 2])
    classes = np.unique(y)
    by_class = [np.flatnonzero(y == c) for c in classes]
    for tries in range(1, max_tries + 1):
        parts: list[list[np.ndarray]] = [[] for _ in range(N)]
        sizes = np.zeros(N, dtype=np.int64)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(N, float(eta)))
            if balance:
                p = p * (sizes < n / N)
                p = p / p.sum() if p.sum() > 0 else np.full(N, 1.0 / N)
            cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
            for i, chunk in enumerate(np.split(idx, cuts)):
                parts[i].append(chunk)
                sizes[i] += len(chunk)
        if sizes.min() >= min_size:
            if tries > 1:
                warnings.warn(
                    f"Dirichlet partition Dir({eta:g}) over {N} clients: resampled {tries - 1} time(s) so that every "
                    f"client has >= {min_size} samples (the accepted split is still a Dir({eta:g}) draw, conditioned "
                    f"on that minimum)",
                    UserWarning,
                    stacklevel=2,
                )
            return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
    raise ValueError(
        f"Dirichlet partition Dir({eta:g}) over {N} clients: no draw in {max_tries} gave every client >= {min_size} "
        f"samples; use a smaller min_size, a larger eta, fewer clients or balance=True"
    )


def label_shards(labels, num_clients: int, shards_per_client: int = 1, seed: int = 0) -> list[np.ndarray]:
    """Label-sorted split. ``shards_per_client=1`` (FedNMap): sort the samples by label (stable,
    ties in index order) and cut them into N contiguous, non-overlapping chunks, so client i sees
    one or two classes. ``shards_per_client = s > 1``: cut into N·s shards and deal s shards to
    each client at random (McMahan et al.'s pathological non-IID split)."""
    y = _labels(labels)
    n = y.shape[0]
    _check_n(num_clients, n)
    N, s = int(num_clients), int(shards_per_client)
    if s < 1 or N * s > n:
        raise ValueError(f"shards_per_client must be >= 1 with num_clients * shards_per_client <= {n}, got {s}")
    order = np.argsort(y, kind="stable")
    shards = np.array_split(order, N * s)
    if s == 1:
        return [np.sort(p).astype(np.int64) for p in shards]
    deal = np.random.default_rng([seed, 3]).permutation(N * s).reshape(N, s)
    return [np.sort(np.concatenate([shards[j] for j in row])).astype(np.int64) for row in deal]


def by_group(groups, num_clients: Optional[int] = None) -> list[np.ndarray]:
    """One client per distinct group id (writer, generating client), in increasing id order.
    ``num_clients``, if given, must equal the number of groups."""
    g = _labels(groups)
    ids = np.unique(g)
    if num_clients is not None and int(num_clients) != len(ids):
        raise ValueError(f"the data have {len(ids)} natural clients (groups); num_clients={num_clients} does not match")
    return [np.flatnonzero(g == k).astype(np.int64) for k in ids]


def cyclic(n: int, num_clients: int, samples: int, seed: int = 0) -> np.ndarray:
    """``[N, samples]`` int64, row i sorted: client i's rows ``perm[(i·samples + j) mod n]`` of a seeded
    permutation ``perm`` of ``range(n)`` (one array, not N: 10^5 clients of A9A cost 2.4 MB of indices)."""
    if isinstance(samples, bool) or int(samples) != samples or not 1 <= samples <= n:
        raise ValueError(f"samples per client must be an int in [1, {n}] (the rows), got {samples!r}")
    if isinstance(num_clients, bool) or int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
    perm = np.random.default_rng([seed, 4]).permutation(n)
    at = (np.arange(int(num_clients), dtype=np.int64)[:, None] * int(samples) + np.arange(int(samples))) % n
    return np.sort(perm[at], axis=1).astype(np.int64)


def label_histograms(labels, parts: Sequence[np.ndarray], num_classes: Optional[int] = None) -> np.ndarray:
    """``[N, C]`` int64 counts: row i is client i's label histogram (C = max label + 1 by default)."""
    y = _labels(labels).astype(np.int64)
    C = int(num_classes) if num_classes is not None else int(y.max()) + 1
    if isinstance(parts, np.ndarray) and parts.ndim == 2:  # one [N, s] array (cyclic): counted at once
        at, keep = np.arange(len(parts))[:, None] * C + y[parts], y[parts] < C  # as bincount(...)[:C] drops >= C
        return np.bincount(at[keep], minlength=len(parts) * C).reshape(len(parts), C).astype(np.int64)
    return np.stack([np.bincount(y[p], minlength=C)[:C] for p in parts]).astype(np.int64)
