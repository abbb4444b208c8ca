"""The peers table: one FedAvg round of our executors side by side with pfl-research's simulator.

    python -m bench.peers                        # ~1 min on 2 cores; pfl rows where pfl is installed
    python -m bench.peers --readme docs/performance.md   # also refresh the peers table there
    python -m bench.peers --no-pfl               # our rows only

The workload of ``bench.clients_table``: the 109,386-parameter MLP, N = 100 MNIST-shaped clients x
256 samples, FedAvg with local SGD (lr ``--lr``), batch 32, float32, 1 torch thread per process.
pfl's local loop walks a client's data once per epoch and stops there, so every contender runs one
local epoch: K = 256 / 32 = 8 steps per client and round. Contenders, timed in one run:

* fedkernels ``sequential`` and ``batched`` executors (``python_algos.simulate``), one process;
* the plain PyTorch loop of ``bench.clients`` (``copy.deepcopy(model)`` + ``torch.optim.SGD`` per client);
* pfl (PyPI ``pfl``, its ``FederatedAveraging`` + ``SimulatedBackend``; ``bench/pfl_fedavg.py``) in
  one process, and on 2 processes joined by pfl itself under ``torchrun`` (gloo);
* fedkernels on 2 processes (``executor="distributed"`` under ``torchrun``) where this checkout has it.

Each reports the median seconds per round over ``--rounds`` rounds after one untimed warm-up round
(pfl's warm-up round also evaluates). The training loss over all clients' data after the last round
shows that the contenders did comparable work: the same model, data, start and lr, but different
minibatches (python_algos draws random batches, pfl walks the data in order), so losses agree
closely, not bitwise. pfl is never a dependency of fedkernels: without it the pfl rows are left out
and the script says how to install it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

import fedkernels as fk

from .bandwidth import machine_info, machine_line
from .clients import make_clients, make_model, time_executor, time_plain_loop
from .readme_block import markers, publish

README_BEGIN, README_END = markers("peers-table")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PFL_INSTALL = ("pfl-research is not installed here, so its rows are left out. To time it, in a separate "
               "virtual environment that already has this project and a CPU torch: "
               "`pip install pfl==0.6.0` (pfl needs torch only through its [pytorch] extra, so the "
               "installed torch stays), then run `python -m bench.peers` there.")


def pfl_available() -> bool:
    return importlib.util.find_spec("pfl") is not None


def distributed_available() -> bool:
    """Whether this checkout's python_algos can run one simulation on several processes."""
    import python_algos.clients as pc

    return hasattr(pc, "DistributedClients")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


@torch.no_grad()
def training_loss(params: torch.Tensor, clients) -> float:
    """Mean cross-entropy over every sample of every client of the MLP with flat ``params``."""
    model = make_model("mlp")
    torch.nn.utils.vector_to_parameters(params.to(torch.float32), model.parameters())
    total = sum(F.cross_entropy(model(X), y, reduction="sum").item() for X, y in clients)
    return total / sum(len(y) for _, y in clients)


def fedavg_in_order(clients, *, batch: int, rounds: int, lr: float) -> torch.Tensor:
    """FedAvg as a plain PyTorch loop that walks each client's data in order, one epoch per round
    (deepcopy + SGD per client; x <- mean of the local models): what pfl's FedAvg computes, written
    independently of pfl, to check that its rows did the same work."""
    import copy

    model = make_model("mlp")
    for _ in range(rounds):
        total = [torch.zeros_like(q) for q in model.parameters()]
        for X, y in clients:
            local = copy.deepcopy(model)
            opt = torch.optim.SGD(local.parameters(), lr=lr)
            for s in range(0, len(y), batch):
                opt.zero_grad()
                F.cross_entropy(local(X[s:s + batch]), y[s:s + batch]).backward()
                opt.step()
            with torch.no_grad():
                for t, q in zip(total, local.parameters()):
                    t.add_(q)
        with torch.no_grad():
            for q, t in zip(model.parameters(), total):
                q.copy_(t.div_(len(clients)))
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def _rel_dev(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.to(ref.dtype) - ref).norm() / ref.norm())


