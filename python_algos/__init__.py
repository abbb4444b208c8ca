"""Composite federated learning algorithms on fedkernels (ALGORITHMS.md §4–§5).

Each algorithm is one file: hyper-parameters (spec symbols), a State NamedTuple, ``init``,
``round`` and ``report``; clients are rows of ``[N, d]`` stacks updated by fused kernels, and
algorithms reach clients only through :class:`ClientSet` (gradients, mean, broadcast).

    import fedkernels as fk
    from python_algos import FedCanon, simulate
    hist = simulate(FedCanon(alpha=0.1, beta=0.01, local_steps=10), model, loss_fn, clients,
                    rounds=100, regularizer=fk.SCAD(1e-3))
"""

from . import topology
from .core import Algorithm, ClientSet, CommCounter, Costs, SequentialClients
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
from .simulate import History, simulate
from .za1 import ZA1, ZA1State

FedCanon2 = FedCanonII  # alias matching the registry name "fedcanon2"

__all__ = [
    "simulate",
    "History",
    "Algorithm",
    "ClientSet",
    "SequentialClients",
    "CommCounter",
    "Costs",
    "ALGORITHMS",
    "make",
    "FedCanon",
    "FedCanonState",
    "FedCanonII",
    "FedCanon2",
    "FedCanonIIState",
    "ZA1",
    "ZA1State",
    "FedNMap",
    "FedNMapState",
    "ProxFedAvg",
    "ProxFedAvgState",
    "FedMiD",
    "FedMiDState",
    "FedDA",
    "FedDAState",
    "FedAvg",
    "FedAvgState",
    "SCAFFOLD",
    "SCAFFOLDState",
    "SCAFFNEW",
    "SCAFFNEWState",
    "FedDR",
    "FedDRState",
    "FedADMM",
    "FedADMMState",
    "FedProx",
    "FedProxState",
    "DEPOSITUM",
    "DEPOSITUMState",
    "topology",
]
