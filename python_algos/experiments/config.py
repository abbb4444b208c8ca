"""The experiment configuration (:class:`Config`): every setting declared once, and its checks.

    cfg = Config.from_dict({"algorithm": "fedcanon", "lr": 0.05, "rounds": 100})   # checks every value
    cfg.check()                                                                  # raises ConfigError

Each field of :class:`Config` is declared with :func:`setting`: its command-line flag (and short
alias, ``-K``), how the flag's text is read, its check (type and bounds), its help text and its
resume rule. Everything else is derived from that declaration (:data:`SETTINGS`): the command
line's flags (:mod:`.cli.parser`), the config-file keys (the field names), the flags a ``--resume``
accepts and the settings a checkpoint must match (each setting's ``on_resume``), and the checks of a
value a sweep gives a setting (:meth:`Config.check` of the point's config).

A bad value raises :class:`ConfigError` naming the setting the way the user gave it: the flag as
typed (``-K 0: ...``), or the config file and key (``c.toml: rounds = '2': ...``) inside
:func:`named_as` (the command line enters it with what it parsed), else the setting's long flag. The
checks here are the ones that need nothing but the values; :func:`~.prepare.prepare_run` adds those
that need the data, the algorithm or the machine.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import math
import numbers
import types
from typing import Callable, Dict, Iterator, Mapping, Optional

import fedkernels.regularizers as fkr

from ..algorithms.registry import ALGORITHMS, algorithm_entry, algorithm_names
from ..clients import EXECUTORS
from ..clients.state_plan import MODES as STATE_MODES
from ..data import DATASETS, PARTITIONS, check_data_options
from ..data.datasets import options_help
from ..data.standardize import MODES
from ..system.threads import MAX_THREADS
from .models import MODELS
from .regularizer_specs import REGULARIZERS
from .values import parse_batch, parse_float, parse_int, parse_option, parse_reg_param, parse_seed

__all__ = ["Config", "ConfigError", "Setting", "SETTINGS", "setting", "flag", "named_as", "FromFile",
           "check_given", "RESULT_KEYS", "MAX_THREADS",
           "MAX_SEED", "MAX_COUNT", "show_value"]

# Bounds of the integer settings. A count (rounds, local steps, clients, samples per batch, ...) above
# 2**31 - 1 would overflow the 32-bit sizes of torch's and OpenMP's loops and would not finish anyway;
# seeds go to torch.manual_seed, which takes at most a signed 64-bit integer. Threads: MAX_THREADS
# (python_algos/system/threads.py, with its reason).
MAX_COUNT = 2**31 - 1
MAX_SEED = 2**63 - 1

# How a --resume treats a setting (the `on_resume` of :func:`setting`):
#   fixed           part of the result: taken from the folder, a checkpoint must match it, its flag is refused
#   kept            changes how fast, not what (executor, threads): taken from the folder, its flag refused
#                   with the reason the field declares (``why_kept``: the bits of the resumed run would differ)
#   may_change      its flag is accepted by every --resume (rounds: extend the run)
#   run_may_change  accepted by `run --resume` alone (checkpoint_every: when a checkpoint is written never
#                   changes what a round computes; a comparison, seeds or Flower resume keeps the folder's)
RESUME_RULES = ("fixed", "kept", "may_change", "run_may_change")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting of a run, as a :class:`Config` field declares it (see :func:`setting`)."""

    name: str  # the Config field and the config-file key
    flag: str  # the long flag, --local-steps
    short: Optional[str]  # -K
    aliases: tuple  # other long spellings (--kappa)
    help: Optional[str]
    check: Callable  # value -> None, or the rule the value breaks
    parse: Callable  # the flag's text -> value; raises ValueError(rule)
    on_resume: str
    why_kept: Optional[str]
    group: str  # the --help section
    options: bool  # a table of KEY=VALUE entries, one per repeated flag
    choices: Optional[tuple]
    metavar: Optional[str]
    single_run: bool  # a flag of `run` only (compare and sweep take several: -a/--algorithms)

    @property
    def flags(self) -> tuple:
        """Every spelling of the flag, short first (argparse's order)."""
        return tuple(f for f in (self.short, self.flag, *self.aliases) if f)


