"""Regularizers h by name, as the command line and config files spell them.

    build_regularizer("scad", 1e-3)                       # --reg scad --reg-strength 1e-3
    build_param_regularizer({"reg": "group_lasso", "lam": 1e-2, "groups": "cols"}, 0.0)   # --reg-param entry

:data:`REGULARIZERS` are the names of ``--reg`` (one h for the whole model); :data:`PARAM_REGULARIZERS`
those of a ``--reg-param`` / ``[regularizers]`` entry (one h per parameter; ``group_lasso`` needs a
parameter's shape, so it is only there). The per-parameter table of a Config is built in
:mod:`.build` (its errors name the config key).
"""

from __future__ import annotations

from typing import Optional

import fedkernels as fk

__all__ = ["REGULARIZERS", "PARAM_REGULARIZERS", "build_regularizer", "build_param_regularizer"]


REGULARIZERS = ("zero", "l1", "elastic_net", "mcp", "scad", "box", "nonneg", "l2ball")


def build_regularizer(name: str, strength: float = 0.0, **opts) -> fk.Regularizer:
    """h by name. ``strength`` is kappa (L1), l1 (elastic net: ``l2=`` in opts, default = strength),
    lam (MCP: ``gamma=`` default 3; SCAD: ``a=`` default 3.7), the radius (l2ball); box takes ``lo=``/``hi=``."""
    if name == "zero":
        return fk.Zero()
    if name == "l1":
        return fk.L1(strength)
    if name == "elastic_net":
        return fk.ElasticNet(strength, opts.get("l2", strength))
    if name == "mcp":
        return fk.MCP(strength, opts.get("gamma", 3.0))
    if name == "scad":
        return fk.SCAD(strength, opts.get("a", 3.7))
    if name == "box":
        return fk.Box(opts.get("lo", -1.0), opts.get("hi", 1.0))
    if name == "nonneg":
        return fk.NonNeg()
    if name == "l2ball":
        return fk.L2Ball(strength if strength > 0 else opts.get("radius", 1.0))
    if name == "group_lasso":
        return fk.GroupLasso(strength, opts.get("groups", "rows"))
    raise ValueError(f"unknown regularizer {name!r}; valid: {', '.join(REGULARIZERS)}")


# Per-parameter entries (--reg-param / [regularizers]): every --reg name, group_lasso (needs a
# parameter's shape, so never the whole model's h) and none; the strength under its own name.
PARAM_REGULARIZERS = ("none",) + REGULARIZERS + ("group_lasso",)
_STRENGTH_NAMES = {"l1": "kappa", "elastic_net": "l1", "mcp": "lam", "scad": "lam", "group_lasso": "lam",
                   "l2ball": "radius"}
_PARAM_OPTIONS = {"elastic_net": ("l2",), "mcp": ("gamma",), "scad": ("a",), "box": ("lo", "hi"),
                  "group_lasso": ("groups",)}


def _spec_text(pattern: str, spec) -> str:
    """An entry as --reg-param spells it: PATTERN=NAME[,KEY=VALUE...]."""
    if not isinstance(spec, dict):
        return f"{pattern}={spec if spec is not None else 'none'}"
    opts = "".join(f",{k}={v}" for k, v in spec.items() if k != "reg")
    return f"{pattern}={spec.get('reg')}{opts}"


def build_param_regularizer(spec, default_strength: float) -> Optional[fk.Regularizer]:
    """One --reg-param entry ("name" or {"reg": name, options}) -> Regularizer, or None for none /
    zero. The strength is ``strength=`` or the penalty's own name for it (``kappa`` for l1, ``lam``
    for mcp / scad / group_lasso, ``l1`` for elastic_net, ``radius`` for l2ball), default
    ``default_strength`` (the run's --reg-strength)."""
    opts = dict(spec) if isinstance(spec, dict) else {"reg": spec if spec is not None else "none"}
    name = str(opts.pop("reg")).lower()
    if name not in PARAM_REGULARIZERS:
        raise ValueError(f"unknown regularizer {name!r}; valid: {', '.join(PARAM_REGULARIZERS)}")
    if name in ("none", "zero"):
        if opts:
            raise ValueError(f"{name} takes no options, got {', '.join(opts)}")
        return None
    own = _STRENGTH_NAMES.get(name)
    strength = default_strength
    for key in ("strength", own):
        if key is not None and key in opts:
            strength = opts.pop(key)
    unknown = [k for k in opts if k not in _PARAM_OPTIONS.get(name, ())]
    if unknown:
        valid = ["strength"] + ([own] if own else []) + list(_PARAM_OPTIONS.get(name, ()))
        raise ValueError(f"{name} has no option {', '.join(unknown)}; its options: {', '.join(valid)}")
    if isinstance(strength, bool) or not isinstance(strength, (int, float)):
        raise ValueError(f"the strength must be a number, got {strength!r}")
    return build_regularizer(name, float(strength), **opts)
