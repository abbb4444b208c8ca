"""``python -m python_algos run ... --flower``: one run through a real local Flower deployment.

    prep = prepare_flower(cfg, "results/my-run")   # every check, nothing written, no process started
    summary = execute_flower(prep)                 # SuperLink + one SuperNode per client, then the run folder

What runs where: :class:`~python_algos.deploy.local.LocalDeployment` starts one SuperLink and one
SuperNode per client on 127.0.0.1 (``--insecure`` on loopback only). The apps are
:mod:`.flower_app`: every Flower process rebuilds the data split, the model, the
algorithm and h from the run's ``config.json`` with the command line's own builders, so the node of
client i holds client i's rows and draws its minibatches from a generator seeded exactly as in
simulation. In float64 the final model equals the one-process ``run``'s (tested to 1e-10).

The run folder has the usual format (``config.json``, ``partition.json``, ``metrics.jsonl``,
``summary.json`` with ``engine: "flower"``, ``model.pt`` with its round), so ``plot`` and
``History.load`` read it. The server holds no data: it records the reported model of every metric
round, and the objective metrics (f, h, f+h, ||G_s||², the normal map, sparsity, test metrics) are
computed here afterwards on the full data by simulate's own formula. Per round, ``sent_bytes`` /
``recv_bytes`` are the server's bytes on the wire (all participants) and ``wall_time`` the server's
round trip, Flower's per-message process start included.

Not yet: ``--resume`` (no server checkpoint), ``--workers``, several seeds, a GPU, and the algorithms
the deployment refuses (DEPOSITUM, FedDR's ``init_from='paper'``, FedCanon II): refused before
anything is written. Nothing is written before the Flower run has finished: Ctrl-C or a failure
(e.g. a node that stops) ends every process and leaves no run folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from typing import Callable

import torch

import fedkernels as fk

from .config import ConfigError
from .evaluation import make_eval
from .losses import loss_function
from .prepare import PreparedRun, prepare_run
from .run import _start_folder
from ..clients import resolve_executor
from ..runfolder import checkpoint as ckpt
from ..runfolder.files import _write_json, _write_jsonl
from ..simulate import objective_metrics

__all__ = ["check_flower_flags", "prepare_flower", "execute_flower", "ROUND_TIMEOUT", "CONNECT_TIMEOUT"]

ROUND_TIMEOUT = 300.0  # seconds a round may take before the run stops naming the node that did not answer
CONNECT_TIMEOUT = 120.0  # seconds for the N SuperNodes to connect
_ROW_KEYS = ("round", "wall_time", "elapsed", "prox_time", "prox_evals", "up", "down", "sent_bytes", "recv_bytes",
             "participants")


def check_flower_flags(*, workers=None, resume=None, seeds: bool = False, demo: bool = False,
                       distributed: bool = False) -> None:
    """The command-line combinations ``--flower`` cannot run (one line each, naming the flag), and Flower itself."""
    if demo:
        raise ValueError("--flower with --demo: the demo is a comparison of several algorithms; --flower runs one "
                         "(give -a ALGORITHM and the problem's flags)")
    if workers:
        raise ValueError("--flower with --workers: the Flower run already has one process per client (its "
                         "SuperNodes); leave out --workers")
    if resume:
        raise ValueError("--flower with --resume: not yet (a Flower run writes no checkpoint to continue from); "
                         "start the run again, or resume it without --flower")
    if seeds:
        raise ValueError("--flower with several seeds (--seeds or a --seed list): not yet; run one seed per command")
    if distributed:
        raise ValueError("--flower under torchrun: run the command in one process; Flower starts its own processes")
    if importlib.util.find_spec("flwr") is None or \
            not os.path.exists(os.path.join(os.path.dirname(sys.executable), "flower-superlink")):
        from ..deploy.flower import INSTALL
        raise ValueError(f"--flower needs Flower installed beside this Python ({sys.executable}): {INSTALL}")


def prepare_flower(cfg, out_dir: str, *, replace: bool = False) -> PreparedRun:
    """Every check of ``run`` (:func:`prepare_run`) plus those of a Flower deployment; writes nothing."""
    prep = prepare_run(cfg, out_dir, replace=replace)
    if prep.device.type != "cpu":
        raise ConfigError("device", cfg.device, f"--flower runs the clients and the server on the CPU (this picks "
                                                f"{prep.device}); give --device cpu")
    from ..algorithms.base import ServerClientAlgorithm
    from ..deploy.nodes import ServerClients, server_state

    alg = prep.algorithm
    if not isinstance(alg, ServerClientAlgorithm):
        why = "it is peer-to-peer, with no server" if alg.name == "DEPOSITUM" else "it has no server program"
        raise ConfigError("algorithm", cfg.algorithm, f"--flower deploys server–client algorithms; {alg.name} cannot "
                                                      f"be deployed: {why}")
    dim = sum(p.numel() for p in prep.model.parameters())
    p0 = next(prep.model.parameters())
    x0 = torch.zeros(dim, dtype=p0.dtype)  # the values do not matter: only whether init needs client data
    try:
        with torch.no_grad():
            server_state(alg, x0, ServerClients(len(prep.fed.parts), dim, p0.dtype))
    except ValueError as e:
        raise ValueError(f"--flower -a {cfg.algorithm}: {e}") from None
    return prep


def _python_path() -> str:
    """The folders holding python_algos and fedkernels, so that Flower's app processes import them."""
    import fedkernels
    import python_algos

    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(m.__file__))) for m in (python_algos, fedkernels)]
    dirs += [d for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d]
    return os.pathsep.join(dict.fromkeys(dirs))