def setting(default, *, flag: Optional[str] = None, short: Optional[str] = None, aliases: tuple = (),
            help: Optional[str] = None, check: Callable, parse: Optional[Callable] = None, on_resume: str = "fixed",
            why_kept: Optional[str] = None, group: str = "run", options: bool = False,
            choices: Optional[tuple] = None, metavar: Optional[str] = None, single_run: bool = False):
    """A :class:`Config` field with its declaration as metadata: ``flag`` (default ``--NAME`` with
    ``-`` for ``_``), ``short`` alias, ``parse`` (the flag's text to a value), ``check`` (a value to
    None or the rule it breaks), ``help``, ``on_resume`` (one of :data:`RESUME_RULES`), and for a
    table of options (``options=True``) one ``KEY=VALUE`` per repeated flag."""
    if on_resume not in RESUME_RULES:
        raise ValueError(f"on_resume must be one of {', '.join(RESUME_RULES)}, got {on_resume!r}")
    parse = parse or (parse_option if options else str)  # the flag's text as it is, or its KEY=VALUE entry
    meta = dict(flag=flag, short=short, aliases=tuple(aliases), help=help, check=check, parse=parse,
                on_resume=on_resume, why_kept=why_kept, group=group, options=options, choices=choices,
                metavar=metavar or ("KEY=VALUE" if options else None), single_run=single_run)
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata={"setting": meta})
    return dataclasses.field(default=default, metadata={"setting": meta})


def _declared(field: dataclasses.Field) -> Setting:
    meta = dict(field.metadata["setting"])
    meta["flag"] = meta["flag"] or "--" + field.name.replace("_", "-")
    return Setting(name=field.name, **meta)


# --- how the user named each setting ---------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class FromFile:
    """A setting whose value came from config file ``path`` (errors say ``path: key = value: rule``)."""

    path: str


_NO_NAMES: Mapping = types.MappingProxyType({})  # read-only: the default is shared by every context
_NAMES: contextvars.ContextVar[Mapping] = contextvars.ContextVar("setting_names", default=_NO_NAMES)


@contextlib.contextmanager
def named_as(names: Mapping) -> Iterator[None]:
    """Within it, a :class:`ConfigError` about setting ``key`` names it as ``names[key]``: the flag
    as the user typed it (``"-K"``) or :class:`FromFile`. ``names`` is read when an error is raised,
    so the command line may add the config file's keys once it has read the file."""
    token = _NAMES.set(names)
    try:
        yield
    finally:
        _NAMES.reset(token)


class ConfigError(ValueError):
    """A configuration value breaks a rule. ``key`` is the Config field, ``value`` what was given.

    The message names the setting as the user gave it (:func:`named_as`); ``flag_text`` replaces
    ``FLAG VALUE`` when the value came from several flags (``--reg-opt a=1 --reg-opt b=2``)."""

    def __init__(self, key: str, value, rule: str, flag_text: Optional[str] = None):
        self.key, self.value, self.rule = key, value, rule
        name = _NAMES.get().get(key)
        if isinstance(name, FromFile):
            super().__init__(self._file_text(name.path))
        else:
            super().__init__(f"{flag_text or f'{name or flag(key)} {show_value(value)}'}: {rule}")

    def _file_text(self, path: str) -> str:
        """Worded for a value from config file ``path``. A string given for a key that takes no string
        keeps its quotes there (``rounds = '2'``): in a file, unlike on the command line, the quotes
        are what made it a string, and without them ``rounds = 2: must be an integer`` reads as a
        contradiction."""
        # option tables (reg_opts = {...}) are shown as the KEY=VALUE text the error rendered: no quotes
        text_key = (self.key == "regularizers" or self.key.endswith("_opts")
                    or "str" in str(Config.__annotations__.get(self.key, "")))  # text: this module's annotations
        shown = repr(self.value) if isinstance(self.value, str) and not text_key else show_value(self.value)
        return f"{path}: {self.key} = {shown}: {self.rule}"

    def in_file(self, path: str) -> "ConfigError":
        """The same error, worded for a value that came from config file ``path``."""
        e = ConfigError(self.key, self.value, self.rule)
        e.args = (e._file_text(path),)
        return e


