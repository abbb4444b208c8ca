"""The command line's settings: config files merged with flags, output folders, summaries."""

from __future__ import annotations

import argparse
import os
import re
from typing import Optional, Sequence, Union

from ...runfolder.files import as_json, parse_json
from ...runfolder.records import CONFIG
from .. import launch
from ..config import RESULT_KEYS, SETTINGS, Config, ConfigError, FromFile, check_given, flag, unknown_keys_text
from ..folders import default_out_dir, read_config_json
from ..plotting import NothingToPlot, plot_runs  # matplotlib itself: imported when a figure is drawn
from ..prepare import check_algorithm_names, prepare_run
from ..regularizer_specs import spec_text
from ..seeds import seed_list
from ..tables import column_name, format_table
from .options import Common, Figures, GivenSettings, given_settings
from .parser import DEMO_ALGORITHMS, TYPED


def read_config_file(path: str) -> dict:
    """The mapping in a TOML / YAML / JSON file; a syntax error is one line naming the file and line."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".toml", ".yaml", ".yml", ".json"):
        raise ValueError(f"config file {path}: use .toml, .yaml/.yml or .json")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ValueError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"--config {path}: is a folder, not a config file") from None
    except PermissionError:
        raise ValueError(f"--config {path}: not allowed to read it (permission denied)") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if ext == ".toml":
        try:
            import tomllib  # here, not at the top: tomli stands in for it on Python < 3.11
        except ImportError:  # Python < 3.11
            try:
                import tomli as tomllib
            except ImportError:
                raise SystemExit("reading TOML needs Python >= 3.11 or `pip install tomli`") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}, {_toml_error_text(e)}") from None
    elif ext in (".yaml", ".yml"):
        try:
            import yaml  # here, not at the top: pyyaml is optional (only a .yaml config needs it)
        except ImportError:
            raise SystemExit("reading YAML needs `pip install pyyaml` (or use a .toml / .json config)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
            line = mark.line + 1 if mark is not None else "?"
            problem = " ".join(str(getattr(e, "problem", None) or e).split())
            raise ValueError(f"{path}, line {line}: {problem}") from None
        data = {} if data is None else data
    else:
        data = parse_json(text, path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a table / mapping of keys, got a {type(data).__name__}")
    return data


def _toml_error_text(e) -> str:
    """tomllib's message with its position first: 'line 3, column 7: Invalid value', or 'at the
    end of the file: Unclosed array'. Python >= 3.14 gives msg / lineno / colno; older versions
    only a message ending in '(at line L, column C)' or '(at end of document)'."""
    msg = str(e)
    m = re.search(r" \(at line (\d+), column (\d+)\)$", msg)
    if msg.endswith(" (at end of document)"):
        return f"at the end of the file: {msg[:-len(' (at end of document)')]}"
    if getattr(e, "lineno", None) is not None and getattr(e, "msg", None):
        return f"line {e.lineno}, column {e.colno}: {e.msg}"
    if m:
        return f"line {m[1]}, column {m[2]}: {msg[:m.start()]}"
    return msg  # a message of another shape: kept whole


_DICT_KEYS = tuple(k for k, s in SETTINGS.items() if s.options)  # tables: a flag adds to the file's


def merge_settings(given: Union[GivenSettings, argparse.Namespace], extra_keys: Sequence[str] = ()) -> dict:
    """Config file values, overridden by the flags given on the command line. The file's keys are
    added to ``given.names`` (an error about one of them names the file and key). A parsed
    namespace (a caller holding one, like a test) is read once into its :class:`GivenSettings`."""
    if isinstance(given, argparse.Namespace):
        given = given_settings(given)
    base = read_config_file(given.config) if given.config else {}
    base = {k.replace("-", "_"): v for k, v in base.items()}
    in_file = set(base)
    names = set(SETTINGS) | set(extra_keys)
    unknown = [k for k in base if k not in names]
    if unknown:  # only the file can hold one: argparse takes no unknown flag
        raise ValueError(f"{given.config}: {unknown_keys_text(unknown, names)}")
    flags = set()
    for k, v in given.values.items():
        if k not in names or (v is None and k in extra_keys):  # compare's -a not given: the file's list stands
            continue
        flags.add(k)
        if k in _DICT_KEYS:
            if base.get(k) is not None and not isinstance(base[k], dict):
                continue  # Config.check names the file's malformed value
            base[k] = {**(base.get(k) or {}), **dict(v)}
        else:
            base[k] = v
    # a table the file and flags both add to is named by the file (its entries are merged)
    given.names.update({k: FromFile(given.config) for k in in_file if k not in flags or k in _DICT_KEYS})
    if "partition" not in _swept(given, base):  # a sweep over partitions uses eta in some points
        check_given(base)
    if base.get("regularizers") and any(k in base for k in ("reg", "reg_opts")):
        spec = " ".join(spec_text(k, v) for k, v in base["regularizers"].items())
        raise ConfigError("regularizers", spec,
                          "give --reg (one penalty for the whole model) or --reg-param / a [regularizers] table (one "
                          "per parameter), not both; a '*' pattern gives the remaining parameters a default")
    return base


RESEED_ALONE = ("draws the data anew with each seed, so it needs several seeds (--seeds 0,1,2 or a --seed "
                 "list); with one seed there is nothing to redraw: leave it out")


def _swept(given: GivenSettings, base: dict) -> set:
    """The keys a sweep varies (--grid / --space, the file's grid / space tables)."""
    keys = {k for k, _ in given.grid} | {k for k, _ in given.space}
    for table in ("grid", "space"):
        if isinstance(base.get(table), dict):
            keys |= set(base[table])
    return keys


def output_folder(cmd: Common, name: str) -> str:
    """The command's results folder: --out, else ./results/NAME (--name), else a new default one."""
    if cmd.out:
        return cmd.out
    if cmd.name:
        return os.path.join("results", cmd.name)
    return default_out_dir(name)


def split_alg_opts(opts: dict, algorithms: Sequence[str]):
    """compare: {ALG: {...}} / 'ALG.KEY' entries go to one algorithm, plain keys to all."""
    common, per = {}, {a: {} for a in algorithms}
    for k, v in opts.items():
        if isinstance(v, dict) and k in per:
            per[k].update(v)
        elif "." in k and k.rsplit(".", 1)[0] in per:  # rsplit: ALG may be package.module:Class
            a, key = k.rsplit(".", 1)
            per[a][key] = v
        elif "." in k:
            raise ValueError(f"--alg-opt {k}={v}: {k.split('.', 1)[0]!r} is not one of the compared algorithms "
                             f"({' '.join(algorithms)})")
        else:
            common[k] = v
    return {a: {**common, **per[a]} for a in algorithms}


# --------------------------------------------------------------------------- #
# Commands
# --------------------------------------------------------------------------- #


def print_summary(summary: dict) -> None:
    f = summary["final"]
    keys = [k for k in ("f", "h", "f+h", "grad_map_sq", "normal_map_sq", "sparsity", "test_acc", "train_acc",
                        "support_f1") if k in f]
    print(format_table(["round", *(column_name(k, f.get("grad_map_step")) for k in keys), column_name("elapsed")],
                       [[summary["rounds_done"], *[f[k] for k in keys], summary["elapsed"]]]))


# The one table of the flags a --resume accepts (argparse destinations), by what it resumes; the settings'
# part derives from each setting's resume rule (config.setting's on_resume). A resumed run must end with the
# bits of the uninterrupted run, so these change only what is shown or written around the rounds, or how many
# there are: the settings that may change on resume (--rounds: extend), the output flags and --workers (the
# clients re-cut over P processes: docs/scaling-out.md). `run --resume` (one run, in this process or its
# torchrun ranks) may also change the run_may_change settings (--checkpoint-every: a checkpoint only reads the
# state; tests/test_resume_checks.py proves the bits equal); a comparison, seeds or Flower resume keeps the
# folder's (they do not pass it on). Flower takes no --workers (check_flower_flags refuses it with its own
# reason); a sweep takes its own flags only. Refused: every other flag; the settings kept for another reason
# than the result (--executor, --threads) say why (their why_kept). The refusal lists exactly the entry.
_MAY_CHANGE = tuple(k for k, s in SETTINGS.items() if s.on_resume == "may_change")
_OUTPUT = ("no_progress", "formats", "no_plot", "band", "tensorboard")
RESUME_FLAGS = {"group": _MAY_CHANGE + ("workers", *_OUTPUT),  # compare, --seeds
                "run": _MAY_CHANGE + ("workers", *_OUTPUT) + tuple(k for k, s in SETTINGS.items()
                                                                   if s.on_resume == "run_may_change"),
                "flower": _MAY_CHANGE + _OUTPUT + ("flower", "round_timeout"),
                "sweep": ("jobs", *_OUTPUT, "select")}
# argparse destinations that are not settings: present in every namespace (or refused on their own
# when given, like --out), never listed as accepted.
_NOT_SETTINGS = ("command", "demo", "resume", "argv", "out", "name", "config", "algorithms", TYPED)


def quiet(_text: str) -> None:
    pass


def restarted_run(cfg, out: str) -> bool:
    """True in a job that torchrun restarted (``--max-restarts``) whose run folder this job started:
    the restarted ranks resume it instead of starting over. A folder holding a run of other
    settings (the first attempt refused it) is left alone: the fresh-run checks then refuse it again."""
    if not (launch.distributed() and launch.restarting() and os.path.isfile(os.path.join(out, CONFIG))):
        return False
    try:
        saved = as_json(read_config_json(os.path.join(out, CONFIG)).to_dict())
    except ValueError:
        return False
    now = as_json(cfg.to_dict())
    return all(saved.get(k) == now.get(k) for k in RESULT_KEYS if k != "rounds")


def check_resume_flags(cmd: Common, resumed: str = "group") -> None:
    """With --resume, the settings come from the folder: refuse every other flag given, with a
    ``ValueError`` (printed as ``error: ...``) that lists the accepted flags, ``RESUME_FLAGS[resumed]``,
    so the list cannot drift from the check."""
    allowed = RESUME_FLAGS[resumed]
    # the settings count as given too where options built without argparse did not list them in cmd.given
    given = [k for k in (*cmd.given, *(k for k in cmd.settings.values if k not in cmd.given))
             if k not in allowed and k not in _NOT_SETTINGS]
    named = {"out": cmd.out, "name": cmd.name, "config": cmd.settings.config,
             "algorithms": getattr(cmd, "algorithms", None)}
    given += [k for k, v in named.items() if v]
    if given:
        flags = [flag(k) for k in allowed]
        accepted = " and ".join([", ".join(flags[:-1]), flags[-1]] if len(flags) > 1 else flags)
        typed = cmd.names
        why = "".join(f"; {typed.get(k, flag(k))}: {SETTINGS[k].why_kept}" for k in given
                      if k in SETTINGS and SETTINGS[k].why_kept)
        whose = "the sweep's" if resumed == "sweep" else "its"
        raise ValueError(f"--resume takes {whose} settings from {cmd.resume}, so only {accepted} may be given "
                         f"(got {', '.join(typed.get(g, flag(g)) for g in given)}){why}; nothing was changed")


def replace_requested(cmd) -> bool:
    """``--replace``: only a folder the user named (``--out`` / ``--name``) is replaced; a default
    folder is new by construction (:func:`~python_algos.runfolder.folder.claim_new_folder`)."""
    if not getattr(cmd, "replace", False):
        return False
    if not (cmd.out or cmd.name):
        raise ValueError("--replace: needs --out DIR or --name NAME (the folder to replace); without them every "
                         "command writes to a new folder")
    return True


def resumed_run(cmd: Common):
    """``run --resume DIR`` checked and prepared (writes nothing): the folder's run, with
    ``--checkpoint-every`` when given (the only setting a resume may change: it decides when the
    state is saved, never what a round computes). config.json then records the new interval, so a
    later resume keeps it."""
    check_resume_flags(cmd, "run")
    prep = prepare_run(None, cmd.resume, resume=True, rounds=cmd.settings.get("rounds"))
    changed = {k: v for k, s in SETTINGS.items() if s.on_resume == "run_may_change"
               and (v := cmd.settings.get(k)) is not None and v != getattr(prep.cfg, k)}
    if changed:
        cfg = prep.cfg.replace(**changed)
        cfg.check()  # a bad value is named by its flag, before anything is written
        prep.cfg, prep.rewrite_config = cfg, True
    return prep


def compare_settings(given: GivenSettings, algorithms: Optional[Sequence[str]]):
    """(the shared Config, the algorithm names, each algorithm's own options, the seeds (None: one each),
    reseed_data) of a ``compare``, checked (values, algorithm names); ``algorithms``: -a, else the config
    file's, else the demo's."""
    merged, seeds, reseed = seed_settings(given, extra=("algorithms",))
    algorithms = list(algorithms or merged.pop("algorithms", None) or DEMO_ALGORITHMS)
    merged.pop("algorithms", None)
    twice = sorted({a for a in algorithms if algorithms.count(a) > 1})
    if twice:  # both would write one folder, OUT/<algorithm>
        raise ValueError(f"-a/--algorithms {' '.join(algorithms)}: {', '.join(twice)} is given twice; a comparison "
                         f"runs each algorithm once (into OUT/<algorithm>): give each once, or compare other "
                         f"settings of one algorithm with `sweep`")
    per = split_alg_opts(merged.pop("alg_opts", {}) or {}, algorithms)
    # the cheap checks here (from_dict checks every value), before the "comparing ..." line: a misspelt
    # name or a bad flag is then the only thing printed (compare_experiments checks the rest before it writes)
    cfg = Config.from_dict(merged)
    check_algorithm_names(algorithms)
    return cfg, algorithms, per, seeds, reseed


def overview_figure(folder: str, figures: Figures, draw=None) -> None:
    """The run's / comparison's overview figure in its folder (``draw()``: other figures, a sweep's),
    and their paths; a missing matplotlib is a note, not a failure (the results are written)."""
    if figures.no_plot:
        return
    try:
        files = draw() if draw is not None else plot_runs([folder], out_dir=folder, per_metric=False,
                                                          formats=figures.formats, band=figures.band)
    except (RuntimeError, NothingToPlot) as e:  # no matplotlib, or no metric recorded (--metrics-every 0)
        print(f"no figure: {e}")
        return
    for f in files:
        print(f"figure: {f}")


def seed_settings(given: GivenSettings, extra=()):
    """(merged settings without the seed keys, the seeds (None: one run), reseed_data) of a run / compare with
    seeds, or a sweep."""
    merged = merge_settings(given, extra_keys=("seeds", "reseed_data", *extra))
    seeds = seed_list(merged.get("seed"), merged.pop("seeds", None))
    reseed = merged.pop("reseed_data", False)
    if not isinstance(reseed, bool):
        raise ValueError(f"reseed_data = {reseed!r}: must be true or false")
    if reseed and len(seeds or ()) < 2:
        raise ConfigError("reseed_data", reseed, RESEED_ALONE)
    if seeds:
        merged["seed"] = seeds[0]
    return merged, seeds, reseed
