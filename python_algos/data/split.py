"""The seeded train/test split every data set uses (built-in generators, files, scikit-learn's sets).

Its own module so that :mod:`.datasets` and :mod:`.sklearn_data` (which ``datasets`` imports) share it
without importing each other.
"""

from __future__ import annotations

import numpy as np

__all__ = ["train_test_indices"]


def train_test_indices(n: int, test_fraction: float, seed: int):
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    perm = np.random.default_rng([seed, 7]).permutation(n)
    k = int(round(n * test_fraction))
    return np.sort(perm[k:]), np.sort(perm[:k])
