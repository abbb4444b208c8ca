"""Communication graphs and mixing matrices for decentralized algorithms (DEPOSITUM, docs/algorithms.md §4.5).

A :class:`Topology` is an undirected connected graph on N nodes (clients) together with a symmetric,
doubly-stochastic mixing matrix W with ``w_ij > 0`` only for ``j = i`` or an edge ``(i, j)``, and
``lambda_W = ||W - J||_2 < 1`` (J = (1/N) 11^T). One gossip step is the matrix product ``X <- W X`` over
an ``[N, d]`` client stack.

    from python_algos import topology
    topology.ring(8)                              # Metropolis–Hastings weights by default
    topology.erdos_renyi(10, p=0.3, seed=1)       # seeded, resampled until connected
    topology.torus(12)                            # 3 x 4 wrap-around grid
    topology.from_adjacency(A)                    # any connected undirected graph
    topology.from_matrix(W)                       # a user-given W, validated
    topology.build("ring", 8)                     # by name (what DEPOSITUM(topology="ring") does)

Default weights (the spec's suggestion, the seed gives none): Metropolis–Hastings,
``w_ij = 1 / (1 + max(deg_i, deg_j))`` on edges and ``w_ii = 1 - sum_{j != i} w_ij``. On the complete
graph these are J (every entry 1/N; ``complete`` sets them exactly), DEPOSITUM's server-equivalent
case (paper Remark 3).

A ring, star, torus or Erdős–Rényi graph of more than ``SPARSE_BUILD`` = 1024 nodes is a
:class:`SparseTopology`: built from its edges and kept as W's non-zeros (O(edges) memory; the dense build
takes an N x N array and an O(N^3) eigen-decomposition: 45 s at N = 4,000), with the same weights (a
star's centre, summed in another order, may differ in its last bits) and, for G(n, p), the same graph
(the same uniforms, drawn in blocks).

Validation (``Topology.__init__``, so every constructor) raises ``ValueError`` naming the violated
property: square and finite, symmetric, non-negative, rows (hence columns) summing to 1, the graph of
the off-diagonal non-zeros connected (the error lists the components), and ``lambda_W < 1`` (fails
e.g. for a bipartite graph with zero self-weights, where W has eigenvalue -1 and gossip oscillates).
"""

from __future__ import annotations

import math
from typing import Optional, Union

import numpy as np
import torch

__all__ = [
    "Topology",
    "SparseTopology",
    "NAMES",
    "build",
    "ring",
    "complete",
    "star",
    "torus",
    "erdos_renyi",
    "from_adjacency",
    "from_matrix",
    "metropolis_hastings",
]

NAMES = ("ring", "complete", "star", "torus", "erdos_renyi")
_ALIASES = {"er": "erdos_renyi", "erdos-renyi": "erdos_renyi", "full": "complete", "grid": "torus"}
_TOL = 1e-9  # absolute tolerance of the symmetry / stochasticity checks (W entries are in [0, 1])
SPARSE_DENSITY = 1 / 32  # "auto" layout: sparse COO product when nnz(W) < N^2 / 32 (measured crossover ~1/40 on CPU)
SPARSE_BUILD = 1024  # a ring, star, torus or G(n, p) of more nodes is built as its non-zeros (SparseTopology)
_DRAWS = 1 << 18  # G(n, p)'s uniforms drawn at a time (erdos_renyi: memory O(edges), not the n(n - 1)/2 draws)


