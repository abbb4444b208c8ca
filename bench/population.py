"""Population scale (issue 39 item 6): SCAFFOLD on an a9a-sized logistic regression (d = 124) with
N = 10^6 clients built on demand (``python_algos.clients.population``) and per-client state in a RAM
store (``state="ram"``), against the same cohort at N = 10^3 clients held in RAM as a list with a dense
state stack, side by side in one run; each configuration in its own process, so that its peak RSS is
its own.

    python -m bench.population                                  # the table (bench/results/population.md)
    python -m bench.population --readme docs/performance.md     # also refresh the table there
    python -m bench.population --rounds 5 --clients 10000       # a quick look
    python -m bench.population --workload mlp                   # SCAFFOLD and FedDR, MNIST MLP, 10^5, disk
    python -m bench.population --workload mlp --pfl-python /tmp/pflenv/bin/python   # and pfl-research's SCAFFOLD
    python -m bench.population --workload fedcanon              # full participation, A9A as 10^5 clients

pfl-research runs in its own virtual environment, never this project's (``--pfl-python``: its interpreter):
``python -m venv /tmp/pflenv; /tmp/pflenv/bin/pip install torch==2.13.0`` (a CPU wheel), then
``pip install --no-deps pfl==0.6.0`` and what it imports: ``numpy scipy packaging multiprocess
'dp-accounting>=0.4,<0.6' 'prv-accountant>=0.2,<0.3'`` (so that no other torch is pulled in).

The data: ``SparseLogistic`` (123 binary features, ~11 % set, 40-60 samples per client, client i from
(seed, i)). Metrics are off (``metrics_every=0``): the objective f is a mean over every client, so
each metric pass over a population builds all N clients (~0.3 ms each).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from typing import Optional, Sequence

from .readme_block import markers, publish, update_readme


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class MnistLike:
    """MNIST-shaped clients for the MLP workload, client i from ``(seed, i)`` alone: ``samples`` samples
    x = mean[y] + noise (the class means drawn from ``seed``), labels skewed per client (bench.clients).
    The noise images are drawn per client from a bank of ``bank`` drawn from ``seed``: a client is built
    in ~0.1 ms, not the ~0.5 ms of drawing its 39,200 normals (a cohort's 100 clients: 50 ms of a round
    that the N = 10^3 list in RAM does not pay)."""

    def __init__(self, seed: int = 0, samples: int = 50, bank: int = 4096):
        import torch

        g = torch.Generator().manual_seed(seed)
        self.seed, self.samples = seed, samples
        self.means = torch.randn(10, 1, 28, 28, generator=g)
        self.noise = torch.randn(bank, 1, 28, 28, generator=g)
        self.recipe = f"MnistLike(seed={seed}, samples={samples}, bank={bank})"

    def __call__(self, i: int) -> tuple:
        import torch

        g = torch.Generator().manual_seed(self.seed * 2**32 + int(i))
        y = (torch.randint(0, 10, (self.samples,), generator=g) + i) % 10
        picks = torch.randint(0, self.noise.shape[0], (self.samples,), generator=g)
        return torch.index_select(self.noise, 0, picks).add_(self.means[y]), y


def _workload(cfg: dict):
    """(model, loss, make_client, algorithm) of a configuration."""
    import torch.nn.functional as F
    from torch import nn

    from python_algos.algorithms import SCAFFOLD, FedDR
    from python_algos.clients.population import SparseLogistic

    if cfg.get("workload", "linear") == "fedcanon":  # A9A's training rows as N clients of 3 rows (cyclic)
        from python_algos.algorithms import FedCanon
        from python_algos.data import RowClients, cyclic, load_dataset

        ds = load_dataset("a9a")
        gen = RowClients(ds.X, ds.y, cyclic(len(ds.X), cfg["N"], 3, seed=0), name="a9a")
        return nn.Linear(123, 2), F.cross_entropy, gen, FedCanon(alpha=1.0, beta=0.05, local_steps=cfg["K"])
    if cfg.get("workload", "linear") == "linear":
        gen = SparseLogistic(seed=0)
        model, loss = nn.Linear(gen.dim, 1), F.binary_cross_entropy_with_logits
    else:
        from bench.clients import make_model

        gen, model, loss = MnistLike(seed=0), make_model("mlp"), F.cross_entropy
    alg = SCAFFOLD(lr_local=0.05, local_steps=cfg["K"]) if cfg.get("algorithm", "SCAFFOLD") == "SCAFFOLD" else \
        FedDR(eta=1.0, lr_local=0.05, local_steps=cfg["K"], init_from="code")
    return model, loss, gen, alg


def _disk_bytes(folder: str) -> int:
    """Bytes the files under ``folder`` occupy on disk (allocated blocks: a sparse file counts what was written)."""
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(folder) for f in fs)


@contextlib.contextmanager
def _phase_timers(on: bool):
    """``--phases``: the seconds of each call of the round's state phases, recorded while the context lasts (then
    the functions are put back): the gathers and scatters of the client rows (``rows_`` / ``put_rows_`` of
    python_algos/algorithms/base.py), a disk store's read-ahead of the next cohort (``read_ahead``) and the
    clients built on demand (``Population.build``). Off: None."""
    import python_algos.algorithms.base as ab
    from python_algos.clients.population import Population

    if not on:
        yield None
        return
    spent: dict = {"gather": [], "scatter": [], "read_ahead": [], "build": []}
    places = ((ab, "rows_", "gather"), (ab, "put_rows_", "scatter"), (ab, "read_ahead", "read_ahead"),
              (Population, "build", "build"))
    kept = [(owner, name, getattr(owner, name)) for owner, name, _ in places]

    def timed(f, key: str):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[key].append(time.perf_counter() - t)
        return wrapper

    for (owner, name, key), (_, _, f) in zip(places, kept):
        setattr(owner, name, timed(f, key))
    try:
        yield spent
    finally:
        for owner, name, f in kept:
            setattr(owner, name, f)


def one(cfg: dict) -> dict:
    """One configuration, in this process: start-up seconds, s/round, RSS before and peak, builds."""
    import tempfile

    import torch

    from python_algos import simulate
    from python_algos.clients.population import Population

    torch.manual_seed(0)
    model, loss, gen, alg = _workload(cfg)
    clients = Population(cfg["N"], gen) if cfg["lazy"] else [gen(i) for i in range(cfg["N"])]
    rss_start = _rss_mib()
    with tempfile.TemporaryDirectory(prefix="bench-population-") as tmp:
        folder = os.path.join(tmp, "state") if cfg["state"] == "disk" else None
        t0 = time.perf_counter()
        try:
            with _phase_timers(bool(cfg.get("phases"))) as spent:
                h = simulate(alg, model, loss, clients, rounds=cfg["rounds"], clients_per_round=cfg["cohort"],
                             state=cfg["state"], state_folder=folder, metrics_every=0,
                             executor=cfg.get("executor", "sequential"))
        except ValueError as e:  # a configuration this version refuses: its row says why
            return {**cfg, "refused": str(e)}
        total = time.perf_counter() - t0
        disk = _disk_bytes(folder) if folder else None
    walls = sorted(h.series("wall_time"))
    stacks = [getattr(h.state, f) for f in type(h.state).client_fields]
    floor = _floor(cfg["N"], int(h.params.numel()), len(stacks)) if cfg.get("floor") else None
    return {**cfg, "s_per_round": walls[len(walls) // 2], "mean_s_per_round": sum(walls) / len(walls),
            "floor_s": floor,
            "startup_s": total - sum(walls), "dim": int(h.params.numel()), "stacks": len(stacks),
            "rss_start_mib": rss_start, "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "builds": getattr(clients, "builds", None), "disk_bytes": disk,
            "rows_written": getattr(stacks[0], "rows_written", None), "state_bytes": sum(int(s.nbytes) for s in stacks),
            "phases_ms": None if spent is None else {k: 1e3 * _per_round(v, cfg["rounds"]) for k, v in spent.items()}}


def _per_round(times: list, rounds: int) -> float:
    """Seconds a round of a phase: the median round's, where every round makes as many calls (the gathers, the
    scatters, the read-ahead), else the mean (the clients built, which a round needs fewer of once cached)."""
    per = len(times) // rounds
    if not per or len(times) % rounds:
        return sum(times) / rounds
    sums = sorted(sum(times[r * per:(r + 1) * per]) for r in range(rounds))
    return sums[len(sums) // 2]


def _floor(n: int, dim: int, stacks: int) -> float:
    """Seconds to read and write ``stacks`` [n, dim] float32 stacks once in RAM (``mul_(1)``, pages touched
    before): what a full participation round over that state cannot go below; the best of 3."""
    import torch

    buf = torch.ones(n, dim)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        buf.mul_(1.0)
        times.append(time.perf_counter() - t)
    return min(times) * stacks


def _launch_pfl(cfg: dict, python: str, log) -> dict:
    """pfl-research's SCAFFOLD (bench.pfl_scaffold) in its own interpreter: the row's fields."""
    import statistics
    import tempfile

    log(f"pfl-research SCAFFOLD, N = {cfg['N']}, DiskUserStateStorage ({python})")
    with tempfile.TemporaryDirectory(prefix="bench-pfl-") as tmp:
        out = os.path.join(tmp, "r.json")
        run = subprocess.run([python, "-m", "bench.pfl_scaffold", "--clients", str(cfg["N"]), "--cohort",
                              str(cfg["cohort"]), "--rounds", str(cfg["rounds"]), "-K", str(cfg["K"]), "--out", out],
                             capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if run.returncode != 0:
            raise RuntimeError(f"pfl failed:\n{run.stderr[-3000:]}")
        with open(out) as f:
            r = json.load(f)
    rounds = r["round_s"][1:] or r["round_s"]  # the first also evaluates (pfl's round 0)
    return {**cfg, "s_per_round": statistics.median(rounds), "startup_s": None, "dim": r["dim"], "stacks": 1,
            "rss_start_mib": None, "rss_peak_mib": r["rss_peak_mib"], "builds": None, "rows_written": r["files"],
            "state_bytes": r["disk_bytes"], "disk_bytes": r["disk_bytes"], "pfl_version": r["pfl_version"]}


def _launch(cfg: dict, log) -> dict:
    log(f"N = {cfg['N']} ({'on demand' if cfg['lazy'] else 'a list in RAM'}), state={cfg['state']!r}")
    out = subprocess.run([sys.executable, "-m", "bench.population", "--one", json.dumps(cfg)], capture_output=True,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where bench/ is a package
    if out.returncode != 0:
        raise RuntimeError(f"configuration {cfg} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


WORKLOADS = {  # defaults per workload: N on demand, its state backend, local steps, algorithms, table block
    "linear": {"clients": 10**6, "state": "ram", "K": 10, "algorithms": ["SCAFFOLD"], "block": "population-table"},
    "mlp": {"clients": 10**5, "state": "disk", "K": 2, "algorithms": ["SCAFFOLD", "FedDR"],
            "block": "population-mlp-table"},
    "fedcanon": {"clients": 10**5, "state": "ram", "K": 2, "algorithms": ["FedCanon"],
                 "block": "population-fedcanon-table"},
}


def run(args, log=print) -> dict:
    from bench.bandwidth import machine_info

    info = machine_info()
    w = WORKLOADS[args.workload]
    common = {"workload": args.workload, "cohort": args.cohort, "rounds": args.rounds, "K": args.K,
              "phases": args.phases}
    if args.workload == "fedcanon":  # full participation, N clients both ways: streamed store, dense stack
        common = {**common, "cohort": None, "algorithm": "FedCanon", "N": args.clients, "lazy": False, "floor": True}
        configs = [{**common, "state": s, "executor": args.executor} for s in (w["state"], "dense")]
    else:
        configs = [c for alg in w["algorithms"] for c in (
            {**common, "algorithm": alg, "N": args.clients, "lazy": True, "state": w["state"]},
            {**common, "algorithm": alg, "N": args.small, "lazy": False, "state": "dense"})]
    if args.pfl_python and args.workload == "mlp":
        configs.append({**common, "algorithm": "SCAFFOLD", "N": args.clients, "lazy": True, "state": "pfl"})
    runs = [[] for _ in configs]
    for _ in range(args.repeats):  # alternately, so that a change of the machine's load falls on both
        for j, cfg in enumerate(configs):
            runs[j].append(_launch_pfl(cfg, args.pfl_python, log) if cfg["state"] == "pfl" else _launch(cfg, log))
    return {"machine": info, "cells": _cells([r for r in runs if "refused" not in r[0]]),  # refused: one row, why
            "refused": [r[0] for r in runs if "refused" in r[0]], "load_after": list(os.getloadavg())}


def _cells(runs: list) -> list:
    # each configuration's run with the lowest median round (the least disturbed), its peak RSS the highest seen
    return [{**min(r, key=lambda c: c["s_per_round"]), "rss_peak_mib": max(c["rss_peak_mib"] for c in r),
             "all_s_per_round": [c["s_per_round"] for c in r]} for r in runs]


def _row(c: dict) -> str:
    disk = "–"
    if c.get("disk_bytes") is not None:
        per_round = c["disk_bytes"] / c["rounds"]
        disk = f"{per_round / 2**20:.1f} MiB ({per_round / (c['cohort'] * c['dim'] * 4 * c['stacks']):.2f}×)"
    return (f"| {c.get('algorithm', 'SCAFFOLD')} | {c['N']:,} | {'on demand' if c['lazy'] else 'list in RAM'} | "
            f"{c['state']} | {c['s_per_round']:.4f} | {c['startup_s']:.2f} | {c['rss_peak_mib']:.0f} "
            f"({c['rss_start_mib']:.0f}) | {c['builds'] if c['builds'] is not None else 'all'} | "
            f"{c['rows_written'] if c['rows_written'] is not None else 'all'} | {c['state_bytes']:,} | {disk} |")


def _pfl_row(c: dict) -> str:
    per_round = c["disk_bytes"] / c["rounds"]
    return (f"| SCAFFOLD in pfl {c['pfl_version']} | {c['N']:,} | on demand | disk: `DiskUserStateStorage`, one file "
            f"per user | {c['s_per_round']:.4f} | – | {c['rss_peak_mib']:.0f} | – | {c['rows_written']:,} files | "
            f"{c['state_bytes']:,} | {per_round / 2**20:.1f} MiB ({per_round / (c['cohort'] * c['dim'] * 4):.2f}×) |")


def render_fedcanon(res: dict) -> str:
    """The full participation table: s/round of each state backend against the state's read+write floor."""
    from bench.bandwidth import machine_line

    m, cells = res["machine"], res["cells"]
    lines = ["| algorithm | N | executor | client state | s/round | floor ms (state read + written once) | × floor | "
             "peak RSS MiB (at start) | state bytes |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| FedCanon | {c['N']:,} | {c['executor']} | {c['state']} | {c['s_per_round']:.4f} | "
              f"{c['floor_s'] * 1e3:.3g} | "
              f"{c['s_per_round'] / c['floor_s']:,.0f} | {c['rss_peak_mib']:.0f} ({c['rss_start_mib']:.0f}) | "
              f"{c['state_bytes']:,} |" for c in cells]
    lines += [f"| FedCanon | {c['N']:,} | {c['executor']} | {c['state']} | refused: {c['refused']} | | | | |"
              for c in res["refused"]]
    c, load = cells[0], lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    lines += ["", f"A9A's 26,049 training rows as {c['N']:,} clients of 3 rows (`cyclic`, a list in RAM), the linear "
                  f"model d = {c['dim']:,} (2 classes, cross-entropy); FedCanon alpha 1, beta 0.05, K = {c['K']} full "
                  f"local gradients, every client every round, {c['rounds']} rounds, float32, 1 torch thread, "
                  f"`metrics_every=0`. s/round: the median round of the less disturbed of {len(c['all_s_per_round'])} "
                  f"alternating runs. Floor: one `mul_(1)` over each [N, d] client stack already in RAM (the state "
                  f"read and written once), the best of 3. {m['date']}; {machine_line(m)}; load average before "
                  f"{load(m['loadavg'])}, after {load(res['load_after'])}."]
    return "\n".join(lines)


