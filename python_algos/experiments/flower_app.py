"""The Flower apps behind ``python -m python_algos run --flower`` (see :mod:`.flower_run`).

They belong to the experiments layer (they rebuild a command-line run); the server and client
programs themselves are :mod:`python_algos.deploy.flower`'s.

Flower starts the ServerApp and each ClientApp in processes of its own, so the apps cannot be handed
Python objects: they rebuild them from the run's settings. The run config names a ``config.json``
(a :class:`~python_algos.experiments.config.Config`, written by the parent command); every process
builds the model, the algorithm and the regularizer from it with the command line's own builders
(``experiments.build``), which are deterministic in the Config's seeds, and the server the data
split. A node needs only its own rows: its first message builds the split and keeps them in the
node's ``state-dir`` (:mod:`.node_data`), the following ones read them from there. So the node of
client i holds exactly the rows ``run`` gives client i, starts from the same model, and draws its
minibatches from a generator seeded as in simulation (:mod:`python_algos.deploy.flower`); the handshake of
:func:`~python_algos.deploy.flower.run_server` compares every node's settings with the server's anyway.

The ServerApp keeps the run's config as the parent command recorded it (the run config's
``recorded-config``) in every checkpoint, so that a resume compares config.json with it as a
one-process resume does. It writes the reported model (and the normal-map point, where the algorithm has one)
of every metric round to the run config's ``points-dir`` (one file a round), its checkpoint to
``checkpoint`` (a resume continues from it), a line per round ended to ``rounds.jsonl`` (the
parent's progress display reads it as it grows), and, beside
:func:`~python_algos.deploy.flower.save_result`'s ``result.pt``, ``status.pt`` (divergence) or, if
it stopped on an error, ``error.txt``. The server holds no data, so the parent command computes the
objective metrics on those points with the full data, with simulate's own formula
(``simulate.objective_metrics``).
"""

from __future__ import annotations

import json
import os
from typing import Optional

import torch

from ..deploy.flower import (
    flwr_modules,
    handle_hello,
    handle_round,
    load_server_checkpoint,
    node_client_id,
    run_server,
    save_result,
    write_error,
)
from ..deploy.persist import RoundFiles

__all__ = [
    "clientapp",  # noqa: F822 -- built on first use by the module __getattr__ below (needs Flower)
    "serverapp",  # noqa: F822 -- likewise
    "load_setup", "node_setup", "STATUS_FILE", "ROUNDS_FILE",
]

STATUS_FILE = "status.pt"
ROUNDS_FILE = "rounds.jsonl"  # one line per round as it ends (the parent command's progress display)
_CACHE: dict = {}  # config path (and client) -> setup (one process may serve several messages)


def load_setup(path: str, threads: int = 1) -> dict:
    """The run's pieces from the Config at ``path``: data split, model builder, loss, algorithm, h."""
    if path in _CACHE:
        return _CACHE[path]
    from .build import build_algorithm, build_model, build_run_regularizer, prepare_data
    from .folders import read_config_json
    from .losses import loss_function

    torch.set_num_threads(max(1, int(threads)))  # N nodes + the server share the machine
    cfg = read_config_json(path)
    fed = prepare_data(cfg)

    def model_fn():
        return build_model(cfg, fed.dataset)  # seeded: the same parameters in every process

    setup = {"cfg": cfg, "fed": fed, "model_fn": model_fn, "loss": loss_function(fed.dataset.task),
             "algorithm": build_algorithm(cfg), "regularizer": build_run_regularizer(cfg, model_fn())}
    _CACHE[path] = setup
    return setup


def node_setup(path: str, client_id: int, state_dir: Optional[str], threads: int = 1) -> dict:
    """A client node's pieces: its own rows (cached in its ``state_dir``: :mod:`.node_data`), the
    model builder, loss, algorithm and h, without the rest of the data."""
    key = (path, int(client_id), state_dir)
    if key in _CACHE:
        return _CACHE[key]
    from .build import build_algorithm, build_model, build_run_regularizer
    from .folders import read_config_json
    from .losses import loss_function
    from .node_data import node_rows

    torch.set_num_threads(max(1, int(threads)))
    cfg = read_config_json(path)
    rows, shape = node_rows(cfg, int(client_id), state_dir)

    def model_fn():
        return build_model(cfg, shape)  # seeded: the same parameters in every process

    setup = {"cfg": cfg, "rows": rows, "model_fn": model_fn, "loss": loss_function(shape.task),
             "algorithm": build_algorithm(cfg), "regularizer": build_run_regularizer(cfg, model_fn())}
    _CACHE[key] = setup
    return setup