def _write_app(folder: str, config_path: str, threads: int) -> str:
    """A Flower app folder whose components are :mod:`.flower_app`, configured with the run's Config."""
    app = os.path.join(folder, "pa-run-app")  # Flower's rule: the folder name is a valid app name
    os.makedirs(app, exist_ok=True)
    with open(os.path.join(app, "pyproject.toml"), "w") as f:
        f.write(f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "pa-run-app"
version = "1.0.0"
description = "python -m python_algos run --flower"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "python-algos"

[tool.flwr.app.components]
serverapp = "python_algos.experiments.flower_app:serverapp"
clientapp = "python_algos.experiments.flower_app:clientapp"

[tool.flwr.app.config]
config-path = {json.dumps(config_path)}
threads = {int(threads)}
round-timeout = {ROUND_TIMEOUT}
connect-timeout = {CONNECT_TIMEOUT}
result-dir = ""
""")
    return app


def _metric_rows(prep: PreparedRun, result: dict, saved: dict) -> tuple:
    """(initial row, per-round rows, divergence message or None): the server's records, with the
    objective metrics of each metric round computed here on the full data (simulate's formula)."""
    cfg, fed, alg, reg, model = prep.cfg, prep.fed, prep.algorithm, prep.reg, prep.model
    flat = fk.FlatParams(model)
    x0 = flat.params.detach().clone()
    make = resolve_executor("sequential", model)
    cs = make(model, loss_function(fed.dataset.task), fed.clients, batch_size=cfg.batch_size, seed=cfg.seed, flat=flat)
    eval_fn = make_eval(fed.dataset, model)
    step = float(cfg.metric_step) if cfg.metric_step is not None else float(alg.metric_step())

    def evaluate(x, normal_map) -> dict:
        out = objective_metrics(cs, reg, x, step, normal_map)
        flat.bind_(x.clone())
        out.update(eval_fn(x))
        return out

    initial = {"round": 0}
    if cfg.metrics_every:
        with torch.no_grad():
            state0 = alg.init(x0.clone(), cs)  # the server's start, as simulate's round 0
            initial.update(evaluate(alg.report(state0, reg).detach(), alg.normal_map_point(state0)))
    at = {p["round"]: p for p in saved["points"]}
    rows, diverged = [], saved.get("diverged")
    for rec in result["metrics"]:
        row = {k: rec[k] for k in _ROW_KEYS if k in rec}
        p = at.get(rec["round"])
        if p is not None:
            row.update(evaluate(p["x"].to(x0.dtype), p["normal_map"]))
        rows.append(row)
        if p is not None and not torch.isfinite(torch.tensor(row["f+h"])):
            diverged = f"round {rec['round']}: f+h = {row['f+h']}"
            break
    flat.bind_(result["params"].to(x0.dtype).clone(), torch.zeros_like(x0))  # the model holds the final params
    return initial, rows, diverged


def execute_flower(prep: PreparedRun, *, log: Callable[[str], None] = print, label=None) -> dict:
    """Run a :func:`prepare_flower`-checked run through a local Flower deployment; returns the summary."""
    from .flower_app import POINTS_FILE
    from ..deploy.local import LocalDeployment

    cfg, out_dir = prep.cfg, prep.out_dir
    n = len(prep.fed.parts)
    label = label or cfg.algorithm
    node_cfg = cfg.replace(device="cpu", data_dir=os.path.abspath(cfg.data_dir) if cfg.data_dir else None)
    t0 = time.perf_counter()
    with LocalDeployment(n, env={"PYTHONPATH": _python_path()}) as dep:
        config_path = os.path.join(dep.dir, "run-config.json")
        with open(config_path, "w") as f:
            json.dump(node_cfg.to_dict(), f)
        app = _write_app(dep.dir, config_path, cfg.threads or 1)
        log(f"flower: a SuperLink and {n} SuperNodes on 127.0.0.1 (logs in {dep.dir} while it runs)")
        result = dep.run(app, {}, timeout=CONNECT_TIMEOUT + 60 + ROUND_TIMEOUT * max(cfg.rounds, 1))
        saved = torch.load(os.path.join(dep.dir, "result", POINTS_FILE), weights_only=False)
    run_seconds = time.perf_counter() - t0

    initial, rows, diverged = _metric_rows(prep, result, saved)
    _start_folder(prep, log)  # config.json, partition.json (every check passed, the run is done)
    _write_jsonl(os.path.join(out_dir, "metrics.jsonl"), [initial, *rows])
    last_obj = next((r for r in reversed(rows) if "f+h" in r), rows[-1] if rows else initial)
    alg, model = prep.algorithm, prep.model
    summary = {
        "label": label,
        "algorithm": alg.name,
        "hparams": alg.hparams(),
        "engine": "flower",
        "status": "diverged" if diverged else "completed",
        "message": None,
        "rounds": cfg.rounds,
        "rounds_done": rows[-1]["round"] if rows else 0,
        "final": last_obj,
        "initial": initial,
        "elapsed": rows[-1].get("elapsed", 0.0) if rows else 0.0,
        "process_seconds": run_seconds,
        "regularizer": repr(prep.reg),
        "dataset": prep.fed.dataset.source,
        "partition": cfg.partition,
        "num_clients": n,
        "dim": sum(p.numel() for p in model.parameters()),
        "executor": "flower",
        "world_size": n + 1,  # the server and one node per client
        "threads": cfg.threads or 1,
        "out_dir": out_dir,
        "last_checkpoint_round": None,
        "resume_command": None,  # not yet: see the module docstring
        "nodes": {str(k): v for k, v in result["nodes"].items()},
    }
    if diverged:
        summary["message"] = (f"{label} diverged at {diverged}; the run was stopped. Lower the step size "
                              f"(--lr, currently {cfg.lr:g}) or the local steps.")
    else:  # model.pt records its round, as the one-process run's
        ckpt.atomic_save({"params": result["params"].cpu(), "round": rows[-1]["round"] if rows else 0,
                          "state_dict": {k: v.cpu() for k, v in model.state_dict().items()}},
                         os.path.join(out_dir, "model.pt"))
    _write_json(os.path.join(out_dir, "summary.json"), summary)
    return summary