def render_markdown(res: dict) -> str:
    from bench.bandwidth import machine_line

    if res["cells"][0].get("workload") == "fedcanon":
        return render_fedcanon(res)
    m = res["machine"]
    pfl, cells = [c for c in res["cells"] if c["state"] == "pfl"], [c for c in res["cells"] if c["state"] != "pfl"]
    lines = ["| algorithm | N | client data | client state | s/round | start-up s | peak RSS MiB (at start) | "
             "clients built | state rows written | state bytes | disk bytes/round (× cohort·d·4·stacks) |",
             "|---|---|---|---|---|---|---|---|---|---|---|", *(_row(c) for c in cells), *(_pfl_row(c) for c in pfl)]
    pairs = [(cells[j], cells[j + 1]) for j in range(0, len(cells), 2)]
    ratios = "; ".join(f"{big.get('algorithm', 'SCAFFOLD')} **{big['s_per_round'] / small['s_per_round']:.2f}×** "
                       f"(medians {', '.join(f'{x:.3f}' for x in big['all_s_per_round'])} against "
                       f"{', '.join(f'{x:.3f}' for x in small['all_s_per_round'])})" for big, small in pairs)
    big, small = pairs[0]
    what = ("d = 124 (`SparseLogistic`: 123 binary features, ~50 samples per client, binary cross-entropy)"
            if big.get("workload", "linear") == "linear" else
            f"the MNIST MLP, d = {big['dim']:,} (`MnistLike`: 50 samples of 1×28×28 per client, noise images "
            f"from a bank of 4,096, cross-entropy)")
    load = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    lines += ["", f"{what}; K = {big['K']} full local gradients, lr 0.05 (FedDR: eta 1, init_from='code'), cohort "
                  f"{big['cohort']}, {big['rounds']} rounds, float32, 1 torch thread, `metrics_every=0`. s/round: the "
                  f"median round of the less disturbed of {len(big['all_s_per_round'])} alternating runs; peak RSS: "
                  f"the highest; disk: the state files' allocated bytes at the end / rounds. s/round at N = "
                  f"{big['N']:,} on demand against N = {small['N']:,} in RAM: {ratios} (an on-demand round also "
                  f"builds its cohort's data).{_pfl_note(pfl, cells)}{_phases_note(cells)} {m['date']}; "
                  f"{machine_line(m)}; load average before {load(m['loadavg'])}, after {load(res['load_after'])}."]
    return "\n".join(lines)


