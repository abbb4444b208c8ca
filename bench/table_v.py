"""FedCanon Table V analogue: total compute time of T rounds vs. local steps K.

    python -m bench.table_v                                  # K = 10 20 40 80, T = 2, ~2-3 min on 2 cores
    python -m bench.table_v --rounds 5 --K 10 40 --samples 512
    python -m bench.table_v --repeat 3                       # keep the fastest of 3 sweeps per cell
    python -m bench.table_v --out bench/results/table_v.md   # also write the tables to a file

Setting (FedCanon v2 §VI, Table V: FMNIST, CNN, SCAD, 10 clients, i.i.d., T = 200): a CNN
(``python_algos.experiments.models.CNN``, 268,362 parameters) on MNIST-shaped synthetic data (1x28x28, 10
classes, class-dependent means plus noise, i.i.d. over clients), SCAD regularizer, minibatch
gradients, FedCanon vs FedMiD vs FedDA vs ZA1 with the same local step and K, run through
``python_algos.simulate``.

Reported per (algorithm, K): total wall time of the T rounds (the paper's quantity, here for
small T; it is linear in T), its ratio to FedCanon, the time spent in forward/backward passes,
in prox kernels, and the share of round time **outside forward/backward** (binding client rows,
batch sampling, the fused client/server updates, aggregation). The goal is < 10 % for every
algorithm: with fused kernels, the prox no longer dominates as it did in the paper's Table V.
Timings are noisy on a shared machine; compare columns of one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

import fedkernels as fk
import python_algos as pa
from python_algos.experiments.models import CNN

ALGORITHMS: Dict[str, Callable[[float, int], pa.Algorithm]] = {
    "FedCanon": lambda lr, K: pa.FedCanon(alpha=lr * K, beta=lr, local_steps=K),
    "FedMiD": lambda lr, K: pa.FedMiD(lr_client=lr, lr_server=1.0, local_steps=K),
    "FedDA": lambda lr, K: pa.FedDA(lr_client=lr, lr_server=1.0, local_steps=K),
    "ZA1": lambda lr, K: pa.ZA1(eta=lr, eta_g=1.0, local_steps=K),
}


def make_clients(num_clients: int = 10, samples: int = 256, seed: int = 0) -> List[tuple]:
    """MNIST-shaped synthetic data: x = mean[y] + noise, i.i.d. split over clients (float32)."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(10, 1, 28, 28, generator=g)
    clients = []
    for _ in range(num_clients):
        y = torch.randint(0, 10, (samples,), generator=g)
        X = means[y] + torch.randn(samples, 1, 28, 28, generator=g)
        clients.append((X, y))
    return clients


def run_one(name: str, K: int, rounds: int, clients, *, lr: float = 0.01, batch_size: int = 32,
            reg: Optional[fk.Regularizer] = None, seed: int = 0) -> dict:
    """T rounds of algorithm ``name`` with K local steps; returns the timing breakdown."""
    reg = reg if reg is not None else fk.SCAD(1e-3)
    torch.manual_seed(seed)
    model = CNN()
    hist = pa.simulate(ALGORITHMS[name](lr, K), model, nn.functional.cross_entropy, clients, rounds, reg,
                       batch_size=batch_size, seed=seed, metrics_every=0)
    total = sum(hist.series("wall_time"))
    fwd_bwd = sum(hist.series("fwd_bwd_time"))
    return {
        "algorithm": name,
        "K": K,
        "rounds": rounds,
        "total_s": total,
        "per_round_s": total / max(rounds, 1),
        "fwd_bwd_s": fwd_bwd,
        "grad_call_s": sum(hist.series("grad_time")),
        "prox_s": sum(hist.series("prox_time")),
        "prox_evals": sum(hist.series("prox_evals")),
        "outside_share": 1.0 - fwd_bwd / total if total > 0 else float("nan"),
    }


