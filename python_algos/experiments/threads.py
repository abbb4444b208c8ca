"""How many CPU threads a run uses (``--threads``; ``Config.threads``).

Policy when the user gives no number (``threads=None``):

* ``OMP_NUM_THREADS`` set in the environment: that number (the user already chose).
* a CUDA device: 1 (the CPU only launches kernels; extra threads only contend).
* a model with fewer than ``SMALL_MODEL`` (1,000,000) parameters: 1 thread. Each torch op of such
  a model runs for microseconds to a millisecond, too short for a second thread to pay off, and on
  a shared machine every multi-threaded region can stall for milliseconds waiting for a descheduled
  thread: the built-in demo measured 84 s on a loaded 2-core machine with 2 threads, 9.6 s idle
  with 2 threads, 6.5 s with 1 thread.
* otherwise every core this process may run on (torch's own default).

The choice applies to torch's intra-op pool and to fedkernels' OpenMP kernels, and is recorded in
``summary.json`` (``threads``). The library functions (``simulate``) never change thread settings.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

import fedkernels as fk

from .config import MAX_THREADS

__all__ = ["SMALL_MODEL", "choose_threads", "apply_threads"]

SMALL_MODEL = 1_000_000


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose_threads(requested: Optional[int], dim: int, device: torch.device) -> int:
    """The number of threads for a run of a ``dim``-parameter model on ``device`` (see the module
    docstring); ``requested`` wins when given."""
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or not 1 <= requested <= MAX_THREADS:
            # the bound of Config.threads (its reason: config.MAX_THREADS), for a caller from Python
            raise ValueError(f"--threads must be an int >= 1 and <= {MAX_THREADS}, got {requested!r}")
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    if torch.device(device).type == "cuda" or dim < SMALL_MODEL:
        return 1
    return _cores()


def apply_threads(requested: Optional[int], dim: int, device) -> int:
    """Set torch's and fedkernels' thread counts by :func:`choose_threads`; returns the number."""
    n = choose_threads(requested, dim, device)
    torch.set_num_threads(n)
    fk.set_num_threads(n)
    return n
