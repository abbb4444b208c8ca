"""Command line (its parser: subcommands, flags, argument types): ``python -m python_algos`` (or the
installed ``fedkernels`` command).

    python -m python_algos                        # built-in demo: 5 algorithms, < 1 min on 2 cores
    python -m python_algos run -a fedcanon --dataset synthetic --partition natural -N 30 --reg l1 \\
        --reg-strength 1e-3 --lr 0.05 -K 10 -T 200
    python -m python_algos run --config exp.toml --rounds 300     # flags override the file
    python -m python_algos run --resume results/<run>              # continue after a crash / kill
    python -m python_algos run -a scaffold -N 4 -T 20 --flower      # through local Flower processes
    python -m python_algos run --resume results/<run> --flower     # continue it after a failed node
    python -m python_algos compare -a fedcanon fedavg za1 --partition dirichlet --eta 0.1
    python -m python_algos compare --resume results/<compare-folder>   # finish an interrupted comparison
    python -m python_algos sweep -a fedcanon --grid alpha=0.05,0.1 --grid beta=log:1e-3:1e-1:3 --seeds 3 --jobs 2
    python -m python_algos plot results/<compare-folder> [results/<run> ...] [--formats png,pdf,svg]
    python -m python_algos algorithms                              # the algorithm table

Exit status: 0 done, 1 error (message on stderr), 2 bad command line, 3 the run diverged (the
model or f+h became NaN/Inf, or f+h rose more than 1e3 x max(|f+h at round 0|, 1) above round 0),
128 + the signal when stopped by one: 130 Ctrl-C (SIGINT), 143 SIGTERM, 129 SIGHUP (every process
the command started ends, the summary so far is written and the resume command printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib

import fedkernels as fk

from ..config import MAX_COUNT, MAX_THREADS, SETTINGS, Config, Setting, show_value
from ..plotting import parse_formats  # matplotlib itself: imported when a figure is drawn

DEMO_ALGORITHMS = ("fedcanon", "fedavg", "za1", "fednmap", "fedmid")


def demo_config():
    # Sparse logistic regression with a known 10-sparse ground truth in R^100; 10 clients whose
    # features are shifted differently (heterogeneous f_i, one common x_true); L1; full gradients.
    return Config(algorithm="fedcanon", lr=0.1, local_steps=10, dataset="sparse_logistic",
                  data_opts={"n": 2000, "dim": 100, "nnz": 10, "num_groups": 10, "shift": 1.0, "noise": 0.1},
                  partition="natural", num_clients=10, model="linear", reg="l1", reg_strength=0.02,
                  rounds=60, checkpoint_every=0)


# --------------------------------------------------------------------------- #
# Parsing
# --------------------------------------------------------------------------- #

# The namespace attribute holding each given setting's flag as the user typed it ({"local_steps": "-K"}):
# errors about a setting name it so (config.named_as).
TYPED = "typed_flags"


class SettingAction(argparse.Action):
    """Reads one flag of a :class:`~.config.Setting` with the setting's own parser, records the flag
    as typed (:data:`TYPED`), and appends to a table for a repeatable ``KEY=VALUE`` flag. A value that
    does not parse is a usage error naming the flag as typed: ``-K abc: must be an integer``."""

    def __init__(self, option_strings, dest, setting: Setting, **kw):
        super().__init__(option_strings, dest, **kw)
        self.setting = setting

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            value = self.setting.parse(values)
        except ValueError as e:
            raise argparse.ArgumentError(None, f"{option_string} {values}: {e}") from None
        if self.setting.options:
            value = [*(getattr(namespace, self.dest, None) or []), value]
        setattr(namespace, self.dest, value)
        typed = getattr(namespace, TYPED, None)
        if typed is None:
            typed = {}
            setattr(namespace, TYPED, typed)
        typed[self.dest] = option_string


class Parser(argparse.ArgumentParser):
    """argparse, with an unknown flag answered by the nearest known one of its command:
    ``unrecognized argument --roudns; did you mean --rounds?``."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.commands = {}  # name -> its sub-parser (add_command)

    def add_command(self, sub, name: str, **kw) -> "Parser":
        p = sub.add_parser(name, **kw)
        self.commands[name] = p
        return p

    def parse_args(self, args=None, namespace=None):
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self.commands.get(getattr(ns, "command", None), self)
            parser.error("; ".join(_unrecognized(a, parser) for a in _stray(extras)))
        return ns

    def given_dests(self, ns: argparse.Namespace) -> tuple:
        """The destinations of ``ns`` (this parser's result) that its command line gave, in the
        namespace's order: a flag whose default is SUPPRESS is there only when given; one that argparse
        fills with its default counts when its value differs (``--no-progress``, ``-a ...``)."""
        parser = self.commands.get(getattr(ns, "command", None), self)
        defaults = {a.dest: a.default for a in parser._actions}
        return tuple(k for k, v in vars(ns).items() if k in defaults and (defaults[k] is S or v != defaults[k]))


