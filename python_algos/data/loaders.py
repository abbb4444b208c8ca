"""Readers for the standard files of the papers' datasets. Nothing is ever downloaded.

Every reader takes the directory the user passed as ``--data-dir`` and looks for the files in
the layouts people usually have (the original archive's names, torchvision's ``<Name>/raw``,
LEAF's ``data/<split>``). A missing file raises :class:`DataNotFoundError` naming the file, every
place it was looked for, and where the file can be obtained on a machine with internet.

=================  ==============================================  ================================
reader             files                                            returns
=================  ==============================================  ================================
``read_idx``       one IDX file, gzipped or not                     ``np.ndarray`` (dtype of file)
``load_mnist``     ``train-images-idx3-ubyte[.gz]`` and 3 others    ``(X, y, X_test, y_test)``
``load_cifar10``   ``cifar-10-batches-py/data_batch_1..5, test``    ``(X, y, X_test, y_test)``
``load_libsvm``    any LIBSVM / SVMlight text file                  ``(X dense or sparse, y)``
``load_a9a``       ``a9a`` and ``a9a.t``                            ``(X, y, X_test, y_test)``
``load_femnist``   LEAF JSON: ``train/*.json``, ``test/*.json``      ``(X, y, writers, X_t, y_t, w_t,
                                                                      writer_names)``
=================  ==============================================  ================================

Images come back as float32 tensors in [0, 1] with shape ``(n, C, H, W)``; labels as int64.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import pickle
import warnings
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

__all__ = [
    "DataNotFoundError",
    "read_idx",
    "load_mnist",
    "load_cifar10",
    "load_libsvm",
    "classes_or_targets",
    "load_a9a",
    "load_femnist",
]


class DataNotFoundError(FileNotFoundError):
    """A dataset file is not where it was looked for (the message says where and how to get it)."""


def _missing(dataset: str, names: Sequence[str], dirs: Sequence[str], source: str) -> DataNotFoundError:
    where = "\n".join(f"  {d}" for d in dirs)
    files = ", ".join(names)
    return DataNotFoundError(
        f"{dataset}: expected {files} in one of\n{where}\n"
        f"fedkernels never downloads data. {source} Copy the files into one of the folders above "
        f"and pass its parent with --data-dir (or data_dir=)."
    )


def _find(data_dir: str, subdirs: Iterable[str], names: Sequence[str]) -> tuple[Optional[str], list[str]]:
    """First ``data_dir/sub/name`` that exists, trying each name (and name + '.gz') in each sub."""
    tried = []
    for sub in subdirs:
        d = os.path.join(data_dir, sub) if sub else data_dir
        tried.append(d)
        for name in names:
            for cand in (name, name + ".gz"):
                p = os.path.join(d, cand)
                if os.path.isfile(p):
                    return p, tried
    return None, tried


def _check_dir(data_dir) -> str:
    if data_dir is None:
        raise DataNotFoundError("no data directory given: pass --data-dir DIR (or data_dir=) pointing at the "
                                "dataset files")
    return os.path.abspath(os.path.expanduser(str(data_dir)))


def _open(path: str):
    with open(path, "rb") as f:
        head = f.read(2)
    return gzip.open(path, "rb") if head == b"\x1f\x8b" else open(path, "rb")


# --------------------------------------------------------------------------- #
# IDX (MNIST, Fashion-MNIST)
# --------------------------------------------------------------------------- #

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (the MNIST format), gzipped or not (detected from the content)."""
    with _open(path) as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number {raw[:4]!r})")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path}: truncated IDX header")
    shape = tuple(int(v) for v in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    count = int(np.prod(shape)) if shape else 1
    offset = 4 + 4 * ndim
    if len(raw) - offset < count * dtype.itemsize:
        raise ValueError(f"{path}: truncated IDX data (shape {shape}, {len(raw) - offset} bytes)")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(shape).astype(dtype.newbyteorder("="))


_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_MNIST_DIRS = {
    "mnist": ["", "mnist", "MNIST", "MNIST/raw", "mnist/raw"],
    "fashion_mnist": ["", "fashion_mnist", "fashion-mnist", "FashionMNIST", "FashionMNIST/raw", "fashion_mnist/raw"],
}
_MNIST_SOURCE = {
    "mnist": "Get the four IDX files from https://ossci-datasets.s3.amazonaws.com/mnist/ (mirror of "
    "yann.lecun.com/exdb/mnist), or run torchvision.datasets.MNIST(root, download=True) on a machine "
    "with internet (they land in root/MNIST/raw).",
    "fashion_mnist": "Get the four IDX files from https://github.com/zalandoresearch/fashion-mnist "
    "(data/fashion), or torchvision.datasets.FashionMNIST(root, download=True) (root/FashionMNIST/raw).",
}


def load_mnist(data_dir, kind: str = "mnist"):
    """MNIST (``kind="mnist"``) or Fashion-MNIST (``"fashion_mnist"``) from IDX files.

    Looks in ``data_dir``, ``data_dir/mnist``, ``data_dir/MNIST/raw`` (torchvision), ... (for
    Fashion-MNIST: ``fashion_mnist``, ``fashion-mnist``, ``FashionMNIST/raw``). Files may be
    gzipped. Returns ``(X, y, X_test, y_test)``: float32 ``(n, 1, 28, 28)`` in [0, 1], int64 labels.
    """
    if kind not in _MNIST_DIRS:
        raise ValueError(f"kind must be one of {list(_MNIST_DIRS)}, got {kind!r}")
    root = _check_dir(data_dir)
    # every file must come from the same folder (train and test of one dataset)
    for sub in _MNIST_DIRS[kind]:
        paths = {}
        for key, name in _MNIST_FILES.items():
            p, _ = _find(root, [sub], [name])
            if p is None:
                break
            paths[key] = p
        if len(paths) == 4:
            break
    else:
        dirs = [os.path.join(root, s) if s else root for s in _MNIST_DIRS[kind]]
        names = [n + "[.gz]" for n in _MNIST_FILES.values()]
        raise _missing({"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}[kind], names, dirs, _MNIST_SOURCE[kind])

    def images(p):
        a = read_idx(p)
        if a.ndim != 3:
            raise ValueError(f"{p}: expected a 3-d image array, got shape {a.shape}")
        return torch.from_numpy(a.astype(np.float32) / 255.0).unsqueeze(1)

    def labels(p, n):
        a = read_idx(p)
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(f"{p}: expected {n} labels, got shape {a.shape}")
        return torch.from_numpy(a.astype(np.int64))

    X, Xt = images(paths["train_images"]), images(paths["test_images"])
    return X, labels(paths["train_labels"], X.shape[0]), Xt, labels(paths["test_labels"], Xt.shape[0])


# --------------------------------------------------------------------------- #
# CIFAR-10 (python pickle batches)
# --------------------------------------------------------------------------- #


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only (a CIFAR batch); anything else is refused,
    so a tampered file cannot run code."""

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),  # bytes in protocol-2 pickles written by Python 3
        ("builtins", "list"),
        ("builtins", "dict"),
        ("collections", "OrderedDict"),
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} (only numpy arrays are expected)")


def _load_pickle(path: str) -> dict:
    with _open(path) as f:
        data = f.read()
    out = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    if not isinstance(out, dict):
        raise ValueError(f"{path}: expected a dict batch, got {type(out).__name__}")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in out.items()}


def load_cifar10(data_dir):
    """CIFAR-10 from the "python version" batches (``cifar-10-batches-py/data_batch_1..5``,
    ``test_batch``). Returns ``(X, y, X_test, y_test)``: float32 ``(n, 3, 32, 32)`` in [0, 1]."""
    root = _check_dir(data_dir)
    subdirs = ["cifar-10-batches-py", "cifar10/cifar-10-batches-py", "CIFAR10/cifar-10-batches-py", "cifar10", ""]
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for sub in subdirs:
        d = os.path.join(root, sub) if sub else root
        if all(os.path.isfile(os.path.join(d, n)) for n in names):
            break
    else:
        raise _missing(
            "CIFAR-10", names, [os.path.join(root, s) if s else root for s in subdirs],
            "Get cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and unpack it "
            "(it creates cifar-10-batches-py/), or torchvision.datasets.CIFAR10(root, download=True).",
        )

    def batch(name):
        b = _load_pickle(os.path.join(d, name))
        if "data" not in b or "labels" not in b:
            raise ValueError(f"{os.path.join(d, name)}: a CIFAR batch needs 'data' and 'labels', got keys {sorted(b)}")
        x = np.asarray(b["data"], dtype=np.uint8)
        if x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
            raise ValueError(f"{os.path.join(d, name)}: data must be [n, 3072] uint8, got {x.shape}")
        y = np.asarray(b["labels"], dtype=np.int64)
        if y.shape != (x.shape[0],):
            raise ValueError(f"{os.path.join(d, name)}: {x.shape[0]} images but labels of shape {y.shape}")
        return x, y

    train = [batch(n) for n in names[:5]]
    xt, yt = batch("test_batch")

    def to_t(x):
        return torch.from_numpy(x.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0)

    X = to_t(np.concatenate([b[0] for b in train]))
    y = torch.from_numpy(np.concatenate([b[1] for b in train]))
    return X, y, to_t(xt), torch.from_numpy(yt)


# --------------------------------------------------------------------------- #
# LIBSVM text (A9A and any other)
# --------------------------------------------------------------------------- #


def load_libsvm(path: str, n_features: Optional[int] = None, sparse: bool = False, dtype=torch.float32):
    """Read a LIBSVM / SVMlight file: ``label idx:value idx:value ...`` per line, 1-based indices.

    ``qid:`` fields and ``#`` comments are ignored. ``n_features`` defaults to the largest index
    (pass it to give train and test files the same width). Returns ``(X, y)``: X a dense
    ``[n, n_features]`` tensor, or a sparse CSR tensor with ``sparse=True``; y float64 labels as
    written (e.g. -1/+1 for A9A).
    """
    if not os.path.isfile(path):
        raise DataNotFoundError(f"LIBSVM file {path} does not exist")
    labels, rows, cols, vals = [], [], [], []
    with _open(path) as f, io.TextIOWrapper(f, encoding="utf-8") as text:
        for lineno, raw in enumerate(text, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            try:
                labels.append(float(parts[0]))
                r = len(labels) - 1
                for tok in parts[1:]:
                    k, v = tok.split(":", 1)
                    if k == "qid":
                        continue
                    j = int(k)
                    if j < 1:
                        raise ValueError(f"feature index {j} < 1 (LIBSVM indices are 1-based)")
                    rows.append(r)
                    cols.append(j - 1)
                    vals.append(float(v))
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: not a LIBSVM line ({e}): {raw.strip()[:80]!r}") from None
    n = len(labels)
    if n == 0:
        raise ValueError(f"{path}: no samples")
    width = (max(cols) + 1) if cols else 0
    if n_features is None:
        n_features = width
    elif width > n_features:
        raise ValueError(f"{path}: feature index {width} exceeds n_features={n_features}")
    y = torch.tensor(labels, dtype=torch.float64)
    idx = torch.tensor([rows, cols], dtype=torch.int64)
    v = torch.tensor(vals, dtype=dtype)
    X = torch.sparse_coo_tensor(idx, v, (n, n_features), check_invariants=True).coalesce()
    if not sparse:
        return X.to_dense(), y
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return X.to_sparse_csr(), y


def classes_or_targets(ys: list):
    """``(tensors, task, classes)`` of label arrays ``ys``: integral labels with few values are classes
    0..C-1 (in sorted order over all arrays: -1/+1 -> 0/1), other labels regression targets (float64)."""
    values = np.unique(np.concatenate(ys))
    n = sum(len(y) for y in ys)
    if np.all(values == np.round(values)) and len(values) <= max(2, min(1000, n // 2)):
        return [torch.from_numpy(np.searchsorted(values, y)).long() for y in ys], "multiclass", len(values)
    return [torch.from_numpy(y) for y in ys], "regression", 0


def load_a9a(data_dir, sparse: bool = False):
    """A9A (Adult, 123 binary features) from LIBSVM's ``a9a`` and ``a9a.t``.

    Returns ``(X, y, X_test, y_test)`` with 123 features and labels mapped -1/+1 -> 0/1 (int64).
    """
    root = _check_dir(data_dir)
    subdirs = ["", "a9a", "libsvm"]
    train, tried = _find(root, subdirs, ["a9a"])
    test, _ = _find(root, subdirs, ["a9a.t"])
    if train is None or test is None:
        raise _missing(
            "A9A", ["a9a", "a9a.t"], tried,
            "Get both files from https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary.html#a9a.",
        )
    X, y = load_libsvm(train, n_features=123, sparse=sparse)
    Xt, yt = load_libsvm(test, n_features=123, sparse=sparse)
    return X, (y > 0).long(), Xt, (yt > 0).long()


# --------------------------------------------------------------------------- #
# FEMNIST (LEAF JSON)
# --------------------------------------------------------------------------- #


def _read_leaf(files: Sequence[str], writer_ids: dict):
    xs, ys, ws = [], [], []
    for path in files:
        with _open(path) as f:
            blob = json.load(f)
        try:
            users, user_data = blob["users"], blob["user_data"]
        except KeyError:
            raise ValueError(f"{path}: a LEAF file needs 'users' and 'user_data'") from None
        for u in users:
            d = user_data[u]
            x = np.asarray(d["x"], dtype=np.float32)
            y = np.asarray(d["y"], dtype=np.int64)
            if x.ndim != 2 or x.shape[0] != y.shape[0]:
                raise ValueError(f"{path}: writer {u}: x of shape {x.shape} vs {y.shape[0]} labels")
            xs.append(x)
            ys.append(y)
            ws.append(np.full(y.shape[0], writer_ids.setdefault(u, len(writer_ids)), dtype=np.int64))
    if not xs:
        return None
    X = np.concatenate(xs)
    side = int(round(np.sqrt(X.shape[1])))
    if side * side != X.shape[1]:
        raise ValueError(f"FEMNIST images must be square, got {X.shape[1]} values per image")
    return (torch.from_numpy(X).reshape(-1, 1, side, side), torch.from_numpy(np.concatenate(ys)),
            torch.from_numpy(np.concatenate(ws)))


def load_femnist(data_dir):
    """FEMNIST in LEAF's JSON format (``{"users", "num_samples", "user_data": {u: {"x", "y"}}}``).

    Looks for ``train/*.json`` and ``test/*.json`` under ``data_dir``, ``data_dir/femnist``,
    ``data_dir/femnist/data`` or ``data_dir/leaf/data/femnist/data``. Writer ids are kept: the
    result is ``(X, y, writers, X_test, y_test, writers_test, writer_names)`` where ``writers`` are
    int64 indices into ``writer_names`` (a writer has the same index in train and test).
    X is float32 ``(n, 1, 28, 28)`` as stored by LEAF (values in [0, 1]); 62 classes.
    """
    root = _check_dir(data_dir)
    subdirs = ["", "femnist", "femnist/data", "leaf/data/femnist/data", "FEMNIST"]
    tried = []
    for sub in subdirs:
        d = os.path.join(root, sub) if sub else root
        tried.append(d)
        tr = sorted(glob.glob(os.path.join(d, "train", "*.json")) + glob.glob(os.path.join(d, "train", "*.json.gz")))
        te = sorted(glob.glob(os.path.join(d, "test", "*.json")) + glob.glob(os.path.join(d, "test", "*.json.gz")))
        if tr:
            break
    else:
        raise _missing(
            "FEMNIST", ["train/*.json", "test/*.json"], tried,
            "Build it with LEAF (https://github.com/TalwalkarLab/leaf, data/femnist: "
            "./preprocess.sh -s niid --sf 0.05 -k 0 -t sample) on a machine with internet.",
        )
    ids: dict = {}
    X, y, w = _read_leaf(tr, ids)
    test = _read_leaf(te, ids) if te else None
    Xt, yt, wt = test if test is not None else (X[:0], y[:0], w[:0])
    names = [None] * len(ids)
    for u, i in ids.items():
        names[i] = u
    return X, y, w, Xt, yt, wt, names