def _setup(context) -> dict:
    rc = context.run_config
    return load_setup(str(rc["config-path"]), int(rc.get("threads", 1)))


def _node(context) -> dict:
    rc = context.run_config
    state_dir = context.node_config.get("state-dir")
    return node_setup(str(rc["config-path"]), node_client_id(context), str(state_dir) if state_dir else None,
                      int(rc.get("threads", 1)))


def _metric_round(t: int, cfg) -> bool:
    """simulate's rule: every ``metrics_every`` rounds and after the last."""
    return bool(cfg.metrics_every) and (t % cfg.metrics_every == 0 or t == cfg.rounds)


def server_main(grid, context) -> None:
    s = _setup(context)
    cfg, alg, reg = s["cfg"], s["algorithm"], s["regularizer"]
    rc = context.run_config
    out, points, path = str(rc["result-dir"]), RoundFiles(str(rc["points-dir"])), str(rc["checkpoint"])
    status = {"diverged": None}
    try:
        with open(str(rc["recorded-config"])) as f:  # the run's config.json as the parent command read it
            recorded = {"config": json.load(f)}  # kept in every checkpoint: a resume compares it with config.json
        resume = load_server_checkpoint(path) if rc["resume"] else None

        os.makedirs(out, exist_ok=True)

        def record(t, state, rec):
            with open(os.path.join(out, ROUNDS_FILE), "a") as f:  # whole lines: the parent reads as it grows
                f.write(json.dumps({"round": t, "elapsed": rec["elapsed"]}) + "\n")
            with torch.no_grad():
                x = alg.report(state, reg).detach().clone()
            if not bool(torch.isfinite(x).all()):  # as the one-process run: stop at a non-finite model
                status["diverged"] = f"round {t}: the model has NaN/Inf entries"
                return True
            if _metric_round(t, cfg):  # one file per metric round, written before the round's checkpoint
                nm = alg.normal_map_point(state)
                points.save(t, {"round": t, "x": x,
                                "normal_map": None if nm is None else (nm[0].detach().clone(), float(nm[1]))})
            return None

        every = int(cfg.checkpoint_every) or cfg.rounds + 1  # 0: only after the last round
        result = run_server(grid, alg, s["model_fn"], regularizer=reg, rounds=cfg.rounds,
                            num_clients=len(s["fed"].parts), clients_per_round=cfg.clients_per_round,
                            participation=cfg.participation, seed=cfg.seed, batch_size=cfg.batch_size,
                            round_timeout=float(rc["round-timeout"]), connect_timeout=float(rc["connect-timeout"]),
                            callbacks=[record], checkpoint=path, checkpoint_every=every, resume=resume,
                            run_key=str(rc["run-key"]), checkpoint_extra=lambda: recorded)
    except Exception as e:
        write_error(out, e)  # the parent command reports it (Flower's log buries it in a traceback)
        raise
    os.makedirs(out, exist_ok=True)
    torch.save({"diverged": status["diverged"]}, os.path.join(out, STATUS_FILE))
    save_result(result, out)  # last: result.pt tells the parent the run is complete


def _client_load(s):
    def load(i, context):
        return s["rows"]
    return load


def _make_apps():
    _, fclient, fserver = flwr_modules()
    server, client = fserver.ServerApp(), fclient.ClientApp()
    server.main()(server_main)

    @client.query("hello")
    def hello(msg, context):
        s = _node(context)
        cfg = s["cfg"]
        return handle_hello(msg, context, s["algorithm"], s["model_fn"], s["regularizer"], cfg.seed, cfg.batch_size,
                            _client_load(s))

    @client.train("round")
    def train(msg, context):
        s = _node(context)
        cfg = s["cfg"]
        return handle_round(msg, context, s["algorithm"], s["model_fn"], s["loss"], _client_load(s), s["regularizer"],
                            cfg.seed, cfg.batch_size)

    return server, client


def __getattr__(name):  # the apps are built on first use: importing this module does not need Flower
    if name in ("serverapp", "clientapp"):
        server, client = _make_apps()
        globals().update(serverapp=server, clientapp=client)
        return globals()[name]
    raise AttributeError(name)

