"""Datasets by name, and their federated split.

    ds = load_dataset("mnist", data_dir="~/data")                 # files (see loaders.py)
    ds = load_dataset("sparse_logistic", dim=200, nnz=10)           # built-in generator
    fed = federate(ds, "dirichlet", num_clients=10, eta=0.1, seed=0)
    fed.clients      # [(X_i, y_i), ...] for python_algos.simulate
    fed.histograms   # [N, C] label counts per client

=================  =========  ==========  ========================================================
name               kind       task        notes
=================  =========  ==========  ========================================================
sparse_logistic    built-in   binary      known sparse ``x_true``; ``num_groups``/``shift``: natural
                                          feature-shift clients
sparse_linear      built-in   regression  same, linear targets (MSE)
synthetic          built-in   multiclass  FedProx synthetic(alpha, beta); natural clients (groups)
image_like         built-in   multiclass  small image task (``shape``, ``modes``, ``noise``)
mnist              files      multiclass  IDX files
fashion_mnist      files      multiclass  IDX files
cifar10            files      multiclass  python pickle batches
a9a                bundled    multiclass  LIBSVM a9a inside the package (its training split, ``test_fraction``
                   or files               held out), or ``a9a``/``a9a.t`` in ``data_dir``; 2 classes (a
                                          linear model has 248 parameters, as in FedCanon Fig. 1)
libsvm             files      auto        any LIBSVM file: ``file=`` (``test_file=`` optional)
femnist            files      multiclass  LEAF JSON; writer ids in ``groups``
tcga_brca          bundled    survival    Fed-TCGA-BRCA: 39 clinical features standardised with the pooled
                                          training statistics, (event, time) targets, its 6 centres in
                                          ``groups`` (partition ``natural``), its fixed test split
sklearn:NAME       sklearn    per NAME    scikit-learn's bundled digits, breast_cancer, wine, iris,
                                          diabetes (see :mod:`.sklearn_data`; needs scikit-learn)
folder:PATH        files      auto        your own data, one file per client (see :mod:`.folder`)
=================  =========  ==========  ========================================================

Tasks: ``multiclass`` (cross-entropy over ``num_classes`` logits), ``binary`` (one logit,
BCE-with-logits against {0, 1} labels), ``regression`` (one output, MSE), ``survival`` (one output, a
risk score; Cox partial likelihood against ``[n, 2]`` (event, time) targets; metric: Harrell's C).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
from typing import Annotated, Optional

import numpy as np
import torch

from . import bundled, folder, loaders, partitions, synthetic
from .options import COUNT, Opt, check_options, options_of
from .population_sources import FolderClients, RowClients, scan_folder
from .sklearn_data import PREFIX as SKLEARN_PREFIX
from .sklearn_data import SKLEARN, load_sklearn
from .split import train_test_indices
from .standardize import client_scales, scaled

__all__ = ["Dataset", "FederatedData", "DATASETS", "BUILTIN", "DATA_OPTIONS", "load_dataset", "federate",
           "federate_folder", "data_options", "check_data_options"]

BUILTIN = ("sparse_logistic", "sparse_linear", "synthetic", "image_like")
FILES = ("mnist", "fashion_mnist", "cifar10", "a9a", "libsvm", "femnist")
BUNDLED = ("tcga_brca",)  # inside the package (a9a is too, when no data_dir is given)
SKLEARN_DATASETS = tuple(SKLEARN_PREFIX + n for n in SKLEARN)  # sklearn:digits, ... (bundled with scikit-learn)
DATASETS = BUILTIN + FILES + BUNDLED + SKLEARN_DATASETS


@dataclasses.dataclass
class Dataset:
    name: str
    X: torch.Tensor  # training features
    y: torch.Tensor  # training labels (int64 classes) or targets (float32)
    X_test: Optional[torch.Tensor]
    y_test: Optional[torch.Tensor]
    task: str  # "multiclass" | "binary" | "regression"
    num_classes: int  # classes (multiclass), 2 (binary), 0 (regression)
    groups: Optional[torch.Tensor] = None  # [n] writer / generating-client id of each training sample
    x_true: Optional[torch.Tensor] = None  # ground-truth weights (sparse generators)
    source: str = ""  # where the data came from, for reports
    test_groups: Optional[torch.Tensor] = None  # [n_test] the client of each test row (folder:PATH), if any

    @property
    def in_shape(self) -> tuple:
        return tuple(self.X.shape[1:])

    @property
    def outputs(self) -> int:
        """Model outputs: num_classes for multiclass, 1 for binary / regression."""
        return self.num_classes if self.task == "multiclass" else 1


@dataclasses.dataclass
class FederatedData:
    dataset: Dataset
    parts: list  # one int64 index array (into dataset.X) per client
    clients: list  # [(X_i, y_i)]
    histograms: Optional[np.ndarray]  # [N, C] label counts (None for regression)
    partition: str


def _take(X, y, groups, tr, te):
    tr_t, te_t = torch.from_numpy(tr), torch.from_numpy(te)
    g = groups[tr_t] if groups is not None else None
    return X[tr_t], y[tr_t], (X[te_t] if len(te) else None), (y[te_t] if len(te) else None), g


def load_dataset(name: str, data_dir: Optional[str] = None, seed: int = 0, test_fraction: float = 0.2,
                 **opts) -> Dataset:
    """Load or generate dataset ``name`` (see the module table).

    Built-in generators take their keyword arguments in ``opts`` (e.g. ``n=``, ``dim=``, ``nnz=``
    for the sparse ones; ``alpha=``, ``beta=``, ``num_clients=`` for ``synthetic``; ``shape=``,
    ``modes=`` for ``image_like``) and hold out ``test_fraction`` of the samples for testing.
    File datasets read ``data_dir`` and use their own test split; a missing file raises
    :class:`~python_algos.data.loaders.DataNotFoundError` saying what is expected where.
    """
    return _checked(_load(name, data_dir, seed, test_fraction, opts))


def _load(name: str, data_dir: Optional[str], seed: int, test_fraction: float, opts: dict) -> Dataset:
    """:func:`load_dataset`'s data, before :func:`_checked`."""
    if name.startswith(folder.PREFIX):  # a path: its case is kept
        key = "folder"
    else:
        key = {"fmnist": "fashion_mnist"}.get(name.lower().replace("-", "_"), name.lower().replace("-", "_"))
        if key not in DATASETS and not key.startswith(SKLEARN_PREFIX):
            raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}, folder:PATH")
    declared = data_options(name)
    unknown = set(opts) - set(declared)
    missing = [k for k, o in declared.items() if o.default is inspect.Parameter.empty and k not in opts]
    if unknown or missing:
        raise ValueError(f"dataset {key!r} does not take option(s) {sorted(unknown)}; it takes: {', '.join(declared)}"
                         if unknown else f"dataset {key!r} needs {missing[0]}=VALUE (CLI: --data-opt "
                                         f"{missing[0]}=VALUE)")
    if key.startswith(SKLEARN_PREFIX):
        X, y, Xt, yt, task, classes, source = load_sklearn(key[len(SKLEARN_PREFIX):], seed=seed,
                                                           test_fraction=test_fraction, **opts)
        return Dataset(key, X, y, Xt, yt, task, classes, source=source)
    if key == "folder":
        X, y, Xt, yt, g, gt, task, classes, source = folder.load_folder(name[len(folder.PREFIX):], seed=seed,
                                                                         test_fraction=test_fraction, **opts)
        return Dataset("folder", X, y, Xt, yt, task, classes, groups=g, source=source, test_groups=gt)
    if key in ("sparse_logistic", "sparse_linear"):
        task = "logistic" if key == "sparse_logistic" else "linear"
        X, y, x_true, groups = synthetic.sparse_regression(task=task, seed=seed, **opts)
        X, y, Xt, yt, g = _take(X, y, groups, *train_test_indices(X.shape[0], test_fraction, seed))
        desc = ", ".join(f"{k}={v}" for k, v in opts.items())
        return Dataset(key, X, y, Xt, yt, "binary" if task == "logistic" else "regression",
                       2 if task == "logistic" else 0, groups=g, x_true=x_true,
                       source=f"built-in generator sparse_regression(task={task!r}{', ' + desc if desc else ''})")
    if key in ("synthetic", "image_like"):
        opts = {k: o.default for k, o in declared.items()} | opts
        made = (synthetic.fedprox_synthetic if key == "synthetic" else synthetic.image_like)(seed=seed, **opts)
        X, y, Xt, yt, g = _take(*made[:2], made[2] if key == "synthetic" else None,
                                *train_test_indices(made[0].shape[0], test_fraction, seed))
        return Dataset(key, X, y, Xt, yt, "multiclass", opts["num_classes"], groups=g,
                       source=f"built-in generator FedProx synthetic(alpha={opts['alpha']}, beta={opts['beta']})"
                       if key == "synthetic" else "built-in generator image_like")

    # files
    if key in ("mnist", "fashion_mnist"):
        X, y, Xt, yt = loaders.load_mnist(data_dir, kind=key)
        return Dataset(key, X, y, Xt, yt, "multiclass", 10, source=f"{key} IDX files in {data_dir}")
    if key == "cifar10":
        X, y, Xt, yt = loaders.load_cifar10(data_dir)
        return Dataset(key, X, y, Xt, yt, "multiclass", 10, source=f"CIFAR-10 batches in {data_dir}")
    if key == "tcga_brca":
        X, y, Xt, yt, centres, _, _ = bundled.load_tcga_brca()
        mean, std = X.mean(0), X.std(0)
        std[std == 0] = 1.0
        return Dataset(key, (X - mean) / std, y, (Xt - mean) / std, yt, "survival", 0, groups=centres,
                       source="Fed-TCGA-BRCA (bundled: 6 centres, the fixed train/test split)")
    if key == "a9a" and data_dir is None:  # the copy inside the package: its training split only
        X, y = bundled.load_a9a_bundled()
        X, y, Xt, yt, _ = _take(X, y, None, *train_test_indices(X.shape[0], test_fraction, seed))
        return Dataset(key, X, y, Xt, yt, "multiclass", 2, source="A9A (LIBSVM a9a, bundled: its training split, "
                                                                  f"{test_fraction:g} held out for testing)")
    if key == "a9a":
        X, y, Xt, yt = loaders.load_a9a(data_dir)
        return Dataset(key, X, y, Xt, yt, "multiclass", 2, source=f"A9A (LIBSVM) in {data_dir}")
    if key == "femnist":
        X, y, w, Xt, yt, _, names = loaders.load_femnist(data_dir)
        return Dataset(key, X, y, Xt if len(yt) else None, yt if len(yt) else None, "multiclass", 62, groups=w,
                       source=f"FEMNIST (LEAF JSON, {len(names)} writers) in {data_dir}")
    return _load_libsvm(**opts, data_dir=data_dir, seed=seed, test_fraction=test_fraction)


