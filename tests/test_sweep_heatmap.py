"""The sweep's heat map as a reader sees it: every number legible on its cell (black on light
cells, white on dark ones, by the cell colour's luminance), and a title in words ("training
objective f + h"), not the --select key (`f_plus_h`). The sweep's table uses the metric names that
experiments.tables.METRIC_COLUMNS names the metrics in every table.

Ground truth: the WCAG 2 relative luminance of the colours, computed here by hand from their sRGB
values; viridis' two ends (dark purple, bright yellow)."""

import pytest

pytest.importorskip("matplotlib")

from python_algos.experiments.plotting import heatmaps  # noqa: E402
from python_algos.experiments.plotting.heatmaps import plot_sweep, text_colour  # noqa: E402
from python_algos.experiments.tables import METRIC_COLUMNS, column_name  # noqa: E402


def test_text_is_white_on_a_dark_cell_and_black_on_a_light_one():
    assert text_colour((0.267, 0.005, 0.329, 1.0)) == "white"  # viridis at 0: dark purple
    assert text_colour((0.993, 0.906, 0.144, 1.0)) == "black"  # viridis at 1: yellow
    assert text_colour((0.0, 0.0, 0.0, 1.0)) == "white" and text_colour((1.0, 1.0, 1.0, 1.0)) == "black"
    # mid grey #777 (luminance 0.184, just above the 0.179 where both contrast alike) and #757575 (0.178)
    assert text_colour((0x77 / 255,) * 3) == "black" and text_colour((0x75 / 255,) * 3) == "white"


def _luminance(rgba):
    def lin(c):
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(c) for c in rgba[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_the_heat_map_numbers_read_on_every_cell_and_the_title_is_in_words(tmp_path, monkeypatch):
    grid = {"alpha": [0.1, 0.2, 0.3], "beta": [0.01, 0.1]}
    points = [{"algorithm": "fedcanon", "point": {"alpha": a, "beta": b}, "name": f"alpha={a:g},beta={b:g}",
               "statuses": ["completed"], "final": {"f+h": {"mean": 10 * a + b}}, "dir": ""}
              for a in grid["alpha"] for b in grid["beta"]]
    result = {"points": points, "skipped": [], "best": {}}
    figures = []
    monkeypatch.setattr(heatmaps, "save_figure", lambda fig, *a, **k: figures.append(fig) or [])
    monkeypatch.setattr(heatmaps.pyplot(), "close", lambda fig: None)
    plot_sweep(str(tmp_path), result, grid, "f+h", "f_plus_h", formats=("png",))
    (fig,) = figures
    ax = fig.axes[0]
    title = ax.get_title()
    assert "training objective f + h" in title and "f_plus_h" not in title, title
    image = ax.get_images()[0]
    colours = {"black": 0, "white": 0}
    for t in ax.texts:
        j, i = (round(c) for c in t.get_position())
        cell = image.cmap(image.norm(image.get_array()[i, j]))
        want = "black" if _luminance(cell) > 0.179 else "white"
        from matplotlib.colors import same_color

        assert same_color(t.get_color(), want), (t.get_text(), cell, t.get_color())
        colours[want] += 1
    assert colours["black"] and colours["white"]  # the map's range spans light and dark cells


def test_the_table_names_are_one_mapping():
    assert column_name("test_acc") == METRIC_COLUMNS["test_acc"] == "test acc"
    assert column_name("unknown_metric") == "unknown_metric"
