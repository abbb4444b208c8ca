"""Population scale (issue 39 item 6): SCAFFOLD on an a9a-sized logistic regression (d = 124) with
N = 10^6 clients built on demand (``python_algos.clients.population``) and per-client state in a RAM
store (``state="ram"``), against the same cohort at N = 10^3 clients held in RAM as a list with a dense
state stack, side by side in one run; each configuration in its own process, so that its peak RSS is
its own.

    python -m bench.population                                  # the table (bench/results/population.md)
    python -m bench.population --readme docs/performance.md     # also refresh the table there
    python -m bench.population --rounds 5 --clients 10000       # a quick look

The data: ``SparseLogistic`` (123 binary features, ~11 % set, 40-60 samples per client, client i from
(seed, i)). Metrics are off (``metrics_every=0``): the objective f is a mean over every client, so
each metric pass over a population builds all N clients (~0.3 ms each).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Optional, Sequence

from .readme_block import markers, publish, update_readme

README_BEGIN, README_END = markers("population-table")


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def one(cfg: dict) -> dict:
    """One configuration, in this process: start-up seconds, s/round, RSS before and peak, builds."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from python_algos import simulate
    from python_algos.algorithms import SCAFFOLD
    from python_algos.clients.population import Population, SparseLogistic

    gen = SparseLogistic(seed=0)
    clients = Population(cfg["N"], gen) if cfg["lazy"] else [gen(i) for i in range(cfg["N"])]
    torch.manual_seed(0)
    model = nn.Linear(gen.dim, 1)
    rss_start = _rss_mib()
    t0 = time.perf_counter()
    h = simulate(SCAFFOLD(lr_local=0.05, local_steps=cfg["K"]), model, F.binary_cross_entropy_with_logits, clients,
                 rounds=cfg["rounds"], clients_per_round=cfg["cohort"], state=cfg["state"], metrics_every=0)
    total = time.perf_counter() - t0
    walls = sorted(h.series("wall_time"))
    store = h.state.c_i
    return {**cfg, "s_per_round": walls[len(walls) // 2], "mean_s_per_round": sum(walls) / len(walls),
            "startup_s": total - sum(walls),
            "rss_start_mib": rss_start, "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "builds": getattr(clients, "builds", None),
            "rows_written": getattr(store, "rows_written", None), "state_bytes": int(store.nbytes)}


def _launch(cfg: dict, log) -> dict:
    log(f"N = {cfg['N']} ({'on demand' if cfg['lazy'] else 'a list in RAM'}), state={cfg['state']!r}")
    out = subprocess.run([sys.executable, "-m", "bench.population", "--one", json.dumps(cfg)], capture_output=True,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where bench/ is a package
    if out.returncode != 0:
        raise RuntimeError(f"configuration {cfg} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args, log=print) -> dict:
    from bench.bandwidth import machine_info

    info = machine_info()
    common = {"cohort": args.cohort, "rounds": args.rounds, "K": args.K}
    configs = [{**common, "N": args.clients, "lazy": True, "state": "ram"},
               {**common, "N": args.small, "lazy": False, "state": "dense"}]
    runs = [[], []]
    for _ in range(args.repeats):  # alternately, so that a change of the machine's load falls on both
        for j, cfg in enumerate(configs):
            runs[j].append(_launch(cfg, log))
    # each configuration's run with the lowest median round (the least disturbed), its peak RSS the highest seen
    cells = [{**min(r, key=lambda c: c["s_per_round"]), "rss_peak_mib": max(c["rss_peak_mib"] for c in r),
              "all_s_per_round": [c["s_per_round"] for c in r]} for r in runs]
    return {"machine": info, "cells": cells, "load_after": list(os.getloadavg())}


def render_markdown(res: dict) -> str:
    from bench.bandwidth import machine_line

    m, cells = res["machine"], res["cells"]
    big, small = cells
    lines = ["| N | client data | client state | s/round | start-up s | peak RSS MiB (at start) | clients built | "
             "state rows written | state bytes |", "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c['N']:,} | {'on demand (Population)' if c['lazy'] else 'list in RAM'} | "
                     f"{c['state']} | {c['s_per_round']:.4f} | {c['startup_s']:.2f} | {c['rss_peak_mib']:.0f} "
                     f"({c['rss_start_mib']:.0f}) | {c['builds'] if c['builds'] is not None else 'all'} | "
                     f"{c['rows_written'] if c['rows_written'] is not None else 'all'} | {c['state_bytes']:,} |")
    ratio = big["s_per_round"] / small["s_per_round"]
    load = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    lines += ["", f"SCAFFOLD (K = {big['K']} full local gradients, lr 0.05), d = 124 (`SparseLogistic`: 123 binary "
                  f"features, ~50 samples per client), cohort {big['cohort']}, {big['rounds']} rounds, float32, 1 "
                  f"torch thread, `metrics_every=0`. s/round: the median round of the less disturbed of "
                  f"{len(big['all_s_per_round'])} alternating runs (all runs' medians: "
                  f"{', '.join(f'{x:.3f}' for x in big['all_s_per_round'])} on demand, "
                  f"{', '.join(f'{x:.3f}' for x in small['all_s_per_round'])} in RAM); peak RSS: the highest. "
                  f"At N = {big['N']:,} on demand / N = {small['N']:,} in "
                  f"RAM: **{ratio:.2f}×** (an on-demand round also builds its cohort's data). {m['date']}; "
                  f"{machine_line(m)}; load average before {load(m['loadavg'])}, after {load(res['load_after'])}."]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.population", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=10**6, help="N of the on-demand population (default 10^6)")
    p.add_argument("--small", type=int, default=1000, help="N of the in-RAM list it is compared with (default 1000)")
    p.add_argument("--cohort", type=int, default=100)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("-K", type=int, default=10, help="local steps (default 10)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each configuration, alternately (default 2)")
    p.add_argument("--out", default="bench/results/population.md")
    p.add_argument("--readme", default=None, help="also replace the population table block in this file")
    p.add_argument("--from-json", default=None, help="re-render a saved result, measuring nothing")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one configuration, JSON in and out
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.from_json:
        with open(args.from_json) as f:
            res = json.load(f)
    else:
        res = run(args, log)
    md = render_markdown(res)
    if not args.from_json:
        publish(md, res, args.out, args.readme, README_BEGIN, README_END)
    else:
        if args.readme:
            update_readme(args.readme, md, README_BEGIN, README_END)
        print(md)


if __name__ == "__main__":
    main()
