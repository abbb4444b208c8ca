"""A :func:`~python_algos.simulate` result (:class:`~python_algos.simulate.History`) as a run folder.

    hist = simulate(FedCanon(alpha=0.1, beta=0.01, local_steps=10), model, loss_fn, clients, rounds=100)
    hist.save("results/my-api-run")            # config.json, metrics.jsonl, summary.json, model.pt
    python -m python_algos plot results/my-api-run
    hist = History.load("results/my-api-run")   # also reads folders written by `run` / `compare`

The files are those of a command-line run (see :mod:`python_algos.runfolder`), so ``plot`` and every
reader of run folders work on them. ``config.json`` holds what ``simulate`` knew (algorithm and its
hyper-parameters, regularizer, rounds, seed, batch size, executor, number of clients, ...) and
``"api_run": true``: such a folder has no checkpoint and no data recipe, so ``run --resume``
refuses it. No ``checkpoint.pt`` or ``partition.json`` is written.

The folder is written in full under a temporary name beside the target and renamed into place, so
a failure (or a kill) leaves either no folder or the previous one, never a mix.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from typing import Optional

import torch

from . import checkpoint as ckpt
from .files import _holds_run, _write_json, _write_jsonl, read_metrics

__all__ = ["save_history", "load_history", "API_MARK"]

API_MARK = "api_run"  # config.json key that tells a folder written by History.save from a `run` folder


def _check_target(path: str, overwrite: bool) -> None:
    """Refuse a target the save must not touch (before anything is written)."""
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False, got {overwrite!r}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"History.save: {path} is a file, not a folder (nothing was changed)")
    if os.path.isdir(path) and os.listdir(path):
        if not _holds_run(path):
            raise FileExistsError(f"History.save: {path} holds files that are not a run folder; choose another "
                                  f"path (nothing was changed, overwrite=True replaces only run folders)")
        if not overwrite:
            raise FileExistsError(f"History.save: {path} already holds a run; pass overwrite=True to replace it, "
                                  f"or choose another path (nothing was changed)")


def save_history(hist, path: str, *, overwrite: bool = False, label: Optional[str] = None,
                 f_star: Optional[float] = None, model=None) -> str:
    """See :meth:`python_algos.simulate.History.save`."""
    path = os.fspath(path)
    if label is not None and not isinstance(label, str):
        raise TypeError(f"label must be a string, got {type(label).__name__}")
    if f_star is not None and (isinstance(f_star, bool) or not isinstance(f_star, (int, float))
                               or not math.isfinite(f_star)):
        raise ValueError(f"f_star must be a finite number (the optimal value F*), got {f_star!r}")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_target(path, overwrite)
    rows = [hist.initial, *hist.metrics]
    last_obj = next((r for r in reversed(rows) if "f+h" in r), rows[-1])
    setup = dict(hist.setup or {})
    label = label or hist.algorithm
    config = {API_MARK: True, "saved_by": "python_algos History.save", "algorithm": hist.algorithm,
              "hparams": hist.hparams, "executor": hist.executor, **setup}
    summary = {
        "label": label,
        "algorithm": hist.algorithm,
        "hparams": hist.hparams,
        "status": "completed",
        "message": None,
        "rounds": setup.get("rounds", rows[-1].get("round", 0)),
        "rounds_done": rows[-1].get("round", 0),
        "final": last_obj,
        "initial": hist.initial,
        "elapsed": rows[-1].get("elapsed", 0.0),
        "regularizer": setup.get("regularizer"),
        "num_clients": setup.get("num_clients"),
        "dim": int(hist.params.numel()),
        "executor": hist.executor,
        "f_star": None if f_star is None else float(f_star),
        API_MARK: True,
        "resume_command": None,
    }
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(path))}.tmp-{os.getpid()}")
    old = os.path.join(parent, f".{os.path.basename(os.path.abspath(path))}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.makedirs(tmp)
        _write_json(os.path.join(tmp, "config.json"), config)
        _write_jsonl(os.path.join(tmp, "metrics.jsonl"), rows)
        state_dict = None if model is None else {k: v.detach().cpu() for k, v in model.state_dict().items()}
        ckpt.atomic_save({"params": hist.params.detach().cpu(), "state_dict": state_dict},
                         os.path.join(tmp, "model.pt"))
        _write_json(os.path.join(tmp, "summary.json"), {**summary, "out_dir": path})
        if os.path.isdir(path):  # empty, or a run folder that overwrite=True replaces: swap, then drop the old
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _nan_for_null(row: dict) -> dict:
    """metrics.jsonl stores non-finite numbers as null; give them back as NaN."""
    return {k: (math.nan if v is None else v) for k, v in row.items()}


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}, line {e.lineno}: {e.msg}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return d


def load_history(path: str) -> dict:
    """See :meth:`python_algos.simulate.History.load`: the History's fields (all but ``state``) as a
    dict, which ``History.load`` builds the History from (this layer sits below ``simulate``)."""
    path = os.fspath(path)
    missing = [f for f in ("config.json", "metrics.jsonl") if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise FileNotFoundError(f"History.load: {path} is not a run folder (no {', '.join(missing)})")
    config = _read_json(os.path.join(path, "config.json"))
    summary = _read_json(os.path.join(path, "summary.json")) if os.path.isfile(os.path.join(path, "summary.json")) \
        else {}
    rows = [_nan_for_null(r) for r in read_metrics(path)]
    if not rows:
        raise ValueError(f"History.load: {os.path.join(path, 'metrics.jsonl')} holds no rows")
    model_path = os.path.join(path, "model.pt")
    if not os.path.isfile(model_path):
        raise FileNotFoundError(f"History.load: {path} holds no model.pt (the run did not complete)")
    params = torch.load(model_path, map_location="cpu", weights_only=True)["params"]
    if config.get(API_MARK):
        setup = {k: v for k, v in config.items() if k not in (API_MARK, "saved_by", "algorithm", "hparams", "executor")}
        algorithm, hparams, executor = config["algorithm"], config["hparams"], config.get("executor", "sequential")
    else:  # a folder of `run` / `compare`: the Config is the setup
        setup = dict(config)
        algorithm = summary.get("algorithm", config.get("algorithm"))
        hparams, executor = summary.get("hparams", {}), summary.get("executor", config.get("executor"))
    return dict(params=params, metrics=rows[1:], initial=rows[0], algorithm=algorithm, hparams=hparams,
                executor=executor, setup=setup)