def flag(key: str) -> str:
    """The long command-line flag of Config field ``key`` (``local_steps`` -> ``--local-steps``, ``alg_opts``
    -> ``--alg-opt``), or of another argparse destination (``--DEST`` with ``-`` for ``_``)."""
    s = SETTINGS.get(key)
    return s.flag if s is not None else "--" + key.replace("_", "-")


def show_value(value) -> str:
    """A value as the user typed it (strings unquoted unless empty or odd, floats in %g)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return value if value and value.isprintable() and " " not in value else repr(value)
    return repr(value) if value is not None else "null"


# --- value checks: each returns None if fine, else the rule that was broken ----------------------------------- #


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _got(v) -> str:
    """', got a string' for a string where a number belongs ('2' in a config file, or from Python)."""
    return ", got a string" if isinstance(v, str) else ""


def _int(lo: int, none_ok: bool = False, what: str = "", hi: int = MAX_COUNT):
    def check(v):
        if v is None and none_ok:
            return None
        if not _is_int(v) or v < lo:
            return f"must be an integer >= {lo}{' or null' if none_ok else ''}{what}{_got(v)}"
        if v > hi:
            return f"must be an integer in [{lo}, {hi}]{what}"
        return None
    return check


def _num(lo: float, open_lo: bool = True, hi: Optional[float] = None, open_hi: bool = False, none_ok: bool = False,
         what: str = ""):
    def check(v):
        if v is None and none_ok:
            return None
        ok = (isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
              and (v > lo if open_lo else v >= lo))
        if ok and hi is not None:
            ok = v < hi if open_hi else v <= hi
        if not ok:
            rng = f"{'>' if open_lo else '>='} {lo:g}" if hi is None else \
                f"in {'(' if open_lo else '['}{lo:g}, {hi:g}{')' if open_hi else ']'}"
            return f"must be a finite number {rng}{' or null' if none_ok else ''}{what}{_got(v)}"
        return None
    return check


def _str(choices=None, none_ok: bool = False, prefix_ok: tuple = ()):
    def check(v):
        if v is None and none_ok:
            return None
        if not isinstance(v, str):
            return "must be a string" + (f", one of {', '.join(choices)}" if choices else "")
        if choices is not None and v not in choices and not v.startswith(prefix_ok):
            return f"must be one of {', '.join(choices)}"
        return None
    return check


# The executor of a run's clients in each process. "distributed" is not a value here: a run becomes
# distributed by how it is launched (torchrun, --workers), and then --executor names the executor
# that each rank runs its share of the clients with.
_RUN_EXECUTORS = ("auto", *(e for e in EXECUTORS if e != "distributed"))


def _executor(v):
    if v == "distributed":
        return (f"must be one of {', '.join(_RUN_EXECUTORS)}; to split the clients over processes, launch the run "
                f"with --workers P or torchrun (--executor then names the executor of each process's clients)")
    return _str(_RUN_EXECUTORS)(v)


def _mapping(v):
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        return "must be a table of KEY=VALUE options"
    return None


def _reg_table(v):
    """``regularizers``: PATTERN -> "name" or {reg = "name", option = value, ...} (the table's order
    is kept: the first matching pattern decides a parameter)."""
    if not isinstance(v, dict):
        return 'must be a table of PATTERN = "name" or {reg = "name", ...} entries'
    for k, spec in v.items():
        if not isinstance(k, str) or not k:
            return f"keys must be parameter names or patterns (non-empty strings), got {k!r}"
        if spec is None or isinstance(spec, str):
            continue
        if not isinstance(spec, dict) or not isinstance(spec.get("reg"), str):
            return (f'{k} = {show_value(spec)}: each entry must be a regularizer name ("none", "l1", ...) or a table '
                    f'with a "reg" name and its options, e.g. {{reg = "group_lasso", lam = 1e-2, groups = "cols"}}')
        if not all(isinstance(o, str) for o in spec):
            return f"{k}: option names must be strings"
    return None


_REGISTRIES = {"algorithm": tuple(ALGORITHMS), "dataset": tuple(DATASETS), "partition": tuple(PARTITIONS),
               "model": tuple(MODELS), "reg": tuple(REGULARIZERS)}


def _reference_fault(key: str, ref: str):
    """None if ``ref`` imports and is a penalty (``reg``) / an algorithm class (``algorithm``), else why not."""
    try:
        if key == "reg":
            fkr.regularizer_entry(ref)
        else:
            algorithm_entry(ref)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def _registry(key: str):
    """The check of a name from a registry (``--algorithm``, ``--dataset``, ...), case-insensitive."""
    names = _REGISTRIES[key]

    def check(v):
        if key in ("reg", "algorithm") and isinstance(v, str) and ":" in v:  # a user's class: package.module:Class
            return _reference_fault(key, v)
        if key == "dataset" and isinstance(v, str) and v.startswith("folder:"):  # your own files, one per client
            return None if v[len("folder:"):] else "folder:PATH needs the folder's path"
        if key == "dataset" and isinstance(v, str) and v.lower().startswith("sklearn:") and v.lower() not in names:
            return f"unknown scikit-learn data set; valid: {', '.join(c for c in names if c.startswith('sklearn:'))}"
        if key == "reg" and isinstance(v, str) and v.lower() == "group_lasso":
            return ("group_lasso needs a parameter's shape (its rows or columns are the groups): give it per "
                    "parameter, e.g. --reg-param 'net.0.weight=group_lasso,lam=0.01,groups=cols'")
        if isinstance(v, str) and v.lower() in names:
            return None
        # not a built-in: the names installed packages register (read only now: it scans the installed packages)
        valid = algorithm_names() if key == "algorithm" else names
        if not isinstance(v, str) or v.lower() not in valid:
            return f"unknown {key}; valid: {', '.join(valid)}" + (
                " or your own class as package.module:Class" if key in ("reg", "algorithm") else "")
        return None
    return check


@dataclasses.dataclass
class Config:
    """Everything that defines a run. Each field declares its command-line flag, its check, its help
    text and its resume rule (:func:`setting`); the flags, the config-file keys and the resume rules
    are derived from these declarations (:data:`SETTINGS`)."""

    # algorithm (python_algos.algorithms.registry): built from (lr, local_steps), then alg_opts overrides
    algorithm: str = setting("fedcanon", short="-a", group="algorithm", single_run=True, check=_registry("algorithm"),
                             help="registry name (see `algorithms`)")
    lr: float = setting(0.05, group="algorithm", parse=parse_float, check=_num(0, what=" (the local step size)"),
                        help="local step size (mapped per algorithm, see registry)")
    local_steps: int = setting(10, short="-K", group="algorithm", parse=parse_int, check=_int(1),
                               help="local steps per round")
    alg_opts: dict = setting({}, flag="--alg-opt", group="algorithm", options=True, check=_mapping,
                             help="override a hyper-parameter, e.g. alpha=0.1")
    # data (python_algos.data)
    dataset: str = setting("sparse_logistic", group="data", check=_registry("dataset"),
                           help="sparse_logistic | sparse_linear | synthetic | image_like | mnist | fashion_mnist | "
                                "cifar10 | a9a | libsvm | femnist | sklearn:NAME (scikit-learn's bundled digits, "
                                "breast_cancer, wine, iris, diabetes; needs scikit-learn) | folder:PATH (your own "
                                "data: one .csv/.tsv/.npz/.pt/.libsvm file per client, --partition natural)")
    data_dir: Optional[str] = setting(None, group="data", check=_str(none_ok=True),
                                      help="folder holding the dataset files (never downloaded)")
    data_opts: dict = setting({}, flag="--data-opt", group="data", options=True, check=_mapping,
                              help="an option of the data set, typed and bounded as its generator / loader's "
                                   "signature declares: " + options_help())
    test_fraction: float = setting(0.2, group="data", parse=parse_float,
                                   check=_num(0, open_lo=False, hi=1, open_hi=True))
    standardize: Optional[str] = setting(None, group="data", choices=MODES, check=_str(MODES, none_ok=True),
                                         help="scale each feature by the pooled mean and std (global: from each "
                                              "client's count, sum and sum of squares), each client's own (local) or "
                                              "not (none); default: global for folder:PATH, none for the others")
    partition: str = setting("iid", group="data",
                             choices=("iid", "dirichlet", "shards", "writers", "natural", "cyclic"),
                             check=_registry("partition"))
    num_clients: int = setting(10, short="-N", group="data", parse=parse_int, check=_int(1))
    eta: float = setting(0.5, group="data", parse=parse_float, check=_num(0, what=" (the Dirichlet concentration)"),
                         help="Dirichlet concentration Dir(eta)")
    min_size: Optional[int] = setting(None, group="data", parse=parse_int, check=_int(0, none_ok=True),
                                      help="Dirichlet: minimum samples per client")
    shards_per_client: int = setting(1, group="data", parse=parse_int, check=_int(1))
    samples_per_client: Optional[int] = setting(None, group="data", parse=parse_int, check=_int(1, none_ok=True),
                                                help="--partition cyclic: rows per client (default: rows // N, at "
                                                     "least 1); its clients are built when sampled")
    participation: Optional[float] = setting(None, group="data", parse=parse_float,
                                             check=_num(0, hi=1, none_ok=True, what=" (a fraction of the clients)"),
                                             help="fraction of clients sampled per round (partial participation; "
                                                  "algorithms that support it)")
    clients_per_round: Optional[int] = setting(None, group="data", parse=parse_int, check=_int(1, none_ok=True),
                                               help="number of clients sampled per round (instead of --participation)")
    # model (python_algos.experiments.models)
    model: str = setting("linear", group="model and regularizer", check=_registry("model"),
                         help="linear | mlp | cnn | sigmoid_net | resnet18 | resnet34 | resnet50 | resnet101")
    model_opts: dict = setting({}, flag="--model-opt", group="model and regularizer", options=True, check=_mapping,
                               help="e.g. hidden=64 (sigmoid_net) or hidden=[128,64] (mlp)")
    # regularizer h
    reg: str = setting("l1", group="model and regularizer", check=_registry("reg"),
                       help="zero | l1 | elastic_net | mcp | scad | box | nonneg | l2ball")
    reg_strength: float = setting(1e-3, aliases=("--kappa",), group="model and regularizer", parse=parse_float,
                                  check=_num(0, open_lo=False),
                                  help="a penalty's weight: kappa (l1), l1 weight (elastic_net), lambda (mcp, scad); "
                                       "default 1e-3. The constraints (box, nonneg, l2ball) have none: giving one is "
                                       "an error (zero ignores it)")
    reg_opts: dict = setting({}, flag="--reg-opt", group="model and regularizer", options=True, check=_mapping,
                             help="the regularizer's options (repeatable): gamma=3 (mcp), a=3.7 (scad), l2=... "
                                  "(elastic_net; default: the l1 weight), lo=-1 hi=1 (box), radius=1 (l2ball); the "
                                  "values shown are the defaults. An unknown key is an error, and so is the "
                                  "strength's own name (kappa=, lam=, l1=): the strength is --reg-strength")
    # per-parameter h (PATTERN -> name or {reg = name, options}; non-empty: replaces reg / reg_opts)
    regularizers: dict = setting({}, flag="--reg-param", group="model and regularizer", parse=parse_reg_param,
                                 options=True, check=_reg_table, metavar="PATTERN=SPEC",
                                 help="one penalty per parameter, instead of --reg (repeatable; config file: a "
                                      "[regularizers] table): PATTERN is a parameter name or fnmatch pattern, SPEC a "
                                      "name (none, l1, ..., group_lasso) with KEY=VALUE options, e.g. "
                                      "'net.0.weight=group_lasso,lam=0.01,groups=cols' '*.bias=none' "
                                      "'*=l1,kappa=1e-4'. An exact name wins, then the first matching pattern in "
                                      "order; unmatched parameters get no penalty")
    # run
    rounds: int = setting(100, short="-T", group="run", parse=parse_int, check=_int(0), on_resume="may_change")
    batch_size: Optional[int] = setting(None, short="-B", group="run", parse=parse_batch,
                                        check=_int(1, none_ok=True, what=" (null: full gradients)"),
                                        help="minibatch size (>= 1), or 'full': full local gradients (the default)")
    seed: int = setting(0, group="run", parse=parse_seed, check=_int(0, hi=MAX_SEED),
                        help="the random seed (model initialization, sampling, data); a comma-separated list "
                             "(--seed 1,2,3) runs one independent run per seed")
    # the seed of the data alone (generated samples, train/test split, client partition); None: ``seed``.
    # Independent seeds of one experiment (``--seeds``) keep it fixed, so they differ in the model's
    # initialization and the sampling, not in the problem, unless ``--reseed-data`` is given.
    data_seed: Optional[int] = setting(None, group="run", parse=parse_int,
                                       check=_int(0, none_ok=True, hi=MAX_SEED, what=" (null: the data follow --seed)"),
                                       help="the seed of the data alone (samples, train/test split, partition); "
                                            "default: --seed")
    metrics_every: int = setting(1, group="run", parse=parse_int, check=_int(0, what=" (0: timings only)"))
    metric_step: Optional[float] = setting(None, group="run", parse=parse_float, check=_num(0, none_ok=True),
                                           help="step s of ||G_s||²")
    device: str = setting("cpu", group="run", check=_str(("cpu", "cuda", "cuda:K", "auto"), prefix_ok=("cuda:",)),
                          help="cpu | cuda | cuda:K | auto")
    dtype: str = setting("float32", group="run", choices=("float32", "float64"), check=_str(("float32", "float64")))
    checkpoint_every: int = setting(10, group="run", parse=parse_int,
                                    check=_int(0, what=" (0: only at the start and the end)"),
                                    on_resume="run_may_change",
                                    help="checkpoint every N rounds (default 10; 0: only at the start and the end)")
    # how long this invocation may run its rounds: it stops after the first round that ends past the budget,
    # checkpointed (status "stopped"), and --resume continues it; when it stops changes no round's result
    time_budget: Optional[float] = setting(None, group="run", parse=parse_float,
                                           check=_num(0, none_ok=True, what=" (seconds)"), on_resume="run_may_change",
                                           metavar="SECONDS",
                                           help="stop after the first round that ends more than SECONDS after the "
                                                "rounds started, with a checkpoint of that round (summary status "
                                                "'stopped'; --resume continues); default: no limit")
    # where the per-client stacks live (clients/state_plan.py): changes memory, not a bit of the result
    state: str = setting("dense", group="run", choices=STATE_MODES, check=_str(STATE_MODES), on_resume="kept",
                         why_kept="a checkpoint holds the client rows in the form its run kept them (a dense stack or "
                                  "a store's written rows), so a resume keeps the folder's --state",
                         help="where per-client state (SCAFFOLD's c_i, FedDR's stacks) lives: dense [N, d] stacks, "
                              "ram (only the rows written), disk (the same in files under the run folder's state/; its "
                              "checkpoints log the rows changed), auto (by the estimate printed with the setup); "
                              "ram/auto need --clients-per-round or --participation (docs/population.md)")
    # execution (changes speed, not the result beyond floating-point summation order)
    executor: str = setting("auto", group="run", choices=_RUN_EXECUTORS, check=_executor, on_resume="kept",
                            why_kept="another executor runs the same algorithm with another floating-point summation "
                                     "order, so the resumed run would not end with the bits of an uninterrupted one (a "
                                     "resume keeps the folder's executor; an `auto` run keeps the executor it started "
                                     "on)",
                            help="how client work runs: one client after another, or all clients vectorized "
                                 "(default: auto)")
    threads: Optional[int] = setting(None, group="run", parse=parse_int, check=_int(1, none_ok=True, hi=MAX_THREADS),
                                     on_resume="kept",
                                     why_kept="another number of threads changes how torch splits its sums and matrix "
                                              "products, so the resumed run would not end with the bits of an "
                                              "uninterrupted one",
                                     help=f"torch / fedkernels threads (default: 1 for small models, see "
                                          f"docs/executors.md "
                                          f"'Threads'); at most {MAX_THREADS}, more than the hardware threads of any "
                                          f"current machine (thousands of threads make OpenMP fail or crash)")

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(unknown_keys_text(unknown, names))
        cfg = cls(**d)
        cfg.check()
        return cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **kw) -> "Config":
        return dataclasses.replace(self, **kw)

    def check(self) -> None:
        """Raise :class:`ConfigError` for the first value of a wrong type or out of range, then for the
        values that break a rule together."""
        for s in SETTINGS.values():
            v = getattr(self, s.name)
            rule = s.check(v)
            if rule:
                raise ConfigError(s.name, v, rule)
        bad = check_data_options(self.dataset, self.data_opts)
        if bad is not None:
            key, rule = bad
            raise ConfigError("data_opts", f"{key}={show_value(self.data_opts[key])}", rule)
        if not math.isfinite(self.lr * self.local_steps):
            # lr·K is the default step s of the stationarity metric and the step of several algorithms
            # (FedCanon's alpha, FedNMap's lam, ...): an infinite one fails inside a kernel, naming no flag
            raise ConfigError("lr", self.lr, f"lr × local steps = {self.lr:g} × {self.local_steps} is not a finite "
                              f"number (it is the step of the stationarity metric and of several algorithms)")
        if self.participation is not None and self.clients_per_round is not None:
            raise ConfigError("clients_per_round", self.clients_per_round,
                              f"give {flag('participation')} (a fraction) or {flag('clients_per_round')} "
                              f"(a count), not both")


def nearest(word: str, candidates) -> Optional[str]:
    """The candidate closest to a misspelt ``word`` (difflib), or None when none is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_keys_text(unknown, valid) -> str:
    """'unknown key(s) lrr; valid keys: ...; did you mean lr?' (the caller puts the file's name in front)."""
    unknown = sorted(map(str, unknown))
    guesses = [f"{u} -> {g}" if len(unknown) > 1 else g for u in unknown for g in [nearest(u, valid)] if g]
    guess = f"; did you mean {', '.join(guesses)}?" if guesses else ""
    return f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(valid))}{guess}"