def _stray(extras: list) -> list:
    """The unrecognized arguments worth naming: an unknown flag, not the value that follows it."""
    return [a for i, a in enumerate(extras) if a.startswith("-") or i == 0 or not extras[i - 1].startswith("-")]


def _unrecognized(arg: str, parser: argparse.ArgumentParser) -> str:
    flag = arg.split("=", 1)[0]
    known = [o for a in parser._actions for o in a.option_strings]
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag.startswith("-") else []
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unrecognized argument {arg}{hint}"


def _kv_text(text: str):
    """KEY=VALUES with VALUES kept as text (--grid parses it: lists, log:...)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUES (e.g. alpha=0.01,0.1 or alpha=log:1e-3:1e-1:5), "
                                         f"got {text!r}")
    k, v = text.split("=", 1)
    return k.strip(), v.strip()


def _count(what: str, hi: int = MAX_COUNT):
    """The argparse type of a count in [1, hi]; ``what`` says what is counted in its error (each flag
    its own: ``--seeds 0`` is not about processes)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = 0
        if v < 1:
            raise argparse.ArgumentTypeError(f"must be an integer >= 1 ({what}), got {text!r}")
        if v > hi:
            raise argparse.ArgumentTypeError(f"must be an integer in [1, {hi}] ({what}), got {text!r}")
        return v

    return parse


# processes: at most MAX_THREADS, more than the hardware threads of any current machine
_workers = _count("processes", MAX_THREADS)  # --workers
_jobs = _count("worker processes", MAX_THREADS)  # sweep --jobs
_seeds = _count("independent runs, one per seed")  # --seeds
_trials = _count("trials per algorithm")  # sweep --optuna

# --round-timeout: at most a week; a longer wait is no timeout (and overflows the wait's clock)
MAX_WAIT = 7 * 24 * 3600


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (0 < v <= MAX_WAIT):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0 and <= {MAX_WAIT} (a week), "
                                         f"got {text!r}")
    return v


def formats_flag(text: str):
    try:
        return parse_formats(text)
    except ValueError as e:  # argparse prefixes the flag itself
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None


def _add_figure_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--formats", type=formats_flag, default=("png", "pdf"), metavar="png,pdf,svg",
                   help="figure file formats, comma-separated (default: png,pdf)")
    p.add_argument("--no-plot", action="store_true", dest="no_plot", help="do not write the figure")
    p.add_argument("--band", choices=["std", "minmax"], default="std",
                   help="several seeds: the shaded band around the mean (mean ± std, or min to max; default std)")
    p.add_argument("--tensorboard", action="store_true", default=S,
                   help="also write each run's per-round metrics as TensorBoard events into RUN/tensorboard/, "
                        "live: each round as soon as it is in metrics.jsonl, so `tensorboard --logdir OUT` "
                        "shows the curves growing (a resume shows each round once); needs `pip install "
                        "tensorboard`")


S = argparse.SUPPRESS
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config) if f.default is not dataclasses.MISSING}


def _add_setting(g, s: Setting, single: bool) -> None:
    """The flag of setting ``s`` (config.Config's declaration): only given flags override (SUPPRESS)."""
    help = s.help
    if s.name == "alg_opts" and not single:
        help += "; ALG.KEY=VALUE for one algorithm"
    default = _DEFAULTS.get(s.name)  # Config's (the flag's own default is SUPPRESS: only given flags override)
    if default is not None and "default" not in (help or ""):  # None: the help says what no value means
        help = f"{help or ''} (default: {show_value(default)})".lstrip()
    g.add_argument(*s.flags, action=SettingAction, setting=s, dest=s.name, default=S, help=help,
                   metavar=s.metavar, choices=s.choices)


def _add_config_flags(p: argparse.ArgumentParser, single: bool) -> None:
    """The flags of every Config setting (declared in config.py), in its --help section, and the
    flags of a command's seeds (not settings of one run)."""
    groups = {}
    for s in SETTINGS.values():
        if s.single_run and not single:
            continue  # compare / sweep: -a/--algorithms
        if s.group not in groups:
            groups[s.group] = p.add_argument_group(s.group)
        _add_setting(groups[s.group], s, single)
        if s.name == "data_seed":
            _add_seed_flags(groups[s.group])
    _add_output_flags(p)


