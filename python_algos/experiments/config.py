"""The experiment configuration (:class:`Config`) and the checks of its values.

    cfg = Config.from_dict({"algorithm": "fedcanon", "lr": 0.05, "rounds": 100})   # checks every value
    cfg.check()                                                                  # raises ConfigError

Field names are the command line's flags (``local_steps`` is ``--local-steps``) and the keys of a
TOML / YAML / JSON config file. A bad value raises :class:`ConfigError` naming the flag and the
value the user wrote (``--lr -0.1: ...``), never an internal name or a mapped value, so the
command line can say it in the user's terms (it rewrites the prefix for values that came from a
config file). The checks here are the ones that need nothing but the values;
:func:`~.prepare.prepare_run` adds those that need the data, the algorithm or the machine.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Optional

from ..clients import EXECUTORS

__all__ = ["Config", "ConfigError", "flag", "check_given", "RESULT_KEYS", "EXECUTION_KEYS"]


class ConfigError(ValueError):
    """A configuration value breaks a rule. ``key`` is the Config field, ``value`` what was given."""

    def __init__(self, key: str, value, rule: str):
        self.key, self.value, self.rule = key, value, rule
        super().__init__(f"{flag(key)} {_show(value)}: {rule}")

    def in_file(self, path: str) -> "ConfigError":
        """The same error, worded for a value that came from config file ``path``. A string given for
        a key that takes no string keeps its quotes there (``rounds = '2'``): in a file, unlike on the
        command line, the quotes are what made it a string, and without them
        ``rounds = 2: must be an integer`` reads as a contradiction."""
        e = ConfigError(self.key, self.value, self.rule)
        # option tables (reg_opts = {...}) are shown as the KEY=VALUE text the error rendered: no quotes
        text_key = (self.key == "regularizers" or self.key.endswith("_opts")
                    or "str" in str(_field_types().get(self.key, "")))
        shown = repr(self.value) if isinstance(self.value, str) and not text_key else _show(self.value)
        e.args = (f"{path}: {self.key} = {shown}: {self.rule}",)
        return e




def _field_types() -> dict:
    """Config field -> its annotation (text: this module has ``from __future__ import annotations``)."""
    return {f.name: f.type for f in dataclasses.fields(Config)}


def flag(key: str) -> str:
    """The command-line flag of Config field ``key`` (``local_steps`` -> ``--local-steps``)."""
    if key == "regularizers":
        return "--reg-param"
    if key.endswith("_opts"):
        return "--" + key[: -len("_opts")].replace("_", "-") + "-opt"
    return "--" + key.replace("_", "-")


def _show(value) -> str:
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


def _is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _got(v) -> str:
    """', got a string' for a string where a number belongs ('2' in a config file, or from Python)."""
    return ", got a string" if isinstance(v, str) else ""


def _int(lo: int, none_ok: bool = False, what: str = ""):
    def check(v):
        if v is None and none_ok:
            return None
        if not _is_int(v) or v < lo:
            return f"must be an integer >= {lo}{' or null' if none_ok else ''}{what}{_got(v)}"
        return None
    return check


def _num(lo: float, open_lo: bool = True, hi: Optional[float] = None, open_hi: bool = False, none_ok: bool = False,
         what: str = ""):
    def check(v):
        if v is None and none_ok:
            return None
        ok = _is_num(v) and math.isfinite(v) and (v > lo if open_lo else v >= lo)
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
            return (f'{k} = {_show(spec)}: each entry must be a regularizer name ("none", "l1", ...) or a table '
                    f'with a "reg" name and its options, e.g. {{reg = "group_lasso", lam = 1e-2, groups = "cols"}}')
        if not all(isinstance(o, str) for o in spec):
            return f"{k}: option names must be strings"
    return None


def _choices():  # imported late: the registries pull in torch and the algorithm modules
    from ..algorithms.registry import ALGORITHMS
    from .data import DATASETS, PARTITIONS
    from .models import MODELS
    from .regularizer_specs import REGULARIZERS

    return {"algorithm": tuple(ALGORITHMS), "dataset": tuple(DATASETS), "partition": tuple(PARTITIONS),
            "model": tuple(MODELS), "reg": tuple(REGULARIZERS)}


_RULES = {
    "lr": _num(0, what=" (the local step size)"),
    "local_steps": _int(1),
    "alg_opts": _mapping,
    "data_dir": _str(none_ok=True),
    "data_opts": _mapping,
    "test_fraction": _num(0, open_lo=False, hi=1, open_hi=True),
    "num_clients": _int(1),
    "eta": _num(0, what=" (the Dirichlet concentration)"),
    "min_size": _int(0, none_ok=True),
    "shards_per_client": _int(1),
    "participation": _num(0, hi=1, none_ok=True, what=" (a fraction of the clients)"),
    "clients_per_round": _int(1, none_ok=True),
    "model_opts": _mapping,
    "reg_strength": _num(0, open_lo=False),
    "reg_opts": _mapping,
    "regularizers": _reg_table,
    "rounds": _int(0),
    "batch_size": _int(1, none_ok=True, what=" (null: full gradients)"),
    "seed": _int(0),
    "data_seed": _int(0, none_ok=True, what=" (null: the data follow --seed)"),
    "metrics_every": _int(0, what=" (0: timings only)"),
    "metric_step": _num(0, none_ok=True),
    "device": _str(("cpu", "cuda", "cuda:K", "auto"), prefix_ok=("cuda:",)),
    "dtype": _str(("float32", "float64")),
    "checkpoint_every": _int(0, what=" (0: only at the start and the end)"),
    "executor": _executor,
    "threads": _int(1, none_ok=True),
}


@dataclasses.dataclass
class Config:
    """Everything that defines a run. Field names are the command line's flags (``--local-steps``)
    and the keys of a TOML / YAML config file."""

    # algorithm (python_algos.algorithms.registry): built from (lr, local_steps), then alg_opts overrides
    algorithm: str = "fedcanon"
    lr: float = 0.05
    local_steps: int = 10
    alg_opts: dict = dataclasses.field(default_factory=dict)
    # data (python_algos.experiments.data)
    dataset: str = "sparse_logistic"
    data_dir: Optional[str] = None
    data_opts: dict = dataclasses.field(default_factory=dict)
    test_fraction: float = 0.2
    partition: str = "iid"
    num_clients: int = 10
    eta: float = 0.5  # Dirichlet concentration Dir(eta)
    min_size: Optional[int] = None
    shards_per_client: int = 1
    participation: Optional[float] = None  # fraction of clients sampled per round (None: all)
    clients_per_round: Optional[int] = None  # or their number
    # model (python_algos.experiments.models)
    model: str = "linear"
    model_opts: dict = dataclasses.field(default_factory=dict)
    # regularizer h
    reg: str = "l1"
    reg_strength: float = 1e-3
    reg_opts: dict = dataclasses.field(default_factory=dict)
    # per-parameter h (PATTERN -> name or {reg = name, options}; non-empty: replaces reg / reg_opts)
    regularizers: dict = dataclasses.field(default_factory=dict)
    # run
    rounds: int = 100
    batch_size: Optional[int] = None  # None: full local gradients
    seed: int = 0
    # the seed of the data alone (generated samples, train/test split, client partition); None: ``seed``.
    # Independent seeds of one experiment (``--seeds``) keep it fixed, so they differ in the model's
    # initialization and the sampling, not in the problem, unless ``--reseed-data`` is given.
    data_seed: Optional[int] = None
    metrics_every: int = 1
    metric_step: Optional[float] = None
    device: str = "cpu"
    dtype: str = "float32"
    checkpoint_every: int = 10
    # execution (changes speed, not the result beyond floating-point summation order)
    executor: str = "auto"  # sequential | batched | auto (python_algos.clients.EXECUTORS)
    threads: Optional[int] = None  # torch / fedkernels threads; None: the policy of python_algos.experiments.threads

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
        """Raise :class:`ConfigError` for the first value of a wrong type or out of range."""
        choices = _choices()
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in choices:
                if f.name == "dataset" and isinstance(v, str) and v.lower().startswith("sklearn:") \
                        and v.lower() not in choices[f.name]:
                    names = ", ".join(c for c in choices[f.name] if c.startswith("sklearn:"))
                    raise ConfigError(f.name, v, f"unknown scikit-learn data set; valid: {names}")
                if f.name == "reg" and isinstance(v, str) and v.lower() == "group_lasso":
                    raise ConfigError(f.name, v, "group_lasso needs a parameter's shape (its rows or columns are "
                                      "the groups): give it per parameter, e.g. --reg-param "
                                      "'net.0.weight=group_lasso,lam=0.01,groups=cols'")
                if not isinstance(v, str) or v.lower() not in choices[f.name]:
                    raise ConfigError(f.name, v, f"unknown {f.name}; valid: {', '.join(choices[f.name])}")
                continue
            rule = _RULES[f.name](v)
            if rule:
                raise ConfigError(f.name, v, rule)
        if self.participation is not None and self.clients_per_round is not None:
            raise ConfigError("clients_per_round", self.clients_per_round,
                              f"give {flag('participation')} (a fraction) or {flag('clients_per_round')} "
                              f"(a count), not both")


def unknown_keys_text(unknown, valid) -> str:
    """'unknown key(s) lrr; valid keys: ...' (the caller puts the file's name in front)."""
    return f"unknown key(s) {', '.join(sorted(map(str, unknown)))}; valid keys: {', '.join(sorted(valid))}"


# The partition settings and the partitions that read them (data.federate). The others ignore them,
# so a value given with another partition (--eta 0.1 without --partition dirichlet) would change
# nothing, silently: check_given refuses it.
PARTITION_KEYS = {"eta": ("dirichlet", "writers"), "min_size": ("dirichlet", "writers"),
                  "shards_per_client": ("shards",)}


def check_given(given: dict) -> None:
    """Refuse settings the user gave (``given``: the command line's flags and the config file's keys,
    not the defaults) that the run would ignore: a partition setting that ``--partition`` does not use.

    Not part of :meth:`Config.check`: a Config holds every field, given or default, and the
    config.json of a run made before this check may record such a value; it must still load and
    resume (the value changed nothing then either)."""
    partition = given.get("partition", Config.partition)
    if not isinstance(partition, str) or partition.lower() not in _choices()["partition"]:
        return  # Config.check names the bad partition
    for key, users in PARTITION_KEYS.items():
        if key in given and partition.lower() not in users:
            raise ConfigError(key, given[key], f"applies only to --partition {' or '.join(users)} "
                                               f"(got {partition})")


# Settings that change how fast a run goes, not what it computes: they may differ when a run is
# resumed. Every other key must match the checkpoint (``rounds`` may grow, see :mod:`.prepare`).
EXECUTION_KEYS = ("executor", "threads", "checkpoint_every", "rounds")
RESULT_KEYS = tuple(f.name for f in dataclasses.fields(Config) if f.name not in EXECUTION_KEYS)
