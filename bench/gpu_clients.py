"""Seconds per round of the batched client executor against the sequential one (FedAvg, MLP).

    python -m bench.gpu_clients --json bench/results/gpu_check/clients.json          # on a GPU
    python -m bench.gpu_clients --device cpu --clients 4 --rounds 1                    # smoke

The setting of the clients table (``bench/clients.py``): ``--clients`` (default 100) clients of
``--samples`` (default 256) MNIST-shaped synthetic samples, the MLP (109,386 parameters), FedAvg
with K = ``--local-steps`` (default 10) minibatch steps of ``--batch`` (default 32), lr 0.01, no
metric passes. Each executor first runs one untimed round (allocations, first launches, kernel
loading), then ``--rounds`` (default 5) rounds from the same initial model, timed as a whole with
the device synchronized before and after (``simulate``'s per-round ``wall_time`` does not wait for
queued GPU work). Both executors draw the same minibatches, so their final models agree up to
summation order; the largest difference is reported.

Executors are looked up at run time in ``python_algos.clients.EXECUTORS``; without a "batched"
entry only the sequential row is measured and the comparison is reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

import python_algos as pa
from python_algos.clients import EXECUTORS

from .clients import ALGORITHMS, make_clients, make_model

MODEL, ALGORITHM, LR = "mlp", "FedAvg", 0.01


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_executor(name: str, clients, device, *, rounds: int, local_steps: int, batch: int) -> dict:
    def once(r):
        model = make_model(MODEL, device)
        _sync(device)
        t0 = time.perf_counter()
        hist = pa.simulate(ALGORITHMS[ALGORITHM](LR, local_steps), model, F.cross_entropy, clients, r,
                           batch_size=batch, seed=0, metrics_every=0, executor=name)
        _sync(device)
        return time.perf_counter() - t0, hist

    once(1)  # warm-up
    seconds, hist = once(rounds)
    return {"executor": name, "ran_as": getattr(hist, "executor", name), "rounds": rounds, "seconds": seconds,
            "s_per_round": seconds / rounds, "params": hist.params.detach().cpu()}


def run(*, device="cuda", clients: int = 100, samples: int = 256, rounds: int = 5, local_steps: int = 10,
        batch: int = 32, log=print) -> dict:
    device = torch.device(device)
    data = make_clients(clients, samples, device=device)
    out = {"device": str(device), "clients": clients, "samples": samples, "rounds": rounds, "local_steps": local_steps,
           "batch": batch, "model": MODEL, "algorithm": ALGORITHM, "lr": LR,
           "params": sum(p.numel() for p in make_model(MODEL).parameters()),
           "executors_available": sorted(EXECUTORS), "rows": []}
    names = ["sequential"] + (["batched"] if "batched" in EXECUTORS else [])
    params = {}
    for name in names:
        r = time_executor(name, data, device, rounds=rounds, local_steps=local_steps, batch=batch)
        params[name] = r.pop("params")
        out["rows"].append(r)
        log(f"  {name:<10} {r['s_per_round']:.4f} s/round ({clients} clients, {ALGORITHM} K={local_steps}, {device})")
    if "batched" in params:
        seq = out["rows"][0]["s_per_round"]
        bat = out["rows"][1]["s_per_round"]
        out["speedup"] = seq / bat if bat > 0 else float("nan")
        out["max_abs_diff"] = float((params["batched"] - params["sequential"]).abs().max())
        log(f"  batched is {out['speedup']:.1f}x the sequential speed; final models differ by at most "
            f"{out['max_abs_diff']:.2e}")
    else:
        out["skipped"] = ("python_algos.clients.EXECUTORS has no 'batched' executor (available: "
                          + ", ".join(sorted(EXECUTORS)) + ")")
        log("  " + out["skipped"])
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--samples", type=int, default=256, help="samples per client")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--local-steps", type=int, default=10)
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
