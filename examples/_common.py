"""Shared pieces of the paper-experiment scripts: arguments, data fallback, runs, slopes, reports."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from typing import Callable, Optional, Sequence

import numpy as np

from python_algos.data import DataNotFoundError, load_dataset
from python_algos.experiments.build import prepare_data
from python_algos.experiments.config import Config
from python_algos.experiments.run import run_experiment

__all__ = ["parser", "paper_data", "Runner", "loglog_slope", "write_report", "table", "show_warnings_as_the_cli"]


def show_warnings_as_the_cli() -> None:
    """Print warnings the way ``python -m python_algos run`` does (``warning: ...``, through the
    CLI's own formatter), each distinct one once: a script makes many runs, and each would repeat
    the same warning (Python's once-per-location memory is reset whenever a warnings filter
    changes, which every run does)."""
    from python_algos.experiments.cli.commands import show_warning

    seen = set()

    def show(message, category, filename, lineno, file=None, line=None):
        if (category, str(message)) not in seen:
            seen.add((category, str(message)))
            show_warning(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The scripts' common flags; every script starts here, so warnings are set up here too."""
    show_warnings_as_the_cli()
    p = argparse.ArgumentParser(prog=f"python -m examples.{name}", description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few rounds on a tiny problem (smoke test, seconds)")
    p.add_argument("--data-dir", default=None, help="folder with the paper's dataset files (used when present)")
    p.add_argument("--out", default=os.path.join("results", "examples", name), help="results folder")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--progress", action="store_true", help="progress bars for every run")
    return p


def paper_data(paper: str, data_dir: Optional[str], fallback: str, fallback_opts: dict, log=print):
    """``(dataset, data_opts, data_dir, note)``: the paper's dataset if its files are in ``data_dir``,
    else the built-in ``fallback`` generator, with a note saying which one is used and why."""
    if data_dir is not None:
        try:
            load_dataset(paper, data_dir)
            note = f"dataset: {paper} from {data_dir} (as in the paper)"
            log(note)
            return paper, {}, data_dir, note
        except DataNotFoundError as e:
            reason = str(e).splitlines()[0]
    else:
        reason = "no --data-dir given"
    note = (f"dataset: built-in generator {fallback}({', '.join(f'{k}={v}' for k, v in fallback_opts.items())}) "
            f"instead of the paper's {paper} ({reason})")
    log(note)
    return fallback, dict(fallback_opts), None, note


def a9a_data(args, quick_opts: dict, log=print):
    """``(dataset, data_opts, data_dir, note)`` of a script on the papers' A9A: the copy inside the
    package (or the files in ``--data-dir``); with ``--quick``, a small generated stand-in
    (``sparse_logistic`` with ``quick_opts``) unless ``--data-dir`` holds a9a."""
    if args.quick:
        return paper_data("a9a", args.data_dir, "sparse_logistic", quick_opts, log=log)
    note = (f"dataset: A9A ({'files in ' + args.data_dir if args.data_dir else 'the copy inside the package'}, "
            "as in the paper)")
    log(note)
    return "a9a", {}, args.data_dir, note


class Runner:
    """Runs configs into ``out/<label>`` with one printed line per run; caches data splits."""

    def __init__(self, out: str, progress: bool = False, log=print):
        self.out, self.progress, self.log = out, progress, log
        self._fed = {}
        os.makedirs(out, exist_ok=True)

    def fed(self, cfg: Config):
        key = json.dumps({k: v for k, v in cfg.to_dict().items()
                          if k in ("dataset", "data_dir", "data_opts", "test_fraction", "partition", "num_clients",
                                   "eta", "min_size", "shards_per_client", "seed")}, sort_keys=True)
        if key not in self._fed:
            self._fed[key] = prepare_data(cfg)
        return self._fed[key]

    def run(self, cfg: Config, label: str, extra_eval: Optional[Callable] = None,
            f_star: Optional[float] = None) -> dict:
        t0 = time.perf_counter()
        # replace=True: running a script again regenerates its results (the folder is the script's own)
        s = run_experiment(cfg, os.path.join(self.out, label), fed=self.fed(cfg), progress=self.progress,
                           extra_eval=extra_eval, label=label, log=self.log, f_star=f_star, replace=True)
        f = s["final"]
        keys = [k for k in ("f+h", "grad_map_sq", "normal_map_sq", "dist_to_opt", "test_acc") if f.get(k) is not None]
        self.log(f"  {label:28s} " + "  ".join(f"{k}={f[k]:.4g}" for k in keys)
                 + f"  [{s['status']}, {time.perf_counter() - t0:.1f}s]")
        if s["status"] != "completed":
            self.log("  " + s["message"])
        return s


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


def tail_mean(rows: list, key: str, frac: float = 0.1) -> float:
    """Mean of ``key`` over the last ``frac`` of the metric rounds (smooths minibatch noise)."""
    vals = [r[key] for r in rows if r.get(key) is not None and r.get("round", 0) > 0]
    k = max(1, int(math.ceil(len(vals) * frac)))
    return float(np.mean(vals[-k:])) if vals else float("nan")


def table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    from python_algos.experiments.compare import format_table

    return format_table(header, rows)


def write_report(out: str, name: str, command: str, note: str, body: str, data: dict) -> str:
    """``out/RESULTS.md`` (command, data note, tables, outcome) and ``out/results.json``."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(data, f, indent=2, default=float)
    path = os.path.join(out, "RESULTS.md")
    with open(path, "w") as f:
        f.write(f"# {name}\n\n`{command}`\n\n{note}\n\n{body}\n")
    return path


def sklearn_missing() -> bool:
    """True, after saying how to install it, when scikit-learn (the digits' source) is missing."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("this example needs scikit-learn: pip install scikit-learn", file=sys.stderr)
        return True
    return False


def save_figure(fig, out: str, name: str) -> str:
    """``fig`` laid out and written to ``out/name`` (120 dpi), then closed; returns its path."""
    from matplotlib import pyplot as plt

    fig.tight_layout()
    path = os.path.join(out, name)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
