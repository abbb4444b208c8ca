"""A :class:`~.config.Config`'s pieces: the federated data, the model, the algorithm, the regularizer.

Each builder checks what it builds and words its errors in the user's terms: the flags that set the
value (``--dataset``, ``--model-opt``, ``--alg-opt``, ``--lr`` with ``--local-steps``, ``--reg``) or
the config key of a per-parameter entry (``[regularizers]`` / ``--reg-param``).

Which flag a refused value came from is found by trying the values, never by reading the error's
text (:func:`_at_fault`): each flag's values are checked alone over values known to pass (the
defaults), so an option is named because its value fails, not because its name appears in a rule.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from typing import Callable, Optional

import torch
from torch import nn

import fedkernels as fk

from ..algorithms.registry import algorithm_entry, build, typed_hparams
from .config import Config, ConfigError, show_value
from .data import FederatedData, federate, load_dataset
from .device import resolve_device
from .models import build_model as _build_model
from .regularizer_specs import (
    build_param_regularizer,
    build_regularizer,
    is_reference,
    reg_entry,
    spec_text,
    unknown_options,
)

__all__ = ["prepare_data", "build_model", "build_algorithm", "build_per_parameter", "build_run_regularizer",
           "hparam_error"]


def _opts_text(opts: dict) -> str:
    return " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in opts.items())


def prepare_data(cfg: Config) -> FederatedData:
    """Load / generate the data and split it over the clients; errors name the flags."""
    seed = cfg.seed if cfg.data_seed is None else cfg.data_seed  # see Config.data_seed
    try:
        ds = load_dataset(cfg.dataset, cfg.data_dir, seed=seed, test_fraction=cfg.test_fraction, **cfg.data_opts)
    except (ValueError, TypeError, MemoryError) as e:
        # each option's type and bounds were checked (data.check_data_options, in Config.check): what is
        # left is a rule between options (nnz <= dim) or a file, so every option given is named
        given = f" --data-opt {_opts_text(cfg.data_opts)}" if cfg.data_opts else ""
        why = "the data do not fit in memory" if isinstance(e, MemoryError) else str(e)
        raise ValueError(f"--dataset {cfg.dataset}{given}: {why}") from None
    if cfg.partition == "natural" and ds.groups is not None:
        groups = int(torch.unique(torch.as_tensor(ds.groups)).numel())
        if groups != cfg.num_clients:
            fix = {"sparse_logistic": "num_groups", "sparse_linear": "num_groups",
                   "synthetic": "num_clients"}.get(ds.name)
            also = (f", or have the generator make {cfg.num_clients} groups: --data-opt {fix}={cfg.num_clients}"
                    if fix else "")
            raise ConfigError("num_clients", cfg.num_clients,
                              f"--partition natural makes one client per group of the data, and {ds.name} has "
                              f"{groups} group(s): use -N {groups}{also}")
    try:
        return federate(ds, cfg.partition, cfg.num_clients, seed=seed, eta=cfg.eta, min_size=cfg.min_size,
                        shards_per_client=cfg.shards_per_client)
    except ValueError as e:
        raise ValueError(f"--partition {cfg.partition} -N {cfg.num_clients}: {e}") from None


def build_model(cfg: Config, ds) -> nn.Module:
    """The model, initialized from ``cfg.seed`` (every algorithm of a comparison starts here)."""
    torch.manual_seed(cfg.seed)
    try:
        model = _build_model(cfg.model, ds.in_shape, ds.outputs, **cfg.model_opts)
    except (ValueError, TypeError) as e:
        at_fault = getattr(e, "options", ())  # a models.ModelOptionError names them
        named = {k: v for k, v in cfg.model_opts.items() if k in at_fault}
        raise ValueError(f"--model {cfg.model}{' --model-opt ' + _opts_text(named) if named else ''}: {e}") from None
    return model.to(device=resolve_device(cfg.device), dtype=getattr(torch, cfg.dtype))


def _failure(attempt: Callable[[dict], object], values: dict) -> Optional[Exception]:
    """The error ``attempt(values)`` raises about a value (None: it passes)."""
    try:
        with warnings.catch_warnings():  # the run's own checks warn once, not each trial
            warnings.simplefilter("ignore")
            attempt(values)
    except (ValueError, TypeError) as e:
        return e
    return None


def _at_fault(attempt: Callable[[dict], object], references: list, sources: dict, error: Exception,
              base: Optional[str] = None) -> tuple:
    """Which of ``sources`` (label -> the values that flag sets, in the user's order) make
    ``attempt({**reference, **their values})`` fail, found by trying them, not by reading ``error``
    (the failure of all of them together). The reference values the sources are tried over: the first
    of ``references`` that passes (the defaults first).

    ``base`` (the --lr mapping, --reg-strength) is tried first; when it passes alone, the others are
    tried over it. A source that fails alone is named alone, with its own error; otherwise the rule is
    one between sources, and those whose removal lets the rest pass are named (all, if none does), with
    ``error``. Returns (labels, error); no labels when no reference passes."""
    reference = next((r for r in references if _failure(attempt, r) is None), None)
    if reference is None:
        return [], error
    over = dict(reference)
    order = list(sources) if base is None else [base, *(k for k in sources if k != base)]
    for label in order:
        e = _failure(attempt, {**over, **sources[label]})
        if e is not None:
            return [label], e
        if label == base:
            over.update(sources[base])

    def without(label):
        return {**reference, **{k: v for other in sources if other != label for k, v in sources[other].items()}}

    together = [label for label in sources if _failure(attempt, without(label)) is None]
    return together or list(sources), error


_LR = "--lr"  # the source label of the values --lr and --local-steps set (no hyper-parameter is called so)


def _algorithm_sources(cfg: Config, entry) -> tuple:
    """(references, sources) of cfg's hyper-parameters: the values of the default --lr, else of the
    user's (with -K 100 the default's steps may break a weakly convex h's rule), and per flag the values
    it sets (--lr / --local-steps: the mapped ones no --alg-opt overrides; each --alg-opt)."""
    references = [entry.from_lr(lr, cfg.local_steps) for lr in (Config.lr, cfg.lr)]
    mapped = {k: v for k, v in entry.from_lr(cfg.lr, cfg.local_steps).items() if k not in cfg.alg_opts}
    return references, {_LR: mapped, **{k: {k: v} for k, v in cfg.alg_opts.items()}}


def _hparam_fault(cfg: Config, alg_name: str, labels: list, e: Exception) -> ValueError:
    """The error ``e`` of the hyper-parameters set by the flags ``labels`` (:func:`_at_fault`), worded
    with them: ``--alg-opt KEY=VALUE`` (or its config-file key), else the ``--lr`` / ``--local-steps``
    mapping and the options that break the rule with it (no labels: every option given)."""
    rule = str(e)
    opts = {k: cfg.alg_opts[k] for k in (labels or cfg.alg_opts) if k != _LR}
    if labels and _LR not in labels:
        return ConfigError("alg_opts", _opts_text(opts) if len(opts) == 1 else opts, rule,
                           flag_text=f"--alg-opt {_opts_text(opts)}")
    mapped = {k: v for k, v in algorithm_entry(cfg.algorithm).from_lr(cfg.lr, cfg.local_steps).items()
              if k != "local_steps" and k not in cfg.alg_opts}
    shown = ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in mapped.items())
    with_opts = f", with --alg-opt {_opts_text(opts)}" if opts else ""
    return ValueError(f"--lr {cfg.lr:g} with --local-steps {cfg.local_steps} sets {alg_name}'s {shown} "
                      f"(see `python -m python_algos algorithms`; override with --alg-opt){with_opts}: {rule}")


def _maker(cfg: Config, entry):
    """The algorithm from hyper-parameter values, as ``build`` makes it (a user's class: values typed)."""
    return lambda values: entry.cls(**typed_hparams(cfg.algorithm, entry.cls, values))


def hparam_error(cfg: Config, alg_name: str, e: Exception, reg: Optional[fk.Regularizer] = None) -> ValueError:
    """``e``, raised by ``validate(reg)`` of cfg's algorithm (h: ``reg``, None: the one of cfg's --reg
    flags), in terms of the flags that set the hyper-parameters at fault: each flag's values are
    validated alone (:func:`_at_fault`), ``--alg-opt KEY=VALUE`` when the user's key is, else the
    ``--lr`` / ``--local-steps`` mapping."""
    entry = algorithm_entry(cfg.algorithm)
    h = reg if reg is not None else build_run_regularizer(cfg, None)
    references, sources = _algorithm_sources(cfg, entry)
    make = _maker(cfg, entry)
    labels, err = _at_fault(lambda values: make(values).validate(h), references, sources, e, base=_LR)
    return _hparam_fault(cfg, alg_name, labels, err)


def build_algorithm(cfg: Config):
    entry = algorithm_entry(cfg.algorithm)
    names = [f.name for f in dataclasses.fields(entry.cls)]
    if "local_steps" in cfg.alg_opts:
        # K is a run setting, not only the algorithm's: config.json, the setup line and the metrics' step
        # read cfg.local_steps, so a second value here would record one K while the algorithm ran another
        raise ValueError(f"--alg-opt {_opts_text({'local_steps': cfg.alg_opts['local_steps']})}: the number of "
                         f"local steps is a run setting; give it with -K/--local-steps "
                         f"(-K {show_value(cfg.alg_opts['local_steps'])})")
    unknown = [k for k in cfg.alg_opts if k not in names]
    if unknown:
        own = [n for n in names if n != "local_steps"]
        k_note = "; the local steps: -K/--local-steps" if "local_steps" in names else ""
        raise ValueError(f"--alg-opt {_opts_text({k: cfg.alg_opts[k] for k in unknown})}: {entry.cls.name} has no "
                         f"such hyper-parameter; its hyper-parameters: {', '.join(own)}{k_note}")
    try:
        return build(cfg.algorithm, cfg.lr, cfg.local_steps, cfg.alg_opts)
    except (ValueError, TypeError) as e:
        references, sources = _algorithm_sources(cfg, entry)
        labels, err = _at_fault(_maker(cfg, entry), references, sources, e, base=_LR)
        raise _hparam_fault(cfg, entry.cls.name, labels, err) from None


def build_per_parameter(table: dict, model: nn.Module, default_strength: float = 0.0) -> fk.PerParameter:
    """The per-parameter h of a [regularizers] table / --reg-param flags; errors name the entry."""
    mapping = {}
    for pattern, spec in table.items():
        try:
            mapping[pattern] = build_param_regularizer(spec, default_strength)
        except (ValueError, TypeError) as e:
            raise ConfigError("regularizers", spec_text(pattern, spec), str(e)) from None
    try:
        return fk.PerParameter(model, mapping)
    except (ValueError, TypeError) as e:
        # the entries at fault, by trying them (an entry alone: a pattern matching no parameter; together:
        # one shadowing another), over no penalty at all
        labels, err = _at_fault(lambda entries: fk.PerParameter(model, entries), [{}],
                                {p: {p: r} for p, r in mapping.items()}, e)
        labels = labels or list(table)
        texts = [spec_text(p, table[p]) for p in labels]
        raise ConfigError("regularizers", texts[0] if len(texts) == 1 else {p: table[p] for p in labels}, str(err),
                          flag_text=" ".join(f"--reg-param {t}" for t in texts)) from None


def build_run_regularizer(cfg: Config, model: nn.Module) -> fk.Regularizer:
    if cfg.regularizers:
        return build_per_parameter(cfg.regularizers, model, cfg.reg_strength)
    return _flag_regularizer(cfg.reg, cfg.reg_strength, cfg.reg_opts)


def _reg_opts_error(opts: dict, rule: str) -> ConfigError:
    """A ConfigError of the --reg-opt entries ``opts`` (one flag per entry on the command line; a config
    file's [reg_opts] value is worded with the file by the command line)."""
    flags = f"--reg-opt {' --reg-opt '.join(_opts_text({k: v}) for k, v in opts.items())}"
    return ConfigError("reg_opts", _opts_text(opts) if len(opts) == 1 else opts, rule, flag_text=flags)


_CONSTRAINT_HINTS = {"box": " and set its bounds with --reg-opt lo=LO --reg-opt hi=HI",
                     "l2ball": " and set its radius with --reg-opt radius=R"}


def _flag_regularizer(reg: str, strength: float, opts: dict) -> fk.Regularizer:
    """The h of --reg / --reg-strength / --reg-opt, by the rules of :mod:`.regularizer_specs`. Each error
    names only the flags that set what is wrong: an unknown option, a penalty's strength given as an
    option (the strength has one place, --reg-strength, so config.json records it once), a strength
    given to a constraint (--reg-strength's default, which the user did not type, is let through), or a
    value the regularizer refuses."""
    name = reg if is_reference(reg) else reg.lower()
    entry = reg_entry(name)
    own = entry.strength
    for key in ("strength", own) if own is not None else ():
        if key in opts:
            raise _reg_opts_error({key: opts[key]}, f"{key} is {name}'s strength, which --reg-strength sets: "
                                  f"give --reg-strength {_opts_text({key: opts[key]}).split('=', 1)[1]} instead")
    text = unknown_options(name, opts, tuple(entry.options))
    if text:
        raise _reg_opts_error({k: v for k, v in opts.items() if k not in entry.options}, text)
    if own is None:
        # zero is no h at all: a strength has nothing to weigh, and an ablation (--grid reg=zero,l1
        # --reg-strength 0.01) must not be refused for it
        if name != "zero" and strength not in (0, Config.reg_strength):
            raise ConfigError("reg_strength", strength, f"{name} is a constraint and has no strength: leave "
                              f"--reg-strength out{_CONSTRAINT_HINTS.get(name, '')}")
        strength = 0.0
    try:
        return build_regularizer(name, float(strength), **opts)
    except (ValueError, TypeError) as e:
        raise _regularizer_fault(name, float(strength), opts, e) from None


_STRENGTH = "--reg-strength"  # the source label of a penalty's strength (no option is called so)


def _regularizer_fault(name: str, strength: float, opts: dict, e: Exception) -> ValueError:
    """The error ``e`` of --reg NAME, worded with the flags whose values are at fault (:func:`_at_fault`,
    each checked alone over the defaults: --reg-strength's and the options')."""
    def attempt(values):
        values = dict(values)
        build_regularizer(name, values.pop(_STRENGTH), **values)

    penalty = reg_entry(name).strength is not None
    sources = {**({_STRENGTH: {_STRENGTH: strength}} if penalty else {}), **{k: {k: v} for k, v in opts.items()}}
    labels, err = _at_fault(attempt, [{_STRENGTH: Config.reg_strength if penalty else 0.0}], sources, e,
                            base=_STRENGTH if penalty else None)
    rule, named = str(err), {k: opts[k] for k in labels if k != _STRENGTH}
    if labels == [_STRENGTH]:
        return ConfigError("reg_strength", strength, rule)
    if labels and _STRENGTH not in labels:
        return _reg_opts_error(named, rule)
    if labels:
        also = "".join(f" --reg-opt {_opts_text({k: v})}" for k, v in named.items())
        return ConfigError("reg_strength", strength, rule, flag_text=f"--reg-strength {show_value(strength)}{also}")
    return ValueError(f"--reg {name}{' --reg-opt ' + _opts_text(opts) if opts else ''}: {rule}")
