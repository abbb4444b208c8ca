"""The distributed table: one process vs P processes (torch.distributed, gloo) on one machine.

    python -m bench.distributed_table                       # the default grid, ~2 min on 2 cores
    python -m bench.distributed_table --readme docs/performance.md   # also refresh the table there

For N = 100 MNIST-shaped clients (256 samples each) with the MLP, K = 10 local steps, batch 32,
float32, FedAvg and FedCanon: seconds per round (median of the rounds after the first) in one
process with the ``sequential`` / ``batched`` executor, and on P ranks with the ``distributed``
executor wrapping the same inner executor; bytes per round that each rank hands to
torch.distributed (the algorithm's all-reduces, ``comm.sent_bytes``). Every rank uses 1 torch
thread. Then the peak resident memory of each rank (``ru_maxrss``) for N = 100 and N = 1000 clients
after one FedAvg round on the sequential executor: the clients are a lazy sequence, so a rank
builds only its shard's data (N/P clients x 256 x 784 float32 = N/P x 0.8 MB), as a user's
sequence that loads from disk would.

The ranks are spawned with ``torch.multiprocessing`` and join through the same environment
variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). Each rank's
final model is compared with the one-process run of the same inner executor (relative deviation
in the table): the ranks did the same work.

pfl (Apple's pfl-research, which also simulates on several processes) is timed only where it is
importable; the table says when it was not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from .readme_block import markers, publish

README_BEGIN, README_END = markers("distributed-table")


class LazyClients:
    """N MNIST-shaped clients built on access from client i's own seed (x = mean[y] + noise, labels
    skewed per client, as bench.clients.make_clients): a rank touching only its shard builds only it."""

    def __init__(self, n: int, samples: int = 256, seed: int = 0):
        self.n, self.samples, self.seed = n, samples, seed
        g = torch.Generator().manual_seed(seed)
        self.means = torch.randn(10, 1, 28, 28, generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(i)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i + 1)
        y = (torch.randint(0, 10, (self.samples,), generator=g) + i) % 10
        return self.means[y] + torch.randn(self.samples, 1, 28, 28, generator=g), y


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _one_run(algorithm: str, clients, executor: str, options: Optional[dict], K: int, batch: int, rounds: int):
    import python_algos as pa
    from bench.clients import ALGORITHMS, make_model

    hist = pa.simulate(ALGORITHMS[algorithm](0.01, K), make_model("mlp"), F.cross_entropy, clients, rounds,
                       batch_size=batch, metrics_every=0, executor=executor, executor_options=options)
    rows = hist.metrics[1:] if len(hist.metrics) > 1 else hist.metrics
    return {"s_per_round": statistics.median(r["wall_time"] for r in rows),
            "sent_bytes_per_round": statistics.median(r.get("sent_bytes", 0) for r in rows),
            "recv_bytes_per_round": statistics.median(r.get("recv_bytes", 0) for r in rows),
            "params": hist.params.clone()}


def _rank(rank: int, world: int, port: int, out: str, job: dict) -> None:
    """One rank (or the single process when world == 0): the timing cells, then the memory cell."""
    if world:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import fedkernels as fk

    fk.set_num_threads(1)
    import python_algos  # noqa: F401  (in the start-up figure, like torch)

    res = {"rss_start_mib": _rss_mib(), "cells": []}
    clients = LazyClients(job["N"], job["samples"])
    for inner in job["inners"]:
        for alg in job["algorithms"]:
            executor, options = ("distributed", {"inner": inner}) if world else (inner, None)
            r = _one_run(alg, clients, executor, options, job["K"], job["batch"], job["rounds"])
            r.update(algorithm=alg, inner=inner)
            res["cells"].append(r)
        res[f"rss_after_{inner}_mib"] = _rss_mib()
    res["rss_peak_mib"] = _rss_mib()
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))
    if world:
        from python_algos.experiments.launch import finish

        finish()


def _launch(world: int, job: dict, log) -> list:
    """Run ``job`` on ``world`` spawned ranks (0: one plain process); returns each rank's results."""
    import socket

    import torch.multiprocessing as mp

    from python_algos.clients.process_group import bounds  # noqa: F401  (fail here, not in the children)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        mp.start_processes(_rank, args=(world, port, out, job), nprocs=max(world, 1), join=True,
                           start_method="spawn")
        log(f"  {max(world, 1)} process(es), N={job['N']}: {time.perf_counter() - t0:.0f} s")
        return [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(max(world, 1))]


def _pfl_note() -> str:
    # pfl runs one local epoch per client (its local loop stops after one pass over the data), so it
    # is timed on that workload in bench/peers.py, next to our 1- and 2-process rows, not here.
    return ("pfl-research's 1- and 2-process runs are in the peers table (`python -m bench.peers`), "
            "timed on its one-epoch workload.")


