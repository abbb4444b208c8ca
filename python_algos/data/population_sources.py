"""Client data built when the client is sampled (docs/population.md, "Sources"): ``make_client(i)``
callables for :class:`python_algos.clients.population.Population` over the data layer's sources.

* :class:`FolderClients` — a folder of one file per client (:mod:`.folder`'s formats and reader):
  N from the sorted listing, client i's file read only when client i is built;
* :class:`RowClients` — a data set's rows dealt to many clients by an index array (one row of
  indices per client, e.g. :func:`.partitions.cyclic`'s ``[N, s]``): the rows stay one shared copy,
  client i's ``s`` rows are gathered when it is built.

Each has a ``recipe`` for the resume fingerprint that names its source without reading the data.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Optional, Union

import numpy as np
import torch

from .folder import SPARSE, client_files, client_test_files, conform, hold_out, read_client_file, stem
from .standardize import client_moments, client_scales, scaled, std_of

__all__ = ["FolderClients", "RowClients", "scan_folder", "FOLDER_POPULATION"]

FOLDER_POPULATION = 1000  # files from which run reads a folder as a population (under partial participation)


def _digest(*parts) -> str:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(p if isinstance(p, bytes) else np.ascontiguousarray(p).tobytes())
    return h.hexdigest()


class FolderClients:
    """Client i of folder ``path`` is its i-th file in sorted name order, read when client i is built
    (``load_folder``'s rows of that client: its training rows after the seeded ``test_fraction``
    held out, none held out when ``path/test/`` exists). Each file's features must be ``reference``'s (file, X[:0],
    names): client 0's, or load_folder's (the first dense file, else the widest LIBSVM) after :meth:`take_widest`.

    ``classes``: the label values (sorted) mapped to 0..C-1 as ``load_folder`` maps every file's,
    a label outside them refused naming the file; None keeps the labels as written (float64).
    ``standardize``: ``"none"``, ``"local"`` (each client by its own statistics) or the pooled
    ``(mean, std)`` (``standardize.combine_moments`` of the clients' ``client_moments``): ``"global"``
    needs every file, so it is computed by whoever reads them. ``opened`` counts the files read.
    The recipe hashes the listing's names and byte sizes (os.stat, no file opened): a resume catches
    an added, removed or resized file anywhere, an edit of a sampled client's rows by the content hash,
    but not a same-size edit of a file it does not sample."""

    def __init__(self, path: str, label: Union[int, str, None] = None, header: Optional[bool] = None, *,
                 seed: int = 0, test_fraction: float = 0.2, classes=None, standardize: Union[str, tuple] = "none",
                 reference: Optional[tuple] = None):
        self.files = client_files(path)
        if len({stem(f) for f in self.files}) < len(self.files):
            raise ValueError(f"{path}: two client files share a name (a.csv and a.npz): one file per client")
        if isinstance(standardize, str) and standardize not in ("none", "local"):
            raise ValueError(f"standardize={standardize!r}: 'none', 'local' or the pooled (mean, std); 'global' "
                             f"pools every file's statistics (standardize.combine_moments of each client's "
                             f"client_moments): pass that pair")
        self.label, self.header, self.seed, self.standardize = label, header, int(seed), standardize
        self.test_fraction = float(test_fraction) if not os.path.isdir(os.path.join(path, "test")) else 0.0
        self.classes = None if classes is None else np.unique(np.asarray(classes, dtype=np.float64))
        self.opened, self.reference = 0, reference
        sizes = np.array([os.stat(f).st_size for f in self.files], dtype=np.int64)
        scale = standardize if isinstance(standardize, str) else _digest(*(np.asarray(t) for t in standardize))
        self.recipe = (f"FolderClients({os.path.abspath(path)!r}, label={label!r}, header={header!r}, seed={seed}, "
                       f"test_fraction={self.test_fraction:g}, "
                       f"classes={None if classes is None else self.classes.tolist()}, "
                       f"standardize={scale}, files={len(self.files)}, listing="
                       f"{_digest('|'.join(map(os.path.basename, self.files)).encode(), sizes)})")

    def __len__(self) -> int:
        return len(self.files)

    def _read(self, i: int) -> tuple:
        f = self.files[i]
        self.opened += 1
        try:
            if not os.path.isfile(f):
                raise FileNotFoundError(2, "no such file")
            return f, *read_client_file(f, self.label, self.header)
        except OSError as e:  # deleted or unreadable since the listing: named, as a bad file is
            raise ValueError(f"{f}: client {i}'s file cannot be read ({e.strerror or e}); it was listed when the "
                             f"population was made") from None

    def rows(self, i: int) -> tuple:
        """``(file, X, y, X_test, y_test)`` of client i as written (float64; the held-out pair None without
        ``test_fraction``): its file checked against ``reference``'s features, nothing mapped or scaled."""
        f, X, y, names = self._read(i)
        if self.reference is None:  # client 0's file sets the features every file must have
            f0, X0, _, names0 = (f, X, y, names) if i == 0 else self._read(0)
            self.reference = (f0, X0[:0], names0)
        X = conform(f, X, names, self.reference)
        return (f, *hold_out(f, X, y, self.test_fraction, self.seed)) if self.test_fraction > 0 else (f, X, y, None,
                                                                                                      None)

    def take_widest(self) -> None:
        """``load_folder``'s reference, reading the files up to the first dense one (all, if all are LIBSVM): a
        LIBSVM file wider than client 0's is then widened, as the eager folder path does, not refused."""
        ref = None
        for i, f in enumerate(self.files):
            _, X, _, names = self._read(i)
            if ref is None or not f.lower().endswith(SPARSE) or X.shape[1] > ref[1].shape[1]:
                ref = (f, X[:0], names)
            if not f.lower().endswith(SPARSE):
                break
        self.reference = ref

    def __call__(self, i: int) -> tuple:
        f, X, y, _, _ = self.rows(i)
        if self.classes is not None:
            at = np.searchsorted(self.classes, y).clip(0, len(self.classes) - 1)
            bad = np.flatnonzero(self.classes[at] != y)
            if len(bad):
                raise ValueError(f"{f}: label {y[bad[0]]:g} is not one of the classes {self.classes.tolist()}")
            y = at
        X = torch.from_numpy(X)
        if isinstance(self.standardize, tuple):
            X = scaled(X, *self.standardize)
        elif self.standardize == "local":
            X = scaled(X, *client_scales([X], "local")[0])
        return X, torch.from_numpy(y).long() if self.classes is not None else torch.from_numpy(y)


def scan_folder(src: FolderClients, mode: str) -> tuple:
    """What a run needs before its first round of the folder behind ``src`` (raw rows: ``classes`` None,
    ``standardize`` none), reading one file at a time: every file checked (as ``load_folder`` checks them,
    before anything is written), the training labels as written per client, the test rows (held out or
    ``test/``'s, scaled as ``mode`` says), and for ``global`` the pooled ``(mean, std)``, as
    ``combine_moments`` sums them (a second pass re-reads the files for the squares about the pooled
    mean). Returns ``(ys, X_test, y_test, test_groups or None, scale)``; ``src.reference`` is the folder's."""
    src.take_widest()
    tests = {i: t for t, i in client_test_files(os.path.dirname(src.files[0]), src.files)}
    ys, Xt, yt, gt, total, n = [], [], [], [], 0, 0
    for i in range(len(src)):
        f, X, y, X_te, y_te = src.rows(i)
        if i in tests or (None in tests and i == 0):
            t = tests[i if i in tests else None]
            X_te, y_te, names = read_client_file(t, src.label, src.header)
            X_te = conform(t, X_te, names, src.reference)
        ys.append(y)
        cnt, mean, _ = client_moments(torch.from_numpy(X))
        total, n = total + cnt * mean, n + cnt
        if X_te is not None and len(y_te):
            X_te = torch.from_numpy(X_te)
            Xt, yt = Xt + [scaled(X_te, *client_scales([torch.from_numpy(X)], "local")[0]) if mode == "local"
                           else X_te], yt + [y_te]
            gt.append(np.full(len(y_te), -1 if None in tests else i))
    if mode == "local" and None in tests:
        raise ValueError("standardize: 'local' scales each client by its own statistics, and the pooled test "
                         "file belongs to no client; use 'global' (or per-client test files, folder:PATH/test/)")
    scale = mode
    if mode == "global":
        mean, m2 = total / n, 0
        for i in range(len(src)):
            cnt, m, q = client_moments(torch.from_numpy(src.rows(i)[1]))
            m2 = m2 + (q + cnt * (m - mean) ** 2)
        scale = (mean, std_of(m2 / n))
        Xt = [scaled(X, *scale) for X in Xt]
    X_test = torch.cat(Xt) if Xt else None
    return ys, X_test, yt, torch.from_numpy(np.concatenate(gt)) if Xt and None not in tests else None, scale


class RowClients(Sequence):
    """Client i is ``(X[parts[i]], y[parts[i]])``, gathered when asked for: ``parts`` one index array
    per client (a list, or one ``[N, s]`` array), the rows one shared copy. A Sequence of N clients
    and their ``make_client`` (``rows(i)``); ``nbytes_estimate`` is the shared rows' bytes."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor, parts, name: str = "rows"):
        self.X, self.y, self.parts = X, y, parts
        self.recipe = (f"RowClients({name}, {len(parts)} clients of {len(X)} rows, content "
                       f"{_digest(X.numpy(), y.numpy(), *(parts if isinstance(parts, list) else [parts]))})")

    def __len__(self) -> int:
        return len(self.parts)

    def __getitem__(self, i):
        idx = torch.from_numpy(np.asarray(self.parts[i]))
        return self.X[idx], self.y[idx]

    def __call__(self, i: int) -> tuple:
        return self[i]

    def nbytes_estimate(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in (self.X, self.y))
