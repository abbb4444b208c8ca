"""Client executors: the :class:`ClientSet` interface and the backends that run client work.

===============  =============================================================================
executor         how ``gradients_`` runs the clients
===============  =============================================================================
``sequential``   :class:`SequentialClients`: one client after another on one module
===============  =============================================================================
"""

from .base import ClientSet, CommCounter, client_tensors, seeds
from .sequential import SequentialClients

__all__ = ["ClientSet", "CommCounter", "SequentialClients", "client_tensors", "seeds"]
