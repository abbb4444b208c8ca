"""Grid sweeps: every point of a grid of hyper-parameters, for one or several algorithms, × seeds,
in parallel worker processes, resumable (``python -m python_algos sweep``).

    python -m python_algos sweep -a fedcanon --grid alpha=0.01,0.05,0.1 --grid beta=log:1e-3:1e-1:3 \\
        --seeds 3 --jobs 2 --dataset synthetic ...            # the other flags as in `run`
    python -m python_algos sweep --resume results/<sweep>     # what is missing or was interrupted

Folder::

    OUT/sweep.json                          the settings (base config, algorithms, grid, seeds)
    OUT/<algorithm>/<k1=v1,k2=v2>/seed-<s>/ one run folder per point and seed
    OUT/summary.json, OUT/summary.md        every point's final metrics (mean ± std over the seeds),
                                            the skipped points with the reason, the best point per algorithm
    OUT/heatmap-<algorithm>.<ext>           2-D grids: the selected metric over the grid
    OUT/best.<ext>                          the best point of each algorithm, mean with a band

A grid key is a run setting (``lr``, ``local_steps``, ``reg_strength``, ...: the flags of `run` with
``_`` for ``-``) or a hyper-parameter of the algorithm (``alpha``, ``beta``, ...), which then applies
to the algorithms that have it. A key that is both (``eta``: the Dirichlet concentration ``--eta``,
and the step η of FedNMap, ZA1, FedDR and FedADMM) is refused unless qualified: ``fednmap.eta=...``
(that algorithm's hyper-parameter) or ``run.eta=...`` (the run setting); any key may be qualified
so. A swept run setting gets the checks of its flag (``lr=-1`` is refused as ``--lr -1`` is, and a
partition setting no swept partition reads, as ``--eta`` under ``--partition iid``), before anything
is written. A point that breaks an algorithm's rule (its constructor or ``validate(reg)`` raises,
e.g. α·ρ ≥ 1) is skipped and listed with the reason. Each point has its own folder, named by its
values (``%g``, or the full value where two would print alike: ``lr=0.5`` and ``lr=0.5000001``); a
value given twice (``1,1.0``) is refused.

Runs go to ``--jobs`` worker processes (started with ``spawn``: no fork of a process holding
torch's threads; :class:`Workers` keeps them), each run on one torch thread unless ``--threads``
says otherwise. Resuming never runs a finished point again (its ``summary.json`` says completed
or diverged at the asked rounds); a run that was interrupted continues from its checkpoint, one
that never started starts. Ctrl-C, SIGTERM and SIGHUP stop every running run at once, each writing
its summary (status interrupted); every worker process ends before the command does (killed after
:data:`STOP_GRACE` seconds), and the sweep's summary lists what is left (exit status 128 + the
signal). A worker process that dies (killed, out of memory) fails its run with the reason
(``worker process died (signal 9, SIGKILL)``, in the table's notes and ``summary.json``'s
``failed``); a fresh process runs the other points, the summary is written, the command exits 1,
and ``--resume`` runs the failed run again. A worker dies with the command, however the command
dies (SIGKILL and out-of-memory kills included: :mod:`~python_algos.system.processes`). Every
file is replaced atomically, so nothing is left half-written.

‖G_s‖² depends on s, so every point measures it at one s (:func:`sweep_metric_step`: ``--metric-step``,
else the smallest lr·K of the grid), recorded in ``sweep.json`` and shown in the table's header. The
parent prints one progress line per finished run and re-emits the runs' warnings, each once.
``sweep.json`` also records ``select`` and the CLI's figure settings (``figures``), which a resume
reuses unless given again.

``sweep --optuna N --space ...`` (optuna_search.py) is a random search over the same keys: its
trials run through :func:`plan_point`, :class:`Workers` and :func:`run_point` into these folders,
and end with the same :func:`summarize`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import multiprocessing
import multiprocessing.connection as mp_connection
import os
import shlex
import signal
import sys
import threading
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence

from ..algorithms.registry import algorithm_entry
from ..runfolder.files import RunFolderError, read_json_object, write_json, write_text_atomically
from ..runfolder.folder import check_group_start, open_group_folder
from ..runfolder.progress import human_time
from ..runfolder.records import CONFIG, METRICS, SUMMARY, read_summary, run_folder_name
from ..runfolder.signals import HELD_SIGNALS, exit_code
from ..system import processes
from ..system.lock import folders_locked, lock_folder
from . import prepare  # prepare.prepare_run looked up when called (tests hold two commands there: test_group_folders)
from .aggregate import SEED_DIR, final_stats, stats_cell
from .build import build_algorithm, build_run_regularizer, hparam_error
from .compare import finished_run  # completed at the rounds asked, or diverged: never run again
from .config import PARTITION_KEYS, SETTINGS, Config, ConfigError, check_given
from .config import flag as setting_flag
from .run import Interrupted, execute_run
from .seeds import seed_configs
from .tables import column_name, format_table, status_cell, warning_notes
from .tensorboard import write_events
from .values import parse_value

__all__ = ["parse_grid_values", "parse_grid", "plan_sweep", "run_sweep", "SweepInterrupted", "SELECT",
           "STOP_AFTER_ENV", "KILL_POINT_ENV", "SWEEP_FILE", "sweep_metric_step", "key_meaning", "check_keys",
           "check_swept_settings", "Workers", "plan_point", "summarize", "value_text", "point_name",
           "run_status", "read_sweep", "SWEEP_RECORDS", "STUDY_FILE", "sweep_resume_command",
           "check_select_and_jobs"]

SWEEP_FILE = "sweep.json"
STUDY_FILE = "optuna.db"  # a random search's study (optuna_search.py), beside its sweep.json
# a sweep's own files beside its runs (a replacement deletes them with the runs): its settings, summary,
# figures (heatmap-<algorithm>.<ext>, best.<ext>) and a random search's study (SQLite adds -journal files)
SWEEP_RECORDS = (SWEEP_FILE, SUMMARY, "summary.md", "heatmap-*", "best.*", STUDY_FILE + "*")
STOP_AFTER_ENV = "_FEDKERNELS_TEST_SWEEP_STOP_AFTER"  # test hook: act as on Ctrl-C after this many runs ended
KILL_POINT_ENV = "_FEDKERNELS_TEST_SWEEP_KILL_POINT"  # test hook: SIGKILL the worker given the run folder ending so
STOP_GRACE = 10.0  # seconds the runs get to write their summaries after a stop, before their processes are killed
# --select: the metric, and whether the best point has its smallest or largest mean
SELECT = {"f_plus_h": ("f+h", min), "test_acc": ("test_acc", max), "stationarity": ("grad_map_sq", min)}


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep, after its summary (what finished, what is left) was written."""

    def __init__(self, out_dir: str, table: str, cause: Optional[BaseException] = None):
        super().__init__(f"the sweep in {out_dir} was interrupted")
        self.out_dir, self.table = out_dir, table
        self.exit_code = exit_code(cause if cause is not None else KeyboardInterrupt())  # 130, 143 on SIGTERM, ...
        self.resume_command = sweep_resume_command(out_dir)


