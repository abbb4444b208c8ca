"""Statistics over independent seeds of one experiment: per round and of the final metrics.

    rows = aggregate_rows([read_metrics(d) for d in seed_dirs])   # one row per round
    rows[5]["f+h"]  ->  {"mean": ..., "std": ..., "min": ..., "max": ...}
    stats_cell(final_stats(summaries)["f+h"])                     # "0.3312 ± 0.0021"

Every numeric metric of the rows is aggregated round by round over the seeds that logged it at
that round (``n`` counts them; a seed that stopped early, or logged the metric at other rounds,
does not enter the rounds it lacks). ``std`` is the sample standard deviation (n − 1 in the
denominator; 0 for one seed), the usual error bar of a mean over independent seeds.

Files (written next to the seed folders by :func:`write_aggregate`):

==================  ============================================================================
``aggregate.jsonl``  one line per (label, round): ``{"label", "round", "n", KEY: {mean, std, min, max}}``
``aggregate.json``   per label: the seeds, their statuses and folders, the final metrics' statistics
``aggregate.md``     the table of final metrics as mean ± std (what the command prints)
==================  ============================================================================
"""

from __future__ import annotations

import math
import os
import re
from typing import Dict, List, Optional, Sequence

from ..runfolder.files import _atomic_text, _write_json, _write_jsonl

__all__ = ["stats", "aggregate_rows", "final_stats", "stats_cell", "seed_table", "write_aggregate", "seed_of",
           "group_key", "TABLE_METRICS", "SEED_DIR"]

SEED_DIR = "seed-{}"  # the folder of one seed inside an experiment's folder
_SEED_RE = re.compile(r"^seed-(\d+)$")
# the final metrics a table shows, in this order, where the runs logged them
TABLE_METRICS = ("f+h", "grad_map_sq", "sparsity", "test_acc", "train_acc", "support_f1")


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def stats(values: Sequence[float]) -> dict:
    """``{"mean", "std", "min", "max", "n"}`` of finite numbers (std: sample std, 0 for one value)."""
    vals = [float(v) for v in values]
    n = len(vals)
    mean = math.fsum(vals) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(vals), "max": max(vals), "n": n}


def aggregate_rows(runs_rows: Sequence[Sequence[dict]]) -> List[dict]:
    """Per round, the statistics of every numeric metric over the runs (see the module docstring)."""
    by_round: Dict[int, Dict[str, list]] = {}
    counts: Dict[int, int] = {}
    for rows in runs_rows:
        for r in rows:
            t = r.get("round")
            if not isinstance(t, int):
                continue
            counts[t] = counts.get(t, 0) + 1
            slot = by_round.setdefault(t, {})
            for k, v in r.items():
                if k != "round" and _num(v):
                    slot.setdefault(k, []).append(v)
    out = []
    for t in sorted(by_round):
        row = {"round": t, "n": counts[t]}
        for k, vals in by_round[t].items():
            s = stats(vals)
            s.pop("n")
            row[k] = s if len(vals) == counts[t] else {**s, "n": len(vals)}
        out.append(row)
    return out


def final_stats(summaries: Sequence[dict]) -> dict:
    """KEY -> statistics of ``summary["final"][KEY]`` over the summaries (seeds) that have it."""
    vals: Dict[str, list] = {}
    for s in summaries:
        for k, v in (s.get("final") or {}).items():
            if k != "round" and _num(v):
                vals.setdefault(k, []).append(v)
    return {k: stats(v) for k, v in vals.items()}


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return f"{v:.3e}"
    return f"{v:.4g}"


def stats_cell(s: Optional[dict]) -> Optional[str]:
    """``"mean ± std"`` (just the mean for one seed); None for a missing metric."""
    if not s:
        return None
    return _fmt(s["mean"]) if s.get("n", 2) == 1 else f"{_fmt(s['mean'])} ± {_fmt(s['std'])}"


def seed_table(groups: Sequence[dict], metric_step: Optional[float] = None, first: str = "algorithm") -> str:
    """Markdown table of final metrics as mean ± std, one row per group ``{"label", "summaries"}``."""
    from .compare import format_table

    finals = [final_stats(g["summaries"]) for g in groups]
    keys = [k for k in TABLE_METRICS if any(k in f for f in finals)]
    if "test_acc" in keys and "train_acc" in keys:
        keys.remove("train_acc")
    s = f" (s={metric_step:g})" if metric_step else ""
    names = {"grad_map_sq": f"‖G_s‖²{s}", "test_acc": "test acc", "train_acc": "train acc",
             "support_f1": "support F1"}
    header = [first, "seeds", *(names.get(k, k) for k in keys), "status"]
    rows = []
    for g, f in zip(groups, finals):
        statuses = [x.get("status", "missing") for x in g["summaries"]]
        done = sum(st == "completed" for st in statuses)
        status = "completed" if done == len(statuses) else ", ".join(
            f"{statuses.count(st)} {st}" for st in dict.fromkeys(statuses))
        rows.append([g["label"], len(g["summaries"]), *(stats_cell(f.get(k)) for k in keys), status])
    return format_table(header, rows)


def write_aggregate(out_dir: str, groups: Sequence[dict], metric_step: Optional[float] = None) -> str:
    """Write aggregate.jsonl / .json / .md for ``groups`` (``{"label", "summaries", "rows"}``, ``rows``
    being each seed's metrics rows); returns the table. Every file is replaced atomically."""
    lines, record = [], {}
    for g in groups:
        lines += [{"label": g["label"], **r} for r in aggregate_rows(g["rows"])]
        record[g["label"]] = {"seeds": g.get("seeds"), "statuses": [s.get("status") for s in g["summaries"]],
                              "folders": [s.get("out_dir") for s in g["summaries"]],
                              "final": final_stats(g["summaries"])}
    table = seed_table(groups, metric_step)
    _write_jsonl(os.path.join(out_dir, "aggregate.jsonl"), lines)
    _write_json(os.path.join(out_dir, "aggregate.json"), {"std": "sample (n - 1)", "groups": record})
    _atomic_text(os.path.join(out_dir, "aggregate.md"), table + "\n")
    return table


def seed_of(path: str) -> Optional[int]:
    """The seed of a run folder inside a ``seed-<k>`` folder (at any depth), else None."""
    for part in os.path.normpath(path).split(os.sep):
        m = _SEED_RE.match(part)
        if m:
            return int(m.group(1))
    return None


def group_key(path: str) -> str:
    """``path`` without its ``seed-<k>`` component: the runs of one experiment's seeds share it
    (``OUT/seed-3`` -> ``OUT``; ``OUT/seed-3/fedcanon`` -> ``OUT/fedcanon``)."""
    parts = os.path.normpath(path).split(os.sep)
    kept = [p for p in parts if not _SEED_RE.match(p)]
    return os.sep.join(kept) if len(kept) < len(parts) else os.path.normpath(path)
