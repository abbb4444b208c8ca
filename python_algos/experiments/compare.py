"""Comparisons: several algorithms on the same split and the same initial model, and their tables.

A comparison (:func:`compare_experiments`) is a folder of run folders, one per algorithm, plus
``comparison.json`` (the settings and the runs' summaries, rewritten after each run) and
``comparison.md`` (:func:`comparison_table`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Optional, Sequence

from ..runfolder.files import RunFolderError, read_json_object, write_json, write_text_atomically
from ..runfolder.folder import check_group_start, open_group_folder
from ..runfolder.records import API_MARK, COMPARISON, CONFIG, read_metrics, read_summary, run_folder_name
from ..system.lock import lock_folder
from . import launch
from .build import prepare_data
from .config import Config
from .folders import compare_resume_command, resume_command
from .prepare import check_algorithm_names, prepare_run
from .run import Interrupted, execute_run
from .tables import column_name, format_table, status_cell, warning_notes

__all__ = ["compare_experiments", "comparison_table", "format_table", "finished_run", "kept_message", "verdict_line",
           "coinciding", "write_comparison", "check_resumable", "COMPARISON_RECORDS"]

COMPARISON_RECORDS = (COMPARISON, "comparison.md")  # a comparison's own files, beside its runs


def _read_comparison(out_dir: str) -> dict:
    lock_folder(out_dir)  # a resume: no other command in the folder meanwhile
    path = os.path.join(out_dir, COMPARISON)
    if not os.path.isfile(path):
        hint = (f"; it is a single run: `{resume_command(out_dir)}`"
                if os.path.isfile(os.path.join(out_dir, CONFIG)) else "")
        raise RunFolderError(f"cannot resume the comparison {out_dir}: it holds no {COMPARISON}{hint}")
    d = read_json_object(path)  # a damaged file: RunFolderError naming the file and line
    check_resumable(out_dir, d)
    try:
        cfg = Config.from_dict(d["config"])
        return {"config": cfg, "algorithms": list(d["algorithms"]), "alg_opts": dict(d.get("alg_opts") or {})}
    except (KeyError, TypeError, ValueError) as e:
        raise RunFolderError(f"{path}: not a comparison written by `compare` ({e})") from None


def check_resumable(folder: str, record: dict) -> None:
    """A group :func:`.api.compare` wrote (``api_run``) records no data settings, so no resume continues it."""
    if record.get(API_MARK):
        raise RunFolderError(f"cannot resume {folder}: compare() from Python wrote it, which records no data settings "
                             f"to continue from; draw it with `python -m python_algos plot {folder}` (nothing was "
                             f"changed)")


def _plan_runs(cfg: Config, algorithms: Sequence[str], alg_opts: dict, out_dir: str, resume: bool,
               replace: bool) -> dict:
    """name -> the run's :class:`~.prepare.PreparedRun`, or the summary of a finished run a resume
    keeps (:func:`finished_run`). Every algorithm is checked, writing nothing; the errors of all
    of them are raised together."""
    cfg.check()
    fed = prepare_data(cfg.replace(algorithm=algorithms[0]))
    plans, errors = {}, []
    for name in algorithms:
        c = cfg.replace(algorithm=name, alg_opts=dict(alg_opts.get(name, {})))
        run_dir = os.path.join(out_dir, run_folder_name(name))
        try:
            done = finished_run(run_dir, c.rounds) if resume else None
            if done is not None:
                plans[name] = done
            elif resume and os.path.isfile(os.path.join(run_dir, CONFIG)):
                plans[name] = prepare_run(None, run_dir, fed=fed, resume=True, rounds=c.rounds)
            else:
                plans[name] = prepare_run(c, run_dir, fed=fed, replace=replace)  # empty, or cleared (replace)
        except (ValueError, json.JSONDecodeError) as e:
            errors.append(f"{name}: {e}")
    if errors:
        raise ValueError(("; ".join(errors)) + " (nothing was written)")
    return plans


def compare_experiments(cfg: Optional[Config], algorithms: Optional[Sequence[str]], out_dir: str, *,
                        alg_opts: Optional[dict] = None, progress: bool = True,
                        extra_eval: Optional[Callable] = None, log: Callable[[str], None] = print,
                        resume: bool = False, rounds: Optional[int] = None, replace: bool = False) -> list:
    """Run each algorithm on the same split and the same initial model, in ``out_dir/<name>/``.

    ``alg_opts[name]`` overrides that algorithm's hyper-parameters (``cfg.alg_opts`` is ignored).
    The metric step s of ||G_s||² defaults to lr·K for every algorithm, so the stationarity
    column is comparable. Every algorithm is checked before anything is written (an invalid one
    raises ``ValueError`` naming it). ``resume=True`` continues the comparison in ``out_dir``
    (``cfg``, ``algorithms``, ``alg_opts`` come from its ``comparison.json``; finished runs,
    completed or diverged (:func:`finished_run`), are kept untouched, the others resume from their
    checkpoints). A fresh comparison into a folder that already
    holds files raises :class:`~python_algos.runfolder.files.RunExistsError` (nothing is touched)
    unless ``replace=True``, which replaces the whole comparison (refused when the folder holds anything
    else than its runs, records and figures). Writes ``comparison.json`` and
    ``comparison.md``; returns the summaries.
    """
    if not isinstance(replace, bool):  # a truthy string must not delete runs
        raise TypeError(f"replace must be True or False, got {replace!r}")
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
        # a replacement may delete only the old comparison (its runs, records, figures)
        check_group_start(out_dir, COMPARISON_RECORDS, replace, how_to_resume=compare_resume_command(out_dir))
    plans = _plan_runs(cfg, algorithms, alg_opts, out_dir, resume, replace)
    launch.barrier()  # under torchrun: every rank has checked everything before rank 0 writes
    main = launch.is_main()
    record = {"config": cfg.to_dict(), "algorithms": list(algorithms), "alg_opts": alg_opts}

    def write_record(summaries):
        if main:
            write_json(os.path.join(out_dir, COMPARISON), {**record, "runs": summaries})

    if not resume and main:  # replaced: nothing of the old comparison outlives it (an algorithm left out now)
        open_group_folder(out_dir, COMPARISON, {**record, "runs": []}, COMPARISON_RECORDS, replace=replace)
    else:
        write_record([])
    summaries = []
    for name in algorithms:
        plan = plans[name]
        if isinstance(plan, dict):
            log(f"{name}: {kept_message(plan)}")
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
    if main:
        write_comparison(out_dir, record, summaries, cfg.metric_step)
    return summaries


def write_comparison(out_dir: str, record: dict, summaries: Sequence[dict], metric_step: Optional[float]) -> None:
    """A finished comparison's records: comparison.json (``record`` and the runs' summaries) and comparison.md."""
    write_json(os.path.join(out_dir, COMPARISON), {**record, "runs": list(summaries)})
    write_text_atomically(os.path.join(out_dir, "comparison.md"), comparison_table(summaries, metric_step) + "\n")


def finished_run(run_dir: str, rounds: int) -> Optional[dict]:
    """The summary of the run in ``run_dir`` if it is finished, else None. A resume continues only
    the others (interrupted, or never summarized). Finished: completed to ``rounds`` (a resume
    asking for more rounds extends it), or diverged (resumed from its last good checkpoint, it
    would diverge again, rewriting its files on every resume)."""
    s = read_summary(run_dir)  # None: missing or unreadable (a kill while writing it)
    if s is None:
        return None
    if s.get("status") == "diverged" or (s.get("status") == "completed" and s.get("rounds") == rounds):
        return s
    return None


def kept_message(summary: dict) -> str:
    """What a resume says of a finished run it keeps (:func:`finished_run`)."""
    if summary.get("status") == "diverged":
        return (f"diverged at round {summary.get('rounds_done')}, kept as it is in {summary.get('out_dir')} (a "
                f"resume continues interrupted runs only; this one would diverge again)")
    return f"already completed in {summary.get('out_dir')}, kept"


def comparison_table(summaries: Sequence[dict], metric_step: Optional[float] = None) -> str:
    """Markdown table of final metrics, one row per run summary (headings: :func:`.tables.column_name`)."""
    finals = [r.get("final") or {} for r in summaries]
    keys = ["f+h", "grad_map_sq", "sparsity"]
    acc = next((k for k in ("test_acc", "train_acc") if any(k in f for f in finals)), None)
    keys += [acc] if acc else []
    keys += ["support_f1"] if any("support_f1" in f for f in finals) else []
    header = ["algorithm", *(column_name(k, metric_step) for k in keys), column_name("elapsed"), "status"]
    rows = [[r.get("label"), *(f.get(k) for k in keys), r.get("elapsed"), status_cell(r.get("status"), [r])]
            for r, f in zip(summaries, finals)]
    return "\n".join([format_table(header, rows), *warning_notes([(r.get("label"), r) for r in summaries])])


# Two curves closer than this (relative difference of f+h) are one line in a figure: one hides the other
COINCIDE_RTOL = 1e-4
SAME_RTOL = 1e-9  # closer than this at every round: the same trajectory, up to rounding


def _rel_diffs(a: Sequence[dict], b: Sequence[dict], key: str) -> dict:
    """round -> |a − b| / max(|a|, |b|) of ``key`` at the rounds both runs logged it (finite)."""
    bv = {r["round"]: r.get(key) for r in b}
    out = {}
    for r in a:
        x, y = r.get(key), bv.get(r["round"])
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(x) and math.isfinite(y):
            scale = max(abs(x), abs(y))
            out[r["round"]] = abs(x - y) / scale if scale > 0 else 0.0
    return out


def coinciding(runs: Sequence[tuple], key: str = "f+h") -> list:
    """Pairs of runs ``(name, metrics rows)`` whose ``key`` curves coincide: relative difference below
    :data:`COINCIDE_RTOL` at every round of the second half of the run (where a figure shows them
    as one line; the first rounds may differ). Returns ``[(name_a, name_b, worst, same)]``: ``worst``
    the largest relative difference over that half, ``same`` whether it stays below
    :data:`SAME_RTOL` at every round (the same trajectory)."""
    found = []
    for i, (na, ra) in enumerate(runs):
        for nb, rb in runs[i + 1:]:
            diffs = _rel_diffs(ra, rb, key)
            if len(diffs) < 2:
                continue
            half = max(diffs) / 2
            late = [d for t, d in diffs.items() if t >= half]
            if max(late) < COINCIDE_RTOL:
                found.append((na, nb, max(late), max(diffs.values()) < SAME_RTOL))
    return found


def _names(summaries: Sequence[dict]) -> str:
    names = [s.get("algorithm") or s.get("label") for s in summaries]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _best(summaries: Sequence[dict], key: str, better) -> Optional[tuple]:
    """(the runs that reach the best final ``key``, that value); ties (equal values) all named."""
    vals = [(s, s["final"][key]) for s in summaries if isinstance((s.get("final") or {}).get(key), (int, float))
            and math.isfinite(s["final"][key])]
    if not vals:
        return None
    top = better(v for _, v in vals)
    return [s for s, v in vals if v == top], top


def verdict_line(summaries: Sequence[dict]) -> str:
    """One line on a comparison's completed runs: which reached the lowest f+h, which the best support
    recovery (support F1 against a known ground truth, when the problem has one), and which f+h
    curves coincide (:func:`coinciding`). Reads each run's metrics.jsonl."""
    done = [s for s in summaries if s.get("status") == "completed"]
    parts = []
    best = _best(done, "f+h", min)
    if best:
        parts.append(f"lowest f+h: {_names(best[0])} ({best[1]:.6g})")
    best = _best(done, "support_f1", max)
    if best:
        parts.append(f"best support recovery: {_names(best[0])} (support F1 = {best[1]:.4g})")
    name = {s["out_dir"]: s.get("algorithm") or s.get("label") for s in done}
    for a, b, worst, same in coinciding([(name[s["out_dir"]], read_metrics(s["out_dir"])) for s in done]):
        how = ("the same trajectory: f+h within a relative 1e-9 at every round" if same else
               f"f+h within a relative {worst:.1e} over the second half of the rounds")
        parts.append(f"{a} and {b} coincide ({how}; one curve hides the other in the figures)")
    return "; ".join(parts) if parts else "no run completed"
