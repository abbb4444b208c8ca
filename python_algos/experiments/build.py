"""A :class:`~.config.Config`'s pieces: the federated data, the model, the algorithm, the regularizer.

Each builder checks what it builds and words its errors in the user's terms: the flags that set the
value (``--dataset``, ``--model-opt``, ``--alg-opt``, ``--lr`` with ``--local-steps``, ``--reg``) or
the config key of a per-parameter entry (``[regularizers]`` / ``--reg-param``).

Which flags a refused value came from is read from the error itself: an algorithm's and a
regularizer's checks raise ``fk.ParameterError`` naming the field(s) whose values break the rule, and
each field is mapped here to the flag that set it (never found by searching the error's text).
"""

from __future__ import annotations

import dataclasses
import json

import torch
from torch import nn

import fedkernels as fk

from ..algorithms.registry import algorithm_entry, build
from ..clients.population import Population
from ..data import FederatedData, RowClients, federate, load_dataset, population_sources
from ..data.datasets import federate_folder
from ..data.folder import PREFIX as FOLDER
from ..data.folder import client_files
from .config import Config, ConfigError, show_value
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


def _folder_population(cfg: Config) -> bool:
    """A folder of at least FOLDER_POPULATION files under partial participation: its clients are read
    when sampled (data.federate_folder), the rest of the time they are not in memory."""
    if not cfg.dataset.startswith(FOLDER) or (cfg.clients_per_round is None and cfg.participation is None):
        return False
    try:
        return len(client_files(cfg.dataset[len(FOLDER):])) >= population_sources.FOLDER_POPULATION
    except (OSError, ValueError):  # the eager path names what is wrong with the folder
        return False


def prepare_data(cfg: Config) -> FederatedData:
    """Load / generate the data and split it over the clients; errors name the flags."""
    seed = cfg.seed if cfg.data_seed is None else cfg.data_seed  # see Config.data_seed
    try:
        if _folder_population(cfg):
            if cfg.partition != "natural" or cfg.num_clients != len(client_files(cfg.dataset[len(FOLDER):])):
                raise ConfigError("num_clients", cfg.num_clients, f"the folder's files are its clients: use "
                                  f"--partition natural -N {len(client_files(cfg.dataset[len(FOLDER):]))}")
            fed = federate_folder(cfg.dataset[len(FOLDER):], cfg.standardize, seed, cfg.test_fraction,
                                  **cfg.data_opts)
            fed.clients = Population(len(fed.clients), fed.clients, recipe=fed.clients.recipe)
            return fed
        ds = load_dataset(cfg.dataset, cfg.data_dir, seed=seed, test_fraction=cfg.test_fraction, **cfg.data_opts)
    except ConfigError:
        raise
    except (ValueError, TypeError, MemoryError) as e:
        if str(e).startswith("standardize: "):
            raise ConfigError("standardize", cfg.standardize, str(e)[len("standardize: "):]) from None
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
        fed = federate(ds, cfg.partition, cfg.num_clients, seed=seed, eta=cfg.eta, min_size=cfg.min_size,
                       shards_per_client=cfg.shards_per_client, standardize=cfg.standardize,
                       samples_per_client=cfg.samples_per_client)
    except ValueError as e:
        if str(e).startswith("standardize: "):
            raise ConfigError("standardize", cfg.standardize, str(e)[len("standardize: "):]) from None
        raise ValueError(f"--partition {cfg.partition} -N {cfg.num_clients}: {e}") from None
    if isinstance(fed.clients, RowClients):  # --partition cyclic: client i gathered when sampled, never all N
        fed.clients = Population(len(fed.clients), fed.clients, recipe=fed.clients.recipe)
    return fed


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


def _named_fields(e: Exception) -> tuple:
    """The fields an error names (``fk.ParameterError.fields``; none for a plain ValueError)."""
    return tuple(getattr(e, "fields", ()) or ())


def hparam_error(cfg: Config, alg_name: str, e: Exception) -> ValueError:
    """``e``, raised building or validating cfg's algorithm, worded with the flags that set the fields
    it names: ``--alg-opt KEY=VALUE`` (or its config-file key) for the user's keys, the ``--lr`` /
    ``--local-steps`` mapping for the values it sets, ``--local-steps`` for K. An error that names no
    field the user set (a user's class raising a plain ValueError) names every option given."""
    fields = _named_fields(e)
    mapped = {k: v for k, v in algorithm_entry(cfg.algorithm).from_lr(cfg.lr, cfg.local_steps).items()
              if k not in cfg.alg_opts}
    opts = {k: v for k, v in cfg.alg_opts.items() if k in fields}
    by_lr = {k: v for k, v in mapped.items() if k in fields and k != "local_steps"}
    by_k = "local_steps" in fields
    if not (opts or by_lr or by_k):
        opts, by_lr = dict(cfg.alg_opts), {k: v for k, v in mapped.items() if k != "local_steps"}
    rule = str(e)
    if by_lr:
        shown = ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in by_lr.items())
        with_opts = f", with --alg-opt {_opts_text(opts)}" if opts else ""
        return ValueError(f"--lr {cfg.lr:g} with --local-steps {cfg.local_steps} sets {alg_name}'s {shown} "
                          f"(see `python -m python_algos algorithms`; override with --alg-opt){with_opts}: {rule}")
    if opts:
        with_k = f" with --local-steps {cfg.local_steps}" if by_k else ""
        return ConfigError("alg_opts", _opts_text(opts) if len(opts) == 1 else opts, rule,
                           flag_text=f"--alg-opt {_opts_text(opts)}{with_k}")
    if by_k:
        return ConfigError("local_steps", cfg.local_steps, rule)
    return ValueError(f"-a {cfg.algorithm}: {rule}")


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
        # the entries the error names (a pattern matching no parameter; one shadowing another: both)
        labels = [p for p in table if p in _named_fields(e)] or list(table)
        texts = [spec_text(p, table[p]) for p in labels]
        raise ConfigError("regularizers", texts[0] if len(texts) == 1 else {p: table[p] for p in labels}, str(e),
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


def _regularizer_fault(name: str, strength: float, opts: dict, e: Exception) -> ValueError:
    """The error ``e`` of --reg NAME, worded with the flags that set the fields it names: the strength
    (and an option that defaults to it, elastic net's l2) is --reg-strength's, an option given is its
    --reg-opt; a field left at its default is no flag's (none named: every option given)."""
    own, fields = reg_entry(name).strength, _named_fields(e)
    derived = {k for k, v in reg_entry(name).options.items() if v is fk.regularizers.SAME_AS_STRENGTH}
    by_strength = own is not None and any(f == own or (f in derived and f not in opts) for f in fields)
    rule, named = str(e), {k: v for k, v in opts.items() if k in fields}
    if not (by_strength or named):
        by_strength, named = own is not None, dict(opts)
    if by_strength and not named:
        return ConfigError("reg_strength", strength, rule)
    if named and not by_strength:
        return _reg_opts_error(named, rule)
    if named:
        also = "".join(f" --reg-opt {_opts_text({k: v})}" for k, v in named.items())
        return ConfigError("reg_strength", strength, rule, flag_text=f"--reg-strength {show_value(strength)}{also}")
    return ValueError(f"--reg {name}: {rule}")
