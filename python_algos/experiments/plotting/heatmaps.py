"""The figures of a sweep: a heat map of the selection metric over each algorithm's 2-D grid
(skipped points blank, the best point boxed) and the best point of each algorithm with its seeds' band.
"""

from __future__ import annotations

import math

from .figures import plot_runs
from .runs import display_name
from .style import DEFAULT_FORMATS, RC, TITLES, parse_formats, pyplot, save_figure

__all__ = ["plot_sweep", "heatmap_data"]


def heatmap_data(points: list, algorithm: str, metric: str):
    """(row key, row values, column key, column values, matrix of mean ``metric``) of ``algorithm``'s
    points in a 2-D grid; NaN where a point was skipped or did not complete. None unless 2-D."""
    pts = [p for p in points if p["algorithm"] == algorithm]
    keys = list(pts[0]["point"]) if pts else []
    return _grid(pts, keys, metric) if len(keys) == 2 else None


def _grid(pts, keys, metric):
    rk, ck = keys
    rows = list(dict.fromkeys(p["point"][rk] for p in pts))
    cols = list(dict.fromkeys(p["point"][ck] for p in pts))
    m = [[math.nan] * len(cols) for _ in rows]
    for p in pts:
        st = p["final"].get(metric)
        if st is not None and all(s == "completed" for s in p["statuses"]):
            m[rows.index(p["point"][rk])][cols.index(p["point"][ck])] = st["mean"]
    return rk, rows, ck, cols, m


def plot_sweep(out_dir: str, result: dict, grid: dict, select_metric: str, select_name: str, formats=DEFAULT_FORMATS,
               band: str = "std") -> list:
    """The figures of a sweep: a heat map of ``select_metric`` per algorithm whose grid is 2-D
    (skipped points blank, the best point boxed), and the best point of each algorithm drawn with
    its seeds' band (``best.<ext>``). Returns the file paths."""
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
        m = [[next((p["final"][select_metric]["mean"] for p in pts if p["point"].get(rk) == r and
                    p["point"].get(ck) == c and select_metric in p["final"]
                    and all(s == "completed" for s in p["statuses"])), math.nan) for c in cols] for r in rows]
        with plt.rc_context(RC):
            fig, ax = plt.subplots(figsize=(1.2 * len(cols) + 2.5, 0.8 * len(rows) + 1.8))
            finite = [v for row in m for v in row if math.isfinite(v)]
            im = ax.imshow(m, cmap="viridis_r" if select_name != "test_acc" else "viridis", aspect="auto")
            fig.colorbar(im, ax=ax, label=TITLES.get(select_metric, select_metric) + " (mean)")
            ax.set_xticks(range(len(cols)), [f"{c:g}" if isinstance(c, float) else str(c) for c in cols])
            ax.set_yticks(range(len(rows)), [f"{r:g}" if isinstance(r, float) else str(r) for r in rows])
            ax.set_xlabel(ck)
            ax.set_ylabel(rk)
            b = result["best"].get(a)
            for i, r in enumerate(rows):
                for j, c in enumerate(cols):
                    v = m[i][j]
                    ax.text(j, i, f"{v:.3g}" if math.isfinite(v) else "skipped", ha="center", va="center",
                            fontsize=8, color="white" if math.isfinite(v) else "gray")
                    if b and b["point"].get(rk) == r and b["point"].get(ck) == c:
                        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red",
                                                   linewidth=2))
            ax.set_title(f"{display_name(a)}: {select_name} over {rk} × {ck}"
                         + ("" if finite else " (no completed point)"), fontsize=10)
            fig.tight_layout()
            files += save_figure(fig, out_dir, f"heatmap-{a}", formats, 130)
            plt.close(fig)
    best = result["best"]
    if best:
        labels = [f"{display_name(a)} ({b['name']})" for a, b in best.items()]
        files += plot_runs([b["dir"] for b in best.values()], out_dir=out_dir, name="best", per_metric=False,
                           labels=labels, formats=formats, band=band, x_axes=("round",))
    return files
