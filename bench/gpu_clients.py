"""Seconds per round of the client executors on one device: the batched executor against the
sequential one and a plain PyTorch loop (FedAvg, 100 MLP clients), and pfl-research's CIFAR-10
benchmark configuration in client updates per second.

    python -m bench.gpu_clients --json bench/results/gpu_check/clients.json          # on a GPU
    python -m bench.gpu_clients --device cpu --clients 4 --rounds 1 --cifar10-clients 4   # smoke

**MLP** (the clients table's setting, ``bench/clients.py``): ``--clients`` (default 100) clients of
``--samples`` (default 256) MNIST-shaped synthetic samples, the MLP (109,386 parameters), FedAvg
with K = ``--local-steps`` (default 10) minibatch steps of ``--batch`` (default 32), lr 0.01, no
metric passes. Rows: the sequential and batched executors, and the plain PyTorch loop of
``bench.clients`` (``copy.deepcopy(model)`` + ``torch.optim.SGD`` per client, what most FL code does).

**CIFAR-10** (``bench.clients.WORKLOADS["cifar10"]``, as ``python -m bench.peers --workload cifar10``):
pfl-research's CNN (1,626,442 parameters, two dropout layers), ``--cifar10-clients`` (default 1,000)
clients of 50 synthetic 3x32x32 images, 50 sampled per round, one local epoch of batch 10 (K = 5).
Its measure is client updates per second: clients per round / seconds per round. Where pfl-research
(PyPI ``pfl``) is importable, its own FedAvg runs the same configuration in a child process
(``bench.pfl_fedavg``, data on the device, pfl training on the GPU; median round after the first).

Each executor first runs one untimed round (allocations, first launches, kernel loading), then
``--rounds`` (default 5) rounds from the same initial model, timed as a whole with the device
synchronized before and after (``simulate``'s per-round ``wall_time`` does not wait for queued GPU
work). The plain loop runs ``--rounds`` rounds, synchronizes after every round and reports the median
round after its first.
All three draw the same cohorts and minibatches, so on the MLP their final models agree up to
summation order: the largest difference from the sequential executor's is reported. (The CIFAR-10
CNN draws dropout masks, which differ between them.)

Executors are looked up at run time in ``python_algos.clients.EXECUTORS``; without a "batched"
entry only the sequential and loop rows are measured and the comparison is reported as skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

import python_algos as pa
from python_algos.clients import EXECUTORS

from .clients import ALGORITHMS, WORKLOADS, Workload, input_shape, make_clients, make_model, time_plain_loop

MODEL, ALGORITHM, LR = "mlp", "FedAvg", 0.01
LOOP = "plain loop"
PFL_MISSING = ("pfl is not installed: carry its wheels to include it (docs/install.md, 'GPU check'); it is "
               "never a dependency of fedkernels")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_executor(name: str, clients, device, *, rounds: int, local_steps: int, batch: int, model: str = MODEL,
                  clients_per_round: Optional[int] = None) -> dict:
    def once(r):
        net = make_model(model, device)
        _sync(device)
        t0 = time.perf_counter()
        hist = pa.simulate(ALGORITHMS[ALGORITHM](LR, local_steps), net, F.cross_entropy, clients, r,
                           batch_size=batch, seed=0, metrics_every=0, executor=name,
                           clients_per_round=clients_per_round)
        _sync(device)
        return time.perf_counter() - t0, hist

    once(1)  # warm-up
    seconds, hist = once(rounds)
    return {"executor": name, "ran_as": getattr(hist, "executor", name), "rounds": rounds, "seconds": seconds,
            "s_per_round": seconds / rounds, "params": hist.params.detach().cpu()}


def time_loop(clients, device, *, rounds: int, local_steps: int, batch: int, model: str = MODEL,
              clients_per_round: Optional[int] = None) -> dict:
    # `rounds` rounds, as the executors' timed run, so that the final models compare; the median
    # leaves out the first round (first launches), except in a one-round smoke run
    r = time_plain_loop(model, clients, K=local_steps, batch=batch, rounds=rounds, lr=LR, device=device,
                        clients_per_round=clients_per_round)
    return {"executor": LOOP, "ran_as": LOOP, "rounds": rounds, "s_per_round": r["s_per_round"],
            "params": r["params"].detach().cpu()}


def _rows(clients, device, *, model: str, rounds: int, local_steps: int, batch: int, cohort: Optional[int],
          log, label: str) -> tuple:
    """Sequential, batched (where registered) and the plain loop on ``clients``: (rows, final models)."""
    names = ["sequential"] + (["batched"] if "batched" in EXECUTORS else [])
    common = dict(rounds=rounds, local_steps=local_steps, batch=batch, model=model, clients_per_round=cohort)
    rows, params = [], {}
    for name in names + [LOOP]:
        r = (time_loop(clients, device, **common) if name == LOOP
             else time_executor(name, clients, device, **common))
        params[name] = r.pop("params")
        rows.append(r)
        log(f"  {label} {name:<10} {r['s_per_round']:.4f} s/round ({device})")
    return rows, params


def pfl_row(w: Workload, device, *, rounds: int, log=print) -> Optional[dict]:
    """pfl-research's own FedAvg on ``w`` in one process (``bench.pfl_fedavg``; pfl trains on the GPU
    when torch sees one), or None where pfl is not installed. A failed run is a row with its reason."""
    from . import peers

    if not peers.pfl_available():
        log(f"  pfl row left out: {PFL_MISSING}")
        return None
    args = argparse.Namespace(rounds=rounds, lr=LR, timeout=600)
    res, reason = peers.launch_retrying("bench.pfl_fedavg", 1, w, args, ("--device", str(device)), log)
    if res is None:
        return {"executor": "pfl", "ran_as": "pfl", "failure": reason}
    row = {"executor": f"pfl {res['pfl_version']}", "ran_as": f"pfl on {res.get('device', '?')}",
           "rounds": rounds, "s_per_round": statistics.median(res["round_s"][1:])}
    log(f"  cifar10 {row['executor']} {row['s_per_round']:.4f} s/round ({row['ran_as']})")
    return row


def run_cifar10(w: Workload, device, *, rounds: int, pfl: bool = True, log=print) -> dict:
    """pfl-research's CIFAR-10 configuration ``w`` on ``device``: client updates per second of our
    executors, the plain loop and (``pfl``, where installed) pfl-research itself."""
    data = make_clients(w.clients, w.samples, device=device, in_shape=input_shape(w.model))
    cohort = w.cohort if w.cohort < w.clients else None
    rows, _ = _rows(data, device, model=w.model, rounds=rounds, local_steps=w.K, batch=w.batch, cohort=cohort,
                    log=log, label="cifar10")
    del data
    if device.type == "cuda":  # pfl's child process allocates its own copy: give back our cached blocks
        torch.cuda.empty_cache()
    failed, pfl_status = [], "left out"
    if pfl:
        row = pfl_row(w, device, rounds=rounds, log=log)
        if row is None:
            pfl_status = PFL_MISSING
        elif "failure" in row:
            failed.append(row)
            pfl_status = row["failure"]
        else:
            rows.append(row)
            pfl_status = "measured"
    for r in rows:
        r["client_updates_per_s"] = w.cohort / r["s_per_round"]
    out = {"workload": dataclasses.asdict(w), "description": w.describe(), "rounds": rounds, "rows": rows,
           "failed": failed, "params": sum(p.numel() for p in make_model(w.model).parameters()), "pfl": pfl_status}
    best = max((r for r in rows if r["executor"] in EXECUTORS), key=lambda r: r["client_updates_per_s"])
    out["best"] = {"executor": best["executor"], "client_updates_per_s": best["client_updates_per_s"]}
    log(f"  cifar10: fedkernels' best, {best['executor']}, at {best['client_updates_per_s']:.1f} client updates/s")
    return out


def run(*, device="cuda", clients: int = 100, samples: int = 256, rounds: int = 5, local_steps: int = 10,
        batch: int = 32, cifar10: Optional[Workload] = WORKLOADS["cifar10"], pfl: bool = True, log=print) -> dict:
    device = torch.device(device)
    data = make_clients(clients, samples, device=device)
    out = {"device": str(device), "clients": clients, "samples": samples, "rounds": rounds, "local_steps": local_steps,
           "batch": batch, "model": MODEL, "algorithm": ALGORITHM, "lr": LR,
           "params": sum(p.numel() for p in make_model(MODEL).parameters()),
           "executors_available": sorted(EXECUTORS)}
    out["rows"], params = _rows(data, device, model=MODEL, rounds=rounds, local_steps=local_steps, batch=batch,
                                cohort=None, log=log, label="mlp")
    seq = out["rows"][0]["s_per_round"]
    for r in out["rows"][1:]:
        r["max_abs_diff"] = float((params[r["executor"]] - params["sequential"]).abs().max())
    if "batched" in params:
        bat = out["rows"][1]["s_per_round"]
        out["speedup"] = seq / bat if bat > 0 else float("nan")
        out["max_abs_diff"] = out["rows"][1]["max_abs_diff"]
        log(f"  batched is {out['speedup']:.1f}x the sequential speed; final models differ by at most "
            f"{out['max_abs_diff']:.2e}")
    else:
        out["skipped"] = ("python_algos.clients.EXECUTORS has no 'batched' executor (available: "
                          + ", ".join(sorted(EXECUTORS)) + ")")
        log("  " + out["skipped"])
    del data
    if cifar10 is not None:
        out["cifar10"] = run_cifar10(cifar10, device, rounds=rounds, pfl=pfl, log=log)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--clients", type=int, default=100, help="MLP clients")
    ap.add_argument("--samples", type=int, default=256, help="samples per MLP client")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--local-steps", type=int, default=10, help="MLP local steps")
    ap.add_argument("--batch", type=int, default=32, help="MLP batch size")
    ap.add_argument("--cifar10-clients", type=int, default=WORKLOADS["cifar10"].clients,
                    help="clients of the CIFAR-10 configuration (50 of them, or all if fewer, per round)")
    ap.add_argument("--no-cifar10", action="store_true", help="leave out the CIFAR-10 configuration")
    ap.add_argument("--no-pfl", action="store_true", help="leave out pfl-research's row of the CIFAR-10 configuration")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    for flag in ("clients", "samples", "rounds", "local_steps", "batch", "cifar10_clients"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_clients: --device cuda needs a CUDA GPU visible to torch (none here)", file=sys.stderr)
        return 2
    res = run(device=args.device, clients=args.clients, samples=args.samples, rounds=args.rounds,
              local_steps=args.local_steps, batch=args.batch, cifar10=cifar10_workload(args.cifar10_clients,
                                                                                      args.no_cifar10),
              pfl=not args.no_pfl)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


def cifar10_workload(clients: int, leave_out: bool = False) -> Optional[Workload]:
    """The CIFAR-10 configuration with ``clients`` clients (a cohort of 50, or all of them if fewer)."""
    if leave_out:
        return None
    w = WORKLOADS["cifar10"]
    return dataclasses.replace(w, clients=clients, cohort=min(w.cohort, clients))


if __name__ == "__main__":
    sys.exit(main())
