"""Counting and timing of prox evaluations, through the kernel layer.

    with fedkernels.prox_stats() as stats:
        ...                       # any fedkernels calls
    stats.evaluations, stats.seconds

``evaluations`` counts one per model, i.e. per row of a [N, d] stack: a FedMiD round over N
clients with K local steps adds N*K + 1. ``seconds`` is host wall time inside the prox-bearing
kernels (for CUDA tensors that is launch time unless the caller synchronizes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time

_local = threading.local()


@dataclasses.dataclass
class ProxStats:
    evaluations: int = 0
    seconds: float = 0.0
    calls: int = 0


def active() -> ProxStats | None:
    return getattr(_local, "stats", None)


@contextlib.contextmanager
def prox_stats():
    """Collect ProxStats for every prox-bearing kernel call made in this thread."""
    previous = active()
    stats = ProxStats()
    _local.stats = stats
    try:
        yield stats
    finally:
        _local.stats = previous
        if previous is not None:  # nested collectors both see the calls
            previous.evaluations += stats.evaluations
            previous.seconds += stats.seconds
            previous.calls += stats.calls


def run_counted(rows: int, fn, *args) -> None:
    """Call a prox-bearing kernel, recording it if a collector is active."""
    stats = getattr(_local, "stats", None)
    if stats is None or rows == 0:  # rows == 0: an identity "prox" (h = 0) is not an evaluation
        fn(*args)
        return
    t0 = time.perf_counter()
    fn(*args)
    stats.seconds += time.perf_counter() - t0
    stats.evaluations += rows
    stats.calls += 1


@contextlib.contextmanager
def paused():
    """Record nothing inside (a composite prox that counts itself once, e.g. fk.PerParameter)."""
    previous = active()
    _local.stats = None
    try:
        yield
    finally:
        _local.stats = previous
