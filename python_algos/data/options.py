"""The options a data set takes (``--data-opt KEY=VALUE``, a config file's ``data_opts``), read from
the signature of its generator or loader: each parameter's name, type, default and, in an
``Annotated[type, Opt(lo, hi, what)]`` annotation, its bounds and meaning. :func:`options_of` derives
them; :func:`check_options` checks values before any data are generated or read (``Config.check``).
A value of the wrong type used to reach the generator and fail there (``n=abc``: "'<' not supported
between instances of 'str' and 'int'"), and a huge size to fail allocating terabytes.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import math
import numbers
import typing
from typing import Annotated, Callable, Dict, Optional, Sequence, Tuple, Union

__all__ = ["Opt", "Option", "COUNT", "MAX_VALUES", "options_of", "check_options"]

COUNT = 2**31 - 1  # sizes and counts: torch's and numpy's 32-bit loops
# The most values (samples × features) a built-in generator makes: 2**31 float64 values are 16 GiB
# while they are drawn, beyond any experiment these generators are for; a larger data set is a file.
MAX_VALUES = 2**31


@dataclasses.dataclass(frozen=True)
class Opt:
    """A parameter's bounds ``lo``/``hi`` (a list's items'), meaning ``what`` and, for a list, ``length``."""

    lo: Optional[float] = None
    hi: Optional[float] = None
    what: str = ""
    length: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: ``kinds`` the types it takes (int, float, bool, str, list), its ``default``
    (``inspect.Parameter.empty``: required), ``none_ok`` whether null is allowed, ``opt`` its bounds."""

    kinds: tuple
    default: object
    none_ok: bool = False
    opt: Opt = Opt()

    def rule_broken(self, name: str, v) -> Optional[str]:
        if v is None and self.none_ok:
            return None
        if any(_fits(kind, v, self.opt) for kind in self.kinds):
            return None
        what, got = f" ({self.opt.what})" if self.opt.what else "", "" if bool in self.kinds else f", got {v!r}"
        kinds = " or ".join(_kind_text(k, self.opt) for k in self.kinds) + (" or null" if self.none_ok else "")
        return f"{name} must be {kinds}{what}{got}"


def _fits(kind, v, opt: Opt) -> bool:
    if kind is list:
        return (isinstance(v, (list, tuple)) and (opt.length is None or len(v) == opt.length)
                and all(_fits(int, d, opt) for d in v))
    if kind is bool or kind is str:
        return isinstance(v, kind) and (kind is bool or bool(v))
    ok = not isinstance(v, bool) and (isinstance(v, numbers.Integral) if kind is int else
                                      isinstance(v, numbers.Real) and math.isfinite(v))
    return ok and (opt.lo is None or v >= opt.lo) and (opt.hi is None or v <= opt.hi)


def _kind_text(kind, opt: Opt) -> str:
    if kind is bool:
        return "true or false"
    if kind is str:
        return "a non-empty text"
    show = str if kind in (int, list) else "{:g}".format
    bounds = ("" if opt.lo is None else f">= {show(opt.lo)}" if opt.hi is None
              else f"in [{show(opt.lo)}, {show(opt.hi)}]")
    if kind is list:
        return f"a list of {opt.length or 'some'} integers {bounds}".rstrip()
    return ("an integer" if kind is int else "a finite number") + (f" {bounds}" if bounds else "")


def _option(hint, default) -> Option:
    """The :class:`Option` of a parameter annotated ``hint`` (``Optional`` / ``Union`` of the kinds)."""
    opt = Opt()

    def bare(a):
        nonlocal opt
        if typing.get_origin(a) is not Annotated:
            return a
        a, *meta = typing.get_args(a)
        opt = next((m for m in meta if isinstance(m, Opt)), opt)
        return a

    hint = bare(hint)
    args = [bare(a) for a in (typing.get_args(hint) if typing.get_origin(hint) is Union else (hint,))]
    kinds = [_kind(a) for a in args if a is not type(None)]
    return Option(tuple(kinds), default, default is None or type(None) in args, opt)


def _kind(hint):
    if typing.get_origin(hint) in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        return list
    if hint not in (int, float, bool, str):
        raise TypeError(f"a data option must be int, float, bool, str or a list of ints, got {hint!r}")
    return hint


def options_of(fn: Callable, hidden: Sequence[str] = ()) -> Dict[str, Option]:
    """The options of generator / loader ``fn``: its parameters but ``seed`` and ``hidden`` (what the
    data set's name sets, e.g. ``task``) and keyword-only ones (what ``load_dataset`` passes)."""
    hints = typing.get_type_hints(fn, include_extras=True)
    return {name: _option(hints.get(name, str), p.default) for name, p in inspect.signature(fn).parameters.items()
            if name != "seed" and name not in hidden and p.kind is p.POSITIONAL_OR_KEYWORD}


def check_options(declared: Dict[str, Option], dataset: str, opts: dict,
                  size: Optional[Tuple[str, int]] = None) -> Optional[Tuple[str, str]]:
    """None, or (the option at fault, the rule it breaks): each option's type and bounds, then the
    ``size`` (the option that sets it, samples × features) of the data they would generate. An unknown
    option is :func:`~.datasets.load_dataset`'s to refuse (it names the options there are)."""
    for k, v in opts.items():
        rule = declared[k].rule_broken(k, v) if k in declared else None
        if rule:
            return k, rule
    if size is not None and size[1] > MAX_VALUES:
        key = size[0] if size[0] in opts else next(iter(opts), size[0])
        return key, (f"{dataset} would generate {size[1]:,} values ({size[1] * 8 / 2**30:,.0f} GiB while drawn), "
                     f"more than the {MAX_VALUES:,} a built-in generator makes; use fewer samples or features")
    return None
