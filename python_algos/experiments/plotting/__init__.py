"""Figures of runs for papers: loss / accuracy / stationarity / sparsity vs rounds and vs wall time.

    python -m python_algos plot results/<comparison> [results/<run> ...] [--out DIR] [--formats png,pdf,svg]
    from python_algos.experiments.plotting import plot_runs; plot_runs(["results/demo"], out_dir="figs")

Several runs are overlaid and stay distinguishable in print: each run has its own colour, line style
and marker, markers sit at sparse, staggered intervals so they do not pile up where curves overlap,
and one legend names the runs. Each figure carries a setup line (algorithm(s), dataset, partition,
N, model, h, K, lr and the hyper-parameters set explicitly (``--alg-opt``, a sweep's point, History's
own): what the runs share, and the values where they differ) under the optional title; lr is shown
only while it still sets one of a run's hyper-parameters.
Axis labels say whether a quantity is measured on the training data (the objective f + h, the
stationarity ‖G_s‖²) or the test data (test accuracy / loss). Objective and stationarity axes are
logarithmic with labelled decades. When the optimal value F* is known (``--f-star``, or ``f_star``
in a run's summary.json, e.g. from ``History.save(..., f_star=)``) the suboptimality f + h − F* is
drawn instead of f + h.

The pieces: :mod:`.runs` (finding and loading run folders, seed groups), :mod:`.heading` (the
setup line), :mod:`.curves` (a metric's points and bands), :mod:`.axes` (one metric on one axes),
:mod:`.figures` (the figure files), :mod:`.heatmaps` (a sweep's figures), :mod:`.style` (formats, titles,
look).

For each metric and x axis one figure (``<metric>_vs_<round|time>.<ext>``) plus an overview grid
(``overview.<ext>``), in every format asked for (png, pdf, svg; default png and pdf). PDF and SVG
keep text as text (TrueType in PDF, ``<text>`` in SVG), so a paper can restyle or search it. Needs
matplotlib (``pip install fedkernels[plot]``).
"""

from __future__ import annotations

from .axes import line_plot
from .curves import DEFAULT_METRICS, available_metrics
from .figures import NothingToPlot, merge_identical, plot_runs  # noqa: F401 - merge_identical: kept importable from here
from .heading import setup_line
from .heatmaps import plot_sweep  # noqa: F401 - the sweep command's figures
from .runs import find_runs, group_seeds, load_run  # noqa: F401 - group_seeds: kept importable from here
from .style import DEFAULT_FORMATS, FORMATS, parse_formats, pyplot

__all__ = ["plot_runs", "find_runs", "load_run", "available_metrics", "DEFAULT_METRICS", "line_plot", "setup_line",
           "parse_formats", "FORMATS", "DEFAULT_FORMATS", "pyplot"]
