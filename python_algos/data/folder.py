"""``--dataset folder:PATH``: your own federated data, one file per client.

    hospitals/a.csv, b.csv, ...      one client each, in sorted name order; the name is the client's
    hospitals/test/a.csv, ...        optional: each client's test rows (same names), or one pooled file

A file is CSV (``.csv``) or TSV (``.tsv``) with one row per sample (a header row or not; the label
column is ``label=``: a header name or a 0-based index, by default the last column), NumPy ``.npz`` or
torch ``.pt`` holding arrays ``X`` and ``y``, or LIBSVM (``.libsvm``, ``.svm``). Labels that are few
integers are classes (mapped to 0..C-1 over every file), others regression targets. Without
``test/``, each client's ``test_fraction`` of rows is held out (seeded). Bad input is refused in one
line naming the file, the line and the rule, before anything is written.
"""

from __future__ import annotations

import csv
import os
from typing import Annotated, Optional, Union

import numpy as np
import torch

from .loaders import DataNotFoundError, classes_or_targets, load_libsvm
from .options import Opt
from .split import train_test_indices

__all__ = ["PREFIX", "FORMATS", "client_files", "read_client_file", "read_client", "load_folder", "conform",
           "hold_out", "stem", "client_test_files"]

PREFIX = "folder:"
FORMATS = (".csv", ".tsv", ".npz", ".pt", ".libsvm", ".svm")
SPARSE = (".libsvm", ".svm")  # a row leaves out its zero features, the trailing ones included


def client_files(folder: str) -> list:
    """The client files of ``folder`` (hidden files and sub-folders aside), in sorted name order."""
    if not os.path.isdir(folder):
        raise DataNotFoundError(f"{folder}: no such folder (folder:PATH names a folder with one file per client)")
    names = sorted(f for f in os.listdir(folder) if not f.startswith(".") and os.path.isfile(os.path.join(folder, f)))
    for f in names:
        if os.path.splitext(f)[1].lower() not in FORMATS:
            raise ValueError(f"{os.path.join(folder, f)}: not a client file; one file per client, each "
                             f"{', '.join(FORMATS)}")
    if not names:
        raise ValueError(f"{folder}: no client files (one file per client: {', '.join(FORMATS)})")
    return [os.path.join(folder, f) for f in names]


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _column(path: str, label, names: Optional[list], width: int) -> int:
    """The label column's index; refused naming the file when the file has no such column."""
    if isinstance(label, str) and names is None:
        raise ValueError(f"{path}:1: label={label!r} names a column, but the file has no header row: give the "
                         f"label column's 0-based index, or add a header")
    if isinstance(label, str) and label not in names:
        raise ValueError(f"{path}:1: no label column {label!r}; the header has {', '.join(names)}")
    if isinstance(label, int) and not -width <= label < width:
        raise ValueError(f"{path}:1: no label column {label}: the rows have {width} columns (0-based)")
    return names.index(label) if isinstance(label, str) else (width - 1 if label is None else label % width)