def _load_libsvm(file: str, test_file: Optional[str] = None,
                 n_features: Annotated[Optional[int], Opt(1, COUNT, "features")] = None, *,
                 data_dir: Optional[str], seed: int, test_fraction: float) -> Dataset:
    """``libsvm``: any LIBSVM file (``file=``, ``test_file=`` optional, relative to ``data_dir``);
    integral labels with few values are classes, other labels regression targets."""
    path, tp = (os.path.join(os.path.expanduser(data_dir), p) if data_dir is not None and p and not os.path.isabs(p)
                else p for p in (file, test_file))
    X, yraw = loaders.load_libsvm(path, n_features=n_features)
    Xt, ytraw = loaders.load_libsvm(tp, n_features=X.shape[1]) if tp else (None, None)
    ys, task, C = loaders.classes_or_targets([yraw.numpy()] + ([ytraw.numpy()] if tp else []))
    ys = [t.float() for t in ys] if task == "regression" else ys
    y, yt = ys[0], (ys[1] if tp else None)
    if Xt is None:
        X, y, Xt, yt, _ = _take(X, y, None, *train_test_indices(X.shape[0], test_fraction, seed))
    return Dataset("libsvm", X, y, Xt, yt, task, C, source=f"LIBSVM file {path}")


# data set -> (the generator / loader whose signature declares its --data-opt options, the parameters the
# name sets); the generators' own checks still refuse a rule between options (nnz <= dim)
MAKERS = {"sparse_logistic": (synthetic.sparse_regression, ("task",)), "synthetic": (synthetic.fedprox_synthetic, ()),
          "sparse_linear": (synthetic.sparse_regression, ("task",)), "image_like": (synthetic.image_like, ()),
          "libsvm": (_load_libsvm, ()), "sklearn": (load_sklearn, ("name", "test_fraction")),
          "folder": (folder.load_folder, ("path",))}
