"""One metric drawn on one matplotlib axes: every run's curve in its own colour, line style and
sparse, staggered markers, a seed group's shaded band, a log axis with readable labels where the metric
is logarithmic, labelled ticks that enclose the data, and axis labels that say training or test.
"""

from __future__ import annotations

import math

from .curves import band_series, series
from .heading import run_qualifiers
from .style import LINE_STYLES, LOG_METRICS, MARKERS, TITLES, UNIT_METRICS

__all__ = ["line_plot"]

# what a metric's value depends on beyond the run's label: a figure that overlays runs differing in it
# names it in each legend entry (an f+h of SCAD beside one of L1, ‖G_s‖² at s = 0.25 beside s = 1)
_DEPENDS_ON = {"f+h": "h", "suboptimality": "h", "test_f+h": "h", "grad_map_sq": "s", "stationarity": "s",
               "normal_map_sq": "s"}


def _qualified_labels(drawn: list, metric: str) -> dict:
    """Run index -> its legend label, with " (h=...)" or " (s=...)" where the drawn runs differ in it."""
    what = _DEPENDS_ON.get(metric) or next((_DEPENDS_ON[d[4]] for d in drawn if d[4] in _DEPENDS_ON), None)
    labels = {i: run["label"] for i, run, *_ in drawn}
    if what is None:
        return labels
    values = {i: run_qualifiers(run)[what] for i, run, *_ in drawn}
    if len(set(values.values())) > 1:
        labels = {i: lab if values[i] is None else f"{lab} ({what}={values[i]})" for i, lab in labels.items()}
    return labels


def _readable_log_y(ax, lo: float, hi: float) -> None:
    """Log y axis whose labels can be read. Over a decade or more: labelled decades (10^k) and
    unlabelled minor ticks. Over less (where matplotlib would label one tick or none): ticks at
    1, 2, 3 and 5 × 10^k labelled as plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogFormatterSciNotation, LogLocator, NullFormatter

    ax.set_yscale("log")
    if hi / lo >= 10:
        ax.yaxis.set_major_locator(LogLocator(base=10, numticks=7))
        ax.yaxis.set_major_formatter(LogFormatterSciNotation(base=10))
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10)), numticks=12))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0), numticks=12))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(4.0, 6.0, 7.0, 8.0, 9.0), numticks=12))
        ax.yaxis.set_minor_formatter(NullFormatter())


def _ticks_cover(ax, lo: float, hi: float, key: str) -> None:
    """Make the labelled y ticks enclose the data: the axis ends at the labelled tick at or below the
    lowest value and at or above the highest (a paper's reader reads the last value off a label,
    not off an unlabelled stretch of axis). Fractions stay within [0, 1]; a constant fraction (an
    all-dense model's sparsity 0) gets the axis [0, 1], not matplotlib's ±0.04 around it."""
    if key in UNIT_METRICS and lo >= 0 and hi <= 1:
        if hi - lo < 1e-12:
            ax.set_ylim(0.0, 1.0)
            return
    log = ax.get_yscale() == "log"
    unit = key in UNIT_METRICS and lo >= 0 and hi <= 1
    tol = lambda v: 1e-9 * max(abs(v), 1e-300)  # noqa: E731 - a tick equal to the data, up to rounding
    view = (lo, hi) if hi > lo else (lo - 0.5 * max(abs(lo), 1.0), hi + 0.5 * max(abs(hi), 1.0))
    loc = ax.yaxis.get_major_locator()

    def ticks(a, b):
        return [float(t) for t in loc.tick_values(a, b) if t > 0 or not log]

    def wide(a, b):  # the ticks just beyond a view (a view's own ticks may stop inside it)
        return ticks(a / 10, b * 10) if log else ticks(a - (b - a), b + (b - a))

    def is_tick(v, ts):
        return any(abs(t - v) <= tol(v) for t in ts)

    # The ticks depend on the view (a narrow log axis falls back to linear ticks), so move the ends
    # to ticks, then check with the ticks matplotlib draws for the new view, until both ends are ticks.
    for _ in range(12):
        own = ticks(*view)
        if is_tick(view[0], own) and is_tick(view[1], own) and view[0] <= lo + tol(lo) and view[1] >= hi - tol(hi):
            break
        cand = sorted(set(own) | set(wide(*view)))
        below = [t for t in cand if t <= lo + tol(lo)]
        above = [t for t in cand if t >= hi - tol(hi)]
        new = (max(below) if below else view[0], min(above) if above else view[1])
        if unit:
            new = (max(new[0], 0.0), min(new[1], 1.0))
        if new == view:
            break
        view = new
    if view[1] > view[0]:
        ax.set_ylim(*view)


def line_plot(ax, runs: list, metric: str, x: str = "round") -> bool:
    """Draw ``metric`` vs ``x`` for every run on ``ax`` (a seed group: its mean, with a shaded band);
    returns whether anything was drawn."""
    drawn = []
    for i, run in enumerate(runs):
        xs, ys, key = series(run, metric, x)
        if xs:
            drawn.append((i, run, xs, ys, key))
    if not drawn:
        return False
    keys = {d[4] for d in drawn}
    n = len(runs)
    labels = _qualified_labels(drawn, metric)
    for i, _run, xs, ys, key in drawn:
        every = max(1, len(xs) // 8)
        label = labels[i]
        if len(keys) > 1 and key.split("_")[0] in ("test", "train"):  # runs differ in what they measured
            label += " (test)" if key.startswith("test") else " (training)"
        ax.plot(xs, ys, linestyle=LINE_STYLES[i % len(LINE_STYLES)], marker=MARKERS[i % len(MARKERS)],
                color=f"C{i % 10}", markevery=((i * every) // n, every), markersize=5, linewidth=1.5, label=label)
    ys_all = [y for d in drawn for y in d[3]]
    for i, run, _xs, _ys, key in drawn:
        if run.get("band_rows"):
            bx, lo, hi = band_series(run, key, x)
            if bx:
                ax.fill_between(bx, lo, hi, color=f"C{i % 10}", alpha=0.2, linewidth=0)
                ys_all += [v for v in lo + hi if math.isfinite(v)]
    resolved = next(iter(keys)) if len(keys) == 1 else metric
    if metric in LOG_METRICS and min(ys_all) > 0:
        _readable_log_y(ax, min(ys_all), max(ys_all))
    _ticks_cover(ax, min(ys_all), max(ys_all), resolved)
    ax.set_xlabel("communication rounds" if x == "round" else "wall-clock time (s)")
    key = next(iter(keys)) if len(keys) == 1 else metric
    ax.set_ylabel(TITLES.get(key, TITLES.get(metric, metric)))
    ax.grid(True, which="major", linestyle=":", linewidth=0.7, alpha=0.8)
    return True
