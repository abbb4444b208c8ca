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
``summary.json``       status (completed / diverged), final metrics, totals
``model.pt``           the reported model: flat ``params`` and the module's ``state_dict``
=====================  ======================================================================

A comparison (:func:`compare_experiments`) is a folder of such run folders, one per algorithm,
all on the same split and initialization, plus ``comparison.json`` / ``comparison.md``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import signal
import time
import warnings
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import fedkernels as fk

from . import checkpoint as ckpt
from . import launch
from .data import FederatedData, federate, load_dataset
from .models import build_model as _build_model
from .progress import Progress
from ..algorithms.registry import ALGORITHMS, make
from ..simulate import simulate

__all__ = [
    "Config",
    "build_regularizer",
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


@dataclasses.dataclass
class Config:
    """Everything that defines a run. Field names are the command line's flags (``--local-steps``)
    and the keys of a TOML / YAML config file."""

    # algorithm (python_algos.algorithms.registry): built from (lr, local_steps), then alg_opts overrides
    algorithm: str = "fedcanon"
    lr: float = 0.05
    local_steps: int = 10
    alg_opts: dict = dataclasses.field(default_factory=dict)
    # data (python_algos.experiments.data)
    dataset: str = "sparse_logistic"
    data_dir: Optional[str] = None
    data_opts: dict = dataclasses.field(default_factory=dict)
    test_fraction: float = 0.2
    partition: str = "iid"
    num_clients: int = 10
    eta: float = 0.5  # Dirichlet concentration Dir(eta)
    min_size: Optional[int] = None
    shards_per_client: int = 1
    participation: Optional[float] = None  # fraction of clients sampled per round (None: all)
    clients_per_round: Optional[int] = None  # or their number
    # model (python_algos.experiments.models)
    model: str = "linear"
    model_opts: dict = dataclasses.field(default_factory=dict)
    # regularizer h
    reg: str = "l1"
    reg_strength: float = 1e-3
    reg_opts: dict = dataclasses.field(default_factory=dict)
    # run
    rounds: int = 100
    batch_size: Optional[int] = None  # None: full local gradients
    seed: int = 0
    metrics_every: int = 1
    metric_step: Optional[float] = None
    device: str = "cpu"
    dtype: str = "float32"
    checkpoint_every: int = 10
    # execution (changes speed, not the result beyond floating-point summation order)
    executor: str = "auto"  # sequential | batched | auto (python_algos.clients.EXECUTORS)
    threads: Optional[int] = None  # torch / fedkernels threads; None: the policy of python_algos.threads

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown config key(s) {sorted(unknown)}; valid keys: {', '.join(sorted(names))}")
        cfg = cls(**d)
        cfg.check()
        return cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **kw) -> "Config":
        return dataclasses.replace(self, **kw)

    def check(self) -> None:
        if self.algorithm.lower() not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; valid names: {', '.join(ALGORITHMS)}")
        if self.reg not in REGULARIZERS:
            raise ValueError(f"unknown regularizer {self.reg!r}; valid: {', '.join(REGULARIZERS)}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype!r}")
        if self.device not in ("cpu", "cuda", "auto") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be cpu, cuda, cuda:K or auto, got {self.device!r}")
        for name in ("rounds", "num_clients", "local_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "rounds" else 1):
                raise ValueError(f"{name} must be an int >= {0 if name == 'rounds' else 1}, got {v!r}")
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise ValueError(f"batch_size must be a positive int or None (full gradients), got {self.batch_size!r}")


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
    raise ValueError(f"unknown regularizer {name!r}; valid: {', '.join(REGULARIZERS)}")


def cross_entropy(out, y):
    return F.cross_entropy(out, y)


def bce_with_logits(out, y):
    return F.binary_cross_entropy_with_logits(out, y.to(out.dtype))


def mse(out, y):
    return F.mse_loss(out, y.to(out.dtype))


def loss_function(task: str) -> Callable:
    return {"multiclass": cross_entropy, "binary": bce_with_logits, "regression": mse}[task]


def prepare_data(cfg: Config) -> FederatedData:
    ds = load_dataset(cfg.dataset, cfg.data_dir, seed=cfg.seed, test_fraction=cfg.test_fraction, **cfg.data_opts)
    return federate(ds, cfg.partition, cfg.num_clients, seed=cfg.seed, eta=cfg.eta, min_size=cfg.min_size,
                    shards_per_client=cfg.shards_per_client)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available here (torch {torch.__version__}); "
                           f"use --device cpu")
    return dev


