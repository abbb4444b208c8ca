"""What a user replaces: the model, the loss, each node's data, the algorithm and h, from the run config.

The data here is a synthetic heterogeneous least-squares problem, client i's (A_i, b_i) generated from
(seed, i): every node builds its own partition and nothing else. A real node would read its local files
in ``load_data``.
"""

from __future__ import annotations

import torch
from torch import nn

import fedkernels as fk
from python_algos.algorithms.registry import make


def settings(cfg) -> dict:
    """The run's settings from the run config (pyproject's [tool.flwr.app.config], `flwr run --run-config`)."""
    k, b = int(cfg["clients-per-round"]), int(cfg["batch-size"])
    return {"rounds": int(cfg["rounds"]), "num_clients": int(cfg["num-clients"]), "seed": int(cfg["seed"]),
            "clients_per_round": k or None, "batch_size": b or None, "regularizer": fk.L1(float(cfg["l1"]))}


def algorithm(cfg):
    return make(str(cfg["algorithm"]), lr=float(cfg["lr"]), local_steps=int(cfg["local-steps"]))


def model_fn(cfg):
    """The initial model: the same parameters on every node and on the server (seeded)."""
    def build():
        g = torch.Generator().manual_seed(int(cfg["seed"]) + 1)
        model = nn.Linear(int(cfg["dim"]), 1, bias=False).double()
        with torch.no_grad():
            model.weight.copy_(0.1 * torch.randn(model.weight.shape, generator=g, dtype=torch.float64))
        return model
    return build


def loss(out, y):
    return nn.functional.mse_loss(out.squeeze(-1), y)


def load_data(cfg):
    """Client i's data: (A_i, b_i) with its own optimum, from (seed, i)."""
    def load(i, context):
        d, m, seed = int(cfg["dim"]), int(cfg["samples"]), int(cfg["seed"])
        x_true = torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        g = torch.Generator().manual_seed(seed * 1000 + 17 * (i + 1))
        A = torch.randn(m, d, generator=g, dtype=torch.float64)
        x_i = x_true + 0.5 * torch.randn(d, generator=g, dtype=torch.float64)
        return A, A @ x_i + 0.1 * torch.randn(m, generator=g, dtype=torch.float64)
    return load
