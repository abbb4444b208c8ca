"""Command line (its parser: subcommands, flags, argument types): ``python -m python_algos`` (or the installed ``fedkernels`` command).

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

Exit status: 0 done, 1 error (message on stderr), 2 bad command line, 3 the run diverged,
130 interrupted (Ctrl-C; the summary so far is written and the resume command printed).
"""

from __future__ import annotations

import argparse

from .values import parse_value

DEMO_ALGORITHMS = ("fedcanon", "fedavg", "za1", "fednmap", "fedmid")


def _demo_config():
    from .config import Config

    # Sparse logistic regression with a known 10-sparse ground truth in R^100; 10 clients whose
    # features are shifted differently (heterogeneous f_i, one common x_true); L1; full gradients.
    return Config(algorithm="fedcanon", lr=0.1, local_steps=10, dataset="sparse_logistic",
                  data_opts={"n": 2000, "dim": 100, "nnz": 10, "num_groups": 10, "shift": 1.0, "noise": 0.1},
                  partition="natural", num_clients=10, model="linear", reg="l1", reg_strength=0.02,
                  rounds=60, checkpoint_every=0)


# --------------------------------------------------------------------------- #
# Parsing
# --------------------------------------------------------------------------- #


_value = parse_value  # a KEY=VALUE value (config.parse_value, shared with sweep's --grid)


def _kv_text(text: str):
    """KEY=VALUES with VALUES kept as text (--grid parses it: lists, log:...)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUES (e.g. alpha=0.01,0.1 or alpha=log:1e-3:1e-1:5), "
                                         f"got {text!r}")
    k, v = text.split("=", 1)
    return k.strip(), v.strip()


def _kv(text: str):
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    k, v = text.split("=", 1)
    return k.strip(), _value(v)


def _count(what: str):
    """The argparse type of a count >= 1; ``what`` says what is counted in its error (each flag its
    own: ``--seeds 0`` is not about processes)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = 0
        if v < 1:
            raise argparse.ArgumentTypeError(f"must be an integer >= 1 ({what}), got {text!r}")
        return v

    return parse


_workers = _count("processes")  # --workers
_jobs = _count("worker processes")  # sweep --jobs
_seeds = _count("independent runs, one per seed")  # --seeds
_trials = _count("trials per algorithm")  # sweep --optuna


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (v > 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return v


def _formats(text: str):
    from .plotting import parse_formats

    try:
        return parse_formats(text)
    except ValueError as e:  # argparse prefixes the flag itself
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None


def _add_figure_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--formats", type=_formats, default=("png", "pdf"), metavar="png,pdf,svg",
                   help="figure file formats, comma-separated (default: png,pdf)")
    p.add_argument("--no-plot", action="store_true", dest="no_plot", help="do not write the figure")
    p.add_argument("--band", choices=["std", "minmax"], default="std",
                   help="several seeds: the shaded band around the mean (mean ± std, or min to max; default std)")
    p.add_argument("--tensorboard", action="store_true", default=S,
                   help="also write each run's per-round metrics as TensorBoard events into RUN/tensorboard/, "
                        "live: each round as soon as it is in metrics.jsonl, so `tensorboard --logdir OUT` "
                        "shows the curves growing (a resume shows each round once); needs `pip install "
                        "tensorboard`")


