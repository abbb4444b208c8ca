"""The setup line printed under a figure's title: algorithm(s), dataset, partition, N, model, h,
and what set the algorithms' hyper-parameters (the common K and lr while they still set one, the
values given explicitly by ``--alg-opt`` / a sweep's or search's point, or a History.save folder's
own), each value the runs share once and differing values joined by "/".
"""

from __future__ import annotations

import re

from .runs import registry_entry

__all__ = ["setup_line", "run_qualifiers"]


def _short_reg(reg):
    """A per-parameter regularizer's repr shortened for the setup line: ``PerParameter({'0.weight':
    L1(kappa=0.01), '*.bias': None})`` -> ``per-parameter(0.weight: L1(0.01), *.bias: none)``, and
    past 72 characters only the distinct penalties: ``per-parameter(L1, GroupLasso, none; 5 rules)``."""
    if not isinstance(reg, str) or not reg.startswith("PerParameter("):
        return reg
    entries = re.findall(r"'((?:[^'\\]|\\.)*)':\s*(None|\w+(?:\((?:[^()]|\([^()]*\))*\))?)", reg)
    if not entries:
        return "per-parameter"
    short = [(pat, "none" if spec == "None" else re.sub(r"\b\w+=", "", spec)) for pat, spec in entries]
    text = "per-parameter(" + ", ".join(f"{p}: {sp}" for p, sp in short) + ")"
    if len(text) <= 72:
        return text
    kinds = list(dict.fromkeys(sp.split("(")[0] for _, sp in short))
    return f"per-parameter({', '.join(kinds)}; {len(short)} rules)"


# --------------------------------------------------------------------------- #
# What set the hyper-parameters
# --------------------------------------------------------------------------- #


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
    entry = registry_entry(alg)
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
    out.update({n: _shown(v) for n, v in opts.items()})  # an override named lr (SCAFFNEW's) takes lr's place
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
            "N": c.get("num_clients", s.get("num_clients")), "participation": _participation(c),
            "model": c.get("model"), "h": _short_reg(reg),
            **_hyper_parameters(c, s, alg)}


def run_qualifiers(run: dict) -> dict:
    """What a run's curves depend on beyond its label: ``h`` (its penalty, which f + h includes) and
    ``s`` (the step of its stationarity measure ‖G_s‖², recorded in summary.json; None: unknown)."""
    c, s = run.get("config") or {}, run.get("summary") or {}
    step = c.get("metric_step") if c.get("metric_step") is not None else s.get("metric_step")
    return {"h": _setup_of({"config": c, "summary": s})["h"], "s": None if step is None else f"{float(step):g}"}


def _participation(c: dict) -> "str | None":
    """"k of N clients per round" (or "p of clients per round"), None under full participation."""
    n, k, p = c.get("num_clients"), c.get("clients_per_round"), c.get("participation")
    if k is not None:
        return f"{k} of {n} clients per round" if n is not None else f"{k} clients per round"
    if p is not None and float(p) < 1:
        return f"{float(p):.0%} of clients per round"
    return None


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
        parts.append(text if key in ("algorithm", "dataset", "partition", "participation", "model")
                     else f"{key}={text}")
    counts = sorted({len(r["seeds"]) for r in runs if r.get("seeds")})
    if counts:
        band = "mean ± std" if runs[0].get("band", "std") == "std" else "min to max"
        parts.append(f"{'/'.join(map(str, counts))} seeds: mean, band {band}")
    return " · ".join(parts)