DATA_OPTIONS = {name: options_of(fn, hidden) for name, (fn, hidden) in MAKERS.items()}


def data_options(dataset: str) -> dict:
    """The :class:`~.options.Option` of each option data set ``dataset`` takes (none for the files but libsvm)."""
    key = dataset.lower().replace("-", "_")
    return DATA_OPTIONS.get(key.split(":")[0] if key.startswith((SKLEARN_PREFIX, folder.PREFIX)) else key, {})


def options_help() -> str:
    """``sparse_logistic, sparse_linear: n=1000, dim=100, ...; ...``: the options and their defaults (``--help``)."""
    by: dict = {}
    for name, declared in DATA_OPTIONS.items():
        text = ", ".join(f"{k}={'(required)' if o.default is inspect.Parameter.empty else json.dumps(o.default)}"
                         for k, o in declared.items())
        by.setdefault(text, []).append({"sklearn": "sklearn:NAME", "folder": "folder:PATH"}.get(name, name))
    return "; ".join(f"{', '.join(names)}: {text}" for text, names in by.items())


def check_data_options(dataset: str, opts: dict):
    """None, or (the option at fault, the rule it breaks) for the options ``opts`` of ``dataset``: each
    option's type and bounds, then the size of the data a generator would make (before it runs)."""
    if not isinstance(dataset, str) or not isinstance(opts, dict):
        return None  # Config.check names a bad dataset or table first
    declared, key = data_options(dataset), dataset.lower()
    o = {k: d.default for k, d in declared.items()} | opts
    size = {"sparse_logistic": ("dim", lambda: o["n"] * o["dim"]), "sparse_linear": ("dim", lambda: o["n"] * o["dim"]),
            "image_like": ("n", lambda: o["n"] * math.prod(o["shape"])),
            "synthetic": ("num_clients", lambda: o["num_clients"] * (o["samples"] or o["max_samples"]) * o["dim"])}
    bad = check_options(declared, dataset, opts)
    return bad or (check_options(declared, dataset, opts, (size[key][0], size[key][1]())) if key in size else None)


