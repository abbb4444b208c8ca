"""The real data sets shipped inside the package (nothing is downloaded), checked against their
SHA-256 on every load. Origin and licence: the repository's NOTICE file and docs/experiments.md.

``a9a``        LIBSVM a9a (UCI Adult, CC BY 4.0): 32,561 × 123 binary features, labels ±1 -> {0, 1};
               the training split only (the test split is held out of it by ``test_fraction``)
``tcga_brca``  Fed-TCGA-BRCA (TCGA open-access clinical data, split by FLamby, MIT): 1,088 patients,
               39 clinical features, survival target (event, time), 6 natural centres (regions), the
               fixed train/test split
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import os

import torch

from .loaders import load_libsvm

__all__ = ["BUNDLED", "bundled_path", "load_a9a_bundled", "load_tcga_brca"]

BUNDLED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bundled")
# the SHA-256 of each file's content (of the unpacked text for a .gz file)
BUNDLED = {
    "a9a.gz": "76b604b2c3f738783537bd3b32893eae66af54b8a41aee534fac1ecea45c1535",
    "tcga_brca/brca.csv": "07cb53423f7d579d33cfdbf2cba57b2aee75318b85866c68ce39a75b1f1ba020",
    "tcga_brca/train_test_split.csv": "1249c6543a4060ff0fdaf8510fc37017755836db6c9fc5e6af96057c36510990",
}
TCGA_CENTRES = ("Northeast", "South", "West", "Midwest", "Europe", "Canada")  # the centre index c of train_c/test_c


def bundled_path(name: str) -> str:
    """The installed path of bundled file ``name`` (a key of :data:`BUNDLED`)."""
    return os.path.join(BUNDLED_DIR, *name.split("/"))


def _verified_text(name: str) -> bytes:
    """The file's content (unpacked), after checking its SHA-256: a damaged copy is refused, naming it."""
    path = bundled_path(name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"the package's data file {path} is missing: reinstall fedkernels")
    with (gzip.open(path, "rb") if name.endswith(".gz") else open(path, "rb")) as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != BUNDLED[name]:
        raise ValueError(f"the package's data file {path} is damaged (SHA-256 {digest}, expected {BUNDLED[name]}): "
                         f"reinstall fedkernels")
    return data


def load_a9a_bundled():
    """``(X [32561, 123] float32, y int64 in {0, 1})`` from the bundled a9a."""
    _verified_text("a9a.gz")
    X, y = load_libsvm(bundled_path("a9a.gz"), n_features=123)
    return X, (y > 0).long()


def load_tcga_brca():
    """``(X, y, X_test, y_test, centres, centres_test, features)``: float32 features (39 columns, as in
    the file), targets ``[n, 2]`` float32 with columns (event: 1 observed / 0 censored, time in days),
    int64 centre indices 0..5 (:data:`TCGA_CENTRES`), the fixed split of ``train_test_split.csv``."""
    rows = list(csv.reader(io.StringIO(_verified_text("tcga_brca/brca.csv").decode())))
    split = {pid: fold for pid, _, fold in list(csv.reader(io.StringIO(
        _verified_text("tcga_brca/train_test_split.csv").decode())))[1:]}
    header, body = rows[0], [r for r in rows[1:] if r[0] in split]  # 1,088 of the file's 1,096 are split
    if header[-2:] != ["E", "T"] or len(header) != 42:
        raise ValueError(f"{bundled_path('tcga_brca/brca.csv')}: unexpected columns {header[:2]} … {header[-2:]}")
    parts = {"train": [], "test": []}
    for r in body:
        kind, centre = split[r[0]].split("_")
        parts[kind].append(([float(v) for v in r[1:-2]], [float(r[-2]), float(r[-1])], int(centre)))

    def tensors(items):
        return (torch.tensor([i[0] for i in items], dtype=torch.float32),
                torch.tensor([i[1] for i in items], dtype=torch.float32),
                torch.tensor([i[2] for i in items], dtype=torch.int64))

    (X, y, c), (Xt, yt, ct) = tensors(parts["train"]), tensors(parts["test"])
    return X, y, Xt, yt, c, ct, header[1:-2]
