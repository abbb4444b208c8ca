"""The records of a run folder, each built and written in one place for every engine: one process
(``run_experiment``, and through it ``run``, ``compare``, seeds, ``sweep``, Optuna and ``--workers``),
``--flower``, and :meth:`History.save <python_algos.simulate.History.save>`.

* ``config.json`` — :func:`write_config` (the settings; ``History.save``'s: what ``simulate`` knew);
* ``partition.json`` — :func:`write_partition` (the split: client sizes, label histograms);
* ``metrics.jsonl`` — :func:`metrics_row` (one round's row; :func:`metric_round`: which rows hold
  metrics), :func:`write_metrics` (rows 0..t), :func:`~.files.append_row` (one more row);
* ``summary.json`` — :func:`summary_record` (how the run ended, its first and last metrics, what it
  ran on), :func:`write_summary`;
* ``model.pt`` — :func:`save_model` (the reported model and its round), :func:`load_model`.

Reading them back: :func:`read_config`, :func:`read_metrics`, :func:`read_summary`, and of a folder
of runs (a comparison, seeds) :func:`group_runs`, the names of its runs in the group's order.

The format is in :mod:`python_algos.runfolder`; the writes are atomic (:mod:`.files`).
"""

from __future__ import annotations

import math
import os
import shlex
from typing import Any, Mapping, Optional, Sequence

import torch

from . import checkpoint as ckpt
from .files import RunExistsError, RunFolderError, create_json, read_json_object, read_metrics, write_json, write_jsonl

__all__ = ["CONFIG", "PARTITION", "METRICS", "SUMMARY", "MODEL", "STATUSES", "API_MARK", "COMPARISON", "SEEDS",
           "FORMAT_VERSION", "FORMAT_KEY", "check_format",
           "run_folder_name", "write_config", "write_partition", "metric_round", "metrics_row",
           "write_metrics", "RunWarning", "run_warning", "summary_record",
           "write_summary", "save_model", "load_model", "read_config", "read_metrics", "read_summary", "group_runs"]

CONFIG, PARTITION, METRICS = "config.json", "partition.json", "metrics.jsonl"
SUMMARY, MODEL = "summary.json", "model.pt"
# The first file of a folder of runs: a comparison (its runs in -a order), seeds (seed-<k>/ each)
COMPARISON, SEEDS = "comparison.json", "seeds.json"

# How a run ended (summary.json "status"): it ran every round; its objective or model became
# non-finite and it was stopped; Ctrl-C / SIGTERM / SIGHUP stopped it (resumable); a Flower node failed;
# its time budget (--time-budget) was spent, after a round it checkpointed (resumable).
STATUSES = ("completed", "diverged", "interrupted", "failed", "stopped")

API_MARK = "api_run"  # config.json / summary.json key that tells a folder written by History.save from a `run` folder
# The run-folder format, in every run's config.json (check_format: a resume's one check of it); raised when
# a resume could no longer continue a folder of the last one. 2: the first recorded (Flower records data);
# 3: a checkpoint's client generators are a dict of the created ones by client index, not a list of N.
FORMAT_VERSION, FORMAT_KEY = 3, "format_version"


# --------------------------------------------------------------------------- config.json


def write_config(out_dir: str, settings: Mapping[str, Any], *, exclusive: bool = False) -> None:
    """``out_dir/config.json``: the settings of the run (a command-line run: ``Config.to_dict()``).

    ``exclusive=True`` (a fresh run that replaces nothing): written only if the folder holds no
    config.json yet, else :class:`~.files.RunExistsError` and nothing changed. config.json is a run's
    first file, so two commands starting runs in one folder at once (the same ``--out``) cannot
    both start: the second is refused instead of clearing the first's files."""
    path = os.path.join(out_dir, CONFIG)
    settings = {FORMAT_KEY: FORMAT_VERSION, **settings}
    if not exclusive:
        write_json(path, settings)
        return
    try:
        create_json(path, settings)
    except FileExistsError:
        raise RunExistsError(f"{out_dir}: another command started a run in this folder after this one had checked "
                             f"it; that run was left alone and this one did not start: choose another --out") from None


def read_config(out_dir: str) -> dict:
    """``out_dir/config.json`` as written (:func:`write_config`); ``FileNotFoundError`` when missing,
    :class:`~.files.RunFolderError` naming the file and line when damaged."""
    return read_json_object(os.path.join(out_dir, CONFIG))