# --------------------------------------------------------------------------- #
# The grid
# --------------------------------------------------------------------------- #


def parse_grid_values(key: str, spec, flag: str = "--grid") -> list:
    """``"0.01,0.05,0.1"``, ``"log:1e-3:1e-1:5"`` (5 values spaced evenly in log from 1e-3 to 1e-1)
    or a list (config file) -> the values; errors name ``FLAG KEY=SPEC`` (``--space``: a search's choices)."""
    what = f"{flag} {key}={spec if not isinstance(spec, (list, tuple)) else ','.join(map(str, spec))}"
    if isinstance(spec, (list, tuple)):
        vals = list(spec)
    elif isinstance(spec, str) and spec.strip().lower().startswith("log:"):
        parts = spec.strip().split(":")
        try:
            lo, hi, n = float(parts[1]), float(parts[2]), int(parts[3])
            if len(parts) != 4:
                raise ValueError
        except (ValueError, IndexError):
            raise ValueError(f"{what}: expected log:LOW:HIGH:COUNT, e.g. log:1e-3:1e-1:5") from None
        if not (lo > 0 and hi > 0 and math.isfinite(lo) and math.isfinite(hi) and n >= 1):
            raise ValueError(f"{what}: log:LOW:HIGH:COUNT needs LOW, HIGH > 0 and COUNT >= 1")
        vals = [lo] if n == 1 else [float(f"{math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (n - 1)):.6g}")
                                    for i in range(n)]
    elif isinstance(spec, str):
        vals = [parse_value(v.strip()) for v in spec.split(",") if v.strip()]
    else:
        vals = [spec]
    if not vals:
        raise ValueError(f"{what}: no values")
    repeated = _repeated(vals)
    if repeated is not None:  # the same run twice (1 and 1.0 are one number: one K, one lr)
        raise ValueError(f"{what}: a value is repeated ({' and '.join(map(str, repeated))} are the same "
                         f"value); give each value once")
    return vals


def _same_value(a, b) -> bool:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return a == b if numbers else json.dumps(a) == json.dumps(b)


def _repeated(vals: list):
    """The first two values of ``vals`` that are the same value, or None."""
    for i, v in enumerate(vals):
        for w in vals[:i]:
            if _same_value(v, w):
                return w, v
    return None


def parse_keyed(items, flag: str, parse: Callable) -> dict:
    """``[(key, spec), ...]`` or ``{key: spec}`` -> ``{key: parse(key, spec)}`` (order kept; dashes in
    keys become underscores); ``flag`` names the option in errors (``--grid``, ``--space``)."""
    items = items.items() if isinstance(items, dict) else items
    out = {}
    for k, spec in items:
        if not isinstance(k, str) or not k:
            raise ValueError(f"{flag} {k!r}: the key must be a setting or a hyper-parameter name")
        out[k.replace("-", "_")] = parse(k, spec)
    return out


def parse_grid(items) -> Dict[str, list]:
    """``[(key, spec), ...]`` or ``{key: spec}`` -> ``{key: [values]}`` (order kept)."""
    return parse_keyed(items, "--grid", parse_grid_values)


def _hparams(algorithm: str) -> List[str]:
    return [f.name for f in dataclasses.fields(algorithm_entry(algorithm).cls)]


RUN_QUALIFIER = "run"  # --grid run.eta=...: the run setting eta, whatever the algorithms' hyper-parameters


def _fed_by_setting(algorithm: str, name: str) -> bool:
    """Whether hyper-parameter ``name`` of ``algorithm`` is set by the run setting of the same name
    (``lr`` and ``local_steps`` feed the algorithm through its ``from_lr`` map): then the two are
    one thing and a bare key is unambiguous. Detected by mapping distinctive probe values."""
    probe = {"lr": 0.123456789, "local_steps": 7}
    if name not in probe:
        return False
    return algorithm_entry(algorithm).from_lr(probe["lr"], probe["local_steps"]).get(name) == probe[name]