# The partition settings and the partitions that read them (data.federate). The others ignore them,
# so a value given with another partition (--eta 0.1 without --partition dirichlet) would change
# nothing, silently: check_given refuses it.
PARTITION_KEYS = {"eta": ("dirichlet", "writers"), "min_size": ("dirichlet", "writers"),
                  "shards_per_client": ("shards",), "samples_per_client": ("cyclic",)}


def check_given(given: dict) -> None:
    """Refuse settings the user gave (``given``: the command line's flags and the config file's keys,
    not the defaults) that the run would ignore: a partition setting that ``--partition`` does not use.

    Not part of :meth:`Config.check`: a Config holds every field, given or default, and the
    config.json of a run made before this check may record such a value; it must still load and
    resume (the value changed nothing then either)."""
    partition = given.get("partition", Config.partition)
    if not isinstance(partition, str) or partition.lower() not in _REGISTRIES["partition"]:
        return  # Config.check names the bad partition
    for key, users in PARTITION_KEYS.items():
        if key in given and partition.lower() not in users:
            raise ConfigError(key, given[key], f"applies only to --partition {' or '.join(users)} "
                                               f"(got {partition})")


SETTINGS: Dict[str, Setting] = {f.name: _declared(f) for f in dataclasses.fields(Config)}

# The settings a checkpoint must match (the result of a round depends on them). The others change how
# fast a run goes or for how long, and may differ from the checkpoint's (``rounds`` may grow, see
# :mod:`.prepare`; executor and threads are kept from config.json by a resume).
RESULT_KEYS = tuple(k for k, s in SETTINGS.items() if s.on_resume == "fixed")
