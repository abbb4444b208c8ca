"""Every check of a run before anything is written: :func:`prepare_run` -> :class:`PreparedRun`.

The checks come in the order a user would fix them: the settings, the run folder (a resume reads
``config.json`` and the checkpoint and refuses one that does not match them), the data, the model,
the algorithm with its regularizer, participation and the metric step.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import warnings
from typing import Optional, Sequence

import torch
from torch import nn

import fedkernels as fk

from ..algorithms.registry import algorithm_entry
from ..clients import ClientSet, resolve_executor
from ..clients.data import check_finite
from ..clients.population import Population
from ..clients.state_plan import DoesNotFit, StateEstimate, StatePlan, check_dense_fits, data_bytes, stream_cost
from ..data import FederatedData
from ..runfolder import checkpoint as ckpt
from ..runfolder.files import FLOWER_MARK, STATE_DIR, RunFolderError, as_json
from ..runfolder.folder import check_fresh_start
from ..runfolder.records import CONFIG, check_format, read_config
from ..runfolder.setup_record import check_same_setup
from ..simulate import checked_clients_per_round
from ..system.lock import lock_folder
from ..system.threads import choose_threads
from . import launch
from .build import build_algorithm, build_model, build_run_regularizer, hparam_error, prepare_data
from .config import RESULT_KEYS, Config, ConfigError, flag
from .device import resolve_device
from .folders import read_config_json, resume_command
from .losses import loss_function

__all__ = ["PreparedRun", "prepare_run", "check_algorithm_names", "check_world_size", "check_rounds_reach",
           "check_recorded_config", "check_state", "estimate_line"]


@dataclasses.dataclass
class PreparedRun:
    """A run whose every input has been checked; nothing is written until :func:`execute_run`."""

    cfg: Config
    out_dir: str
    fed: FederatedData
    model: nn.Module
    algorithm: object
    reg: fk.Regularizer
    device: torch.device
    snap: Optional[dict]  # the checkpoint to continue from (resume), else None
    resume: bool
    rewrite_config: bool  # config.json must be (re)written (fresh run, or --rounds changed)
    replace: bool  # a fresh run replaces the run folder's files
    torch_rng: torch.Tensor  # torch's global generator right after the model was built
    estimate: Optional[dict] = None  # the memory and disk estimate (check_state): the setup's line, summary.json


def check_algorithm_names(algorithms: Sequence[str]) -> None:
    for a in algorithms:  # a registered name, one of an installed package, or package.module:Class
        try:
            algorithm_entry(a)
        except ValueError as e:
            raise ConfigError("algorithm", a, str(e)) from None


def check_world_size(num_clients: int, processes: int) -> None:
    """Every process of a distributed run holds at least one client."""
    if num_clients < processes:
        raise ConfigError("num_clients", num_clients,
                          f"{num_clients} client(s) cannot be split over {processes} processes: every process needs "
                          f"at least one client; use at most {num_clients} processes (--workers / --nproc-per-node) "
                          f"or more clients")


def check_rounds_reach(cfg: Config, saved_round: int, out_dir: str) -> None:
    """A resumed run's ``--rounds`` reaches its checkpoint's round (a run cannot go back)."""
    if cfg.rounds < saved_round:
        raise ConfigError("rounds", cfg.rounds,
                          f"the checkpoint in {out_dir} is at round {saved_round} and a run cannot go back; "
                          f"give --rounds {saved_round} or more (nothing was changed)")


def check_recorded_config(saved: Optional[dict], cfg: Config, ckpt_path: str) -> None:
    """A command-line resume's check (one process, ``--workers``, ``--flower``; seeds, sweeps and Optuna
    resume through :func:`prepare_run`): the config recorded in the checkpoint ``ckpt_path`` equals
    ``cfg`` (config.json's) in every setting that changes the result. A difference is refused by
    :func:`~python_algos.runfolder.setup_record.check_same_setup`, naming each setting with its flag."""
    if not isinstance(saved, dict):
        return
    keys = RESULT_KEYS
    saved, now = as_json(saved), as_json(cfg.to_dict())
    check_same_setup({k: saved.get(k) for k in keys}, {k: now.get(k) for k in keys}, what=f"from {ckpt_path}",
                     audience=_config_label,  # the config's keys are its settings, each named by its flag
                     fix="undo the edit of config.json (or put the run's own checkpoint back), or start these "
                         "settings in a new folder", error=RunFolderError)


def _config_label(key: str) -> str:
    """A setting of config.json as a refusal names it: key and flag (participation / clients_per_round:
    both flags, they set one thing together)."""
    pair = {"clients_per_round": "participation", "participation": "clients_per_round"}.get(key)
    return f"{key} ({flag(key)}" + (f" / {flag(pair)})" if pair else ")")


def _resumed_config(out_dir: str, rounds: Optional[int], flower: bool):
    """(config.json's Config with ``rounds`` when given, whether config.json must be rewritten) of a
    run folder a resume may continue: one run (not a group's folder), run the same way (``flower``)."""
    cfg_path = os.path.join(out_dir, CONFIG)
    if not os.path.isdir(out_dir):
        raise RunFolderError(f"cannot resume {out_dir}: no such folder")
    if not os.path.isfile(cfg_path):
        for record, what, command in (("comparison.json", "a comparison", "compare"),
                                      ("sweep.json", "a sweep (or random search)", "sweep")):
            if os.path.isfile(os.path.join(out_dir, record)):
                raise RunFolderError(f"{out_dir} is {what}, not one run: continue it with "
                                     f"`python -m python_algos {command} --resume {shlex.quote(out_dir)}`")
        raise RunFolderError(f"cannot resume {out_dir}: it holds no config.json, so no run was started there "
                             f"(a run stopped before it wrote its settings leaves none); start it again with `run`")
    ran_flower = os.path.isfile(os.path.join(out_dir, FLOWER_MARK))
    if ran_flower and not flower:
        raise RunFolderError(f"{out_dir} ran through Flower (run --flower): continue it the same way, with "
                             f"`{resume_command(out_dir)} --flower`; nothing was changed")
    if flower and not ran_flower:
        raise RunFolderError(f"{out_dir} ran in this process, not through Flower: continue it without --flower, "
                             f"with `{resume_command(out_dir)}`; nothing was changed")
    check_format(out_dir, read_config(out_dir))  # a folder of another format version: refused, it still plots
    cfg = read_config_json(cfg_path)
    if rounds is None:
        return cfg, False
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ConfigError("rounds", rounds, "must be an integer >= 0")
    return cfg.replace(rounds=rounds), rounds != cfg.rounds


def _absolute_data_paths(cfg: Config) -> Config:
    """``cfg`` with its data paths absolute (``--data-dir``, ``--data-opt file=`` / ``test_file=``, which
    are relative to ``--data-dir`` when given): a relative path means the current folder of this
    command, which a Flower node or a later resume does not share."""
    data_dir = os.path.abspath(os.path.expanduser(cfg.data_dir)) if isinstance(cfg.data_dir, str) else cfg.data_dir
    opts = dict(cfg.data_opts or {})
    for k in ("file", "test_file"):
        if isinstance(opts.get(k), str) and data_dir is None:
            opts[k] = os.path.abspath(os.path.expanduser(opts[k]))
    folder = cfg.dataset.startswith("folder:") and "folder:" + os.path.abspath(os.path.expanduser(cfg.dataset[7:]))
    return cfg.replace(data_dir=data_dir, data_opts=opts, dataset=folder or cfg.dataset)




def prepare_run(cfg: Optional[Config], out_dir: str, *, fed: Optional[FederatedData] = None, resume: bool = False,
                rounds: Optional[int] = None, replace: bool = False, flower: bool = False) -> PreparedRun:
    """Every check of a run, in the order a user would fix them; writes nothing.

    ``replace=True`` lets a fresh run replace the run already in ``out_dir`` (every file, event and
    figure of it goes: :func:`~python_algos.runfolder.folder.clear_for_fresh_run`); by default such a
    folder is refused, as the command line refuses ``--out DIR`` of an existing run, and a replacement
    is refused when the folder also holds files no run writes.
    Raises :class:`ConfigError` (a value, named by its flag), :class:`RunFolderError` (the folder:
    a foreign or edited checkpoint, ``--rounds`` below the checkpoint; :class:`RunExistsError`: an
    existing run that ``replace=False`` keeps), :class:`~python_algos.runfolder.checkpoint.CheckpointError`
    (a damaged checkpoint) or
    ``ValueError`` (data, model, algorithm and participation, named by their flags).
    """
    if not isinstance(replace, bool):  # a truthy string must not delete a run
        raise TypeError(f"replace must be True or False, got {replace!r}")
    lock_folder(out_dir)  # no other command in this folder while this one runs (--replace, --resume included)
    ckpt_path = os.path.join(out_dir, "checkpoint.pt")
    snap = None
    rewrite = not resume
    if resume:
        cfg, rewrite = _resumed_config(out_dir, rounds, flower)
    elif cfg is None:
        raise ValueError("cfg is required unless resume=True")
    else:
        if rounds is not None:
            cfg = cfg.replace(rounds=rounds)
        cfg.check()
        cfg = _absolute_data_paths(cfg)  # config.json names the files wherever the run (or its Flower nodes) resumes
        check_fresh_start(out_dir, replace, how_to_resume=resume_command(out_dir))
    launch.join(cfg.device)  # under torchrun: join the job (and take this rank's GPU) before picking the device
    device = resolve_device(cfg.device)
    if resume and os.path.isfile(ckpt_path):
        snap = ckpt.load(ckpt_path, map_location=device)  # a manifest only, when several processes wrote it
        check_recorded_config((snap.get("extra") or {}).get("config"), cfg, ckpt_path)
        check_rounds_reach(cfg, int(snap["round"]), out_dir)
    fed = fed if fed is not None else prepare_data(cfg)
    if not isinstance(fed.clients, Population):  # a population checks each client when it is built
        check_finite(fed.clients)  # simulate refuses them too, but after the folder is written
    check_world_size(len(fed.parts), launch.world_size())
    model = build_model(cfg, fed.dataset)
    torch_rng = torch.get_rng_state()
    if not resume and cfg.threads is None:  # recorded in config.json: a resume uses it, whatever its environment
        cfg = cfg.replace(threads=choose_threads(None, sum(p.numel() for p in model.parameters()), device))
    algorithm = build_algorithm(cfg)
    reg = build_run_regularizer(cfg, model)
    with warnings.catch_warnings():  # simulate validates again and warns once
        warnings.simplefilter("ignore")
        try:
            algorithm.validate(reg)
        except ValueError as e:
            raise hparam_error(cfg, algorithm.name, e) from None
    try:
        checked_clients_per_round(algorithm, len(fed.parts), cfg.participation, cfg.clients_per_round)
    except ValueError as e:
        key = "participation" if cfg.participation is not None else "clients_per_round"
        raise ConfigError(key, getattr(cfg, key), str(e)) from None
    if cfg.metric_step is None and not algorithm.metric_step() > 0:
        raise ConfigError("metric_step", cfg.metric_step, f"{algorithm.name}'s default step is not > 0; give one")
    if snap is not None and (snap.get("algorithm") != algorithm.name or snap.get("hparams") != algorithm.hparams()):
        raise RunFolderError(f"{ckpt_path} is a checkpoint of {snap.get('algorithm')} {snap.get('hparams')}, not of "
                             f"{algorithm.name} {algorithm.hparams()} as config.json says; nothing was changed")
    estimate = check_state(cfg, fed.clients, model, algorithm, resume=resume, flower=flower, out_dir=out_dir,
                           task=fed.dataset.task)
    if snap is not None:  # this process's client rows (re-cut if another number of processes wrote it)
        snap = launch.local_rows(snap, ckpt_path, len(fed.clients), map_location=device,  # disk: its logs checked
                                 state_folder=os.path.join(out_dir, STATE_DIR))
    return PreparedRun(cfg, out_dir, fed, model, algorithm, reg, device, snap, resume, rewrite, replace, torch_rng,
                       estimate)


class _Shapes(ClientSet):
    """One client of a ``dim``-parameter model: ``algorithm.init`` on it shows the State's client stacks."""

    def __init__(self, dim: int, dtype: torch.dtype):
        super().__init__()
        self.num_clients, self.rows, self.dim, self.dtype, self.device = 1, 1, dim, dtype, torch.device("cpu")

    def gradients_(self, X, G, ids=None):
        return G.zero_()

    def _mean(self, S, divisor=None):
        return S.sum(0) / (divisor or S.shape[0])

    def _broadcast(self, v):
        return v.clone()

    def full_objective_(self, x, grad_out):
        grad_out.zero_()
        return 0.0


def _as_flags(text: str) -> str:
    """A state_plan message in the command line's words: state='disk' -> --state disk, ..."""
    text = re.sub(r"state='(\w+)'", r"--state \1", text)
    for python, flags in _FLAGS:
        text = text.replace(python, flags)
    return text


_FLAGS = (("clients_per_round", "--clients-per-round"), (" or participation)", " or --participation)"),
          ("fewer clients", "fewer clients (--num-clients)"), ("state_folder", "the run folder"),
          ("the distributed executor", "the distributed executor (--workers, torchrun)"),
          ("mixing='sparse'", "--alg-opt mixing=sparse"))


def check_state(cfg: Config, clients, model: nn.Module, algorithm, *, resume: bool = False, flower: bool = False,
                workers: bool = False, out_dir: str = ".", task: Optional[str] = None) -> dict:
    """``--state`` checked by :class:`StatePlan`'s own rules (what ``simulate`` would refuse, named by
    flag: a command-line run always checkpoints) and the run's memory and disk estimate, refused with
    :class:`DoesNotFit`'s message when it cannot fit; before anything is written. Returns the estimate.
    ``workers``: ``run --workers`` checks it before torchrun starts the ranks (one error, not one a rank);
    ``out_dir``: the run folder (a disk store keeps its rows and row log in its state/ folder); ``task``: the
    data's (a streamed round's chunks are those the run's executor cuts: it is built to ask)."""
    if flower and cfg.state != "dense":
        raise ConfigError("state", cfg.state, "--flower keeps each client's state on its node: use --state dense")
    k = checked_clients_per_round(algorithm, len(clients), cfg.participation, cfg.clients_per_round)
    try:
        executor = "distributed" if workers else launch.executor_for(cfg.executor)[0]
        folder = os.path.join(out_dir, STATE_DIR) if cfg.state in ("disk", "auto") else None  # run.py's
        plan = StatePlan.checked(cfg.state, folder, k, executor, None, True, resume)
        dense_only = plan.keeps_dense(algorithm, len(clients))  # full participation: streamed in chunks, or refused
    except ValueError as e:
        raise ConfigError("state", cfg.state, re.sub(r"^--state \w+ ", "", _as_flags(str(e)))) from None
    params = [p for p in model.parameters() if p.requires_grad]
    dim = sum(p.numel() for p in params)
    state = algorithm.init(torch.zeros(dim, dtype=params[0].dtype), _Shapes(dim, params[0].dtype))
    streamed = k is None and not dense_only and plan.mode != "dense"
    fields, uploads = len(getattr(type(state), "client_fields", ())), len(algorithm.messages().up) if streamed else 0
    est = StateEstimate(len(clients), dim, params[0].element_size(), fields, None if streamed else k or len(clients),
                        cfg.rounds, _data_bytes(clients), uploads, None if not streamed else
                        stream_cost(algorithm, _executor(cfg, executor, clients, model, task), fields, uploads,
                                    params[0].element_size()))
    try:
        kept = plan.kept(est)
        if kept == "dense" and streamed:  # auto under full participation, the dense stacks fit
            est = dataclasses.replace(est, cohort=len(clients), uploads=0)
        if kept == "dense":
            check_dense_fits(est.dense_bytes, f"--state dense: {est.fields} [{est.num_clients}, {dim}] client stack(s)")
    except DoesNotFit as e:
        raise DoesNotFit(_as_flags(str(e))) from None
    state_bytes = est.dense_bytes if kept == "dense" else est.store_bytes
    return {"state": cfg.state, "kept": kept, "state_bytes": state_bytes, "data_bytes": est.data_bytes,
            # disk: the rows staged for the disk and those read ahead beside the working stacks
            "working_bytes": est.working_bytes + (est.stage_bytes + est.ahead_bytes if kept == "disk" else 0),
            "stacks": est.fields,  # disk: the row log, not one file each
            "checkpoint_bytes": est.log_bytes if kept == "disk" else state_bytes,
            "chunk": est.chunk, "streamed_bytes": est.streamed_bytes}  # a full participation round's chunks


def _executor(cfg: Config, executor: str, clients, model: nn.Module, task: str):
    """The executor ``simulate`` builds for the run (its chunks of a streamed round: :func:`stream_cost`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return resolve_executor(executor, model)(model, loss_function(task), clients, batch_size=cfg.batch_size,
                                                 seed=cfg.seed)


def _data_bytes(clients) -> int:
    """The clients' bytes in memory; a population's (never all N built): its source's shared rows, or, for a
    source that shares none (a folder of files), client 0's bytes (the probe builds it anyway) times the cache."""
    if isinstance(clients, Population):
        shared = getattr(clients.make_client, "nbytes_estimate", None)
        return int(shared()) if shared is not None else data_bytes([clients[0]]) * min(clients.cache, len(clients))
    return data_bytes(clients)


def estimate_line(est: dict) -> str:
    """The estimate (:func:`check_state`) in one line, printed with the run's setup."""
    how = {"dense": f"dense: {est['stacks']} [N, d] stack(s)", "ram": "ram: rows written only",
           "disk": "disk: rows written only, in files"}[est["kept"]]
    ckpts = (f"the checkpoints' row log at most {_mb(est['checkpoint_bytes'])}" if est["kept"] == "disk" else
             f"checkpoints {_mb(est['checkpoint_bytes'])} each")
    streamed = "" if not est.get("chunk") else \
        f", streamed in chunks of {est['chunk']} clients ({_mb(est['streamed_bytes'])} read and written a round)"
    return (f"memory: state {_mb(est['state_bytes'])} ({how}), data {_mb(est['data_bytes'])}, working "
            f"{_mb(est['working_bytes'])}{streamed}; disk: {ckpts}")


def _mb(n: int) -> str:
    return f"{n / 1e6:.2g} MB" if n >= 1e5 else f"{n / 1e3:.2g} kB"
