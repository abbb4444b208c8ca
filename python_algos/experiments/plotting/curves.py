"""The points a figure draws for a run: the values of a metric against rounds or wall time (the
aliases ``accuracy``, ``stationarity`` and ``suboptimality`` = f + h − F* resolved per run), a seed
group's band around its mean, and which metrics a set of runs can draw at all.
"""

from __future__ import annotations

import math
from typing import Sequence

from .style import LOG_METRICS

__all__ = ["DEFAULT_METRICS", "series", "band_series", "available_metrics", "check_metrics"]

DEFAULT_METRICS = ("f+h", "accuracy", "stationarity", "sparsity")
_ALIASES = ("accuracy", "stationarity", "suboptimality")


def _resolve(rows: list, key: str) -> str:
    if key == "accuracy":
        return next((k for k in ("test_acc", "train_acc") if any(k in r for r in rows)), "test_acc")
    if key == "stationarity":
        return "grad_map_sq"
    return key


def series(run: dict, key: str, x: str):
    """x and y values of ``key`` where present and finite (``accuracy`` / ``stationarity`` pick
    the first available of test/train accuracy, grad-map; ``suboptimality`` is f+h − F*, kept
    where positive, so it can sit on a log axis)."""
    rows = run["rows"] if isinstance(run, dict) else run
    f_star = run.get("f_star") if isinstance(run, dict) else None
    key = _resolve(rows, key)
    if key == "suboptimality" and f_star is None:
        return [], [], key
    xs, ys = [], []
    for r in rows:
        v = r.get("f+h" if key == "suboptimality" else key)
        xv = r.get(x, 0.0 if r.get("round") == 0 else None)
        if v is None or xv is None or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        if key == "suboptimality":
            v -= f_star
            if v <= 0:
                continue
        xs.append(xv)
        ys.append(v)
    return xs, ys, key


def band_series(run: dict, key: str, x: str):
    """x, lower and upper edge of a seed group's band of ``key`` (resolved) at the points :func:`series`
    keeps; on a log axis a lower edge <= 0 (mean − std) is replaced by the smallest seed's value."""
    src = "f+h" if key == "suboptimality" else key
    shift = run.get("f_star") if key == "suboptimality" else 0.0
    lo_at, hi_at, floor_at = ({r["round"]: r.get(src) for r in rows} for rows in run["band_rows"])
    xs, lo, hi = [], [], []
    for r in run["rows"]:
        v, t = r.get(src), r["round"]
        xv = r.get(x, 0.0 if t == 0 else None)
        if v is None or xv is None or lo_at.get(t) is None or hi_at.get(t) is None or not math.isfinite(v):
            continue
        if key == "suboptimality" and v - shift <= 0:
            continue
        a, b = lo_at[t] - shift, hi_at[t] - shift
        if a <= 0 and (key in LOG_METRICS):
            a = floor_at[t] - shift if floor_at.get(t) is not None and floor_at[t] - shift > 0 else v - shift
        if key in ("sparsity", "hoyer") or key.endswith("_acc"):  # fractions: mean ± std may leave [0, 1]
            a, b = max(a, 0.0), min(b, 1.0)
        xs.append(xv)
        lo.append(a)
        hi.append(b)
    return xs, lo, hi


def available_metrics(runs: list) -> list:
    """Metric names :func:`plot_runs` can draw for ``runs``: the aliases and every numeric key of their rows
    (``suboptimality`` where F* is known)."""
    keys = {k for r in runs for row in r["rows"] for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "round"}
    names = dict.fromkeys((*DEFAULT_METRICS, "suboptimality", *sorted(keys)))
    return [m for m in names if m in keys or m in _ALIASES and any(series(r, m, "round")[0] for r in runs)]


def check_metrics(metrics: Sequence[str], runs: list) -> None:
    """Refuse metric names that no run has (a typo would otherwise give an empty figure set)."""
    have = available_metrics(runs)
    bad = [m for m in metrics if m not in have]
    if bad:
        hint = ("; suboptimality needs F*: give --f-star VALUE" if "suboptimality" in bad
                and "suboptimality" not in have else "")
        raise ValueError(f"--metrics {' '.join(bad)}: not a metric of these runs; available: {', '.join(have)}{hint}")
