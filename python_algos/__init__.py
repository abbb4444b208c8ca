"""Composite federated learning on fedkernels: algorithms, client executors, ``simulate``.

Layers, bottom to top (each imports only from itself and the ones above it in this list; no import
cycle crosses them, checked by tests/test_layers.py):

* :mod:`python_algos.runfolder` — what a run leaves on disk and shows: the run-folder files,
  ``History`` save / load, checkpoint files, the progress display (shared by ``simulate`` and the
  command line, so API runs and CLI runs have one format and one look);
* :mod:`python_algos.clients` — the :class:`ClientSet` interface and its executors (how the
  clients' gradients are computed: sequentially, batched, ...);
* :mod:`python_algos.algorithms` — one file per algorithm: hyper-parameters (the papers'
  symbols), a State NamedTuple, ``init`` / ``round`` / ``report``; clients are rows of
  ``[N, d]`` stacks updated by fused kernels, reached only through a ``ClientSet``;
* :mod:`python_algos.simulate` — drives an algorithm through a ``ClientSet`` and records metrics;
  this package (``import python_algos``) stops here;
* :mod:`python_algos.data` — data sets and their federated splits: readers of local files (no
  downloads), the bundled a9a and Fed-TCGA-BRCA, generators, partitions, federated standardisation
  (``from python_algos.data import load_dataset, federate, standardize``; imports nothing above);
* :mod:`python_algos.deploy` — Flower apps and local deployments;
* :mod:`python_algos.experiments` — the application: CLI, configs, runs and comparisons, models,
  launching on several processes, plots.

For example::

    import fedkernels as fk
    from python_algos import FedCanon, simulate
    hist = simulate(FedCanon(alpha=0.1, beta=0.01, local_steps=10), model, loss_fn, clients,
                    rounds=100, regularizer=fk.SCAD(1e-3))
"""

from .algorithms import (
                         ALGORITHMS,
                         DEPOSITUM,
                         SCAFFNEW,
                         SCAFFOLD,
                         ZA1,
                         Algorithm,
                         Costs,
                         DEPOSITUMState,
                         FastFedDA,
                         FastFedDAState,
                         FedADMM,
                         FedADMMState,
                         FedAvg,
                         FedAvgState,
                         FedCanon,
                         FedCanonII,
                         FedCanonIIState,
                         FedCanonState,
                         FedDA,
                         FedDAState,
                         FedDR,
                         FedDRState,
                         FedMiD,
                         FedMiDState,
                         FedNMap,
                         FedNMapState,
                         FedProx,
                         FedProxState,
                         ProxFedAvg,
                         ProxFedAvgState,
                         SCAFFNEWState,
                         SCAFFOLDState,
                         ZA1State,
                         make,
                         topology,
)
from .clients import ClientSet, CommCounter, DistributedClients, SequentialClients
from .simulate import History, simulate

FedCanon2 = FedCanonII  # alias matching the registry name "fedcanon2"

__all__ = [
    "simulate",
    "History",
    "Algorithm",
    "ClientSet",
    "SequentialClients",
    "DistributedClients",
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
    "FastFedDA",
    "FastFedDAState",
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
