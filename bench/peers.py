"""The peers table: one FedAvg round of our executors side by side with pfl-research's simulator.

    python -m bench.peers                        # ~1 min on 2 cores; pfl rows where pfl is installed
    python -m bench.peers --readme docs/performance.md   # also refresh the peers table there
                                                         # (cross-device: the block "peers-cross-device-table")
    python -m bench.peers --no-pfl               # our rows only
    python -m bench.peers --workload cross-device   # 1,000 clients, 100 per round, logistic regression
    python -m bench.peers --workload cifar10        # pfl-research's CIFAR-10 benchmark configuration (~5 min)

Workloads (``bench.clients.WORKLOADS``), FedAvg with local SGD (lr ``--lr``), float32, 1 torch thread
per process:

* ``mlp`` (default): the workload of ``bench.clients_table``, the 109,386-parameter MLP, N = 100
  MNIST-shaped clients x 256 samples, batch 32. pfl's local loop walks a client's data once per
  epoch and stops there, so every contender runs one local epoch: K = 256 / 32 = 8 steps. Bound by
  arithmetic.
* ``cross-device``: 1,000 clients x 32 samples, 100 sampled per round, logistic regression (7,850
  parameters), K = 5 local steps of batch 8 (pfl walks each sampled user's 32 samples and again its
  first 8). Bound by per-client overhead, where a simulator earns its keep.
* ``cifar10``: the configuration of pfl-research's CIFAR-10 benchmark: its CNN (1,626,442 parameters,
  ``bench.clients.CifarCNN``, with its two dropout layers), 1,000 clients x 50 synthetic 3x32x32
  images (CIFAR-10's 50,000 training images as 1,000 users), 50 sampled per round, one local epoch
  of batch 10 (K = 5). Bound by convolution arithmetic. The training loss is taken over the first
  100 clients' 5,000 samples (a pass over all 50,000 would take longer than the rounds).

Contenders, timed in one run:

* fedkernels ``sequential`` and ``batched`` executors (``python_algos.simulate``), one process;
* the plain PyTorch loop of ``bench.clients`` (``copy.deepcopy(model)`` + ``torch.optim.SGD`` per client);
* pfl (PyPI ``pfl``, its ``FederatedAveraging`` + ``SimulatedBackend``; ``bench/pfl_fedavg.py``) in
  one process, and on 2 processes joined by pfl itself under ``torchrun`` (gloo);
* fedkernels on 2 processes (``executor="distributed"`` under ``torchrun``) where this checkout has it.

Each reports the median seconds per round over ``--rounds`` rounds after one untimed warm-up round
(pfl's warm-up round also evaluates), and the client updates per second it makes of them (clients per
round / seconds per round). The FLOP floor column is the round's forward+backward FLOPs
(torch's flop counter on one client step, x clients per round x K) at ``torch.bmm``'s rate measured in
the same run (as ``bench.clients_table``), divided by the process count for the multi-process rows.
A launched run that fails is retried once; a second failure is a row with its reason. The training loss over all
clients' data after the last round shows that the contenders did comparable work: the same model, data, start and
lr, but different minibatches (python_algos draws random batches, pfl walks the data in order), so losses agree
closely, not bitwise. pfl is never a dependency of fedkernels: without it the pfl rows are left out
and the script says how to install it.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from .clients import (
    WORKLOADS,
    Workload,
    bmm_rate,
    flops_per_step,
    input_shape,
    make_clients,
    make_model,
    time_executor,
    time_plain_loop,
)
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
def training_loss(params: torch.Tensor, clients, model_name: str = "mlp") -> float:
    """Mean cross-entropy over every sample of every client of ``model_name`` with flat ``params``
    (in eval mode: dropout off)."""
    model = make_model(model_name).eval()
    torch.nn.utils.vector_to_parameters(params.to(torch.float32), model.parameters())
    total = sum(F.cross_entropy(model(X), y, reduction="sum").item() for X, y in clients)
    return total / sum(len(y) for _, y in clients)


def fedavg_in_order(clients, *, batch: int, rounds: int, lr: float, model_name: str = "mlp") -> torch.Tensor:
    """FedAvg as a plain PyTorch loop that walks each client's data in order, one epoch per round
    (deepcopy + SGD per client; x <- mean of the local models): what pfl's FedAvg computes, written
    independently of pfl, to check that its rows did the same work."""
    import copy

    model = make_model(model_name)
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


def _workload_args(w: Workload, args) -> List[str]:
    return ["--clients", str(w.clients), "--samples", str(w.samples), "--batch", str(w.batch), "--steps", str(w.K),
            "--cohort", str(w.cohort), "--model", w.model, "--rounds", str(args.rounds + 1), "--lr", str(args.lr)]


def _launch(module: str, procs: int, w: Workload, args, extra=()) -> dict:
    """Run ``python -m module`` in one process (``procs`` 1) or ``procs`` ranks under torchrun; the
    rank-0 result file it writes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        launcher = [] if procs == 1 else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                          str(procs)]
        cmd = [sys.executable, *launcher, "-m", module, *_workload_args(w, args), *extra, "--out", out]
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([REPO_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
            raise RuntimeError(f"`{' '.join(cmd[1:])}` exited {proc.returncode}:\n" + "\n".join(tail))
        with open(out) as f:
            return json.load(f)


def _row(name: str, procs: int, s_per_round: float, params: torch.Tensor, clients, model_name: str, ref_name: str,
         ref: Optional[torch.Tensor], **extra) -> dict:
    """``clients``: those the training loss is taken over (``loss_clients``)."""
    return {"name": name, "procs": procs, "s_per_round": s_per_round,
            "loss": training_loss(params, clients, model_name), "reference": ref_name,
            "rel_dev": None if ref is None else _rel_dev(params, ref), **extra}


def _failed_row(name: str, procs: int, reason: str) -> dict:
    return {"name": name, "procs": procs, "s_per_round": None, "failure": reason}


def launch_retrying(module: str, procs: int, w: Workload, args, extra, log):
    """``python -m module`` on workload ``w`` in ``procs`` processes (``args``: ``rounds`` timed after
    a warm-up, ``lr``, ``timeout`` s): (its result, None), or (None, reason) after a failure and one
    retry."""
    reasons = []
    for attempt in (1, 2):
        try:
            return _launch(module, procs, w, args, extra), None
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            reasons.append(f"attempt {attempt}: {reason}")
            log(f"{module} on {procs} process(es) failed (attempt {attempt}): {e}")
    return None, "; ".join(reasons)


# Workloads whose local work is one epoch (what pfl's loop runs): K = samples / batch unless -K is given.
ONE_EPOCH = ("mlp", "cifar10")
# Clients whose samples the training loss is taken over (None: all): a CNN pass over all 50,000
# CIFAR-shaped samples would take longer than the timed rounds.
LOSS_CLIENTS = {"cifar10": 100}


def workload_from_args(args) -> Workload:
    """--workload's shape, with --clients / --samples / --batch / -K / --cohort where given."""
    w = WORKLOADS[args.workload]
    given = {k: getattr(args, k) for k in ("clients", "samples", "batch", "K", "cohort")
             if getattr(args, k) is not None}
    if args.workload in ONE_EPOCH and "K" not in given:
        given["K"] = given.get("samples", w.samples) // given.get("batch", w.batch)
    if args.workload == "mlp" and "cohort" not in given:
        given["cohort"] = given.get("clients", w.clients)
    if "cohort" not in given and given.get("clients", w.clients) < w.cohort:  # a small --clients: all of them
        given["cohort"] = given["clients"]
    return dataclasses.replace(w, **given)


def loss_clients(w: Workload, clients: list) -> list:
    """The clients whose samples the training loss is taken over."""
    return clients[: LOSS_CLIENTS.get(w.name, len(clients))]


def draws_random_numbers(model_name: str) -> str:
    """What the model's training pass draws at random ("" if nothing), probed by python_algos' own
    detector on a few zero inputs: then the executors, each drawing its own dropout masks, end at
    different models, not only up to summation order."""
    from python_algos.clients.separable import training_side_effects

    return training_side_effects(make_model(model_name), torch.zeros(4, *input_shape(model_name)))


def _in_process_rows(w: Workload, clients, args, log):
    """fedkernels sequential and batched, and the plain PyTorch loop (same cohorts and minibatches)."""
    rows, seq = [], None
    common = dict(K=w.K, batch=w.batch, rounds=args.rounds + 1, lr=args.lr,
                  clients_per_round=w.cohort if w.cohort < w.clients else None)
    scored = loss_clients(w, clients)
    for ex in ("sequential", "batched"):
        r = time_executor(w.model, "FedAvg", clients, ex, **common)
        seq = r["params"] if seq is None else seq
        rows.append(_row(f"fedkernels {ex}", 1, r["s_per_round"], r["params"], scored, w.model, "sequential", seq))
        log(f"fedkernels {ex}: {r['s_per_round']:.3f} s/round")
    r = time_plain_loop(w.model, clients, **common)
    rows.append(_row("plain PyTorch loop (deepcopy + SGD)", 1, r["s_per_round"], r["params"], scored, w.model,
                     "sequential", seq))
    log(f"plain loop: {r['s_per_round']:.3f} s/round")
    return rows, seq


def _launches(w: Workload, args, notes, log) -> list:
    out = []
    if args.no_pfl:
        notes.append("pfl rows skipped (`--no-pfl`).")
    elif not pfl_available():
        notes.append(PFL_INSTALL)
        log(PFL_INSTALL)
    else:
        out += [("pfl", "bench.pfl_fedavg", 1, ()), ("pfl", "bench.pfl_fedavg", args.procs, ())]
    if distributed_available():
        for inner in ("sequential", "batched"):  # the executor each rank runs its clients with
            out.append((f"fedkernels {inner}", "bench.fk_distributed_fedavg", args.procs, ("--inner", inner)))
    else:
        notes.append("fedkernels on several processes: not in this checkout (no `executor=\"distributed\"`), "
                     "row left out.")
    return out


def _launched_rows(w: Workload, clients, seq, args, notes, log) -> list:
    rows, in_order, scored = [], None, loss_clients(w, clients)
    for label, module, procs, extra in _launches(w, args, notes, log):
        where = " in one process" if procs == 1 else f" on {procs} processes (torchrun, gloo)"
        res, reason = launch_retrying(module, procs, w, args, extra, log)
        if res is None:
            rows.append(_failed_row(label + where, procs, reason))
            continue
        name = (f"pfl {res['pfl_version']}" if label == "pfl" else label) + where
        if label == "pfl":
            if in_order is None and w.cohort == w.clients:  # pfl's sampler picks its own cohorts otherwise
                in_order = fedavg_in_order(clients, batch=w.batch, rounds=args.rounds + 1, lr=args.lr,
                                           model_name=w.model)
            ref_name, ref = ("in-order loop", in_order) if w.cohort == w.clients else ("–", None)
        else:
            ref_name, ref = ("sequential", seq)
        rows.append(_row(name, procs, statistics.median(res["round_s"][1:]), torch.tensor(res["params"]), scored,
                         w.model, ref_name, ref, threads=res.get("threads")))
        log(f"{name}: {rows[-1]['s_per_round']:.3f} s/round")
    return rows


def run(args, log=print) -> dict:
    torch.set_num_threads(1)
    fk.set_num_threads(1)
    w = workload_from_args(args)
    up_before = uptime()
    info = machine_info()
    rate = bmm_rate("cpu")
    floor = w.cohort * w.K * flops_per_step(w.model, w.batch) / rate
    log(f"{w.describe()}; FLOP floor {floor:.4f} s/round at {rate / 1e9:.1f} GFLOP/s")
    clients = make_clients(w.clients, w.samples, in_shape=input_shape(w.model))
    notes = []
    drawn = draws_random_numbers(w.model)
    if drawn:
        notes.append(f"{drawn[0].upper()}{drawn[1:]}: each contender draws its own masks (the batched executor "
                     "one stream per client), so final models differ by more than summation order; compare the "
                     "training losses.")
    rows, seq = _in_process_rows(w, clients, args, log)
    rows += _launched_rows(w, clients, seq, args, notes, log)
    scored = loss_clients(w, clients)
    start_loss = training_loss(torch.nn.utils.parameters_to_vector(make_model(w.model).parameters()), scored, w.model)
    return {"machine": info, "uptime_before": up_before, "uptime_after": uptime(), "threads": 1,
            "workload": dataclasses.asdict(w), "description": w.describe(), "bmm_gflops": rate / 1e9,
            "flop_floor_s": floor, "clients": w.clients, "samples": w.samples, "batch": w.batch, "K": w.K,
            "rounds": args.rounds, "lr": args.lr, "start_loss": start_loss, "loss_clients": len(scored),
            "rows": rows, "notes": notes,
            "load_after": list(os.getloadavg())}


def _table_row(r: dict, ref: Optional[float], floor: float, cohort: int) -> str:
    if r["s_per_round"] is None:
        return f"| {r['name']} | {r['procs']} | failed | – | – | – | – | {r['failure']} |"
    ratio = "–" if ref is None else f"{r['s_per_round'] / ref:.2f}×"
    over_floor = f"{r['s_per_round'] / (floor / r['procs']):.1f}×"
    no_dev = r["name"] == "fedkernels sequential" or r["rel_dev"] is None
    dev = "–" if no_dev else f"{r['rel_dev']:.1e} ({r['reference']})"
    s = r["s_per_round"]
    secs = f"{s:.4f}" if s < 0.1 else f"{s:.3f}"  # 3 significant digits down to 10 ms
    updates = cohort / s
    rate = f"{updates:,.0f}" if updates >= 100 else f"{updates:.3g}"
    return f"| {r['name']} | {r['procs']} | {secs} | {rate} | {ratio} | {over_floor} | {r['loss']:.4f} | {dev} |"


def render_markdown(res: dict) -> str:
    m = res["machine"]
    ref = next((r["s_per_round"] for r in res["rows"] if r["name"] == "fedkernels batched"), None)
    floor = res["flop_floor_s"]
    lines = [
        f"FedAvg, {res['description']}, lr {res['lr']}, float32, 1 torch thread per process; "
        f"median of {res['rounds']} rounds after a warm-up round. {machine_line(m)}. "
        f"`uptime` before: {res['uptime_before']}; after: {res['uptime_after']}; {m['date']}. "
        f"`python -m bench.peers --workload {res['workload']['name']}`.",
        "",
        f"FLOP floor: {floor:.4f} s per round on one process (the round's forward+backward FLOPs at `torch.bmm`'s "
        f"{res['bmm_gflops']:.1f} GFLOP/s measured in this run; half that on 2 processes).",
        "",
        f"| contender | processes | s / round | client updates / s | × fedkernels batched | × FLOP floor | "
        f"training loss after {res['rounds'] + 1} rounds | final model vs reference (rel. dev.) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    cohort = res["workload"]["cohort"]
    lines += [_table_row(r, ref, floor, cohort) for r in res["rows"]]
    scored = res.get("loss_clients", res["clients"])
    over = (f"all {res['clients'] * res['samples']:,} samples" if scored == res["clients"]
            else f"the first {scored:,} clients' {scored * res['samples']:,} samples")
    lines += ["", f"Client updates / s: clients per round ({cohort}) / s per round. "
                  f"Training loss: mean cross-entropy over {over}, dropout off "
                  f"(start: {res['start_loss']:.4f}). python_algos and the plain loop draw the same cohorts and random "
                  "minibatches (reference: the sequential executor's final model); pfl walks each client's data in "
                  "order, so its loss is close to ours but not equal, and its reference is a plain PyTorch FedAvg "
                  "loop that walks the data in order the same way (in `bench/peers.py`, independent of pfl; "
                  "with a sampled cohort pfl's sampler draws other clients than ours, so there is none). "
                  "Rel. dev.: ‖x − x_ref‖ / ‖x_ref‖ of the final models, float32."]
    if res["notes"]:
        lines += [""] + [f"* {n}" for n in res["notes"]]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp",
                   help="mlp: 100 clients x 256 samples, one local epoch; cross-device: 1,000 clients x 32 samples, "
                        "100 per round, logistic regression, K = 5 steps of batch 8; cifar10: pfl-research's CIFAR-10 "
                        "benchmark configuration (1.63 M-parameter CNN, 50 of 1,000 clients x 50 images per round, "
                        "one local epoch of batch 10)")
    p.add_argument("--clients", type=int, default=None, help="clients (default: the workload's)")
    p.add_argument("--samples", type=int, default=None, help="samples per client (default: the workload's)")
    p.add_argument("--batch", type=int, default=None, help="local batch size (default: the workload's)")
    p.add_argument("-K", type=int, default=None, help="local steps (default: the workload's; mlp, cifar10: one epoch)")
    p.add_argument("--cohort", type=int, default=None, help="clients sampled per round (default: the workload's)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds, after one warm-up round")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--procs", type=int, default=2, help="processes of the multi-process rows")
    p.add_argument("--no-pfl", action="store_true", help="leave out the pfl rows")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed for each launched run")
    p.add_argument("--out", default=None, help="markdown file (default: bench/results/peers_table[_<workload>].md)")
    p.add_argument("--readme", default=None, help="also replace the peers table block in this file")
    args = p.parse_args(argv)
    _check_args(p, args)
    args.out = args.out or ("bench/results/peers_table.md" if args.workload == "mlp"
                            else f"bench/results/peers_table_{args.workload}.md")
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    res = run(args, log)
    md = render_markdown(res)
    begin, end = (README_BEGIN, README_END) if args.workload == "mlp" else markers(f"peers-{args.workload}-table")
    publish(md, res, args.out, args.readme, begin, end)


def _check_args(p: argparse.ArgumentParser, args) -> None:
    for flag, v, lo in (("--clients", args.clients, 1), ("--samples", args.samples, 1), ("--batch", args.batch, 1),
                        ("-K", args.K, 1), ("--cohort", args.cohort, 1), ("--rounds", args.rounds, 1),
                        ("--procs", args.procs, 2)):
        if v is not None and v < lo:
            p.error(f"{flag} must be at least {lo}, got {v}")
    w = workload_from_args(args)
    if w.cohort > w.clients:
        p.error(f"--cohort ({w.cohort}) must be at most --clients ({w.clients})")
    if args.workload in ONE_EPOCH and args.K is None and w.samples % w.batch:
        p.error(f"--samples ({w.samples}) must be a multiple of --batch ({w.batch}): every contender "
                "runs one whole local epoch")
    if not args.lr > 0:
        p.error(f"--lr must be positive, got {args.lr}")
    if args.readme and not os.path.isfile(args.readme):
        p.error(f"--readme {args.readme}: no such file")


if __name__ == "__main__":
    main()
