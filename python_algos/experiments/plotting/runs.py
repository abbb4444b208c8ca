"""The runs a figure draws, read from their folders: run folders (``metrics.jsonl``) found among
the paths given, a comparison folder's runs in its own order, a folder of seeds expanded; each run's
rows, config.json and summary.json; and one experiment's seeds grouped into a mean with a band.
"""

from __future__ import annotations

import os
from typing import Sequence

from ...algorithms.registry import ALGORITHMS
from ...runfolder.records import METRICS, group_runs, read_config, read_metrics, read_summary
from ..aggregate import aggregate_rows, counted, group_key, seed_of

__all__ = ["find_runs", "load_run", "group_seeds", "display_name", "registry_entry"]


def find_runs(paths: Sequence[str]) -> list:
    """Run folders (holding metrics.jsonl) among ``paths``; a comparison folder expands to its runs."""
    runs = []
    for p in paths:
        if os.path.isfile(os.path.join(p, METRICS)):
            runs.append(p)
            continue
        if not os.path.isdir(p):
            raise FileNotFoundError(f"{p}: no such folder")
        subs = sorted(d for d in os.listdir(p) if os.path.isfile(os.path.join(p, d, METRICS)))
        order = {name: i for i, name in enumerate(group_runs(p) or ())}  # a comparison's -a order
        subs.sort(key=lambda d: order.get(d, len(order)))
        seeds = sorted((d for d in os.listdir(p) if seed_of(d) is not None and os.path.isdir(os.path.join(p, d))),
                       key=seed_of)
        if not subs and seeds:  # a folder of seeds: each seed-<k> is a run or a comparison
            for d in seeds:
                try:
                    runs += find_runs([os.path.join(p, d)])
                except FileNotFoundError:  # a seed that has not started yet
                    pass
            if runs:
                continue
        if not subs:
            raise FileNotFoundError(f"{p}: neither a run folder (metrics.jsonl) nor a folder of runs")
        runs += [os.path.join(p, d) for d in subs]
    return runs


def group_seeds(runs: list, band: str = "std") -> list:
    """Runs of one experiment's seeds (folders ``.../seed-<k>/...`` differing only in k) become one
    entry: ``rows`` the per-round mean, ``band_rows`` the lower and upper edge of the band (mean ± std,
    or min and max with ``band="minmax"``), ``seeds`` the seeds. Other runs are kept as they are."""
    if band not in ("std", "minmax"):
        raise ValueError(f"--band {band}: must be std or minmax")
    groups: dict = {}
    for r in runs:
        key = group_key(r["path"]) if seed_of(r["path"]) is not None else ("run", r["path"])
        groups.setdefault(key, []).append(r)
    out = []
    for members in groups.values():
        if len(members) == 1 and seed_of(members[0]["path"]) is None:
            out.append(members[0])
            continue
        # the seeds the tables count (aggregate.counted: the completed ones), unless none has completed yet
        members = [members[i] for i in counted([m["summary"] for m in members])] or members
        agg = aggregate_rows([m["rows"] for m in members])
        lo, hi = ((_rows(agg, lambda v: v["mean"] - v["std"]), _rows(agg, lambda v: v["mean"] + v["std"]))
                  if band == "std" else (_rows(agg, lambda v: v["min"]), _rows(agg, lambda v: v["max"])))
        out.append({**members[0], "rows": _rows(agg, lambda v: v["mean"]),
                    "band_rows": (lo, hi, _rows(agg, lambda v: v["min"])), "band": band,
                    "seeds": [seed_of(m["path"]) for m in members], "members": members})
    return out


def _rows(agg: list, of) -> list:
    """Per round of ``agg`` (:func:`~..aggregate.aggregate_rows`), ``of(statistics)`` of every metric."""
    return [{"round": a["round"], **{k: of(v) for k, v in a.items() if isinstance(v, dict)}} for a in agg]


def _config(path: str) -> dict:
    """The run's config.json, or {} when missing or damaged (a figure needs it for its setup line only)."""
    try:
        return read_config(path)
    except (OSError, ValueError):
        return {}


def registry_entry(name):
    """The registry entry of an algorithm named by its key (``fedcanon``: a Config's, and what `compare`
    labels its runs with) or its own spelling (``FedCanon``, what History.save records); None for another name."""
    if not isinstance(name, str):
        return None
    return ALGORITHMS.get(name.lower()) or next((e for e in ALGORITHMS.values() if e.cls.name == name), None)


def display_name(label: str) -> str:
    """A registry name (``za1``) as the algorithm's own spelling (``ZA1``), the one the setup line and
    the tables use; any other label is kept."""
    entry = registry_entry(label)
    return entry.cls.name if entry is not None else label


def load_run(path: str) -> dict:
    """``{"label", "rows", "path", "config", "summary", "f_star"}`` for one run folder (label: its
    summary's label, else the folder name; f_star: the summary's, else None)."""
    summary = read_summary(path) or {}
    label = summary.get("label") or os.path.basename(os.path.normpath(path))
    label = display_name(label)
    f_star = summary.get("f_star")
    return {"label": label, "rows": read_metrics(path), "path": path, "summary": summary,
            "config": _config(path),
            "f_star": float(f_star) if isinstance(f_star, (int, float)) and not isinstance(f_star, bool) else None}