def _checked(ds: Dataset) -> Dataset:
    """A data set a federated run can train on: 2 or more training samples and, for classification,
    2 or more classes; refused naming where the data came from (before any run folder is written)."""
    n = int(ds.X.shape[0])
    if n < 2:
        raise ValueError(f"{ds.source}: {n} sample{'' if n == 1 else 's'} to train on; a run needs at least 2 "
                         f"(each client holds at least one, and the metrics average over them): give more data")
    if ds.task == "multiclass" and ds.num_classes < 2:
        raise ValueError(f"{ds.source}: its labels take {ds.num_classes} value(s); a classification needs at least 2 "
                         f"classes")
    return ds


def _standardized(ds: Dataset, parts: list, mode: str) -> Dataset:
    """``ds`` with each client's rows (``parts``), and each test row, scaled as ``mode`` says; the
    mode goes into ``source`` (the summary's ``dataset``)."""
    if mode == "none":  # said where the default would have scaled them
        return dataclasses.replace(ds, source=f"{ds.source}; not standardized") if ds.name == "folder" else ds
    scales = client_scales([ds.X[torch.from_numpy(p)] for p in parts], mode)
    if mode == "local" and ds.X_test is not None and ds.test_groups is None:
        raise ValueError(f"standardize: 'local' scales each client by its own statistics, and the test rows of "
                         f"{ds.name} belong to no client; use 'global' (or per-client test files, folder:PATH/test/)")
    X = ds.X.clone()
    for p, s in zip(parts, scales):
        X[torch.from_numpy(p)] = scaled(ds.X[torch.from_numpy(p)], *s)
    Xt = ds.X_test
    if Xt is not None and mode == "global":
        Xt = scaled(Xt, *scales[0])
    elif Xt is not None:
        Xt = Xt.clone()
        for i, s in enumerate(scales):
            Xt[ds.test_groups == i] = scaled(ds.X_test[ds.test_groups == i], *s)
    how = "pooled statistics from each client's count, sum and sum of squares" if mode == "global" else "per client"
    return dataclasses.replace(ds, X=X, X_test=Xt, source=f"{ds.source}; standardized {mode} ({how})")