def _workload_args(args) -> List[str]:
    return ["--clients", str(args.clients), "--samples", str(args.samples), "--batch", str(args.batch),
            "--rounds", str(args.rounds + 1), "--lr", str(args.lr)]


def _launch(module: str, procs: int, args, log, extra=()) -> dict:
    """Run ``python -m module`` in one process (``procs`` 1) or ``procs`` ranks under torchrun; the
    rank-0 result file it writes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        launcher = [] if procs == 1 else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                          str(procs)]
        cmd = [sys.executable, *launcher, "-m", module, *_workload_args(args), *extra, "--out", out]
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([REPO_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
            raise RuntimeError(f"`{' '.join(cmd[1:])}` exited {proc.returncode}:\n" + "\n".join(tail))
        with open(out) as f:
            return json.load(f)


def _row(name: str, procs: int, s_per_round: float, params: torch.Tensor, clients, ref_name: str,
         ref: torch.Tensor, **extra) -> dict:
    return {"name": name, "procs": procs, "s_per_round": s_per_round, "loss": training_loss(params, clients),
            "reference": ref_name, "rel_dev": _rel_dev(params, ref), **extra}


def run(args, log=print) -> dict:
    torch.set_num_threads(1)
    fk.set_num_threads(1)
    up_before = uptime()
    info = machine_info()
    clients = make_clients(args.clients, args.samples)
    K = args.samples // args.batch  # one local epoch: what pfl's local loop runs
    rows, notes = [], []
    common = dict(K=K, batch=args.batch, rounds=args.rounds + 1, lr=args.lr)
    seq = None
    for ex in ("sequential", "batched"):
        r = time_executor("mlp", "FedAvg", clients, ex, **common)
        seq = r["params"] if seq is None else seq
        rows.append(_row(f"fedkernels {ex}", 1, r["s_per_round"], r["params"], clients, "sequential", seq))
        log(f"fedkernels {ex}: {r['s_per_round']:.3f} s/round")
    r = time_plain_loop("mlp", clients, **common)
    rows.append(_row("plain PyTorch loop (deepcopy + SGD)", 1, r["s_per_round"], r["params"], clients,
                     "sequential", seq))
    log(f"plain loop: {r['s_per_round']:.3f} s/round")

    launches = []
    if args.no_pfl:
        notes.append("pfl rows skipped (`--no-pfl`).")
    elif not pfl_available():
        notes.append(PFL_INSTALL)
        log(PFL_INSTALL)
    else:
        launches += [("pfl", "bench.pfl_fedavg", 1, ()), ("pfl", "bench.pfl_fedavg", args.procs, ())]
        in_order = fedavg_in_order(clients, batch=args.batch, rounds=args.rounds + 1, lr=args.lr)
    if distributed_available():
        for inner in ("sequential", "batched"):  # the executor each rank runs its clients with
            launches.append((f"fedkernels {inner}", "bench.fk_distributed_fedavg", args.procs, ("--inner", inner)))
    else:
        notes.append("fedkernels on several processes: not in this checkout (no `executor=\"distributed\"`), "
                     "row left out.")
    for label, module, procs, extra in launches:
        try:
            res = _launch(module, procs, args, log, extra)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            notes.append(f"{label} on {procs} process(es) failed: {e}")
            log(notes[-1])
            continue
        timed = res["round_s"][1:]
        name = f"pfl {res['pfl_version']}" if label == "pfl" else label
        name += " in one process" if procs == 1 else f" on {procs} processes (torchrun, gloo)"
        ref_name, ref = ("in-order loop", in_order) if label == "pfl" else ("sequential", seq)
        rows.append(_row(name, procs, statistics.median(timed), torch.tensor(res["params"]), clients, ref_name,
                         ref, threads=res.get("threads")))
        log(f"{name}: {rows[-1]['s_per_round']:.3f} s/round")
    start_loss = training_loss(torch.nn.utils.parameters_to_vector(make_model("mlp").parameters()), clients)
    return {"machine": info, "uptime_before": up_before, "uptime_after": uptime(), "threads": 1,
            "clients": args.clients, "samples": args.samples, "batch": args.batch, "K": K,
            "rounds": args.rounds, "lr": args.lr, "start_loss": start_loss, "rows": rows, "notes": notes,
            "load_after": list(os.getloadavg())}


def render_markdown(res: dict) -> str:
    m = res["machine"]
    ref = next((r["s_per_round"] for r in res["rows"] if r["name"] == "fedkernels batched"), None)
    lines = [
        f"FedAvg, MLP (109,386 parameters), {res['clients']} clients x {res['samples']} samples, one local epoch "
        f"(K = {res['K']} steps of batch {res['batch']}), lr {res['lr']}, float32, 1 torch thread per process; "
        f"median of {res['rounds']} rounds after a warm-up round. {machine_line(m)}. "
        f"`uptime` before: {res['uptime_before']}; after: {res['uptime_after']}; {m['date']}. "
        "`python -m bench.peers`.",
        "",
        f"| contender | processes | s / round | × fedkernels batched | training loss after {res['rounds'] + 1} rounds "
        "| final model vs reference (rel. dev.) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in res["rows"]:
        ratio = "–" if ref is None else f"{r['s_per_round'] / ref:.2f}×"
        dev = "–" if r["name"] == "fedkernels sequential" else f"{r['rel_dev']:.1e} ({r['reference']})"
        lines.append(f"| {r['name']} | {r['procs']} | {r['s_per_round']:.3f} | {ratio} | {r['loss']:.4f} | {dev} |")
    lines += ["", f"Training loss: mean cross-entropy over all {res['clients'] * res['samples']:,} samples "
                  f"(start: {res['start_loss']:.4f}). python_algos and the plain loop draw the same random "
                  "minibatches (reference: the sequential executor's final model); pfl walks each client's data in "
                  "order, so its loss is close to ours but not equal, and its reference is a plain PyTorch FedAvg "
                  "loop that walks the data in order the same way (in `bench/peers.py`, independent of pfl). "
                  "Rel. dev.: ‖x − x_ref‖ / ‖x_ref‖ of the final models, float32."]
    if res["notes"]:
        lines += [""] + [f"* {n}" for n in res["notes"]]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--samples", type=int, default=256, help="samples per client (one local epoch = samples / batch steps)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds, after one warm-up round")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--procs", type=int, default=2, help="processes of the multi-process rows")
    p.add_argument("--no-pfl", action="store_true", help="leave out the pfl rows")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed for each launched run")
    p.add_argument("--out", default="bench/results/peers_table.md")
    p.add_argument("--readme", default=None, help="also replace the peers table block in this file")
    args = p.parse_args(argv)
    for flag, v, lo in (("--clients", args.clients, 1), ("--samples", args.samples, 1), ("--batch", args.batch, 1),
                        ("--rounds", args.rounds, 1), ("--procs", args.procs, 2)):
        if v < lo:
            p.error(f"{flag} must be at least {lo}, got {v}")
    if args.samples % args.batch:
        p.error(f"--samples ({args.samples}) must be a multiple of --batch ({args.batch}): every contender "
                "runs one whole local epoch")
    if not args.lr > 0:
        p.error(f"--lr must be positive, got {args.lr}")
    if args.readme and not os.path.isfile(args.readme):
        p.error(f"--readme {args.readme}: no such file")
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    res = run(args, log)
    md = render_markdown(res)
    publish(md, res, args.out, args.readme, README_BEGIN, README_END)


if __name__ == "__main__":
    main()
