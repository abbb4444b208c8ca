"""Command line: ``python -m python_algos`` (or the installed ``fedkernels`` command).

    python -m python_algos                        # built-in demo: 5 algorithms, < 1 min on 2 cores
    python -m python_algos run -a fedcanon --dataset synthetic --partition natural -N 30 --reg l1 \\
        --reg-strength 1e-3 --lr 0.05 -K 10 -T 200
    python -m python_algos run --config exp.toml --rounds 300     # flags override the file
    python -m python_algos run --resume results/<run>              # continue after a crash / kill
    python -m python_algos run -a scaffold -N 4 -T 20 --flower      # through local Flower processes
    python -m python_algos compare -a fedcanon fedavg za1 --partition dirichlet --eta 0.1
    python -m python_algos compare --resume results/<compare-folder>   # finish an interrupted comparison
    python -m python_algos plot results/<compare-folder> [results/<run> ...] [--formats png,pdf,svg]
    python -m python_algos algorithms                              # the algorithm table

Exit status: 0 done, 1 error (message on stderr), 2 bad command line, 3 the run diverged,
130 interrupted (Ctrl-C; the summary so far is written and the resume command printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import warnings
from typing import Optional, Sequence

from .values import parse_value

__all__ = ["main", "build_parser", "DEMO_ALGORITHMS"]

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


def _workers(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 (processes), got {text!r}")
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
                   help="also write each run's per-round metrics as TensorBoard events into RUN/tensorboard/ "
                        "(`tensorboard --logdir OUT`; needs `pip install tensorboard`)")


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
                   help="kappa (l1), l1 weight (elastic_net), lambda (mcp, scad), radius (l2ball)")
    g.add_argument("--reg-opt", type=_kv, action="append", default=S, dest="reg_opts", metavar="KEY=VALUE",
                   help="gamma=3 (mcp), a=3.7 (scad), l2=... (elastic_net), lo= hi= (box)")
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
    g.add_argument("--seeds", type=_workers, default=S, metavar="K",
                   help="K independent runs with seeds --seed, ..., --seed + K - 1, each in OUT/seed-<k>/, with "
                        "mean / std / min / max per round in OUT/aggregate.jsonl, tables as mean ± std and figures "
                        "with a band (see docs/sweeps.md)")
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
                   help="torch / fedkernels threads (default: 1 for small models, see README 'Threads')")
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
                   "(--rounds may extend it; other flags are taken from DIR/config.json)")
    r.add_argument("--workers", type=_workers, default=S, metavar="P",
                   help="run on P local processes (torchrun ranks, clients split between them; see README "
                        "'Scaling out'); under torchrun, the ranks are torchrun's")
    r.add_argument("--flower", action="store_true", default=S,
                   help="run through a local Flower deployment: one SuperLink and one SuperNode per client as "
                        "processes on 127.0.0.1 (needs pip install \".[flower]\"; see README 'Deploying with Flower')")
    _add_config_flags(r, single=True)

    c = sub.add_parser("compare", help="several algorithms, same split and initialization",
                       description="Run several algorithms on the same data split and initial model; one folder "
                       "per algorithm plus comparison.md.")
    c.add_argument("-a", "--algorithms", nargs="+", default=None, help=f"default: {' '.join(DEMO_ALGORITHMS)}")
    c.add_argument("--resume", metavar="DIR", help="finish the comparison in DIR: completed runs are kept, the "
                   "others continue from their checkpoints (--rounds may extend it; other flags come from DIR)")
    c.add_argument("--workers", type=_workers, default=S, metavar="P",
                   help="run every algorithm on P local processes (torchrun ranks, clients split between them; "
                        "see README 'Scaling out'); under torchrun, the ranks are torchrun's")
    _add_config_flags(c, single=False)

    w = sub.add_parser("sweep", help="a grid of hyper-parameters x algorithms x seeds, in parallel, resumable",
                       description="Run every point of a grid (--grid KEY=VALUES, repeatable) for each algorithm and "
                       "seed, on --jobs worker processes; points that break an algorithm's rule are skipped and "
                       "listed. Ends with a table of every point (mean ± std over the seeds), the best point per "
                       "algorithm (--select), a heat map of 2-D grids and a figure of the best points. "
                       "See docs/sweeps.md.")
    w.add_argument("-a", "--algorithms", nargs="+", default=None, help="the algorithms (registry names)")
    w.add_argument("--grid", type=_kv_text, action="append", default=S, dest="grid_items", metavar="KEY=VALUES",
                   help="a run setting (lr, local_steps, reg_strength, ...) or a hyper-parameter (alpha, beta, ...) "
                        "and its values: 0.01,0.05,0.1 or log:1e-3:1e-1:5 (5 values evenly spaced in log); a config "
                        "file's [grid] table holds the same")
    w.add_argument("--optuna", type=_workers, default=S, metavar="N",
                   help="instead of a grid: N trials per algorithm of a random search with Optuna's TPE sampler "
                        "(seeded from --seed) over --space; needs pip install optuna (see docs/sweeps.md)")
    w.add_argument("--space", type=_kv_text, action="append", default=S, dest="space_items", metavar="KEY=SPEC",
                   help="with --optuna: a key and its range: log:1e-3:1 (log-uniform), float:0:1, int:1:20, "
                        "intlog:1:64, or a list a,b,c (a choice); a config file's [space] table holds the same")
    w.add_argument("--jobs", type=_workers, default=S, metavar="P",
                   help="worker processes running points in parallel (default 1: one after another in this process); "
                        "with --optuna, a trial's seeds run in parallel and trials one after another")
    w.add_argument("--select", choices=["f_plus_h", "test_acc", "stationarity"], default=S,
                   help="the metric that picks the best point per algorithm: lowest final f+h (default), highest "
                        "test accuracy, lowest ‖G_s‖²")
    w.add_argument("--resume", metavar="DIR", help="finish the sweep in DIR: finished points are kept, interrupted "
                   "runs continue from their checkpoints, the others start (--jobs may differ)")
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


def _read_config_file(path: str) -> dict:
    """The mapping in a TOML / YAML / JSON file; a syntax error is one line naming the file and line."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".toml", ".yaml", ".yml", ".json"):
        raise ValueError(f"config file {path}: use .toml, .yaml/.yml or .json")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if ext == ".toml":
        try:
            import tomllib
        except ImportError:  # Python < 3.11
            try:
                import tomli as tomllib
            except ImportError:
                raise SystemExit("reading TOML needs Python >= 3.11 or `pip install tomli`") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}, {_toml_error_text(e)}") from None
    elif ext in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise SystemExit("reading YAML needs `pip install pyyaml` (or use a .toml / .json config)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
            line = mark.line + 1 if mark is not None else "?"
            problem = " ".join(str(getattr(e, "problem", None) or e).split())
            raise ValueError(f"{path}, line {line}: {problem}") from None
        data = {} if data is None else data
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {e.lineno}: {e.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a table / mapping of keys, got a {type(data).__name__}")
    return data


def _toml_error_text(e) -> str:
    """tomllib's message with its position first: 'line 3, column 7: Invalid value', or 'at the
    end of the file: Unclosed array'. Python >= 3.14 gives msg / lineno / colno; older versions
    only a message ending in '(at line L, column C)' or '(at end of document)'."""
    import re

    msg = str(e)
    m = re.search(r" \(at line (\d+), column (\d+)\)$", msg)
    if msg.endswith(" (at end of document)"):
        return f"at the end of the file: {msg[:-len(' (at end of document)')]}"
    if getattr(e, "lineno", None) is not None and getattr(e, "msg", None):
        return f"line {e.lineno}, column {e.colno}: {e.msg}"
    if m:
        return f"line {m[1]}, column {m[2]}: {msg[:m.start()]}"
    return msg  # a message of another shape: kept whole


_DICT_KEYS = ("alg_opts", "data_opts", "model_opts", "reg_opts", "regularizers")


def _merge(args: argparse.Namespace, extra_keys: Sequence[str] = ()) -> dict:
    """Config file values, overridden by the flags given on the command line. Sets
    ``args.file_keys``: the keys whose values came from the file (for error messages)."""
    base = _read_config_file(args.config) if getattr(args, "config", None) else {}
    base = {k.replace("-", "_"): v for k, v in base.items()}
    from .config import Config

    names = {f.name for f in __import__("dataclasses").fields(Config)} | set(extra_keys)
    flags = set()
    for k, v in vars(args).items():
        if k not in names or (v is None and k in extra_keys):  # compare's -a not given: the file's list stands
            continue
        flags.add(k)
        if k in _DICT_KEYS:
            if base.get(k) is not None and not isinstance(base[k], dict):
                continue  # Config.check names the file's malformed value
            base[k] = {**(base.get(k) or {}), **dict(v)}
        else:
            base[k] = v
    args.file_keys = {k for k in base if k not in flags or k in _DICT_KEYS}
    if base.get("regularizers") and any(k in base for k in ("reg", "reg_opts")):
        from .config import ConfigError

        from .regularizer_specs import _spec_text

        given = " ".join(_spec_text(k, v) for k, v in base["regularizers"].items())
        raise ConfigError("regularizers", given,
                          "give --reg (one penalty for the whole model) or --reg-param / a [regularizers] table (one "
                          "per parameter), not both; a '*' pattern gives the remaining parameters a default")
    return base


def _in_terms_of(args, e: Exception) -> Exception:
    """A ConfigError about a value that came from the config file, worded with the file and key."""
    from .config import ConfigError

    if isinstance(e, ConfigError) and e.key in getattr(args, "file_keys", ()) and getattr(args, "config", None):
        return e.in_file(args.config)
    return e


def _out_dir(args, name: str) -> str:
    from .folders import default_out_dir

    if args.out:
        return args.out
    if getattr(args, "name", None):
        return os.path.join("results", args.name)
    return default_out_dir(name)


def _split_alg_opts(opts: dict, algorithms: Sequence[str]):
    """compare: {ALG: {...}} / 'ALG.KEY' entries go to one algorithm, plain keys to all."""
    common, per = {}, {a: {} for a in algorithms}
    for k, v in opts.items():
        if isinstance(v, dict) and k in per:
            per[k].update(v)
        elif "." in k and k.split(".", 1)[0] in per:
            a, key = k.split(".", 1)
            per[a][key] = v
        elif "." in k:
            raise ValueError(f"--alg-opt {k}={v}: {k.split('.', 1)[0]!r} is not one of the compared algorithms "
                             f"({' '.join(algorithms)})")
        else:
            common[k] = v
    return {a: {**common, **per[a]} for a in algorithms}


# --------------------------------------------------------------------------- #
# Commands
# --------------------------------------------------------------------------- #


def _print_summary(summary: dict) -> None:
    from .compare import format_table

    f = summary["final"]
    keys = [k for k in ("f", "h", "f+h", "grad_map_sq", "normal_map_sq", "sparsity", "test_acc", "train_acc",
                        "support_f1") if k in f]
    print(format_table(["round", *keys, "time (s)"], [[summary["rounds_done"], *[f[k] for k in keys], summary["elapsed"]]]))


_RESUME_OK = ("command", "demo", "resume", "rounds", "no_progress", "out", "name", "config", "algorithms",
              "workers", "argv",
              "formats", "no_plot", "band", "tensorboard")


def _quiet(_text: str) -> None:
    pass


def _restarted_run(cfg, out: str) -> bool:
    """True in a job that torchrun restarted (``--max-restarts``) whose run folder this job started:
    the restarted ranks resume it instead of starting over. A folder holding a run of other
    settings (the first attempt refused it) is left alone: the fresh-run checks then refuse it again."""
    from . import launch
    from .config import RESULT_KEYS
    from .folders import _read_config_json
    from ..runfolder.files import _as_json

    if not (launch.distributed() and launch.restarting() and os.path.isfile(os.path.join(out, "config.json"))):
        return False
    try:
        saved = _as_json(_read_config_json(os.path.join(out, "config.json")).to_dict())
    except ValueError:
        return False
    now = _as_json(cfg.to_dict())
    return all(saved.get(k) == now.get(k) for k in RESULT_KEYS if k != "rounds")


def _resume_flags_check(args) -> None:
    given = [k for k in vars(args) if k not in _RESUME_OK]
    given += [k for k in ("out", "name", "config", "algorithms") if getattr(args, k, None)]
    if given:
        raise SystemExit(f"--resume takes its settings from {args.resume}; only --rounds, --no-progress, --formats "
                         f"and --no-plot may be "
                         f"given (got {', '.join('--' + g.replace('_', '-') for g in given)})")


def cmd_run(args) -> int:
    from .config import Config
    from .run import run_experiment

    if args.demo:
        return cmd_demo(argparse.Namespace(rounds=getattr(args, "rounds", None), out=args.out,
                                           no_progress=args.no_progress, formats=args.formats, no_plot=args.no_plot))
    from . import launch

    if getattr(args, "flower", False):
        return _cmd_run_flower(args)
    if getattr(args, "workers", None) and _wants_seeds(args):
        raise ValueError("--workers with several seeds: run the seeds one after another on one process each "
                         "(leave out --workers), or give one seed")
    if getattr(args, "workers", None) and not launch.distributed():  # launch the ranks, then wait
        out = None
        if args.resume:
            _resume_flags_check(args)
        else:  # check the settings here, and pick the folder once for every rank
            from .prepare import check_world_size, prepare_run

            try:
                cfg = Config.from_dict(_merge(args))
                out = _out_dir(args, cfg.algorithm)
                # Every check a rank would make (data, model, regularizers, participation, the folder),
                # here and writing nothing: an error is then one line, not P numbered copies of it
                # followed by torchrun's failure report. It loads the data once more; ranks load theirs.
                prep = prepare_run(cfg, out, replace=not (args.out or getattr(args, "name", None)))
                check_world_size(len(prep.fed.parts), args.workers)
            except ValueError as e:
                raise _in_terms_of(args, e) from None
        return launch.run_workers(args.argv, args.workers, out)
    if _wants_seeds(args):
        return _cmd_run_seeds(args)
    main = launch.is_main()
    say = print if main else _quiet  # under torchrun rank 0 alone prints
    if args.resume:
        _resume_flags_check(args)
        summary = run_experiment(None, args.resume, resume=True, rounds=getattr(args, "rounds", None),
                                 progress=not args.no_progress, log=say)
    else:
        from .prepare import prepare_run
        from .run import execute_run

        try:
            cfg = Config.from_dict(_merge(args))
            out = launch.agree_on(_out_dir(args, cfg.algorithm) if main else None, cfg.device)  # rank 0's folder
            if launch.agree_on(main and _restarted_run(cfg, out)):
                # torchrun restarted the job after a rank failed: continue from the last checkpoint
                prep = prepare_run(None, out, resume=True, rounds=cfg.rounds)
            else:
                prep = prepare_run(cfg, out, replace=not (args.out or getattr(args, "name", None)))
        except ValueError as e:
            raise _in_terms_of(args, e) from None
        h = "per parameter" if cfg.regularizers else cfg.reg
        say(f"{cfg.algorithm} on {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), {cfg.model}, h={h}; "
            f"results -> {out}" + (f" ({launch.world_size()} processes)" if launch.distributed() else ""))
        summary = execute_run(prep, progress=not args.no_progress, log=say)
    if not main:
        return 3 if summary["status"] == "diverged" else 0
    return _finish_run(summary, args)


def _cmd_run_flower(args) -> int:
    """``run --flower`` (experiments/flower_run.py): every check, then the local Flower deployment."""
    from . import launch
    from .config import Config
    from .flower_run import check_flower_flags, execute_flower, prepare_flower

    check_flower_flags(workers=getattr(args, "workers", None), resume=args.resume, seeds=_wants_seeds(args),
                       demo=args.demo, distributed=launch.distributed())
    try:
        cfg = Config.from_dict(_merge(args))
        out = _out_dir(args, cfg.algorithm)
        prep = prepare_flower(cfg, out, replace=not (args.out or getattr(args, "name", None)))
    except ValueError as e:
        raise _in_terms_of(args, e) from None
    h = "per parameter" if cfg.regularizers else cfg.reg
    print(f"{cfg.algorithm} on {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), {cfg.model}, h={h}; "
          f"results -> {out} (Flower)")
    return _finish_run(execute_flower(prep), args)


def _finish_run(summary: dict, args) -> int:
    _print_summary(summary)
    print(f"results written to {summary['out_dir']}")
    _events([summary["out_dir"]], args)
    _figure(summary["out_dir"], args)
    if summary["status"] == "diverged":
        print(summary["message"], file=sys.stderr)
        return 3
    return 0


def _compare_settings(args, seeds: bool = False):
    """(the shared Config, the algorithm names, each algorithm's own options) of a ``compare``,
    checked (values, algorithm names). ``seeds=True``: also read the seeds (into ``args.seed_list``
    and ``args.reseed``)."""
    from .config import Config

    if seeds:
        merged, args.seed_list, args.reseed = _seed_settings(args, extra=("algorithms",))
    else:
        merged = _merge(args, extra_keys=("algorithms",))
    algorithms = args.algorithms or merged.pop("algorithms", None) or list(DEMO_ALGORITHMS)
    merged.pop("algorithms", None)
    per = _split_alg_opts(merged.pop("alg_opts", {}) or {}, algorithms)
    cfg = Config.from_dict(merged)
    # the cheap checks here, before the "comparing ..." line: a misspelt name or a bad flag is then
    # the only thing printed (compare_experiments checks the rest before it writes anything)
    from .prepare import check_algorithm_names

    cfg.check()
    check_algorithm_names(algorithms)
    return cfg, algorithms, per


def cmd_compare(args) -> int:
    from . import launch
    from .compare import compare_experiments, comparison_table

    if _wants_seeds(args):
        if getattr(args, "workers", None):
            raise ValueError("--workers with several seeds: run the seeds one after another on one process each "
                             "(leave out --workers), or give one seed")
        return _cmd_compare_seeds(args)
    if getattr(args, "workers", None) and not launch.distributed():  # launch the ranks, then wait
        out = None
        if args.resume:
            _resume_flags_check(args)
        else:  # check the settings here, and pick the folder once for every rank
            from .device import resolve_device
            from .prepare import check_algorithm_names, check_world_size

            try:
                cfg, algorithms, _ = _compare_settings(args)
                cfg.check()
                check_algorithm_names(algorithms)
                resolve_device(cfg.device)
                check_world_size(cfg.num_clients, args.workers)
            except ValueError as e:
                raise _in_terms_of(args, e) from None
            out = _out_dir(args, "compare")
        return launch.run_workers(args.argv, args.workers, out)
    main = launch.is_main()
    say = print if main else _quiet  # under torchrun rank 0 alone prints
    if args.resume:
        _resume_flags_check(args)
        out = args.resume
        say(f"resuming the comparison in {out}")
        summaries = compare_experiments(None, None, out, resume=True, rounds=getattr(args, "rounds", None),
                                        progress=not args.no_progress and main, log=say)
        with open(os.path.join(out, "comparison.json")) as f:
            step = json.load(f)["config"]["metric_step"]
    else:
        try:
            cfg, algorithms, per = _compare_settings(args)
        except ValueError as e:
            raise _in_terms_of(args, e) from None
        out = launch.agree_on(_out_dir(args, "compare") if main else None, cfg.device)  # rank 0's folder
        say(f"comparing {', '.join(algorithms)} on {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), "
              f"{cfg.model}, h={cfg.reg}; results -> {out}")
        try:
            summaries = compare_experiments(cfg, algorithms, out, alg_opts=per, progress=not args.no_progress and main,
                                            replace=not (args.out or getattr(args, "name", None)), log=say)
        except ValueError as e:
            raise _in_terms_of(args, e) from None
        step = cfg.metric_step if cfg.metric_step is not None else cfg.lr * cfg.local_steps
    if not main:
        return 3 if any(s["status"] == "diverged" for s in summaries) else 0
    print(comparison_table(summaries, step))
    print(f"results written to {out}  (more figures: python -m python_algos plot {shlex.quote(out)})")
    _events([s["out_dir"] for s in summaries], args)
    _figure(out, args)
    return 3 if any(s["status"] == "diverged" for s in summaries) else 0


# --------------------------------------------------------------------------- #
# Several seeds (experiments/seeds.py)
# --------------------------------------------------------------------------- #


def _events(run_dirs, args) -> None:
    """--tensorboard: the runs' TensorBoard events (see experiments/tensorboard.py)."""
    if getattr(args, "tensorboard", False):
        from .tensorboard import write_events

        for d in run_dirs:
            write_events(d)
        print(f"TensorBoard events: tensorboard --logdir {shlex.quote(os.path.commonpath(run_dirs))}")


def _wants_seeds(args) -> bool:
    """Several seeds asked for: --seeds, a --seed list, a seeds/reseed_data key of the config file, or
    --resume of a folder of seeds."""
    from .seeds import is_seeds_folder

    if getattr(args, "resume", None):
        return is_seeds_folder(args.resume)
    if hasattr(args, "seeds") or isinstance(getattr(args, "seed", None), list):
        return True
    if getattr(args, "config", None):
        keys = {k.replace("-", "_") for k in _read_config_file(args.config)}
        return bool(keys & {"seeds"}) or isinstance(_read_config_file(args.config).get("seed"), list)
    return False


def _seed_settings(args, extra=()):
    """(merged settings without the seed keys, the seeds, reseed_data) of a run / compare with seeds."""
    from .seeds import seed_list

    merged = _merge(args, extra_keys=("seeds", "reseed_data", *extra))
    seeds = seed_list(merged.get("seed"), merged.pop("seeds", None))
    reseed = merged.pop("reseed_data", False)
    if not isinstance(reseed, bool):
        raise ValueError(f"reseed_data = {reseed!r}: must be true or false")
    merged["seed"] = seeds[0]
    return merged, seeds, reseed


def _tb_hook(args):
    if not getattr(args, "tensorboard", False):
        return None
    from .tensorboard import check_available, write_events

    check_available()
    return write_events


def _seeds_done(result: dict, args, flat) -> int:
    print(result["table"])
    out = result["out_dir"]
    print(f"mean ± std over {len(result['seeds'])} seeds (seeds {', '.join(map(str, result['seeds']))}); results "
          f"written to {out}  (per-round statistics: {os.path.join(out, 'aggregate.jsonl')})")
    _figure(out, args)
    return 3 if any(s.get("status") == "diverged" for s in flat) else 0


def _cmd_run_seeds(args) -> int:
    from .config import Config
    from .seeds import run_seeds

    hook = _tb_hook(args)
    if args.resume:
        _resume_flags_check(args)
        print(f"resuming the seeds in {args.resume}")
        result = run_seeds(None, None, args.resume, resume=True, rounds=getattr(args, "rounds", None),
                           progress=not args.no_progress, after_run=hook)
    else:
        try:
            merged, seeds, reseed = _seed_settings(args)
            cfg = Config.from_dict(merged)
            out = _out_dir(args, cfg.algorithm)
            print(f"{cfg.algorithm} on {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), {cfg.model}, "
                  f"seeds {', '.join(map(str, seeds))}{' (data redrawn per seed)' if reseed else ''}; results -> {out}")
            result = run_seeds(cfg, seeds, out, reseed_data=reseed, progress=not args.no_progress, after_run=hook)
        except ValueError as e:
            raise _in_terms_of(args, e) from None
    return _seeds_done(result, args, result["summaries"])


def _cmd_compare_seeds(args) -> int:
    from .seeds import compare_seeds

    hook = _tb_hook(args)
    if args.resume:
        _resume_flags_check(args)
        print(f"resuming the seeds in {args.resume}")
        result = compare_seeds(None, None, None, args.resume, resume=True, rounds=getattr(args, "rounds", None),
                               progress=not args.no_progress, after_run=hook)
    else:
        try:
            cfg, algorithms, per = _compare_settings(args, seeds=True)
            out = _out_dir(args, "compare")
            print(f"comparing {', '.join(algorithms)} on {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), "
                  f"{cfg.model}, seeds {', '.join(map(str, args.seed_list))}; results -> {out}")
            result = compare_seeds(cfg, algorithms, args.seed_list, out, alg_opts=per, reseed_data=args.reseed,
                                   progress=not args.no_progress, after_run=hook)
        except ValueError as e:
            raise _in_terms_of(args, e) from None
    return _seeds_done(result, args, [s for per_seed in result["summaries"] for s in per_seed])


_SWEEP_RESUME_OK = ("command", "resume", "jobs", "no_progress", "formats", "no_plot", "band", "tensorboard", "select",
                    "argv", "algorithms", "out", "name", "config")


def cmd_sweep(args) -> int:
    """`sweep` (experiments/sweep.py): the grid's runs, then the table and the figures."""
    from .config import Config
    from .seeds import seed_list
    from .sweep import SELECT, SweepInterrupted, _read_sweep, parse_grid, run_sweep

    opts = dict(jobs=getattr(args, "jobs", None), select=getattr(args, "select", None))
    try:
        if args.resume:
            given = [k for k in vars(args) if k not in _SWEEP_RESUME_OK]
            given += [k for k in ("out", "name", "config", "algorithms") if getattr(args, k, None)]
            if given:
                raise SystemExit(f"--resume takes the sweep's settings from {args.resume}; only --jobs, --select, "
                                 f"--no-progress, --formats, --band, --tensorboard and --no-plot may be given (got "
                                 f"{', '.join('--' + g.replace('_', '-') for g in given)})")
            out = args.resume
            kw = dict(cfg=None, algorithms=None, grid=None, resume=True)
            print(f"resuming the sweep in {out}")
        else:
            merged = _merge(args, extra_keys=("algorithms", "seeds", "reseed_data", "grid", "select", "jobs", "optuna",
                                              "space"))
            grid = merged.pop("grid", None) or {}
            if not isinstance(grid, dict):
                raise ValueError(f"{args.config}: grid must be a table of KEY = [values] or \"log:LOW:HIGH:COUNT\"")
            grid = {**grid, **dict(getattr(args, "grid_items", []))}
            trials, space = merged.pop("optuna", None), merged.pop("space", None) or {}
            if not isinstance(space, dict):
                raise ValueError(f"{args.config}: space must be a table of KEY = \"log:LOW:HIGH\" (or float:, int:, "
                                 f"intlog:) or KEY = [choices]")
            space = {**space, **dict(getattr(args, "space_items", []))}
            if trials is not None and grid:
                raise ValueError("--optuna and --grid: give one (a random search over --space, or a grid)")
            if space and trials is None:
                raise ValueError("--space: only with --optuna N (the number of trials); a grid takes --grid")
            if trials is not None:
                from .optuna_search import parse_space

                if not space:
                    raise ValueError("--optuna: give the space to search with --space KEY=SPEC (e.g. --space "
                                     "alpha=log:1e-3:1), or a [space] table in --config")
                space = parse_space(space)
            elif not grid:
                raise ValueError("--grid: give at least one KEY=VALUES (e.g. --grid alpha=0.01,0.1), or a [grid] "
                                 "table in --config")
            else:
                grid = parse_grid(grid)
            algorithms = args.algorithms or merged.pop("algorithms", None)
            merged.pop("algorithms", None)
            if not algorithms:
                raise ValueError("-a/--algorithms: give the algorithm(s) to sweep (see `python -m python_algos "
                                 "algorithms`)")
            seeds = seed_list(merged.get("seed"), merged.pop("seeds", None))
            reseed = merged.pop("reseed_data", False)
            for k in ("jobs", "select"):
                if opts[k] is None:
                    opts[k] = merged.pop(k, None)
                merged.pop(k, None)
            if seeds:
                merged["seed"] = seeds[0]
            per = _split_alg_opts(merged.pop("alg_opts", {}) or {}, algorithms)
            cfg = Config.from_dict(merged)
            out = _out_dir(args, "sweep")
            over = (' x '.join(f'{k} ({len(v)})' for k, v in grid.items()) if trials is None else
                    f"{', '.join(space)} ({trials} Optuna trials)")
            print(f"sweep of {', '.join(algorithms)} over {over} on {cfg.dataset} ({cfg.partition}, "
                  f"N={cfg.num_clients}), {cfg.model}; results -> {out}")
            kw = dict(cfg=cfg, algorithms=algorithms, grid=grid, seeds=seeds, alg_opts=per, reseed_data=bool(reseed))
            if trials is not None:
                kw.update(grid=None, space=space, trials=trials)
        select = opts["select"]  # None: f_plus_h, or on resume what the sweep (a random search) was run with
        if "space" in kw:
            from .optuna_search import run_study

            result = run_study(kw.pop("cfg"), kw.pop("algorithms"), kw.pop("space"), kw.pop("trials"), kw.pop("seeds"),
                               out_dir=out, jobs=opts["jobs"] or 1, select=select or "f_plus_h",
                               tensorboard=bool(getattr(args, "tensorboard", False)),
                               **{k: v for k, v in kw.items() if k != "grid"})
        elif kw.get("resume") and "optuna" in _read_sweep(out):  # a random search: its trials continue
            from .optuna_search import run_study

            result = run_study(None, None, None, None, out_dir=out, jobs=opts["jobs"] or 1, select=select,
                               resume=True, tensorboard=bool(getattr(args, "tensorboard", False)))
        else:
            result = run_sweep(out_dir=out, jobs=opts["jobs"] or 1, select=select,
                               tensorboard=bool(getattr(args, "tensorboard", False)), **kw)
    except SweepInterrupted as e:
        print(e.table)
        print(f"\ninterrupted: resume with: {e.resume_command}", file=sys.stderr)
        return 130
    except ValueError as e:
        raise _in_terms_of(args, e) from None
    print(result["table"])
    print(f"results written to {out}")
    if getattr(args, "tensorboard", False):
        print(f"TensorBoard events: tensorboard --logdir {shlex.quote(out)}")
    if not getattr(args, "no_plot", False):
        from .plotting import plot_sweep
        from .sweep import _read_sweep

        try:
            select = result["select"]
            files = plot_sweep(out, result, _read_sweep(out)["grid"], SELECT[select][0], select, formats=args.formats,
                               band=getattr(args, "band", "std"))
        except RuntimeError as e:  # no matplotlib
            print(f"no figure: {e}")
            files = []
        for f in files:
            print(f"figure: {f}")
    return 0


def cmd_demo(args) -> int:
    from . import launch
    from .compare import compare_experiments, comparison_table
    from .folders import default_out_dir

    t0 = time.perf_counter()
    cfg = _demo_config()
    if args.rounds is not None:
        cfg = cfg.replace(rounds=args.rounds)
    main = launch.is_main()
    say = print if main else _quiet  # under torchrun rank 0 alone prints
    out = launch.agree_on((args.out or default_out_dir("demo")) if main else None, cfg.device)  # rank 0's folder
    say(f"fedkernels demo: sparse logistic regression (d = 100, 10-sparse ground truth), 10 heterogeneous "
        f"clients, h = {cfg.reg_strength:g}·||x||_1, full gradients, K = {cfg.local_steps}, T = {cfg.rounds}")
    summaries = compare_experiments(cfg, list(DEMO_ALGORITHMS), out, progress=not args.no_progress and main, log=say)
    if not main:
        return 0
    print()
    print(comparison_table(summaries, cfg.lr * cfg.local_steps))
    print()
    print("f+h: final objective; ‖G_s‖²: stationarity (prox-gradient mapping, common s = lr·K); sparsity: "
          "fraction of exact zeros;\nsupport F1: recovered non-zero pattern vs the ground truth. FedAvg ignores h "
          "(smooth method), so its model is dense.")
    print(f"results written to {out}  (more figures: python -m python_algos plot {shlex.quote(out)})")
    _figure(out, args)
    print(f"demo finished in {time.perf_counter() - t0:.1f} s")
    return 0


def _figure(folder: str, args) -> None:
    """The run's / comparison's overview figure in its folder, and its path; a missing matplotlib
    is a note, not a failure (the results are written)."""
    if getattr(args, "no_plot", False):
        return
    from .plotting import plot_runs

    try:
        files = plot_runs([folder], out_dir=folder, per_metric=False, formats=args.formats,
                          band=getattr(args, "band", "std"))
    except RuntimeError as e:  # no matplotlib
        print(f"no figure: {e}")
        return
    for f in files:
        print(f"figure: {f}")


def cmd_plot(args) -> int:
    from .plotting import plot_runs

    files = plot_runs(args.runs, out_dir=args.out, metrics=args.metrics, x_axes=args.x, title=args.title,
                      formats=args.formats, f_star=args.f_star, setup=not args.no_setup, band=args.band)
    for f in files:
        print(f)
    return 0


def cmd_algorithms(args) -> int:
    from ..algorithms.registry import markdown_table

    print(markdown_table())
    return 0


def _showwarning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv or ["demo"])
    args.argv = argv
    if args.command is None:
        parser.print_help()
        return 2
    from . import launch
    from .data import DataNotFoundError

    handler = {"run": cmd_run, "compare": cmd_compare, "sweep": cmd_sweep, "demo": cmd_demo, "plot": cmd_plot,
               "algorithms": cmd_algorithms}[args.command]
    from .run import Interrupted

    with warnings.catch_warnings():
        warnings.showwarning = _showwarning
        if launch.rank() != 0:  # rank 0 alone reports (every rank would print the same warnings)
            warnings.simplefilter("ignore")
        try:
            if getattr(args, "tensorboard", False):  # before any run: a missing package is not found at the end
                from .tensorboard import check_available

                check_available()
            code = handler(args)
        except (DataNotFoundError, FileNotFoundError, ValueError, RuntimeError) as e:
            where = f" on rank {launch.rank()} of {launch.world_size()}" if launch.distributed() else ""
            print(f"error{where}: {e}", file=sys.stderr)
            launch.finish(ok=False)
            return 1
        except Interrupted as e:  # Ctrl-C during a run: its summary is written
            if launch.is_main():
                print(f"\ninterrupted: {e.summary['message']}; the summary so far is in "
                      f"{os.path.join(e.summary['out_dir'], 'summary.json')}\nresume with: "
                      f"{e.summary['resume_command']}", file=sys.stderr)
            launch.leave_interrupted()
            return 130
        except KeyboardInterrupt:  # before a run folder existed, or while it was being finished
            if launch.is_main():
                print("\ninterrupted", file=sys.stderr)
            launch.leave_interrupted()
            return 130
        launch.finish()
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