def _read_table(path: str, label, header: Optional[bool]):
    """``(X, y, column names)`` of a CSV / TSV file; every rule broken is named with its line."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = [(i, r) for i, r in enumerate(csv.reader(f, delimiter="\t" if path.endswith(".tsv") else ","), 1)
                    if any(c.strip() for c in r)]
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path}: not a CSV / TSV text file ({e})") from None
    if not rows:
        raise ValueError(f"{path}: no samples; every client needs at least 1 row")
    has_header = not any(_number(c) for c in rows[0][1]) if header is None else header
    names = [c.strip() for c in rows[0][1]] if has_header else None
    body, width = rows[1:] if has_header else rows, len(rows[0][1])
    if width < 2:
        raise ValueError(f"{path}:{rows[0][0]}: 1 column; a row needs features and a label")
    col = _column(path, label, names, width)
    try:
        values = np.array([r for _, r in body], dtype=np.float64).reshape(len(body), width)
    except ValueError:  # find the line at fault
        for line, r in body:
            if len(r) != width:
                raise ValueError(f"{path}:{line}: {len(r)} fields, the first row has {width} (ragged rows)") from None
            j = next((j for j, c in enumerate(r) if not _number(c)), None)
            if j is not None:
                raise ValueError(f"{path}:{line}: column {names[j] if names else j}: {r[j]!r} is not a "
                                 f"number") from None
        raise
    bad = np.argwhere(~np.isfinite(values))
    if len(bad):
        (i, j), line = bad[0], body[bad[0][0]][0]
        raise ValueError(f"{path}:{line}: column {names[j] if names else j}: {body[i][1][j]!r} is not a finite number")
    keep = [j for j in range(width) if j != col]
    return values[:, keep], values[:, col], (None if names is None else [names[j] for j in keep])


def read_client_file(path: str, label: Union[int, str, None] = None, header: Optional[bool] = None):
    """``(X float64 [n, ...], y float64 [n], column names or None)`` of one client's file."""
    ext, names = os.path.splitext(path)[1].lower(), None
    if ext in (".csv", ".tsv"):
        X, y, names = _read_table(path, label, header)
    elif ext in (".npz", ".pt"):
        try:
            with open(path, "rb") as f:  # .npz: its arrays read now, so the file closes here
                got = dict(np.load(f, allow_pickle=False)) if ext == ".npz" else torch.load(f, weights_only=True)
        except Exception as e:  # a damaged archive, or a .pt holding more than tensors (weights_only)
            raise ValueError(f"{path}: not a readable {ext} file of arrays X and y ({type(e).__name__}: {e})") from None
        if not isinstance(got, dict) or not all(k in got for k in ("X", "y")):
            has = ", ".join(map(str, got)) if isinstance(got, dict) else f"a {type(got).__name__}"
            raise ValueError(f"{path}: needs arrays 'X' and 'y' (features, labels), has {has}")
        X, y = (np.asarray(torch.as_tensor(got[k]).double()) for k in ("X", "y"))
    else:
        X, y = (t.double().numpy() for t in load_libsvm(path, dtype=torch.float64))
    if y.ndim != 1 or X.ndim < 2 or len(y) != len(X):
        raise ValueError(f"{path}: X of shape {tuple(X.shape)} and y of shape {tuple(y.shape)}: need X [n, ...] and "
                         f"y [n]")
    if len(y) == 0:
        raise ValueError(f"{path}: no samples; every client needs at least 1 row")
    rows = np.flatnonzero(~np.isfinite(X.reshape(len(X), -1)).all(1) | ~np.isfinite(y))
    if len(rows):
        raise ValueError(f"{path}: row {rows[0] + 1}: NaN or Inf; the data must be finite numbers")
    return X, y, names


def stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _reference(files: list, read: list) -> tuple:
    """``(file, X, column names)`` every file must match: the first dense file, else the widest LIBSVM one."""
    dense = [(f, *r[::2]) for f, r in zip(files, read) if not f.lower().endswith(SPARSE)]
    return dense[0] if dense else max(((f, *r[::2]) for f, r in zip(files, read)), key=lambda t: t[1].shape[1])


def conform(f: str, X: np.ndarray, names: Optional[list], ref: tuple) -> np.ndarray:
    """``X`` of file ``f`` with the reference's features (a LIBSVM file widened with the trailing zero
    columns it omits); other feature counts, or other header names, are refused naming the file."""
    first, X0, names0 = ref
    if f.lower().endswith(SPARSE) and X.ndim == 2 == X0.ndim and X.shape[1] < X0.shape[1]:
        X = np.pad(X, ((0, 0), (0, X0.shape[1] - X.shape[1])))
    if X.shape[1:] != X0.shape[1:]:
        raise ValueError(f"{f}: features of shape {tuple(X.shape[1:])}, {first} has {tuple(X0.shape[1:])}: every "
                         f"client's file needs the same columns")
    if names is not None and names0 is not None and names != names0:
        raise ValueError(f"{f}:1: its columns {', '.join(names)} differ from {first}'s {', '.join(names0)}")
    return X


def client_test_files(path: str, files: list) -> list:
    """``[(test file, its client index or None for a pooled file)]`` of ``path/test/`` (empty without it)."""
    if not os.path.isdir(os.path.join(path, "test")):
        return []
    tests, index = client_files(os.path.join(path, "test")), {stem(f): i for i, f in enumerate(files)}
    if len(tests) == 1 and stem(tests[0]) not in index:
        return [(tests[0], None)]
    for t in tests:
        if stem(t) not in index:
            raise ValueError(f"{t}: no client file {stem(t)}.* in {path}; test/ holds each client's test rows under "
                             f"its client's name, or one pooled file")
    return [(t, index[stem(t)]) for t in tests]