def key_meaning(key: str, algorithm: str):
    """What sweep key ``key`` sets for ``algorithm``: ``("setting", field)`` (a run setting),
    ``("hparam", name)`` (one of its hyper-parameters) or None (the key does not apply to it).
    ``run.X`` is always the run setting X, ``<algorithm>.X`` that algorithm's hyper-parameter X; a
    bare key is a run setting when it is one (:func:`check_keys` refuses the ambiguous ones)."""
    head, dot, name = key.partition(".")
    if dot:
        if head == RUN_QUALIFIER:
            return ("setting", name)
        return ("hparam", name) if head.lower() == algorithm.lower() else None
    if key in SETTINGS:
        return ("setting", key)
    return ("hparam", key) if key in _hparams(algorithm) else None


def value_text(v) -> str:
    """A grid value in a folder name and a table: ``%g`` when that reads back as the same number
    (the names sweeps always had), else the shortest text that does (``0.5000001``), so that two
    values never share a folder."""
    if isinstance(v, float) and float(f"{v:g}") == v:
        return f"{v:g}"
    return repr(v) if isinstance(v, float) else str(v)


def point_name(point: dict) -> str:
    return ",".join(f"{k}={value_text(v)}" for k, v in point.items()) or "default"


def plan_sweep(cfg: Config, algorithms: Sequence[str], grid: Dict[str, list], alg_opts: Optional[dict] = None) -> list:
    """Every point: ``[{"algorithm", "point": {key: value}, "name", "config": Config | None, "skip": reason | None}]``.

    Keys that are run settings apply to every algorithm, hyper-parameters to the algorithms that
    have them (:func:`key_meaning`); a key that is neither, or both (unqualified), raises ValueError
    naming ``--grid``, as does a swept setting's value that its flag refuses. A point whose
    algorithm breaks a rule has ``config = None`` and the rule in ``skip``."""
    check_keys(grid, algorithms)
    check_swept_settings(cfg, grid, algorithms)
    plans = []
    for a in algorithms:
        keys = keys_of(a, grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            plans.append(plan_point(cfg, a, dict(zip(keys, values)), alg_opts))
    names = [(p["algorithm"], p["name"]) for p in plans]
    same = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if same is not None:  # one folder per point: two points must never print alike
        raise ValueError(f"--grid: two points of {same[0]} are both named {same[1]} (one folder each is needed); "
                         f"give values that differ as written")
    return plans


def check_keys(keys, algorithms: Sequence[str], flag: str = "--grid") -> None:
    """Every key is a run setting or a hyper-parameter of one of ``algorithms``, may vary, and means
    one thing; else ValueError naming ``flag``. A bare key that is both a run setting and a
    hyper-parameter of a chosen algorithm that the setting does not feed (``eta``: the Dirichlet
    concentration, and the step of FedNMap, ZA1, FedDR, FedADMM) must be qualified:
    ``fednmap.eta`` (the hyper-parameter) or ``run.eta`` (the run setting)."""
    for k in keys:
        head, dot, name = k.partition(".")
        if dot:
            _check_qualified(k, head, name, algorithms, flag)
        else:
            _check_bare(k, algorithms, flag)
        name = name if dot else k
        if name in ("algorithm", "seed", "alg_opts", "rounds") and (not dot or head == RUN_QUALIFIER):
            raise ValueError(f"{flag} {k}: not a {flag[2:]} key (give the algorithms with -a, seeds with --seeds, "
                             f"rounds with --rounds)")
        if name == "metric_step":  # one s for every point, or ‖G_s‖² would not compare across points
            raise ValueError(f"{flag} {k}: not a {flag[2:]} key: a sweep measures ‖G_s‖² at one step s for "
                             f"every point, so that the values compare; give it with --metric-step S")
    for a in algorithms:  # `lr` and `run.lr` (or `alpha` and `fedcanon.alpha`) would set one value twice
        seen = {}
        for k in keys:
            m = key_meaning(k, a)
            if m is not None and m in seen:
                raise ValueError(f"{flag} {seen[m]} and {flag} {k}: both set {a}'s {m[1]}; give one")
            seen.setdefault(m, k)


def _check_bare(k: str, algorithms: Sequence[str], flag: str) -> None:
    owners = [a for a in algorithms if k in _hparams(a)]
    if k not in SETTINGS and not owners:
        raise ValueError(f"{flag} {k}: neither a run setting nor a hyper-parameter of {', '.join(algorithms)} "
                         f"(hyper-parameters: {'; '.join(f'{a}: ' + ', '.join(_hparams(a)) for a in algorithms)})")
    both = [a for a in owners if k in SETTINGS and not _fed_by_setting(a, k)]
    if both:
        read_by = (f", read by --partition {' or '.join(PARTITION_KEYS[k])}" if k in PARTITION_KEYS else "")
        qualified = " or ".join(f"{flag} {a.lower()}.{k}=..." for a in both)
        raise ValueError(
            f"{flag} {k}: ambiguous: {k} is both a run setting ({setting_flag(k)}{read_by}) and a hyper-parameter "
            f"of {', '.join(both)}, two different things; write {qualified} to vary the algorithm's {k}, or "
            f"{flag} {RUN_QUALIFIER}.{k}=... to vary the run setting {setting_flag(k)}")


def _check_qualified(k: str, head: str, name: str, algorithms: Sequence[str], flag: str) -> None:
    if head == RUN_QUALIFIER:
        if name not in SETTINGS:
            raise ValueError(f"{flag} {k}: {name} is not a run setting (the flags of `run`, with _ for -)")
        return
    chosen = {a.lower(): a for a in algorithms}
    if head.lower() not in chosen:
        raise ValueError(f"{flag} {k}: {head} is not one of the swept algorithms ({', '.join(algorithms)}); "
                         f"write ALGORITHM.KEY for a hyper-parameter, {RUN_QUALIFIER}.KEY for a run setting")
    if name not in _hparams(head):
        raise ValueError(f"{flag} {k}: {head} has no hyper-parameter {name} (its hyper-parameters: "
                         f"{', '.join(_hparams(head))})")
    if name == "local_steps":  # K is a run setting (config.json and the metrics read it): build_algorithm's rule
        raise ValueError(f"{flag} {k}: the number of local steps is a run setting: {flag} local_steps=...")


def check_swept_settings(cfg: Config, values: Dict[str, list], algorithms: Sequence[str], flag: str = "--grid") -> None:
    """The checks of a run setting's flag, for each value a sweep gives it (``values``: key -> the
    values, or a range's ends): a swept ``lr=-1`` is refused as ``--lr -1`` is, naming
    ``FLAG KEY=VALUE``, before anything is written; and a partition setting that no swept partition
    reads (``eta`` under ``--partition iid``) is refused, as its flag is: every point would be the same run."""
    swept = {}
    for k, vals in values.items():
        meanings = {key_meaning(k, a) for a in algorithms} - {None}
        swept.update({m[1]: (k, vals) for m in meanings if m[0] == "setting"})
    partitions = swept.get("partition", (None, [cfg.partition]))[1]
    for name, (k, vals) in swept.items():
        for v in vals:
            try:
                cfg.replace(**{name: v}).check()
                if name in PARTITION_KEYS and not any(str(p).lower() in PARTITION_KEYS[name] for p in partitions):
                    check_given({"partition": partitions[0], name: v})  # the refusal its flag gets
            except ConfigError as e:
                raise ValueError(f"{flag} {k}={value_text(v)}: {e.rule}") from None


def sweep_metric_step(cfg: Config, values: Dict[str, list]) -> float:
    """The one step s of ‖G_s‖² for every point of a sweep. ‖G_s‖² depends on s, so the points must
    share it for the ‖G_s‖² column and ``--select stationarity`` to compare them (as ``compare`` does
    with lr·K). The rule, the same for every point: ``cfg.metric_step`` (``--metric-step``) when
    given, else the smallest lr·K the sweep holds: the smallest ``lr`` of ``values`` times its
    smallest ``local_steps`` (``values``: each swept key's values, a grid's lists or a search
    space's low ends; a key not swept is the base setting's). That s is no larger than the lr·K
    step of any point."""
    if cfg.metric_step is not None:
        return float(cfg.metric_step)

    def smallest(key, base):
        vals = [v for v in values.get(key, ()) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]
        return min(vals) if vals else base

    return float(smallest("lr", cfg.lr)) * int(smallest("local_steps", cfg.local_steps))


def keys_of(algorithm: str, keys) -> list:
    """The keys (in order) that apply to ``algorithm``: run settings, and its own hyper-parameters."""
    return [k for k in keys if key_meaning(k, algorithm) is not None]


def plan_point(cfg: Config, algorithm: str, point: dict, alg_opts: Optional[dict] = None) -> dict:
    """One point: ``{"algorithm", "point", "name", "config": Config | None, "skip": reason | None}``;
    a point whose settings or algorithm break a rule has ``config = None`` and the rule in ``skip``.
    The point's keys are sweep keys (:func:`key_meaning`)."""
    meant = {k: key_meaning(k, algorithm) for k in point}
    opts = dict((alg_opts or {}).get(algorithm, {}))
    opts.update({m[1]: point[k] for k, m in meant.items() if m is not None and m[0] == "hparam"})
    settings = {m[1]: point[k] for k, m in meant.items() if m is not None and m[0] == "setting"}
    entry = {"algorithm": algorithm, "point": point, "name": point_name(point), "config": None, "skip": None}
    try:
        c = cfg.replace(algorithm=algorithm, alg_opts=opts, **settings)
        c.check()
        alg = build_algorithm(c)
        if not c.regularizers:  # a per-parameter h needs the model: checked when the run starts
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    alg.validate(build_run_regularizer(c, None))
                except ValueError as e:
                    raise hparam_error(c, alg.name, e) from None
        entry["config"] = c
    except (ValueError, TypeError) as e:
        entry["skip"] = str(e)
    return entry


# --------------------------------------------------------------------------- #
# Running (worker side)
# --------------------------------------------------------------------------- #

_STOP = None  # the sweep's stop event, in a worker process


def _ignore_stop_signals() -> None:
    for s in HELD_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def _worker_main(conn, stop) -> None:
    """A worker process: runs the tasks the parent sends on ``conn`` (one at a time, each answered
    with :func:`run_point`'s result) until it is sent None or the parent is gone. It dies with the
    parent, however the parent dies (:mod:`~python_algos.system.processes`), sits in a process
    group of its own, and locks the folders it runs in. Ctrl-C, SIGTERM and SIGHUP are ignored
    between runs (the parent alone decides what stops); ``stop`` set by the parent interrupts the
    running run the way Ctrl-C would (SIGINT to this process)."""
    global _STOP
    processes.die_with_parent(multiprocessing.parent_process().pid)
    os.setpgid(0, 0)
    _ignore_stop_signals()
    _STOP = stop

    def watch():
        stop.wait()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, daemon=True).start()
    with folders_locked():
        _serve(conn)