def _add_seed_flags(g) -> None:
    g.add_argument("--seeds", type=_seeds, default=S, metavar="K",
                   help="K independent runs with seeds --seed, ..., --seed + K - 1, each in OUT/seed-<k>/, with "
                        "mean / std / min / max per round in OUT/aggregate.jsonl, tables as mean ± std and figures "
                        "with a band (see docs/seeds-and-sweeps.md)")
    g.add_argument("--reseed-data", action="store_true", default=S, dest="reseed_data",
                   help="with several seeds: redraw the data (samples, split, partition) with each seed; by default "
                        "every seed runs on the data of the first")


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--config", help="TOML / YAML / JSON file with the same keys (flags override it)")
    g.add_argument("--out", help="results folder; one holding a finished run is refused (resume it with --resume, "
                   "or choose another) (default: a new ./results/<timestamp>-<name>[-2, -3, ...], never shared "
                   "with another command)")
    g.add_argument("--name", help="name of the results folder under ./results/")
    g.add_argument("--no-progress", action="store_true", help="no progress bar / progress lines")
    _add_figure_flags(g)


def _add_run_command(p: Parser, sub) -> None:
    """``run``: one algorithm on one problem (its own flags, then the settings' flags)."""
    r = p.add_command(sub, "run", help="one algorithm on one problem", description="Run one algorithm; results go to a "
                      "folder with config.json, metrics.jsonl (per round), summary.json, checkpoint.pt, model.pt. "
                      "A run stops as diverged (status \"diverged\", exit status 3) when its model or f+h becomes "
                      "NaN/Inf, or f+h rises more than 1e3 x max(|f+h at round 0|, 1) above its round-0 value.")
    r.add_argument("--demo", action="store_true", help="the built-in demo comparison (as with no arguments)")
    r.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint "
                   "(--rounds may extend it, --checkpoint-every change when it saves; the other settings are "
                   "taken from DIR/config.json)")
    r.add_argument("--workers", type=_workers, default=S, metavar="P",
                   help="run on P local processes (torchrun ranks, clients split between them; see "
                        "docs/scaling-out.md); under torchrun, the ranks are torchrun's")
    r.add_argument("--flower", action="store_true", default=S,
                   help="run through a local Flower deployment: one SuperLink and one SuperNode per client as "
                        "processes on 127.0.0.1 (needs pip install \".[flower]\"; see docs/flower.md)")
    r.add_argument("--round-timeout", type=_seconds, default=S, metavar="SECONDS", dest="round_timeout",
                   help="with --flower: seconds the server waits for a round's answers before it stops the run, "
                        "naming the client that did not answer (default 300; the run can then be resumed)")
    _add_replace_flag(r, "the run already in that folder (all of it: metrics, checkpoints, TensorBoard events, "
                         "figures)")
    _add_config_flags(r, single=True)


def _add_replace_flag(command, what: str) -> None:
    """``--replace`` of a command that writes a folder: one rule for run, compare and sweep."""
    command.add_argument("--replace", action="store_true", default=S,
                         help=f"with --out or --name: replace {what}; a folder holding other files is refused")


def _add_compare_command(p: Parser, sub) -> None:
    """``compare``: several algorithms on the same split and initial model."""
    c = p.add_command(sub, "compare", help="several algorithms, same split and initialization",
                       description="Run several algorithms on the same data split and initial model; one folder "
                       "per algorithm plus comparison.md.")
    c.add_argument("-a", "--algorithms", nargs="+", default=None, help=f"default: {' '.join(DEMO_ALGORITHMS)}")
    c.add_argument("--resume", metavar="DIR", help="finish the comparison in DIR: finished runs (completed or "
                   "diverged) are kept, the others continue from their checkpoints (--rounds may extend it; other "
                   "flags come from DIR)")
    c.add_argument("--workers", type=_workers, default=S, metavar="P",
                   help="run every algorithm on P local processes (torchrun ranks, clients split between them; "
                        "see docs/scaling-out.md); under torchrun, the ranks are torchrun's")
    _add_replace_flag(c, "the comparison already in that folder (all its runs, records and figures)")
    _add_config_flags(c, single=False)


