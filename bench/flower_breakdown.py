"""Where the seconds of one ``run --flower`` message go, next to Flower's floor (an echo ClientApp).

    python -m bench.flower_breakdown            # ~2 min on 2 quiet cores

The same workload as :mod:`bench.flower_table`, through a local deployment whose ServerApp is
``run --flower``'s own and whose ClientApp is ``run --flower``'s handlers wrapped in timers (this
module's ``clientapp``): for every message, the ClientApp process's CPU seconds and wall seconds
since it started at each step — Flower's part before the app (interpreter start, Flower's imports,
pulling the message), importing torch, importing python_algos, the node's setup (its rows, the
model, algorithm and h), and in the round handler: decoding the vectors, building the model and the
node's client set, assembling its State, the algorithm's work, encoding, and saving its state. The
echo app of :mod:`bench.flower_floor` reports its own Flower part the same way. CPU seconds hardly
move with the machine's load; wall seconds do (the load average is printed).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Optional, Sequence

from .flower_floor import app_start

__all__ = [
    "main",
    "clientapp",  # noqa: F822 -- built on first use by the module __getattr__ below (needs Flower)
]

PHASES = ("flower before the app", "import torch", "import python_algos", "node setup", "  of which: its rows",
          "decode vectors", "model + client set", "node State", "algorithm (client_update)", "encode vectors",
          "save node state", "handler total")


class _Timer:
    def __init__(self):
        self.t: dict = {}

    def wrap(self, name: str, fn):
        def timed(*a, **kw):
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                cpu, wall = self.t.get(name, (0.0, 0.0))
                self.t[name] = (cpu + time.process_time() - c0, wall + time.perf_counter() - w0)
        return timed


def _make_client():
    start = app_start()
    c0, w0 = time.process_time(), time.perf_counter()
    import torch  # noqa: F401

    t_torch = (time.process_time() - c0, time.perf_counter() - w0)
    c0, w0 = time.process_time(), time.perf_counter()
    import flwr.clientapp as fclient

    from python_algos.deploy import flower_client, persist
    from python_algos.experiments import flower_app, node_data

    t_pa = (time.process_time() - c0, time.perf_counter() - w0)
    timer = _Timer()
    for name, attr in (("decode vectors", "decode_vectors"), ("encode vectors", "encode_vectors"),
                       ("node State", "node_state"), ("algorithm (client_update)", "node_round")):
        setattr(flower_client, attr, timer.wrap(name, getattr(flower_client, attr)))
    flower_client.NodeClients = timer.wrap("model + client set", flower_client.NodeClients)
    persist.NodeStore.save = timer.wrap("save node state", persist.NodeStore.save)
    node_data.node_rows = timer.wrap("  of which: its rows", node_data.node_rows)
    app = fclient.ClientApp()

    def handle(kind, msg, context):
        c0, w0 = time.process_time(), time.perf_counter()
        rc = context.run_config
        state_dir = context.node_config.get("state-dir")
        s = timer.wrap("node setup", flower_app.node_setup)(
            str(rc["config-path"]), flower_client.node_client_id(context), str(state_dir) if state_dir else None,
            int(rc.get("threads", 1)))
        model_fn = timer.wrap("model + client set", s["model_fn"])
        cfg = s["cfg"]
        if kind == "hello":
            reply = flower_client.handle_hello(msg, context, s["algorithm"], s["model_fn"], s["regularizer"],
                                               cfg.seed, cfg.batch_size, lambda i, ctx: s["rows"])
        else:
            reply = flower_client.handle_round(msg, context, s["algorithm"], model_fn, s["loss"],
                                               lambda i, ctx: s["rows"], s["regularizer"], cfg.seed, cfg.batch_size)
        timer.t["handler total"] = (time.process_time() - c0, time.perf_counter() - w0)
        record = {"kind": kind, "flower before the app": (start["cpu"], start["wall"]), "import torch": t_torch,
                  "import python_algos": t_pa, **timer.t}
        with open(str(rc["timing-file"]), "a") as f:
            f.write(json.dumps(record) + "\n")
        return reply

    app.query("hello")(lambda msg, context: handle("hello", msg, context))
    app.train("round")(lambda msg, context: handle("round", msg, context))
    return app


def __getattr__(name):
    if name == "clientapp":
        globals()["clientapp"] = _make_client()
        return globals()["clientapp"]
    raise AttributeError(name)


def _app(folder: str, config: dict) -> str:
    from python_algos.deploy.app_project import write_app_project

    return write_app_project(folder, "pa-breakdown-app", "run --flower with timed client handlers",
                             "python_algos.experiments.flower_app:serverapp", "bench.flower_breakdown:clientapp",
                             {**config, "result-dir": ""})


def run_ours(rounds: int, folder: str) -> list:
    """The table's workload through ``run --flower``'s apps, the client's handlers timed: one record a message."""
    import secrets

    from python_algos.deploy.local import LocalDeployment
    from python_algos.experiments.config import Config

    cfg = Config(algorithm="scaffold", clients_per_round=2, dataset="sparse_logistic",
                 data_opts={"n": 240, "dim": 12}, num_clients=3, rounds=rounds, batch_size=8, dtype="float64",
                 executor="sequential", seed=3, threads=1, device="cpu")
    paths = {k: os.path.join(folder, k) for k in ("config.json", "timing.jsonl", "checkpoint.pt", "points", "nodes")}
    with open(paths["config.json"], "w") as f:
        json.dump(cfg.to_dict(), f)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {"PYTHONPATH": os.pathsep.join([root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    with LocalDeployment(3, env=env, node_config={"state-dir": paths["nodes"]}) as dep:
        app = _app(dep.dir, {"config-path": paths["config.json"], "threads": 1, "round-timeout": 300.0,
                             "connect-timeout": 120.0, "checkpoint": paths["checkpoint.pt"], "resume": False,
                             "points-dir": paths["points"], "run-key": secrets.token_hex(8),
                             "recorded-config": paths["config.json"], "timing-file": paths["timing.jsonl"]})
        dep.start_run(app, {}).wait(timeout=900)
    with open(paths["timing.jsonl"]) as f:
        return [json.loads(line) for line in f]


def _median(records: list, phase: str, j: int) -> Optional[float]:
    vals = [r[phase][j] for r in records if phase in r]
    return statistics.median(vals) if vals else None


def render(ours: list, floor: list, load: str) -> str:
    rounds = [r for r in ours if r["kind"] == "round"]
    later = rounds[3:] or rounds  # each node's first round runs init and the probe: left out where there are more
    lines = [f"One `run --flower` message (round handler; median of {len(later)} messages) next to Flower's echo "
             f"ClientApp ({len(floor)} messages). Load average {load}.", "",
             "| step | ours: CPU s | ours: wall s | echo: CPU s | echo: wall s |", "|---|---:|---:|---:|---:|"]
    for phase in PHASES:
        cells = [_median(later, phase, 0), _median(later, phase, 1), _median(floor, phase, 0),
                 _median(floor, phase, 1)]
        lines.append(f"| {phase} | " + " | ".join("–" if v is None else f"{v:.4f}" for v in cells) + " |")
    first = [r for r in ours if r["kind"] == "hello"]
    if first:
        lines += ["", f"The handshake (builds the split once, caches the node's rows): node setup "
                      f"{_median(first, 'node setup', 1):.3f} s wall, of which its rows "
                      f"{_median(first, '  of which: its rows', 1):.3f} s."]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    import argparse
    import tempfile

    from .flower_floor import run_floor

    p = argparse.ArgumentParser(prog="python -m bench.flower_breakdown", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args(argv)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="flower-breakdown-") as folder:
        timing = os.path.join(folder, "floor-timing.jsonl")
        run_floor(3, 2, args.rounds, 2, 12, seed=3, timing_file=timing)
        with open(timing) as f:
            floor = [json.loads(line) for line in f]
        ours = run_ours(args.rounds, folder)
    load += " -> " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(render(ours, floor, load))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
