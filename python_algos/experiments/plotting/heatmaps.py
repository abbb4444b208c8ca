"""The figures of a sweep: a heat map of the selection metric over each algorithm's 2-D grid
(skipped points blank, the best point boxed) and the best point of each algorithm with its seeds' band.
"""

from __future__ import annotations

import math

from ..sweep import value_text
from .figures import plot_runs
from .runs import display_name
from .style import DEFAULT_FORMATS, RC, TITLES, parse_formats, pyplot, save_figure

__all__ = ["plot_sweep", "text_colour"]

MAXIMIZED = {"test_acc", "train_acc", "accuracy", "support_f1"}  # higher is better: the bright end of the map


def text_colour(rgba) -> str:
    """Black or white, whichever reads better on a cell of colour ``rgba`` (0..1 floats): black when
    the colour's relative luminance (WCAG 2: sRGB linearised, 0.2126 R + 0.7152 G + 0.0722 B) is above
    0.179, where black and white have the same contrast ratio with it."""
    def linear(c):
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(float(c)) for c in rgba[:3])
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.179 else "white"


def _matrix(pts, rk, rows, ck, cols, metric):
    """The mean ``metric`` of each (row, column) point that completed; NaN elsewhere."""
    def cell(r, c):
        return next((p["final"][metric]["mean"] for p in pts if p["point"].get(rk) == r and p["point"].get(ck) == c
                     and metric in p["final"] and all(s == "completed" for s in p["statuses"])), math.nan)

    return [[cell(r, c) for c in cols] for r in rows]


def _draw_heatmap(plt, m, rows, cols, rk, ck, metric: str, title: str, best_cell):
    """The figure of one heat map: each cell's value written in the colour that reads on it, the best
    cell boxed."""
    fig, ax = plt.subplots(figsize=(1.2 * len(cols) + 2.5, 0.8 * len(rows) + 1.8))
    im = ax.imshow(m, cmap="viridis" if metric in MAXIMIZED else "viridis_r", aspect="auto")
    fig.colorbar(im, ax=ax, label=TITLES.get(metric, metric) + " (mean)")
    ax.set_xticks(range(len(cols)), [value_text(c) for c in cols])
    ax.set_yticks(range(len(rows)), [value_text(r) for r in rows])
    ax.set_xlabel(ck)
    ax.set_ylabel(rk)
    for i in range(len(rows)):
        for j in range(len(cols)):
            v = m[i][j]
            colour = text_colour(im.cmap(im.norm(v))) if math.isfinite(v) else "gray"
            text = f"{v:.3g}" if math.isfinite(v) else "skipped"
            best = (i, j) == best_cell  # named in words and bold: a colour or a box alone is lost on some cells
            ax.text(j, i, f"{text}\nbest" if best else text, ha="center", va="center", fontsize=8, color=colour,
                    fontweight="bold" if best else "normal")
    if best_cell is not None:  # a white box inside a black one: visible on the darkest and the brightest cell
        i, j = best_cell
        for colour, width, inset in (("black", 3.0, 0.0), ("white", 1.5, 0.04)):
            ax.add_patch(plt.Rectangle((j - 0.5 + inset, i - 0.5 + inset), 1 - 2 * inset, 1 - 2 * inset,
                                       fill=False, edgecolor=colour, linewidth=width))
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_sweep(out_dir: str, result: dict, grid: dict, select_metric: str, select_name: str, formats=DEFAULT_FORMATS,
               band: str = "std") -> list:
    """The figures of a sweep: a heat map of ``select_metric`` per algorithm whose grid is 2-D
    (skipped points blank, the best point boxed), titled with the metric's words (``training
    objective f + h``, :data:`~.style.TITLES`), and the best point of each algorithm drawn with its
    seeds' band (``best.<ext>``). ``select_name`` (the ``--select`` value) is not shown: the metric's
    title says what it is. Returns the file paths."""
    plt = pyplot()
    formats = parse_formats(formats)
    files = []
    points = result["points"]
    for a in dict.fromkeys(p["algorithm"] for p in points):
        skipped = [s for s in result["skipped"] if s["algorithm"] == a]
        keys = [k for k in grid if any(k in p["point"] for p in points if p["algorithm"] == a)]
        if len(keys) != 2:
            continue
        pts = [p for p in points if p["algorithm"] == a] + [
            {"point": s["point"], "final": {}, "statuses": ["skipped"]} for s in skipped]
        rk, ck = keys
        rows, cols = grid[rk], grid[ck]  # the grid's own order
        m = _matrix(pts, rk, rows, ck, cols, select_metric)
        b = result["best"].get(a)
        best_cell = next(((i, j) for i, r in enumerate(rows) for j, c in enumerate(cols)
                          if b and b["point"].get(rk) == r and b["point"].get(ck) == c), None)
        empty = not any(math.isfinite(v) for row in m for v in row)
        title = (f"{display_name(a)}: {TITLES.get(select_metric, select_metric)} over {rk} × {ck}"
                 + (" (no completed point)" if empty else ""))
        with plt.rc_context(RC):
            fig = _draw_heatmap(plt, m, rows, cols, rk, ck, select_metric, title, best_cell)
            files += save_figure(fig, out_dir, f"heatmap-{a}", formats, 130)
            plt.close(fig)
    best = result["best"]
    if best:
        labels = [f"{display_name(a)} ({b['name']})" for a, b in best.items()]
        files += plot_runs([b["dir"] for b in best.values()], out_dir=out_dir, name="best", per_metric=False,
                           labels=labels, formats=formats, band=band, x_axes=("round",))
    return files
