"""Experiment runner behind the command line and the paper scripts.

    cfg = Config(algorithm="fedcanon", dataset="synthetic", partition="natural", num_clients=30,
                 model="linear", reg="l1", reg_strength=1e-3, rounds=100)
    summary = run_experiment(cfg, "results/my-run")        # writes the folder below
    summary = run_experiment(None, "results/my-run", resume=True, rounds=200)   # continue / extend

A run folder holds:

=====================  ======================================================================
``config.json``        the resolved :class:`Config` (enough to rebuild the run)
``partition.json``     client sizes and per-client label histograms
``metrics.jsonl``      one JSON object per round (round 0 = the starting point): §3 metrics,
                       timings, communication, test accuracy; non-finite numbers as null
``checkpoint.pt``      the last checkpoint (atomic; see :mod:`python_algos.experiments.checkpoint`)
``summary.json``       status (completed / diverged / interrupted), final metrics, totals,
                       the command that resumes the run
``model.pt``           the reported model: flat ``params`` and the module's ``state_dict``
=====================  ======================================================================

A comparison (:func:`compare_experiments`) is a folder of such run folders, one per algorithm,
all on the same split and initialization, plus ``comparison.json`` / ``comparison.md``.

Guarantees: every input is checked (:func:`prepare_run`) before a folder is created or a file
in it changes; every file is replaced atomically except ``metrics.jsonl``, which is appended
to and rewritten from the checkpoint on resume (rows past the checkpoint's round are dropped),
so a kill at any moment leaves a folder that ``run --resume`` finishes with the bit-identical
result of an uninterrupted run. A resume refuses a checkpoint whose settings differ from
``config.json`` in anything but the execution settings (``executor``, ``threads``,
``checkpoint_every``) and the number of rounds, which may only grow.

Under ``torchrun`` every rank runs the same calls: the clients are split over the ranks (executor
``distributed`` wrapping ``--executor``), every rank checks every input before rank 0 alone writes
the folder files and shows progress, and the checkpoint is sharded (a manifest ``checkpoint.pt``
plus one file per rank in ``checkpoint.pt.shards/``; see :mod:`python_algos.experiments.launch`),
which resumes on any number of processes.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
import shlex
import signal
import time
import warnings
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import fedkernels as fk

from . import launch
from .config import RESULT_KEYS, Config, ConfigError, flag
from .data import FederatedData, federate, load_dataset
from .models import build_model as _build_model
from .threads import apply_threads
from ..algorithms.registry import ALGORITHMS, make
from ..runfolder import checkpoint as ckpt
from ..runfolder.files import (RUN_FILES, RunFolderError, _append_row, _as_json, _atomic_text, _holds_run,
                               _remove_leftovers, _write_json, _write_jsonl, read_metrics)
from ..runfolder.progress import Progress
from ..simulate import _clients_per_round, simulate

__all__ = [
    "Config",
    "ConfigError",
    "RunFolderError",
    "Interrupted",
    "prepare_run",
    "execute_run",
    "PreparedRun",
    "resume_command",
    "build_regularizer",
    "build_param_regularizer",
    "build_per_parameter",
    "loss_function",
    "prepare_data",
    "build_model",
    "build_algorithm",
    "make_eval",
    "run_experiment",
    "compare_experiments",
    "read_metrics",
    "default_out_dir",
    "format_table",
    "comparison_table",
    "REGULARIZERS",
]

KILL_ENV = "_FEDKERNELS_TEST_KILL_AT_ROUND"  # test hook: SIGKILL the process after this round


# --------------------------------------------------------------------------- #
# Building blocks
# --------------------------------------------------------------------------- #

REGULARIZERS = ("zero", "l1", "elastic_net", "mcp", "scad", "box", "nonneg", "l2ball")


def build_regularizer(name: str, strength: float = 0.0, **opts) -> fk.Regularizer:
    """h by name. ``strength`` is kappa (L1), l1 (elastic net: ``l2=`` in opts, default = strength),
    lam (MCP: ``gamma=`` default 3; SCAD: ``a=`` default 3.7), the radius (l2ball); box takes ``lo=``/``hi=``."""
    if name == "zero":
        return fk.Zero()
    if name == "l1":
        return fk.L1(strength)
    if name == "elastic_net":
        return fk.ElasticNet(strength, opts.get("l2", strength))
    if name == "mcp":
        return fk.MCP(strength, opts.get("gamma", 3.0))
    if name == "scad":
        return fk.SCAD(strength, opts.get("a", 3.7))
    if name == "box":
        return fk.Box(opts.get("lo", -1.0), opts.get("hi", 1.0))
    if name == "nonneg":
        return fk.NonNeg()
    if name == "l2ball":
        return fk.L2Ball(strength if strength > 0 else opts.get("radius", 1.0))
    if name == "group_lasso":
        return fk.GroupLasso(strength, opts.get("groups", "rows"))
    raise ValueError(f"unknown regularizer {name!r}; valid: {', '.join(REGULARIZERS)}")


# Per-parameter entries (--reg-param / [regularizers]): every --reg name, group_lasso (needs a
# parameter's shape, so never the whole model's h) and none; the strength under its own name.
PARAM_REGULARIZERS = ("none",) + REGULARIZERS + ("group_lasso",)
_STRENGTH_NAMES = {"l1": "kappa", "elastic_net": "l1", "mcp": "lam", "scad": "lam", "group_lasso": "lam",
                   "l2ball": "radius"}
_PARAM_OPTIONS = {"elastic_net": ("l2",), "mcp": ("gamma",), "scad": ("a",), "box": ("lo", "hi"),
                  "group_lasso": ("groups",)}


def _spec_text(pattern: str, spec) -> str:
    """An entry as --reg-param spells it: PATTERN=NAME[,KEY=VALUE...]."""
    if not isinstance(spec, dict):
        return f"{pattern}={spec if spec is not None else 'none'}"
    opts = "".join(f",{k}={v}" for k, v in spec.items() if k != "reg")
    return f"{pattern}={spec.get('reg')}{opts}"


def build_param_regularizer(spec, default_strength: float) -> Optional[fk.Regularizer]:
    """One --reg-param entry ("name" or {"reg": name, options}) -> Regularizer, or None for none /
    zero. The strength is ``strength=`` or the penalty's own name for it (``kappa`` for l1, ``lam``
    for mcp / scad / group_lasso, ``l1`` for elastic_net, ``radius`` for l2ball), default
    ``default_strength`` (the run's --reg-strength)."""
    opts = dict(spec) if isinstance(spec, dict) else {"reg": spec if spec is not None else "none"}
    name = str(opts.pop("reg")).lower()
    if name not in PARAM_REGULARIZERS:
        raise ValueError(f"unknown regularizer {name!r}; valid: {', '.join(PARAM_REGULARIZERS)}")
    if name in ("none", "zero"):
        if opts:
            raise ValueError(f"{name} takes no options, got {', '.join(opts)}")
        return None
    own = _STRENGTH_NAMES.get(name)
    strength = default_strength
    for key in ("strength", own):
        if key is not None and key in opts:
            strength = opts.pop(key)
    unknown = [k for k in opts if k not in _PARAM_OPTIONS.get(name, ())]
    if unknown:
        valid = ["strength"] + ([own] if own else []) + list(_PARAM_OPTIONS.get(name, ()))
        raise ValueError(f"{name} has no option {', '.join(unknown)}; its options: {', '.join(valid)}")
    if isinstance(strength, bool) or not isinstance(strength, (int, float)):
        raise ValueError(f"the strength must be a number, got {strength!r}")
    return build_regularizer(name, float(strength), **opts)


def build_per_parameter(table: dict, model: nn.Module, default_strength: float = 0.0) -> fk.PerParameter:
    """The per-parameter h of a [regularizers] table / --reg-param flags; errors name the entry."""
    mapping = {}
    for pattern, spec in table.items():
        try:
            mapping[pattern] = build_param_regularizer(spec, default_strength)
        except (ValueError, TypeError) as e:
            raise ConfigError("regularizers", _spec_text(pattern, spec), str(e)) from None
    try:
        return fk.PerParameter(model, mapping)
    except (ValueError, TypeError) as e:
        text = next((_spec_text(p, s) for p, s in table.items() if repr(p) in str(e)), None)
        raise ConfigError("regularizers", text if text is not None else table, str(e)) from None


def cross_entropy(out, y):
    return F.cross_entropy(out, y)


def bce_with_logits(out, y):
    return F.binary_cross_entropy_with_logits(out, y.to(out.dtype))


def mse(out, y):
    return F.mse_loss(out, y.to(out.dtype))


def loss_function(task: str) -> Callable:
    return {"multiclass": cross_entropy, "binary": bce_with_logits, "regression": mse}[task]


def _opts_text(opts: dict) -> str:
    return " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in opts.items())


def prepare_data(cfg: Config) -> FederatedData:
    """Load / generate the data and split it over the clients; errors name the flags."""
    try:
        ds = load_dataset(cfg.dataset, cfg.data_dir, seed=cfg.seed, test_fraction=cfg.test_fraction, **cfg.data_opts)
    except (ValueError, TypeError) as e:
        named = {k: v for k, v in cfg.data_opts.items() if re.search(rf"\b{re.escape(k)}\b", str(e))}
        raise ValueError(f"--dataset {cfg.dataset}{' --data-opt ' + _opts_text(named) if named else ''}: {e}") from None
    if cfg.partition == "natural" and ds.groups is not None:
        groups = int(torch.unique(torch.as_tensor(ds.groups)).numel())
        if groups != cfg.num_clients:
            fix = {"sparse_logistic": "num_groups", "sparse_linear": "num_groups", "synthetic": "num_clients"}.get(ds.name)
            also = f", or have the generator make {cfg.num_clients} groups: --data-opt {fix}={cfg.num_clients}" if fix else ""
            raise ConfigError("num_clients", cfg.num_clients,
                              f"--partition natural makes one client per group of the data, and {ds.name} has "
                              f"{groups} group(s): use -N {groups}{also}")
    try:
        return federate(ds, cfg.partition, cfg.num_clients, seed=cfg.seed, eta=cfg.eta, min_size=cfg.min_size,
                        shards_per_client=cfg.shards_per_client)
    except ValueError as e:
        raise ValueError(f"--partition {cfg.partition} -N {cfg.num_clients}: {e}") from None


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", name, f"CUDA is not available here (torch {torch.__version__}); use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError("device", name, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def build_model(cfg: Config, ds) -> nn.Module:
    """The model, initialized from ``cfg.seed`` (every algorithm of a comparison starts here)."""
    torch.manual_seed(cfg.seed)
    try:
        model = _build_model(cfg.model, ds.in_shape, ds.outputs, **cfg.model_opts)
    except (ValueError, TypeError) as e:
        raise ValueError(f"--model {cfg.model}{' --model-opt ' + _opts_text(cfg.model_opts) if cfg.model_opts else ''}"
                         f": {e}") from None
    return model.to(device=resolve_device(cfg.device), dtype=getattr(torch, cfg.dtype))


def _hparam_error(cfg: Config, alg_name: str, e: Exception) -> ValueError:
    """``e`` (raised by an algorithm about one of its hyper-parameters) in terms of the flags that set it:
    ``--alg-opt KEY=VALUE`` when the user gave that key, else the ``--lr`` / ``--local-steps`` mapping."""
    msg = str(e)
    given = [k for k in cfg.alg_opts if re.search(rf"\b{re.escape(k)}\b", msg)]
    if given:
        return ValueError(f"--alg-opt {_opts_text({k: cfg.alg_opts[k] for k in given})}: {msg}")
    mapped = {k: v for k, v in ALGORITHMS[cfg.algorithm.lower()].from_lr(cfg.lr, cfg.local_steps).items()
              if k != "local_steps" and k not in cfg.alg_opts}
    shown = ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in mapped.items())
    return ValueError(f"--lr {cfg.lr:g} with --local-steps {cfg.local_steps} sets {alg_name}'s {shown} "
                      f"(see `python -m python_algos algorithms`; override with --alg-opt): {msg}")


def build_algorithm(cfg: Config):
    entry = ALGORITHMS[cfg.algorithm.lower()]
    names = [f.name for f in dataclasses.fields(entry.cls)]
    unknown = [k for k in cfg.alg_opts if k not in names]
    if unknown:
        raise ValueError(f"--alg-opt {_opts_text({k: cfg.alg_opts[k] for k in unknown})}: {entry.cls.name} has no "
                         f"such hyper-parameter; its hyper-parameters: {', '.join(names)}")
    try:
        return make(cfg.algorithm, lr=cfg.lr, local_steps=cfg.local_steps, **cfg.alg_opts)
    except (ValueError, TypeError) as e:
        raise _hparam_error(cfg, entry.cls.name, e) from None


def _build_regularizer(cfg: Config, model: nn.Module) -> fk.Regularizer:
    if cfg.regularizers:
        return build_per_parameter(cfg.regularizers, model, cfg.reg_strength)
    try:
        return build_regularizer(cfg.reg, cfg.reg_strength, **cfg.reg_opts)
    except (ValueError, TypeError) as e:
        opts = f" --reg-opt {_opts_text(cfg.reg_opts)}" if cfg.reg_opts else ""
        raise ValueError(f"--reg {cfg.reg} --reg-strength {cfg.reg_strength:g}{opts}: {e}") from None


def make_eval(ds, model: nn.Module, extra: Optional[Callable] = None, chunk: int = 4096) -> Callable:
    """``eval_fn(params)`` for simulate: test (or, without a test set, train) accuracy and loss;
    with a known ``x_true`` and a linear model, the support F1 score and ||w − x_true||²."""
    X, y, prefix = (ds.X_test, ds.y_test, "test") if ds.X_test is not None else (ds.X, ds.y, "train")
    loss_fn = loss_function(ds.task)
    p0 = next(model.parameters())
    X = X.to(device=p0.device, dtype=p0.dtype)
    y = y.to(device=p0.device)
    x_true = ds.x_true

    def eval_fn(params: torch.Tensor) -> dict:
        out = {}
        with torch.no_grad():
            loss, correct = 0.0, 0
            for s in range(0, X.shape[0], chunk):
                o = model(X[s : s + chunk])
                yc = y[s : s + chunk]
                loss += float(loss_fn(o, yc)) * yc.shape[0]
                if ds.task == "multiclass":
                    correct += int((o.argmax(1) == yc).sum())
                elif ds.task == "binary":
                    correct += int(((o > 0).long() == yc).sum())
            out[f"{prefix}_loss"] = loss / X.shape[0]
            if ds.task != "regression":
                out[f"{prefix}_acc"] = correct / X.shape[0]
            if x_true is not None and params.numel() == x_true.numel() + 1:  # linear model: [w, b]
                w = params[: x_true.numel()].detach().cpu().to(x_true.dtype)
                est, true = w != 0, x_true != 0
                tp = int((est & true).sum())
                out["support_f1"] = 2 * tp / max(int(est.sum()) + int(true.sum()), 1)
                out["dist_to_truth"] = float((w - x_true).pow(2).sum())
            if extra is not None:
                out.update(extra(params))
        return out

    return eval_fn


def default_out_dir(name: str, root: str = "results") -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = os.path.join(root, f"{stamp}-{name}")
    k = 1
    while os.path.exists(path):
        k += 1
        path = os.path.join(root, f"{stamp}-{name}-{k}")
    return path


# --------------------------------------------------------------------------- #
# Files
# --------------------------------------------------------------------------- #


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run, after its summary (status ``"interrupted"``) was written; ``summary``
    holds it, including ``resume_command``."""

    def __init__(self, summary: dict):
        super().__init__(summary.get("message"))
        self.summary = summary


def _read_config_json(path: str) -> Config:
    try:
        with open(path) as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise RunFolderError(f"{path}, line {e.lineno}: {e.msg}: the run's settings are damaged; restore the file "
                             f"from a copy") from None
    if not isinstance(d, dict):
        raise RunFolderError(f"{path}: expected a JSON object of settings")
    if d.get("api_run") is True:  # written by History.save: no checkpoint, no data recipe to rebuild the run
        folder = os.path.dirname(path) or "."
        raise RunFolderError(f"cannot resume {folder}: it is a run saved from Python with History.save (a simulate() "
                             f"result), which has no checkpoint or data settings to continue from; draw it with "
                             f"`python -m python_algos plot {shlex.quote(folder)}` (nothing was changed)")
    try:
        return Config.from_dict(d)
    except ConfigError as e:
        raise e.in_file(path) from None
    except ValueError as e:
        raise RunFolderError(f"{path}: {e}") from None


def resume_command(out_dir: str) -> str:
    return f"python -m python_algos run --resume {shlex.quote(out_dir)}"


# --------------------------------------------------------------------------- #
# Runs
# --------------------------------------------------------------------------- #


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


def check_algorithm_names(algorithms: Sequence[str]) -> None:
    unknown = [a for a in algorithms if a.lower() not in ALGORITHMS]
    if unknown:
        raise ConfigError("algorithm", " ".join(unknown), f"unknown algorithm(s); valid names: {', '.join(ALGORITHMS)}")


def check_world_size(num_clients: int, processes: int) -> None:
    """Every process of a distributed run holds at least one client."""
    if num_clients < processes:
        raise ConfigError("num_clients", num_clients,
                          f"{num_clients} client(s) cannot be split over {processes} processes: every process needs "
                          f"at least one client; use at most {num_clients} processes (--workers / --nproc-per-node) "
                          f"or more clients")


def prepare_run(cfg: Optional[Config], out_dir: str, *, fed: Optional[FederatedData] = None, resume: bool = False,
                rounds: Optional[int] = None, replace: bool = True) -> PreparedRun:
    """Every check of a run, in the order a user would fix them; writes nothing.

    Raises :class:`ConfigError` (a value, named by its flag), :class:`RunFolderError` (the folder:
    a foreign or edited checkpoint, ``--rounds`` below the checkpoint, an existing run that
    ``replace=False`` keeps), :class:`~.checkpoint.CheckpointError` (a damaged checkpoint) or
    ``ValueError`` (data, model, algorithm and participation, named by their flags).
    """
    cfg_path = os.path.join(out_dir, "config.json")
    ckpt_path = os.path.join(out_dir, "checkpoint.pt")
    snap = None
    rewrite = not resume
    if resume:
        if not os.path.isdir(out_dir):
            raise RunFolderError(f"cannot resume {out_dir}: no such folder")
        if not os.path.isfile(cfg_path):
            if os.path.isfile(os.path.join(out_dir, "comparison.json")):
                raise RunFolderError(f"{out_dir} is a comparison: continue it with "
                                     f"`python -m python_algos compare --resume {out_dir}`")
            raise RunFolderError(f"cannot resume {out_dir}: it holds no config.json, so no run was started there "
                                 f"(a run stopped before it wrote its settings leaves none); start it again with `run`")
        cfg = _read_config_json(cfg_path)
        if rounds is not None:
            if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
                raise ConfigError("rounds", rounds, "must be an integer >= 0")
            rewrite = rounds != cfg.rounds
            cfg = cfg.replace(rounds=rounds)
    elif cfg is None:
        raise ValueError("cfg is required unless resume=True")
    else:
        if rounds is not None:
            cfg = cfg.replace(rounds=rounds)
        cfg.check()
        if not replace and os.path.isdir(out_dir) and _holds_run(out_dir):
            raise RunFolderError(f"{out_dir} already holds a run: continue it with `{resume_command(out_dir)}`, or "
                                 f"choose another --out (nothing was changed)")
    launch.join(cfg.device)  # under torchrun: join the job (and take this rank's GPU) before picking the device
    device = resolve_device(cfg.device)
    if resume and os.path.isfile(ckpt_path):
        snap = ckpt.load(ckpt_path, map_location=device)  # a manifest only, when several processes wrote it
        saved = (snap.get("extra") or {}).get("config")
        if isinstance(saved, dict):
            now = _as_json(cfg.to_dict())
            saved = _as_json(saved)
            diff = [k for k in RESULT_KEYS if saved.get(k) != now.get(k)]
            if diff:
                what = "; ".join(f"{k}: checkpoint {json.dumps(saved.get(k))}, config.json {json.dumps(now.get(k))}"
                                 for k in diff)
                raise RunFolderError(
                    f"{ckpt_path} does not belong to the settings in config.json: they differ in {what}. Resuming "
                    f"would continue the checkpoint's run under other settings, so nothing was changed: undo the edit "
                    f"(or put the run's own checkpoint back), or start the new settings in a new folder")
        if cfg.rounds < int(snap["round"]):
            raise ConfigError("rounds", cfg.rounds,
                              f"the checkpoint in {out_dir} is at round {snap['round']} and a run cannot go back; "
                              f"give --rounds {snap['round']} or more (nothing was changed)")
    fed = fed if fed is not None else prepare_data(cfg)
    check_world_size(len(fed.parts), launch.world_size())
    model = build_model(cfg, fed.dataset)
    torch_rng = torch.get_rng_state()
    algorithm = build_algorithm(cfg)
    reg = _build_regularizer(cfg, model)
    with warnings.catch_warnings():  # simulate validates again and warns once
        warnings.simplefilter("ignore")
        try:
            algorithm.validate(reg)
        except ValueError as e:
            raise _hparam_error(cfg, algorithm.name, e) from None
    try:
        _clients_per_round(algorithm, len(fed.parts), cfg.participation, cfg.clients_per_round)
    except ValueError as e:
        key = "participation" if cfg.participation is not None else "clients_per_round"
        raise ConfigError(key, getattr(cfg, key), str(e)) from None
    if cfg.metric_step is None and not algorithm.metric_step() > 0:
        raise ConfigError("metric_step", cfg.metric_step, f"{algorithm.name}'s default step is not > 0; give one")
    if snap is not None and (snap.get("algorithm") != algorithm.name or snap.get("hparams") != algorithm.hparams()):
        raise RunFolderError(f"{ckpt_path} is a checkpoint of {snap.get('algorithm')} {snap.get('hparams')}, not of "
                             f"{algorithm.name} {algorithm.hparams()} as config.json says; nothing was changed")
    if snap is not None:  # this process's client rows (re-cut if another number of processes wrote it)
        snap = launch.local_rows(snap, ckpt_path, len(fed.clients), map_location=device)
    return PreparedRun(cfg, out_dir, fed, model, algorithm, reg, device, snap, resume, rewrite, replace, torch_rng)


def run_experiment(cfg: Optional[Config], out_dir: str, *, fed: Optional[FederatedData] = None,
                   resume: bool = False, rounds: Optional[int] = None, progress: bool = True,
                   extra_eval: Optional[Callable] = None, label: Optional[str] = None,
                   log: Callable[[str], None] = print, replace: bool = True, f_star: Optional[float] = None) -> dict:
    """Run ``cfg`` into ``out_dir`` (see the module docstring); returns the summary dict.

    ``fed``: an already prepared split of this config's data (a comparison shares one).
    ``resume=True``: read ``out_dir/config.json`` and ``checkpoint.pt`` and continue (``cfg`` is
    ignored); ``rounds`` then extends the total (never below the checkpoint's round). Every input
    is checked (:func:`prepare_run`) before anything in ``out_dir`` is created or changed.
    ``replace=False`` refuses a fresh run into a folder that already holds one. ``extra_eval(params)
    -> dict`` adds metrics (e.g. distance to a known solution). A NaN/Inf loss or model stops the run
    with status ``"diverged"``; the checkpoint of the last good round is kept. Ctrl-C writes the
    summary so far (status ``"interrupted"``) and raises :class:`Interrupted`. ``f_star``: the problem's
    optimal value F*, when the caller knows it; recorded in summary.json, where ``plot`` finds it
    and draws the suboptimality f + h − F*.
    """
    _check_f_star(f_star)
    prep = prepare_run(cfg, out_dir, fed=fed, resume=resume, rounds=rounds, replace=replace)
    return execute_run(prep, progress=progress, extra_eval=extra_eval, label=label, log=log, f_star=f_star)


def _check_f_star(f_star) -> None:
    if f_star is not None and (isinstance(f_star, bool) or not isinstance(f_star, (int, float))
                               or not math.isfinite(f_star)):
        raise ValueError(f"f_star must be a finite number (the optimal value F*), got {f_star!r}")


def _start_folder(prep: PreparedRun, log) -> None:
    """The first writes of a run (every check has passed): settings, split, and metrics from the checkpoint."""
    out_dir, cfg, fed, snap = prep.out_dir, prep.cfg, prep.fed, prep.snap
    cfg_path = os.path.join(out_dir, "config.json")
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    if not prep.resume:
        os.makedirs(out_dir, exist_ok=True)
        _remove_leftovers(out_dir, also=RUN_FILES)  # replace: no file of the previous run may outlive it
        launch.remove_shards(os.path.join(out_dir, "checkpoint.pt"))  # ... nor its checkpoint shards
        _write_json(cfg_path, cfg.to_dict())  # first: a folder with config.json can always be resumed
        prep.rewrite_config = False
    else:
        _remove_leftovers(out_dir)
        launch.remove_shard_leftovers(os.path.join(out_dir, "checkpoint.pt"))
    if not prep.resume or snap is None:
        _write_json(os.path.join(out_dir, "partition.json"), {
            "partition": fed.partition, "num_clients": len(fed.parts), "sizes": [len(p) for p in fed.parts],
            "label_histograms": fed.histograms.tolist() if fed.histograms is not None else None,
        })
    if snap is not None:
        _write_jsonl(metrics_path, [snap["initial"], *snap["metrics"]])  # drop the rounds after the checkpoint
        log(f"resuming {out_dir} from round {snap['round']} (checkpoint), up to round {cfg.rounds}")
    else:
        if os.path.exists(metrics_path):
            os.remove(metrics_path)
        if prep.resume:
            log(f"resuming {out_dir}: no checkpoint was written yet, starting from round 0")
    if prep.rewrite_config:
        _write_json(cfg_path, cfg.to_dict())


def execute_run(prep: PreparedRun, *, progress: bool = True, extra_eval: Optional[Callable] = None,
                label: Optional[str] = None, log: Callable[[str], None] = print,
                f_star: Optional[float] = None) -> dict:
    """Run a :class:`PreparedRun` into its folder; returns the summary (see :func:`run_experiment`)."""
    _check_f_star(f_star)
    cfg, out_dir, fed, model, algorithm, reg, snap = (prep.cfg, prep.out_dir, prep.fed, prep.model, prep.algorithm,
                                                      prep.reg, prep.snap)
    ds = fed.dataset
    label = label or cfg.algorithm
    ckpt_path = os.path.join(out_dir, "checkpoint.pt")
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    main = launch.is_main()  # under torchrun rank 0 alone writes the folder files and shows progress
    launch.barrier()  # every rank has checked its inputs (prepare_run) before rank 0 writes anything
    err = None
    if main:
        try:
            _start_folder(prep, log)
        except Exception as e:  # noqa: BLE001 - the other ranks stop too (launch.agree)
            err = e
    launch.agree(err)  # ... and the folder is ready before any rank writes a checkpoint shard
    eval_fn = make_eval(ds, model, extra_eval)

    status = {"diverged": None, "interrupted": False}
    metrics_file = open(metrics_path if main else os.devnull, "a")
    bar = Progress(cfg.rounds, initial=snap["round"] if snap else 0, desc=label, enabled=progress and main)
    kill_at = int(os.environ.get(KILL_ENV, "0") or 0)

    def on_save(s):
        if s["round"] == 0:  # the starting point, before round 1
            _append_row(metrics_file, s["initial"])

    def per_round(t, state, m):
        _append_row(metrics_file, m)
        bar.update(t, m)
        x = algorithm.report(state, reg)
        what = None
        if not bool(torch.isfinite(x).all()):
            what = "the model has NaN/Inf entries"
        elif m.get("f+h") is not None and not math.isfinite(m["f+h"]):
            what = f"f+h = {m['f+h']}"
        if what:
            status["diverged"] = f"round {t}: {what}"
            return True
        if kill_at and t == kill_at:
            metrics_file.close()
            os.kill(os.getpid(), signal.SIGKILL)
        launch.maybe_kill(t)
        return None

    saver = launch.checkpointer(ckpt_path, len(fed.clients), extra={"config": cfg.to_dict()}, on_save=on_save)
    executor, executor_options = launch.executor_for(cfg.executor)
    hist = None
    t0 = time.perf_counter()
    threads = apply_threads(cfg.threads, sum(p.numel() for p in model.parameters()), prep.device)
    torch.set_rng_state(prep.torch_rng)  # as if the model had just been built (a comparison builds them all first)
    try:
        hist = simulate(algorithm, model, loss_function(ds.task), fed.clients, cfg.rounds, regularizer=reg,
                        batch_size=cfg.batch_size, seed=cfg.seed, eval_fn=eval_fn, callbacks=[per_round],
                        metrics_every=cfg.metrics_every, metric_step=cfg.metric_step, resume=snap,
                        checkpoint=saver, checkpoint_every=cfg.checkpoint_every,
                        participation=cfg.participation, clients_per_round=cfg.clients_per_round,
                        executor=executor, executor_options=executor_options)
    except ckpt.Diverged as e:
        status["diverged"] = str(e)
    except KeyboardInterrupt:
        status["interrupted"] = True
    finally:
        bar.close()
        metrics_file.close()
    if not status["interrupted"]:  # every rank reports the same status (an interrupted peer may be gone)
        status["diverged"] = launch.first_message(status["diverged"])
    run_seconds = time.perf_counter() - t0

    # rank 0 wrote metrics.jsonl; another rank (maybe on another node) has the same rows in memory
    rows = read_metrics(out_dir) if main else ([hist.initial, *hist.metrics] if hist is not None else [])
    last_obj = next((r for r in reversed(rows) if "f+h" in r), rows[-1] if rows else {})
    last_ckpt = saver.last_round if saver.last_round is not None else (int(snap["round"]) if snap else None)
    if status["interrupted"] and main:
        last_ckpt = ckpt.saved_round(ckpt_path)  # the file, not the bookkeeping Ctrl-C may have cut short
    summary = {
        "label": label,
        "algorithm": algorithm.name,
        "hparams": algorithm.hparams(),
        "status": "interrupted" if status["interrupted"] else "diverged" if status["diverged"] else "completed",
        "message": None,
        "rounds": cfg.rounds,
        "rounds_done": rows[-1]["round"] if rows else 0,
        "final": last_obj,
        "initial": rows[0] if rows else None,
        "elapsed": rows[-1].get("elapsed", 0.0) if rows else 0.0,
        "process_seconds": run_seconds,
        "regularizer": repr(reg),
        "dataset": ds.source,
        "partition": cfg.partition,
        "num_clients": len(fed.parts),
        "dim": sum(p.numel() for p in model.parameters()),
        "executor": hist.executor if hist is not None else executor,
        "world_size": hist.world_size if hist is not None else launch.world_size(),
        "threads": threads,
        "out_dir": out_dir,
        "last_checkpoint_round": last_ckpt,
        "resume_command": resume_command(out_dir),
    }
    if executor == "distributed":
        summary["inner_executor"] = cfg.executor
    if f_star is not None:
        summary["f_star"] = float(f_star)
    if status["interrupted"]:
        summary["message"] = (f"{label} was interrupted after round {summary['rounds_done']} of {cfg.rounds}; "
                              + (f"the last checkpoint is round {last_ckpt}, where the run resumes"
                                 if last_ckpt is not None else "no checkpoint was written, so it restarts at round 0"))
        if main:
            _write_json(os.path.join(out_dir, "summary.json"), summary)
        raise Interrupted(summary)
    if status["diverged"]:
        keep = (f"the last good checkpoint (round {saver.last_round}) is kept in {ckpt_path}"
                if saver.last_round is not None else
                (f"{ckpt_path} keeps the checkpoint it had" if os.path.exists(ckpt_path) else "no checkpoint was written"))
        summary["message"] = (f"{label} diverged at {status['diverged']}; the run was stopped and {keep}. "
                              f"Lower the step size (--lr, currently {cfg.lr:g}) or the local steps.")
    elif main:
        ckpt.atomic_save({"params": hist.params.cpu(),
                          "state_dict": {k: v.cpu() for k, v in model.state_dict().items()}},
                         os.path.join(out_dir, "model.pt"))
    if main:
        _write_json(os.path.join(out_dir, "summary.json"), summary)
    return summary


def compare_resume_command(out_dir: str) -> str:
    return f"python -m python_algos compare --resume {shlex.quote(out_dir)}"


def _read_comparison(out_dir: str) -> dict:
    path = os.path.join(out_dir, "comparison.json")
    if not os.path.isfile(path):
        hint = (f"; it is a single run: `{resume_command(out_dir)}`"
                if os.path.isfile(os.path.join(out_dir, "config.json")) else "")
        raise RunFolderError(f"cannot resume the comparison {out_dir}: it holds no comparison.json{hint}")
    try:
        with open(path) as f:
            d = json.load(f)
        cfg = Config.from_dict(d["config"])
        return {"config": cfg, "algorithms": list(d["algorithms"]), "alg_opts": dict(d.get("alg_opts") or {})}
    except json.JSONDecodeError as e:
        raise RunFolderError(f"{path}, line {e.lineno}: {e.msg}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise RunFolderError(f"{path}: not a comparison written by `compare` ({e})") from None


def compare_experiments(cfg: Optional[Config], algorithms: Optional[Sequence[str]], out_dir: str, *,
                        alg_opts: Optional[dict] = None, progress: bool = True,
                        extra_eval: Optional[Callable] = None, log: Callable[[str], None] = print,
                        resume: bool = False, rounds: Optional[int] = None, replace: bool = True) -> list:
    """Run each algorithm on the same split and the same initial model, in ``out_dir/<name>/``.

    ``alg_opts[name]`` overrides that algorithm's hyper-parameters (``cfg.alg_opts`` is ignored).
    The metric step s of ||G_s||² defaults to lr·K for every algorithm, so the stationarity
    column is comparable. Every algorithm is checked before anything is written (an invalid one
    raises ``ValueError`` naming it). ``resume=True`` continues the comparison in ``out_dir``
    (``cfg``, ``algorithms``, ``alg_opts`` come from its ``comparison.json``; finished runs are
    kept, the others resume from their checkpoints). Writes ``comparison.json`` and
    ``comparison.md``; returns the summaries.
    """
    if resume:
        saved = _read_comparison(out_dir)
        cfg, algorithms, alg_opts = saved["config"], saved["algorithms"], saved["alg_opts"]
        if rounds is not None:
            cfg = cfg.replace(rounds=rounds)
    else:
        alg_opts = alg_opts or {}
        if rounds is not None:
            cfg = cfg.replace(rounds=rounds)
        check_algorithm_names(algorithms)
        if cfg.metric_step is None:
            cfg = cfg.replace(metric_step=cfg.lr * cfg.local_steps)
        if not replace and os.path.isdir(out_dir) and os.listdir(out_dir):
            raise RunFolderError(f"{out_dir} already holds files: continue a comparison there with "
                                 f"`{compare_resume_command(out_dir)}`, or choose another --out (nothing was changed)")
    cfg.check()
    fed = prepare_data(cfg.replace(algorithm=algorithms[0]))
    plans, errors = {}, []
    for name in algorithms:  # every check first, so an invalid algorithm leaves nothing behind
        c = cfg.replace(algorithm=name, alg_opts=dict(alg_opts.get(name, {})))
        run_dir = os.path.join(out_dir, name)
        try:
            done = None
            if resume and os.path.isfile(os.path.join(run_dir, "summary.json")):
                with open(os.path.join(run_dir, "summary.json")) as f:
                    done = json.load(f)
                if done.get("status") != "completed" or done.get("rounds") != c.rounds:
                    done = None
            if done is not None:
                plans[name] = done
            elif resume and os.path.isfile(os.path.join(run_dir, "config.json")):
                plans[name] = prepare_run(None, run_dir, fed=fed, resume=True, rounds=c.rounds)
            else:
                plans[name] = prepare_run(c, run_dir, fed=fed, replace=True)
        except (ValueError, json.JSONDecodeError) as e:
            errors.append(f"{name}: {e}")
    if errors:
        raise ValueError(("; ".join(errors)) + " (nothing was written)")
    launch.barrier()  # under torchrun: every rank has checked everything before rank 0 writes
    main = launch.is_main()
    if main:
        os.makedirs(out_dir, exist_ok=True)
    record = {"config": cfg.to_dict(), "algorithms": list(algorithms), "alg_opts": alg_opts}

    def write_record(summaries):
        if main:
            _write_json(os.path.join(out_dir, "comparison.json"), {**record, "runs": summaries})

    write_record([])
    summaries = []
    for name in algorithms:
        plan = plans[name]
        if isinstance(plan, dict):
            log(f"{name}: already completed in {plan.get('out_dir')}, kept")
            summaries.append(plan)
            continue
        try:
            summaries.append(execute_run(plan, progress=progress, extra_eval=extra_eval, label=name, log=log))
        except Interrupted as e:
            e.summary["resume_command"] = compare_resume_command(out_dir)
            write_record(summaries + [e.summary])
            raise
        if summaries[-1]["status"] != "completed":
            log(summaries[-1]["message"])
    write_record(summaries)
    if main:
        _atomic_text(os.path.join(out_dir, "comparison.md"), comparison_table(summaries, cfg.metric_step) + "\n")
    return summaries


def comparison_table(summaries: Sequence[dict], metric_step: Optional[float] = None) -> str:
    """Markdown table of final metrics, one row per run summary."""
    s = f" (s={metric_step:g})" if metric_step else ""
    finals = [r.get("final") or {} for r in summaries]
    cols = [("algorithm", "label"), ("f+h", "f+h"), (f"‖G_s‖²{s}", "grad_map_sq"), ("sparsity", "sparsity")]
    acc = next((k for k in ("test_acc", "train_acc") if any(k in f for f in finals)), None)
    if acc:
        cols.append((acc.replace("_", " "), acc))
    if any("support_f1" in f for f in finals):
        cols.append(("support F1", "support_f1"))
    cols += [("time (s)", "elapsed"), ("status", "status")]
    rows = [[r.get(k) if k in ("label", "elapsed", "status") else f.get(k) for _, k in cols]
            for r, f in zip(summaries, finals)]
    return format_table([c[0] for c in cols], rows)


def format_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A markdown table; floats with 4 significant digits."""

    def cell(v):
        if v is None:
            return "–"
        if isinstance(v, float):
            if not math.isfinite(v):
                return str(v)
            if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
                return f"{v:.3e}"
            return f"{v:.4g}"
        return str(v)

    cells = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)])
