"""The figure files of a set of runs: the arguments checked before anything is written, curves that
coincide merged into one legend entry, one figure per (metric, x axis) and the overview grid, each
with the title and setup line fitted to its width, in every format asked for.
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence

from .axes import line_plot
from .curves import DEFAULT_METRICS, available_metrics, check_metrics, series
from .heading import setup_line
from .runs import find_runs, group_seeds, load_run
from .style import DEFAULT_FORMATS, FORMATS, RC, parse_formats, pyplot, save_figure

__all__ = ["plot_runs", "merge_identical", "NothingToPlot"]


class NothingToPlot(ValueError):
    """The runs recorded none of the default metrics (``--metrics-every 0``): a run's own overview
    figure is then skipped with a note, while ``plot`` refuses it naming what is there."""


def merge_identical(runs: list, metrics: Sequence[str]) -> list:
    """Runs whose curves of every metric in ``metrics`` are exactly equal, round by round, drawn once
    and named together in the legend ("ZA1 = FedNMap"): otherwise the later curve hides the earlier
    and a reader concludes an algorithm is missing. Seed groups (bands) are compared by their
    members' rows."""
    def signature(run):  # per metric, each member's (x, y) points
        return tuple(tuple(tuple(map(tuple, series(member, m, "round")[:2])) for member in run.get("members") or [run])
                     for m in metrics)

    out, seen = [], {}
    for r in runs:
        sig = signature(r)
        if not any(p[0] for part in sig for p in part):  # nothing drawn: nothing to confuse
            out.append(r)
            continue
        if sig in seen:
            first = seen[sig]
            first["label"] = f"{first['label']} = {r['label']}"
            first.setdefault("same_as", []).append(r)
            continue
        r = dict(r)
        seen[sig] = r
        out.append(r)
    return out


def _checked_options(band: str, formats, f_star, x_axes) -> tuple:
    """:func:`plot_runs`' options checked, each error naming its flag; returns the formats parsed."""
    if band not in ("std", "minmax"):
        raise ValueError(f"--band {band!r}: must be std or minmax")
    formats = parse_formats(formats)
    if f_star is not None and (isinstance(f_star, bool) or not isinstance(f_star, (int, float))
                               or not math.isfinite(f_star)):
        raise ValueError(f"--f-star {f_star!r}: must be a finite number (the optimal value F*)")
    bad_x = [x for x in x_axes if x not in ("round", "elapsed")]
    if bad_x:
        raise ValueError(f"--x {' '.join(bad_x)}: unknown x axis; valid: round, elapsed")
    return formats


def plot_runs(paths: Sequence[str], out_dir: Optional[str] = None, metrics: Optional[Sequence[str]] = None,
              x_axes: Sequence[str] = ("round", "elapsed"), title: Optional[str] = None,
              name: str = "overview", per_metric: bool = True, labels: Optional[Sequence[str]] = None,
              formats=DEFAULT_FORMATS, f_star: Optional[float] = None, setup: bool = True,
              band: str = "std") -> list:
    """Write figures of the runs in ``paths`` (run or comparison folders); returns the file paths.

    One figure per (metric, x axis) unless ``per_metric=False``, then the overview grid ``name``
    (its files always last in the returned list), each in every one of ``formats`` (``"png,pdf"``
    or a sequence; see :data:`FORMATS`). ``labels`` replaces the runs' legend labels. ``title`` is
    printed above the setup line (``setup=False`` leaves the setup line out). ``f_star`` (F*) makes
    the ``suboptimality`` metric f + h − F* available for every run (else a run's summary.json
    ``f_star``) and the default in place of f + h. Runs of several seeds (``seed-<k>`` folders) are
    drawn as their per-round mean with a shaded band: mean ± std (``band="std"``) or min to max
    (``"minmax"``). Runs whose curves coincide exactly are drawn once, named together ("A = B").
    Every argument is checked before a file is written.
    """
    formats = _checked_options(band, formats, f_star, x_axes)
    runs = [load_run(p) for p in find_runs(paths)]
    if f_star is not None:
        for r in runs:
            r["f_star"] = float(f_star)
    if metrics is None:  # the defaults these runs have (a regression run has no accuracy)
        known = any(r["f_star"] is not None for r in runs)
        have = available_metrics(runs)
        metrics = [m for m in (("suboptimality" if m == "f+h" and known else m) for m in DEFAULT_METRICS) if m in have]
        if not metrics:
            raise NothingToPlot(f"{', '.join(paths)}: the runs hold no metric to plot (no f+h, accuracy, "
                                f"stationarity or sparsity); give --metrics, available: {', '.join(have) or 'none'}")
    metrics = list(metrics)
    check_metrics(metrics, runs)
    runs = group_seeds(runs, band)
    if labels is not None:
        if len(labels) != len(runs):
            raise ValueError(f"{len(labels)} labels for {len(runs)} runs")
        for r, lab in zip(runs, labels):
            r["label"] = lab
    runs = merge_identical(runs, metrics)
    plt = pyplot()
    stem = os.path.splitext(name)[0] if os.path.splitext(name)[1].lstrip(".").lower() in FORMATS else name
    heading = "\n".join(t for t in (title, setup_line(runs) if setup else None) if t)
    out_dir = out_dir or (paths[0] if os.path.isdir(paths[0]) else ".")
    os.makedirs(out_dir, exist_ok=True)
    files = []

    def save(fig, base: str, dpi: int) -> None:
        files.extend(save_figure(fig, out_dir, base, formats, dpi))

    with plt.rc_context(RC):
        for m in metrics if per_metric else ():
            for x in x_axes:
                fig, ax = plt.subplots(figsize=(5.6, 4.2))
                if line_plot(ax, runs, m, x):
                    ax.legend(frameon=False)
                    if heading:
                        ax.set_title(_wrap(heading, 12 * fig.get_figwidth()), fontsize=9, loc="left")
                    fig.tight_layout()
                    save(fig, f"{_safe(m)}_vs_{'round' if x == 'round' else 'time'}", 130)
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
            inch = 1.0 / fig.get_figheight()  # layout in inches: heading lines, then the legend, then the axes
            head = _wrap(heading, 16 * fig.get_figwidth()) if heading else ""
            legend_top = 1.0 - (0.05 + (0.19 * (head.count("\n") + 1) + 0.05 if head else 0.0)) * inch
            rows = math.ceil(len(names) / 6)
            fig.tight_layout(rect=(0, 0, 1, legend_top - 0.25 * rows * inch))  # before the heading and legend exist
            if head:
                fig.suptitle(head, y=1.0 - 0.05 * inch, va="top", fontsize=10)
            fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, legend_top),
                       ncol=min(len(names), 6), frameon=False)
            save(fig, stem, 110)
        plt.close(fig)
    return files


def _wrap(text: str, width: float) -> str:
    """Break each line of ``text`` at its " · " separators so that no line is much longer than
    ``width`` characters (a setup line must fit the figure, not run off its edge)."""
    out = []
    for line in text.split("\n"):
        cur = ""
        for part in line.split(" · "):
            if cur and len(cur) + 3 + len(part) > width:
                out.append(cur)
                cur = part
            else:
                cur = f"{cur} · {part}" if cur else part
        out.append(cur)
    return "\n".join(out)


def _safe(metric: str) -> str:
    return metric.replace("+", "_plus_").replace("/", "_")
