"""Statistics over independent seeds of one experiment: per round and of the final metrics.

    rows = aggregate_rows([read_metrics(d) for d in seed_dirs])   # one row per round
    rows[5]["f+h"]  ->  {"mean": ..., "std": ..., "min": ..., "max": ...}
    stats_cell(final_stats(summaries)["f+h"])                     # "0.3312 ± 0.0021"

Every numeric metric of the rows is aggregated round by round over the seeds that logged it at
that round (``n`` counts them; a seed that logged the metric at other rounds does not enter the
rounds it lacks). ``std`` is the sample standard deviation (n − 1 in the denominator; 0 for one
seed), the usual error bar of a mean over independent seeds.

The files and the table cover the seeds that **completed** (:func:`counted`), in every round and
every column alike. A seed that diverged is left out whole: its last row holds metrics of a NaN/Inf
model (accuracy and sparsity still finite, f+h not), and taking only the finite ones would average
each column over other seeds. The table says how many seeds each number covers ("2 of 3") and
names the seeds left out and why.

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

from ..runfolder.files import write_json, write_jsonl, write_text_atomically
from .tables import column_name, format_number, format_table, status_cell, warning_notes

__all__ = ["stats", "aggregate_rows", "final_stats", "stats_cell", "seed_table", "write_aggregate", "seed_of",
           "group_key", "counted", "left_out", "TABLE_METRICS", "SEED_DIR"]

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
    try:
        mean = math.fsum(vals) / n
    except OverflowError:  # values near the largest float: their sum overflows, their mean does not
        mean = math.fsum(v / n for v in vals)
    dev = [v - mean for v in vals]
    # the squares scaled by the largest deviation: a finite 1e200 must not overflow the sum of squares
    scale = max(abs(d) for d in dev) or 1.0
    std = scale * math.sqrt(math.fsum((d / scale) ** 2 for d in dev) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(vals), "max": max(vals), "n": n}


COUNTED = "completed"  # the status of a seed whose numbers enter the statistics


def counted(summaries: Sequence[dict]) -> List[int]:
    """The positions of the seeds whose metrics enter the statistics: those that completed."""
    return [i for i, s in enumerate(summaries) if (s or {}).get("status") == COUNTED]


def left_out(group: dict) -> List[str]:
    """``"seed 3 diverged at round 12: f+h = nan"``: each seed of ``group`` left out, and why."""
    seeds = group.get("seeds") or list(range(len(group["summaries"])))
    keep = set(counted(group["summaries"]))
    out = []
    for i, (seed, s) in enumerate(zip(seeds, group["summaries"])):
        if i not in keep:
            s = s or {}
            why = s.get("status", "missing")
            if why == "diverged" and s.get("rounds_done") is not None:
                why += f" at round {s['rounds_done']}"
            out.append(f"seed {seed} {why}")
    return out


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


def stats_cell(s: Optional[dict]) -> Optional[str]:
    """``"mean ± std"`` (just the mean for one seed); None for a missing metric."""
    if not s:
        return None
    return format_number(s["mean"]) if s.get("n", 2) == 1 else f"{format_number(s['mean'])} ± {format_number(s['std'])}"


def _status(summaries: Sequence[dict]) -> str:
    statuses = [(x or {}).get("status", "missing") for x in summaries]
    if all(st == "completed" for st in statuses):
        return "completed"
    return ", ".join(f"{statuses.count(st)} {st}" for st in dict.fromkeys(statuses))


def seed_table(groups: Sequence[dict], metric_step: Optional[float] = None, first: str = "algorithm") -> str:
    """Markdown table of final metrics as mean ± std over the completed seeds, one row per group
    ``{"label", "summaries", "seeds"}``; the column "seeds" says how many seeds each number covers,
    and a note below the table names the seeds left out (:func:`left_out`)."""
    finals = [final_stats([g["summaries"][i] for i in counted(g["summaries"])]) for g in groups]
    keys = [k for k in TABLE_METRICS if any(k in f for f in finals)]
    if "test_acc" in keys and "train_acc" in keys:
        keys.remove("train_acc")
    header = [first, "seeds", *(column_name(k, metric_step) for k in keys), "status"]
    rows, notes = [], []
    for g, f in zip(groups, finals):
        n, total = len(counted(g["summaries"])), len(g["summaries"])
        rows.append([g["label"], f"{n} of {total}", *(stats_cell(f.get(k)) for k in keys),
                     status_cell(_status(g["summaries"]), g["summaries"])])
        out = left_out(g)
        if out:
            notes.append(f"{g['label']}: {'; '.join(out)}: left out of every column")
        seeds = g.get("seeds") or range(len(g["summaries"]))
        notes += warning_notes([(f"{g['label']} seed {k}", s) for k, s in zip(seeds, g["summaries"])])
    return "\n".join([format_table(header, rows), *notes])


def write_aggregate(out_dir: str, groups: Sequence[dict], metric_step: Optional[float] = None) -> str:
    """Write aggregate.jsonl / .json / .md for ``groups`` (``{"label", "seeds", "summaries", "rows"}``,
    ``rows`` being each seed's metrics rows); returns the table. The statistics cover the completed
    seeds (module docstring); every file is replaced atomically."""
    lines, record = [], {}
    for g in groups:
        keep = counted(g["summaries"])
        lines += [{"label": g["label"], **r} for r in aggregate_rows([g["rows"][i] for i in keep])]
        record[g["label"]] = {"seeds": g.get("seeds"), "statuses": [s.get("status") for s in g["summaries"]],
                              "folders": [s.get("out_dir") for s in g["summaries"]],
                              "counted": len(keep), "left_out": left_out(g),
                              "final": final_stats([g["summaries"][i] for i in keep])}
    table = seed_table(groups, metric_step)
    write_jsonl(os.path.join(out_dir, "aggregate.jsonl"), lines)
    write_json(os.path.join(out_dir, "aggregate.json"), {"std": "sample (n - 1)", "counted": COUNTED,
                                                          "groups": record})
    write_text_atomically(os.path.join(out_dir, "aggregate.md"), table + "\n")
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
