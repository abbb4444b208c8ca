"""The tables of results the commands print and write (comparison, seeds, sweep, demo, one run):
one markdown format, and one name for each metric, so a column reads the same in every table.

    format_table(["algorithm", column_name("f+h")], [["fedcanon", 0.3312]])
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

__all__ = ["METRIC_COLUMNS", "column_name", "format_table", "format_number", "status_cell", "warning_notes"]

# metric key (metrics.jsonl, summary.json) -> its column heading in every table
METRIC_COLUMNS = {
    "f": "f",
    "h": "h",
    "f+h": "f+h",
    "grad_map_sq": "‖G_s‖²",
    "normal_map_sq": "‖F_nor‖²",
    "sparsity": "sparsity",
    "test_acc": "test acc",
    "train_acc": "train acc",
    "support_f1": "support F1",
    "elapsed": "time (s)",
}


def column_name(key: str, metric_step: Optional[float] = None) -> str:
    """The heading of metric ``key``; ``‖G_s‖²`` names its step s when ``metric_step`` is given
    (the value depends on s, so a table says which)."""
    name = METRIC_COLUMNS.get(key, key)
    if key == "grad_map_sq" and metric_step:
        name += f" (s={metric_step:g})"
    return name


def format_number(v: float) -> str:
    """4 significant digits; scientific notation below 1e-3 and from 1e5."""
    if not math.isfinite(v):
        return str(v)
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return f"{v:.3e}"
    return f"{v:.4g}"


def format_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A markdown table; floats with 4 significant digits, None as "–"."""

    def cell(v):
        if v is None:
            return "–"
        if isinstance(v, float):
            return format_number(v)
        return str(v)

    cells = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)])


def status_cell(status: str, summaries: Sequence[dict]) -> str:
    """A table's status of one run or a group of runs, marked ``⚠`` (``⚠ k``: k of the group) when run
    summaries hold a ``warning`` (:func:`~python_algos.runfolder.records.run_warning`; named below the table)."""
    k = sum(1 for s in summaries if (s or {}).get("warning"))
    return status if not k else f"{status} ⚠" if len(summaries) == 1 else f"{status}, ⚠ {k}"


def warning_notes(labelled: Sequence[tuple]) -> list:
    """``⚠ label: warning`` for each ``(label, summary)`` whose run summary holds a warning."""
    return [f"⚠ {label}: {s['warning']}" for label, s in labelled if (s or {}).get("warning")]
