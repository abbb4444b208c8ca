"""Regularizers h by name, as the command line and config files spell them.

    build_regularizer("scad", 1e-3)                       # --reg scad --reg-strength 1e-3
    build_regularizer("l2ball", radius=5.0)               # --reg l2ball --reg-opt radius=5
    build_param_regularizer({"reg": "group_lasso", "lam": 1e-2, "groups": "cols"}, 0.0)   # --reg-param entry

:data:`REGULARIZERS` are the names of ``--reg`` (one h for the whole model); :data:`PARAM_REGULARIZERS`
those of a ``--reg-param`` / ``[regularizers]`` entry (one h per parameter; ``group_lasso`` needs a
parameter's shape, so it is only there). The per-parameter table of a Config is built in
:mod:`.build`, and so is the h of ``--reg`` / ``--reg-strength`` / ``--reg-opt``: there its errors name
the flags (or the config key) that set the value.

Two kinds of h, one rule each, the same through ``--reg`` and ``--reg-param``:

* a penalty (l1, elastic_net, mcp, scad, group_lasso) has a strength, its weight: ``--reg-strength``
  (a ``--reg-param`` entry: ``strength=`` or the penalty's own name for it, ``kappa`` / ``l1`` / ``lam``,
  default the run's ``--reg-strength``), plus its shape options (``gamma``, ``a``, ``l2``, ``groups``).
  In ``--reg-opt`` the strength's name is refused, naming ``--reg-strength``: the strength has one place,
  so a run folder's config.json records it once.
* a constraint (box, nonneg, l2ball; and zero) is an indicator function, which no weight scales: it has
  no strength, only its options (``lo`` / ``hi`` default -1 / 1, ``radius`` default 1). A
  ``--reg-strength`` set with one (other than 0 or its default) is refused rather than ignored (an
  earlier version took it as the l2ball radius, so ``--reg-strength``'s default 1e-3 pinned the model to
  a ball of radius 0.001). zero alone lets a strength through: it is no h, so nothing changes, and an
  ablation grid over ``reg=zero,l1`` shares one ``--reg-strength``.
"""

from __future__ import annotations

from typing import Optional

import fedkernels as fk
import fedkernels.regularizers as fkr

__all__ = ["REGULARIZERS", "PARAM_REGULARIZERS", "STRENGTH_NAMES", "OPTIONS", "reg_entry", "build_regularizer",
           "build_param_regularizer", "unknown_options", "spec_text", "is_reference"]

# Everything below is derived from fedkernels' one table of penalties (fk.regularizers.REGULARIZER_TABLE:
# name, class, strength, options and their defaults), which a user's class joins as package.module:Class.
_TABLE = fkr.REGULARIZER_TABLE
REGULARIZERS = tuple(n for n, e in _TABLE.items() if e.whole_model)
# Per-parameter entries (--reg-param / [regularizers]): every --reg name, those that need a
# parameter's shape (group_lasso: never the whole model's h) and none.
PARAM_REGULARIZERS = ("none",) + REGULARIZERS + tuple(n for n, e in _TABLE.items() if not e.whole_model)

# A penalty's name for its strength (the constraints, absent here, have none) ...
STRENGTH_NAMES = {n: e.strength for n, e in _TABLE.items() if e.strength is not None}


def _shown_default(v):
    return None if v is fkr.SAME_AS_STRENGTH else v  # elastic_net's l2 defaults to its l1 strength


# ... and every h's options with their defaults.
OPTIONS = {n: {k: _shown_default(v) for k, v in e.options.items()} for n, e in _TABLE.items()}


def is_reference(name) -> bool:
    """``package.module:Class``: a user's penalty, not a built-in name."""
    return isinstance(name, str) and ":" in name


def reg_entry(name: str) -> fkr.RegularizerEntry:
    """The table's entry of a built-in name (any case) or of a user's ``package.module:Class``."""
    return fkr.regularizer_entry(name)


def unknown_options(name: str, given, valid) -> Optional[str]:
    """The one wording of unknown options, for --reg-opt and --reg-param alike (None: all known)."""
    unknown = [k for k in given if k not in valid]
    if not unknown:
        return None
    return (f"{name} has no option {', '.join(unknown)}; "
            + (f"its options: {', '.join(valid)}" if valid else "it takes no options"))


def build_regularizer(name: str, strength: float = 0.0, **opts) -> fk.Regularizer:
    """h by name or ``package.module:Class``. ``strength`` is a penalty's weight: kappa (l1), l1
    (elastic net; ``l2=`` default = strength), lam (MCP: ``gamma=`` default 3; SCAD: ``a=`` default
    3.7; group lasso: ``groups=`` default rows). The constraints take no strength (0 only): box
    ``lo=`` / ``hi=`` (default -1 / 1), l2ball ``radius=`` (default 1), nonneg and zero nothing. A
    user's class takes its constructor's arguments as options, its ``strength_arg`` as the strength.
    An unknown option is an error."""
    return reg_entry(name).build(strength, **opts)


def spec_text(pattern: str, spec) -> str:
    """An entry as --reg-param spells it: PATTERN=NAME[,KEY=VALUE...]."""
    if not isinstance(spec, dict):
        return f"{pattern}={spec if spec is not None else 'none'}"
    opts = "".join(f",{k}={v}" for k, v in spec.items() if k != "reg")
    return f"{pattern}={spec.get('reg')}{opts}"


def build_param_regularizer(spec, default_strength: float) -> Optional[fk.Regularizer]:
    """One --reg-param entry ("name" or {"reg": name, options}) -> Regularizer, or None for none /
    zero. A penalty's strength is ``strength=`` or its own name for it (``kappa`` for l1, ``lam``
    for mcp / scad / group_lasso, ``l1`` for elastic_net), default ``default_strength`` (the run's
    --reg-strength); a constraint has none (l2ball's ``radius=`` is an option, default 1)."""
    opts = dict(spec) if isinstance(spec, dict) else {"reg": spec if spec is not None else "none"}
    name = str(opts.pop("reg"))
    name = name if is_reference(name) else name.lower()
    if not is_reference(name) and name not in PARAM_REGULARIZERS:
        raise ValueError(f"unknown regularizer {name!r}; valid: {', '.join(PARAM_REGULARIZERS)} "
                         "or your own class as package.module:Class")
    if name in ("none", "zero"):
        if opts:
            raise ValueError(f"{name} takes no options, got {', '.join(opts)}")
        return None
    entry = reg_entry(name)
    own = entry.strength
    strength = default_strength if own is not None else 0.0
    if own is not None:
        for key in ("strength", own):
            if key in opts:
                strength = opts.pop(key)
    text = unknown_options(name, opts, (("strength", own) if own else ()) + tuple(entry.options))
    if text:
        raise ValueError(text)
    if isinstance(strength, bool) or not isinstance(strength, (int, float)):
        raise ValueError(f"the strength must be a number, got {strength!r}")
    return build_regularizer(name, float(strength), **opts)
