"""Seconds per round of the batched client executor against the sequential one (FedAvg, MLP).

    python -m bench.gpu_clients --json bench/results/gpu_check/clients.json          # on a GPU
    python -m bench.gpu_clients --device cpu --clients 4 --rounds 1                    # smoke

Setting: ``--clients`` (default 100) clients of ``--samples`` (default 64) MNIST-shaped synthetic
samples each (class means plus noise, as bench/table_v.py), the MLP (784-128-64-10, 109,386
parameters), FedAvg with K = ``--local-steps`` (default 5) minibatch steps of ``--batch`` (default
32), no metric passes. Each executor first runs one untimed round (allocations, first launches),
then ``--rounds`` (default 5) timed rounds from the same initial model; s/round is the wall time of
``simulate`` over them (synchronized), divided by the rounds. Both executors draw the same
minibatches, so their final models agree up to summation order; the largest difference is
reported beside the times.

Executors are looked up at run time in ``python_algos.clients.EXECUTORS``; without a "batched"
entry only the sequential row is measured and the comparison is reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import List, Optional, Sequence

import torch
from torch import nn

import python_algos as pa
from python_algos.clients import EXECUTORS
from python_algos.experiments.models import build_model, count_parameters

INPUT = (1, 28, 28)


def make_clients(num_clients: int, samples: int, seed: int = 0) -> List[tuple]:
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(10, *INPUT, generator=g)
    out = []
    for _ in range(num_clients):
        y = torch.randint(0, 10, (samples,), generator=g)
        out.append((means[y] + torch.randn(samples, *INPUT, generator=g), y))
    return out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_executor(name: str, clients, device, *, rounds: int, local_steps: int, batch: int, lr: float) -> dict:
    def once(r):
        torch.manual_seed(0)
        model = build_model("mlp", INPUT).to(device)
        _sync(device)
        t0 = time.perf_counter()
        hist = pa.simulate(pa.FedAvg(lr_local=lr, local_steps=local_steps), model, nn.functional.cross_entropy,
                           clients, r, batch_size=batch, seed=0, metrics_every=0, executor=name)
        _sync(device)
        return time.perf_counter() - t0, hist

    once(1)  # warm-up
    seconds, hist = once(rounds)
    return {"executor": name, "ran_as": getattr(hist, "executor", name), "rounds": rounds, "seconds": seconds,
            "s_per_round": seconds / rounds, "params": hist.params.detach().cpu()}


def run(*, device="cuda", clients: int = 100, samples: int = 64, rounds: int = 5, local_steps: int = 5,
        batch: int = 32, lr: float = 0.05, log=print) -> dict:
    device = torch.device(device)
    data = make_clients(clients, samples)
    out = {"device": str(device), "clients": clients, "samples": samples, "rounds": rounds, "local_steps": local_steps,
           "batch": batch, "model": "mlp", "params": count_parameters(build_model("mlp", INPUT)),
           "executors_available": sorted(EXECUTORS), "rows": []}
    names = ["sequential"] + (["batched"] if "batched" in EXECUTORS else [])
    params = {}
    for name in names:
        r = time_executor(name, data, device, rounds=rounds, local_steps=local_steps, batch=batch, lr=lr)
        params[name] = r.pop("params")
        out["rows"].append(r)
        log(f"  {name:<10} {r['s_per_round']:.4f} s/round ({clients} clients, FedAvg K={local_steps}, {device})")
    if "batched" in params:
        seq = out["rows"][0]["s_per_round"]
        bat = out["rows"][1]["s_per_round"]
        out["speedup"] = seq / bat if bat > 0 else float("nan")
        out["max_abs_diff"] = float((params["batched"] - params["sequential"]).abs().max())
        log(f"  batched / sequential: {out['speedup']:.1f}x faster; final models differ by at most {out['max_abs_diff']:.2e}")
    else:
        out["skipped"] = ("python_algos.clients.EXECUTORS has no 'batched' executor (available: "
                          + ", ".join(sorted(EXECUTORS)) + ")")
        log("  " + out["skipped"])
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--samples", type=int, default=64, help="samples per client")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    for flag in ("clients", "samples", "rounds", "local_steps", "batch"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_clients: --device cuda needs a CUDA GPU visible to torch (none here)", file=sys.stderr)
        return 2
    res = run(device=args.device, clients=args.clients, samples=args.samples, rounds=args.rounds,
              local_steps=args.local_steps, batch=args.batch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
