"""SCAFFOLD in pfl-research (PyPI ``pfl``) with its ``DiskUserStateStorage`` on the population workload of
``bench.population --workload mlp``: the MNIST MLP (d = 109,386), N users built on demand
(``bench.population.MnistLike``: 50 samples each, user i from (seed, i)), a cohort per round, each
user's control variate ``c_i`` in one file per user on disk. Started by ``python -m bench.population``
with pfl's own interpreter (``--pfl-python``); not part of the product and never one of its dependencies.

    python -m bench.pfl_scaffold --clients 100000 --cohort 100 --rounds 50 --out r.json

pfl runs in its own virtual environment (torch, numpy and pfl only: nothing here imports python_algos).
Same work as ours: K = 2 full-batch local gradient steps (pfl: ``local_num_epochs=2``,
``local_batch_size=None``), lr 0.05, SCAFFOLD option II (``use_gradient_as_control_variate=False``),
server step SGD with lr 1 on the averaged model difference; pfl's sampler draws its own cohorts. Writes
seconds of each round (pfl's end-of-round callback), the files and allocated bytes of the state folder.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time

import numpy as np
import torch
from torch import nn

from .pfl_fedavg import PflModel
from .population import MnistLike


def mnist_mlp() -> nn.Module:
    """bench.clients' MLP (784-128-64-10, 109,386 parameters), seeded as ours."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def _disk(folder: str) -> tuple:
    """(files, allocated bytes) under ``folder``."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]
    return len(files), sum(os.stat(f).st_blocks * 512 for f in files)


def run(args) -> dict:
    torch.set_num_threads(1)
    np.random.seed(0)
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm.scaffold import SCAFFOLD, SCAFFOLDParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.data.user_state import DiskUserStateStorage
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.model.pytorch import PyTorchModel
    from pfl.stats import MappedVectorStatistics

    # pfl 0.6.0 reads a user's state file back with torch.load, whose weights_only default (torch >= 2.6) refuses
    # pfl's own class: allowed here, the files being the ones this run wrote
    torch.serialization.add_safe_globals([MappedVectorStatistics])
    gen = MnistLike(seed=0)
    fed = FederatedDataset(lambda u: Dataset(raw_data=list(gen(u)), user_id=u),
                           get_user_sampler("random", list(range(args.clients))))
    module = PflModel(mnist_mlp())  # the loss and metrics pfl's PyTorchModel calls
    model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    ends, folder = [], tempfile.mkdtemp(prefix="pfl-scaffold-state-")

    class RoundClock(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            ends.append(time.perf_counter())
            return super().on_train_begin(model=model)

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            ends.append(time.perf_counter())
            return False, type(aggregate_metrics)()

    try:
        SCAFFOLD().run(
            algorithm_params=SCAFFOLDParams(central_num_iterations=args.rounds,
                                            evaluation_frequency=args.rounds + 1,  # round 0 only (untimed)
                                            train_cohort_size=args.cohort, val_cohort_size=0,
                                            population=args.clients, use_gradient_as_control_variate=False,
                                            user_state_storage=DiskUserStateStorage(folder)),
            backend=SimulatedBackend(training_data=fed, val_data=fed), model=model,
            model_train_params=NNTrainHyperParams(local_learning_rate=args.lr, local_num_epochs=args.K,
                                                  local_batch_size=None),
            model_eval_params=NNEvalHyperParams(local_batch_size=None), callbacks=[RoundClock()],
            send_metrics_to_platform=False)
        files, nbytes = _disk(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    from importlib.metadata import version

    return {"round_s": [b - a for a, b in zip(ends, ends[1:])], "files": files, "disk_bytes": nbytes,
            "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "pfl_version": version("pfl"),
            "dim": sum(p.numel() for p in module.parameters())}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pfl_scaffold", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=100_000)
    p.add_argument("--cohort", type=int, default=100)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("-K", type=int, default=2, help="local epochs of one full batch (default 2)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    res = run(args)
    with open(args.out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
