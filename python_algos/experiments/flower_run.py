"""``python -m python_algos run ... --flower``: one run through a real local Flower deployment.

    prep = prepare_flower(cfg, "results/my-run")   # every check, nothing written, no process started
    summary = execute_flower(prep)                 # SuperLink + one SuperNode per client, then the run folder
    prep = prepare_flower(None, "results/my-run", resume=True)   # continue a run a failed node stopped

What runs where: :class:`~python_algos.deploy.local.LocalDeployment` starts one SuperLink and one
SuperNode per client on 127.0.0.1 (only the deploying user may connect: :mod:`~python_algos.deploy.same_user`).
The apps are :mod:`.flower_app`: every Flower process builds the model, the algorithm and h from the
run's ``config.json`` with the command line's own builders, and each node its own client's rows
(built once at the handshake, cached in its state folder), so the node of
client i holds client i's rows and draws its minibatches from a generator seeded exactly as in
simulation. In float64 the final model equals the one-process ``run``'s (tested to 1e-10).

The run folder has the usual format (``config.json``, ``partition.json``, ``metrics.jsonl``,
``summary.json`` with ``engine: "flower"``, ``model.pt`` with its round), so ``plot`` and
``History.load`` read it, plus what a deployment keeps: ``flower.json`` (the engine and the key of
the nodes' state folders), ``flower-checkpoint.pt`` (the server's checkpoint, every
``--checkpoint-every`` rounds: its fields of the State and generators, no client state),
``flower-nodes/`` (each node's own state, written by the node: in a real deployment it lies on the
client's machine) and the server's round rows beside its checkpoint. The ServerApp rebuilds the full
data and computes every metric of a metric round once, with simulate's own formula (f, h, f+h,
||G_s||², the normal map, sparsity, test metrics): its rows are ``metrics.jsonl``'s. Per round,
``sent_bytes`` / ``recv_bytes`` are the server's bytes on the wire (all participants) and
``wall_time`` the server's round trip, Flower's per-message process start included.

A node that fails or stops answering stops the run: every process ends, and the folder gets the
metrics up to the server's last checkpoint and a summary with ``status: "failed"``, the client named,
and the command that continues it exactly (``run --resume DIR --flower``); Ctrl-C likewise, with
``status: "interrupted"``. Not with ``--flower``: ``--workers``, several seeds, a GPU, and the
algorithms the deployment refuses (DEPOSITUM, FedDR's ``init_from='paper'``, FedCanon II) or models
whose training pass keeps state outside the parameters (BatchNorm statistics, Dropout): refused
before anything is written.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import secrets
import sys
import time
from typing import Callable, Optional

import torch

import fedkernels as fk

from ..algorithms.base import ServerClientAlgorithm
from ..deploy.app_project import write_app_project
from ..deploy.flower_server import check_checkpoint, server_setup
from ..deploy.local import DeploymentError, LocalDeployment
from ..deploy.nodes import ServerClients, check_no_node_state, server_state
from ..deploy.persist import history_path, load_server
from ..runfolder.files import (
    FLOWER_CHECKPOINT,
    FLOWER_DIRS,
    FLOWER_MARK,
    RunFolderError,
    read_json_object,
    remove_leftovers,
    write_json,
)
from ..runfolder.progress import Progress
from ..runfolder.records import save_model, summary_record, write_config, write_metrics
from ..runfolder.setup_record import check_same_setup, fingerprint_clients
from ..runfolder.signals import signal_of, stop_signals_held
from .config import ConfigError
from .flower_app import STATUS_FILE
from .folders import resume_command
from .prepare import PreparedRun, check_recorded_config, check_rounds_reach, prepare_run
from .run import Interrupted, close_run, start_folder
from .tensorboard import live_requested, write_events

__all__ = ["check_flower_flags", "prepare_flower", "execute_flower", "PreparedFlower", "FlowerRunFailed",
           "flower_resume_command", "ROUND_TIMEOUT", "CONNECT_TIMEOUT"]

ROUND_TIMEOUT = 300.0  # seconds a round may take before the run stops naming the node that did not answer
CONNECT_TIMEOUT = 120.0  # seconds for the N SuperNodes to connect
NODES_DIR = FLOWER_DIRS[0]


class FlowerRunFailed(RuntimeError):
    """A node failed (or the deployment did): the folder holds the run up to the server's last checkpoint."""


