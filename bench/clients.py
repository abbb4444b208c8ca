"""Client-executor workloads for the clients table and the pytest-benchmark suite.

One round of FedAvg or FedCanon over N clients x K local steps (batch B), run by

* ``sequential``  python_algos' SequentialClients (one client after another on one module),
* ``batched``     python_algos' BatchedClients (vectorized passes over client chunks),
* ``loop``        a plain PyTorch FedAvg loop: per client ``copy.deepcopy(model)`` + ``torch.optim.SGD``
                  (what most FL code does; the reference a user would write),

and the **FLOP floor**: the round's forward+backward FLOPs (``torch.utils.flop_counter`` on one
client step, x N x K) at the batched-matmul rate measured in the same run.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import python_algos as pa
from python_algos.experiments.models import CNN, MLP

__all__ = ["MODELS", "Workload", "WORKLOADS", "make_model", "make_clients", "input_shape", "time_executor",
           "time_plain_loop", "cohorts", "flops_per_step", "bmm_rate", "ALGORITHMS"]

IN_SHAPE = (1, 28, 28)  # MNIST-shaped inputs (784 features)
CIFAR_SHAPE = (3, 32, 32)


class LogReg(nn.Module):
    """Multinomial logistic regression on 784 features (7,850 parameters)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(784, 10)

    def forward(self, x):
        return self.lin(torch.flatten(x, 1))


class CifarCNN(nn.Sequential):
    """The CNN of pfl-research's CIFAR-10 benchmark (1,626,442 parameters) on 3x32x32 inputs.

    Two unpadded 3x3 convolutions (3 -> 32 -> 64 channels, each followed by ReLU), a 2x2 max-pool
    (28x28 -> 14x14), dropout 0.25, a dense layer 12,544 -> 128 with ReLU, dropout 0.5 and a dense
    layer 128 -> 10; weights Glorot-uniform, biases PyTorch's default, as there. pfl's model takes
    channels-last images and transposes them first; this one takes channels-first images, so the
    arithmetic is the same without the transpose."""

    def __init__(self, num_classes: int = 10):
        super().__init__(
            nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
            nn.Flatten(), nn.Linear(64 * 14 * 14, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, num_classes))
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)


MODELS: Dict[str, Callable[[], nn.Module]] = {"logreg": LogReg, "mlp": MLP, "cnn": CNN, "cifar_cnn": CifarCNN}
# Each model's input: MNIST-shaped, but the CIFAR-10 CNN's.
INPUT_SHAPES = {"cifar_cnn": CIFAR_SHAPE}


def input_shape(model_name: str) -> tuple:
    """The shape of one input sample of ``model_name`` (``make_clients``'s ``in_shape`` for it)."""
    return INPUT_SHAPES.get(model_name, IN_SHAPE)

ALGORITHMS: Dict[str, Callable[[float, int], pa.Algorithm]] = {
    "FedAvg": lambda lr, K: pa.FedAvg(lr_local=lr, local_steps=K),
    "FedCanon": lambda lr, K: pa.FedCanon(alpha=lr * K, beta=lr, local_steps=K),
}


@dataclasses.dataclass(frozen=True)
class Workload:
    """One FedAvg round's shape: ``cohort`` of ``clients`` clients train, each K steps of ``batch``
    of its ``samples`` samples (synthetic, shaped for the model: ``make_clients``), on ``model``."""

    name: str
    model: str
    clients: int
    samples: int
    batch: int
    K: int
    cohort: int

    def describe(self) -> str:
        params = sum(p.numel() for p in make_model(self.model).parameters())
        who = (f"{self.cohort} of {self.clients:,} clients sampled per round" if self.cohort < self.clients
               else f"{self.clients:,} clients")
        shape = "x".join(map(str, input_shape(self.model)))
        return (f"workload {self.name}: {self.model} ({params:,} parameters), {who}, {self.samples} samples "
                f"({shape}) each, K = {self.K} local steps of batch {self.batch}")


# The peers table's workloads: silo-like (few clients with much data and a 109 k-parameter MLP,
# one local epoch, bound by arithmetic), cross-device (many clients, few samples each, a small
# model: bound by per-client overhead), and the configuration of pfl-research's CIFAR-10 benchmark
# (its 1.63 M-parameter CNN; CIFAR-10's 50,000 training images as 1,000 users of 50; 50 users per
# round, one local epoch of batch 10), with synthetic images of CIFAR-10's shape.
WORKLOADS = {
    "mlp": Workload("mlp", "mlp", clients=100, samples=256, batch=32, K=8, cohort=100),
    "cross-device": Workload("cross-device", "logreg", clients=1000, samples=32, batch=8, K=5, cohort=100),
    "cifar10": Workload("cifar10", "cifar_cnn", clients=1000, samples=50, batch=10, K=5, cohort=50),
}


def make_model(name: str, device="cpu", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]().to(device)


