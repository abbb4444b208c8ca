"""Client data as a population: N clients whose data are built on demand (docs/population.md).

``simulate(clients=Population(10**6, make_client), ...)`` runs like a list of N clients, but client
i's data exist only while it is in use: ``make_client(i)`` builds them (an ``(X, y)`` pair, a
``Dataset`` or a ``DataLoader``, as for a list) when the executor first asks for client i, and a
small LRU cache keeps the current cohort's, so a round with partial participation builds only its
cohort, and a run touches at most rounds × cohort clients. ``make_client`` must be deterministic
(client i's rows depend on i alone, never on N or on the order of the calls): a population run then
equals the run on the materialised list ``[make_client(i) for i in range(N)]`` bit for bit.

What the start of a run reads: the model and loss probe (:mod:`.probe`) runs on the first
:data:`PROBE_CLIENTS` clients only, and decides the loss's kind once for every client from its type
and options (:func:`.probe.check_population`: a loss not a per-sample mean is refused under
minibatches before the run); a NaN or an infinity, and under minibatches a label equal to the default
``ignore_index=-100``, is refused when a client is first built (naming the client and row, as for a
list); the resume fingerprint (:meth:`Population.fingerprint`)
is ``(N, make_client's recipe, a hash of a few sampled clients' bits)``. It detects another N,
another ``make_client`` (by its recipe: a ``recipe`` attribute or argument, else the function's
module and name and a ``functools.partial``'s arguments) and other data at the sampled clients; it
cannot detect a change confined to clients it does not sample behind an unchanged recipe (edited
code under the same name): give ``recipe=`` a version string when the code behind it changes.

The executors: the sequential one reads clients on demand (a full participation round, or a
metric pass, streams every client through the cache, never holding them all); the batched one runs
its vectorized passes over each call's clients (:mod:`.cohort_batched`). Each client's minibatch
generator is created when first used (:class:`LazyGenerators`), so 10^6 clients do not cost 10^6
generator states (5 kB each).
"""

from __future__ import annotations

import collections
import functools
import hashlib
from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np
import torch

from .base import seeds
from .data import check_finite, client_data

__all__ = ["Population", "LazyClients", "LazyGenerators", "SparseLogistic", "PROBE_CLIENTS"]

PROBE_CLIENTS = 4  # clients 0..3 run through the model and the loss before the first round
FINGERPRINT_CLIENTS = 8  # clients whose bits the resume fingerprint hashes


def _recipe(make_client) -> str:
    """What identifies ``make_client`` across processes (its recipe, or its name and arguments)."""
    recipe = getattr(make_client, "recipe", None)
    if recipe is not None:
        return str(recipe)
    if isinstance(make_client, functools.partial):
        return f"partial({_recipe(make_client.func)}, {make_client.args!r}, {sorted(make_client.keywords.items())!r})"
    name = getattr(make_client, "__qualname__", type(make_client).__qualname__)
    return f"{getattr(make_client, '__module__', '?')}.{name}"


def _sums_finite(client) -> bool:
    """Whether an (X, y) pair's float tensors have finite sums (so no NaN or infinity: either makes the sum
    non-finite); False for anything else, which :func:`.data.check_finite` then reads (a sum that
    overflows is checked there too). One sum per tensor is several times cheaper than ``isfinite``."""
    if not (isinstance(client, (tuple, list)) and len(client) == 2):
        return False
    return all(not (torch.is_tensor(t) and t.is_floating_point()) or bool(torch.isfinite(t.sum())) for t in client)


