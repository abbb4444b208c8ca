"""FedAvg in pfl-research (PyPI package ``pfl``) on the clients-table workload: one process, or one
rank of a ``torchrun`` job. Started by ``python -m bench.peers``; not part of the product.

    python -m bench.pfl_fedavg --out r.json                                   # one process
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m bench.pfl_fedavg --out r.json

pfl joins the ranks itself when it is imported under torchrun (``TORCHELASTIC_RUN_ID`` set: gloo on
CPU) and gives each rank every ``world_size``-th user of the cohort; the server update is an
all-reduce, so every round ends in step on all ranks. Rank 0 writes ``--out``: seconds of each
round (from pfl's own end-of-round callback) and the final model as a flat list.

Same work as python_algos' FedAvg: the ``--model`` of ``bench.clients`` (same seed, so the same
start), ``bench.clients.make_clients`` data, local ``torch.optim.SGD`` with ``--lr``, server step SGD
with lr 1 on the averaged model difference (x <- mean of the local models), ``--cohort`` users
sampled per round by pfl's sampler. pfl walks a user's data in order, one epoch per round, so each
user's dataset is its first ``--steps`` x ``--batch`` samples, taken cyclically (the mlp workload: its
256 samples, 8 steps of 32; cross-device: its 32 samples and again its first 8, 5 steps of 8;
cifar10: its 50 images, 5 steps of 10).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

THREADS = 1  # per process, as every row of the peers table


class PflModel(nn.Module):
    """A bench.clients model with the ``loss`` and ``metrics`` methods pfl's PyTorchModel requires."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net  # parameter order = net's, so the final flat vector compares with ours

    def forward(self, x):
        return self.net(x)

    def loss(self, x, y, eval=False):  # noqa: A002  (pfl's keyword)
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=False):  # noqa: A002
        from pfl.metrics import Weighted

        self.eval() if eval else self.train()
        return {"loss": Weighted(F.cross_entropy(self(x), y, reduction="sum").item(), len(x))}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pfl_fedavg", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--model", default="mlp", help="a bench.clients model (mlp, logreg, cnn, cifar_cnn)")
    p.add_argument("--steps", type=int, default=None, help="local steps per round (default: samples / batch)")
    p.add_argument("--cohort", type=int, default=None, help="users per round (default: all)")
    p.add_argument("--device", default="cpu",
                   help="where the clients' data is put; pfl itself trains on the GPU whenever torch sees one")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    torch.set_num_threads(THREADS)
    import numpy as np

    np.random.seed(0)  # pfl's user sampling must draw the same cohorts on every rank
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.internal.ops import pytorch_ops
    from pfl.model.pytorch import PyTorchModel

    from .clients import input_shape, make_clients, make_model

    data = make_clients(args.clients, args.samples, device=args.device, in_shape=input_shape(args.model))
    steps = args.steps or args.samples // args.batch
    walk = (torch.arange(steps * args.batch) % args.samples).to(args.device)  # one in-order epoch = `steps` batches
    users = list(range(args.clients))
    fed = FederatedDataset(lambda u: Dataset(raw_data=[data[u][0][walk], data[u][1][walk]], user_id=u),
                           get_user_sampler("minimize_reuse", users))
    module = PflModel(make_model(args.model))
    model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))

    ends = []

    def stamp():
        if torch.cuda.is_available():  # a round ends when its queued GPU work has
            torch.cuda.synchronize()
        ends.append(time.perf_counter())

    class RoundClock(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            stamp()
            return super().on_train_begin(model=model)

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            stamp()
            return False, type(aggregate_metrics)()

    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=args.rounds,
                                           evaluation_frequency=args.rounds + 1,  # round 0 only (untimed)
                                           train_cohort_size=args.cohort or args.clients, val_cohort_size=0),
        backend=SimulatedBackend(training_data=fed, val_data=fed),
        model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=args.lr, local_num_epochs=1,
                                              local_batch_size=args.batch),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=[RoundClock()],
        send_metrics_to_platform=False)

    dist = pytorch_ops.distributed
    if dist.global_rank == 0:
        flat = torch.cat([q.detach().reshape(-1) for q in module.net.parameters()]).cpu()
        res = {"round_s": [b - a for a, b in zip(ends, ends[1:])], "params": flat.tolist(),
               "device": str(next(module.parameters()).device),
               "world_size": dist.world_size, "threads": torch.get_num_threads(),
               "pfl_version": _pfl_version()}
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f)
        os.replace(tmp, args.out)


def _pfl_version() -> str:
    from importlib.metadata import version

    return version("pfl")


if __name__ == "__main__":
    main()
