"""The command line's typed options: :func:`command_of` turns argparse's namespace, once, into one
frozen object per command (:class:`RunCommand`, :class:`CompareCommand`, :class:`SweepCommand`,
:class:`DemoCommand`, :class:`PlotCommand`, :class:`AlgorithmsCommand`). Every function below
``main`` takes these objects or plain values, so what a command reads is declared here, once,
with its type, and a command can be called without argparse (a test, another program).

The settings themselves stay declared in config.py (``setting(...)``): :class:`GivenSettings` holds
the ones the command line gave, as parsed there; the config file is merged with them by
:func:`~.settings.merge_settings` where each command needs its Config (after its own flag checks,
so the first error a command reports does not depend on this conversion)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional, Tuple, Union

from ..config import SETTINGS
from .parser import TYPED, Parser

# The command-line destinations, besides the settings, that a config file's key of the same name may
# also give (merge_settings: the flag wins over the file): a compare / sweep's algorithms, the seeds,
# and a sweep's own options.
FILE_KEYS = ("algorithms", "seeds", "reseed_data", "select", "jobs", "optuna")


@dataclass(frozen=True)
class GivenSettings:
    """The settings the command line gave, before the config file is merged with them."""

    values: Mapping[str, Any] = field(default_factory=dict)  # destination -> parsed value, in the order given
    config: Optional[str] = None  # --config FILE
    # How the user named each setting ({"local_steps": "-K"}): the flag as typed; merge_settings adds
    # the config file's keys (config.FromFile). main runs the command inside config.named_as(names).
    names: dict = field(default_factory=dict)
    grid: Tuple[Tuple[str, str], ...] = ()  # sweep --grid KEY=VALUES, as text
    space: Tuple[Tuple[str, str], ...] = ()  # sweep --space KEY=SPEC, as text

    def get(self, key: str, default=None):
        return self.values.get(key, default)


@dataclass(frozen=True)
class Figures:
    """What is written around the rounds: figures and TensorBoard events."""

    formats: Tuple[str, ...] = ("png", "pdf")
    no_plot: bool = False
    band: str = "std"  # several seeds: mean ± std, or min to max
    tensorboard: bool = False


@dataclass(frozen=True)
class Common:
    """What ``run``, ``compare`` and ``sweep`` share."""

    settings: GivenSettings = field(default_factory=GivenSettings)
    resume: Optional[str] = None  # --resume DIR
    out: Optional[str] = None
    name: Optional[str] = None
    no_progress: bool = False
    figures: Figures = field(default_factory=Figures)
    argv: Tuple[str, ...] = ()  # the command line as given (torchrun's ranks run it again)
    given: Tuple[str, ...] = ()  # argparse destinations the command line gave, in its order (--resume checks)

    @property
    def names(self) -> dict:
        return self.settings.names


@dataclass(frozen=True)
class RunCommand(Common):
    demo: bool = False
    workers: Optional[int] = None
    flower: bool = False
    round_timeout: Optional[float] = None
    replace: bool = False


@dataclass(frozen=True)
class CompareCommand(Common):
    algorithms: Optional[Tuple[str, ...]] = None  # -a (None: the config file's, else the demo's)
    workers: Optional[int] = None
    replace: bool = False


@dataclass(frozen=True)
class SweepCommand(Common):
    algorithms: Optional[Tuple[str, ...]] = None
    jobs: Optional[int] = None  # None: the config file's, else 1
    select: Optional[str] = None  # None: the config file's, else f_plus_h (or the sweep's own on resume)
    replace: bool = False


@dataclass(frozen=True)
class DemoCommand:
    rounds: Optional[int] = None
    out: Optional[str] = None
    no_progress: bool = False
    figures: Figures = field(default_factory=Figures)
    names: dict = field(default_factory=dict)  # {"rounds": "-T"} when given


@dataclass(frozen=True)
class PlotCommand:
    runs: Tuple[str, ...] = ()
    out: Optional[str] = None
    metrics: Optional[Tuple[str, ...]] = None
    x: Tuple[str, ...] = ("round", "elapsed")
    title: Optional[str] = None
    setup: bool = True
    f_star: Optional[float] = None
    formats: Tuple[str, ...] = ("png", "pdf")
    band: str = "std"
    names: dict = field(default_factory=dict)


@dataclass(frozen=True)
class AlgorithmsCommand:
    names: dict = field(default_factory=dict)


Command = Union[RunCommand, CompareCommand, SweepCommand, DemoCommand, PlotCommand, AlgorithmsCommand]


def _tuple(value) -> Optional[tuple]:
    return None if value is None else tuple(value)


def given_settings(ns: argparse.Namespace) -> GivenSettings:
    """The settings part of a parsed namespace (also for a caller holding one, like a test)."""
    names = getattr(ns, TYPED, None)
    if names is None:
        names = {}
    values = {k: v for k, v in vars(ns).items() if k in SETTINGS or k in FILE_KEYS}
    return GivenSettings(values=MappingProxyType(values), config=getattr(ns, "config", None), names=names,
                         grid=tuple(getattr(ns, "grid_items", ())), space=tuple(getattr(ns, "space_items", ())))


def _figures(ns: argparse.Namespace) -> Figures:
    return Figures(formats=tuple(ns.formats), no_plot=bool(getattr(ns, "no_plot", False)),
                   band=getattr(ns, "band", "std"), tensorboard=bool(getattr(ns, "tensorboard", False)))


def _common(parser: Parser, ns: argparse.Namespace, argv) -> dict:
    return dict(settings=given_settings(ns), resume=ns.resume, out=ns.out, name=ns.name, no_progress=ns.no_progress,
                figures=_figures(ns), argv=tuple(argv), given=parser.given_dests(ns))


def command_of(parser: Parser, ns: argparse.Namespace, argv) -> Command:
    """The typed options of the command in ``ns`` (``parser.parse_args``'s result for ``argv``); the
    only reader of the namespace besides parser.py."""
    if ns.command == "run":
        return RunCommand(**_common(parser, ns, argv), demo=ns.demo, workers=getattr(ns, "workers", None),
                          flower=bool(getattr(ns, "flower", False)), round_timeout=getattr(ns, "round_timeout", None),
                          replace=bool(getattr(ns, "replace", False)))
    if ns.command == "compare":
        return CompareCommand(**_common(parser, ns, argv), algorithms=_tuple(ns.algorithms),
                              workers=getattr(ns, "workers", None), replace=bool(getattr(ns, "replace", False)))
    if ns.command == "sweep":
        return SweepCommand(**_common(parser, ns, argv), algorithms=_tuple(ns.algorithms),
                            jobs=getattr(ns, "jobs", None), select=getattr(ns, "select", None),
                            replace=bool(getattr(ns, "replace", False)))
    if ns.command == "demo":
        return DemoCommand(rounds=ns.rounds, out=ns.out, no_progress=ns.no_progress, figures=_figures(ns),
                           names=given_settings(ns).names)
    if ns.command == "plot":
        return PlotCommand(runs=tuple(ns.runs), out=ns.out, metrics=_tuple(ns.metrics), x=tuple(ns.x),
                           title=ns.title, setup=not ns.no_setup, f_star=ns.f_star, formats=tuple(ns.formats),
                           band=ns.band)
    return AlgorithmsCommand()