def federate(ds: Dataset, partition: str = "iid", num_clients: int = 10, seed: int = 0, eta: float = 0.5,
             min_size: Optional[int] = None, shards_per_client: int = 1,
             standardize: Optional[str] = None, samples_per_client: Optional[int] = None) -> FederatedData:
    """Split the training data of ``ds`` over clients.

    ``partition``: ``iid``; ``dirichlet`` (label skew Dir(eta)); ``shards`` (label-sorted
    contiguous chunks, FedNMap); ``writers`` (Dir(eta) over ``ds.groups``, e.g. FEMNIST writers);
    ``natural`` (one client per group: FedProx synthetic's clients, FEMNIST writers, the sparse
    generators' feature-shift groups); ``cyclic`` (``samples_per_client`` rows each, default n // N
    or 1, clients overlapping once N·samples > n: 10^5 clients of A9A's rows), whose ``clients`` are a
    :class:`.population_sources.RowClients`, gathered when asked for (``parts`` one ``[N, s]`` array).
    ``min_size`` (Dirichlet) defaults to min(10, n / 2N).
    ``standardize`` (:mod:`.standardize`): ``global``, ``local`` or ``none``; None: ``global`` for
    ``folder:PATH`` data (a natural partition, the files), ``none`` for the others.
    """
    n = ds.X.shape[0]
    if ds.name == "folder" and partition != "natural":
        raise ValueError(f"the folder's {int(ds.groups.max()) + 1} files are its clients: use partition 'natural' "
                         f"(--partition natural -N {int(ds.groups.max()) + 1})")
    if partition == "iid":
        parts = partitions.iid(n, num_clients, seed)
    elif partition in ("dirichlet", "shards"):
        if ds.task in ("regression", "survival"):
            raise ValueError(f"partition {partition!r} needs class labels; dataset {ds.name!r} is a {ds.task} task "
                             f"(use partition 'iid'{' or natural' if ds.groups is not None else ''})")
        if partition == "dirichlet":
            ms = min(10, n // (2 * num_clients)) if min_size is None else min_size
            parts = partitions.dirichlet(ds.y, num_clients, eta, seed=seed, min_size=ms)
        else:
            parts = partitions.label_shards(ds.y, num_clients, shards_per_client, seed=seed)
    elif partition in ("writers", "natural"):
        if ds.groups is None:
            raise ValueError(f"partition {partition!r} needs writer / client ids; dataset {ds.name!r} has none "
                             f"(it works with femnist, synthetic, and the sparse generators with num_groups > 1)")
        if partition == "natural":
            parts = partitions.by_group(ds.groups, num_clients)
        else:
            ms = min(10, n // (2 * num_clients)) if min_size is None else min_size
            parts = partitions.dirichlet(ds.groups, num_clients, eta, seed=seed, min_size=ms)
    elif partition == "cyclic":
        if standardize == "local":
            raise ValueError("standardize: 'local' scales each client by its own rows' statistics, and partition "
                             "'cyclic' shares rows between clients (one copy of the data): use 'global' or 'none'")
        parts = partitions.cyclic(n, num_clients, samples_per_client or max(1, n // num_clients), seed)
    else:
        raise ValueError(f"unknown partition {partition!r}; valid: {', '.join(partitions.PARTITIONS)}")
    ds = _standardized(ds, parts, standardize or ("global" if ds.name == "folder" else "none"))
    clients = [(ds.X[torch.from_numpy(p)], ds.y[torch.from_numpy(p)]) for p in parts] if partition != "cyclic" \
        else RowClients(ds.X, ds.y, parts, name=ds.name)
    hist = None
    if ds.task in ("multiclass", "binary"):
        hist = partitions.label_histograms(ds.y, parts, max(ds.num_classes, int(ds.y.max()) + 1))
    return FederatedData(ds, parts, clients, hist, partition)


def federate_folder(path: str, standardize: Optional[str] = None, seed: int = 0, test_fraction: float = 0.2,
                    **opts) -> FederatedData:
    """``federate(load_dataset("folder:PATH"), "natural", N)``'s clients without their rows in memory:
    ``clients`` a :class:`.population_sources.FolderClients` that reads client i's file when it is built
    (a ``make_client`` for a Population), the same rows, labels and scaling. Before it returns, every
    file is read once, one at a time (:func:`.population_sources.scan_folder`: its checks, the labels,
    the pooled statistics, the test rows, which it holds); ``dataset.X`` is empty (its feature shape)."""
    raw = FolderClients(path, seed=seed, test_fraction=test_fraction, **opts)
    ys, X_test, yt, test_groups, scale = scan_folder(raw, standardize or "global")
    if X_test is None:
        raise ValueError(f"folder {path}: no test rows (a test fraction of 0 and no test/): a run on a population "
                         f"of files evaluates on test rows, and holds no client's training rows; give a test "
                         f"fraction > 0 or a test/ folder")
    labels, task, classes = loaders.classes_or_targets(ys + yt)
    values = np.unique(np.concatenate(ys + yt)) if task == "multiclass" else None
    src = FolderClients(path, seed=seed, test_fraction=test_fraction, classes=values, standardize=scale,
                        reference=raw.reference, **opts)
    hist = np.stack([np.bincount(t.numpy(), minlength=classes) for t in labels[:len(ys)]]) if values is not None \
        else None
    ds = Dataset("folder", torch.empty((0, *X_test.shape[1:]), dtype=X_test.dtype), labels[0][:0], X_test,
                 torch.cat(labels[len(ys):]), task, classes, test_groups=test_groups,
                 source=f"folder {path}: {len(src)} client files, each read when its client is sampled; standardized "
                        f"{standardize or 'global'}")
    return FederatedData(ds, [range(len(y)) for y in ys], src, hist, "natural")
