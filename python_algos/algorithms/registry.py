"""Name -> algorithm class, with the per-algorithm extras that generic code needs.

    from python_algos.algorithms.registry import ALGORITHMS, make
    alg = make("fedcanon", lr=0.01, local_steps=10)       # common parameterization
    alg = ALGORITHMS["fedcanon"].cls(alpha=0.1, beta=0.01, local_steps=10)

``Entry.from_lr(lr, K)`` maps one local step size and K local steps to each algorithm's own
hyper-parameters with the usual matching (FedCanon's heuristic α = βK of its Remark 4, η_g = 1,
η_s = 1, Fast-FedDA γ = 1/lr with μ = 0 (its primal is then FedDA's), FedNMap λ = ηK, SCAFFNEW
p = 1/K, FedDR / FedADMM η = lr·K with K inner steps of lr, FedProx μ = 0.01, DEPOSITUM α = lr,
γ = 1, β = 0.9 on a ring gossiping every τ = K iterations — one DEPOSITUM round is one iteration).
Tests, benchmarks and a CLI use it to run every algorithm on comparable settings.
``python -m python_algos algorithms`` prints the README table.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import fedkernels as fk

from .base import Algorithm
from .depositum import DEPOSITUM
from .fastfedda import FastFedDA
from .fedadmm import FedADMM
from .fedavg import FedAvg
from .fedcanon import FedCanon
from .fedcanon2 import FedCanonII
from .fedda import FedDA
from .feddr import FedDR
from .fedmid import FedMiD
from .fednmap import FedNMap
from .fedprox import FedProx
from .prox_fedavg import ProxFedAvg
from .scaffnew import SCAFFNEW
from .scaffold import SCAFFOLD
from .za1 import ZA1

__all__ = ["Entry", "ALGORITHMS", "ENTRY_POINT_GROUP", "make", "build", "algorithm_entry", "algorithm_names",
           "is_reference", "typed_hparams", "markdown_table", "installed_algorithms_text"]

# Where an installed package lists its algorithms by name: in its pyproject.toml,
# [project.entry-points."fedkernels.algorithms"] mymethod = "mypkg.methods:MyMethod"
ENTRY_POINT_GROUP = "fedkernels.algorithms"


@dataclasses.dataclass(frozen=True)
class Entry:
    cls: type
    from_lr: Callable[[float, int], dict]  # (local lr, K) -> constructor kwargs
    down_note: str = ""  # README detail for the communication column
    comm_note: str = ""  # README text for both communication columns (replaces the counts)


ALGORITHMS: dict[str, Entry] = {
    "fedcanon": Entry(FedCanon, lambda lr, K: dict(alpha=lr * K, beta=lr, local_steps=K)),
    "fedcanon2": Entry(FedCanonII, lambda lr, K: dict(alpha=lr * K, beta=lr, local_steps=K)),
    "za1": Entry(ZA1, lambda lr, K: dict(eta=lr, eta_g=1.0, local_steps=K)),
    "fednmap": Entry(FedNMap, lambda lr, K: dict(lam=lr * K, eta=lr, local_steps=K),
                     down_note=' (1 with downlink="z")'),
    "prox_fedavg": Entry(ProxFedAvg, lambda lr, K: dict(alpha=1.0, beta=lr, local_steps=K)),
    "fedmid": Entry(FedMiD, lambda lr, K: dict(lr_client=lr, lr_server=1.0, local_steps=K)),
    "fedda": Entry(FedDA, lambda lr, K: dict(lr_client=lr, lr_server=1.0, local_steps=K)),
    "fastfedda": Entry(FastFedDA, lambda lr, K: dict(gamma=1.0 / lr, mu=0.0, local_steps=K)),
    "fedavg": Entry(FedAvg, lambda lr, K: dict(lr_local=lr, lr_global=1.0, local_steps=K)),
    "scaffold": Entry(SCAFFOLD, lambda lr, K: dict(lr_local=lr, lr_global=1.0, local_steps=K)),
    "scaffnew": Entry(SCAFFNEW, lambda lr, K: dict(lr=lr, p=1.0 / K)),
    "feddr": Entry(FedDR, lambda lr, K: dict(eta=lr * K, lr_local=lr, local_steps=K)),
    "fedadmm": Entry(FedADMM, lambda lr, K: dict(eta=lr * K, lr_local=lr, local_steps=K)),
    "fedprox": Entry(FedProx, lambda lr, K: dict(lr_local=lr, local_steps=K, mu=0.01)),
    "depositum": Entry(DEPOSITUM, lambda lr, K: dict(alpha=lr, gamma=1.0, beta=0.9, period=K),
                       comm_note="2·deg(i) to / from neighbours per gossip iteration (every τ), no server"),
}


def is_reference(name: str) -> bool:
    """``package.module:Class`` (a user's class), not a registered name."""
    return isinstance(name, str) and ":" in name


def _generic_from_lr(cls: type) -> Callable[[float, int], dict]:
    """A user's class: the common ``lr`` / ``local_steps`` fill its fields of those names, if any."""
    names = {f.name for f in dataclasses.fields(cls)}
    return lambda lr, K: {k: v for k, v in (("lr", lr), ("local_steps", K)) if k in names}


def _user_entry(ref: str, cls) -> Entry:
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ValueError(f"{ref!r} is not a python_algos algorithm: a subclass of "
                         f"python_algos.algorithms.base.Algorithm (ServerClientAlgorithm) was expected, got {cls!r}")
    if not dataclasses.is_dataclass(cls):
        raise ValueError(f"{ref!r}: an algorithm class must be a dataclass (@dataclasses.dataclass(frozen=True)) "
                         "whose fields are its hyper-parameters")
    return Entry(cls, _generic_from_lr(cls))


def _plugins() -> dict:
    """Algorithms that installed packages register under :data:`ENTRY_POINT_GROUP`."""
    from importlib.metadata import entry_points

    return {ep.name.lower(): ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name.lower() not in ALGORITHMS}


def algorithm_names() -> list:
    """Every name ``-a`` accepts: the built-ins, then those of installed packages."""
    return [*ALGORITHMS, *sorted(_plugins())]


def algorithm_entry(name: str) -> Entry:
    """The entry of a built-in name, a name an installed package registers, or ``package.module:Class``."""
    if is_reference(name):
        import fedkernels.regularizers as regs  # the one importer of module:attr references

        return _user_entry(name, regs.import_reference(name))
    key = name.lower() if isinstance(name, str) else name
    if key in ALGORITHMS:
        return ALGORITHMS[key]
    plugins = _plugins()
    if key in plugins:
        try:
            cls = plugins[key].load()
        except Exception as e:
            raise ValueError(f"algorithm {name!r} (registered by an installed package as {plugins[key].value!r}) "
                             f"does not import: {type(e).__name__}: {e}") from None
        return _user_entry(plugins[key].value, cls)
    raise ValueError(f"unknown algorithm {name!r}; valid names: {', '.join(algorithm_names())}, "
                     "or your own class as package.module:Class")


def make(name: str, *, lr: float, local_steps: int, **overrides) -> Algorithm:
    """Build algorithm ``name`` from the common (lr, K) parameterization, then ``overrides``."""
    return build(name, lr, local_steps, overrides)


def build(name: str, lr: float, local_steps: int, overrides: dict) -> Algorithm:
    """:func:`make` with the overrides as a dict: an algorithm's own hyper-parameter may be called
    ``lr`` (SCAFFNEW's), which cannot also be passed to ``make`` as a keyword."""
    entry = algorithm_entry(name)
    if is_reference(name) or name.lower() not in ALGORITHMS:
        fields = {f.name: f for f in dataclasses.fields(entry.cls)}
        unknown = [k for k in overrides if k not in fields]
        if unknown:
            raise fk.ParameterError(f"{name} has no hyper-parameter {', '.join(unknown)}; its fields: "
                                    f"{', '.join(fields)}", *unknown)
        given = {**entry.from_lr(lr, local_steps), **overrides}
        missing = [k for k, f in fields.items() if f.init and k not in given
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise fk.ParameterError(f"{name} needs a value for {', '.join(missing)} (--alg-opt {missing[0]}=VALUE)",
                                    *missing)
        return entry.cls(**typed_hparams(name, entry.cls, given))
    return entry.cls(**{**entry.from_lr(lr, local_steps), **overrides})


def typed_hparams(name: str, cls: type, values: dict) -> dict:
    """A user's hyper-parameters checked against the field annotations that are plain types (float,
    int, bool, str): an int where a float is declared is widened, anything else wrong is refused.
    The built-in algorithms check their own values (their errors say more): left as given."""
    import typing

    if any(e.cls is cls for e in ALGORITHMS.values()):
        return values
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # annotations that do not resolve: leave the checks to the class
        return values
    out = dict(values)
    for k, v in values.items():
        t = hints.get(k)
        if t not in (float, int, bool, str):
            continue
        if t is float and isinstance(v, int) and not isinstance(v, bool):
            out[k] = float(v)
        elif not isinstance(v, t) or (t is not bool and isinstance(v, bool)):
            raise fk.ParameterError(f"{name}: {k} must be {'a' if t is not int else 'an'} {t.__name__}, got {v!r} "
                                    f"(--alg-opt {k}=VALUE)", k)
    return out


def installed_algorithms_text() -> str:
    """The algorithms installed packages register (:data:`ENTRY_POINT_GROUP`), one line each, or a
    line saying how to add one."""
    plugins = _plugins()
    if not plugins:
        return ("No algorithm of an installed package (entry-point group fedkernels.algorithms). Your own class "
                "runs as -a package.module:Class.")
    lines = ["Installed by packages (entry-point group fedkernels.algorithms):"]
    lines += [f"  {name}  ({ep.value})" for name, ep in sorted(plugins.items())]
    return "\n".join(lines)


def markdown_table() -> str:
    """The README's algorithm table, built from the declared costs (which the tests check)."""
    rows = [
        "| name | algorithm | section (docs/algorithms.md) | status | prox / round: clients (total) "
        "| prox / round: server | up | down | reports | switches |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, e in ALGORITHMS.items():
        alg = make(key, lr=0.01, local_steps=7)
        c = alg.costs(1000)
        client = {0: "0", 1000: "N (1 each)", 7000: "N·K"}.get(c.client_prox, str(c.client_prox))
        if e.comm_note:
            up = down = e.comm_note
        elif key == "scaffnew":
            down = f"{c.down} per communication"
            up = f"{c.up} per communication"
        else:
            up, down = str(c.up), f"{c.down}{e.down_note}"
        switches = ", ".join(f"`{s}`" for s in alg.switches) or "–"
        rows.append(
            f"| `{key}` | {alg.name} | {alg.spec.replace('docs/algorithms.md ', '')} | {alg.status} | {client} | "
            f"{c.server_prox} | {up} | {down} | {alg.reports} | {switches} |"
        )
    return "\n".join(rows)