@dataclasses.dataclass
class PreparedFlower:
    """A checked ``run --flower``: the run's pieces, the server checkpoint a resume continues from
    (None: from round 0) and the key of the nodes' state folders."""

    run: PreparedRun
    snap: Optional[dict]
    run_key: str


def flower_resume_command(out_dir: str) -> str:
    return resume_command(out_dir) + " --flower"


def check_flower_flags(*, workers=None, seeds: bool = False, demo: bool = False, distributed: bool = False) -> None:
    """The command-line combinations ``--flower`` cannot run (one line each, naming the flag), and Flower itself."""
    if demo:
        raise ValueError("--flower with --demo: the demo is a comparison of several algorithms; --flower runs one "
                         "(give -a ALGORITHM and the problem's flags)")
    if workers:
        raise ValueError("--flower with --workers: the Flower run already has one process per client (its "
                         "SuperNodes); leave out --workers")
    if seeds:
        raise ValueError("--flower with several seeds (--seeds or a --seed list): not yet; run one seed per command")
    if distributed:
        raise ValueError("--flower under torchrun: run the command in one process; Flower starts its own processes")
    if importlib.util.find_spec("flwr") is None or \
            not os.path.exists(os.path.join(os.path.dirname(sys.executable), "flower-superlink")):
        from ..deploy.flower import INSTALL
        raise ValueError(f"--flower needs Flower installed beside this Python ({sys.executable}): {INSTALL}")


def prepare_flower(cfg, out_dir: str, *, replace: bool = False, resume: bool = False,
                   rounds: Optional[int] = None) -> PreparedFlower:
    """Every check of ``run`` (:func:`prepare_run`) plus those of a Flower deployment; writes nothing.
    ``resume=True``: continue the ``run --flower`` in ``out_dir`` (``cfg`` None, its settings are the
    folder's; ``rounds`` may extend it) from its server checkpoint."""
    prep = prepare_run(cfg, out_dir, replace=replace, resume=resume, rounds=rounds, flower=True)
    cfg = prep.cfg
    if prep.device.type != "cpu":
        raise ConfigError("device", cfg.device, f"--flower runs the clients and the server on the CPU (this picks "
                                                f"{prep.device}); give --device cpu")
    if cfg.time_budget is not None:  # the deployment's rounds run in its server app, which has no budget
        raise ConfigError("time_budget", cfg.time_budget, "--flower has no time budget: give --round-timeout for "
                                                          "each round's limit, or run without --flower")
    alg = prep.algorithm
    if not isinstance(alg, ServerClientAlgorithm):
        why = "it is peer-to-peer, with no server" if alg.name == "DEPOSITUM" else "it has no server program"
        raise ConfigError("algorithm", cfg.algorithm, f"--flower deploys server–client algorithms; {alg.name} cannot "
                                                      f"be deployed: {why}")
    flat = fk.FlatParams(prep.model)
    x0 = flat.params.detach().clone()
    try:
        with torch.no_grad():
            server_state(alg, torch.zeros_like(x0), ServerClients(len(prep.fed.parts), x0.numel(), x0.dtype))
    except ValueError as e:
        raise ValueError(f"--flower -a {cfg.algorithm}: {e}") from None
    check_no_node_state(prep.model, prep.fed.clients[0], f"--flower with --model {cfg.model}",
                        fix="Choose a model without it (e.g. --model mlp), or run without --flower")
    _python_path(cfg)  # a user's class from a folder that others can write: refused before anything is written
    snap, run_key = None, secrets.token_hex(8)
    if resume:
        snap, run_key = _check_server_checkpoint(prep, x0, out_dir)
    return PreparedFlower(prep, snap, run_key)


