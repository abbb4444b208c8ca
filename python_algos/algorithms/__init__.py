"""The federated algorithms, one file each, on the :class:`Algorithm` interface.

Each file holds frozen hyper-parameters (the papers' symbols), a State NamedTuple, ``init``,
``round`` and ``report``; rounds are a handful of fused kernel calls on ``[n, d]`` client stacks
plus the clients' gradient calls, which go through a :class:`~python_algos.clients.ClientSet`.
:mod:`.registry` maps names to classes; :mod:`.steps` holds the shared fused steps.
"""

from . import topology
from .base import Algorithm, Costs
from .depositum import DEPOSITUM, DEPOSITUMState
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
    "Algorithm", "Costs", "ALGORITHMS", "make", "topology",
    "FedCanon", "FedCanonState", "FedCanonII", "FedCanonIIState", "ZA1", "ZA1State",
    "FedNMap", "FedNMapState", "ProxFedAvg", "ProxFedAvgState", "FedMiD", "FedMiDState",
    "FedDA", "FedDAState", "FedAvg", "FedAvgState", "SCAFFOLD", "SCAFFOLDState",
    "SCAFFNEW", "SCAFFNEWState", "FedDR", "FedDRState", "FedADMM", "FedADMMState",
    "FedProx", "FedProxState", "DEPOSITUM", "DEPOSITUMState",
]