class Topology:
    """A validated mixing matrix W (``numpy`` float64 ``[N, N]``) and its graph.

    Attributes:
        name: "ring", "complete", ..., or "custom".
        W: the mixing matrix (read-only float64 array).
        adjacency: bool ``[N, N]``, the edges (off-diagonal non-zeros of W), no self-loops.
        num_nodes: N.
        degrees: int ``[N]``, deg(i).
        lambda_w: ``||W - J||_2`` (< 1), the consensus contraction factor per gossip step.
    """

    def __init__(self, W, name: str = "custom"):
        W = np.array(W.detach().cpu().numpy() if isinstance(W, torch.Tensor) else W, dtype=np.float64, copy=True)
        _validate(W, name)
        W.setflags(write=False)
        self.W = W
        self.name = name
        self.num_nodes = W.shape[0]
        adj = W != 0
        np.fill_diagonal(adj, False)
        adj.setflags(write=False)
        self.adjacency = adj
        self.degrees = adj.sum(axis=1)
        self.lambda_w = _lambda_w(W)
        if not self.lambda_w < 1 - 1e-12:
            raise ValueError(
                f"topology {name!r}: ||W - J||_2 = {self.lambda_w:.6g} is not < 1, so gossip does not reach "
                f"consensus (W has an eigenvalue of modulus 1 besides the consensus direction, e.g. -1 for a "
                f"bipartite graph with zero self-weights); give every node a positive self-weight w_ii "
                f"(docs/algorithms.md §4.5: w_ij > 0 iff j = i or (i, j) is an edge)")

    @property
    def mean_degree(self) -> float:
        """Average number of neighbours: d-vectors a client sends (and receives) per gossip step."""
        return float(self.degrees.mean())

    @property
    def nnz(self) -> int:
        return int(np.count_nonzero(self.W))

    def matrix(self, dtype=torch.float64, device=None, layout: str = "auto") -> torch.Tensor:
        """W as a torch tensor for ``torch.mm(W, X)``: dense, or sparse COO (``layout="sparse"``, or
        ``"auto"`` when nnz(W) < N^2 / 32, where the sparse product is faster on CPU)."""
        if layout not in ("auto", "dense", "sparse"):
            raise ValueError(f"layout must be 'auto', 'dense' or 'sparse', got {layout!r}")
        dense = torch.tensor(self.W, dtype=dtype, device=device)
        n = self.num_nodes
        if layout == "sparse" or (layout == "auto" and self.nnz < SPARSE_DENSITY * n * n):
            return dense.to_sparse_coo().coalesce()
        return dense

    def spec(self):
        """A plain description (for hyper-parameter records and checkpoints): the name of a named
        topology built with default parameters is not enough to rebuild a custom one, so this is
        the name and W as nested lists."""
        return {"name": self.name, "W": self.W.tolist()}

    def __eq__(self, other):
        return isinstance(other, Topology) and self.name == other.name and np.array_equal(self.W, other.W)

    def __hash__(self):
        return hash((self.name, self.num_nodes, self.nnz))  # equal matrices: equal counts, whatever their class

    def __repr__(self):
        return (f"Topology({self.name!r}, N={self.num_nodes}, mean_degree={self.mean_degree:g}, "
                f"lambda_W={self.lambda_w:.4f})")


class SparseTopology(Topology):
    """A ring, star, torus or G(n, p) of more than :data:`SPARSE_BUILD` nodes: W kept as its non-zeros (``rows``,
    ``cols``, ``vals``, row-major), never as the N x N array (80 GB at N = 10^5), with Metropolis–Hastings
    weights, so a run of 10^5 gossiping clients holds O(N) of it. ``W`` and ``adjacency`` are built
    when asked for (N x N). Validated: every self-weight positive, rows summing to 1, connected; then
    ``lambda_W < 1`` holds (W symmetric, doubly stochastic, primitive), so ``lambda_w`` (a dense
    eigen-decomposition, O(N^3)) is computed only when read."""

    def __init__(self, n: int, i: np.ndarray, j: np.ndarray, name: str):  # noqa: D107 - edges i < j, distinct
        deg = np.bincount(i, minlength=n) + np.bincount(j, minlength=n)
        w = 1.0 / (1.0 + np.maximum(deg[i], deg[j]))
        diag = 1.0 - (np.bincount(i, weights=w, minlength=n) + np.bincount(j, weights=w, minlength=n))
        rows, cols = np.concatenate([i, j, np.arange(n)]), np.concatenate([j, i, np.arange(n)])
        order = np.lexsort((cols, rows))
        self.rows, self.cols, self.vals = rows[order], cols[order], np.concatenate([w, w, diag])[order]
        self.name, self.num_nodes, self.degrees = name, n, deg
        if not (diag > 0).all() or np.abs(np.bincount(self.rows, weights=self.vals, minlength=n) - 1).max() > _TOL:
            raise ValueError(f"topology {name!r}: the Metropolis–Hastings weights must give positive self-weights "
                             f"and rows summing to 1")
        if len(_components_of_edges(n, i, j)) > 1:
            raise ValueError(f"topology {name!r}: the graph must be connected")

    @property
    def W(self) -> np.ndarray:
        W = np.zeros((self.num_nodes, self.num_nodes))
        W[self.rows, self.cols] = self.vals
        W.setflags(write=False)
        return W

    @property
    def adjacency(self) -> np.ndarray:
        A = self.W != 0
        np.fill_diagonal(A, False)
        return A

    @property
    def lambda_w(self) -> float:
        return _lambda_w(self.W)

    @property
    def nnz(self) -> int:
        return int(np.count_nonzero(self.vals))

    def matrix(self, dtype=torch.float64, device=None, layout: str = "auto") -> torch.Tensor:
        if layout not in ("auto", "dense", "sparse"):
            raise ValueError(f"layout must be 'auto', 'dense' or 'sparse', got {layout!r}")
        n = self.num_nodes
        if layout == "dense" or (layout == "auto" and self.nnz >= SPARSE_DENSITY * n * n):
            return torch.tensor(self.W, dtype=dtype, device=device)
        at = torch.from_numpy(np.stack([self.rows, self.cols]))
        vals = torch.tensor(self.vals, dtype=dtype)
        nz = vals != 0  # as the dense W's to_sparse_coo drops a weight the dtype rounds to zero
        return torch.sparse_coo_tensor(at[:, nz], vals[nz], (n, n), is_coalesced=True,
                                       check_invariants=True).to(device)

    def __eq__(self, other):
        if isinstance(other, SparseTopology):
            return self.name == other.name and self.num_nodes == other.num_nodes and all(
                np.array_equal(getattr(self, k), getattr(other, k)) for k in ("rows", "cols", "vals"))
        return super().__eq__(other)

    __hash__ = Topology.__hash__

    def __repr__(self):
        return f"SparseTopology({self.name!r}, N={self.num_nodes}, mean_degree={self.mean_degree:g})"