def run_table(Ks: Sequence[int], rounds: int, *, num_clients: int = 10, samples: int = 256, batch_size: int = 32,
              lr: float = 0.01, algorithms: Sequence[str] = tuple(ALGORITHMS), repeat: int = 1, log=None) -> List[dict]:
    """Every (algorithm, K); with ``repeat`` > 1 the whole sweep is repeated and, per cell, the
    fastest run is kept (the usual estimator on a machine shared with other jobs)."""
    clients = make_clients(num_clients, samples)
    run_one("FedCanon", 1, 1, clients, lr=lr, batch_size=batch_size)  # warm-up (allocations, first calls)
    best: Dict[tuple, dict] = {}
    for rep in range(repeat):
        for K in Ks:
            for name in algorithms:
                r = run_one(name, K, rounds, clients, lr=lr, batch_size=batch_size)
                if (name, K) not in best or r["total_s"] < best[(name, K)]["total_s"]:
                    best[(name, K)] = r
                if log is not None:
                    log(f"[{rep + 1}/{repeat}] {name:9s} K={K:3d}: {r['total_s']:7.2f} s, outside fwd/bwd "
                        f"{100 * r['outside_share']:5.2f} %, prox {r['prox_s']:.3f} s ({r['prox_evals']} evals)")
    return [best[(name, K)] for K in Ks for name in algorithms]


def markdown(results: List[dict]) -> str:
    algorithms = list(dict.fromkeys(r["algorithm"] for r in results))
    Ks = list(dict.fromkeys(r["K"] for r in results))
    by = {(r["algorithm"], r["K"]): r for r in results}
    rounds = results[0]["rounds"] if results else 0
    lines = [f"Total compute time (s) for T = {rounds} rounds (ratio to FedCanon at the same K; "
             f"ratio to the previous K for the same algorithm):", "",
             "| K | " + " | ".join(algorithms) + " |", "|---|" + "---|" * len(algorithms)]
    prev = {}
    for K in Ks:
        cells = []
        base = by.get(("FedCanon", K))
        for a in algorithms:
            r = by.get((a, K))
            if r is None:
                cells.append("–")
                continue
            notes = []
            if base is not None and a != "FedCanon":
                notes.append(f"{r['total_s'] / base['total_s']:.2f}×")
            if a in prev:
                notes.append(f"{r['total_s'] / prev[a]:.2f}× prev K")
            cells.append(f"{r['total_s']:.2f}" + (f" ({', '.join(notes)})" if notes else ""))
            prev[a] = r["total_s"]
        lines.append(f"| {K} | " + " | ".join(cells) + " |")
    lines += ["", "Share of round time outside forward/backward (prox-kernel time in brackets, as a share of round "
                  "time):", "",
              "| K | " + " | ".join(algorithms) + " |", "|---|" + "---|" * len(algorithms)]
    for K in Ks:
        cells = []
        for a in algorithms:
            r = by.get((a, K))
            cells.append("–" if r is None else
                         f"{100 * r['outside_share']:.2f} % ({100 * r['prox_s'] / r['total_s']:.2f} %)")
        lines.append(f"| {K} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--K", type=int, nargs="+", default=[10, 20, 40, 80], help="local steps (default 10 20 40 80)")
    p.add_argument("--rounds", type=int, default=2, help="communication rounds T per run (default 2)")
    p.add_argument("--clients", type=int, default=10, help="number of clients (default 10)")
    p.add_argument("--samples", type=int, default=256, help="samples per client (default 256)")
    p.add_argument("--batch-size", type=int, default=32, help="minibatch size (default 32)")
    p.add_argument("--lr", type=float, default=0.01, help="local step β = η = η_c (default 0.01)")
    p.add_argument("--repeat", type=int, default=1, help="repeat the sweep, keep the fastest run per cell (default 1)")
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    p.add_argument("--threads", type=int, default=0, help="torch and fedkernels threads (default: leave as is)")
    p.add_argument("--out", default=None, help="also write the markdown tables to this file")
    args = p.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
        fk.set_num_threads(args.threads)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    log(f"torch threads {torch.get_num_threads()}, fedkernels {fk.backend_info().get('simd')}; "
        f"CNN {sum(q.numel() for q in CNN().parameters()):,} parameters, {args.clients} clients, "
        f"batch {args.batch_size}, T = {args.rounds}, repeat {args.repeat}")
    t0 = time.perf_counter()
    results = run_table(args.K, args.rounds, num_clients=args.clients, samples=args.samples,
                        batch_size=args.batch_size, lr=args.lr, algorithms=args.algorithms,
                        repeat=args.repeat, log=log)
    table = markdown(results)
    print(table)
    log(f"done in {time.perf_counter() - t0:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