def hold_out(f: str, X: np.ndarray, y: np.ndarray, test_fraction: float, seed: int) -> tuple:
    """``(X, y, X_test, y_test)``: client file ``f``'s rows less its seeded ``test_fraction`` share."""
    tr, te = train_test_indices(len(y), test_fraction, seed)  # each client holds out its own share
    if len(tr) == 0:
        raise ValueError(f"{f}: {len(y)} row(s), none left to train on after holding out test_fraction "
                         f"{test_fraction:g}; give it more rows, a test/ folder or a smaller test fraction")
    return X[tr], y[tr], X[te], y[te]


def read_client(path: str, index: int, label: Union[int, str, None] = None, header: Optional[bool] = None, *,
                seed: int = 0, test_fraction: float = 0.2, features: Optional[tuple] = None) -> tuple:
    """``(X, y, X_test, y_test)`` (float64 arrays, labels as written; the test pair None when it has
    none) of client ``index`` of the folder ``path``, reading only its own file and its own test file
    (a pooled test file is the server's): what a Flower node holds. The rows are :func:`load_folder`'s
    for that client; ``features``, the feature shape the server expects, is checked as
    :func:`load_folder` checks every file against the first (a LIBSVM file is widened to it)."""
    files = client_files(path)
    if not 0 <= index < len(files):
        raise ValueError(f"{path}: client {index}: the folder has {len(files)} client files (0..{len(files) - 1})")
    f = files[index]
    X, y, names = read_client_file(f, label, header)
    X = conform(f, X, names, (f, X, names) if features is None else ("the server", np.empty((0, *features)), None))
    tests = client_test_files(path, files)
    own = [t for t, i in tests if i == index]
    if own:
        Xt, yt, names_t = read_client_file(own[0], label, header)
        return X, y, conform(own[0], Xt, names_t, (f, X, names)), yt
    return hold_out(f, X, y, test_fraction, seed) if not tests and test_fraction > 0 else (X, y, None, None)


def load_folder(path: str, label: Annotated[Union[int, str, None], Opt(
                    what="CSV/TSV: the label column, a header name or a 0-based index; null: the last")] = None,
                header: Annotated[Optional[bool], Opt(what="CSV/TSV: the first row is a header; null: when it holds "
                                                            "no number")] = None, *, seed: int = 0,
                test_fraction: float = 0.2):
    """``(X, y, X_test, y_test, groups, test_groups, task, classes, source)`` of the client files in
    ``path`` (see the module); ``groups`` / ``test_groups`` the client index of each row (None: a
    pooled test file)."""
    files = client_files(path)
    if len({stem(f) for f in files}) < len(files):
        raise ValueError(f"{path}: two client files share a name (a.csv and a.npz): one file per client")
    read = [read_client_file(f, label, header) for f in files]
    ref, tests = _reference(files, read), client_test_files(path, files)
    Xs, ys = [conform(f, X, names, ref) for f, (X, _, names) in zip(files, read)], [r[1] for r in read]
    Xt, yt, gt = [], [], []
    for f, i in tests:
        X, y, names = read_client_file(f, label, header)
        Xt, yt, gt = Xt + [conform(f, X, names, ref)], yt + [y], gt + [np.full(len(y), -1 if i is None else i)]
    for i, (f, X, y) in enumerate(zip(files, Xs, ys) if not tests and test_fraction > 0 else ()):
        Xs[i], ys[i], X_te, y_te = hold_out(f, X, y, test_fraction, seed)
        Xt, yt, gt = Xt + [X_te], yt + [y_te], gt + [np.full(len(y_te), i)]
    labels, task, classes = classes_or_targets(ys + yt)
    has_test, pooled = sum(len(y) for y in yt) > 0, any(i is None for _, i in tests)  # pooled: rows of no client
    Xt_, yt_ = (torch.from_numpy(np.concatenate(Xt)), torch.cat(labels[len(ys):])) if has_test else (None, None)
    names = [stem(f) for f in files]
    source = (f"folder {path}: {len(files)} client files ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"
              f"{', test/' if tests else ''}")
    return (torch.from_numpy(np.concatenate(Xs)), torch.cat(labels[:len(ys)]), Xt_, yt_,
            torch.repeat_interleave(torch.arange(len(files)), torch.tensor([len(y) for y in ys])),
            torch.from_numpy(np.concatenate(gt)) if has_test and not pooled else None, task, classes, source)
