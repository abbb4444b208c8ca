"""The server's side of a Flower deployment (see :mod:`.flower` for what runs where).

* :class:`ServerProgram`: the algorithm's server program over Flower messages: it holds the
  server's fields of the State and, each round (:meth:`ServerProgram.step`), draws the participants
  (``simulate``'s draw), sends their messages, collects the replies as they come, averages the
  uploads and runs the server update, the prox included, with the fused kernels. It checkpoints
  its side and resumes from such a checkpoint.
* :func:`run_server`: a ServerApp's loop over it: ``simulate``'s engine loop
  (:func:`~python_algos.runfolder.callbacks.run_rounds`) with the same callbacks (the checkpoint,
  ``StopOnDivergence``, ``TimeBudget``, functions), so each has one definition and the rounds have
  one loop.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import warnings
from typing import Callable, Optional, Sequence

import numpy as np
import torch

import fedkernels as fk

from ..algorithms.base import ServerClientAlgorithm
from ..clients.base import seeds
from ..runfolder.callbacks import Checkpoint, MetricsFile, RunView, as_callbacks, run_rounds
from ..runfolder.files import write_jsonl
from ..runfolder.records import metric_round, metrics_row
from ..runfolder.setup_record import check_same_setup
from ..simulate import checked_clients_per_round
from .client_eval import evaluate_on_nodes
from .exchange import check_replies, check_upload, collect, handshake, nonfinite_entries
from .nodes import ServerClients, receives, scalars, server_state
from .persist import history_path, save_server
from .persist import load_server as load_server_checkpoint  # what run_server(checkpoint=) wrote, for resume=
from .wire import (
    ROUND,
    FlowerResult,
    NodeFailure,
    check_algorithm,
    encode_vectors,
    fingerprint,
    flat_x0,
    flwr_modules,
    new_message,
    payload_bytes,
    resolve_setting,
)

__all__ = ["ServerProgram", "run_server", "server_app", "load_server_checkpoint", "checkpoint_to_resume",
           "server_setup", "check_checkpoint"]


def server_setup(algorithm, regularizer, seed, batch_size, num_clients, x0, *, clients_per_round=None,
                 participation=None) -> dict:
    """The server's record of its run, kept in every checkpoint: what server and nodes share (the
    handshake's :func:`~.wire.fingerprint`: algorithm, hyper-parameters, h exactly, seed, batch size,
    N, dtype, x0) and the participation (k clients per round, as ``simulate`` takes it; None: all)."""
    k = checked_clients_per_round(algorithm, int(num_clients), participation, clients_per_round)
    return {**fingerprint(algorithm, regularizer, seed, batch_size, num_clients, x0),
            "clients_per_round": None if k is None else int(k)}


def check_checkpoint(snap: dict, setup: dict, *, audience: str = "python", fix: Optional[str] = None) -> None:
    """Refuse a server checkpoint recorded under another setup than ``setup`` (:func:`server_setup`),
    with :func:`~python_algos.runfolder.setup_record.check_same_setup`, the resume check of every run,
    naming each setting for ``audience`` (``"python"``: run_server's keywords; ``"cli"``: the flags)."""
    check_same_setup(snap["setup"], setup, what="from the Flower server checkpoint", audience=audience,
                     **({"fix": fix} if fix else {}))


class ServerProgram:
    """An algorithm's server program on Flower messages; see the module docstring.

    ``model_fn()`` builds the model with the run's initial parameters (every node calls it too: the
    handshake refuses a node whose initial parameters differ). ``round_timeout``: seconds
    :func:`run_server` waits for a round's replies; ``connect_timeout``: seconds it waits for the
    nodes to connect, and at least that long for their answers to the handshake (each node's first
    ClientApp start). A client that failed, answered with an error, did not answer or uploaded
    something other than the algorithm's vectors raises :class:`NodeFailure` naming it (and its node).

    ``callbacks``: the run's :class:`~python_algos.runfolder.callbacks.Callback` objects, those of
    ``simulate`` (``StopOnDivergence()``, ``TimeBudget(s)``, ...), or functions ``cb(t, state, row)``
    (True stops the run), called as ``simulate``'s loop calls them. ``evaluate(state)``: the objective
    metrics of a state (f, f+h, ...), added to the rows of the metric rounds (``metrics_every``, the
    rule of :func:`~python_algos.runfolder.records.metric_round`) and to round 0's: the server holds no
    data, so only a caller that has it can give it (``StopOnDivergence`` then stops on f+h as in one
    process; without it, on a non-finite model only).

    ``checkpoint``: a file the server's snapshot is written to (atomically) by the engine's
    :class:`~python_algos.runfolder.callbacks.Checkpoint`: after round 0 of a fresh run, every
    ``checkpoint_every`` rounds (0: none between) and after the last, with ``checkpoint_extra()`` (the
    caller's own data) inside; the rows go to the records file beside it (:func:`.persist.history_path`)
    as ``metrics.jsonl``'s go beside a one-process checkpoint. ``resume``: a snapshot read back with
    :func:`load_server_checkpoint`, from which the run continues exactly, provided every node that took
    part before it was started with the node config ``state-dir`` (its own state is saved there; see
    :mod:`.persist`). ``run_key`` names the run's node-state folders (a fresh random one by default; a
    resume takes the snapshot's).
    """

    def __init__(self, algorithm: ServerClientAlgorithm, model_fn: Callable, *, regularizer: fk.Regularizer,
                 rounds: int, num_clients: int, clients_per_round: Optional[int] = None,
                 participation: Optional[float] = None, seed: int = 0, batch_size: Optional[int] = None,
                 round_timeout: float = 300.0, connect_timeout: float = 120.0, callbacks: Sequence = (),
                 evaluate: Optional[Callable] = None, metrics_every: int = 1,
                 checkpoint: Optional[str] = None, checkpoint_every: int = 1, resume: Optional[dict] = None,
                 checkpoint_extra: Optional[Callable[[], dict]] = None, run_key: Optional[str] = None):
        check_algorithm(algorithm)
        for name, v, low in (("rounds", rounds, 0), ("num_clients", num_clients, 1),
                             ("metrics_every", metrics_every, 0)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
        for name, v in (("round_timeout", round_timeout), ("connect_timeout", connect_timeout)):
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0 (a run never waits forever), "
                                 f"got {v!r}")
        saver = Checkpoint(self._write_snapshot, checkpoint_every)  # checks checkpoint_every (an int >= 0)
        algorithm.validate(regularizer)
        self.algorithm, self.regularizer = algorithm, regularizer
        self.rounds, self.n = int(rounds), int(num_clients)
        self.k = checked_clients_per_round(algorithm, self.n, participation, clients_per_round)
        self.round_timeout, self.connect_timeout = float(round_timeout), float(connect_timeout)
        self.evaluate, self.metrics_every = evaluate, int(metrics_every)
        self.grid, self.evaluators = None, set()  # after connect(): the grid, the clients that evaluate
        self.checkpoint, self.checkpoint_extra = checkpoint, checkpoint_extra
        _, x0 = flat_x0(model_fn)
        self.cs = ServerClients(self.n, x0.numel(), x0.dtype, x0.device)
        self.cs.set_participation(self.k, seed)  # simulate's participant draw
        self.rng = torch.Generator().manual_seed(seeds(seed, 1, stream=1)[0])  # simulate's server generator
        with torch.no_grad():
            self.state = server_state(algorithm, x0, self.cs)
        self.fp = fingerprint(algorithm, regularizer, seed, batch_size, self.n, x0)
        self.setup = server_setup(algorithm, regularizer, seed, batch_size, self.n, x0, clients_per_round=self.k)
        self.pending: dict = {}  # client -> the download its client_receive still needs (algorithms with one)
        self.last_round = {i: 0 for i in range(self.n)}  # client -> the last round it took part in (0: none)
        self.metrics, self.elapsed, self.t, self.committed = [], 0.0, 0, None
        self.fresh = resume is None
        if resume is not None:
            self.state, self.t = _restore(resume, self.setup, self.state, self.rng, self.cs, self.rounds)
            self.pending = dict(resume["pending"])
            self.last_round = {int(i): int(r) for i, r in resume["last_round"].items()}
            self.metrics, self.elapsed, run_key = list(resume["metrics"]), float(resume["elapsed"]), resume["run_key"]
            self.initial = dict(resume["initial"])
            self.committed = self.t
        else:
            self.initial = {"round": 0}  # its metrics once connected: the nodes' own are measured too
        self.callbacks = as_callbacks(callbacks)
        if checkpoint:  # the records file holds exactly the rounds before this call's first, written atomically
            write_jsonl(history_path(checkpoint), [] if self.fresh else [self.initial, *self.metrics])
            records = MetricsFile(history_path(checkpoint))  # the rows, as metrics.jsonl's; the checkpoint last
            saver.before_save.append(records.sync)
            self.callbacks = [records, *self.callbacks, saver]
        self.run_key = run_key or secrets.token_hex(8)
        self.nodes: Optional[dict] = None  # client -> Flower node id, after connect()

    def view(self) -> RunView:
        """The run as the engine loop's callbacks see it (``simulate``'s :class:`RunView`)."""
        return RunView(rounds=self.rounds, start=self.t + 1, initial=self.initial, main=True, report=self._report,
                       snapshot=self.snapshot, fresh=self.fresh)

    def _report(self, state) -> torch.Tensor:
        with torch.no_grad():
            return self.algorithm.report(state, self.regularizer).detach()

    def _metrics_of(self, state) -> dict:
        """``evaluate``'s metrics of ``state`` and, once connected, the nodes' own (``evaluate_fn``)."""
        out = {}
        if self.evaluate is not None:
            with torch.no_grad():
                out = dict(self.evaluate(state))
        if self.grid is not None:  # the nodes' own metrics, where their client_app has an evaluate_fn
            out.update(evaluate_on_nodes(self.grid, self.nodes, self.evaluators, self._report(state), self.t,
                                         self.round_timeout))
        return out

    def connect(self, grid) -> None:
        """The handshake: which node is which client, the same settings everywhere, and where each node's
        state starts (a resume restores it from the node's ``state-dir``)."""
        restore = {"run_key": self.run_key, "round": self.t,
                   "last_round": {str(i): r for i, r in self.last_round.items()}}
        self.nodes = handshake(grid, self.fp, self.n, self.connect_timeout, self.round_timeout, restore,
                               self.evaluators)
        self.grid = grid
        if self.fresh and self.metrics_every:
            self.initial.update(self._metrics_of(self.state))

    def step(self, t: int, state) -> tuple:
        """Round ``t``, the engine loop's step: each participant's message (``simulate``'s draw of the
        participants), the replies collected as they come for at most ``round_timeout`` seconds and
        checked, the uploads averaged and the server update; returns the State and the round's row
        (:func:`~python_algos.runfolder.records.metrics_row`, with the metrics on a metric round)."""
        alg, t0 = self.algorithm, time.perf_counter()
        ids = self.cs.participants() if alg.partial_participation else None
        part = list(range(self.n)) if ids is None else ids.tolist()
        with torch.no_grad():
            down = alg.download(self.state, self.rng)
        head = {"round": t, "run_key": self.run_key, "committed": self.committed, "num_clients": self.n}
        out = [new_message(_round_content(self.state, down, self.pending.get(i), head), self.nodes[i], ROUND, t)
               for i in part]
        try:
            got = check_replies(collect(self.grid, out, self.round_timeout), self.nodes, part, t,
                                f"round_timeout={self.round_timeout:g} s")
        except NodeFailure as e:
            raise NodeFailure(f"{e}. " + (f"The server's checkpoint of round {self.committed} is {self.checkpoint}: "
                                          f"restart the node and resume from it"
                                          if self.committed is not None and self.checkpoint else
                                          "No server checkpoint was written (give checkpoint=PATH to resume a run)")
                              ) from None
        msgs = alg.messages()
        who = {i: f"client {i} (node {self.nodes[i]})" for i in part}
        ups = {i: check_upload(got[i].content["up"], msgs.up, self.cs.dim, self.cs.dtype, who[i], t) for i in part}
        for i in part:  # averaged as one process averages them: the divergence check then ends the run
            why = nonfinite_entries(ups[i], who[i], t)
            if why is not None:
                warnings.warn(why, RuntimeWarning, stacklevel=2)
        stacked = {name: torch.stack([ups[i][name] for i in part]) for name in msgs.up}
        with torch.no_grad(), fk.prox_stats() as stats:
            means = alg.aggregate(stacked, self.cs, ids)
            self.state, sent = alg.server_update(self.state, means, down, self.regularizer)
        for i in part:
            self.pending.pop(i, None)
            self.last_round[i] = t
        if receives(alg):
            keep = {name: sent[name].detach().clone() for name in msgs.down}
            self.pending.update({i: keep for i in part})
        wall = time.perf_counter() - t0
        self.elapsed += wall
        self.t = t
        rec = metrics_row(t, wall_time=wall, elapsed=self.elapsed, prox_time=stats.seconds,
                          prox_evals=stats.evaluations, up=len(msgs.up), down=len(msgs.down),
                          sent_bytes=sum(payload_bytes(m.content["vectors"]) for m in out),
                          recv_bytes=sum(payload_bytes(got[i].content["up"]) for i in part),
                          participants=part, metrics=self._metrics_of(self.state)
                          if metric_round(t, self.rounds, self.metrics_every) else None)
        self.metrics.append(rec)
        return self.state, rec

    def snapshot(self, t: int) -> dict:
        """The server's checkpoint of round ``t``, the last one done (what a resume needs; the rows are
        in the records file, not here)."""
        assert t == self.t, (t, self.t)
        return {"round": self.t, "run_key": self.run_key, "setup": self.setup, "state": self.state,
                "rng": self.rng.get_state(), "participation": self.cs.rng_state(), "pending": self.pending,
                "last_round": dict(self.last_round), "elapsed": self.elapsed, "initial": self.initial,
                "extra": self.checkpoint_extra() if self.checkpoint_extra is not None else {}}

    def _write_snapshot(self, snap: dict) -> None:
        """The engine's Checkpoint writes with this: the run's checkpoint file (its rows already on disk)."""
        save_server(self.checkpoint, snap)
        self.committed = int(snap["round"])

    def result(self) -> FlowerResult:
        return FlowerResult(params=self._report(self.state).clone(), state=self.state, metrics=self.metrics,
                            nodes=dict(self.nodes or {}), setup={**self.setup, "rounds": self.rounds})


def run_server(grid, algorithm: ServerClientAlgorithm, model_fn: Callable, **settings) -> FlowerResult:
    """The server's loop on a Flower ``Grid`` (a ServerApp's ``main`` calls it): :class:`ServerProgram`
    with these settings, driven by ``simulate``'s engine loop
    (:func:`~python_algos.runfolder.callbacks.run_rounds`, the same callbacks), each round's replies
    collected as they come, at most ``round_timeout`` seconds. Raises :class:`NodeFailure` naming the
    client (and Flower node) that failed, answered with an error, or did not answer in time."""
    prog = ServerProgram(algorithm, model_fn, **settings)
    prog.connect(grid)
    run_rounds(prog.view(), prog.state, prog.step, prog.callbacks)
    return prog.result()


def _restore(snap: dict, setup: dict, state, rng, cs, rounds):
    """The server's State and generators from a snapshot of this run (refused if its settings differ)."""
    check_checkpoint(snap, setup)
    if int(rounds) < int(snap["round"]):
        raise ValueError(f"rounds={rounds}: the checkpoint is at round {snap['round']} and a run cannot go back")
    saved = snap["state"]
    if type(saved) is not type(state):
        raise ValueError(f"resume: the checkpoint holds a {type(saved).__name__}, this algorithm's state is a "
                         f"{type(state).__name__}")
    rng.set_state(snap["rng"])
    cs.set_rng_state(snap["participation"])
    return saved, int(snap["round"])


def checkpoint_to_resume(path: Optional[str], resume: bool) -> Optional[dict]:
    """The server checkpoint a run continues from: None for a fresh run (``resume`` false), else the
    snapshot at ``path``. ``resume`` true with no checkpoint there is refused (ValueError naming the
    path and both settings, as the apps' run configs call them) instead of silently starting a new run:
    a mistyped path would otherwise redo every round and overwrite the nodes' saved states."""
    if not resume:
        return None
    if not path:
        raise ValueError("resume=true needs the server checkpoint to continue from: set checkpoint to its file "
                         "(it is empty)")
    if not os.path.isfile(path):
        raise ValueError(f"resume=true: no server checkpoint at checkpoint={path!r} (no such file); give the path "
                         f"the stopped run wrote its checkpoint to, or set resume=false to start a new run")
    return load_server_checkpoint(path)


def _round_content(state, down: dict, recv: Optional[dict], head: dict):
    """One participant's message: the vectors its ``client_receive`` needs (``recv:``) and those its
    round starts from (``down:``), a vector equal to one already sent travelling once; the plan
    (JSON) maps names to keys and carries the round counters, the non-tensor round settings and
    ``head`` (round, run key, the server's last checkpoint round, N)."""
    fapp, _, _ = flwr_modules()
    vectors, plan = {}, {"recv": None, "down": {}, "settings": {}, "scalars": scalars(state), **head}
    if recv is not None:
        plan["recv"] = {}
        for name, v in recv.items():
            vectors["recv:" + name] = v
            plan["recv"][name] = "recv:" + name
    for name, v in down.items():
        if not isinstance(v, torch.Tensor):
            plan["settings"][name] = v
        elif recv is not None and name in recv and torch.equal(recv[name], v):
            plan["down"][name] = "recv:" + name
        else:
            vectors["down:" + name] = v
            plan["down"][name] = "down:" + name
    return fapp.RecordDict({"vectors": encode_vectors(vectors),
                            "config": fapp.ConfigRecord({"plan": json.dumps(plan, default=_jsonable)})})


def _jsonable(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    raise TypeError(f"round setting {v!r} ({type(v).__name__}) cannot be sent to the clients")


def server_app(algorithm: ServerClientAlgorithm, model_fn: Callable, *, on_result: Optional[Callable] = None,
               **settings):
    """A Flower ``ServerApp`` running :func:`run_server` with these settings (any of them may be a
    :func:`~.wire.from_run_config` entry, read when the run starts); ``on_result(result,
    context)`` receives the :class:`FlowerResult` (e.g. to write the run folder)."""
    check_algorithm(algorithm)
    _, _, fserver = flwr_modules()
    app = fserver.ServerApp()

    @app.main()
    def main(grid, context) -> None:
        result = run_server(grid, algorithm, model_fn,
                            **{k: resolve_setting(k, v, context) for k, v in settings.items()})
        if on_result is not None:
            on_result(result, context)

    return app