def _serve(conn) -> None:
    kill_point = os.environ.get(KILL_POINT_ENV)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        if kill_point and os.path.normpath(task["dir"]).endswith(os.path.normpath(kill_point)):
            os.kill(os.getpid(), signal.SIGKILL)  # the test hook: die as an out-of-memory kill would
        try:
            r = run_point(task)
        except Exception as e:  # a bug, not the run's own error: the parent reports it as the point's failure
            r = {"dir": task["dir"], "status": "failed", "message": f"{type(e).__name__}: {e}"}
        conn.send(r)


def _interrupt_once(signum, frame):
    _ignore_stop_signals()  # a second Ctrl-C must not cut the summary's write short
    raise KeyboardInterrupt


def run_point(task: dict) -> dict:
    """One run of the sweep (in a worker, or in the parent with --jobs 1): starts it, continues it
    from its checkpoint, or (finished) leaves it alone. Returns ``{"dir", "status", "message",
    "final", "warnings"}``: ``final`` the run's final metrics (for the progress line), ``warnings``
    the distinct ``(category, text)`` of the warnings the run raised. They are caught here, not
    printed: a worker process would print them raw, once per process; the parent re-emits each
    distinct one once (:class:`Workers`), through its own filters and formatter (the CLI's
    ``warning: ...``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every one reaches the parent, whose filters decide
        r = _run_point(task)
    seen = dict.fromkeys((w.category, str(w.message)) for w in caught)  # each distinct one, in order
    s = read_summary(r["dir"]) or {}
    r.update(final=s.get("final") or {}, warnings=list(seen))
    return r


def _run_point(task: dict) -> dict:
    d, cfg = task["dir"], Config.from_dict(task["config"])
    if _STOP is not None and _STOP.is_set():
        return {"dir": d, "status": "not started", "message": None}
    in_worker = _STOP is not None
    if in_worker:
        for sig in HELD_SIGNALS:
            signal.signal(sig, _interrupt_once)
    try:
        if in_worker and _STOP.is_set():  # the stop came between the check above and the handler
            raise KeyboardInterrupt
        done = finished_run(d, cfg.rounds)
        if done is not None:
            return {"dir": d, "status": done["status"], "message": "kept"}
        if os.path.isfile(os.path.join(d, CONFIG)):
            prep = prepare.prepare_run(None, d, resume=True, rounds=cfg.rounds)
        else:
            prep = prepare.prepare_run(cfg, d, replace=False)
        s = execute_run(prep, progress=False, label=task["label"], log=lambda *_: None)
        status, message = s["status"], s.get("message")
    except Interrupted as e:
        status, message = "interrupted", e.summary.get("message")
    except KeyboardInterrupt:
        status, message = "interrupted", "interrupted before the run started or after it ended"
    except (ValueError, RuntimeError, OSError) as e:
        status, message = "error", str(e)
    finally:
        if in_worker:
            _ignore_stop_signals()
    if task.get("tensorboard") and os.path.isfile(os.path.join(d, METRICS)):
        write_events(d)
    return {"dir": d, "status": status, "message": message}


# --------------------------------------------------------------------------- #
# Running (parent side)
# --------------------------------------------------------------------------- #


def read_sweep(out_dir: str) -> dict:
    """``OUT/sweep.json`` of the sweep in ``out_dir``, its config a :class:`Config`; RunFolderError if
    absent or unreadable, or written before sweeps measured ‖G_s‖² at one s for every point (the one
    check of an older sweep: no branch elsewhere continues one)."""
    lock_folder(out_dir)  # a resume: no other command in the folder meanwhile
    path = os.path.join(out_dir, SWEEP_FILE)
    if not os.path.isfile(path):
        raise RunFolderError(f"cannot resume the sweep {out_dir}: it holds no {SWEEP_FILE}")
    d = read_json_object(path)  # a damaged file: RunFolderError naming the file and line
    try:
        d["config"] = Config.from_dict(d["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise RunFolderError(f"{path}: not a sweep written by `sweep` ({e})") from None
    if d["config"].metric_step is None:
        raise RunFolderError(f"cannot resume {out_dir}: it was written before sweeps measured ‖G_s‖² at one step s "
                             f"for every point (its sweep.json records none), and this version continues only "
                             f"those; run it again into a new --out (its runs still plot)")
    return d


def check_select_and_jobs(select: Optional[str], jobs) -> None:
    """``--select`` (None: the sweep's own) and ``--jobs`` of a sweep or random search, each error naming its flag."""
    if select is not None and select not in SELECT:
        raise ValueError(f"--select {select}: must be one of {', '.join(SELECT)}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs {jobs}: must be an integer >= 1 (worker processes)")


def sweep_resume_command(out_dir: str) -> str:
    """The command that continues the sweep or random search in ``out_dir``."""
    return f"python -m python_algos sweep --resume {shlex.quote(out_dir)}"


def run_sweep(cfg: Optional[Config], algorithms: Optional[Sequence[str]], grid: Optional[dict], seeds=None, *,
              out_dir: str, alg_opts: Optional[dict] = None, reseed_data: bool = False, jobs: int = 1,
              select: Optional[str] = "f_plus_h", resume: bool = False, tensorboard: bool = False,
              progress: bool = True, figures: Optional[dict] = None, log: Callable[[str], None] = print,
              replace: bool = False) -> dict:
    """Run (or with ``resume=True`` finish) the sweep in ``out_dir``; returns ``{"table", "points",
    "best", "skipped", "select", "metric_step"}``. Raises :class:`SweepInterrupted` on Ctrl-C (after
    writing the summary). ``select=None``: the sweep's own (a resumed sweep: what it was started
    with; f_plus_h for a new one). Every point measures ‖G_s‖² at one s (:func:`sweep_metric_step`),
    recorded in ``sweep.json`` (its config's ``metric_step``) and kept on resume. ``progress``: one
    line per finished run on stderr (status, the ``select`` metric, k/total, elapsed, ETA).
    ``figures`` (the CLI's ``{"formats", "band"}``) is recorded in ``sweep.json`` for a resume. A new
    sweep into a folder that holds files raises :class:`~python_algos.runfolder.files.RunExistsError`
    (nothing is touched) unless ``replace=True``, which replaces the whole sweep (refused when the
    folder holds anything else than its runs, records and figures)."""
    check_select_and_jobs(select, jobs)
    if resume:
        saved = read_sweep(out_dir)
        if "optuna" in saved:  # a random search resumes through its own module (the CLI dispatches)
            raise RunFolderError(f"{out_dir} holds a random search: resume it with optuna_search.run_study(..., "
                                 f"resume=True) or `sweep --resume {out_dir}`")
        select = select or saved.get("select") or "f_plus_h"
        cfg, algorithms, grid = saved["config"], saved["algorithms"], saved["grid"]
        seeds, reseed_data, alg_opts = saved["seeds"], saved["reseed_data"], saved.get("alg_opts") or {}
        figures = saved.get("figures")
    else:
        select = select or "f_plus_h"
        prepare.check_algorithm_names(algorithms)
        check_group_start(out_dir, SWEEP_RECORDS, replace, how_to_resume=sweep_resume_command(out_dir))
        seeds = list(seeds or [cfg.seed])
        if cfg.threads is None:
            cfg = cfg.replace(threads=1)  # one thread per run: the parallelism is the --jobs processes
        cfg = cfg.replace(metric_step=sweep_metric_step(cfg, grid))
    plans = plan_sweep(cfg, algorithms, grid, alg_opts)
    tasks = []
    for p in plans:
        if p["config"] is None:
            continue
        for s, c in seed_configs(p["config"], seeds, reseed_data):
            tasks.append({"dir": os.path.join(out_dir, run_folder_name(p["algorithm"]), p["name"], SEED_DIR.format(s)),
                          "config": c.to_dict(), "label": p["algorithm"], "tensorboard": tensorboard,
                          "name": f"{p['algorithm']} {p['name']} seed {s}"})
    if not tasks:
        raise ValueError("every point of the grid breaks a rule, nothing to run: "
                         + "; ".join(f"{p['algorithm']} {p['name']}: {p['skip']}" for p in plans))
    if not resume:  # data, model and folder checks of one run before anything is written
        prepare.prepare_run(Config.from_dict(tasks[0]["config"]), tasks[0]["dir"], replace=replace)
        open_group_folder(out_dir, SWEEP_FILE, {
            "config": cfg.to_dict(), "algorithms": list(algorithms), "grid": grid, "seeds": seeds,
            "reseed_data": reseed_data, "alg_opts": alg_opts or {}, "select": select, "figures": figures or {}},
            SWEEP_RECORDS, replace=replace)
    todo = [t for t in tasks if finished_run(t["dir"], t["config"]["rounds"]) is None]
    log(f"sweep: {len(plans)} points ({sum(p['config'] is None for p in plans)} skipped) x {len(seeds)} seed(s) = "
        f"{len(tasks)} runs, {len(tasks) - len(todo)} already finished; {len(todo)} to run on {jobs} process(es); "
        f"‖G_s‖² at s={cfg.metric_step:g} for every point")
    # progress lines go to stderr, as a run's progress does: stdout keeps the results
    printer = (lambda line: print(line, file=sys.stderr, flush=True)) if progress else None
    with Workers(min(jobs, max(1, len(todo))), log, printer, SELECT[select][0]) as w:
        interrupted = w.run(todo)
    result = summarize(out_dir, plans, seeds, select, interrupted, failed=w.failed, metric_step=cfg.metric_step)
    if interrupted:
        raise SweepInterrupted(out_dir, result["table"], w.interrupt)
    return result


class _Process:
    """One worker process, the parent's end of its pipe, and the task it runs (None: idle)."""

    def __init__(self, ctx, stop):
        processes.supervise()  # the worker carries this command's token: it ends with the command
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, stop), name="sweep-worker", daemon=True)
        self.proc.start()
        child.close()
        self.task = None

    def send(self, task: dict) -> None:
        self.task = task
        try:
            self.conn.send(task)
        except OSError:  # it died: its sentinel says so, and the task is failed with the reason
            pass

    def receive(self) -> Optional[dict]:
        """Its task's result, or None when the process died before sending one."""
        try:
            return self.conn.recv() if self.conn.poll() else None
        except (EOFError, OSError):
            return None

    def death(self) -> str:
        """Why it died: ``worker process died (signal 9, SIGKILL)`` or ``(exit code N)``."""
        self.proc.join(1.0)
        code = self.proc.exitcode
        if code is not None and code < 0:
            return f"worker process died (signal {-code}, {signal.Signals(-code).name})"
        return f"worker process died (exit code {code})"

    def end(self) -> None:
        """Ask it to quit; kill it if it has not within a second (it ignores SIGTERM between runs)."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(1.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


class Workers:
    """``--jobs`` worker processes kept for several batches of runs (a random search runs one
    trial's seeds at a time; keeping the processes spares a process start per trial). ``run(tasks)``
    returns True when Ctrl-C, SIGTERM, SIGHUP (or the test hook, which counts the runs ended over
    every batch) stopped them: every running run is then stopped as on Ctrl-C and writes its summary
    (status interrupted), and every worker process is ended (killed after :data:`STOP_GRACE`
    seconds): none outlives the sweep. ``interrupt`` then holds the exception that stopped them.

    A worker process that dies (killed, out of memory) fails the run it held, with the reason
    (``failed``: folder -> ``worker process died (signal 9, SIGKILL)``); a fresh process takes its
    place and the other runs go on.

    The parent collects every run's end (in completion order, whichever process ran it): with
    ``progress`` (a line printer) one line per run, ``[k/total] <algorithm> <point> seed <s>:
    <status>  <metric>=<value>  elapsed <t>  ETA <t>`` (ETA: the mean time per finished run so far
    times the runs left, over every process); without it only runs that did not complete are
    logged. The runs' warnings are re-emitted here, each distinct ``(category, text)`` once per
    Workers (every run of a sweep would otherwise repeat them)."""

    def __init__(self, jobs: int, log, progress: Optional[Callable[[str], None]] = None, metric: str = "f+h"):
        self.jobs, self.log, self.progress, self.metric = jobs, log, progress, metric
        self.stop_after = int(os.environ.get(STOP_AFTER_ENV, "0") or 0)
        self.ended = 0
        self.procs: List[_Process] = []
        self.stop = None
        self.interrupt: Optional[BaseException] = None
        self.failed: Dict[str, str] = {}
        self.warned = set()
        self._batch = (0, 0, 0.0)  # runs of this batch ended, its total, its start time

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """End every worker process (none may outlive the sweep)."""
        procs, self.procs = self.procs, []
        for w in procs:
            w.end()

    def _warn(self, r) -> None:
        for category, text in r.get("warnings") or ():
            if (category, text) not in self.warned:
                self.warned.add((category, text))
                warnings.warn(text, category, stacklevel=2)

    def _report(self, r: dict, task: dict, results) -> None:
        """The end of ``task``'s run (``r``: :func:`run_point`'s result): its warnings, its progress line, the
        failed runs; KeyboardInterrupt when the run saw Ctrl-C from the terminal."""
        r["name"] = task.get("name")
        self._warn(r)
        if r["status"] == "interrupted":
            raise KeyboardInterrupt
        self.ended += 1
        done, total, t0 = self._batch
        done += 1
        self._batch = (done, total, t0)
        if results is not None:
            results[r["dir"]] = r
        if r["status"] == "error":  # the run raised (bad data in this point, a full disk): failed, with the reason
            r["status"] = "failed"
            self.failed[r["dir"]] = r["message"]
        why = f" ({r['message']})" if r["message"] and r["status"] != "completed" else ""
        if self.progress is not None and r["status"] != "not started":
            spent = time.perf_counter() - t0
            value = (r.get("final") or {}).get(self.metric)
            shown = f"  {self.metric}={value:.4g}" if isinstance(value, (int, float)) else ""
            self.progress(f"[{done}/{total}] {r.get('name') or os.path.relpath(r['dir'])}: {r['status']}{why}{shown}  "
                          f"elapsed {human_time(spent)}  ETA {human_time(spent / done * (total - done))}")
        elif r["status"] not in ("completed", "not started"):
            self.log(f"{os.path.relpath(r['dir'])}: {r['status']}{why}")
        if self.stop_after and self.ended >= self.stop_after:
            raise KeyboardInterrupt  # the test hook: as if Ctrl-C came now

    def run(self, tasks: list, results: Optional[dict] = None) -> bool:
        """Run ``tasks``; True when they were stopped. ``results`` (if given) gets each run's
        ``{"dir", "status", "message", ...}`` by folder."""
        self._batch = (0, len(tasks), time.perf_counter())
        if self.jobs == 1 or (len(tasks) <= 1 and not self.procs):
            return self._run_here(tasks, results)
        if self.stop is None:
            self.stop = multiprocessing.get_context("spawn").Event()
        busy: List[_Process] = []
        try:
            pending = list(tasks)
            while pending or busy:
                while pending and len(busy) < self.jobs:
                    w = self._idle(busy)
                    w.send(pending.pop(0))
                    busy.append(w)
                self._collect(busy, results)
        except KeyboardInterrupt as e:
            self.interrupt = e
            self._stop_all(busy)
            return True
        return False

    def _run_here(self, tasks: list, results: Optional[dict]) -> bool:
        """--jobs 1: the runs in this process, one after another."""
        try:
            for t in tasks:
                self._report(run_point(t), t, results)
        except KeyboardInterrupt as e:
            self.interrupt = e
            return True
        return False

    def _idle(self, busy: list) -> _Process:
        """An idle worker process: a kept one, else a new one (spawn: no fork of a process holding
        torch's threads)."""
        for w in list(self.procs):
            if w not in busy and not w.proc.is_alive():  # died while idle (killed): nothing of it to report
                self.procs.remove(w)
                w.end()
        for w in self.procs:
            if w not in busy:
                return w
        w = _Process(multiprocessing.get_context("spawn"), self.stop)
        self.procs.append(w)
        return w

    def _collect(self, busy: list, results: Optional[dict]) -> None:
        """Wait for at least one busy worker to answer or die; report what ended."""
        ready = set(mp_connection.wait([w.conn for w in busy] + [w.proc.sentinel for w in busy]))
        for w in [w for w in busy if w.conn in ready or w.proc.sentinel in ready]:
            task, r = w.task, w.receive()
            busy.remove(w)
            w.task = None
            if r is None:  # the process died with the run: that run fails, a fresh process takes the next one
                r = {"dir": task["dir"], "status": "failed", "message": w.death()}
                self.failed[task["dir"]] = r["message"]
                self.procs.remove(w)
                w.end()
            self._report(r, task, results)

    def _stop_all(self, busy: list) -> None:
        """Stop every running run as Ctrl-C would (each writes its summary, status interrupted),
        wait up to :data:`STOP_GRACE` seconds for them, then end every worker process. Further stop
        signals are ignored meanwhile: they must not cut the summaries' writes short or leave a
        worker running."""
        restore = _ignore_in_main_thread()
        try:
            self.stop.set()
            deadline = time.monotonic() + STOP_GRACE
            while busy and time.monotonic() < deadline:
                waited = [w.conn for w in busy] + [w.proc.sentinel for w in busy]
                ready = set(mp_connection.wait(waited, timeout=max(0.0, deadline - time.monotonic())))
                for w in [w for w in busy if w.conn in ready or w.proc.sentinel in ready]:
                    w.receive()  # the run's summary is in its folder; the sweep's summary reads it there
                    busy.remove(w)
            self.close()
        finally:
            restore()


def _ignore_in_main_thread() -> Callable[[], None]:
    """Ignore SIGINT, SIGTERM and SIGHUP (in the main thread); returns what restores them."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {s: signal.getsignal(s) for s in HELD_SIGNALS}
    for s in old:
        signal.signal(s, signal.SIG_IGN)

    def restore():
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)

    return restore




# --------------------------------------------------------------------------- #
# The summary
# --------------------------------------------------------------------------- #


def run_status(run_dir: str, failed: Optional[Dict[str, str]] = None) -> dict:
    if failed and run_dir in failed:  # its process died: whatever the folder holds is not its end
        return {"status": "failed", "message": failed[run_dir]}
    s = read_summary(run_dir)
    return s if s is not None else {"status": "not started" if not os.path.isdir(run_dir) else "unfinished"}


def summarize(out_dir: str, plans: list, seeds: Sequence[int], select: str = "f_plus_h",
              interrupted: bool = False, extra: Optional[dict] = None, notes: Sequence[str] = (),
              failed: Optional[Dict[str, str]] = None, metric_step: Optional[float] = None) -> dict:
    """The table of every point (mean ± std over seeds), the skipped points, the best point per
    algorithm (``metric_step``: the s every point measures ‖G_s‖² at, in the column's heading);
    written to ``summary.json`` / ``summary.md`` (atomically). ``extra`` goes into
    ``summary.json``, ``notes`` (lines) below the table (a random search's trials). ``failed``: run
    folder -> why its worker process died (:attr:`Workers.failed`); those runs are ``failed``, listed
    with the reason in ``summary.json`` (``failed``) and below the table, and a resume runs them again."""
    metric, better = SELECT[select]
    points, skipped = [], []
    for p in plans:
        if p["config"] is None:
            skipped.append({"algorithm": p["algorithm"], "point": p["point"], "reason": p["skip"]})
            continue
        d = os.path.join(out_dir, run_folder_name(p["algorithm"]), p["name"])
        sums = [run_status(os.path.join(d, SEED_DIR.format(s)), failed) for s in seeds]
        statuses = [s.get("status", "unfinished") for s in sums]
        points.append({"algorithm": p["algorithm"], "point": p["point"], "name": p["name"], "dir": d,
                       "statuses": statuses, "warnings": [s.get("warning") for s in sums],
                       "final": final_stats([s for s in sums if s.get("status") == "completed"])})
    best = {}
    for a in dict.fromkeys(p["algorithm"] for p in points):
        ok = [p for p in points if p["algorithm"] == a and all(s == "completed" for s in p["statuses"])
              and metric in p["final"]]
        if ok:
            b = better(ok, key=lambda p: p["final"][metric]["mean"])
            best[a] = {"point": b["point"], "name": b["name"], "dir": b["dir"], metric: b["final"][metric]}
    keys = [k for k in ("f+h", "grad_map_sq", "sparsity", "test_acc") if any(k in p["final"] for p in points)]
    names = {k: column_name(k, metric_step) for k in keys}
    rows, notes_w = [], []
    for p in points:
        st = p["statuses"]
        status = "completed" if all(s == "completed" for s in st) else ", ".join(
            f"{st.count(s)} {s}" for s in dict.fromkeys(st))
        mark = " *" if best.get(p["algorithm"], {}).get("name") == p["name"] else ""
        warned = [{"warning": w} for w in p["warnings"]]  # records.run_warning of each seed's run
        rows.append([p["algorithm"], p["name"] + mark, *(stats_cell(p["final"].get(k)) for k in keys),
                     status_cell(status, warned)])
        notes_w += warning_notes([(f"{p['algorithm']} {p['name']} seed {k}", w) for k, w in zip(seeds, warned)])
    table = format_table(["algorithm", "point", *(names[k] for k in keys), "status"], rows)
    text = [table, "", f"* best point per algorithm by {select} ({'lowest' if better is min else 'highest'} mean "
                       f"{metric}); mean ± std over {len(seeds)} seed(s): {', '.join(map(str, seeds))}", *notes_w]
    if skipped:
        text += ["", "skipped (the point breaks a rule of the algorithm):"]
        text += [f"- {s['algorithm']} {point_name(s['point'])}: {s['reason']}" for s in skipped]
    text += list(notes)
    if failed:
        text += ["", "failed (run again by `sweep --resume`):"]
        text += [f"- {os.path.relpath(d, out_dir)}: {why}" for d, why in failed.items()]
    if interrupted:
        text += ["", f"interrupted: resume with `{sweep_resume_command(out_dir)}`"]
    table_text = "\n".join(text)
    write_json(os.path.join(out_dir, SUMMARY), {
        "status": "interrupted" if interrupted else "completed", "select": select, "seeds": list(seeds),
        "metric_step": metric_step,
        "points": points, "skipped": skipped, "best": best, "failed": dict(failed or {}), **(extra or {})})
    write_text_atomically(os.path.join(out_dir, "summary.md"), table_text + "\n")
    return {"table": table_text, "points": points, "best": best, "skipped": skipped, "select": select,
            "metric_step": metric_step, "failed": dict(failed or {})}