def check_format(folder: str, record: Mapping[str, Any]) -> None:
    """The one format check of a resume: refuse a folder whose ``record`` (config.json) is of another
    format than :data:`FORMAT_VERSION` (none recorded: 1), naming the fix."""
    if (version := record.get(FORMAT_KEY, 1)) != FORMAT_VERSION:
        raise RunFolderError(f"cannot resume {folder}: it was written in run-folder format {version}, this version "
                             f"continues format {FORMAT_VERSION}: start the run again in a new folder (the old one "
                             f"still plots: `python -m python_algos plot {shlex.quote(folder)}`)")


def write_partition(out_dir: str, partition: str, parts: Sequence, histograms=None) -> None:
    """``out_dir/partition.json``: how the data was split (client sizes, per-client label histograms)."""
    write_json(os.path.join(out_dir, PARTITION), {
        "partition": partition, "num_clients": len(parts), "sizes": [len(p) for p in parts],
        "label_histograms": histograms.tolist() if histograms is not None else None})


# --------------------------------------------------------------------------- metrics.jsonl


def metric_round(t: int, rounds: int, metrics_every: int) -> bool:
    """Whether round ``t`` of a run of ``rounds`` rounds gets the objective metrics in its row, for
    every engine: every ``metrics_every``-th round and the last one (``metrics_every=0``: none, a
    timings-only run)."""
    return bool(metrics_every) and (t % metrics_every == 0 or t == rounds)


def metrics_row(round_: int, *, wall_time: float, elapsed: float, prox_time: float, prox_evals: int, up: int,
                down: int, grad_time: Optional[float] = None, grad_evals: Optional[int] = None,
                fwd_bwd_time: Optional[float] = None, sent_bytes: Optional[int] = None,
                recv_bytes: Optional[int] = None, participants: Optional[Sequence[int]] = None,
                metrics: Optional[Mapping[str, Any]] = None) -> dict:
    """One round's row of ``metrics.jsonl``, for every engine (``simulate``, the Flower server): the
    round, its time (this round, and all rounds so far), the prox evaluations, the messages up and
    down, then what an engine measures (gradient timings, bytes, the round's participants; None:
    not measured, left out) and the evaluated metrics (f, f+h, ...), always in this order."""
    row = {"round": round_, "wall_time": wall_time, "elapsed": elapsed, "prox_time": prox_time,
           "prox_evals": prox_evals}
    optional = (("grad_time", grad_time), ("grad_evals", grad_evals), ("fwd_bwd_time", fwd_bwd_time))
    row.update((k, v) for k, v in optional if v is not None)
    row.update(up=up, down=down)
    optional = (("sent_bytes", sent_bytes), ("recv_bytes", recv_bytes), ("participants", participants))
    row.update((k, v) for k, v in optional if v is not None)
    row.update(metrics or {})
    return row


def write_metrics(out_dir: str, rows: Sequence[dict]) -> None:
    """``out_dir/metrics.jsonl`` replaced by ``rows`` (round 0 first), atomically."""
    write_jsonl(os.path.join(out_dir, METRICS), rows)


# --------------------------------------------------------------------------- summary.json


WORSE_THAN_BEST = 10  # f+h this many times its best so far: the run went wrong, whatever it does after


class RunWarning(RuntimeWarning):
    """simulate's warning of a run that went wrong (:func:`run_warning`; the command line shows it at the end)."""


