"""The federated algorithms, one file each, on the :class:`Algorithm` interface.

Each file holds frozen hyper-parameters (the papers' symbols), a State NamedTuple, ``init`` and
``report``, and the round as a client program and a server program (``client_update`` /
``server_update`` / ``client_receive`` and the named ``messages``; :class:`ServerClientAlgorithm`
composes ``round`` from them) — DEPOSITUM, peer-to-peer, writes its ``round`` directly. The programs
are a handful of fused kernel calls on ``[n, d]`` client stacks plus the clients' gradient calls,
which go through a :class:`~python_algos.clients.ClientSet`.
:mod:`.registry` maps names to classes; :mod:`.steps` holds the shared fused steps.
"""

from . import topology
from .base import Algorithm, Costs, Messages, ServerClientAlgorithm
from .depositum import DEPOSITUM, DEPOSITUMState
from .fastfedda import FastFedDA, FastFedDAState
from .fedadmm import FedADMM, FedADMMState
from .fedavg import FedAvg, FedAvgState
from .fedcanon import FedCanon, FedCanonState
from .fedcanon2 import FedCanonII, FedCanonIIState
from .fedda import FedDA, FedDAState
from .feddr import FedDR, FedDRState
from .fedmid import FedMiD, FedMiDState
from .fednmap import FedNMap, FedNMapState
from .fedprox import FedProx, FedProxState
from .prox_fedavg import ProxFedAvg, ProxFedAvgState
from .registry import ALGORITHMS, make
from .scaffnew import SCAFFNEW, SCAFFNEWState
from .scaffold import SCAFFOLD, SCAFFOLDState
from .za1 import ZA1, ZA1State

__all__ = [
    "Algorithm", "ServerClientAlgorithm", "Messages", "Costs", "ALGORITHMS", "make", "topology",
    "FedCanon", "FedCanonState", "FedCanonII", "FedCanonIIState", "ZA1", "ZA1State",
    "FedNMap", "FedNMapState", "ProxFedAvg", "ProxFedAvgState", "FedMiD", "FedMiDState",
    "FedDA", "FedDAState", "FastFedDA", "FastFedDAState", "FedAvg", "FedAvgState", "SCAFFOLD", "SCAFFOLDState",
    "SCAFFNEW", "SCAFFNEWState", "FedDR", "FedDRState", "FedADMM", "FedADMMState",
    "FedProx", "FedProxState", "DEPOSITUM", "DEPOSITUMState",
]