def _check_server_checkpoint(prep: PreparedRun, x0: torch.Tensor, out_dir: str) -> tuple:
    """(the server checkpoint to continue from or None, the run key) of a resumed ``run --flower``,
    after the checks every resume makes: the config the checkpoint recorded against config.json
    (:func:`~.prepare.check_recorded_config`, as a one-process resume), then the server's own record
    (participation, h exactly, x0: :func:`~python_algos.deploy.flower_server.check_checkpoint`)."""
    cfg, alg = prep.cfg, prep.algorithm
    run_key = read_json_object(os.path.join(out_dir, FLOWER_MARK))["run_key"]
    path = os.path.join(out_dir, FLOWER_CHECKPOINT)
    if not os.path.isfile(path):
        return None, run_key
    snap = load_server(path)
    check_recorded_config((snap.get("extra") or {}).get("config"), cfg, path)
    check_same_setup({"clients": snap["extra"]["data"]}, {"clients": fingerprint_clients(prep.fed.clients)},
                     what=f"from {path}", audience="cli", error=RunFolderError,
                     fix="put the run's data back, or start a run on these data in a new folder")
    now = server_setup(alg, prep.reg, cfg.seed, cfg.batch_size, len(prep.fed.parts), x0,
                       clients_per_round=cfg.clients_per_round, participation=cfg.participation)
    check_checkpoint(snap, now, audience="cli", fix="undo the edit of config.json (or put the run's own "
                     "checkpoint back), or start these settings in a new folder")
    if snap["run_key"] != run_key:
        raise ConfigError("resume", out_dir, f"{path} belongs to another run than {FLOWER_MARK} (their run keys "
                                             f"differ); nothing was changed")
    check_rounds_reach(cfg, int(snap["round"]), out_dir)
    return snap, run_key


def _python_path(cfg) -> str:
    """The ``PYTHONPATH`` of every Flower process: the folders holding python_algos and fedkernels,
    this command's own ``PYTHONPATH``, and for a user's algorithm or penalty given as
    package.module:Class the folder its top package was imported from, nothing else: the current
    folder as such never (a ``sitecustomize.py`` there, put by anyone who can write the folder,
    would run as you in every process). A user's folder that others can write is refused."""
    import fedkernels
    import python_algos

    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(m.__file__))) for m in (python_algos, fedkernels)]
    dirs += [d for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d]
    for key in ("algorithm", "reg"):
        spec = getattr(cfg, key)
        if not (isinstance(spec, str) and ":" in spec):
            continue
        top = importlib.import_module(spec.split(":")[0].split(".")[0])  # imported already by the checks
        where = os.path.abspath(getattr(top, "__file__", None) or "")
        folder = os.path.dirname(os.path.dirname(where) if os.path.basename(where) == "__init__.py" else where)
        if os.stat(folder).st_mode & 0o022:
            raise ConfigError(key, spec, f"comes from {folder}, which other users can write: every Flower process "
                                         f"would import from there as you; move the module to a folder only you can "
                                         f"write (or `chmod go-w {folder}`)")
        dirs.append(folder)
    return os.pathsep.join(dict.fromkeys(dirs))


def _write_app(folder: str, config_path: str, threads: int, round_timeout: float) -> str:
    """A Flower app folder whose components are :mod:`.flower_app`, configured with the run's Config."""
    return write_app_project(folder, "pa-run-app", "python -m python_algos run --flower",
                             "python_algos.experiments.flower_app:serverapp",
                             "python_algos.experiments.flower_app:clientapp",
                             {"config-path": config_path, "threads": int(threads),
                              "round-timeout": float(round_timeout), "connect-timeout": CONNECT_TIMEOUT,
                              "result-dir": "", "checkpoint": "", "resume": False, "points-dir": "", "run-key": "",
                              "recorded-config": ""})


def _start(fp: PreparedFlower, log) -> None:
    """The first writes (every check has passed): a fresh run's settings, split and engine mark; a
    resume drops what the rounds after its checkpoint left (they are redone)."""
    prep, out_dir = fp.run, fp.run.out_dir
    if not prep.resume:
        start_folder(prep, log)  # config.json first, partition.json; a replaced run's files and folders go
        write_json(os.path.join(out_dir, FLOWER_MARK), {"engine": "flower", "run_key": fp.run_key})
        return
    remove_leftovers(out_dir)
    r = int(fp.snap["round"]) if fp.snap is not None else 0
    if prep.rewrite_config:
        write_config(out_dir, prep.cfg.to_dict())
    log(f"resuming {out_dir} from round {r} (the server's checkpoint), up to round {prep.cfg.rounds}"
        if fp.snap is not None else f"resuming {out_dir}: no checkpoint was written yet, starting from round 0")


