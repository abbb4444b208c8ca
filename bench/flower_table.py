"""The Flower table: the same run in one process, with ``--workers``, and through a local Flower deployment.

    python -m bench.flower_table                       # ~1.5 min on 2 quiet cores
    python -m bench.flower_table --readme docs/performance.md   # also refresh the table there

One workload (SCAFFOLD, N = 3 clients, 2 per round, minibatches of 8, float64, sparse logistic
regression with d = 12) through the command line three ways, each as its own ``python -m python_algos
run`` process: one process (the sequential executor), ``--workers 2`` (torch.distributed ranks on one
machine), and ``--flower`` (a SuperLink and one SuperNode per client on 127.0.0.1). Per engine:
seconds per round (the median of the rounds' ``wall_time`` in metrics.jsonl, the first round left
out), the bytes each round moves (``sent_bytes`` / ``recv_bytes``), the whole command's seconds, and
the final model against the one-process run's (max absolute difference).

The model is tiny on purpose: the table shows what each engine costs per round on top of the
algorithm's own work, which for ``--flower`` is Flower's (1.41 starts a ClientApp process for every
message, so a round costs seconds whatever the model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

import torch

from python_algos.runfolder.records import METRICS, MODEL

from .bandwidth import machine_info, machine_line
from .readme_block import markers, publish

README_BEGIN, README_END = markers("flower-table")
ENGINES = {"one process": [], "--workers 2": ["--workers", "2"], "--flower": ["--flower"]}


def workload(rounds: int) -> list:
    return ["-a", "scaffold", "--clients-per-round", "2", "--dataset", "sparse_logistic", "--data-opt", "n=240",
            "--data-opt", "dim=12", "-N", "3", "-T", str(rounds), "-B", "8", "--dtype", "float64",
            "--executor", "sequential", "--seed", "3", "--threads", "1", "--no-progress", "--no-plot"]


def uptime() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run_engine(name: str, rounds: int, folder: str, timeout: float) -> dict:
    out = os.path.join(folder, name.strip("-").replace(" ", "-"))
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "python_algos", "run", *workload(rounds), *ENGINES[name], "--out", out],
                       env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(os.path.join(out, METRICS)) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rounds_rows = [r for r in rows if r["round"] > 0]
    timed = [r["wall_time"] for r in rounds_rows[1:]] or [r["wall_time"] for r in rounds_rows]
    last = rounds_rows[-1]
    return {"name": name, "s_per_round": statistics.median(timed), "command_s": seconds,
            "sent_bytes": last.get("sent_bytes"), "recv_bytes": last.get("recv_bytes"),
            "params": torch.load(os.path.join(out, MODEL))["params"].tolist()}


def run(args, log) -> dict:
    info, before = machine_info(), uptime()
    rows = []
    with tempfile.TemporaryDirectory(prefix="flower-table-") as folder:
        for name in ENGINES:
            log(f"{name} ...")
            rows.append(run_engine(name, args.rounds, folder, args.timeout))
            log(f"{name}: {rows[-1]['s_per_round']:.3f} s/round, {rows[-1]['command_s']:.1f} s in all")
    ref = torch.tensor(rows[0]["params"], dtype=torch.float64)
    for r in rows:
        r["max_diff"] = float((torch.tensor(r["params"], dtype=torch.float64) - ref).abs().max())
    return {"machine": info, "uptime_before": before, "uptime_after": uptime(), "rounds": args.rounds, "rows": rows,
            "date": time.strftime("%Y-%m-%d")}


def _bytes(r: dict) -> str:
    if r["sent_bytes"] is None:
        return "– (nothing leaves the process)"
    return f"{r['sent_bytes']:,} sent + {r['recv_bytes']:,} received"


def render_markdown(res: dict) -> str:
    lines = [
        f"SCAFFOLD, N = 3 clients, 2 per round, batch 8, {res['rounds']} rounds, float64, d = 12 (sparse logistic "
        f"regression), 1 torch thread per process. {machine_line(res['machine'])}; load average before "
        f"{res['uptime_before']}, after {res['uptime_after']}; {res['date']}. `python -m bench.flower_table`.",
        "",
        "| engine | s per round (median) | bytes per round | whole command | final model vs one process |",
        "|---|---:|---|---:|---|",
    ]
    for r in res["rows"]:
        diff = "–" if r["name"] == "one process" else ("equal (max diff 0.0)" if r["max_diff"] == 0 else
                                                       f"max diff {r['max_diff']:.1e}")
        lines.append(f"| {r['name']} | {r['s_per_round']:.4g} | {_bytes(r)} | {r['command_s']:.1f} s | {diff} |")
    lines += ["", "Bytes: `--workers` counts what each rank hands to torch.distributed; `--flower` what the server "
                  "sends to and receives from all participants (the arrays with their .npy headers)."]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.flower_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4, help="rounds of each run (the first is left out of s per round)")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed for each run")
    p.add_argument("--out", default="bench/results/flower_table.md")
    p.add_argument("--readme", default=None, help="also replace the flower table block in this file")
    args = p.parse_args(argv)
    if args.rounds < 2:
        p.error(f"--rounds must be at least 2 (the first round is left out of the median), got {args.rounds}")
    if args.readme and not os.path.isfile(args.readme):
        p.error(f"--readme {args.readme}: no such file")
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    res = run(args, log)
    md = render_markdown(res)
    publish(md, res, args.out, args.readme, README_BEGIN, README_END)


if __name__ == "__main__":
    main()
