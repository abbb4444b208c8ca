"""erdos_renyi past topology.SPARSE_BUILD nodes: the dense build's graph (the same uniforms, redrawn until
connected from the same stream), built from its edges as a SparseTopology in O(edges) memory."""

import tracemalloc

import numpy as np
import pytest

from python_algos.algorithms import topology as topo


def _dense_draw(n: int, p: float, seed: int):
    """The dense build written out: all n(n - 1)/2 uniforms at once into the upper triangle, redrawn until
    every node is reached from node 0. Returns (adjacency, draws it took)."""
    rng = np.random.default_rng(seed)
    iu = np.triu_indices(n, k=1)
    for tries in range(1, 1001):
        A = np.zeros((n, n), dtype=bool)
        A[iu] = rng.random(len(iu[0])) < p
        A |= A.T
        reached = np.zeros(n, dtype=bool)
        reached[0] = True
        for _ in range(n):
            reached |= A[reached].any(axis=0)
        if reached.all():
            return A, tries
    raise AssertionError("no connected draw")


@pytest.mark.parametrize("n,p,seed", [(12, 0.25, 5), (30, None, 3), (23, 0.09, 0), (2, None, 0)])
def test_the_sparse_build_draws_the_dense_builds_graph(n, p, seed, monkeypatch):
    default = 1.0 if n <= 2 else 2 * np.log(n) / n
    want, tries = _dense_draw(n, default if p is None else p, seed)
    dense = topo.erdos_renyi(n, p, seed=seed)
    monkeypatch.setattr(topo, "SPARSE_BUILD", 1)
    monkeypatch.setattr(topo, "_DRAWS", 7)  # blocks cut rows of the triangle and draws
    sparse = topo.erdos_renyi(n, p, seed=seed)
    assert isinstance(sparse, topo.SparseTopology) and not isinstance(dense, topo.SparseTopology)
    assert np.array_equal(dense.adjacency, want) and np.array_equal(sparse.adjacency, want), tries
    np.testing.assert_allclose(sparse.W, dense.W, rtol=0, atol=1e-15)  # self-weights summed in another order


def test_a_graph_that_needs_redraws_redraws_from_the_same_stream(monkeypatch):
    """p below the connectivity threshold: the first draws are not connected, and the sparse build continues
    the stream exactly where the dense build's next draw starts."""
    want, tries = _dense_draw(40, 0.06, 1)
    assert tries > 1  # the case exercises the redraw
    monkeypatch.setattr(topo, "SPARSE_BUILD", 1)
    assert np.array_equal(topo.erdos_renyi(40, 0.06, seed=1).adjacency, want)
    with pytest.raises(ValueError, match="no connected G"):
        topo.erdos_renyi(40, 0.01, seed=1, max_tries=3)


def test_a_large_graph_is_built_in_memory_of_its_edges():
    """6,000 nodes: the dense build holds a 36 MB adjacency and 288 MB of triangle indices; this one its
    ~52,000 edges and one block of draws."""
    tracemalloc.start()
    try:
        g = topo.erdos_renyi(6000, seed=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(g, topo.SparseTopology) and g.num_nodes == 6000
    edges = (g.nnz - 6000) // 2
    assert 40_000 < edges < 65_000 and peak < 16 << 20, (edges, peak)
