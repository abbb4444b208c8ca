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

For each metric and x axis one figure (``<metric>_vs_<round|time>.<ext>``) plus an overview grid
(``overview.<ext>``), in every format asked for (png, pdf, svg; default png and pdf). PDF and SVG
keep text as text (TrueType in PDF, ``<text>`` in SVG), so a paper can restyle or search it. Needs
matplotlib (``pip install fedkernels[plot]``).
"""

from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

from .aggregate import aggregate_rows, group_key, seed_of

__all__ = ["plot_runs", "find_runs", "load_run", "available_metrics", "DEFAULT_METRICS", "line_plot", "setup_line",
           "parse_formats", "FORMATS", "DEFAULT_FORMATS"]

DEFAULT_METRICS = ("f+h", "accuracy", "stationarity", "sparsity")
FORMATS = ("png", "pdf", "svg")
DEFAULT_FORMATS = ("png", "pdf")
_TITLES = {
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
_LOG = {"f+h", "suboptimality", "f", "grad_map_sq", "normal_map_sq", "stationarity", "dist_to_truth", "dist_to_opt",
        "test_loss", "train_loss"}
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
_STYLES = ["-", "--", "-.", ":"]
_RC = {"font.size": 11, "axes.titlesize": 10, "legend.fontsize": 9, "axes.spines.top": False,
       "axes.spines.right": False, "pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}


def _mpl():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: pip install matplotlib (or fedkernels[plot])") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
        seeds = sorted((d for d in os.listdir(p) if seed_of(d) is not None and os.path.isdir(os.path.join(p, d))),
                       key=seed_of)
        if not subs and seeds:  # a folder of seeds: each seed-<k> is a run or a comparison
            for d in seeds:
                try:
                    runs += find_runs([os.path.join(p, d)])
                except FileNotFoundError:  # a seed that has not started yet
                    pass
            if runs:
                continue
        if not subs:
            raise FileNotFoundError(f"{p}: neither a run folder (metrics.jsonl) nor a folder of runs")
        runs += [os.path.join(p, d) for d in subs]
    return runs


def group_seeds(runs: list, band: str = "std") -> list:
    """Runs of one experiment's seeds (folders ``.../seed-<k>/...`` differing only in k) become one
    entry: ``rows`` the per-round mean, ``band_rows`` the lower and upper edge of the band (mean ± std,
    or min and max with ``band="minmax"``), ``seeds`` the seeds. Other runs are kept as they are."""
    if band not in ("std", "minmax"):
        raise ValueError(f"--band {band}: must be std or minmax")
    groups: dict = {}
    for r in runs:
        key = group_key(r["path"]) if seed_of(r["path"]) is not None else ("run", r["path"])
        groups.setdefault(key, []).append(r)
    out = []
    for members in groups.values():
        if len(members) == 1 and seed_of(members[0]["path"]) is None:
            out.append(members[0])
            continue
        agg = aggregate_rows([m["rows"] for m in members])
        mean = [{"round": a["round"], **{k: v["mean"] for k, v in a.items() if isinstance(v, dict)}} for a in agg]
        if band == "std":
            lo = [{"round": a["round"], **{k: v["mean"] - v["std"] for k, v in a.items() if isinstance(v, dict)}}
                  for a in agg]
            hi = [{"round": a["round"], **{k: v["mean"] + v["std"] for k, v in a.items() if isinstance(v, dict)}}
                  for a in agg]
        else:
            lo = [{"round": a["round"], **{k: v["min"] for k, v in a.items() if isinstance(v, dict)}} for a in agg]
            hi = [{"round": a["round"], **{k: v["max"] for k, v in a.items() if isinstance(v, dict)}} for a in agg]
        floor = [{"round": a["round"], **{k: v["min"] for k, v in a.items() if isinstance(v, dict)}} for a in agg]
        first = members[0]
        out.append({**first, "rows": mean, "band_rows": (lo, hi, floor), "band": band,
                    "seeds": [seed_of(m["path"]) for m in members], "members": members})
    return out


def _comparison_order(folder: str) -> dict:
    try:
        with open(os.path.join(folder, "comparison.json")) as f:
            runs = json.load(f)["runs"]
        return {os.path.basename(os.path.normpath(r["out_dir"])): i for i, r in enumerate(runs)}
    except (OSError, KeyError, ValueError, TypeError):
        return {}


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            d = json.load(f)
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def _display_name(label: str) -> str:
    """A registry name (``za1``, what `compare` labels its runs with) as the algorithm's own spelling
    (``ZA1``), the one the setup line and the tables use; any other label is kept."""
    from ..algorithms.registry import ALGORITHMS

    entry = ALGORITHMS.get(str(label).lower())
    return entry.cls.name if entry is not None else label


def _short_reg(reg):
    """A per-parameter regularizer's repr shortened for the setup line: ``PerParameter({'0.weight':
    L1(kappa=0.01), '*.bias': None})`` -> ``per-parameter(0.weight: L1(0.01), *.bias: none)``, and
    past 72 characters only the distinct penalties: ``per-parameter(L1, GroupLasso, none; 5 rules)``."""
    import re

    if not isinstance(reg, str) or not reg.startswith("PerParameter("):
        return reg
    entries = re.findall(r"'((?:[^'\\]|\\.)*)':\s*(None|\w+(?:\((?:[^()]|\([^()]*\))*\))?)", reg)
    if not entries:
        return "per-parameter"
    short = []
    for pat, spec in entries:
        spec = "none" if spec == "None" else re.sub(r"\b\w+=", "", spec)
        short.append((pat, spec))
    text = "per-parameter(" + ", ".join(f"{p}: {sp}" for p, sp in short) + ")"
    if len(text) <= 72:
        return text
    kinds = list(dict.fromkeys(sp.split("(")[0] for _, sp in short))
    return f"per-parameter({', '.join(kinds)}; {len(short)} rules)"


def load_run(path: str) -> dict:
    """``{"label", "rows", "path", "config", "summary", "f_star"}`` for one run folder (label: its
    summary's label, else the folder name; f_star: the summary's, else None)."""
    from ..runfolder.files import read_metrics

    summary = _read_json(os.path.join(path, "summary.json"))
    label = summary.get("label") or os.path.basename(os.path.normpath(path))
    label = _display_name(label)
    f_star = summary.get("f_star")
    return {"label": label, "rows": read_metrics(path), "path": path, "summary": summary,
            "config": _read_json(os.path.join(path, "config.json")),
            "f_star": float(f_star) if isinstance(f_star, (int, float)) and not isinstance(f_star, bool) else None}


# --------------------------------------------------------------------------- #
# The setup line
# --------------------------------------------------------------------------- #


def _registry_entry(name):
    """The registry entry of an algorithm named by its key (``fedcanon``, a Config's) or its own
    spelling (``FedCanon``, what History.save records); None for an unknown name."""
    from ..algorithms.registry import ALGORITHMS

    if not isinstance(name, str):
        return None
    return ALGORITHMS.get(name.lower()) or next((e for e in ALGORITHMS.values() if e.cls.name == name), None)


def _set_by(entry, lr, k) -> tuple:
    """The hyper-parameters that the common lr and K set through ``entry.from_lr``: those whose value
    changes with lr (FedCanon: alpha = lr·K, beta = lr), resp. with K (alpha, local_steps). A constant
    of the mapping (ZA1's eta_g = 1) is set by neither."""
    lr = float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0 else 0.5
    k = k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else 1
    base = entry.from_lr(lr, k)
    by_lr = {n for n, v in entry.from_lr(2 * lr, k).items() if v != base.get(n)}
    by_k = {n for n, v in entry.from_lr(lr, k + 1).items() if v != base.get(n)}
    return by_lr, by_k


def _shown(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _hyper_parameters(c: dict, s: dict, alg) -> dict:
    """``{"K", "lr", <hyper-parameter>: value}`` as the setup line shows them: what set the
    algorithm's hyper-parameters. A `run` / `sweep` / `optuna` folder's config.json holds the common
    ``lr`` and ``local_steps`` and the ``alg_opts`` that override what they map to (a sweep's or
    search's hyper-parameter point is stored there too): lr (K) is shown only while some
    hyper-parameter it sets is not overridden, and every override by its own name. A History.save
    folder records the algorithm's own ``hparams``: K is its local_steps, and the hyper-parameters
    the common parameterization would set are shown by name (there is no lr)."""
    entry = _registry_entry(alg)
    if "lr" not in c:  # History.save: the hyper-parameters themselves
        hp = c.get("hparams") or s.get("hparams") or {}
        out = {"K": hp.get("local_steps"), "lr": None}
        if entry is not None:
            mapped = entry.from_lr(0.5, 1)
            out.update({n: _shown(hp[n]) for n in hp if n in mapped and n != "local_steps"})
        return out
    lr, k, opts = c.get("lr"), c.get("local_steps"), c.get("alg_opts") or {}
    by_lr, by_k = _set_by(entry, lr, k) if entry is not None else ({"?"}, {"?"})
    out = {"K": k if by_k - set(opts) else None,
           "lr": _shown(lr) if isinstance(lr, (int, float)) and by_lr - set(opts) else None}
    out.update({n: _shown(v) for n, v in opts.items()})  # SCAFFNEW's own lr replaces the common one it hides
    return out


def _setup_of(run: dict) -> dict:
    """What a reader needs to know about one run, from its config.json / summary.json (a `run`
    folder's Config, or the setup History.save recorded)."""
    c, s = run["config"], run["summary"]
    alg = s.get("algorithm") or c.get("algorithm")
    partition = c.get("partition")
    if partition == "dirichlet" and c.get("eta") is not None:
        partition = f"Dir({c['eta']:g})"
    reg = s.get("regularizer") or c.get("regularizer")
    if reg is None and c.get("reg") is not None:
        reg = c["reg"] if c["reg"] == "zero" else f"{c['reg']}({c.get('reg_strength', 0):g})"
    return {"algorithm": alg, "dataset": c.get("dataset"), "partition": partition,
            "N": c.get("num_clients", s.get("num_clients")), "model": c.get("model"), "h": _short_reg(reg),
            **_hyper_parameters(c, s, alg)}


def setup_line(runs: list) -> str:
    """One line: algorithm(s), dataset, partition, N, model, h, K, lr, then the hyper-parameters set
    explicitly (``--alg-opt``, a sweep's point) — each value the runs share, or the distinct values
    joined by "/" where they differ; unknown items are left out."""
    setups = [_setup_of(r) for run in runs for r in (run, *run.get("same_as", ()))]
    parts = []
    for key in dict.fromkeys(k for s in setups for k in s):  # the fixed items first, as _setup_of lists them
        vals = list(dict.fromkeys(str(s[key]) for s in setups if s.get(key) is not None))
        if not vals:
            continue
        text = ", ".join(vals) if key == "algorithm" else "/".join(vals)
        parts.append(text if key in ("algorithm", "dataset", "partition", "model") else f"{key}={text}")
    counts = sorted({len(r["seeds"]) for r in runs if r.get("seeds")})
    if counts:
        band = "mean ± std" if runs[0].get("band", "std") == "std" else "min to max"
        parts.append(f"{'/'.join(map(str, counts))} seeds: mean, band {band}")
    return " · ".join(parts)


# --------------------------------------------------------------------------- #
# Curves
# --------------------------------------------------------------------------- #


def _resolve(rows: list, key: str) -> str:
    if key == "accuracy":
        return next((k for k in ("test_acc", "train_acc") if any(k in r for r in rows)), "test_acc")
    if key == "stationarity":
        return "grad_map_sq"
    return key


def _series(run: dict, key: str, x: str):
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


def _band(run: dict, key: str, x: str):
    """x, lower and upper edge of a seed group's band of ``key`` (resolved) at the points :func:`_series`
    keeps; on a log axis a lower edge <= 0 (mean − std) is replaced by the smallest seed's value."""
    lo_rows, hi_rows, floor_rows = run["band_rows"]
    f_star = run.get("f_star")
    src = "f+h" if key == "suboptimality" else key
    shift = f_star if key == "suboptimality" else 0.0
    lo_at = {r["round"]: r.get(src) for r in lo_rows}
    hi_at = {r["round"]: r.get(src) for r in hi_rows}
    floor_at = {r["round"]: r.get(src) for r in floor_rows}
    xs, lo, hi = [], [], []
    for r in run["rows"]:
        v, t = r.get(src), r["round"]
        xv = r.get(x, 0.0 if t == 0 else None)
        if v is None or xv is None or lo_at.get(t) is None or hi_at.get(t) is None or not math.isfinite(v):
            continue
        if key == "suboptimality" and v - shift <= 0:
            continue
        a, b = lo_at[t] - shift, hi_at[t] - shift
        if a <= 0 and (key in _LOG):
            a = floor_at[t] - shift if floor_at.get(t) is not None and floor_at[t] - shift > 0 else v - shift
        if key in ("sparsity", "hoyer") or key.endswith("_acc"):  # fractions: mean ± std may leave [0, 1]
            a, b = max(a, 0.0), min(b, 1.0)
        xs.append(xv)
        lo.append(a)
        hi.append(b)
    return xs, lo, hi


_UNIT = {"sparsity", "hoyer", "test_acc", "train_acc", "accuracy", "support_f1"}  # fractions in [0, 1]


def _ticks_cover(ax, lo: float, hi: float, key: str) -> None:
    """Make the labelled y ticks enclose the data: the axis ends at the labelled tick at or below the
    lowest value and at or above the highest (a paper's reader reads the last value off a label,
    not off an unlabelled stretch of axis). Fractions stay within [0, 1]; a constant fraction (an
    all-dense model's sparsity 0) gets the axis [0, 1], not matplotlib's ±0.04 around it."""
    if key in _UNIT and lo >= 0 and hi <= 1:
        if hi - lo < 1e-12:
            ax.set_ylim(0.0, 1.0)
            return
    log = ax.get_yscale() == "log"
    unit = key in _UNIT and lo >= 0 and hi <= 1
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
        xs, ys, key = _series(run, metric, x)
        if xs:
            drawn.append((i, run, xs, ys, key))
    if not drawn:
        return False
    keys = {d[4] for d in drawn}
    n = len(runs)
    for i, run, xs, ys, key in drawn:
        every = max(1, len(xs) // 8)
        label = run["label"]
        if len(keys) > 1 and key.split("_")[0] in ("test", "train"):  # runs differ in what they measured
            label += " (test)" if key.startswith("test") else " (training)"
        ax.plot(xs, ys, linestyle=_STYLES[i % len(_STYLES)], marker=_MARKERS[i % len(_MARKERS)], color=f"C{i % 10}",
                markevery=((i * every) // n, every), markersize=5, linewidth=1.5, label=label)
    ys_all = [y for d in drawn for y in d[3]]
    for i, run, xs, ys, key in drawn:
        if run.get("band_rows"):
            bx, lo, hi = _band(run, key, x)
            if bx:
                ax.fill_between(bx, lo, hi, color=f"C{i % 10}", alpha=0.2, linewidth=0)
                ys_all += [v for v in lo + hi if math.isfinite(v)]
    resolved = next(iter(keys)) if len(keys) == 1 else metric
    if metric in _LOG and min(ys_all) > 0:
        _readable_log_y(ax, min(ys_all), max(ys_all))
    _ticks_cover(ax, min(ys_all), max(ys_all), resolved)
    ax.set_xlabel("communication rounds" if x == "round" else "wall-clock time (s)")
    key = next(iter(keys)) if len(keys) == 1 else metric
    ax.set_ylabel(_TITLES.get(key, _TITLES.get(metric, metric)))
    ax.grid(True, which="major", linestyle=":", linewidth=0.7, alpha=0.8)
    return True


# --------------------------------------------------------------------------- #
# Figures
# --------------------------------------------------------------------------- #


def merge_identical(runs: list, metrics: Sequence[str]) -> list:
    """Runs whose curves of every metric in ``metrics`` are exactly equal, round by round, drawn once
    and named together in the legend ("ZA1 = FedNMap"): otherwise the later curve hides the earlier
    and a reader concludes an algorithm is missing. Seed groups (bands) are compared by their
    members' rows."""
    def signature(run):
        src = run.get("members") or [run]
        sig = []
        for m in metrics:
            per = []
            for member in src:
                xs, ys, _ = _series(member, m, "round")
                per.append((tuple(xs), tuple(ys)))
            sig.append(tuple(per))
        return tuple(sig)

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
    if band not in ("std", "minmax"):
        raise ValueError(f"--band {band!r}: must be std or minmax")
    formats = parse_formats(formats)
    if f_star is not None and (isinstance(f_star, bool) or not isinstance(f_star, (int, float))
                               or not math.isfinite(f_star)):
        raise ValueError(f"--f-star {f_star!r}: must be a finite number (the optimal value F*)")
    bad_x = [x for x in x_axes if x not in ("round", "elapsed")]
    if bad_x:
        raise ValueError(f"--x {' '.join(bad_x)}: unknown x axis; valid: round, elapsed")
    runs = [load_run(p) for p in find_runs(paths)]
    if f_star is not None:
        for r in runs:
            r["f_star"] = float(f_star)
    if metrics is None:  # the defaults these runs have (a regression run has no accuracy)
        known = any(r["f_star"] is not None for r in runs)
        have = available_metrics(runs)
        metrics = [m for m in (("suboptimality" if m == "f+h" and known else m) for m in DEFAULT_METRICS) if m in have]
        if not metrics:
            raise ValueError(f"{', '.join(paths)}: the runs hold no metric to plot (no f+h, accuracy, stationarity or "
                             f"sparsity); give --metrics, available: {', '.join(have) or 'none'}")
    metrics = list(metrics)
    _check_metrics(metrics, runs)
    runs = group_seeds(runs, band)
    if labels is not None:
        if len(labels) != len(runs):
            raise ValueError(f"{len(labels)} labels for {len(runs)} runs")
        for r, lab in zip(runs, labels):
            r["label"] = lab
    runs = merge_identical(runs, metrics)
    plt = _mpl()
    stem = os.path.splitext(name)[0] if os.path.splitext(name)[1].lstrip(".").lower() in FORMATS else name
    heading = "\n".join(t for t in (title, setup_line(runs) if setup else None) if t)
    out_dir = out_dir or (paths[0] if os.path.isdir(paths[0]) else ".")
    os.makedirs(out_dir, exist_ok=True)
    files = []

    def save(fig, base: str, dpi: int) -> None:
        for ext in formats:
            f = os.path.join(out_dir, f"{base}.{ext}")
            fig.savefig(f, dpi=dpi)
            files.append(f)

    with plt.rc_context(_RC):
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


_ALIASES = ("accuracy", "stationarity", "suboptimality")


def available_metrics(runs: list) -> list:
    """Metric names :func:`plot_runs` can draw for ``runs``: the aliases and every numeric key of their rows
    (``suboptimality`` where F* is known)."""
    keys = {k for r in runs for row in r["rows"] for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "round"}
    names = dict.fromkeys((*DEFAULT_METRICS, "suboptimality", *sorted(keys)))
    return [m for m in names if m in keys or m in _ALIASES and any(_series(r, m, "round")[0] for r in runs)]


def _check_metrics(metrics: Sequence[str], runs: list) -> None:
    """Refuse metric names that no run has (a typo would otherwise give an empty figure set)."""
    have = available_metrics(runs)
    bad = [m for m in metrics if m not in have]
    if bad:
        hint = ("; suboptimality needs F*: give --f-star VALUE" if "suboptimality" in bad
                and "suboptimality" not in have else "")
        raise ValueError(f"--metrics {' '.join(bad)}: not a metric of these runs; available: {', '.join(have)}{hint}")


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


# --------------------------------------------------------------------------- #
# Sweeps
# --------------------------------------------------------------------------- #


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
    plt = _mpl()
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
        with plt.rc_context(_RC):
            fig, ax = plt.subplots(figsize=(1.2 * len(cols) + 2.5, 0.8 * len(rows) + 1.8))
            finite = [v for row in m for v in row if math.isfinite(v)]
            im = ax.imshow(m, cmap="viridis_r" if select_name != "test_acc" else "viridis", aspect="auto")
            fig.colorbar(im, ax=ax, label=_TITLES.get(select_metric, select_metric) + " (mean)")
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
            ax.set_title(f"{_display_name(a)}: {select_name} over {rk} × {ck}"
                         + ("" if finite else " (no completed point)"), fontsize=10)
            fig.tight_layout()
            for ext in formats:
                f = os.path.join(out_dir, f"heatmap-{a}.{ext}")
                fig.savefig(f, dpi=130)
                files.append(f)
            plt.close(fig)
    best = result["best"]
    if best:
        labels = [f"{_display_name(a)} ({b['name']})" for a, b in best.items()]
        files += plot_runs([b["dir"] for b in best.values()], out_dir=out_dir, name="best", per_metric=False,
                           labels=labels, formats=formats, band=band, x_axes=("round",))
    return files
