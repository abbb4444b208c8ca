"""Name -> algorithm class, with the per-algorithm extras that generic code needs.

    from python_algos.algorithms.registry import ALGORITHMS, make
    alg = make("fedcanon", lr=0.01, local_steps=10)       # common parameterization
    alg = ALGORITHMS["fedcanon"].cls(alpha=0.1, beta=0.01, local_steps=10)

``Entry.from_lr(lr, K)`` maps one local step size and K local steps to each algorithm's own
hyper-parameters with the usual matching (FedCanon's heuristic α = βK of its Remark 4, η_g = 1,
η_s = 1, FedNMap λ = ηK, SCAFFNEW p = 1/K, FedDR / FedADMM η = lr·K with K inner steps of lr,
FedProx μ = 0.01, DEPOSITUM α = lr, γ = 1, β = 0.9 on a ring gossiping every τ = K iterations —
one DEPOSITUM round is one iteration). Tests, benchmarks and a CLI use it to run every
algorithm on comparable settings. ``python -m python_algos algorithms`` prints the README table.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .base import Algorithm
from .depositum import DEPOSITUM
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

__all__ = ["Entry", "ALGORITHMS", "make", "build", "markdown_table"]


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
    "fedavg": Entry(FedAvg, lambda lr, K: dict(lr_local=lr, lr_global=1.0, local_steps=K)),
    "scaffold": Entry(SCAFFOLD, lambda lr, K: dict(lr_local=lr, lr_global=1.0, local_steps=K)),
    "scaffnew": Entry(SCAFFNEW, lambda lr, K: dict(lr=lr, p=1.0 / K)),
    "feddr": Entry(FedDR, lambda lr, K: dict(eta=lr * K, lr_local=lr, local_steps=K)),
    "fedadmm": Entry(FedADMM, lambda lr, K: dict(eta=lr * K, lr_local=lr, local_steps=K)),
    "fedprox": Entry(FedProx, lambda lr, K: dict(lr_local=lr, local_steps=K, mu=0.01)),
    "depositum": Entry(DEPOSITUM, lambda lr, K: dict(alpha=lr, gamma=1.0, beta=0.9, period=K),
                       comm_note="2·deg(i) to / from neighbours per gossip iteration (every τ), no server"),
}


def make(name: str, *, lr: float, local_steps: int, **overrides) -> Algorithm:
    """Build algorithm ``name`` from the common (lr, K) parameterization, then ``overrides``."""
    return build(name, lr, local_steps, overrides)


def build(name: str, lr: float, local_steps: int, overrides: dict) -> Algorithm:
    """:func:`make` with the overrides as a dict: an algorithm's own hyper-parameter may be called
    ``lr`` (SCAFFNEW's), which cannot also be passed to ``make`` as a keyword."""
    key = name.lower()
    if key not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; valid names: {', '.join(ALGORITHMS)}")
    entry = ALGORITHMS[key]
    return entry.cls(**{**entry.from_lr(lr, local_steps), **overrides})


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

