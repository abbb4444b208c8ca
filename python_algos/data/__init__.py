"""Data sets for federated runs, from Python and the command line: file readers (no downloads),
the bundled data sets, built-in generators, client partitions, federated standardisation.

    from python_algos.data import load_dataset, federate
    fed = federate(load_dataset("synthetic", alpha=1, beta=1, num_clients=30), "natural", 30)
    simulate(alg, model, loss_fn, fed.clients, rounds=100)
    fed = federate(load_dataset("folder:hospitals"), "natural", 6)   # your own data: one file per client
    Population(len(src), src) for src = FolderClients("hospitals") or federate(.., "cyclic", 10**5).clients:
    client i built when sampled (python_algos.clients.population; docs/population.md)

See :mod:`.datasets` for the names, :mod:`.loaders` for the expected files, :mod:`.partitions`
for the splits.
"""

from .datasets import DATASETS, Dataset, FederatedData, check_data_options, data_options, federate, load_dataset
from .folder import load_folder
from .loaders import DataNotFoundError, load_a9a, load_cifar10, load_femnist, load_libsvm, load_mnist, read_idx
from .partitions import PARTITIONS, by_group, cyclic, dirichlet, iid, label_histograms, label_shards
from .population_sources import FolderClients, RowClients
from .standardize import standardize
from .synthetic import fedprox_synthetic, image_like, sparse_regression

__all__ = [
    "Dataset", "FederatedData", "DATASETS", "PARTITIONS", "load_dataset", "federate",
    "DataNotFoundError",
    "data_options", "check_data_options",
    "read_idx", "load_mnist", "load_cifar10", "load_libsvm", "load_a9a", "load_femnist", "load_folder", "standardize",
    "iid", "dirichlet", "label_shards", "by_group", "cyclic", "label_histograms", "FolderClients", "RowClients",
    "fedprox_synthetic", "sparse_regression", "image_like",
]
