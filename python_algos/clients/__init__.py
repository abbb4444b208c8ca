"""Client executors: the :class:`ClientSet` interface and the backends that run client work.

An executor decides *how* the clients' local work (``gradients_``, the metric pass) runs; the
algorithms and their results do not depend on it, up to floating-point summation order.

===============  =============================================================================
executor         how ``gradients_`` runs the clients
===============  =============================================================================
``sequential``   :class:`SequentialClients`: one client after another on one module
``distributed``  :class:`DistributedClients`: the clients sharded over torch.distributed ranks
                 (``torchrun``), each rank running its shard with an inner executor
===============  =============================================================================

``simulate(..., executor=NAME)`` picks one by name; ``"auto"`` picks the fastest executor that
supports the model (:func:`resolve_executor`).
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from .base import ClientSet, CommCounter, client_generators, client_tensors, seeds
from .distributed import DistributedClients
from .sequential import SequentialClients

__all__ = ["ClientSet", "CommCounter", "SequentialClients", "DistributedClients", "EXECUTORS", "resolve_executor",
           "client_generators", "client_tensors", "seeds"]

#: executor name -> ClientSet class (constructor ``(model, loss_fn, data, batch_size=, seed=, flat=, **options)``)
EXECUTORS: dict[str, type] = {
    "sequential": SequentialClients,
    "distributed": DistributedClients,  # never picked by "auto": it needs a process group / torchrun
}

#: the order in which ``"auto"`` tries executors (the first whose ``supports(model)`` is empty wins)
AUTO_ORDER: tuple[str, ...] = ("sequential",)


def resolve_executor(executor, model: nn.Module) -> Callable[..., ClientSet]:
    """The ClientSet class for ``executor`` (a name in :data:`EXECUTORS` or ``"auto"``).

    Raises ``ValueError`` naming the valid executors, or saying why the model cannot run on the one
    asked for (``cls.unsupported(model)``)."""
    if not isinstance(executor, str):
        raise TypeError(f"executor must be one of {', '.join(['auto', *EXECUTORS])}, got {executor!r}")
    name = executor.lower()
    if name == "auto":
        for cand in AUTO_ORDER:
            if not EXECUTORS[cand].unsupported(model):
                return EXECUTORS[cand]
        return SequentialClients
    if name not in EXECUTORS:
        raise ValueError(f"executor must be one of {', '.join(['auto', *EXECUTORS])}, got {executor!r}")
    cls = EXECUTORS[name]
    why = cls.unsupported(model)
    if why:
        raise ValueError(f"executor {name!r} cannot run this model: {why}")
    return cls