def _components_of_edges(n: int, i: np.ndarray, j: np.ndarray) -> list:
    """The connected components of the graph of edges (i[k], j[k]): labels spread along the edges."""
    label = np.arange(n)
    while True:
        lo = np.minimum(label[i], label[j])
        new = label.copy()
        np.minimum.at(new, i, lo)
        np.minimum.at(new, j, lo)
        while not np.array_equal(new[new], new):  # each node to its label's label, to the end of the chain
            new = new[new]
        if np.array_equal(new, label):
            return [np.flatnonzero(label == c) for c in np.unique(label)]
        label = new


# --------------------------------------------------------------------------- validation


def _validate(W: np.ndarray, name: str) -> None:
    where = f"topology {name!r}"
    if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 1:
        raise ValueError(f"{where}: the mixing matrix must be square [N, N], got shape {W.shape}")
    if not np.isfinite(W).all():
        raise ValueError(f"{where}: the mixing matrix has non-finite entries")
    asym = float(np.abs(W - W.T).max())
    if asym > _TOL:
        i, j = np.unravel_index(np.abs(W - W.T).argmax(), W.shape)
        raise ValueError(f"{where}: W must be symmetric (undirected graph), but |W[{i},{j}] - W[{j},{i}]| = {asym:.3g}")
    if W.min() < -_TOL:
        i, j = np.unravel_index(W.argmin(), W.shape)
        raise ValueError(f"{where}: W must be non-negative, but W[{i},{j}] = {W[i, j]:.6g}")
    rows = W.sum(axis=1)
    bad = np.abs(rows - 1.0) > _TOL
    if bad.any():
        i = int(np.argmax(np.abs(rows - 1.0)))
        raise ValueError(f"{where}: W must be doubly stochastic, but row {i} sums to {rows[i]:.12g} "
                         f"({int(bad.sum())} of {W.shape[0]} rows do not sum to 1; symmetric W: columns too)")
    adj = W != 0
    np.fill_diagonal(adj, False)
    comps = _components(adj)
    if len(comps) > 1:
        shown = "; ".join(str(sorted(c)) if len(c) <= 8 else f"{len(c)} nodes starting {sorted(c)[:4]}"
                          for c in comps[:4])
        raise ValueError(f"{where}: the graph must be connected, but it has {len(comps)} components: {shown}"
                         f"{' ...' if len(comps) > 4 else ''}")


def _components(adj: np.ndarray) -> list:
    n = adj.shape[0]
    seen = np.zeros(n, dtype=bool)
    comps = []
    for s in range(n):
        if seen[s]:
            continue
        stack, comp = [s], []
        seen[s] = True
        while stack:
            u = stack.pop()
            comp.append(u)
            for v in np.flatnonzero(adj[u] & ~seen):
                seen[v] = True
                stack.append(int(v))
        comps.append(comp)
    return comps


def _lambda_w(W: np.ndarray) -> float:
    n = W.shape[0]
    if n == 1:
        return 0.0
    ev = np.linalg.eigvalsh((W + W.T) / 2 - np.full((n, n), 1.0 / n))
    return float(np.abs(ev).max())


