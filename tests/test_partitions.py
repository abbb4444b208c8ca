"""Client partitions: coverage, reproducibility, heterogeneity, minimum sizes, histograms."""

import warnings

import numpy as np
import pytest
import torch

from python_algos.data import (
    by_group,
    dirichlet,
    federate,
    iid,
    label_histograms,
    label_shards,
    load_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:Dirichlet partition:UserWarning")

LABELS = np.repeat(np.arange(10), 100)  # 1000 samples, 10 balanced classes
np.random.default_rng(0).shuffle(LABELS)


def assert_partition(parts, n):
    allidx = np.concatenate(parts)
    assert sorted(allidx.tolist()) == list(range(n)), "every sample exactly once"
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)


def test_iid():
    parts = iid(103, 10, seed=1)
    assert_partition(parts, 103)
    assert {len(p) for p in parts} == {10, 11}
    assert all(np.array_equal(a, b) for a, b in zip(parts, iid(103, 10, seed=1)))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, iid(103, 10, seed=2)))
    with pytest.raises(ValueError, match="cannot split"):
        iid(3, 5)


def skew(parts, labels=LABELS):
    """Mean over clients of the largest class share (1/C for iid, 1 for one class per client)."""
    H = label_histograms(labels, parts)
    return float((H.max(1) / H.sum(1)).mean())


def test_dirichlet_heterogeneity_grows_as_eta_shrinks():
    s = {eta: skew(dirichlet(LABELS, 10, eta, seed=0, min_size=5)) for eta in (100.0, 1.0, 0.1, 0.01)}
    assert s[100.0] < 0.2 < s[1.0] < s[0.1] < s[0.01]
    assert s[0.01] > 0.8
    for eta in (100.0, 0.01):
        assert_partition(dirichlet(LABELS, 10, eta, seed=0, min_size=5), 1000)


def test_dirichlet_reproducible_and_seeded():
    a, b = dirichlet(LABELS, 8, 0.3, seed=5), dirichlet(LABELS, 8, 0.3, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = dirichlet(LABELS, 8, 0.3, seed=6)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_dirichlet_min_size_guarantee_and_warning():
    caught = None
    for seed in range(10):  # find a draw that needed resampling (small eta, big minimum)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            parts = dirichlet(LABELS, 10, 1.0, seed=seed, min_size=60, balance=False)
        assert min(len(p) for p in parts) >= 60
        assert_partition(parts, 1000)
        if w:
            caught = str(w[0].message)
            break
    assert caught is not None and "resampled" in caught and ">= 60 samples" in caught
    with pytest.raises(ValueError, match="no draw in 3"):
        dirichlet(LABELS, 20, 0.001, seed=0, min_size=45, balance=False, max_tries=3)
    with pytest.raises(ValueError, match="exceeds"):
        dirichlet(LABELS, 10, 1.0, min_size=101)
    with pytest.raises(ValueError, match="eta must be > 0"):
        dirichlet(LABELS, 10, 0.0)


def test_dirichlet_balance_bounds_sizes():
    parts = dirichlet(LABELS, 10, 0.01, seed=0, min_size=1)
    sizes = [len(p) for p in parts]
    assert max(sizes) <= 2 * 1000 / 10 + 100  # a client stops receiving classes once it holds n/N


def test_label_shards_contiguous():
    parts = label_shards(LABELS, 10)
    assert_partition(parts, 1000)
    for i, p in enumerate(parts):  # sorted by label, cut into chunks: client i holds class i only
        assert set(LABELS[p].tolist()) == {i}
    uneven = label_shards(LABELS, 7)
    mx = [LABELS[p].max() for p in uneven]
    mn = [LABELS[p].min() for p in uneven]
    assert all(mx[i] <= mn[i + 1] for i in range(6))  # contiguous in label order
    two = label_shards(LABELS, 10, shards_per_client=2, seed=3)
    assert_partition(two, 1000)
    assert all(len(set(LABELS[p].tolist())) <= 2 for p in two)


def test_by_group_and_histograms():
    g = np.array([2, 0, 2, 1, 0, 2])
    parts = by_group(g)
    assert [p.tolist() for p in parts] == [[1, 4], [3], [0, 2, 5]]
    with pytest.raises(ValueError, match="3 natural clients"):
        by_group(g, num_clients=4)
    H = label_histograms(LABELS, iid(1000, 4), num_classes=10)
    assert H.shape == (4, 10) and H.sum() == 1000 and np.array_equal(H.sum(0), np.full(10, 100))


def test_federate():
    ds = load_dataset("image_like", n=500, num_classes=5)
    fed = federate(ds, "dirichlet", 5, eta=0.1, seed=0)
    assert len(fed.clients) == 5 and fed.histograms.shape == (5, 5)
    for (X, y), p, h in zip(fed.clients, fed.parts, fed.histograms):
        assert torch.equal(X, ds.X[torch.from_numpy(p)]) and np.array_equal(np.bincount(y.numpy(), minlength=5), h)
    reg = load_dataset("sparse_linear", n=100, dim=5, nnz=2)
    with pytest.raises(ValueError, match="needs class labels"):
        federate(reg, "dirichlet", 4)
    with pytest.raises(ValueError, match="needs writer"):
        federate(ds, "natural", 5)
    with pytest.raises(ValueError, match="unknown partition"):
        federate(ds, "random", 5)
    nat = federate(load_dataset("sparse_logistic", n=120, dim=5, nnz=2, num_groups=4), "natural", 4)
    assert sum(len(p) for p in nat.parts) == 96 and min(len(p) for p in nat.parts) > 15  # 80 % train, by group