def _add_sweep_command(p: Parser, sub) -> None:
    """``sweep``: a grid or a random search over settings and hyper-parameters."""
    w = p.add_command(sub, "sweep", help="a grid of hyper-parameters x algorithms x seeds, in parallel, resumable",
                       description="Run every point of a grid (--grid KEY=VALUES, repeatable) for each algorithm and "
                       "seed, on --jobs worker processes; points that break an algorithm's rule are skipped and "
                       "listed. Ends with a table of every point (mean ± std over the seeds), the best point per "
                       "algorithm (--select), a heat map of 2-D grids and a figure of the best points. "
                       "See docs/seeds-and-sweeps.md.")
    w.add_argument("-a", "--algorithms", nargs="+", default=None, help="the algorithms (registry names)")
    w.add_argument("--grid", type=_kv_text, action="append", default=S, dest="grid_items", metavar="KEY=VALUES",
                   help="a run setting (lr, local_steps, reg_strength, ...) or a hyper-parameter (alpha, beta, ...) "
                        "and its values: 0.01,0.05,0.1 or log:1e-3:1e-1:5 (5 values evenly spaced in log); a config "
                        "file's [grid] table holds the same")
    w.add_argument("--optuna", type=_trials, default=S, metavar="N",
                   help="instead of a grid: N trials per algorithm of a random search with Optuna's TPE sampler "
                        "(seeded from --seed) over --space; needs pip install optuna (see docs/seeds-and-sweeps.md)")
    w.add_argument("--space", type=_kv_text, action="append", default=S, dest="space_items", metavar="KEY=SPEC",
                   help="with --optuna: a key and its range: log:1e-3:1 (log-uniform), float:0:1, int:1:20, "
                        "intlog:1:64, or a list a,b,c (a choice); a config file's [space] table holds the same")
    _add_replace_flag(w, "the sweep already in that folder (every point's runs, records and figures)")
    w.add_argument("--jobs", type=_jobs, default=S, metavar="P",
                   help="worker processes running points in parallel (default 1: one after another in this process); "
                        "with --optuna, a trial's seeds run in parallel and trials one after another")
    w.add_argument("--select", choices=["f_plus_h", "test_acc", "stationarity"], default=S,
                   help="the metric that picks the best point per algorithm: lowest final f+h (default), highest "
                        "test accuracy, lowest ‖G_s‖² (every point measures it at one s: --metric-step, else the "
                        "smallest lr·K of the grid)")
    w.add_argument("--resume", metavar="DIR", help="finish the sweep in DIR: finished points are kept, interrupted "
                   "runs continue from their checkpoints, the others start (--jobs may differ). The table and "
                   "figures use the sweep's own --select, --formats and --band (recorded in DIR/sweep.json); one "
                   "given with --resume wins for this resume")
    _add_config_flags(w, single=False)


def _add_demo_command(p: Parser, sub) -> None:
    """``demo``: the built-in comparison (also what no arguments run)."""
    d = p.add_command(sub, "demo", help="the built-in demo (same as no arguments)")
    d.add_argument("-T", "--rounds", action=SettingAction, setting=SETTINGS["rounds"], default=None)
    d.add_argument("--out")
    d.add_argument("--no-progress", action="store_true")
    _add_figure_flags(d)


def _add_plot_command(p: Parser, sub) -> None:
    """``plot``: the figures of run, comparison and seed folders."""
    pl = p.add_command(sub, "plot", help="figures of runs / comparisons (PNG, PDF, SVG)",
                        description="Loss (or suboptimality), accuracy, stationarity and sparsity vs rounds and vs "
                        "wall time; several runs overlaid, with a setup line (algorithms, data, partition, N, model, "
                        "h, K, lr).")
    pl.add_argument("runs", nargs="+", help="run folders or comparison folders")
    pl.add_argument("--out", help="output folder (default: the first folder given)")
    pl.add_argument("--metrics", nargs="+", default=None,
                    help="metric keys (default: f+h, accuracy, stationarity, sparsity; suboptimality in place "
                    "of f+h when F* is known)")
    pl.add_argument("--x", nargs="+", default=["round", "elapsed"], choices=["round", "elapsed"], help="x axes")
    pl.add_argument("--title", default=None, help="a title above the setup line")
    pl.add_argument("--no-setup", action="store_true", dest="no_setup", help="leave the setup line out")
    pl.add_argument("--f-star", type=float, default=None, dest="f_star", metavar="F*",
                    help="the optimal value F*: plot the suboptimality f+h − F* (default: a run's summary.json f_star)")
    pl.add_argument("--formats", type=formats_flag, default=("png", "pdf"), metavar="png,pdf,svg",
                    help="file formats, comma-separated (default: png,pdf)")
    pl.add_argument("--band", choices=["std", "minmax"], default="std",
                    help="runs of several seeds (seed-<k> folders) are drawn as their mean with a shaded band: "
                         "mean ± std (default) or min to max")


def build_parser() -> Parser:
    p = Parser(prog="fedkernels", description="Composite federated learning experiments "
                                "(python_algos on fedkernels). No arguments: run the built-in demo.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Examples:\n" + __doc__.split("\n\n")[1])
    p.add_argument("--version", action="version", version=f"%(prog)s {fk.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    _add_run_command(p, sub)
    _add_compare_command(p, sub)
    _add_sweep_command(p, sub)
    _add_demo_command(p, sub)
    _add_plot_command(p, sub)
    p.add_command(sub, "algorithms", help="print the algorithm table (declared per-round costs)")
    return p
