"""The batched executor's first-layer path, chosen by measurement where the choice keeps the bits
(issue 40).

A chain of Linear layers (python_algos.clients.chain) multiplies every client's first-layer matrix by
rows of one sample matrix ``X``, picked by an index ``idx [c, P]``, twice per step (the forward
product and the weight gradient). Four paths compute it on the CPU:

- ``"in_place"``: ``fedkernels.raw.linear_gathered*`` read the rows straight from ``X``;
- ``"gather"``: the rows are first copied into a contiguous block (``torch.index_select``) and the
  same kernels read the block. Each client is computed by one thread in one fixed order on the same
  values, so this gives the bits of ``"in_place"`` (tests/test_first_layer_choice.py);
- ``"gather_bmm"``: the copy, then ``torch.bmm`` (oneDNN / MKL). Another summation order: other
  bits (within rounding), never chosen unless asked for;
- ``"bf16"``: lower precision, only when asked for: the rows copied from a bfloat16 copy of ``X``, the
  matrices they meet (the weights, the loss's gradient) rounded to bfloat16, ``torch.bmm`` in bfloat16
  (oneDNN: AMX on Intel Sapphire Rapids, avx512_bf16 on AMD Zen 4/5), which sums in float32 and rounds
  each result to bfloat16 once, widened into the run's float32 (:func:`bmm_bf16`). Inputs and results
  carry bfloat16's 8-bit significand: relative errors up to 2^-8 per rounding, not the float32 path's
  bits; refused in a float64 run.

``choose(..., requested="auto")`` picks between the two bitwise-identical paths, fastest first: the
``FEDKERNELS_FIRST_LAYER`` environment variable (any path, or ``"auto_bf16"``) decides if set; otherwise a
measurement on the caller's sample matrix at its shape (a few passes, tens of milliseconds), cached
per shape and thread count in the elementwise calibration's entry (CPU model, library version and build:
``fedkernels/_calibrate.py``). The seconds of ``"gather_bmm"`` are measured and kept too, so that
``backend_info()["first_layer"]`` shows whether asking for it would be faster. ``requested="auto_bf16"``
(the user allows lower precision) also times ``"bf16"`` in the same passes and takes it when it is
faster than the faster identical path (by the same margin); the cached seconds serve both requests.
"""

from __future__ import annotations

import os
import time
from typing import Callable, NamedTuple, Optional

import torch

from . import _calibrate
from ._backend import _C
from ._gathered import linear_gathered, linear_gathered_weight_grad

__all__ = ["PATHS", "IDENTICAL", "LOWER_PRECISION", "AUTO_BF16", "REQUESTS", "ENV", "Choice", "choose",
           "check_precision", "bmm_bf16", "choices_made"]

PATHS = ("in_place", "gather", "gather_bmm", "bf16")
IDENTICAL = ("in_place", "gather")  # the same bits: "auto" chooses among these only
LOWER_PRECISION = ("bf16",)  # bfloat16 products: asked for by name, or allowed by AUTO_BF16
AUTO_BF16 = "auto_bf16"  # "auto", and "bf16" too where it is faster: the user allows lower precision
REQUESTS = ("auto", AUTO_BF16, *PATHS)
ENV = "FEDKERNELS_FIRST_LAYER"
_ROUNDS = 5
# Multiply-adds of one timed pass (the forward and the weight gradient of up to `c` clients): the
# calibration stays well under a second for any first layer.
_PASS_MACS = 1 << 25  # 1 thread, Zen 5: 10 (MLP, o = 128) to 80 (o = 10) clients, 4-31 ms in all
_MAX_SHAPES = 64  # shapes kept in the cache file
_MARGIN = 0.05  # a path must beat the one it replaces by this much (noise does not flip the choice)
_made: dict = {}  # shape key (+ " auto_bf16") -> Choice: this process's choices, for backend_info


class Choice(NamedTuple):
    path: str  # one of PATHS
    source: str  # "executor option", ENV, "calibrated", "calibration cache" (+ ", auto_bf16")
    seconds: dict  # seconds per path of one timed pass ({} when not measured here or cached)


def choose(X: torch.Tensor, outputs: int, samples: int, clients: int, requested: str = "auto",
           bf16_rows: Optional[Callable[[], torch.Tensor]] = None) -> Choice:
    """The path for first-layer products of ``clients`` clients x ``samples`` rows of ``X`` ``[n, i]``
    into ``outputs`` outputs. ``requested``: one of REQUESTS; a path is returned as is. ``bf16_rows``:
    ``X`` in bfloat16, made on demand (the executor's own copy; default ``X.to(torch.bfloat16)``), for
    timing ``"bf16"`` under ``"auto_bf16"``."""
    who = "executor option"
    if requested == "auto" and env_path() is not None:
        requested, who = env_path(), ENV
    check_precision(requested, X.dtype, who)
    if requested not in ("auto", AUTO_BF16):
        return Choice(requested, who, {})
    lowp = requested == AUTO_BF16
    key = shape_key(X, outputs, samples)
    memo = f"{key} {AUTO_BF16}" if lowp else key
    if memo in _made:
        return _made[memo]
    cache_key, path = _calibrate.cache_key(_C), os.path.join(_calibrate.cache_dir(), _calibrate.CACHE_FILE)
    entry = _calibrate.read_entry(path, cache_key).get("first_layer")
    known = entry.get(key) if isinstance(entry, dict) else None
    seconds = None  # the cached seconds, {} where only the path was kept
    if isinstance(known, dict) and known.get("path") in IDENTICAL:
        seconds = known["seconds"] if isinstance(known.get("seconds"), dict) else {}
    if seconds is not None and (not lowp or _timed(seconds, "bf16", known["path"])):
        fastest, source = known["path"], "calibration cache"
    else:  # not cached, or "bf16" or the cached path's seconds missing: measure every path here
        rows = (bf16_rows or (lambda: X.to(torch.bfloat16)))() if lowp else None
        seconds = measure(X, outputs, samples, clients, rows)
        fastest = "gather" if seconds["gather"] * (1 + _MARGIN) < seconds["in_place"] else "in_place"
        source = "calibrated"
        table = dict(entry) if isinstance(entry, dict) else {}
        while key not in table and len(table) >= _MAX_SHAPES:  # a bounded file, whatever shapes a machine's runs see
            table.pop(min(table))
        table[key] = {"path": fastest, "seconds": seconds}
        _calibrate.update_cache(path, cache_key, {"first_layer": table})
    if lowp:
        fastest = "bf16" if seconds["bf16"] * (1 + _MARGIN) < seconds[fastest] else fastest
        source += f", {AUTO_BF16}" + ("" if who != ENV else f" from {ENV}")
    _made[memo] = Choice(fastest, source, seconds)
    return _made[memo]


