"""Shared by tests/test_distributed.py and the ranks it spawns: a small float64 problem, the run
cases (every registered algorithm, full gradients and minibatches, partial participation where
supported, DEPOSITUM on a ring and a complete graph), and the rank entry point.

A case runs ``simulate`` with ``executor="distributed"`` on every rank; rank r saves its final
model, metrics and per-round communication to ``out/<case>.rank<r>.pt``. The parent compares them
with ``executor="sequential"`` in one process (the ground truth: only summation order differs).
"""

from __future__ import annotations

import glob
import os
import socket
import time
import warnings
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

N = 7  # uneven shards for 2 and 3 ranks (3 + 4, 2 + 2 + 3)
ROUNDS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(fn, world: int, *args, timeout: float = 300) -> None:
    """Run ``fn(rank, world, port, *args)`` on ``world`` spawned processes; fail the test (killing them) if
    they have not all finished within ``timeout`` seconds."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=(world, free_port(), *args), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{world} ranks did not finish within {timeout} s")


# torch's names for a process group's threads: gloo's workers and event loop, the TCPStore server on rank 0
GROUP_THREADS = ("gloo", "tcpstore")


def group_threads() -> list:
    """This process's threads that belong to a torch.distributed group, by name ([] where /proc is missing)."""
    names = []
    for path in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(path) as f:
                names.append(f.read().strip())
        except OSError:  # a thread that ended meanwhile
            pass
    return sorted(n for n in names if any(k in n for k in GROUP_THREADS))


def finish_released() -> None:
    """A rank's normal end: ``launch.finish()``, then check that nothing of the group still runs. A group kept
    alive past destroy_process_group (a reference left in the library, or one that torch.distributed.nn bound
    as a default argument when torch._dynamo was imported after the group existed) keeps its threads until
    interpreter teardown, where they abort the rank now and then (SIGABRT) after its results are written."""
    from python_algos.experiments.launch import finish

    finish(ok=True)
    left = group_threads()
    if left:
        raise AssertionError(f"the process group's threads still run after finish(): {left}")


def problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    data = []
    for i in range(N):
        m = 12 + i  # different client sizes
        X = torch.randn(m, 5, generator=g, dtype=torch.float64) + 0.3 * i
        y = torch.randint(0, 3, (m,), generator=g)
        data.append((X, y))
    return data


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).double()


def loss(out, y):
    return F.cross_entropy(out, y)


def cases() -> dict:
    """name -> (algorithm registry name, make() overrides, simulate kwargs)."""
    from python_algos.algorithms.registry import ALGORITHMS

    out = {}
    for name, entry in ALGORITHMS.items():
        extra = [({}, "")]
        if name == "depositum":
            extra = [({"topology": "ring", "period": 2}, "-ring"), ({"topology": "complete", "period": 1}, "-complete")]
        for over, tag in extra:
            out[f"{name}{tag}-full"] = (name, over, {"batch_size": None})
            out[f"{name}{tag}-mb"] = (name, over, {"batch_size": 5})
        if entry.cls.partial_participation:
            out[f"{name}-pp"] = (name, {}, {"batch_size": 5, "clients_per_round": 3})
    return out


def run_case(name: str, executor: str, **executor_options):
    import python_algos as pa
    from python_algos.algorithms.registry import make

    alg_name, over, kw = cases()[name]
    alg = make(alg_name, lr=0.05, local_steps=3, **over)
    per_round = []

    def cb(t, state, m):
        per_round.append({k: m[k] for k in ("up", "down", "sent_bytes", "recv_bytes") if k in m})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hist = pa.simulate(alg, model(), loss, problem(), ROUNDS, regularizer=pa.fk.L1(0.01) if hasattr(pa, "fk")
                           else __import__("fedkernels").L1(0.01), seed=3, metrics_every=2, callbacks=[cb],
                           executor=executor, executor_options=executor_options or None, **kw)
    return {"params": hist.params, "last": hist.metrics[-1], "initial": hist.initial, "comm": per_round,
            "executor": hist.executor, "world_size": hist.world_size}


def rank_main(rank: int, world: int, port: int, out_dir: str, names: list, inner: str) -> None:
    """mp.spawn entry point: join the group through the environment, as under torchrun."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from python_algos.experiments.launch import finish

    try:
        for name in names:
            res = run_case(name, "distributed", inner=inner)
            torch.save(res, os.path.join(out_dir, f"{name}.rank{rank}.pt"))
    except BaseException:
        finish(ok=False)
        raise
    finish_released()


def rank_error_main(rank: int, world: int, port: int, out_dir: str, kind: str) -> None:
    """A construction error on one rank only; every rank records the message it raised."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import python_algos as pa

    data = problem()
    net = model()
    if kind == "batchnorm":  # running statistics: each rank would see only its own clients' batches
        net = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)).double()
    elif kind == "bad-data":  # the last client (held by the last rank) has 3 labels for its 18 samples
        X, y = data[-1]
        data[-1] = (X, y[:3])
    elif kind == "too-few":  # 2 clients for 3 ranks
        data = data[:2]
    try:
        pa.DistributedClients(net, loss, data, inner="sequential")
        msg = "no error"
    except Exception as e:  # noqa: BLE001
        msg = f"{type(e).__name__}: {e}"
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(msg)
    from python_algos.experiments.launch import finish

    finish(ok=False)  # every rank raised: they leave the group together (as the command line does)