class Population(Sequence):
    """N clients, client i built by ``make_client(i)`` when first asked for (module docstring).

    Args:
        n: N, the number of clients.
        make_client: ``make_client(i) -> (X, y) | Dataset | DataLoader``, deterministic in i.
        cache: clients kept built (least recently used dropped first); an executor raises it to the
            cohort size, so that a round's local steps do not rebuild its clients.
        recipe: what identifies ``make_client`` in the resume fingerprint (default: see :func:`_recipe`).

    ``builds`` counts the calls of ``make_client``."""

    def __init__(self, n: int, make_client: Callable, *, cache: int = 128, recipe: Optional[str] = None):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be an int >= 1 (the number of clients), got {n!r}")
        if not callable(make_client):
            raise TypeError(f"make_client must be callable (make_client(i) -> client i's data), got "
                            f"{type(make_client).__name__}")
        if isinstance(cache, bool) or not isinstance(cache, int) or cache < 1:
            raise ValueError(f"cache must be an int >= 1, got {cache!r}")
        self.n, self.make_client, self.cache = int(n), make_client, cache
        self.recipe = _recipe(make_client) if recipe is None else str(recipe)
        self.builds = 0
        self._kept: collections.OrderedDict = collections.OrderedDict()

    def __len__(self) -> int:
        return self.n

    def index(self, i) -> int:
        """``i`` as a client id in [0, N) (negative ids count from the end); IndexError outside."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"a Population is indexed by client id (an int), got {type(i).__name__}")
        j = int(i) + self.n if i < 0 else int(i)
        if not 0 <= j < self.n:
            raise IndexError(f"client {i} is not in the population of {self.n} clients")
        return j

    def build(self, i: int):
        """Client i's data, built now (not cached): ``make_client(i)``, refused naming the client and
        row when its in-memory tensors hold a NaN or an infinity."""
        i = self.index(i)
        self.builds += 1
        client = self.make_client(i)
        if not _sums_finite(client):  # the exact check names the row (a finite sum proves every value finite)
            check_finite([client], first_client=i)
        return client

    def __getitem__(self, i):
        i = self.index(i)
        if i in self._kept:
            self._kept.move_to_end(i)
            return self._kept[i]
        client = self._kept[i] = self.build(i)
        while len(self._kept) > self.cache:
            self._kept.popitem(last=False)
        return client

    def __iter__(self):
        return (self[i] for i in range(self.n))

    def reserve(self, k: int) -> None:
        """Keep at least ``k`` clients built (a cohort's)."""
        self.cache = max(self.cache, int(k))

    def sampled_ids(self, k: int = FINGERPRINT_CLIENTS) -> list:
        """The clients the fingerprint hashes: the first, the last and ``k - 2`` evenly spaced between."""
        return sorted({0, self.n - 1, *((j * self.n) // max(1, k - 1) for j in range(1, k - 1))})

    def fingerprint(self) -> dict:
        """The resume record of the clients (module docstring): ``{"population": N, "recipe": ...,
        "sampled": ids, "samples": their sample counts, "content": hash of their kind, shape and bits}``."""
        from ..runfolder.setup_record import fingerprint_clients  # the list's record, on the sampled clients

        ids = self.sampled_ids()
        record = fingerprint_clients([self[i] for i in ids])
        h = hashlib.blake2b(f"{self.n}|{self.recipe}|{record['content']}".encode(), digest_size=8)
        return {"population": self.n, "recipe": self.recipe, "sampled": ids, "samples": record["samples"],
                "content": h.hexdigest()}


class LazyClients(Sequence):
    """A population's clients as an executor reads them (``ClientData`` of the model's dtype and
    device), built on demand and kept in an LRU cache of ``population.cache`` clients."""

    def __init__(self, population: Population, dtype: torch.dtype, device):
        self.population, self.dtype, self.device = population, dtype, device
        self.guard: Optional[Callable] = None  # guard(i, client) on each client built (probe.PopulationCheck's)
        self._kept: collections.OrderedDict = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self.population)

    def __getitem__(self, i):
        c = self._kept.get(i)
        if c is not None:  # the hot path: every local step reads its cohort's clients
            self._kept.move_to_end(i)
            return c
        i = self.population.index(i)
        if i in self._kept:
            self._kept.move_to_end(i)
            return self._kept[i]
        raw = self.population.build(i)
        if self.guard is not None:
            self.guard(i, raw)
        try:
            c = client_data(raw, self.dtype, self.device)
        except (TypeError, ValueError) as e:
            raise type(e)(f"clients: client {i} (make_client({i})): {e}") from e
        self._kept[i] = c
        while len(self._kept) > self.population.cache:
            self._kept.popitem(last=False)
        return c

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def nbytes_estimate(self) -> int:
        """Bytes of the cache when full: the mean tensor bytes of the clients kept now × its size."""
        held = [sum(t.untyped_storage().nbytes() for t in (getattr(c, "X", None), getattr(c, "y", None))
                    if isinstance(t, torch.Tensor)) for c in self._kept.values()]
        return int(sum(held) / len(held) * min(self.population.cache, len(self))) if held else 0


class LazyGenerators(Sequence):
    """The minibatch generators of clients ``first_client ..``, each created when first read: the
    same seeds as :func:`.base.client_generators`, without N generator states up front (every
    executor's, so a checkpoint holds the generators of the clients that drew a minibatch, not N).
    ``touched_states()`` / ``set_touched_states()``: the created ones' states by *global* client index,
    so a checkpoint's are re-cut for any shard by their keys."""

    def __init__(self, seed: int, n: int, first_client: int = 0):
        self.n, self.first = int(n), int(first_client)
        self._seed, self._seeds = seed, None
        self._made: dict = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        g = self._made.get(i)
        if g is None:
            if not 0 <= i < self.n:  # IndexError also ends iteration over the sequence
                raise IndexError(f"client generator {i} of {self.n}")
            if self._seeds is None:  # 8 bytes per client, computed once
                self._seeds = np.array(seeds(self._seed, self.first + self.n)[self.first:], dtype=np.uint64)
            g = self._made[i] = torch.Generator().manual_seed(int(self._seeds[i]))
        return g

    def touched_states(self) -> dict:
        return {self.first + i: g.get_state() for i, g in self._made.items()}

    def set_touched_states(self, states: dict) -> None:
        """Restore :meth:`touched_states`; a list (one state per client, as checkpoints before run-folder
        format 3 held them) or a client outside this set is refused before anything is restored."""
        if not isinstance(states, dict):
            raise ValueError(f"the saved client generators are a {type(states).__name__}, not a dict by client "
                             f"index: the checkpoint was written by an older version (run-folder format 2 or "
                             f"earlier); start the run again")
        lo, hi = self.first, self.first + self.n
        if (out := [int(k) for k in states if not lo <= int(k) < hi]):
            raise ValueError(f"the saved client generators name clients {out[:5]} outside this set's {lo}..{hi - 1}")
        # the generators made before the restore stay the same objects (a kept pass holds them: CohortBatched's
        # probe, reused for the first block), back at their seeds' start unless the checkpoint has their state
        for i, g in self._made.items():
            g.manual_seed(int(self._seeds[i]))
        for k, st in states.items():
            self[int(k) - lo].set_state(st)


class SparseLogistic:
    """An a9a-sized synthetic logistic regression, client by client: ``make_client(i)`` for a
    :class:`Population`. Client i's rows come from a generator seeded by ``(seed, i)`` alone, so
    they never depend on N: ``samples`` ± 20 % samples (at least 2) of ``dim`` binary features, each
    set with probability ``density`` (a9a: 123 features, ~11 % set), labels in {0, 1} (shape
    ``[m, 1]``, for ``binary_cross_entropy_with_logits``) from a logistic model whose weights are
    drawn from ``seed`` alone and shifted per client by a ``heterogeneity``-scaled offset."""

    def __init__(self, seed: int = 0, dim: int = 123, samples: int = 50, density: float = 0.11,
                 heterogeneity: float = 0.5, dtype: torch.dtype = torch.float32):
        self.seed, self.dim, self.samples, self.density = int(seed), int(dim), int(samples), float(density)
        self.heterogeneity, self.dtype = float(heterogeneity), dtype
        self.w = np.random.default_rng([self.seed, 2**32]).standard_normal(self.dim) / np.sqrt(self.density * self.dim)
        self.recipe = (f"SparseLogistic(seed={self.seed}, dim={self.dim}, samples={self.samples}, "
                       f"density={self.density}, heterogeneity={self.heterogeneity}, dtype={dtype})")

    def __call__(self, i: int) -> tuple:
        rng = np.random.default_rng([self.seed, int(i)])
        m = max(2, int(round(self.samples * rng.uniform(0.8, 1.2))))
        X = (rng.random((m, self.dim)) < self.density).astype(np.float64)
        w = self.w + self.heterogeneity * rng.standard_normal(self.dim) / np.sqrt(self.dim)
        p = 1.0 / (1.0 + np.exp(-(X @ w)))
        y = (rng.random(m) < p).astype(np.float64)[:, None]
        return torch.from_numpy(X).to(self.dtype), torch.from_numpy(y).to(self.dtype)
