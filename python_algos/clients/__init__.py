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

``simulate(..., executor=NAME)`` picks one by name; ``"auto"`` picks the fastest executor that
supports the model (:func:`resolve_executor`).
"""

from __future__ import annotations

from typing import Callable

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
    ``"auto"`` tries :data:`AUTO_ORDER` in turn (one client: sequential, nothing to batch)."""
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

    def auto(model, loss_fn, data, **kw):
        if len(data) > 1:
            for cand in AUTO_ORDER[:-1]:
                cls = EXECUTORS[cand]
                if cls.unsupported(model):
                    continue
                try:
                    return cls(model, loss_fn, data, **kw)
                except ValueError as e:
                    if f"executor {cand!r} cannot run this model" not in str(e):
                        raise
        return EXECUTORS[AUTO_ORDER[-1]](model, loss_fn, data, **{k: v for k, v in kw.items() if k in _COMMON})

    return auto


_COMMON = ("batch_size", "seed", "flat", "first_client")
