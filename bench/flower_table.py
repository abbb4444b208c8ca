"""The Flower table: the same run in one process, with ``--workers``, and through a local Flower deployment.

    python -m bench.flower_table                       # ~4 min on 2 quiet cores
    python -m bench.flower_table --readme docs/performance.md   # also refresh the table there

One workload (SCAFFOLD, N = 3 clients, 2 per round, minibatches of 8, float64, sparse logistic
regression with d = 12) through the command line three ways, each as its own ``python -m python_algos
run`` process: one process (the sequential executor), ``--workers 2`` (torch.distributed ranks on one
machine), and ``--flower`` (a SuperLink and one SuperNode per client on 127.0.0.1). Per engine:
seconds per round (the median of the rounds' ``wall_time`` in metrics.jsonl, the first round left
out), the bytes each round moves (``sent_bytes`` / ``recv_bytes``), the whole command's seconds, and
the final model against the one-process run's (max absolute difference).

The model is tiny on purpose: the table shows what each engine costs per round on top of the
algorithm's own work, which for ``--flower`` is mostly Flower's (1.41 starts a ClientApp process for
every message, so a round costs seconds whatever the model). To tell the two apart, the same run
measures Flower's floor (:mod:`bench.flower_floor`: a ClientApp that only echoes arrays of the same
size, through the same kind of local deployment) and ``--flower`` alternately, ``--pairs`` times
each, so that both see the same load; the ``--flower`` row gives its ratio to the floor (pooled
medians of the rounds, each run's first round left out). The load average is recorded before
each run.
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
from .flower_floor import run_floor
from .readme_block import markers, publish

README_BEGIN, README_END = markers("flower-table")
ENGINES = {"one process": [], "--workers 2": ["--workers", "2"], "--flower": ["--flower"]}
FLOOR = "Flower's floor (echo ClientApp)"
NODES, PER_ROUND, ARRAYS, DIM = 3, 2, 2, 12  # the workload's clients, participants, vectors each way (x, c), d


def workload(rounds: int) -> list:
    return ["-a", "scaffold", "--clients-per-round", "2", "--dataset", "sparse_logistic", "--data-opt", "n=240",
            "--data-opt", "dim=12", "-N", "3", "-T", str(rounds), "-B", "8", "--dtype", "float64",
            "--executor", "sequential", "--seed", "3", "--threads", "1", "--no-progress", "--no-plot"]


def uptime() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run_engine(name: str, rounds: int, folder: str, timeout: float) -> dict:
    out = os.path.join(folder, name.strip("-").replace(" ", "-"))
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    load = uptime()
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "python_algos", "run", *workload(rounds), *ENGINES[name], "--out", out],
                       env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(os.path.join(out, METRICS)) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    params = torch.load(os.path.join(out, MODEL))["params"].tolist()
    return {"name": name, "load": load, "command_s": seconds, "params": params,
            **_round_stats([r for r in rows if r["round"] > 0])}


def _round_stats(rounds_rows: list) -> dict:
    """Seconds per round (median, the first round left out: it includes the nodes' first start) and bytes."""
    timed = [r["wall_time"] for r in rounds_rows[1:]] or [r["wall_time"] for r in rounds_rows]
    last = rounds_rows[-1]
    return {"s_per_round": statistics.median(timed), "round_times": timed,
            "sent_bytes": last.get("sent_bytes"), "recv_bytes": last.get("recv_bytes")}


def run_floor_row(rounds: int, timeout: float) -> dict:
    load = uptime()
    got = run_floor(NODES, PER_ROUND, rounds, ARRAYS, DIM, seed=3, timeout=timeout)
    return {"name": FLOOR, "load": load, "command_s": got["command_s"], "params": None, **_round_stats(got["rows"])}


def _pooled(runs: list) -> dict:
    """One row of several runs of one engine: the median of all their timed rounds."""
    row = dict(runs[0])
    row["round_times"] = [t for r in runs for t in r["round_times"]]
    row["s_per_round"] = statistics.median(row["round_times"])
    row["command_s"] = statistics.median(r["command_s"] for r in runs)
    row["runs"] = [{"s_per_round": r["s_per_round"], "load": r["load"]} for r in runs]
    return row


def run(args, log) -> dict:
    info, before = machine_info(), uptime()
    rows, pairs = [], {FLOOR: [], "--flower": []}
    with tempfile.TemporaryDirectory(prefix="flower-table-") as folder:
        for name in ("one process", "--workers 2"):
            log(f"{name} ...")
            rows.append(run_engine(name, args.rounds, folder, args.timeout))
        for k in range(args.pairs):  # the floor and ours in turn: both see the same load
            pairs[FLOOR].append(run_floor_row(args.rounds, args.timeout))
            pairs["--flower"].append(run_engine("--flower", args.rounds, os.path.join(folder, f"pair{k}"),
                                                args.timeout))
            log(f"pair {k + 1}: floor {pairs[FLOOR][-1]['s_per_round']:.3f} s/round, --flower "
                f"{pairs['--flower'][-1]['s_per_round']:.3f} s/round (load {pairs['--flower'][-1]['load']})")
    floor, ours = _pooled(pairs[FLOOR]), _pooled(pairs["--flower"])
    ours["floor_ratio"] = ours["s_per_round"] / floor["s_per_round"]
    rows += [floor, ours]
    ref = torch.tensor(rows[0]["params"], dtype=torch.float64)
    for r in rows:
        if r["params"] is not None:
            r["max_diff"] = float((torch.tensor(r["params"], dtype=torch.float64) - ref).abs().max())
    return {"machine": info, "uptime_before": before, "uptime_after": uptime(), "rounds": args.rounds, "rows": rows,
            "pairs": args.pairs, "date": time.strftime("%Y-%m-%d")}


def _bytes(r: dict) -> str:
    if r["sent_bytes"] is None:
        return "– (nothing leaves the process)"
    return f"{r['sent_bytes']:,} sent + {r['recv_bytes']:,} received"


def _versus(r: dict) -> str:
    if r["name"] == "one process":
        return "–"
    if r.get("params") is None:
        return "– (echoes only)"
    return "equal (max diff 0.0)" if r["max_diff"] == 0 else f"max diff {r['max_diff']:.1e}"


def render_markdown(res: dict) -> str:
    lines = [
        f"SCAFFOLD, N = 3 clients, 2 per round, batch 8, {res['rounds']} rounds, float64, d = 12 (sparse logistic "
        f"regression), 1 torch thread per process. {machine_line(res['machine'])}; load average before "
        f"{res['uptime_before']}, after {res['uptime_after']}; {res['date']}. `python -m bench.flower_table`.",
        "",
        "| engine | s per round (median) | × Flower's floor | bytes per round | whole command | final model vs one "
        "process |",
        "|---|---:|---:|---|---:|---|",
    ]
    for r in res["rows"]:
        ratio = f"{r['floor_ratio']:.2f}" if "floor_ratio" in r else ("1" if r["name"] == FLOOR else "–")
        lines.append(f"| {r['name']} | {r['s_per_round']:.4g} | {ratio} | {_bytes(r)} | {r['command_s']:.1f} s | "
                     f"{_versus(r)} |")
    runs = [r for r in res["rows"] if "runs" in r]
    lines += ["", "Bytes: `--workers` counts what each rank hands to torch.distributed; `--flower` what the server "
                  "sends to and receives from all participants (the arrays with their .npy headers)."]
    if runs:
        lines += ["", f"Flower's floor and `--flower` ran alternately, {res['pairs']} times each (rows: the median "
                      "of all their rounds, each run's first left out); each run's s per round (load average "
                      "at its start): " + "; ".join(
                          f"{r['name']}: " + ", ".join(f"{x['s_per_round']:.3g} ({x['load'].split(',')[0]})"
                                                       for x in r["runs"]) for r in runs) + "."]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.flower_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4, help="rounds of each run (the first is left out of s per round)")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed for each run")
    p.add_argument("--pairs", type=int, default=2, help="runs of Flower's floor and of --flower, alternately")
    p.add_argument("--out", default="bench/results/flower_table.md")
    p.add_argument("--readme", default=None, help="also replace the flower table block in this file")
    args = p.parse_args(argv)
    if args.rounds < 2:
        p.error(f"--rounds must be at least 2 (the first round is left out of the median), got {args.rounds}")
    if args.pairs < 1:
        p.error(f"--pairs must be at least 1, got {args.pairs}")
    if args.readme and not os.path.isfile(args.readme):
        p.error(f"--readme {args.readme}: no such file")
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    res = run(args, log)
    md = render_markdown(res)
    publish(md, res, args.out, args.readme, README_BEGIN, README_END)


if __name__ == "__main__":
    main()
