"""A :class:`~.config.Config`'s pieces: the federated data, the model, the algorithm, the regularizer.

Each builder checks what it builds and words its errors in the user's terms: the flags that set the
value (``--dataset``, ``--model-opt``, ``--alg-opt``, ``--lr`` with ``--local-steps``, ``--reg``) or
the config key of a per-parameter entry (``[regularizers]`` / ``--reg-param``).
"""

from __future__ import annotations

import dataclasses
import json
import re

import torch
from torch import nn

import fedkernels as fk

from ..algorithms.registry import ALGORITHMS, build
from .config import Config, ConfigError, show_value
from .data import FederatedData, federate, load_dataset
from .device import resolve_device
from .models import build_model as _build_model
from .regularizer_specs import (
    OPTIONS,
    STRENGTH_NAMES,
    build_param_regularizer,
    build_regularizer,
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


def hparam_error(cfg: Config, alg_name: str, e: Exception) -> ValueError:
    """``e`` (raised by an algorithm about one of its hyper-parameters) in terms of the flags that set it:
    ``--alg-opt KEY=VALUE`` when the user gave that key, else the ``--lr`` / ``--local-steps`` mapping."""
    msg = str(e)
    given = [k for k in cfg.alg_opts if re.search(rf"\b{re.escape(k)}\b", msg)]
    if given:
        return ValueError(f"--alg-opt {_opts_text({k: cfg.alg_opts[k] for k in given})}: {msg}")
    mapped = {k: v for k, v in ALGORITHMS[cfg.algorithm.lower()].from_lr(cfg.lr, cfg.local_steps).items()
              if k != "local_steps" and k not in cfg.alg_opts}
    shown = ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in mapped.items())
    return ValueError(f"--lr {cfg.lr:g} with --local-steps {cfg.local_steps} sets {alg_name}'s {shown} "
                      f"(see `python -m python_algos algorithms`; override with --alg-opt): {msg}")


def build_algorithm(cfg: Config):
    entry = ALGORITHMS[cfg.algorithm.lower()]
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
        raise hparam_error(cfg, entry.cls.name, e) from None


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
        text = next((spec_text(p, s) for p, s in table.items() if repr(p) in str(e)), None)
        raise ConfigError("regularizers", text if text is not None else table, str(e)) from None


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
    name = reg.lower()
    own = STRENGTH_NAMES.get(name)
    for key in ("strength", own) if own is not None else ():
        if key in opts:
            raise _reg_opts_error({key: opts[key]}, f"{key} is {name}'s strength, which --reg-strength sets: "
                                  f"give --reg-strength {_opts_text({key: opts[key]}).split('=', 1)[1]} instead")
    text = unknown_options(name, opts, tuple(OPTIONS[name]))
    if text:
        raise _reg_opts_error({k: v for k, v in opts.items() if k not in OPTIONS[name]}, text)
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
        msg = str(e)
        named = {k: v for k, v in opts.items() if re.search(rf"\b{re.escape(k)}\b", msg)}
        if named:
            raise _reg_opts_error(named, msg) from None
        if own is not None and re.search(rf"\b{re.escape(own)}\b", msg):
            raise ConfigError("reg_strength", strength, msg) from None
        raise ValueError(f"--reg {name}{' --reg-opt ' + _opts_text(opts) if opts else ''}: {msg}") from None
