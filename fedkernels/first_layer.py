"""The batched executor's first-layer path, chosen by measurement where the choice keeps the bits
(issue 40).

A chain of Linear layers (python_algos.clients.chain) multiplies every client's first-layer matrix by
rows of one sample matrix ``X``, picked by an index ``idx [c, P]``, twice per step (the forward
product and the weight gradient). Three paths compute it on the CPU:

- ``"in_place"``: ``fedkernels.raw.linear_gathered*`` read the rows straight from ``X``;
- ``"gather"``: the rows are first copied into a contiguous block (``torch.index_select``) and the
  same kernels read the block. Each client is computed by one thread in one fixed order on the same
  values, so this gives the bits of ``"in_place"`` (tests/test_first_layer_choice.py);
- ``"gather_bmm"``: the copy, then ``torch.bmm`` (oneDNN / MKL). Another summation order: other
  bits (within rounding), never chosen unless asked for.

``choose(..., requested="auto")`` picks between the two bitwise-identical paths, fastest first: the
``FEDKERNELS_FIRST_LAYER`` environment variable (any of the three paths) decides if set; otherwise a
measurement on the caller's sample matrix at its shape (a few passes, tens of milliseconds), cached
per shape and thread count in the elementwise calibration's cache entry (CPU model, library version and build:
``fedkernels/_calibrate.py``). The seconds of ``"gather_bmm"`` are measured and kept too, so that
``backend_info()["first_layer"]`` shows whether asking for it would be faster.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import torch

from . import _calibrate
from ._backend import _C
from ._gathered import linear_gathered, linear_gathered_weight_grad

__all__ = ["PATHS", "IDENTICAL", "ENV", "Choice", "choose", "choices_made"]

PATHS = ("in_place", "gather", "gather_bmm")
IDENTICAL = ("in_place", "gather")  # the same bits: "auto" chooses among these only
ENV = "FEDKERNELS_FIRST_LAYER"
_ROUNDS = 5
# Multiply-adds of one timed pass (the forward and the weight gradient of up to `c` clients): the
# calibration stays well under a second for any first layer.
_PASS_MACS = 1 << 25  # 1 thread, Zen 5: 10 (MLP, o = 128) to 80 (o = 10) clients, 4-31 ms in all
_MAX_SHAPES = 64  # shapes kept in the cache file
_MARGIN = 0.05  # "gather" must beat "in_place" by this much (noise does not flip the choice)
_made: dict = {}  # shape key -> (path, source, seconds): this process's choices, for backend_info


class Choice(NamedTuple):
    path: str  # one of PATHS
    source: str  # "executor option", ENV, "calibrated", "calibration cache"
    seconds: dict  # seconds per path of one timed pass ({} when not measured here or cached)


def choose(X: torch.Tensor, outputs: int, samples: int, clients: int, requested: str = "auto") -> Choice:
    """The path for first-layer products of ``clients`` clients x ``samples`` rows of ``X`` ``[n, i]``
    into ``outputs`` outputs. ``requested``: a path of PATHS (returned as is) or ``"auto"``."""
    if requested != "auto":
        return Choice(requested, "executor option", {})
    forced = env_path()
    if forced is not None:
        return Choice(forced, ENV, {})
    key = shape_key(X, outputs, samples)
    if key in _made:
        return _made[key]
    cache_key, path = _calibrate.cache_key(_C), os.path.join(_calibrate.cache_dir(), _calibrate.CACHE_FILE)
    entry = _calibrate.read_entry(path, cache_key).get("first_layer")
    known = entry.get(key) if isinstance(entry, dict) else None
    if isinstance(known, dict) and known.get("path") in IDENTICAL:
        seconds = known.get("seconds") if isinstance(known.get("seconds"), dict) else {}
        _made[key] = Choice(known["path"], "calibration cache", seconds)
        return _made[key]
    seconds = measure(X, outputs, samples, clients)
    fastest = "gather" if seconds["gather"] * (1 + _MARGIN) < seconds["in_place"] else "in_place"
    _made[key] = Choice(fastest, "calibrated", seconds)
    table = dict(entry) if isinstance(entry, dict) else {}
    while len(table) >= _MAX_SHAPES:  # a bounded file, whatever shapes a machine's runs see
        table.pop(min(table))
    table[key] = {"path": fastest, "seconds": seconds}
    _calibrate.update_cache(path, cache_key, {"first_layer": table})
    return _made[key]


def env_path() -> str | None:
    """FEDKERNELS_FIRST_LAYER's path, None when unset, empty or "auto"; another value is refused."""
    v = os.environ.get(ENV, "").strip().lower()
    if v in ("", "auto"):
        return None
    if v not in PATHS:
        raise ValueError(f"{ENV}={os.environ[ENV]!r} is not a first-layer path: use one of auto, {', '.join(PATHS)}")
    return v


def shape_key(X: torch.Tensor, outputs: int, samples: int) -> str:
    """What the best path depends on: dtype, inputs, outputs, samples per client, the gathered kernels'
    CPU variant and threads (fedkernels.set_num_threads for the kernels, torch's for the copy and bmm)."""
    dtype = str(X.dtype).replace("torch.", "")
    threads = f"{_C.get_num_threads()}/{torch.get_num_threads()}"
    return f"{dtype} i={X.shape[1]} o={outputs} P={samples} {_C.cpu_gather_isa()} threads={threads}"


def measure(X: torch.Tensor, outputs: int, samples: int, clients: int) -> dict:
    """Seconds of one pass (forward product and weight gradient of the same clients) per path, the
    fastest of `_ROUNDS` rounds, paths interleaved within each round. Random rows of ``X`` itself,
    drawn from a generator of its own (the caller's random streams are not touched)."""
    n, i = X.shape
    c = max(2, min(clients, _PASS_MACS // max(1, samples * i * outputs)))
    gen = torch.Generator().manual_seed(0)
    # fresh rows for every timed pass: rows a previous pass left in the caches would flatter the next
    picks = iter(torch.randint(0, n, (_ROUNDS * 3, c, samples), generator=gen))
    W = torch.randn(c, outputs, i, generator=gen, dtype=X.dtype)
    D = torch.randn(c, outputs, samples, generator=gen, dtype=X.dtype)
    out, grad = torch.empty(c, outputs, samples, dtype=X.dtype), torch.empty(c, outputs, i, dtype=X.dtype)
    block = torch.empty(c * samples, i, dtype=X.dtype)
    local = torch.arange(c * samples).view(c, samples)

    def in_place(idx):
        linear_gathered(W, X, idx, out)
        linear_gathered_weight_grad(D, X, idx, grad)

    def gather(idx):
        torch.index_select(X, 0, idx.view(-1), out=block)
        linear_gathered(W, block, local, out)
        linear_gathered_weight_grad(D, block, local, grad)

    def gather_bmm(idx):
        torch.index_select(X, 0, idx.view(-1), out=block)
        rows = block.view(c, samples, i)
        torch.bmm(W, rows.transpose(1, 2), out=out)
        torch.bmm(D, rows, out=grad)

    runs = {"in_place": in_place, "gather": gather, "gather_bmm": gather_bmm}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(_ROUNDS):
        for name, run in runs.items():
            idx = next(picks)
            t0 = time.perf_counter()
            run(idx)
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def choices_made() -> dict:
    """This process's calibrated or cached choices, ``{shape key: {"path", "source", "seconds"}}``."""
    return {k: c._asdict() for k, c in _made.items()}
