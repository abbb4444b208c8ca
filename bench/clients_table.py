"""The clients table: seconds per round of FedAvg and FedCanon by client executor.

    python -m bench.clients_table                                  # default grid, ~10 min on 2 cores
    python -m bench.clients_table --models mlp --clients 100       # one cell
    python -m bench.clients_table --clients 10 100 1000 --models logreg mlp cnn   # the full grid
    python -m bench.clients_table --readme docs/performance.md     # also refresh the table there

For N clients x K = 10 local steps, batch 32, 256 MNIST-shaped samples per client, float32:
python_algos' ``sequential`` and ``batched`` executors, a plain PyTorch FedAvg loop (deepcopy +
SGD per client), and the FLOP floor (the round's forward+backward FLOPs at the batched-matmul
rate measured in the same run). Each cell runs ``--rounds`` rounds (default 2) and reports the
median of the rounds after the first. Default threads: 1 (``--threads``), the policy of the CLI for
models this small. Cells whose sequential round would take minutes (CNN with 1000 clients) run only
when named with ``--clients``. The plain loop's final model is checked against the sequential
FedAvg run (same minibatch draws), so the peers do the same work. GPU rows are added when CUDA is
available (``--device``). ``--first-layer`` times the batched executor once per first-layer path
(``fedkernels.first_layer``, through ``FEDKERNELS_FIRST_LAYER``; default ``auto``; ``bf16`` and
``auto_bf16``: bfloat16 products, other results): the first path fills the batched column, the others
a line each under the table; the table says which path ``auto`` took.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import Optional, Sequence

import torch

import fedkernels as fk

from .bandwidth import machine_info, machine_line
from .clients import ALGORITHMS, MODELS, bmm_rate, flops_per_step, make_clients, time_executor, time_plain_loop
from .readme_block import markers, publish

README_BEGIN, README_END = markers("clients-table")
DEFAULT_CLIENTS = (10, 100, 1000)
SKIP_BY_DEFAULT = {("cnn", 1000)}  # ~3 min per sequential round on 2 cores


def run(args, log=print) -> dict:
    torch.set_num_threads(args.threads)
    fk.set_num_threads(args.threads)
    info = machine_info()
    devices = args.device or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    cells = []
    for device in devices:
        rate = bmm_rate(device)
        log(f"[{device}] batched-matmul rate {rate / 1e9:.1f} GFLOP/s")
        for model in args.models:
            fl = flops_per_step(model, args.batch)
            for N in args.clients:
                if (model, N) in SKIP_BY_DEFAULT and not args.explicit_clients:
                    log(f"[{device}] {model} N={N}: skipped (name --clients {N} to run it)")
                    continue
                clients = make_clients(N, args.samples, device=device)
                floor = N * args.K * fl / rate
                for alg in args.algorithms:
                    cell = {"device": device, "model": model, "N": N, "algorithm": alg, "flop_floor_s": floor,
                            "gflop_per_round": N * args.K * fl / 1e9}
                    runs = [(ex, p) for ex in args.executors for p in (args.first_layer if ex == "batched" else [""])]
                    for ex, path in runs:
                        t0 = time.perf_counter()
                        with _first_layer(path):
                            r = time_executor(model, alg, clients, ex, K=args.K, batch=args.batch,
                                              rounds=args.rounds, device=device)
                        key = ex if path in ("", args.first_layer[0]) else f"{ex} ({path})"
                        cell[key] = r["s_per_round"]
                        cell[f"{key}_fwd_bwd"] = r["fwd_bwd_s"]
                        cell[f"_{key}_params"] = r["params"]
                        log(f"[{device}] {model} N={N} {alg} {key}: {r['s_per_round']:.3f} s/round "
                            f"({time.perf_counter() - t0:.0f} s)")
                    if alg == "FedAvg" and not args.no_loop:
                        r = time_plain_loop(model, clients, K=args.K, batch=args.batch, rounds=args.rounds,
                                            device=device)
                        cell["loop"] = r["s_per_round"]
                        if "_sequential_params" in cell:  # the peer did the same work
                            a = cell["_sequential_params"]
                            cell["loop_rel_dev"] = float((r["params"] - a).norm() / a.norm())
                        log(f"[{device}] {model} N={N} plain loop: {r['s_per_round']:.3f} s/round")
                    _path_devs(cell, args.first_layer)
                    if "sequential" in args.executors and "batched" in args.executors:
                        a, b = cell.pop("_sequential_params"), cell.pop("_batched_params")
                        cell["max_rel_dev"] = float((a - b).norm() / b.norm())
                    for k in [k for k in cell if k.startswith("_")]:
                        cell.pop(k)
                    cells.append(cell)
                del clients
    return {"machine": info, "threads": args.threads, "K": args.K, "batch": args.batch, "samples": args.samples,
            "rounds": args.rounds, "cells": cells, "load_after": list(os.getloadavg()),
            "first_layer": args.first_layer, "first_layer_auto": fk.backend_info()["first_layer"]["choices"]}


def _path_devs(cell: dict, paths: list) -> None:
    """Each other first-layer path's final model against the batched column's: ‖x_p − x‖ / ‖x‖ (0 for the
    paths with the same bits, within rounding for gather_bmm, bfloat16's rounding for bf16)."""
    base = cell.get("_batched_params")
    for p in paths[1:]:
        other = cell.get(f"_batched ({p})_params")
        if base is not None and other is not None:
            cell[f"batched ({p}) rel_dev"] = float((other - base).norm() / base.norm())


@contextlib.contextmanager
def _first_layer(path: str):
    """FEDKERNELS_FIRST_LAYER set to `path` ("" or "auto": unset) for one timed run."""
    before = os.environ.pop(fk.first_layer.ENV, None)
    if path not in ("", "auto"):
        os.environ[fk.first_layer.ENV] = path
    try:
        yield
    finally:
        os.environ.pop(fk.first_layer.ENV, None)
        if before is not None:
            os.environ[fk.first_layer.ENV] = before


def _s(v) -> str:
    return "–" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def _x(a, b) -> str:
    return "–" if a is None or b is None else f"{a / b:.2f}×"


def render_markdown(res: dict) -> str:
    m = res["machine"]
    lines = [
        f"Seconds per round (median), K = {res['K']} local steps, batch {res['batch']}, {res['samples']} samples per "
        f"client, float32, {res['threads']} thread(s). {machine_line(m)}; load average before "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg'])}, after {', '.join(f'{x:.2f}' for x in res['load_after'])}; "
        f"{m['date']}. `python -m bench.clients_table`.",
        "",
        "| device | model | N | algorithm | sequential | batched | batched speed-up | plain loop (deepcopy+SGD) "
        "| FLOP floor | batched / floor | batched vs sequential (rel. dev.) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in res["cells"]:
        dev = f"{c['max_rel_dev']:.1e}" if "max_rel_dev" in c else "–"
        lines.append(
            f"| {c['device']} | {c['model']} | {c['N']} | {c['algorithm']} | {_s(c.get('sequential'))} | "
            f"{_s(c.get('batched'))} | {_x(c.get('sequential'), c.get('batched'))} | {_s(c.get('loop'))} | "
            f"{_s(c['flop_floor_s'])} | {_x(c.get('batched'), c['flop_floor_s'])} | {dev} |")
    loop_devs = [c["loop_rel_dev"] for c in res["cells"] if "loop_rel_dev" in c]
    lines += ["", "FLOP floor: the round's forward+backward FLOPs (torch's flop counter on one client step, "
                  "x N x K) at the rate of `torch.bmm` on the MLP's first-layer shapes measured in the same run. "
                  "Rel. dev.: ‖x_batched − x_sequential‖ / ‖x_sequential‖ after the run (float32, same minibatch draws)"
                  + ("; the plain loop's FedAvg model deviates from the sequential one by at most "
                     f"{max(loop_devs):.1e}."
                     if loop_devs else ".")]
    lines += _first_layer_lines(res)
    return "\n".join(lines)


def _first_layer_lines(res: dict) -> list:
    """Which first-layer path the batched column ran, and the other paths' cells."""
    paths = res.get("first_layer") or ["auto"]
    auto = ", ".join(f"{k}: {v['path']} ({v['source']})" for k, v in (res.get("first_layer_auto") or {}).items())
    out = ["", f"Batched column: first-layer path {paths[0]}" + (f" (auto took {auto})" if auto else "") + "."]
    for c in res["cells"]:
        for p in paths[1:]:
            if f"batched ({p})" in c:
                dev = c.get(f"batched ({p}) rel_dev")
                out.append(f"- {c['model']} N = {c['N']} {c['algorithm']}, first layer {p}: {_s(c[f'batched ({p})'])} "
                           f"s/round, {_x(c[f'batched ({p})'], c['flop_floor_s'])} the FLOP floor"
                           + ("" if dev is None else f"; model vs the batched column's: {dev:.1e} (rel.)"))
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.clients_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--clients", nargs="+", type=int, default=None, help="N values (default 10 100 1000)")
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    p.add_argument("--executors", nargs="+", default=["sequential", "batched"], choices=["sequential", "batched"])
    p.add_argument("-K", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", nargs="+", default=None, help="cpu and/or cuda (default: cpu, plus cuda if present)")
    p.add_argument("--no-loop", action="store_true", help="skip the plain PyTorch loop")
    p.add_argument("--first-layer", nargs="+", default=["auto"], choices=list(fk.first_layer.REQUESTS),
                   help="the batched executor's first-layer path(s) (FEDKERNELS_FIRST_LAYER), the first one in the "
                        "batched column")
    p.add_argument("--out", default="bench/results/clients_table.md")
    p.add_argument("--readme", default=None, help="also replace the clients table block in this file")
    args = p.parse_args(argv)
    args.explicit_clients = args.clients is not None
    args.clients = args.clients or list(DEFAULT_CLIENTS)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    res = run(args, log)
    md = render_markdown(res)
    publish(md, res, args.out, args.readme, README_BEGIN, README_END)


if __name__ == "__main__":
    main()