def run(args, log=print) -> dict:
    from bench.bandwidth import machine_info

    info = machine_info()
    job = {"N": args.clients, "samples": args.samples, "K": args.K, "batch": args.batch, "rounds": args.rounds,
           "algorithms": args.algorithms, "inners": args.executors}
    timing = {}
    for P in [0, *args.processes]:
        log(f"timing: {'one process' if P == 0 else f'{P} ranks'}")
        timing[P] = _launch(P, job, log)
    memory = {}
    for N in args.memory_clients:
        for P in [0, *args.processes]:
            log(f"memory: N={N}, {'one process' if P == 0 else f'{P} ranks'}")
            memory[(N, P)] = _launch(P, {**job, "N": N, "rounds": 1, "algorithms": ["FedAvg"],
                                         "inners": ["sequential"]}, log)
    cells = []
    for c0 in timing[0][0]["cells"]:
        row = {"algorithm": c0["algorithm"], "inner": c0["inner"], "one_process_s": c0["s_per_round"]}
        for P in args.processes:
            mine = [next(c for c in ranks["cells"] if c["algorithm"] == c0["algorithm"] and c["inner"] == c0["inner"])
                    for ranks in timing[P]]
            row[f"p{P}_s"] = mine[0]["s_per_round"]
            row[f"p{P}_sent_bytes"] = max(c["sent_bytes_per_round"] for c in mine)
            row[f"p{P}_rel_dev"] = max(float((c["params"] - c0["params"]).norm() / c0["params"].norm()) for c in mine)
        cells.append(row)
    mem = [{"N": N, "processes": max(P, 1), "distributed": P > 0,
            "rss_peak_mib": [r["rss_peak_mib"] for r in ranks], "rss_start_mib": [r["rss_start_mib"] for r in ranks]}
           for (N, P), ranks in memory.items()]
    dim = int(sum(p.numel() for p in __import__("bench.clients", fromlist=["make_model"]).make_model("mlp")
                  .parameters()))
    return {"machine": info, "job": job, "processes": args.processes, "dim": dim, "cells": cells, "memory": mem,
            "load_after": list(os.getloadavg()), "pfl": _pfl_note()}


def _kb(b) -> str:
    return f"{b / 1024:.0f} KiB"


def render_markdown(res: dict) -> str:
    from bench.bandwidth import machine_line

    m, job = res["machine"], res["job"]
    Ps = res["processes"]
    head = ["algorithm", "executor (per process)", "1 process (s/round)"]
    for P in Ps:
        head += [f"{P} ranks (s/round)", "speed-up", f"bytes/round per rank ({P} ranks)", "rel. dev. vs 1 process"]
    lines = [
        f"Seconds per round (median of rounds 2..{job['rounds']}), MLP ({res['dim']:,} parameters), "
        f"N = {job['N']} clients x {job['samples']} samples, K = {job['K']} local steps, batch {job['batch']}, "
        f"float32, 1 torch thread per process, ranks on one machine over gloo (TCP on localhost). "
        f"{machine_line(m)}; load average before {', '.join(f'{x:.2f}' for x in m['loadavg'])}, after "
        f"{', '.join(f'{x:.2f}' for x in res['load_after'])}; {m['date']}. `python -m bench.distributed_table`.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for c in res["cells"]:
        cols = [c["algorithm"], c["inner"], f"{c['one_process_s']:.3f}"]
        for P in Ps:
            cols += [f"{c[f'p{P}_s']:.3f}", f"{c['one_process_s'] / c[f'p{P}_s']:.2f}×", _kb(c[f"p{P}_sent_bytes"]),
                     f"{c[f'p{P}_rel_dev']:.1e}"]
        lines.append("| " + " | ".join(cols) + " |")
    lines += ["", "Peak resident memory per process (MiB, `ru_maxrss` after one FedAvg round, sequential executor; "
                  "start-up: after importing torch and python_algos, before any client exists; ranks listed "
                  "0 / 1 / ...):", "",
              "| N | processes | peak RSS per process | start-up RSS |", "|---|---|---|---|"]
    for r in res["memory"]:
        lines.append(f"| {r['N']} | {r['processes']}{' (ranks)' if r['distributed'] else ''} | "
                     f"{' / '.join(f'{v:.0f}' for v in r['rss_peak_mib'])} | "
                     f"{' / '.join(f'{v:.0f}' for v in r['rss_start_mib'])} |")
    lines += ["", f"Bytes/round: what each rank hands to torch.distributed for the algorithm (the payload of its "
                  f"all-reduces, {res['dim']:,} float32 = {_kb(res['dim'] * 4)} per d-vector; a ring all-reduce moves "
                  f"about 2(P−1)/P times that over the wire). Rel. dev.: ‖x_P − x_1‖ / ‖x_1‖ of the final models "
                  f"(float32; only the summation order of the client mean differs). {res['pfl']}"]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.distributed_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=100, help="N for the timing rows (default 100)")
    p.add_argument("--processes", nargs="+", type=int, default=[2], help="ranks to compare with one process")
    p.add_argument("--algorithms", nargs="+", default=["FedAvg", "FedCanon"], choices=["FedAvg", "FedCanon"])
    p.add_argument("--executors", nargs="+", default=["sequential", "batched"], choices=["sequential", "batched"])
    p.add_argument("--memory-clients", nargs="*", type=int, default=[100, 1000], help="N values of the memory rows")
    p.add_argument("-K", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="bench/results/distributed_table.md")
    p.add_argument("--readme", default=None, help="also replace the distributed table block in this file")
    p.add_argument("--from-json", default=None, help="re-render a saved result, measuring nothing")
    args = p.parse_args(argv)
    if any(P < 2 for P in args.processes):
        p.error("--processes: every value must be >= 2 (one process is always measured)")
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.from_json:
        with open(args.from_json) as f:
            res = json.load(f)
    else:
        res = run(args, log)
    md = render_markdown(res)
    if not args.from_json:
        publish(md, res, args.out, args.readme, README_BEGIN, README_END)


if __name__ == "__main__":
    main()