# --------------------------------------------------------------------------- weights


def metropolis_hastings(adjacency) -> np.ndarray:
    """Metropolis–Hastings weights of an undirected graph: ``w_ij = 1/(1 + max(deg_i, deg_j))`` on
    edges, ``w_ii = 1 - sum_{j != i} w_ij`` (the library default, docs/algorithms.md §4.5)."""
    A = _adjacency(adjacency)
    deg = A.sum(axis=1)
    W = np.where(A, 1.0 / (1.0 + np.maximum(deg[:, None], deg[None, :])), 0.0)
    np.fill_diagonal(W, 0.0)
    np.fill_diagonal(W, 1.0 - W.sum(axis=1))
    return W


def _adjacency(A) -> np.ndarray:
    A = np.array(A.detach().cpu().numpy() if isinstance(A, torch.Tensor) else A)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"an adjacency matrix must be square [N, N], got shape {A.shape}")
    if A.dtype != bool:
        if not np.isin(A, (0, 1)).all():
            raise ValueError("an adjacency matrix must hold 0/1 (or bool) entries")
        A = A.astype(bool)
    if (A != A.T).any():
        raise ValueError("the adjacency matrix must be symmetric (undirected graph)")
    A = A.copy()
    np.fill_diagonal(A, False)
    return A


def _is_adjacency(M: np.ndarray) -> bool:
    """A zero-diagonal 0/1 (or bool) matrix is an adjacency matrix; anything else is taken as W
    (a valid W has positive self-weights, so the two readings never collide)."""
    if M.dtype == bool:
        return True
    return M.ndim == 2 and M.shape[0] == M.shape[1] and bool(np.isin(M, (0, 1)).all()) and not np.diag(M).any()


# --------------------------------------------------------------------------- named graphs


def _check_n(n, name, minimum=1) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < minimum:
        raise ValueError(f"{name}: the number of nodes must be an int >= {minimum}, got {n!r}")
    return int(n)


def from_adjacency(adjacency, weights: str = "metropolis", name: str = "custom") -> Topology:
    """A topology from a symmetric 0/1 adjacency matrix (self-loops ignored), with
    Metropolis–Hastings weights (``weights="metropolis"``, the only scheme so far)."""
    if weights != "metropolis":
        raise ValueError(f"weights must be 'metropolis', got {weights!r}")
    return Topology(metropolis_hastings(adjacency), name=name)


def from_matrix(W, name: str = "custom") -> Topology:
    """A topology from a user-given mixing matrix W (validated: symmetric, doubly stochastic,
    connected, ||W - J|| < 1)."""
    return Topology(W, name=name)


def ring(n: int) -> Topology:
    """Cycle 0-1-...-(n-1)-0 (n = 2: one edge; n = 1: a single node)."""
    n = _check_n(n, "ring")
    i = np.arange(n)
    return _from_edges(n, i, (i + 1) % n, "ring")


def complete(n: int) -> Topology:
    """All pairs connected, W = J: the Metropolis–Hastings weights of K_n (1/N everywhere), set
    to exactly 1/N (1 − (N−1)/N would round the diagonal)."""
    n = _check_n(n, "complete")
    return Topology(np.full((n, n), 1.0 / n), name="complete")


def star(n: int) -> Topology:
    """Node 0 connected to every other node."""
    n = _check_n(n, "star")
    return _from_edges(n, np.zeros(n - 1, dtype=np.int64), np.arange(1, n), "star")


def torus(n: int, rows: Optional[int] = None) -> Topology:
    """2-D torus (wrap-around grid) of ``rows x (n // rows)`` nodes; by default ``rows`` is the
    largest divisor of n not above sqrt(n). Node (r, c) is ``r * cols + c``; neighbours
    (r ± 1, c), (r, c ± 1) modulo the grid (a dimension of size 2 gives one neighbour along it)."""
    n = _check_n(n, "torus")
    if rows is None:
        rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1 or n % rows:
        raise ValueError(f"torus: rows must be a positive divisor of n = {n}, got {rows!r}")
    cols = n // rows
    r, c = np.divmod(np.arange(n), cols)
    down, right = ((r + 1) % rows) * cols + c, r * cols + (c + 1) % cols  # (r - 1, c), (r, c - 1): the same edges
    return _from_edges(n, np.concatenate([np.arange(n)] * 2), np.concatenate([down, right]), "torus")


