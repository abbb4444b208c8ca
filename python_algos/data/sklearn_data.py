"""scikit-learn's bundled data sets (shipped inside the sklearn package: nothing is downloaded).

    ds = load_sklearn("digits", seed=0, test_fraction=0.2)      # CLI: --dataset sklearn:digits

==============  ======  ========  =======  ==========  =========================================
name            n       features  classes  task        partitions
==============  ======  ========  =======  ==========  =========================================
digits          1797    64        10       multiclass  iid, dirichlet, shards
breast_cancer   569     30        2        binary      iid, dirichlet, shards
wine            178     13        3        multiclass  iid, dirichlet, shards
iris            150     4         3        multiclass  iid, dirichlet, shards
diabetes        442     10        –        regression  iid (no labels to skew by, no groups)
==============  ======  ========  =======  ==========  =========================================

Features are standardized with the training split's mean and standard deviation (``standardize=
False`` keeps sklearn's values); so is the diabetes target (raw values 25–346 would put the MSE in
the thousands and make every step size problem-specific). None of them has writer / client ids,
so ``writers`` and ``natural`` do not apply.
"""

from __future__ import annotations

import numpy as np
import torch

from .split import train_test_indices  # the same seeded train/test split as the built-in generators

__all__ = ["SKLEARN", "SKLEARN_TASKS", "load_sklearn"]

# name -> (sklearn loader, task, classes)
SKLEARN_TASKS = {
    "digits": ("load_digits", "multiclass", 10),
    "breast_cancer": ("load_breast_cancer", "binary", 2),
    "wine": ("load_wine", "multiclass", 3),
    "iris": ("load_iris", "multiclass", 3),
    "diabetes": ("load_diabetes", "regression", 0),
}
SKLEARN = tuple(SKLEARN_TASKS)
PREFIX = "sklearn:"


def _sklearn_datasets():
    try:
        from sklearn import datasets
    except ImportError:
        raise ValueError("the sklearn:NAME data sets need scikit-learn, which is not installed here: "
                         "pip install scikit-learn (or pip install 'fedkernels[data]')") from None
    return datasets


def load_sklearn(name: str, seed: int = 0, test_fraction: float = 0.2, standardize: bool = True):
    """``(X, y, X_test, y_test, task, num_classes, source)`` of sklearn's bundled data set ``name``;
    the test split is a seeded random ``test_fraction`` of the samples."""
    if name not in SKLEARN_TASKS:
        raise ValueError(f"unknown scikit-learn data set {name!r}; valid: "
                         f"{', '.join(PREFIX + n for n in SKLEARN)}")
    if not isinstance(standardize, bool):
        raise ValueError(f"standardize must be true or false, got {standardize!r}")
    loader, task, classes = SKLEARN_TASKS[name]
    bunch = getattr(_sklearn_datasets(), loader)()
    X = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target)
    tr, te = train_test_indices(X.shape[0], test_fraction, seed)
    if standardize:
        mu, sd = X[tr].mean(0), X[tr].std(0)
        X = (X - mu) / np.where(sd > 0, sd, 1.0)  # constant pixels of digits keep value 0
        if task == "regression":
            y = (y - y[tr].mean()) / y[tr].std()
    Xt = torch.from_numpy(X.astype(np.float32))
    yt = torch.from_numpy(y.astype(np.float32 if task == "regression" else np.int64))
    tr_t, te_t = torch.from_numpy(tr), torch.from_numpy(te)
    source = (f"scikit-learn sklearn.datasets.{loader}() (bundled, {X.shape[0]} samples, {X.shape[1]} features"
              f"{', standardized' if standardize else ''})")
    test = (Xt[te_t], yt[te_t]) if len(te) else (None, None)
    return Xt[tr_t], yt[tr_t], test[0], test[1], task, classes, source
