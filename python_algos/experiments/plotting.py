"""Figures of runs: loss / accuracy / stationarity / sparsity vs rounds and vs wall time.

    python -m python_algos plot results/<comparison> [results/<run> ...] [--out DIR]
    from python_algos.experiments.plotting import plot_runs; plot_runs(["results/demo"], out_dir="figs")

Several runs are overlaid, one line style and marker per run, styled like the papers' figures:
log-scale y for the objective and the stationarity measures, markers every few points, a light
grid and one legend. For each metric and x axis one PNG (``<metric>_vs_<round|time>.png``) plus
an overview grid (``overview.png``). Needs matplotlib (``pip install fedkernels[plot]``).
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence

__all__ = ["plot_runs", "find_runs", "load_run", "available_metrics", "DEFAULT_METRICS", "line_plot"]

DEFAULT_METRICS = ("f+h", "accuracy", "stationarity", "sparsity")
_TITLES = {
    "f+h": "objective f + h",
    "f": "loss f",
    "accuracy": "accuracy",
    "test_acc": "test accuracy",
    "train_acc": "train accuracy",
    "grad_map_sq": r"$\|G_s(x)\|^2$",
    "normal_map_sq": r"$\|F^{\lambda}_{nor}(z)\|^2$",
    "stationarity": r"stationarity $\|G_s(x)\|^2$",
    "sparsity": "sparsity (fraction of zeros)",
    "hoyer": "Hoyer sparsity",
    "dist_to_truth": r"$\|w - x_{true}\|^2$",
    "dist_to_opt": r"$\|x - x^*\|^2 / \|x^0 - x^*\|^2$",
    "support_f1": "support F1",
    "test_loss": "test loss",
    "train_loss": "train loss",
}
_LOG = {"f+h", "f", "grad_map_sq", "normal_map_sq", "stationarity", "dist_to_truth", "dist_to_opt", "test_loss",
        "train_loss"}
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
_STYLES = ["-", "--", "-.", ":"]


def _mpl():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: pip install matplotlib (or fedkernels[plot])") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def find_runs(paths: Sequence[str]) -> list:
    """Run folders (holding metrics.jsonl) among ``paths``; a comparison folder expands to its runs."""
    runs = []
    for p in paths:
        if os.path.isfile(os.path.join(p, "metrics.jsonl")):
            runs.append(p)
            continue
        if not os.path.isdir(p):
            raise FileNotFoundError(f"{p}: no such folder")
        subs = sorted(d for d in os.listdir(p) if os.path.isfile(os.path.join(p, d, "metrics.jsonl")))
        order = _comparison_order(p)
        subs.sort(key=lambda d: order.get(d, len(order)))
        if not subs:
            raise FileNotFoundError(f"{p}: neither a run folder (metrics.jsonl) nor a folder of runs")
        runs += [os.path.join(p, d) for d in subs]
    return runs


def _comparison_order(folder: str) -> dict:
    import json

    try:
        with open(os.path.join(folder, "comparison.json")) as f:
            runs = json.load(f)["runs"]
        return {os.path.basename(os.path.normpath(r["out_dir"])): i for i, r in enumerate(runs)}
    except (OSError, KeyError, ValueError, TypeError):
        return {}


def load_run(path: str) -> dict:
    """``{"label", "rows"}`` for one run folder (label: its summary's label, else the folder name)."""
    import json

    from .runner import read_metrics

    label = os.path.basename(os.path.normpath(path))
    try:
        with open(os.path.join(path, "summary.json")) as f:
            label = json.load(f).get("label") or label
    except (OSError, ValueError):
        pass
    return {"label": label, "rows": read_metrics(path), "path": path}


def _series(rows: list, key: str, x: str):
    """x and y values of ``key`` where present and finite (``accuracy`` / ``stationarity`` pick
    the first available of test/train accuracy, grad-map/normal-map)."""
    if key == "accuracy":
        key = next((k for k in ("test_acc", "train_acc") if any(k in r for r in rows)), "test_acc")
    elif key == "stationarity":
        key = "grad_map_sq"
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        xv = r.get(x, 0.0 if r.get("round") == 0 else None)
        if v is None or xv is None or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        xs.append(xv)
        ys.append(v)
    return xs, ys, key


def line_plot(ax, runs: list, metric: str, x: str = "round") -> bool:
    """Draw ``metric`` vs ``x`` for every run on ``ax``; returns whether anything was drawn."""
    drawn, positive = False, True
    for i, run in enumerate(runs):
        xs, ys, key = _series(run["rows"], metric, x)
        if not xs:
            continue
        every = max(1, len(xs) // 8)
        ax.plot(xs, ys, _STYLES[(i // len(_MARKERS)) % len(_STYLES)], marker=_MARKERS[i % len(_MARKERS)],
                markevery=every, markersize=5, linewidth=1.6, label=run["label"])
        positive = positive and min(ys) > 0
        drawn = True
    if drawn:
        if metric in _LOG and positive:
            ax.set_yscale("log")
        ax.set_xlabel("communication rounds" if x == "round" else "wall-clock time (s)")
        ax.set_ylabel(_TITLES.get(metric, metric))
        ax.grid(True, which="major", linestyle=":", linewidth=0.7, alpha=0.8)
    return drawn


def plot_runs(paths: Sequence[str], out_dir: Optional[str] = None, metrics: Optional[Sequence[str]] = None,
              x_axes: Sequence[str] = ("round", "elapsed"), title: Optional[str] = None,
              name: str = "overview.png", per_metric: bool = True, labels: Optional[Sequence[str]] = None) -> list:
    """Write PNGs for the runs in ``paths`` (run or comparison folders); returns the file paths.

    One PNG per (metric, x axis) unless ``per_metric=False``, then the overview grid ``name``
    (always last in the returned list). ``labels`` replaces the runs' legend labels.
    """
    runs = [load_run(p) for p in find_runs(paths)]
    metrics = list(metrics or DEFAULT_METRICS)
    _check_metrics(metrics, runs)
    bad_x = [x for x in x_axes if x not in ("round", "elapsed")]
    if bad_x:
        raise ValueError(f"--x {' '.join(bad_x)}: unknown x axis; valid: round, elapsed")
    plt = _mpl()
    if labels is not None:
        if len(labels) != len(runs):
            raise ValueError(f"{len(labels)} labels for {len(runs)} runs")
        for r, lab in zip(runs, labels):
            r["label"] = lab
    out_dir = out_dir or (paths[0] if os.path.isdir(paths[0]) else ".")
    os.makedirs(out_dir, exist_ok=True)
    files = []
    rc = {"font.size": 11, "axes.titlesize": 12, "legend.fontsize": 9, "axes.spines.top": False,
          "axes.spines.right": False}
    with plt.rc_context(rc):
        for m in metrics if per_metric else ():
            for x in x_axes:
                fig, ax = plt.subplots(figsize=(5.2, 3.9))
                if line_plot(ax, runs, m, x):
                    ax.legend(frameon=False)
                    if title:
                        ax.set_title(title)
                    fig.tight_layout()
                    f = os.path.join(out_dir, f"{_safe(m)}_vs_{'round' if x == 'round' else 'time'}.png")
                    fig.savefig(f, dpi=130)
                    files.append(f)
                plt.close(fig)
        fig, axes = plt.subplots(len(x_axes), len(metrics), figsize=(4.2 * len(metrics), 3.4 * len(x_axes)),
                                 squeeze=False)
        any_drawn = False
        for r, x in enumerate(x_axes):
            for c, m in enumerate(metrics):
                if not line_plot(axes[r][c], runs, m, x):
                    axes[r][c].set_visible(False)
                else:
                    any_drawn = True
        if any_drawn:
            handles, names = next(((a.get_legend_handles_labels()) for row in axes for a in row if a.get_visible()),
                                  ([], []))
            top = 1.0 - 0.3 / fig.get_figheight()  # room for the legend (and title) in inches
            if title:
                fig.suptitle(title, y=0.995)
                top -= 0.3 / fig.get_figheight()
            fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, top + 0.3 / fig.get_figheight()),
                       ncol=min(len(names), 6), frameon=False)
            fig.tight_layout(rect=(0, 0, 1, top))
            f = os.path.join(out_dir, name)
            fig.savefig(f, dpi=110)
            files.append(f)
        plt.close(fig)
    return files


_ALIASES = ("accuracy", "stationarity")


def available_metrics(runs: list) -> list:
    """Metric names :func:`plot_runs` can draw for ``runs``: the aliases and every numeric key of their rows."""
    keys = {k for r in runs for row in r["rows"] for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "round"}
    return [m for m in (*DEFAULT_METRICS, *sorted(keys)) if m in keys or m in _ALIASES
            and any(_series(r["rows"], m, "round")[0] for r in runs)]


def _check_metrics(metrics: Sequence[str], runs: list) -> None:
    """Refuse metric names that no run has (a typo would otherwise give an empty figure set)."""
    have = available_metrics(runs)
    bad = [m for m in metrics if m not in have]
    if bad:
        raise ValueError(f"--metrics {' '.join(bad)}: not a metric of these runs; available: {', '.join(have)}")


def _safe(metric: str) -> str:
    return metric.replace("+", "_plus_").replace("/", "_")