def _seed(text: str):
    """--seed: an integer, or a comma-separated list of them (one run per seed)."""
    if "," in text:
        from .seeds import parse_seed_list

        try:
            return parse_seed_list(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or a comma-separated list such as 1,2,3, got {text!r}") \
            from None


def _reg_param(text: str):
    """--reg-param PATTERN=NAME[,KEY=VALUE...] -> (PATTERN, "NAME" or {"reg": NAME, KEY: VALUE})."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected PATTERN=SPEC (e.g. '*.bias=none' or "
                                          f"'net.0.weight=group_lasso,lam=0.01,groups=cols'), got {text!r}")
    pattern, spec = (s.strip() for s in text.split("=", 1))
    name, *options = (s.strip() for s in spec.split(","))
    if not pattern or not name:
        raise argparse.ArgumentTypeError(f"expected PATTERN=SPEC with both parts non-empty, got {text!r}")
    if not options:
        return pattern, name
    entry = {"reg": name}
    for o in options:
        if "=" not in o:
            raise argparse.ArgumentTypeError(f"{text!r}: options after the name are KEY=VALUE, got {o!r}")
        k, v = o.split("=", 1)
        entry[k.strip()] = _value(v)
    return pattern, entry


def _batch(text: str):
    """-B: a minibatch size >= 1, or 'full' (full local gradients). One rule everywhere: simulate's
    batch_size and a config file's batch_size are an int >= 1 or None / null for full gradients,
    so 0 is refused here too instead of meaning 'full' on the command line alone."""
    if text.strip().lower() in ("full", "none"):
        return None
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 (samples per minibatch), or 'full' for full "
                                         f"local gradients; got {text!r}")
    return v


S = argparse.SUPPRESS


def _add_config_flags(p: argparse.ArgumentParser, single: bool) -> None:
    """Flags mapping onto experiment.Config; default SUPPRESS so only given flags override."""
    g = p.add_argument_group("algorithm")
    if single:
        g.add_argument("-a", "--algorithm", default=S, help="registry name (see `algorithms`)")
    g.add_argument("--lr", type=float, default=S, help="local step size (mapped per algorithm, see registry)")
    g.add_argument("-K", "--local-steps", type=int, default=S, dest="local_steps", help="local steps per round")
    g.add_argument("--alg-opt", type=_kv, action="append", default=S, dest="alg_opts", metavar="KEY=VALUE",
                   help="override a hyper-parameter, e.g. alpha=0.1"
                   + ("" if single else "; ALG.KEY=VALUE for one algorithm"))
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default=S, help="sparse_logistic | sparse_linear | synthetic | image_like | mnist | "
                   "fashion_mnist | cifar10 | a9a | libsvm | femnist | sklearn:NAME (scikit-learn's bundled digits, "
                   "breast_cancer, wine, iris, diabetes; needs scikit-learn)")
    g.add_argument("--data-dir", default=S, dest="data_dir", help="folder holding the dataset files (never downloaded)")
    g.add_argument("--data-opt", type=_kv, action="append", default=S, dest="data_opts", metavar="KEY=VALUE",
                   help="generator / loader option, e.g. alpha=1 beta=1 (synthetic), file=a.txt (libsvm)")
    g.add_argument("--test-fraction", type=float, default=S, dest="test_fraction")
    g.add_argument("--partition", default=S, choices=["iid", "dirichlet", "shards", "writers", "natural"])
    g.add_argument("-N", "--num-clients", type=int, default=S, dest="num_clients")
    g.add_argument("--eta", type=float, default=S, help="Dirichlet concentration Dir(eta)")
    g.add_argument("--min-size", type=int, default=S, dest="min_size", help="Dirichlet: minimum samples per client")
    g.add_argument("--shards-per-client", type=int, default=S, dest="shards_per_client")
    g.add_argument("--participation", type=float, default=S, help="fraction of clients sampled per round "
                   "(partial participation; algorithms that support it)")
    g.add_argument("--clients-per-round", type=int, default=S, dest="clients_per_round",
                   help="number of clients sampled per round (instead of --participation)")
    g = p.add_argument_group("model and regularizer")
    g.add_argument("--model", default=S,
                   help="linear | mlp | cnn | sigmoid_net | resnet18 | resnet34 | resnet50 | resnet101")
    g.add_argument("--model-opt", type=_kv, action="append", default=S, dest="model_opts", metavar="KEY=VALUE",
                   help="e.g. hidden=64 (sigmoid_net) or hidden=[128,64] (mlp)")
    g.add_argument("--reg", default=S, help="zero | l1 | elastic_net | mcp | scad | box | nonneg | l2ball")
    g.add_argument("--reg-strength", "--kappa", type=float, default=S, dest="reg_strength",
                   help="a penalty's weight: kappa (l1), l1 weight (elastic_net), lambda (mcp, scad); default "
                   "1e-3. The constraints (box, nonneg, l2ball) have none: giving one is an error (zero ignores it)")
    g.add_argument("--reg-opt", type=_kv, action="append", default=S, dest="reg_opts", metavar="KEY=VALUE",
                   help="the regularizer's options (repeatable): gamma=3 (mcp), a=3.7 (scad), l2=... (elastic_net; "
                   "default: the l1 weight), lo=-1 hi=1 (box), radius=1 (l2ball); the values shown are the "
                   "defaults. An unknown key is an error, and so is the strength's own name (kappa=, lam=, "
                   "l1=): the strength is --reg-strength")
    g.add_argument("--reg-param", type=_reg_param, action="append", default=S, dest="regularizers",
                   metavar="PATTERN=SPEC",
                   help="one penalty per parameter, instead of --reg (repeatable; config file: a [regularizers] "
                   "table): PATTERN is a parameter name or fnmatch pattern, SPEC a name (none, l1, ..., "
                   "group_lasso) with KEY=VALUE options, e.g. 'net.0.weight=group_lasso,lam=0.01,groups=cols' "
                   "'*.bias=none' '*=l1,kappa=1e-4'. An exact name wins, then the first matching pattern in "
                   "order; unmatched parameters get no penalty")
    g = p.add_argument_group("run")
    g.add_argument("-T", "--rounds", type=int, default=S)
    g.add_argument("-B", "--batch-size", type=_batch, default=S, dest="batch_size",
                   help="minibatch size (>= 1), or 'full': full local gradients (the default)")
    g.add_argument("--seed", type=_seed, default=S, help="the random seed (model initialization, sampling, data); "
                   "a comma-separated list (--seed 1,2,3) runs one independent run per seed")
    g.add_argument("--data-seed", type=int, default=S, dest="data_seed",
                   help="the seed of the data alone (samples, train/test split, partition); default: --seed")
    g.add_argument("--seeds", type=_seeds, default=S, metavar="K",
                   help="K independent runs with seeds --seed, ..., --seed + K - 1, each in OUT/seed-<k>/, with "
                        "mean / std / min / max per round in OUT/aggregate.jsonl, tables as mean ± std and figures "
                        "with a band (see docs/seeds-and-sweeps.md)")
    g.add_argument("--reseed-data", action="store_true", default=S, dest="reseed_data",
                   help="with several seeds: redraw the data (samples, split, partition) with each seed; by default "
                        "every seed runs on the data of the first")
    g.add_argument("--metrics-every", type=int, default=S, dest="metrics_every")
    g.add_argument("--metric-step", type=float, default=S, dest="metric_step", help="step s of ||G_s||²")
    g.add_argument("--device", default=S, help="cpu | cuda | cuda:K | auto")
    g.add_argument("--dtype", default=S, choices=["float32", "float64"])
    g.add_argument("--executor", default=S, choices=["auto", "sequential", "batched"],
                   help="how client work runs: one client after another, or all clients vectorized (default: auto)")
    g.add_argument("--threads", type=int, default=S,
                   help="torch / fedkernels threads (default: 1 for small models, see docs/executors.md 'Threads')")
    g.add_argument("--checkpoint-every", type=int, default=S, dest="checkpoint_every",
                   help="checkpoint every N rounds (default 10; 0: only at the start and the end)")
    g = p.add_argument_group("output")
    g.add_argument("--config", help="TOML / YAML / JSON file with the same keys (flags override it)")
    g.add_argument("--out", help="results folder (default: ./results/<timestamp>-<name>)")
    g.add_argument("--name", help="name of the results folder under ./results/")
    g.add_argument("--no-progress", action="store_true", help="no progress bar / progress lines")
    _add_figure_flags(g)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedkernels", description="Composite federated learning experiments "
                                "(python_algos on fedkernels). No arguments: run the built-in demo.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Examples:\n" + __doc__.split("\n\n")[1])
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser("run", help="one algorithm on one problem", description="Run one algorithm; results go to a "
                       "folder with config.json, metrics.jsonl (per round), summary.json, checkpoint.pt, model.pt.")
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
    _add_config_flags(r, single=True)

    c = sub.add_parser("compare", help="several algorithms, same split and initialization",
                       description="Run several algorithms on the same data split and initial model; one folder "
                       "per algorithm plus comparison.md.")
    c.add_argument("-a", "--algorithms", nargs="+", default=None, help=f"default: {' '.join(DEMO_ALGORITHMS)}")
    c.add_argument("--resume", metavar="DIR", help="finish the comparison in DIR: completed runs are kept, the "
                   "others continue from their checkpoints (--rounds may extend it; other flags come from DIR)")
    c.add_argument("--workers", type=_workers, default=S, metavar="P",
                   help="run every algorithm on P local processes (torchrun ranks, clients split between them; "
                        "see docs/scaling-out.md); under torchrun, the ranks are torchrun's")
    _add_config_flags(c, single=False)

    w = sub.add_parser("sweep", help="a grid of hyper-parameters x algorithms x seeds, in parallel, resumable",
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

    d = sub.add_parser("demo", help="the built-in demo (same as no arguments)")
    d.add_argument("-T", "--rounds", type=int, default=None)
    d.add_argument("--out")
    d.add_argument("--no-progress", action="store_true")
    _add_figure_flags(d)

    pl = sub.add_parser("plot", help="figures of runs / comparisons (PNG, PDF, SVG)",
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
    pl.add_argument("--formats", type=_formats, default=("png", "pdf"), metavar="png,pdf,svg",
                    help="file formats, comma-separated (default: png,pdf)")
    pl.add_argument("--band", choices=["std", "minmax"], default="std",
                    help="runs of several seeds (seed-<k> folders) are drawn as their mean with a shaded band: "
                         "mean ± std (default) or min to max")

    sub.add_parser("algorithms", help="print the algorithm table (declared per-round costs)")
    return p