def make_clients(num_clients: int, samples: int = 256, device="cpu", seed: int = 0,
                 in_shape: Sequence[int] = IN_SHAPE) -> List[tuple]:
    """Synthetic clients, samples of ``in_shape`` (default MNIST's; ``input_shape(model)``):
    x = mean[y] + noise (float32), labels skewed per client."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(10, *in_shape, generator=g)
    out = []
    for i in range(num_clients):
        y = (torch.randint(0, 10, (samples,), generator=g) + i) % 10
        X = means[y] + torch.randn(samples, *in_shape, generator=g)
        out.append((X.to(device), y.to(device)))
    return out


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_executor(model_name: str, algorithm: str, clients, executor: str, *, K: int = 10, batch: int = 32,
                  rounds: int = 2, lr: float = 0.01, device="cpu", clients_per_round: Optional[int] = None) -> dict:
    """Seconds per round (median of the rounds after the first, which pays first-call costs) of
    ``algorithm`` on ``executor``; also the forward/backward share. ``clients_per_round``: the
    cohort sampled each round (None: every client)."""
    model = make_model(model_name, device)
    alg = ALGORITHMS[algorithm](lr, K)
    hist = pa.simulate(alg, model, F.cross_entropy, clients, rounds, batch_size=batch, metrics_every=0,
                       executor=executor, clients_per_round=clients_per_round)
    _sync(device)
    rows = hist.metrics[1:] if len(hist.metrics) > 1 else hist.metrics
    return {"s_per_round": statistics.median(r["wall_time"] for r in rows),
            "fwd_bwd_s": statistics.median(r["fwd_bwd_time"] for r in rows),
            "params": hist.params}


def cohorts(num_clients: int, clients_per_round: Optional[int], rounds: int, seed: int = 0) -> List[List[int]]:
    """The clients of each round as python_algos samples them (``ClientSet.set_participation``:
    uniformly without replacement from a generator seeded by ``seeds(seed, 1, stream=2)``), sorted;
    every client each round when ``clients_per_round`` is None."""
    if clients_per_round is None or clients_per_round == num_clients:
        return [list(range(num_clients))] * rounds
    g = torch.Generator().manual_seed(pa.clients.seeds(seed, 1, stream=2)[0])
    return [torch.randperm(num_clients, generator=g)[:clients_per_round].sort().values.tolist()
            for _ in range(rounds)]


def time_plain_loop(model_name: str, clients, *, K: int = 10, batch: int = 32, rounds: int = 2, lr: float = 0.01,
                    device="cpu", clients_per_round: Optional[int] = None) -> dict:
    """FedAvg as a plain PyTorch loop (deepcopy + SGD per client, same cohorts and per-client minibatch
    draws as python_algos: client i's generator is seeded by python_algos.clients.seeds)."""
    model = make_model(model_name, device)
    gens = pa.clients.client_generators(0, len(clients))
    times = []
    for cohort in cohorts(len(clients), clients_per_round, rounds):
        t0 = time.perf_counter()
        total = [torch.zeros_like(p) for p in model.parameters()]
        for i in cohort:
            X, y = clients[i]
            local = copy.deepcopy(model)
            opt = torch.optim.SGD(local.parameters(), lr=lr)
            for _ in range(K):
                idx = torch.randperm(X.shape[0], generator=gens[i])[:batch].to(X.device)
                opt.zero_grad()
                F.cross_entropy(local(X[idx]), y[idx]).backward()
                opt.step()
            with torch.no_grad():
                for t, p in zip(total, local.parameters()):
                    t.add_(p)
        with torch.no_grad():
            for p, t in zip(model.parameters(), total):
                p.copy_(t.div_(len(cohort)))
        _sync(device)
        times.append(time.perf_counter() - t0)
    rows = times[1:] if len(times) > 1 else times
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"s_per_round": statistics.median(rows), "params": params}


def flops_per_step(model_name: str, batch: int = 32) -> int:
    """Forward + backward FLOPs of one client step (batch ``batch``), counted by torch."""
    from torch.utils.flop_counter import FlopCounterMode

    model = make_model(model_name)
    X = torch.randn(batch, *input_shape(model_name))
    y = torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(X), y).backward()
    return int(counter.get_total_flops())


def bmm_rate(device="cpu", c: int = 64, repeats: int = 25) -> float:
    """FLOP/s of ``torch.bmm`` on the MLP's first-layer shapes per client ([c, 32, 784] x [c, 784, 128]):
    the fastest of ``repeats`` calls (~4 ms each on one CPU core), so that a busy moment of a shared
    machine does not lower the floor (5 calls left it 20-30 % apart between runs)."""
    a = torch.randn(c, 32, 784, device=device)
    b = torch.randn(c, 784, 128, device=device)
    torch.bmm(a, b)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.bmm(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * c * 32 * 784 * 128 / best
