"""How the figures look and in which files they are written: matplotlib (imported only when a
figure is drawn, headless), the rc settings (TrueType text in PDF, ``<text>`` in SVG, so a paper can
restyle or search it), the output formats, the axis titles of the metrics, which metrics sit on a
log axis or are fractions in [0, 1], and the markers and line styles that tell runs apart in print.
"""

from __future__ import annotations

import os

__all__ = ["FORMATS", "DEFAULT_FORMATS", "parse_formats", "pyplot", "RC", "TITLES", "LOG_METRICS", "UNIT_METRICS",
           "MARKERS", "LINE_STYLES"]

FORMATS = ("png", "pdf", "svg")
DEFAULT_FORMATS = ("png", "pdf")

TITLES = {
    "f+h": "training objective f + h",
    "suboptimality": r"suboptimality f + h $-$ F*",
    "f": "training loss f",
    "h": "regularizer h",
    "accuracy": "accuracy",
    "test_acc": "test accuracy",
    "train_acc": "training accuracy",
    "grad_map_sq": r"stationarity $\|G_s(x)\|^2$ (training)",
    "normal_map_sq": r"$\|F^{\lambda}_{nor}(z)\|^2$ (training)",
    "stationarity": r"stationarity $\|G_s(x)\|^2$ (training)",
    "sparsity": "sparsity (fraction of zeros)",
    "hoyer": "Hoyer sparsity",
    "dist_to_truth": r"$\|w - x_{true}\|^2$",
    "dist_to_opt": r"$\|x - x^*\|^2 / \|x^0 - x^*\|^2$",
    "support_f1": "support F1",
    "test_loss": "test loss",
    "train_loss": "training loss",
}
# (a metric's name in a table's header: experiments/tables.py, METRIC_COLUMNS, one mapping for every table)
LOG_METRICS = {"f+h", "suboptimality", "f", "grad_map_sq", "normal_map_sq", "stationarity", "dist_to_truth",
               "dist_to_opt", "test_loss", "train_loss"}
UNIT_METRICS = {"sparsity", "hoyer", "test_acc", "train_acc", "accuracy", "support_f1"}  # fractions in [0, 1]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
LINE_STYLES = ["-", "--", "-.", ":"]
RC = {"font.size": 11, "axes.titlesize": 10, "legend.fontsize": 9, "axes.spines.top": False,
      "axes.spines.right": False, "pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}


def pyplot():
    """matplotlib.pyplot on the headless Agg backend; a clear error when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: pip install matplotlib (or fedkernels[plot])") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out_dir: str, base: str, formats, dpi: int) -> list:
    """``fig`` written as ``out_dir/base.<ext>`` in each of ``formats``; the paths written."""
    files = []
    for ext in formats:
        f = os.path.join(out_dir, f"{base}.{ext}")
        fig.savefig(f, dpi=dpi)
        files.append(f)
    return files


def parse_formats(formats) -> tuple:
    """``"png,pdf"`` or ``["png", "pdf"]`` -> ``("png", "pdf")``; an unknown format names ``--formats``."""
    items = formats.split(",") if isinstance(formats, str) else list(formats)
    items = [str(f).strip().lower().lstrip(".") for f in items if str(f).strip()]
    bad = [f for f in items if f not in FORMATS]
    if bad or not items:
        given = formats if isinstance(formats, str) else ",".join(map(str, formats))
        raise ValueError(f"--formats {given or repr(given)}: "
                         f"{'unknown format ' + ', '.join(bad) if bad else 'no format given'}; valid: "
                         f"{', '.join(FORMATS)} (comma-separated, e.g. png,pdf)")
    return tuple(dict.fromkeys(items))