def run_warning(rows: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """Why a run's f+h (``rows``: its metrics rows, round 0 first) says it went wrong, else None: f+h
    became non-finite, rose more than :data:`WORSE_THAN_BEST` times above its best so far (a best
    <= 0 has no such ratio), or ended above its first value. The one rule of summary.json's
    ``warning``, the tables' mark and simulate's ``RuntimeWarning``."""
    pts = [(r.get("round"), math.nan if r["f+h"] is None else float(r["f+h"])) for r in rows if "f+h" in r]
    bad = next(((t, v) for t, v in pts if not math.isfinite(v)), None)
    if bad is not None:
        return f"f+h became {bad[1]} at round {bad[0]}"
    why, best = [], pts[0] if pts else None
    for t, v in pts[1:]:
        if best[1] > 0 and v > WORSE_THAN_BEST * best[1]:
            why.append(f"f+h rose to {v:.4g} at round {t}, {v / best[1]:.3g}x its best {best[1]:.4g} (round {best[0]})")
            break
        best = min(best, (t, v), key=lambda p: p[1])
    if len(pts) > 1 and pts[-1][1] > pts[0][1]:
        why.insert(0, f"f+h ended at {pts[-1][1]:.4g} (round {pts[-1][0]}), above its start {pts[0][1]:.4g} "
                      f"(round {pts[0][0]})")
    return "; ".join(why) or None


def summary_record(*, label: str, algorithm: str, hparams: dict, status: str, rows: Sequence[dict], rounds: int,
                   regularizer: Optional[str], num_clients: Optional[int], dim: int, executor: str,
                   out_dir: str, resume_command: Optional[str], message: Optional[str] = None,
                   **more: Any) -> dict:
    """``summary.json`` of a run: how it ended (``status``, one of :data:`STATUSES`, and ``message``),
    its rows' first (``initial``) and last metrics (``final``: the last row with f+h, past timing-only
    rounds, else the last row), rounds asked and done, the time of its last row, what it ran (algorithm,
    h, clients, dimension, executor), and ``resume_command`` (None: it cannot be resumed). ``rows`` are
    metrics.jsonl's, round 0 first.
    ``more``: what one engine adds (timings, threads, checkpoint round, Flower nodes, F*, ...)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    last = rows[-1] if rows else {}
    return {
        "label": label,
        "algorithm": algorithm,
        "hparams": hparams,
        "status": status,
        "message": message,
        "warning": run_warning(rows),
        "rounds": rounds,
        "rounds_done": last.get("round", 0),
        "final": next((r for r in reversed(rows) if "f+h" in r), last),
        "initial": rows[0] if rows else None,
        "elapsed": last.get("elapsed", 0.0),
        "regularizer": regularizer,
        "num_clients": num_clients,
        "dim": int(dim),
        "executor": executor,
        **more,
        "out_dir": out_dir,
        "resume_command": resume_command,
    }


def write_summary(out_dir: str, summary: Mapping[str, Any]) -> None:
    """``out_dir/summary.json``, atomically (written last: a folder with a summary is closed)."""
    write_json(os.path.join(out_dir, SUMMARY), dict(summary))


def read_summary(out_dir: str) -> Optional[dict]:
    """``out_dir/summary.json``, or None when it is missing or unreadable (a run that never got that
    far, or was killed while writing it)."""
    try:
        return read_json_object(os.path.join(out_dir, SUMMARY))
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- folders of runs


def run_folder_name(algorithm: str) -> str:
    """The folder of an algorithm's run inside a group: its name, or for a user's class given as
    ``package.module:Class`` the same with ``-`` for ``:`` (a colon is no folder name on every system)."""
    return algorithm.replace(":", "-").replace("/", "-").replace("\\", "-")


def group_runs(folder: str) -> Optional[list]:
    """The names of the runs of the folder of runs ``folder``, in the group's order: a comparison's
    algorithms (its ``-a`` order, each ``<name>/``), a seeds folder's ``seed-<k>/``; None when
    ``folder`` is no such group or its record is damaged (the folder listing is then all there is)."""
    for mark, listed in ((COMPARISON, lambda d: d.get("algorithms")),
                         (SEEDS, lambda d: [f"seed-{k}" for k in d.get("seeds") or ()])):
        if os.path.isfile(os.path.join(folder, mark)):
            try:
                names = listed(read_json_object(os.path.join(folder, mark)))
            except (OSError, ValueError, TypeError):
                return None
            return [run_folder_name(str(n)) for n in names] if isinstance(names, list) else None
    return None


# --------------------------------------------------------------------------- model.pt


def save_model(out_dir: str, params: torch.Tensor, round_: int, state_dict: Optional[Mapping] = None) -> None:
    """``out_dir/model.pt``: the reported model's flat ``params``, its module's ``state_dict`` (None
    when unknown) and the ``round`` it is the model of (a resumed run that stops early appends rows
    past it; :func:`~.history.load_history` pairs the model with its own round)."""
    state = None if state_dict is None else {k: v.detach().cpu() for k, v in state_dict.items()}
    ckpt.atomic_save({"params": params.detach().cpu(), "round": int(round_), "state_dict": state},
                     os.path.join(out_dir, MODEL))


def load_model(out_dir: str) -> dict:
    """``out_dir/model.pt`` as saved (``params``, ``round`` — missing in folders of older versions —
    and ``state_dict``), on the CPU."""
    return torch.load(os.path.join(out_dir, MODEL), map_location="cpu", weights_only=True)
