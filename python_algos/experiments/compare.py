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

from . import launch
from .config import Config
from .folders import compare_resume_command, resume_command
from .build import prepare_data
from .prepare import check_algorithm_names, prepare_run
from .run import Interrupted, execute_run
from ..runfolder.files import RunExistsError, RunFolderError, _atomic_text, _write_json
from ..runfolder.folder import check_group_replaceable, clear_group

__all__ = ["compare_experiments", "comparison_table", "format_table"]

COMPARISON_RECORDS = ("comparison.json", "comparison.md")  # a comparison's own files, beside its runs


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
                        resume: bool = False, rounds: Optional[int] = None, replace: bool = False) -> list:
    """Run each algorithm on the same split and the same initial model, in ``out_dir/<name>/``.

    ``alg_opts[name]`` overrides that algorithm's hyper-parameters (``cfg.alg_opts`` is ignored).
    The metric step s of ||G_s||² defaults to lr·K for every algorithm, so the stationarity
    column is comparable. Every algorithm is checked before anything is written (an invalid one
    raises ``ValueError`` naming it). ``resume=True`` continues the comparison in ``out_dir``
    (``cfg``, ``algorithms``, ``alg_opts`` come from its ``comparison.json``; finished runs are
    kept, the others resume from their checkpoints). A fresh comparison into a folder that already
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
        if not replace and os.path.isdir(out_dir) and os.listdir(out_dir):
            raise RunExistsError(f"{out_dir} already holds files: continue a comparison there with "
                                 f"`{compare_resume_command(out_dir)}`, or choose another --out; from Python, "
                                 f"replace=True replaces its runs (nothing was changed)")
        if replace:  # what the replacement would delete must all be the old comparison's
            check_group_replaceable(out_dir, COMPARISON_RECORDS)
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
                plans[name] = prepare_run(c, run_dir, fed=fed, replace=replace)  # empty, or cleared (replace)
        except (ValueError, json.JSONDecodeError) as e:
            errors.append(f"{name}: {e}")
    if errors:
        raise ValueError(("; ".join(errors)) + " (nothing was written)")
    launch.barrier()  # under torchrun: every rank has checked everything before rank 0 writes
    main = launch.is_main()
    if main:
        if replace and not resume:  # nothing of the replaced comparison outlives it (an algorithm left out now)
            clear_group(out_dir, COMPARISON_RECORDS)
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