def _from_edges(n: int, i: np.ndarray, j: np.ndarray, name: str) -> Topology:
    """The topology of the undirected edges (i[k], j[k]) (self-loops and repeats dropped), Metropolis–Hastings
    weights: through a dense adjacency up to :data:`SPARSE_BUILD` nodes, else as a :class:`SparseTopology`."""
    keep = i != j
    e = np.unique(np.stack([np.minimum(i, j), np.maximum(i, j)])[:, keep], axis=1)
    if n <= SPARSE_BUILD:
        A = np.zeros((n, n), dtype=bool)
        A[e[0], e[1]] = A[e[1], e[0]] = True
        return from_adjacency(A, name=name)
    return SparseTopology(n, e[0], e[1], name)


def erdos_renyi(n: int, p: Optional[float] = None, seed: int = 0, max_tries: int = 1000) -> Topology:
    """G(n, p) with every edge independently present with probability p, drawn from
    ``numpy.random.default_rng(seed)`` and redrawn (same stream) until connected, so a (n, p, seed)
    triple always gives the same graph (dense or, past :data:`SPARSE_BUILD` nodes, as its non-zeros).
    Default ``p = min(1, 2 ln(n) / n)`` (twice the connectivity threshold)."""
    n = _check_n(n, "erdos_renyi")
    if p is None:
        p = 1.0 if n <= 2 else min(1.0, 2.0 * math.log(n) / n)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
        raise ValueError(f"erdos_renyi: p must be in (0, 1], got {p!r}")
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        i, j = _random_edges(n, p, rng)
        if len(_components_of_edges(n, i, j)) == 1:
            return _from_edges(n, i, j, "erdos_renyi")
    raise ValueError(f"erdos_renyi: no connected G({n}, {p}) in {max_tries} draws (seed {seed}); increase p "
                     f"(the connectivity threshold is about ln(n)/n = {math.log(max(n, 2)) / n:.3g})")


def _random_edges(n: int, p: float, rng: np.random.Generator) -> tuple:
    """One draw of G(n, p): the pairs i < j, in the upper triangle's row-major order, whose uniform from
    ``rng`` is below p. The n(n - 1)/2 uniforms are drawn :data:`_DRAWS` at a time (the numbers one draw of
    them all gives: each is one 64-bit output of the stream), so memory is O(edges), not O(n^2)."""
    total = n * (n - 1) // 2
    rows = np.arange(n, dtype=np.int64)
    first = rows * (2 * n - rows - 1) // 2  # the flat index of (i, i + 1)
    k = [np.flatnonzero(rng.random(min(_DRAWS, total - a)) < p) + a for a in range(0, total, _DRAWS)]
    k = np.concatenate(k) if k else np.zeros(0, dtype=np.int64)
    i = np.searchsorted(first, k, side="right") - 1
    return i, k - first[i] + i + 1


_BUILDERS = {"ring": ring, "complete": complete, "star": star, "torus": torus, "erdos_renyi": erdos_renyi}

TopologyLike = Union[str, Topology, np.ndarray, torch.Tensor, list, tuple]


def canonical(spec: TopologyLike):
    """A hashable, comparable form of a topology argument: a known name (str), or a validated
    :class:`Topology` for a matrix (adjacency -> Metropolis–Hastings weights, else W)."""
    if isinstance(spec, str):
        key = _ALIASES.get(spec.lower(), spec.lower())
        if key not in _BUILDERS:
            raise ValueError(f"unknown topology {spec!r}; valid names: {', '.join(NAMES)} (or an adjacency "
                             f"matrix, a mixing matrix W, or a python_algos.algorithms.topology.Topology)")
        return key
    if isinstance(spec, Topology):
        return spec
    if isinstance(spec, (np.ndarray, torch.Tensor, list, tuple)):
        M = np.asarray(spec.detach().cpu().numpy() if isinstance(spec, torch.Tensor) else spec)
        if _is_adjacency(M):
            return from_adjacency(M)
        return from_matrix(M)
    raise TypeError(f"topology must be a name ({', '.join(NAMES)}), a Topology, an adjacency matrix or a "
                    f"mixing matrix W, got {type(spec).__name__}")


def build(spec: TopologyLike, n: int) -> Topology:
    """The topology on n nodes: a name is built with its default parameters; a Topology or
    matrix must have n nodes."""
    spec = canonical(spec)
    if isinstance(spec, str):
        return _BUILDERS[spec](n)
    if spec.num_nodes != n:
        raise ValueError(f"the topology has {spec.num_nodes} nodes but there are {n} clients")
    return spec