def _phases_note(cells: list) -> str:
    """``--phases``: each configuration's ms a round in each phase (:func:`_per_round`)."""
    timed = [c for c in cells if c.get("phases_ms")]
    if not timed:
        return ""
    return " Ms a round (`--phases`: the median round's; clients built: the mean; gather / scatter of the client " \
           "rows, read-ahead of the next cohort's rows, clients built): " + "; ".join(
        f"{c.get('algorithm', 'SCAFFOLD')} N = {c['N']:,} {c['state']}: " + ", ".join(
            f"{k} {v:.1f}" for k, v in c["phases_ms"].items()) for c in timed) + "."


def _pfl_note(pfl: list, cells: list) -> str:
    """What the pfl row ran, and its s/round against ours on the same workload (SCAFFOLD at its N, on disk)."""
    if not pfl:
        return ""
    c = pfl[0]
    ours = next(x for x in cells if x.get("algorithm") == "SCAFFOLD" and x["N"] == c["N"])
    return (f" pfl-research {c['pfl_version']} (its own virtual environment, `bench/pfl_scaffold.py`): the same "
            f"SCAFFOLD (option II), K = {c['K']} full-batch epochs, each user's c_i in one file per user "
            f"(`DiskUserStateStorage`), its sampler drawing its own cohorts; s/round the median of its rounds after "
            f"the first (which also evaluates); pfl's s/round / ours (state='{ours['state']}'): "
            f"**{c['s_per_round'] / ours['s_per_round']:.2f}×**.")


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.population", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="linear",
                   help="linear: SCAFFOLD, d = 124, N = 10^6, state='ram' (default); mlp: SCAFFOLD and FedDR on the "
                        "MNIST MLP, N = 10^5, state='disk'")
    p.add_argument("--clients", type=int, default=None, help="N of the on-demand population (linear 10^6, mlp 10^5)")
    p.add_argument("--small", type=int, default=1000, help="N of the in-RAM list it is compared with (default 1000)")
    p.add_argument("--cohort", type=int, default=100)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("-K", type=int, default=None, help="local steps (linear 10, mlp 2)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each configuration, alternately (default 2)")
    p.add_argument("--out", default=None, help="default bench/results/population[-mlp].md")
    p.add_argument("--readme", default=None, help="also replace the workload's table block in this file")
    p.add_argument("--from-json", default=None, help="re-render a saved result, measuring nothing")
    p.add_argument("--executor", default="batched", help="fedcanon: the executor (default batched)")
    p.add_argument("--pfl-python", default=None, help="mlp: also pfl-research's SCAFFOLD with DiskUserStateStorage, "
                                                      "run by this interpreter (pfl's own virtual environment)")
    p.add_argument("--phases", action="store_true", help="also time each round's gathers, scatters, read-ahead and "
                                                         "clients built (ms a round; in the JSON and a note)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one configuration, JSON in and out
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    w = WORKLOADS[args.workload]
    args.clients = w["clients"] if args.clients is None else args.clients
    args.K = w["K"] if args.K is None else args.K
    out = args.out or f"bench/results/population{'' if args.workload == 'linear' else '-' + args.workload}.md"
    begin, end = markers(w["block"])
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.from_json:
        with open(args.from_json) as f:
            res = json.load(f)
    else:
        res = run(args, log)
    md = render_markdown(res)
    if not args.from_json:
        publish(md, res, out, args.readme, begin, end)
    else:
        if args.readme:
            update_readme(args.readme, md, begin, end)
        print(md)


if __name__ == "__main__":
    main()