def rank_auto_main(rank: int, world: int, port: int, out_dir: str, n: int) -> None:
    """Record which executor ``inner="auto"`` picked on this rank for n clients of a linear model."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import python_algos as pa

    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(n)]
    torch.manual_seed(0)
    cs = pa.DistributedClients(nn.Linear(3, 2), loss, data, inner="auto")
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(cs.inner_executor)
    finish_released()


# --- reductions of client rows (metric code reading a client stack) --------------------------------

def row_ops() -> dict:
    """name -> op on an [N, d] client stack X; the distributed executor must give torch's answer."""
    f64 = torch.float64
    return {
        "mean0": lambda X: X.mean(0), "mean0-keepdim": lambda X: X.mean(0, keepdim=True),
        "mean0-dtype": lambda X: X.mean(dim=0, dtype=f64), "mean-all": lambda X: X.mean(),
        "mean-all-dtype": lambda X: X.mean(dtype=f64), "mean01": lambda X: X.mean((0, 1)),
        "mean10-keepdim": lambda X: X.mean((1, 0), keepdim=True), "mean-neg": lambda X: X.mean(-2),
        "mean-negs": lambda X: X.mean(dim=(-1, -2)), "mean-none-keepdim": lambda X: X.mean(None, True),
        "torch.mean-list": lambda X: torch.mean(X, dim=[0]), "sum01": lambda X: X.sum((0, 1)),
        "sum0-keepdim": lambda X: X.sum(0, True), "sum-dtype": lambda X: X.sum(dtype=f64),
        "torch.sum0": lambda X: torch.sum(X, 0), "torch.sum-dtype": lambda X: torch.sum(X, dtype=f64),
        "sum-empty": lambda X: X.sum(()), "sum-neg-keepdim-dtype": lambda X: X.sum(-2, keepdim=True, dtype=f64),
        "sum1-mean": lambda X: X.sum(1).mean(), "sq-sum1-sum0-keepdim": lambda X: (X * X).sum(1).sum(0, keepdim=True),
        "consensus": lambda X: (X - X.mean(dim=0)).pow(2).sum(dim=1).mean(),
        "bool-sum": lambda X: (X > 0).sum(0), "row0": lambda X: X[0], "row-last": lambda X: X[-1],
    }


def row_ops_refused() -> dict:
    """Ops along the client dimension that would need another collective: must raise."""
    return {
        "amax0": lambda X: X.amax(0), "norm": lambda X: X.norm(), "norm-dim0": lambda X: X.norm(2, 0),
        "max": lambda X: X.max(), "max0": lambda X: X.max(dim=0), "cumsum0": lambda X: X.cumsum(0),
        "t": lambda X: X.t(), "T": lambda X: X.T, "std0": lambda X: X.std(0), "sort0": lambda X: X.sort(0),
        "vector_norm": lambda X: torch.linalg.vector_norm(X),
        "vec@X": lambda X: torch.ones(X.shape[0], dtype=X.dtype)[: X.shape[0]] @ X,
        "transpose01": lambda X: X.transpose(0, 1), "prod0": lambda X: X.prod(0),
        "float": lambda X: float(X[:1].sum(1)),
    }


def row_stack(dtype, d: int):
    g = torch.Generator().manual_seed(7)
    return torch.randn(N, d, generator=g, dtype=torch.float64).to(dtype)


class RowsState(NamedTuple):
    x: torch.Tensor  # [N, d] a client stack
    client_fields = ("x",)


class _OpReport:
    """An algorithm stand-in whose report applies one op to the state's client stack ``x``."""

    def __init__(self, op):
        self.op = op

    def report(self, state, reg):
        return self.op(state.x)


def rows_results(cs) -> dict:
    """(dtype, op name) -> result or the exception's type name, through ``cs.report``."""
    out = {}
    for dtype in (torch.float32, torch.float64):
        X = row_stack(dtype, cs.dim)[cs.lo : cs.hi]
        for name, op in {**row_ops(), **row_ops_refused()}.items():
            try:
                out[(str(dtype), name)] = cs.report(_OpReport(op), RowsState(X.clone()), None)
            except Exception as e:  # noqa: BLE001
                out[(str(dtype), name)] = type(e).__name__
    return out


def rank_cli_main(rank: int, world: int, port: int, out_dir: str, argv: list) -> None:
    """The command line on this rank, as torchrun starts it; records its exit code and the group's threads left
    when it returned (its last step is launch.finish())."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from python_algos.experiments.cli.commands import main

    code = main([*argv, "--out", os.path.join(out_dir, "run")])
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(f"{code} {group_threads()}")


def rank_rows_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import python_algos as pa

    cs = pa.DistributedClients(model(), loss, problem(), inner="sequential")
    out = rows_results(cs)
    out["objective"] = objective(cs)
    torch.save(out, os.path.join(out_dir, f"rows.rank{rank}.pt"))
    finish_released()


def objective(cs):
    """(f, grad) of the full objective at a fixed float64 point: the metric pass's all-reduce."""
    x = torch.linspace(-0.5, 0.5, cs.dim, dtype=torch.float64)
    g = torch.empty_like(x)
    return cs.full_objective_(x, g), g
