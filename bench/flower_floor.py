"""Flower's own floor: what a round costs when the ClientApp does nothing but echo its arrays.

The ClientApp here imports Flower and numpy only and sends back the arrays it got; the ServerApp
sends ``arrays`` vectors of ``dim`` float64 to ``per_round`` of the nodes each round, pushed once and
pulled every ``POLL`` seconds as ``run --flower``'s server does (:func:`python_algos.deploy.exchange.collect`),
through the same :class:`~python_algos.deploy.local.LocalDeployment` (one SuperLink, one SuperNode
per client, a ClientApp process per message). Its seconds per round are what Flower 1.41 costs
whatever the app does: :mod:`bench.flower_table` sets ``--flower``'s against them.

This module is also the Flower app (``bench.flower_floor:serverapp`` / ``:clientapp``): importing it
must stay as light as the floor it measures (no torch, no python_algos at import).
"""

from __future__ import annotations

import json
import os
import random
import time

_T0 = {"cpu": time.process_time(), "wall": time.time()}  # when Flower started importing this app

__all__ = [
    "run_floor", "FLOOR_FILE", "process_clock",
    "clientapp",  # noqa: F822 -- built on first use by the module __getattr__ below (needs Flower)
    "serverapp",  # noqa: F822 -- likewise
]

FLOOR_FILE = "floor.json"


def process_clock() -> dict:
    """This process's CPU seconds and wall seconds since it started (Linux: /proc/self/stat)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    return {"cpu": time.process_time(), "wall": up - start_ticks / os.sysconf("SC_CLK_TCK")}


def app_start() -> dict:
    """CPU and wall seconds of this process when Flower started importing the app (Flower's part before it)."""
    now = process_clock()
    return {"cpu": _T0["cpu"], "wall": now["wall"] - (time.time() - _T0["wall"])}


def _client_echo(msg, context):
    import flwr.app as fapp

    reply = fapp.Message(fapp.RecordDict({"up": msg.content["vectors"]}), reply_to=msg)
    where = str(context.run_config.get("timing-file", ""))
    if where:  # bench.flower_breakdown: Flower's own part of a message, as the timed run --flower app records it
        start = app_start()
        with open(where, "a") as f:
            f.write(json.dumps({"kind": "echo", "flower before the app": (start["cpu"], start["wall"])}) + "\n")
    return reply


def _wait_nodes(grid, n: int, timeout: float) -> list:
    until = time.monotonic() + timeout
    while len(ids := list(grid.get_node_ids())) < n:
        if time.monotonic() > until:
            raise RuntimeError(f"only {len(ids)} of {n} nodes connected within {timeout:g} s")
        time.sleep(0.1)
    return sorted(ids)


def _server_main(grid, context) -> None:
    import flwr.app as fapp
    import numpy as np

    from python_algos.deploy.exchange import collect

    rc = context.run_config
    n, k, rounds = int(rc["nodes"]), int(rc["per-round"]), int(rc["rounds"])
    arrays, dim = int(rc["arrays"]), int(rc["dim"])
    nodes = _wait_nodes(grid, n, 120.0)
    draw = random.Random(int(rc["seed"]))
    vectors = {f"v{j}": np.full(dim, float(j)) for j in range(arrays)}
    rows = []
    for t in range(1, rounds + 1):
        out = [fapp.Message(fapp.RecordDict({"vectors": fapp.ArrayRecord({k_: fapp.Array(v) for k_, v in
                                                                          vectors.items()})}),
                            nid, "train.echo", group_id=str(t)) for nid in draw.sample(nodes, k)]
        t0 = time.perf_counter()
        got = collect(grid, out, 300.0)
        wall = time.perf_counter() - t0
        if len(got) != k or any(r.has_error() for r in got):
            raise RuntimeError(f"round {t}: {len(got)} of {k} echoes came back")
        sent = sum(len(a.data) for m in out for a in m.content["vectors"].values())
        recv = sum(len(a.data) for r in got for a in r.content["up"].values())
        rows.append({"round": t, "wall_time": wall, "sent_bytes": sent, "recv_bytes": recv})
    os.makedirs(str(rc["result-dir"]), exist_ok=True)
    with open(os.path.join(str(rc["result-dir"]), FLOOR_FILE), "w") as f:
        json.dump(rows, f)


def _make_apps():
    import flwr.clientapp as fclient
    import flwr.serverapp as fserver

    server, client = fserver.ServerApp(), fclient.ClientApp()
    server.main()(_server_main)
    client.train("echo")(_client_echo)
    return server, client


def __getattr__(name):  # the apps are built on first use (Flower imports this module for them)
    if name in ("serverapp", "clientapp"):
        server, client = _make_apps()
        globals().update(serverapp=server, clientapp=client)
        return globals()[name]
    raise AttributeError(name)


def _write_app(folder: str, nodes: int, per_round: int, rounds: int, arrays: int, dim: int, seed: int,
               timing_file: str = "") -> str:
    from python_algos.deploy.app_project import write_app_project  # here: the echo app itself imports no torch

    return write_app_project(folder, "pa-floor-app", "Flower's floor: an echo ClientApp",
                             "bench.flower_floor:serverapp", "bench.flower_floor:clientapp",
                             {"nodes": int(nodes), "per-round": int(per_round), "rounds": int(rounds),
                              "arrays": int(arrays), "dim": int(dim), "seed": int(seed), "timing-file": timing_file,
                              "result-dir": ""})


def run_floor(nodes: int, per_round: int, rounds: int, arrays: int, dim: int, seed: int = 0,
              timeout: float = 900.0, timing_file: str = "") -> dict:
    """Run the echo app through a fresh local deployment; per-round records and the command's seconds.
    ``timing_file``: each echo appends its process's seconds before the app to it (JSON lines)."""
    from python_algos.deploy.local import LocalDeployment

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join([root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    t0 = time.perf_counter()
    with LocalDeployment(nodes, env={"PYTHONPATH": path}) as dep:
        app = _write_app(dep.dir, nodes, per_round, rounds, arrays, dim, seed, timing_file)
        run = dep.start_run(app, {})
        deadline = time.monotonic() + timeout
        while run.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        out = os.path.join(run.result_dir, FLOOR_FILE)
        if not os.path.exists(out):
            raise RuntimeError(f"the floor run ended without {FLOOR_FILE}:\n{dep.log(run.name)}")
        with open(out) as f:
            rows = json.load(f)
    return {"rows": rows, "command_s": time.perf_counter() - t0}