class _RoundsShown:
    """The progress display of a Flower run, driven by the rows the ServerApp appends to its round
    records as rounds end (:func:`~python_algos.deploy.persist.history_path`), read from where the last
    look stopped (from the start when the server has written the file anew); a partly written line
    waits for the next look, a round shown already is not shown again."""

    def __init__(self, bar: Progress, path: str):
        self.bar, self.path, self.offset, self.inode, self.shown = bar, path, 0, None, bar.start_round

    def __call__(self) -> None:
        try:
            with open(self.path, "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                self.offset = self.offset if inode == self.inode else 0
                self.inode = inode
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:  # the ServerApp has not started yet
            return
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        for row in map(json.loads, chunk[:end].splitlines()):
            if int(row["round"]) > self.shown:
                self.shown = int(row["round"])
                self.bar.update(self.shown, row)


@dataclasses.dataclass
class _Outcome:
    """How the deployment ended: the ServerApp's result (None unless it completed), its status file,
    the failure's account, the stop (Ctrl-C, SIGTERM, SIGHUP) that ended it, and its seconds."""

    result: Optional[dict] = None
    status: dict = dataclasses.field(default_factory=dict)
    failure: Optional[str] = None
    interrupted: Optional[BaseException] = None
    seconds: float = 0.0


def _deploy(fp: PreparedFlower, log, wait: float, progress: bool) -> _Outcome:
    """The run through a local deployment (every process ended on return, whatever stopped it), its
    rounds shown as they end."""
    prep, got = fp.run, _Outcome()
    cfg, out_dir, n = prep.cfg, os.path.abspath(prep.out_dir), len(prep.fed.parts)
    node_cfg = cfg.replace(device="cpu", data_dir=os.path.abspath(cfg.data_dir) if cfg.data_dir else None)
    prep.algorithm.validate(prep.reg)  # its warnings (SCAFFOLD ignores h) here: the server's go to its log file
    bar, shown = None, None
    t0 = time.perf_counter()
    try:
        with LocalDeployment(n, env={"PYTHONPATH": _python_path(cfg)},
                             node_config={"state-dir": os.path.join(out_dir, NODES_DIR)}) as dep:
            config_path = os.path.join(dep.dir, "run-config.json")
            with open(config_path, "w") as f:
                json.dump(node_cfg.to_dict(), f)
            recorded = os.path.join(dep.dir, "recorded-config.json")  # config.json's settings, for the checkpoints
            with open(recorded, "w") as f:
                json.dump(cfg.to_dict(), f)
            app = _write_app(dep.dir, config_path, cfg.threads or 1, wait)
            log(f"flower: a SuperLink and {n} SuperNodes on 127.0.0.1, up in {time.perf_counter() - t0:.1f} s (logs "
                f"in {dep.dir} while it runs); round 1 also starts the server's and each node's app process "
                f"(Python and torch imports)")
            # the progress display starts after the last line above: one writer on the terminal at a time
            bar = Progress(cfg.rounds, initial=int(fp.snap["round"]) if fp.snap is not None else 0,
                           desc=cfg.algorithm, enabled=progress)
            shown = _RoundsShown(bar, history_path(os.path.join(out_dir, FLOWER_CHECKPOINT)))
            try:
                run = dep.start_run(app, {"checkpoint": os.path.join(out_dir, FLOWER_CHECKPOINT),
                                          "resume": fp.snap is not None,
                                          "run-key": fp.run_key, "recorded-config": recorded})
                got.result = run.wait(CONNECT_TIMEOUT + 60 + wait * max(cfg.rounds, 1), poll=shown)
                got.status = torch.load(os.path.join(run.result_dir, STATUS_FILE), weights_only=True)
            except DeploymentError as e:
                got.failure = str(e)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP: every process has ended (the with block)
        got.interrupted = e
    finally:
        if bar is not None:
            bar.close()
    got.seconds = time.perf_counter() - t0
    return got


def execute_flower(fp: PreparedFlower, *, log: Callable[[str], None] = print, label=None,
                   round_timeout: Optional[float] = None, progress: bool = True) -> dict:
    """Run a :func:`prepare_flower`-checked run through a local Flower deployment; returns the summary.
    Raises :class:`FlowerRunFailed` (a node failed) or :class:`~.run.Interrupted` (Ctrl-C, SIGTERM,
    SIGHUP) after ending every process of the deployment and writing the folder up to the server's
    last checkpoint, from which ``run --resume DIR --flower`` continues. ``round_timeout``: seconds
    the server waits for a round's answers (default ROUND_TIMEOUT). ``progress``: the progress
    display of a one-process run (a bar on a terminal, a line every ~10 % of the rounds otherwise)."""
    _start(fp, log)
    got = _deploy(fp, log, float(round_timeout or ROUND_TIMEOUT), progress)
    with stop_signals_held():  # a stop now comes after the folder is whole (its summary written)
        return _close_folder(fp, got, label or fp.run.cfg.algorithm)


def _close_folder(fp: PreparedFlower, got: _Outcome, label: str) -> dict:
    """metrics.jsonl, summary.json and model.pt of the run as the deployment ended; raises
    :class:`~.run.Interrupted` or :class:`FlowerRunFailed` after writing them if it did not complete."""
    prep = fp.run
    cfg, out_dir = prep.cfg, os.path.abspath(prep.out_dir)
    ckpt_path = os.path.join(out_dir, FLOWER_CHECKPOINT)
    saved = load_server(ckpt_path) if os.path.exists(ckpt_path) else None
    result = got.result
    # the server's rows hold every metric (it computed them once, on the full data): they are metrics.jsonl's
    rows = result["metrics"] if result is not None else (saved["metrics"] if saved is not None else [])
    initial = dict(saved["initial"]) if saved is not None else {"round": 0}
    diverged = got.status.get("diverged")
    write_metrics(out_dir, [initial, *rows])
    if live_requested():  # --tensorboard: the rows reach this folder only now, so do their events
        write_events(out_dir)
    if result is not None:  # model.pt's state_dict is the final model's
        fk.FlatParams(prep.model).bind_(result["params"].clone())
    status = ("interrupted" if got.interrupted is not None else "failed" if got.failure is not None else
              "diverged" if diverged else "completed")
    summary = _summary(prep, label, status, initial, rows, got, saved)
    try:
        summary = close_run(summary, label=label, cfg=cfg, ckpt_path=ckpt_path, diverged=diverged,
                            interrupted=signal_of(got.interrupted) if got.interrupted is not None else None,
                            failure=None if got.failure is None else
                            f"stopped in the Flower deployment (each node restores its own state from "
                            f"{os.path.join(prep.out_dir, NODES_DIR)}): {got.failure}",
                            save=lambda: save_model(out_dir, result["params"], rows[-1]["round"] if rows else 0,
                                                    prep.model.state_dict()))
    except Interrupted as e:
        raise e from got.interrupted  # exit status: 128 + the signal
    if got.failure is not None:
        raise FlowerRunFailed(summary["message"])
    return summary


def _summary(prep: PreparedRun, label: str, status: str, initial: dict, rows: list, got: _Outcome,
             saved: Optional[dict]) -> dict:
    """summary.json of a Flower run (``message`` is the caller's)."""
    cfg, alg, model, n = prep.cfg, prep.algorithm, prep.model, len(prep.fed.parts)
    return summary_record(
        label=label, algorithm=alg.name, hparams=alg.hparams(), status=status, rows=[initial, *rows],
        rounds=cfg.rounds, regularizer=repr(prep.reg), num_clients=n,
        dim=sum(p.numel() for p in model.parameters()), executor="flower", out_dir=prep.out_dir,
        resume_command=flower_resume_command(prep.out_dir), engine="flower", process_seconds=got.seconds,
        dataset=prep.fed.dataset.source, partition=cfg.partition,
        world_size=n + 1,  # the server and one node per client
        threads=cfg.threads or 1, metric_step=alg.metric_step() if cfg.metric_step is None else cfg.metric_step,
        last_checkpoint_round=int(saved["round"]) if saved is not None else None,
        nodes={str(k): v for k, v in got.result["nodes"].items()} if got.result is not None else None)
