"""Client executors: the :class:`ClientSet` interface and the backends that run client work.

An executor decides *how* the clients' local work (``gradients_``, the metric pass) runs; the
algorithms and their results do not depend on it, up to floating-point summation order.

===============  =============================================================================
executor         how ``gradients_`` runs the clients
===============  =============================================================================
``sequential``   :class:`SequentialClients`: one client after another on one module
``batched``      :class:`BatchedClients`: all clients' forward/backward passes in one vectorized
                 pass (``torch.func.vmap``), chunked by a memory budget
``distributed``  :class:`DistributedClients`: the clients sharded over torch.distributed ranks
                 (``torchrun``), each rank running its shard with an inner executor (one of the
                 above); never chosen by ``"auto"``
===============  =============================================================================

``simulate(..., executor=NAME)`` picks one by name; ``"auto"`` times the executors that support
the model on a sample of the clients and keeps the fastest (:func:`resolve_executor`).
"""

from __future__ import annotations

import time
from typing import Callable

import torch
from torch import nn

from .base import ClientSet, CommCounter, client_generators, client_tensors, seeds
from .batched import BatchedClients
from .distributed import DistributedClients
from .sequential import SequentialClients

__all__ = ["ClientSet", "CommCounter", "SequentialClients", "BatchedClients", "DistributedClients", "EXECUTORS",
           "resolve_executor",
           "client_generators", "client_tensors", "seeds"]

#: executor name -> ClientSet class (constructor ``(model, loss_fn, data, batch_size=, seed=, flat=, **options)``)
EXECUTORS: dict[str, type] = {
    "sequential": SequentialClients,
    "batched": BatchedClients,
    "distributed": DistributedClients,  # never picked by "auto": it needs a process group / torchrun
}

#: the order in which ``"auto"`` tries executors: the first that can run the model wins
AUTO_ORDER: tuple[str, ...] = ("batched", "sequential")


def resolve_executor(executor, model: nn.Module) -> Callable[..., ClientSet]:
    """A ClientSet factory for ``executor`` (a name in :data:`EXECUTORS`, or ``"auto"``).

    Raises ``ValueError`` naming the valid executors, or saying why the model cannot run on the one
    asked for (``cls.unsupported(model)``; the batched executor also probes the model when built).
    ``"auto"`` builds each executor of :data:`AUTO_ORDER` that can run the model on a sample of the
    clients, times one gradient call of each (after a warm-up call) and keeps the fastest: which
    one wins depends on the model, the number of clients and the machine (the batched executor has
    a fixed cost per vectorized pass that a few tiny clients do not repay). The calibration draws
    from its own generators and restores torch's global RNG, so the run's trajectory is unchanged;
    the timings are kept in ``clients.calibration``."""
    names = ", ".join(["auto", *EXECUTORS])
    if not isinstance(executor, str) or executor.lower() not in ("auto", *EXECUTORS):
        raise ValueError(f"executor must be one of {names}, got {executor!r}")
    name = executor.lower()
    if name != "auto":
        cls = EXECUTORS[name]
        why = cls.unsupported(model)
        if why:
            raise ValueError(f"executor {name!r} cannot run this model: {why}")
        return cls
    return _auto


_COMMON = ("batch_size", "seed", "flat", "first_client")
CALIBRATION_CLIENTS = 128  # clients timed per candidate by executor="auto"


def _auto(model, loss_fn, data, **kw) -> ClientSet:
    fallback = EXECUTORS[AUTO_ORDER[-1]]
    common = {k: v for k, v in kw.items() if k in _COMMON}
    if len(data) < 2:
        return fallback(model, loss_fn, data, **common)
    sample = list(data[:CALIBRATION_CLIENTS])
    timings: dict[str, float] = {}
    flat = kw.get("flat")
    saved = (flat.params, flat.grad) if flat is not None else None
    rng = torch.get_rng_state()
    try:
        for cand in AUTO_ORDER:
            cls = EXECUTORS[cand]
            if cls.unsupported(model):
                continue
            try:
                trial = cls(model, loss_fn, sample, **(kw if cls is not fallback else common))
            except ValueError as e:
                if f"executor {cand!r} cannot run this model" in str(e):
                    continue
                raise
            X = trial.flat.params.detach().expand(trial.rows, -1).clone()
            G = torch.empty_like(X)
            with torch.no_grad():
                trial.gradients_(X, G)  # warm-up (allocations, first-call dispatch)
                t0 = time.perf_counter()
                trial.gradients_(X, G)
                timings[cand] = time.perf_counter() - t0
    finally:
        torch.set_rng_state(rng)
        if saved is not None:
            flat.bind_(*saved)
    best = min(timings, key=timings.get) if timings else AUTO_ORDER[-1]
    cls = EXECUTORS[best]
    cs = cls(model, loss_fn, data, **(kw if cls is not fallback else common))
    cs.calibration = timings
    return cs
