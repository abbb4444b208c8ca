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

``simulate(..., executor=NAME)`` picks one by name; ``"auto"`` applies a fixed rule (see
:func:`resolve_executor`), so the same command always runs the same executor and gives the same bits.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from .base import ClientSet, CommCounter, client_generators, seeds
from .batched import BatchedClients
from .data import ClientData, DatasetData, LoaderData, TensorData, client_data
from .distributed import DistributedClients
from .registry import AUTO_MIN_CLIENTS, AUTO_MIN_CLIENTS_PER_PASS, LOCAL_EXECUTORS, resolve_local
from .sequential import SequentialClients

__all__ = ["ClientSet", "CommCounter", "SequentialClients", "BatchedClients", "DistributedClients", "EXECUTORS",
           "resolve_executor", "client_generators", "seeds", "ClientData", "TensorData", "DatasetData", "LoaderData",
           "client_data", "AUTO_MIN_CLIENTS", "AUTO_MIN_CLIENTS_PER_PASS"]

#: executor name -> ClientSet class (constructor ``(model, loss_fn, data, batch_size=, seed=, flat=, **options)``)
EXECUTORS: dict[str, type] = {
    **LOCAL_EXECUTORS,
    "distributed": DistributedClients,  # never picked by "auto": it needs a process group / torchrun
}


def resolve_executor(executor, model: nn.Module) -> Callable[..., ClientSet]:
    """A ClientSet factory for ``executor`` (a name in :data:`EXECUTORS`, or ``"auto"``); see
    :func:`python_algos.clients.registry.resolve_local` for ``"auto"``'s rule (it never picks
    ``"distributed"``). Raises ``ValueError`` naming the valid executors, or saying why the model
    cannot run on the one asked for."""
    if isinstance(executor, str) and executor.lower() == "distributed":
        why = DistributedClients.unsupported(model)
        if why:
            raise ValueError(f"executor 'distributed' cannot run this model: {why}")
        return DistributedClients
    try:
        return resolve_local(executor, model)
    except ValueError as e:
        if not (isinstance(executor, str) and executor.lower() in LOCAL_EXECUTORS):  # a bad name: list them all
            raise ValueError(f"executor must be one of {', '.join(['auto', *EXECUTORS])}, got {executor!r}") from None
        raise e
