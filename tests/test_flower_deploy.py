"""A real local Flower deployment (SuperLink + one SuperNode per client, separate processes on
127.0.0.1) of examples/flower_app reproduces simulate(); a SuperNode killed mid-run stops the run
with an error naming the client, no result, and no process left behind.

Slow (Flower starts one ClientApp process per message): marked ``slow``.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("flwr", reason='Flower is not installed: pip install ".[flower]"')

import _example_app as example_app  # noqa: E402

from python_algos.deploy.local import DeploymentError, LocalDeployment  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(ROOT, "examples", "flower_app")
pytestmark = pytest.mark.slow






def _env():
    path = os.pathsep.join([ROOT, APP, os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path}




def _close(got, want):
    return float((got - want).abs().max()) <= 1e-10 * (1 + float(want.abs().max()))


# SCAFFOLD with 2 of 3 clients per round through real processes: below and tests/test_flower_cli.py.
# Each real-process run costs tens of seconds, mostly waiting (Flower starts a ClientApp process for
# every message, and an idle SuperNode polls every 3 s), so the three algorithms run at the same time
# on one deployment: each node handles the runs' messages in turn.
def test_local_deployment_equals_simulate():
    cfgs = {a: example_app.config(rounds=2, **{"num-clients": 2, "algorithm": a})
            for a in ("fedcanon", "za1", "fednmap")}
    with LocalDeployment(2, env=_env()) as dep:
        runs = {a: dep.start_run(APP, cfg) for a, cfg in cfgs.items()}
        got = {a: run.wait(timeout=400) for a, run in runs.items()}
        started = dep.procs.copy()
    for a, cfg in cfgs.items():
        want = example_app.simulate(cfg)
        assert _close(got[a]["params"], want.params), a
        assert not torch.equal(got[a]["params"], example_app.task().model_fn(cfg)().weight.detach().reshape(-1))
    assert all(p.poll() is not None for p in started.values())


def test_a_killed_supernode_stops_the_run_naming_the_client_and_the_run_resumes_exactly(tmp_path):
    """Client 2 (in every round of this draw) is killed once the server's checkpoint of round 1 exists:
    the run stops naming it, with no result. Client 2's SuperNode is started again (the SuperLink still
    lists the dead one for a while) and the same run with resume=true ends where simulate() ends:
    the server continues from its checkpoint, each node from its own state in its state-dir."""
    import threading
    import time

    server = tmp_path / "server.pt"
    # round-timeout: long enough for a round on a slow or loaded 2-core machine (each message starts a
    # ClientApp process: ~5 s of imports there), since the dead node is found only when it runs out
    cfg = example_app.config(rounds=3, **{"num-clients": 3, "round-timeout": 45.0, "algorithm": "scaffold",
                               "clients-per-round": 2, "checkpoint": str(server)})
    # watch_nodes=False: the server must find the dead node itself (its round timeout)
    with LocalDeployment(3, env=_env(), node_config={"state-dir": str(tmp_path / "nodes")},
                         watch_nodes=False) as dep:
        def kill_after_first_round():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not server.exists():
                time.sleep(0.2)
            dep.kill_node(2)

        threading.Thread(target=kill_after_first_round, daemon=True).start()
        with pytest.raises(DeploymentError, match=r"NodeFailure: round \d: client 2 \(node \d+\).*The server's "
                                                  r"checkpoint of round \d is .*server\.pt: restart the node"):
            dep.start_run(APP, cfg).wait(timeout=400)
        assert not os.path.exists(os.path.join(dep.result_dir, "result.pt"))
        dep.start_node(2)
        got = dep.start_run(APP, {**cfg, "resume": True}).wait(timeout=400)
        groups = dict(dep.procs)
    assert _close(got["params"], example_app.simulate(cfg).params)
    assert [m["round"] for m in got["metrics"]] == [1, 2, 3]
    assert [p for p in groups.values() if p.poll() is None] == []