def _timed(seconds: dict, *paths: str) -> bool:
    """Whether ``seconds`` holds a time for each of ``paths`` (a cache written by hand may not)."""
    return all(isinstance(seconds.get(p), (int, float)) and not isinstance(seconds.get(p), bool) for p in paths)


def check_precision(requested: str, dtype: torch.dtype, who: str = "executor option") -> None:
    """Refuses a lower-precision request (``"bf16"``, ``"auto_bf16"``) outside a float32 run: a
    float64 run asks for float64's precision, which bfloat16 products would throw away. ``who``:
    the executor option or ENV, named in the error with its fix."""
    if requested not in (AUTO_BF16, *LOWER_PRECISION) or dtype == torch.float32:
        return
    name, fix = ((f"{ENV}={requested!r}", f"unset {ENV} (or set it to auto)") if who == ENV else
                 (f"first_layer={requested!r}", "use first_layer='auto'"))
    raise ValueError(f"{name} computes the first layer in bfloat16, which only a float32 run allows; this run "
                     f"is {str(dtype).replace('torch.', '')}: {fix}, or run in float32")


def bmm_bf16(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor, A16: Optional[torch.Tensor] = None,
             out16: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``out <- A @ B`` (batched, ``[c, m, k] x [c, k, n]``) in bfloat16: ``A`` (the run's float32)
    rounded to bfloat16, ``B`` already bfloat16 (the samples' copy), ``torch.bmm`` summing in float32
    and rounding each result to bfloat16 (the CPU's bfloat16 bmm has no float32 output), widened into
    ``out``. ``A16``, ``out16``: bfloat16 buffers of ``A``'s and ``out``'s shapes for the copies (new
    ones by default; the executor passes 64-byte-aligned ones, so a client's bits do not depend on its
    position in a pass). Returns ``out``."""
    A16 = A.to(torch.bfloat16) if A16 is None else A16.copy_(A)
    out16 = torch.empty(out.shape, dtype=torch.bfloat16, device=out.device) if out16 is None else out16
    return out.copy_(torch.bmm(A16, B, out=out16))


def env_path() -> str | None:
    """FEDKERNELS_FIRST_LAYER's path (or "auto_bf16"), None when unset, empty or "auto"; another value
    is refused."""
    v = os.environ.get(ENV, "").strip().lower()
    if v in ("", "auto"):
        return None
    if v not in REQUESTS:
        raise ValueError(f"{ENV}={os.environ[ENV]!r} is not a first-layer path: use one of {', '.join(REQUESTS)}")
    return v


def shape_key(X: torch.Tensor, outputs: int, samples: int) -> str:
    """What the best path depends on: dtype, inputs, outputs, samples per client, the gathered kernels'
    CPU variant and threads (fedkernels.set_num_threads for the kernels, torch's for the copy and bmm)."""
    dtype = str(X.dtype).replace("torch.", "")
    threads = f"{_C.get_num_threads()}/{torch.get_num_threads()}"
    return f"{dtype} i={X.shape[1]} o={outputs} P={samples} {_C.cpu_gather_isa()} threads={threads}"


def measure(X: torch.Tensor, outputs: int, samples: int, clients: int, X16: Optional[torch.Tensor] = None) -> dict:
    """Seconds of one pass (forward product and weight gradient of the same clients) per path, the
    fastest of `_ROUNDS` rounds, paths interleaved within each round; ``"bf16"`` only with ``X16``
    (``X`` in bfloat16). Random rows of ``X`` itself, drawn from a generator of its own (the
    caller's random streams are not touched)."""
    n, i = X.shape
    c = max(2, min(clients, _PASS_MACS // max(1, samples * i * outputs)))
    gen = torch.Generator().manual_seed(0)
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

    def bf16(idx):
        torch.index_select(X16, 0, idx.view(-1), out=block16)
        rows = block16.view(c, samples, i)
        bmm_bf16(W, rows.transpose(1, 2), out)
        bmm_bf16(D, rows, grad)

    runs = {"in_place": in_place, "gather": gather, "gather_bmm": gather_bmm}
    if X16 is not None:
        block16, runs["bf16"] = torch.empty(c * samples, i, dtype=torch.bfloat16), bf16
    # fresh rows for every timed pass: rows a previous pass left in the caches would flatter the next
    picks = iter(torch.randint(0, n, (_ROUNDS * len(runs), c, samples), generator=gen))
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
