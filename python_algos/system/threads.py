"""How many CPU threads a run uses: one policy for the command line (``--threads``; ``Config.threads``)
and :func:`~python_algos.simulate.simulate` (``threads="auto"``).

Policy when no number is given:

* ``OMP_NUM_THREADS`` set in the environment: that number (the user already chose).
* a CUDA device: 1 (the CPU only launches kernels; extra threads only contend).
* a model with fewer than ``SMALL_MODEL`` (1,000,000) parameters: 1 thread. Each torch op of such
  a model runs for microseconds to a millisecond, too short for a second thread to pay off, and on
  a shared machine every multi-threaded region can stall for milliseconds waiting for a descheduled
  thread: the built-in demo measured 84 s on a loaded 2-core machine with 2 threads, 9.6 s idle
  with 2 threads, 6.5 s with 1 thread.
* otherwise every core this process may run on (torch's own default).

The choice applies to torch's intra-op pool and to fedkernels' OpenMP kernels for the run only
(:func:`threads_for_run`: the caller's counts come back afterwards, also when the run raises), and
is recorded (``History.threads``; ``summary.json``'s ``threads``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional, Union

import torch

import fedkernels as fk

__all__ = ["SMALL_MODEL", "MAX_THREADS", "choose_threads", "threads_for_run"]

SMALL_MODEL = 1_000_000
# Every current machine has fewer than 1024 hardware threads, and OpenMP fails (20,000) or segfaults
# (100,000) creating thousands of them, so a larger count is a typo, refused before any thread starts.
MAX_THREADS = 1024


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose_threads(requested: Optional[int], dim: int, device, name: str = "threads") -> int:
    """The number of threads for a run of a ``dim``-parameter model on ``device`` (see the module
    docstring); ``requested`` wins when given. ``name``: the argument's name in an error."""
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or not 1 <= requested <= MAX_THREADS:
            raise ValueError(f"{name} must be an int >= 1 and <= {MAX_THREADS}, got {requested!r}")
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    if torch.device(device).type == "cuda" or dim < SMALL_MODEL:
        return 1
    return _cores()


@contextlib.contextmanager
def threads_for_run(threads: Union[str, int, None], params: torch.Tensor) -> Iterator[Optional[int]]:
    """Torch's and fedkernels' thread counts for a run of the flat model ``params``: ``"auto"`` by
    :func:`choose_threads`, an int that many, None the caller's as they are. Yields the count the run
    uses (None: not set here); the caller's counts are restored on the way out, however it is left."""
    if threads is None:
        yield None
        return
    if threads != "auto" and not isinstance(threads, int):
        raise ValueError(f"threads must be 'auto', an int >= 1 and <= {MAX_THREADS}, or None, got {threads!r}")
    n = choose_threads(None if threads == "auto" else threads, params.numel(), params.device)
    before = (torch.get_num_threads(), fk.get_num_threads())
    torch.set_num_threads(n)
    fk.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before[0])
        fk.set_num_threads(before[1])