def build_model(cfg: Config, ds) -> nn.Module:
    """The model, initialized from ``cfg.seed`` (every algorithm of a comparison starts here)."""
    torch.manual_seed(cfg.seed)
    model = _build_model(cfg.model, ds.in_shape, ds.outputs, **cfg.model_opts)
    return model.to(device=resolve_device(cfg.device), dtype=getattr(torch, cfg.dtype))


def build_algorithm(cfg: Config):
    return make(cfg.algorithm, lr=cfg.lr, local_steps=cfg.local_steps, **cfg.alg_opts)


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


def _clean(v):
    """JSON-safe: non-finite floats -> None, tensors / numpy scalars -> Python numbers."""
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return v if math.isfinite(v) else None
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return _clean(v.item())
    return v


def _write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(_clean(obj), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _write_jsonl(path: str, rows: Sequence[dict]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(_clean(r)) + "\n")
    os.replace(tmp, path)


def read_metrics(run_dir: str) -> list:
    """The rows of ``run_dir/metrics.jsonl`` (round 0 first); a torn last line is skipped."""
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


# --------------------------------------------------------------------------- #
# Runs
# --------------------------------------------------------------------------- #


def run_experiment(cfg: Optional[Config], out_dir: str, *, fed: Optional[FederatedData] = None,
                   resume: bool = False, rounds: Optional[int] = None, progress: bool = True,
                   extra_eval: Optional[Callable] = None, label: Optional[str] = None,
                   log: Callable[[str], None] = print) -> dict:
    """Run ``cfg`` into ``out_dir`` (see the module docstring); returns the summary dict.

    ``fed``: an already prepared split of this config's data (a comparison shares one).
    ``resume=True``: read ``out_dir/config.json`` and ``checkpoint.pt`` and continue (``cfg`` is
    ignored); ``rounds`` then extends or shortens the total. ``extra_eval(params) -> dict`` adds
    metrics (e.g. distance to a known solution). A NaN/Inf loss or model stops the run with
    status ``"diverged"``; the checkpoint of the last good round is kept.

    Under torchrun every rank calls this: the clients are sharded over the ranks (executor
    ``distributed`` wrapping ``cfg.executor``), rank 0 alone writes the folder and reports
    progress, checkpoints are sharded (:mod:`python_algos.experiments.launch`).
    """
    main = launch.is_main()
    os.makedirs(out_dir, exist_ok=True)
    cfg_path = os.path.join(out_dir, "config.json")
    ckpt_path = os.path.join(out_dir, "checkpoint.pt")
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    snap = None
    if resume:
        if not os.path.isfile(cfg_path) or not os.path.isfile(ckpt_path):
            raise FileNotFoundError(f"cannot resume {out_dir}: it needs config.json and checkpoint.pt (written by "
                                    f"`run` every --checkpoint-every rounds)")
        with open(cfg_path) as f:
            cfg = Config.from_dict(json.load(f))
    elif cfg is None:
        raise ValueError("cfg is required unless resume=True")
    cfg.check()
    if rounds is not None:
        cfg = cfg.replace(rounds=int(rounds))
    label = label or cfg.algorithm
    launch.join(cfg.device)  # under torchrun: join the job (and pick this rank's GPU) first
    device = resolve_device(cfg.device)

    fed = fed if fed is not None else prepare_data(cfg)
    ds = fed.dataset
    model = build_model(cfg, ds)
    algorithm = build_algorithm(cfg)
    reg = build_regularizer(cfg.reg, cfg.reg_strength, **cfg.reg_opts)
    with warnings.catch_warnings():  # simulate validates again and warns once
        warnings.simplefilter("ignore")
        algorithm.validate(reg)  # fail before any file is written
    eval_fn = make_eval(ds, model, extra_eval)

    if resume:
        snap = launch.load_checkpoint(ckpt_path, len(fed.clients), map_location=device)
        rows = [snap["initial"], *snap["metrics"]]
        if main:
            _write_jsonl(metrics_path, rows)  # drop the rounds after the checkpoint
            log(f"resuming {out_dir} from round {snap['round']} (checkpoint), up to round {cfg.rounds}")
    elif main:
        if os.path.exists(metrics_path):
            os.remove(metrics_path)
        _write_json(os.path.join(out_dir, "partition.json"), {
            "partition": fed.partition, "num_clients": len(fed.parts), "sizes": [len(p) for p in fed.parts],
            "label_histograms": fed.histograms.tolist() if fed.histograms is not None else None,
        })
    if main:
        _write_json(cfg_path, cfg.to_dict())

    status = {"diverged": None}
    metrics_file = open(metrics_path if main else os.devnull, "a")
    bar = Progress(cfg.rounds, initial=snap["round"] if snap else 0, desc=label, enabled=progress and main)
    kill_at = int(os.environ.get(KILL_ENV, "0") or 0)

    def on_save(s):
        if s["round"] == 0:  # the starting point, before round 1
            metrics_file.write(json.dumps(_clean(s["initial"])) + "\n")
            metrics_file.flush()

    def per_round(t, state, m):
        metrics_file.write(json.dumps(_clean(m)) + "\n")
        metrics_file.flush()
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
    try:
        hist = simulate(algorithm, model, loss_function(ds.task), fed.clients, cfg.rounds, regularizer=reg,
                        batch_size=cfg.batch_size, seed=cfg.seed, eval_fn=eval_fn, callbacks=[per_round],
                        metrics_every=cfg.metrics_every, metric_step=cfg.metric_step, resume=snap,
                        checkpoint=saver, checkpoint_every=cfg.checkpoint_every,
                        participation=cfg.participation, clients_per_round=cfg.clients_per_round,
                        executor=executor, executor_options=executor_options)
    except ckpt.Diverged as e:
        status["diverged"] = str(e)
    finally:
        bar.close()
        metrics_file.close()
    status["diverged"] = launch.first_message(status["diverged"])  # every rank reports the same status
    run_seconds = time.perf_counter() - t0

    rows = read_metrics(out_dir)
    last_obj = next((r for r in reversed(rows) if "f+h" in r), rows[-1] if rows else {})
    summary = {
        "label": label,
        "algorithm": algorithm.name,
        "hparams": algorithm.hparams(),
        "status": "diverged" if status["diverged"] else "completed",
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
        "threads": torch.get_num_threads(),
        "out_dir": out_dir,
        "last_checkpoint_round": saver.last_round,
    }
    if status["diverged"]:
        keep = (f"the last good checkpoint (round {saver.last_round}) is kept in {ckpt_path}"
                if saver.last_round is not None else
                (f"{ckpt_path} keeps the checkpoint it had" if os.path.exists(ckpt_path) else "no checkpoint was written"))
        summary["message"] = (f"{label} diverged at {status['diverged']}; the run was stopped and {keep}. "
                              f"Lower the step size (--lr, currently {cfg.lr:g}) or the local steps.")
    elif main:
        torch.save({"params": hist.params.cpu(), "state_dict": {k: v.cpu() for k, v in model.state_dict().items()}},
                   os.path.join(out_dir, "model.pt"))
    if executor == "distributed":
        summary["inner_executor"] = cfg.executor
    if main:
        _write_json(os.path.join(out_dir, "summary.json"), summary)
    return summary


def compare_experiments(cfg: Config, algorithms: Sequence[str], out_dir: str, *,
                        alg_opts: Optional[dict] = None, progress: bool = True,
                        extra_eval: Optional[Callable] = None, log: Callable[[str], None] = print) -> list:
    """Run each algorithm on the same split and the same initial model, in ``out_dir/<name>/``.

    ``alg_opts[name]`` overrides that algorithm's hyper-parameters (``cfg.alg_opts`` is ignored).
    The metric step s of ||G_s||² defaults to lr·K for every algorithm, so the stationarity
    column is comparable. Writes ``comparison.json`` and ``comparison.md``; returns the summaries.
    """
    alg_opts = alg_opts or {}
    unknown = [a for a in algorithms if a.lower() not in ALGORITHMS]
    if unknown:
        raise ValueError(f"unknown algorithm(s) {unknown}; valid names: {', '.join(ALGORITHMS)}")
    if cfg.metric_step is None:
        cfg = cfg.replace(metric_step=cfg.lr * cfg.local_steps)
    os.makedirs(out_dir, exist_ok=True)
    fed = prepare_data(cfg.replace(algorithm=algorithms[0]))
    summaries = []
    for name in algorithms:
        c = cfg.replace(algorithm=name, alg_opts=dict(alg_opts.get(name, {})))
        try:
            summaries.append(run_experiment(c, os.path.join(out_dir, name), fed=fed, progress=progress,
                                            extra_eval=extra_eval, label=name, log=log))
        except ValueError as e:  # e.g. a step rule the algorithm's validate rejects: skip it, say why
            summaries.append({"label": name, "status": "invalid", "message": f"{name}: {e}", "final": {},
                              "elapsed": None, "rounds_done": 0, "out_dir": os.path.join(out_dir, name)})
        if summaries[-1]["status"] != "completed":
            log(summaries[-1]["message"])
    if launch.is_main():
        _write_json(os.path.join(out_dir, "comparison.json"), {"config": cfg.to_dict(), "runs": summaries})
        with open(os.path.join(out_dir, "comparison.md"), "w") as f:
            f.write(comparison_table(summaries, cfg.metric_step) + "\n")
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
