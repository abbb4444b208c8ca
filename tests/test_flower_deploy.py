"""A real local Flower deployment (SuperLink + one SuperNode per client, separate processes on
127.0.0.1) of examples/flower_app reproduces simulate(); a SuperNode killed mid-run stops the run
with an error naming the client, no result, and no process left behind.

Slow (Flower starts one ClientApp process per message): marked ``slow``.
"""

from __future__ import annotations

import os
import sys
import tomllib
import warnings

import pytest
import torch

pytest.importorskip("flwr", reason='Flower is not installed: pip install ".[flower]"')

import python_algos as pa  # noqa: E402
from python_algos.deploy.local import DeploymentError, LocalDeployment  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(ROOT, "examples", "flower_app")
pytestmark = pytest.mark.slow


def _task():
    sys.path.insert(0, APP)
    try:
        from pa_flower_app import task
    finally:
        sys.path.remove(APP)
    return task


def _config(**over):
    with open(os.path.join(APP, "pyproject.toml"), "rb") as f:
        cfg = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    return {**cfg, **over}


def _env():
    path = os.pathsep.join([ROOT, APP, os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path}


def _simulate(cfg):
    task = _task()
    s = task.settings(cfg)
    data = [task.load_data(cfg)(i, None) for i in range(s["num_clients"])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pa.simulate(task.algorithm(cfg), task.model_fn(cfg)(), task.loss, data, s["rounds"], s["regularizer"],
                           batch_size=s["batch_size"], seed=s["seed"], clients_per_round=s["clients_per_round"],
                           metrics_every=0)


# SCAFFOLD with 2 of 3 clients per round through real processes: tests/test_flower_cli.py (run --flower);
# each real-process run costs about a minute, so the default suite runs one per path.
@pytest.mark.parametrize("over", [{"algorithm": "za1"}])
def test_local_deployment_equals_simulate(over):
    cfg = _config(rounds=2, **{"num-clients": 3}, **over)
    with LocalDeployment(3, env=_env()) as dep:
        got = dep.run(APP, cfg, timeout=400)
        started = dep.procs.copy()
    want = _simulate(cfg)
    assert float((got["params"] - want.params).abs().max()) <= 1e-10 * (1 + float(want.params.abs().max()))
    assert not torch.equal(got["params"], _task().model_fn(cfg)().weight.detach().reshape(-1))
    assert all(p.poll() is not None for p in started.values())


def test_a_killed_supernode_stops_the_run_naming_the_client():
    cfg = _config(rounds=30, **{"num-clients": 3, "round-timeout": 20.0})
    with LocalDeployment(3, env=_env()) as dep:
        import threading
        import time

        def kill_after_first_round():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and dep.log("supernode-1").count("Sent successfully") < 2:
                time.sleep(0.5)
            dep.kill_node(1)

        threading.Thread(target=kill_after_first_round, daemon=True).start()
        with pytest.raises(DeploymentError, match=r"client 1 \(node \d+\)"):
            dep.run(APP, cfg, timeout=400)
        assert not os.path.exists(os.path.join(dep.dir, "result", "result.pt"))
        groups = dict(dep.procs)
    dep_left = [p for p in groups.values() if p.poll() is None]
    assert dep_left == []
