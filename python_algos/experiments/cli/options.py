"""The command line's typed options: :func:`command_of` turns argparse's namespace, once, into one
frozen object per command (:class:`RunCommand`, :class:`CompareCommand`, :class:`SweepCommand`,
:class:`DemoCommand`, :class:`PlotCommand`, :class:`AlgorithmsCommand`). Every function below
``main`` takes these objects or plain values, so what a command reads is declared here with its
type, and a command can be called without argparse (a test, another program). The flags, their
parsing and defaults are declared once, in parser.py: a field takes the value of the flag whose
destination it is named after (tests/test_cli_typed_options.py checks that each field has one).

The settings themselves stay declared in config.py (``setting(...)``): :class:`GivenSettings` holds
the ones the command line gave, as parsed there; the config file is merged with them by
:func:`~.settings.merge_settings` where each command needs its Config (after its own flag checks,
so the first error a command reports does not depend on this conversion)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
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


def given_settings(ns: argparse.Namespace) -> GivenSettings:
    """The settings part of a parsed namespace (also for a caller holding one, like a test)."""
    names = getattr(ns, TYPED, None)
    if names is None:
        names = {}
    values = {k: v for k, v in vars(ns).items() if k in SETTINGS or k in FILE_KEYS}
    return GivenSettings(values=MappingProxyType(values), config=getattr(ns, "config", None), names=names,
                         grid=tuple(getattr(ns, "grid_items", ())), space=tuple(getattr(ns, "space_items", ())))


def _read(cls, ns: argparse.Namespace, **derived):
    """``cls`` from the namespace: each field that is a flag's destination takes the value parsed
    (parser.py declares the flag, its type and default; a list becomes a tuple), a flag the command
    lacks or did not give (a SUPPRESS default) keeps the field's default; ``derived``: the others."""
    got = {f.name: getattr(ns, f.name) for f in fields(cls) if f.name not in derived and hasattr(ns, f.name)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in got.items()}, **derived)


# each command's options class, by its name (main runs the demo when no command is given)
CLASSES = {"run": RunCommand, "compare": CompareCommand, "sweep": SweepCommand, "demo": DemoCommand,
           "plot": PlotCommand, "algorithms": AlgorithmsCommand}


def command_of(parser: Parser, ns: argparse.Namespace, argv) -> Command:
    """The typed options of the command in ``ns`` (``parser.parse_args``'s result for ``argv``); the
    only reader of the namespace besides parser.py."""
    cls, derived = CLASSES[ns.command], {}
    if issubclass(cls, Common):
        derived = dict(settings=given_settings(ns), argv=tuple(argv), given=parser.given_dests(ns))
    elif cls is DemoCommand:
        derived = dict(names=given_settings(ns).names)
    elif cls is PlotCommand:
        derived = dict(setup=not ns.no_setup)
    if any(f.name == "figures" for f in fields(cls)):
        derived["figures"] = _read(Figures, ns)
    return _read(cls, ns, **derived)
