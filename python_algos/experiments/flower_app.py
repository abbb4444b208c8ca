"""The Flower apps behind ``python -m python_algos run --flower`` (see :mod:`.flower_run`).

They belong to the experiments layer (they rebuild a command-line run); the server and client
programs themselves are :mod:`python_algos.deploy.flower`'s.

Flower starts the ServerApp and each ClientApp in processes of its own, so the apps cannot be handed
Python objects: they rebuild them from the run's settings. The run config names a ``config.json``
(a :class:`~python_algos.experiments.config.Config`, written by the parent command); every process
builds the model, the algorithm and the regularizer from it with the command line's own builders
(``experiments.build``), which are deterministic in the Config's seeds, and the server the data
split. A node needs only its own rows: its first message builds the split and keeps them in the
node's ``state-dir`` (:mod:`.node_data`), the following ones read them from there (``folder:PATH``
data: a node reads only its own file, with the pooled statistics from :mod:`.data_exchange`). So the node of
client i holds exactly the rows ``run`` gives client i, starts from the same model, and draws its
minibatches from a generator seeded as in simulation (:mod:`python_algos.deploy.flower`); the handshake of
:func:`~python_algos.deploy.flower.run_server` compares every node's settings with the server's anyway.

The ServerApp's loop is simulate's engine loop (:func:`~python_algos.runfolder.callbacks.run_rounds`,
through :func:`~python_algos.deploy.flower.run_server`) with the callbacks of a one-process ``run``:
the checkpoint (``checkpoint``, at ``--checkpoint-every``'s cadence, round 0 and the last; a resume
continues from it), the round rows beside it, and ``StopOnDivergence`` on f+h. The ServerApp computes
every metric of the metric rounds once, as one process does (it rebuilds the full data from the
Config): the objective with simulate's formula (``simulate.objective_metrics``) and the test metrics,
so a run that blows up stops at the round one process stops at, and its round rows are the run's
``metrics.jsonl`` rows (the parent shows them as they are appended, and copies them). It keeps the
run's config as the parent command recorded it (the run config's ``recorded-config``) and the
fingerprint of the clients' data in every checkpoint, so that a resume compares them as a
one-process resume does; beside :func:`~python_algos.deploy.flower.save_result`'s ``result.pt``, it
writes ``status.pt`` (divergence) or, if it stopped on an error, ``error.txt``. ``resume=true`` with
no checkpoint at ``checkpoint`` is refused.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import torch

import fedkernels as fk

from ..clients import resolve_executor
from ..data.folder import PREFIX as FOLDER
from ..deploy.flower import (
    checkpoint_to_resume,
    flwr_modules,
    handle_hello,
    handle_round,
    node_client_id,
    run_server,
    save_result,
    write_error,
)
from ..runfolder.callbacks import StopOnDivergence
from ..runfolder.setup_record import fingerprint_clients
from ..simulate import objective_metrics
from .data_exchange import exchange_data, handle_scale, handle_stats
from .evaluation import make_eval

__all__ = [
    "clientapp",  # noqa: F822 -- built on first use by the module __getattr__ below (needs Flower)
    "serverapp",  # noqa: F822 -- likewise
    "load_setup", "node_setup", "STATUS_FILE",
]

STATUS_FILE = "status.pt"
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


def _objective(setup: dict):
    """``evaluate(state)`` for the server: the metrics of the state's reported model, as a one-process
    run computes them on the full data (this process has rebuilt it): simulate's objective metrics and
    the test metrics, so that StopOnDivergence stops the run at the round one process stops at and the
    rows are the run's."""
    cfg, alg, reg = setup["cfg"], setup["algorithm"], setup["regularizer"]
    model = setup["model_fn"]()
    flat = fk.FlatParams(model)
    cs = resolve_executor("sequential", model)(model, setup["loss"], setup["fed"].clients, batch_size=cfg.batch_size,
                                               seed=cfg.seed, flat=flat)
    step = float(cfg.metric_step) if cfg.metric_step is not None else float(alg.metric_step())
    eval_fn = make_eval(setup["fed"].dataset, model)

    def evaluate(state) -> dict:
        x = alg.report(state, reg).detach()
        out = objective_metrics(cs, reg, x, step, alg.normal_map_point(state))
        flat.bind_(x.clone())  # the test metrics run the model
        out.update(eval_fn(x))
        return out

    return evaluate


def _node_config(context):
    from .folders import read_config_json

    return read_config_json(str(context.run_config["config-path"]))


def _node(context) -> dict:
    rc = context.run_config
    state_dir = context.node_config.get("state-dir")
    return node_setup(str(rc["config-path"]), node_client_id(context), str(state_dir) if state_dir else None,
                      int(rc.get("threads", 1)))



def server_main(grid, context) -> None:
    s = _setup(context)
    cfg, alg, reg = s["cfg"], s["algorithm"], s["regularizer"]
    rc = context.run_config
    out, path = str(rc["result-dir"]), str(rc["checkpoint"])
    stop = StopOnDivergence()  # simulate's rule, on the rows' f+h and the model
    try:
        with open(str(rc["recorded-config"])) as f:  # the run's config.json as the parent command read it
            recorded = {"config": json.load(f)}  # kept in every checkpoint: a resume compares it with config.json
        # the data the nodes hold: a resume on changed data is refused (flower_run), as a one-process resume is
        recorded["data"] = fingerprint_clients(s["fed"].clients)
        resume = checkpoint_to_resume(path, bool(rc["resume"]))
        os.makedirs(out, exist_ok=True)
        if cfg.dataset.startswith(FOLDER):  # each node reads only its own file: the pooled statistics first
            exchange_data(grid, s["fed"], len(s["fed"].parts), float(rc["connect-timeout"]),
                          float(rc["round-timeout"]))
        result = run_server(grid, alg, s["model_fn"], regularizer=reg, rounds=cfg.rounds,
                            num_clients=len(s["fed"].parts), clients_per_round=cfg.clients_per_round,
                            participation=cfg.participation, seed=cfg.seed, batch_size=cfg.batch_size,
                            round_timeout=float(rc["round-timeout"]), connect_timeout=float(rc["connect-timeout"]),
                            callbacks=[stop], evaluate=_objective(s),
                            metrics_every=cfg.metrics_every, checkpoint=path, checkpoint_every=cfg.checkpoint_every,
                            resume=resume, run_key=str(rc["run-key"]), checkpoint_extra=lambda: recorded)
    except Exception as e:
        write_error(out, e)  # the parent command reports it (Flower's log buries it in a traceback)
        raise
    os.makedirs(out, exist_ok=True)
    torch.save({"diverged": stop.reason}, os.path.join(out, STATUS_FILE))
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

    @client.query("datastats")
    def datastats(msg, context):
        return handle_stats(msg, context, _node_config(context))

    @client.query("datascale")
    def datascale(msg, context):
        return handle_scale(msg, context, _node_config(context))

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

