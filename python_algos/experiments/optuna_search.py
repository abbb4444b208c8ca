"""Random search with Optuna's TPE sampler over the space of a sweep (``sweep --optuna N --space ...``).

    python -m python_algos sweep -a fedcanon --optuna 20 --space alpha=log:1e-3:1 --space beta=log:1e-3:1e-1 \\
        --seeds 3 --jobs 2 --dataset synthetic ...           # the other flags as in `run`
    python -m python_algos sweep --resume results/<sweep>    # what is missing or was interrupted

Each algorithm gets an Optuna study (named after it) of N trials in ``OUT/optuna.db`` (SQLite:
every change is one transaction, so Ctrl-C cannot leave the study half-written). A trial's
parameters are a point of the sweep: it runs, with its seeds, through the grid's machinery into the
grid's folders (``OUT/<algorithm>/<k1=v1,...>/seed-<s>/``), and its value is the ``--select``
metric's mean over the seeds (minimized or maximized as the metric asks). A point the algorithm
refuses (its constructor or ``validate(reg)`` raises) is a *pruned* trial with the reason in its
``reason`` user attribute, as is a point where a seed diverged; TPE ranks pruned trials below every
completed one, so it learns to avoid the region. A run that fails otherwise is a *failed* trial.

Trials run one after another; ``--jobs P`` runs a trial's seeds in parallel. Sequential trials make
the study a function of ``--seed`` alone: the sampler of trial n is ``TPESampler(seed=f(seed, n))``,
so the same settings give the same trials whatever ``--jobs`` is and however often the study was
interrupted. Resuming first finishes the trials an interruption left running (their runs continue
from their checkpoints; a finished run is never run again), then asks for the remaining ones until
the study holds N finished trials. Suggested floats are rounded to 6 significant digits, so a
point's folder name is its exact value.
"""

from __future__ import annotations

import collections
import math
import os
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from ..runfolder.folder import check_group_start, open_group_folder
from ..runfolder.records import run_folder_name
from ..runfolder.signals import stop_signals_held  # a change to the study is never cut in two by a stop
from . import prepare
from .aggregate import SEED_DIR, final_stats, stats_cell
from .compare import finished_run
from .config import Config
from .seeds import seed_configs
from .sweep import (
    SELECT,
    STUDY_FILE,
    SWEEP_FILE,
    SWEEP_RECORDS,
    SweepInterrupted,
    Workers,
    check_keys,
    check_select_and_jobs,
    check_swept_settings,
    keys_of,
    parse_grid_values,
    parse_keyed,
    plan_point,
    point_name,
    read_sweep,
    run_status,
    summarize,
    sweep_metric_step,
    sweep_resume_command,
)

__all__ = ["parse_space", "parse_space_spec", "run_study", "STUDY_FILE", "INSTALL"]

INSTALL = "pip install optuna (or fedkernels[optuna])"
_KINDS = ("log", "float", "int", "intlog")
_RULE = "the point breaks a rule of the algorithm"
_BUDGET = "its runs stopped at --time-budget"  # a trial left running: resumable
_SHOWN = {"RUNNING": "stopped", "FAIL": "failed"}  # a trial's state as its line says it


def _optuna():
    try:
        import optuna
    except ImportError:
        raise RuntimeError(f"--optuna needs the optuna package: {INSTALL}") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep prints its own line per trial
    return optuna


# --------------------------------------------------------------------------- #
# The space
# --------------------------------------------------------------------------- #


def parse_space_spec(key: str, spec) -> dict:
    """``"log:1e-3:1"`` (log-uniform float), ``"float:0:1"``, ``"int:1:20"``, ``"intlog:1:64"`` or a
    list / ``"a,b,c"`` (categorical) -> ``{"kind", "low", "high"}`` or ``{"kind": "choice",
    "choices"}``; errors name ``--space KEY=SPEC``."""
    what = f"--space {key}={spec if not isinstance(spec, (list, tuple)) else ','.join(map(str, spec))}"
    if isinstance(spec, str) and spec.split(":", 1)[0].strip().lower() in _KINDS:
        parts = [p.strip() for p in spec.split(":")]
        kind = parts[0].lower()
        if len(parts) != 3:
            raise ValueError(f"{what}: expected {kind}:LOW:HIGH (e.g. log:1e-3:1); a list of values (a,b,c) is a "
                             f"categorical choice")
        try:
            lo, hi = ((int(parts[1]), int(parts[2])) if kind.startswith("int")
                      else (float(parts[1]), float(parts[2])))
        except ValueError:
            raise ValueError(f"{what}: LOW and HIGH must be {'integers' if kind.startswith('int') else 'numbers'}") \
                from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"{what}: needs finite LOW < HIGH")
        if kind in ("log", "intlog") and lo <= 0:
            raise ValueError(f"{what}: a log range needs LOW > 0")
        return {"kind": kind, "low": lo, "high": hi}
    choices = parse_grid_values(key, spec, "--space")  # a list, or "a,b,c": each value once
    if len(choices) < 2:
        raise ValueError(f"{what}: a categorical choice needs at least two values (a fixed value is a flag of run)")
    if not all(c is None or isinstance(c, (bool, int, float, str)) for c in choices):
        raise ValueError(f"{what}: choices must be numbers, strings or booleans")
    return {"kind": "choice", "choices": choices}


def parse_space(items) -> Dict[str, dict]:
    """``[(key, spec), ...]`` or ``{key: spec}`` -> ``{key: distribution spec}`` (order kept)."""
    return parse_keyed(items, "--space", parse_space_spec)


def _distribution(optuna, d: dict):
    if d["kind"] == "choice":
        return optuna.distributions.CategoricalDistribution(d["choices"])
    if d["kind"].startswith("int"):
        return optuna.distributions.IntDistribution(d["low"], d["high"], log=d["kind"] == "intlog")
    return optuna.distributions.FloatDistribution(d["low"], d["high"], log=d["kind"] == "log")


def _point(params: dict, keys, space: dict) -> dict:
    """A trial's parameters as a sweep point: floats rounded to 6 significant digits (the folder
    name's precision), kept inside the range."""
    point = {}
    for k in keys:
        v = params[k]
        if isinstance(v, float) and space[k]["kind"] != "choice":
            v = min(max(float(f"{v:.6g}"), space[k]["low"]), space[k]["high"])
        point[k] = v
    return point


def _trial_seed(seed: int, number: int) -> int:
    """The sampler seed of trial ``number``: hashed (SeedSequence), because the first draws of
    Mersenne Twisters seeded with consecutive integers are visibly correlated."""
    return int(np.random.SeedSequence([int(seed) % 2 ** 32, number]).generate_state(1)[0])


# --------------------------------------------------------------------------- #
# The study
# --------------------------------------------------------------------------- #


def run_study(cfg: Optional[Config], algorithms: Optional[Sequence[str]], space: Optional[dict], trials: Optional[int],
              seeds=None, *, out_dir: str, alg_opts: Optional[dict] = None, reseed_data: bool = False, jobs: int = 1,
              select: Optional[str] = "f_plus_h", resume: bool = False, tensorboard: bool = False,
              figures: Optional[dict] = None, log: Callable[[str], None] = print, replace: bool = False) -> dict:
    """Run (or with ``resume=True`` finish) the random search in ``out_dir``; returns what
    :func:`~.sweep.summarize` returns plus ``"trials"``. Raises :class:`~.sweep.SweepInterrupted`
    on Ctrl-C (after writing the summary). The study optimizes ``select``, so a resumed one keeps its
    own (``select=None``); another raises ValueError. Every trial measures ‖G_s‖² at one s
    (:func:`~.sweep.sweep_metric_step` with the space's low ends), recorded in ``sweep.json``;
    ``figures`` (the CLI's ``{"formats", "band"}``) is recorded there for a resume. ``replace``: as in
    :func:`~.sweep.run_sweep` (a folder holding files is refused unless replacing it whole)."""
    optuna = _optuna()
    check_select_and_jobs(select, jobs)
    if resume:
        saved = read_sweep(out_dir)
        cfg, algorithms, space, trials = saved["config"], saved["algorithms"], saved["space"], saved["optuna"]
        seeds, reseed_data, alg_opts = saved["seeds"], saved["reseed_data"], saved.get("alg_opts") or {}
        if select is not None and select != saved["select"]:
            raise ValueError(f"--select {select}: the random search in {out_dir} optimizes {saved['select']} (the "
                             f"value of its trials); resume it without --select, or start another")
        select = saved["select"]
    else:
        select = select or "f_plus_h"
        _check_new_study(cfg, algorithms, space, trials)
        check_group_start(out_dir, SWEEP_RECORDS, replace, how_to_resume=sweep_resume_command(out_dir))
        seeds = list(seeds or [cfg.seed])
        cfg = _start_study(cfg, algorithms, space, trials, seeds, reseed_data, alg_opts, out_dir,
                           {"select": select, "figures": figures or {}}, replace)
    metric, better = SELECT[select]
    direction = "minimize" if better is min else "maximize"
    storage = optuna.storages.RDBStorage(f"sqlite:///{os.path.abspath(os.path.join(out_dir, STUDY_FILE))}")
    log(f"random search: {len(algorithms)} algorithm(s) x {trials} trial(s) x {len(seeds)} seed(s); trials one after "
        f"another, each trial's seeds on {min(jobs, len(seeds))} process(es); TPE seeded from {seeds[0]}"
        + f"; ‖G_s‖² at s={cfg.metric_step:g} for every trial")
    interrupted, cause = False, None
    plans, records = [], []
    with Workers(min(jobs, len(seeds)), log) as workers:
        for a in algorithms:
            keys = keys_of(a, space)
            dists = {k: _distribution(optuna, space[k]) for k in keys}
            with stop_signals_held():
                study = optuna.create_study(study_name=a, storage=storage, direction=direction, load_if_exists=True)
            try:
                if interrupted:  # an earlier algorithm's study was interrupted: only its summary is wanted
                    raise KeyboardInterrupt
                # first the trials an interruption or --time-budget left running (their runs continue from
                # their checkpoints); a trial stopped by the budget again asks for no new one
                budget_hit = False
                for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                    budget_hit |= _evaluate(optuna, study, t.number, _point(t.params, keys, space), cfg, a, seeds,
                                            reseed_data, alg_opts, out_dir, metric, workers, tensorboard, trials, log)
                finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                            optuna.trial.TrialState.FAIL)
                while not budget_hit and len(study.get_trials(deepcopy=False, states=finished)) < trials:
                    with stop_signals_held():
                        n = len(study.get_trials(deepcopy=False))
                        study.sampler = optuna.samplers.TPESampler(seed=_trial_seed(seeds[0], n))
                        trial = study.ask(dists)
                    budget_hit = _evaluate(optuna, study, trial.number, _point(trial.params, keys, space), cfg, a,
                                           seeds, reseed_data, alg_opts, out_dir, metric, workers, tensorboard,
                                           trials, log)
            except KeyboardInterrupt as e:
                interrupted, cause = True, cause or e
            for t in study.get_trials(deepcopy=False):
                point = _point(t.params, keys, space) if set(keys) <= set(t.params) else None
                records.append({"algorithm": a, "number": t.number, "state": t.state.name.lower(), "value": t.value,
                                "point": point, "reason": t.user_attrs.get("reason")})
                if point is not None and not any(p["algorithm"] == a and p["point"] == point for p in plans):
                    plans.append(plan_point(cfg, a, point, alg_opts))
    result = summarize(out_dir, plans, seeds, select, interrupted, extra={"optuna": {
        "trials_per_algorithm": trials, "direction": direction, "metric": metric, "trials": records}},
        notes=_trial_notes(records, trials, metric), failed=workers.failed, metric_step=cfg.metric_step)
    result["trials"] = records
    if interrupted:
        raise SweepInterrupted(out_dir, result["table"], cause)
    return result


def _check_new_study(cfg: Config, algorithms: Sequence[str], space: dict, trials) -> None:
    """The checks of a new search's settings (each error names its flag), before anything is written."""
    prepare.check_algorithm_names(algorithms)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"--optuna {trials}: must be an integer >= 1 (trials per algorithm)")
    if not space:
        raise ValueError("--space: give at least one KEY=SPEC to search (e.g. --space alpha=log:1e-3:1)")
    check_keys(space, algorithms, "--space")
    check_swept_settings(cfg, {k: d["choices"] if d["kind"] == "choice" else [d["low"], d["high"]]
                               for k, d in space.items()}, algorithms, "--space")
    for a in algorithms:
        if not keys_of(a, space):
            raise ValueError(f"--space: {a} has none of {', '.join(space)} (give a run setting such as lr, or one "
                             f"of its hyper-parameters; see `python -m python_algos algorithms`)")


def _start_study(cfg: Config, algorithms, space: dict, trials: int, seeds: list, reseed_data, alg_opts,
                 out_dir: str, record: dict, replace: bool) -> Config:
    """The base config of a new search (one torch thread per run, one s for every trial), checked on
    one run's data, model and folder, then recorded in ``sweep.json`` with ``record`` as the search's
    folder is started (``replace``: emptied of the old one); returns it."""
    if cfg.threads is None:
        cfg = cfg.replace(threads=1)  # one thread per run: the parallelism is the --jobs processes
    lows = {k: d["choices"] if d["kind"] == "choice" else [d["low"]] for k, d in space.items()}
    cfg = cfg.replace(metric_step=sweep_metric_step(cfg, lows))
    for a in algorithms:  # data, model and folder checks before anything is written
        base = plan_point(cfg, a, {}, alg_opts)
        if base["config"] is not None:
            prepare.prepare_run(base["config"], os.path.join(out_dir, run_folder_name(a), "check"), replace=False)
            break
    open_group_folder(out_dir, SWEEP_FILE, {
        "config": cfg.to_dict(), "algorithms": list(algorithms), "grid": {}, "space": space, "optuna": trials,
        **record, "seeds": seeds, "reseed_data": reseed_data, "alg_opts": alg_opts or {}}, SWEEP_RECORDS,
        replace=replace)
    return cfg


def _evaluate(optuna, study, number: int, point: dict, cfg: Config, algorithm: str, seeds, reseed_data, alg_opts,
              out_dir: str, metric: str, workers: Workers, tensorboard: bool, trials: int, log) -> bool:
    """Run trial ``number``'s point with its seeds (finished runs are kept) and tell the study its
    value, or prune / fail it with the reason. KeyboardInterrupt leaves the trial running, and so does
    a run that ``--time-budget`` stopped (resumable: ``sweep --resume`` continues it); True then."""
    TS = optuna.trial.TrialState
    plan = plan_point(cfg, algorithm, point, alg_opts)
    head = f"trial {number + 1}/{trials} {algorithm} {plan['name']}"
    if plan["config"] is None:
        _tell(optuna, study, number, TS.PRUNED, None, f"{_RULE}: {plan['skip']}")
        log(f"{head}: pruned ({plan['skip']})")
        return False
    d = os.path.join(out_dir, run_folder_name(algorithm), plan["name"])
    tasks = [{"dir": os.path.join(d, SEED_DIR.format(s)), "config": c.to_dict(), "label": algorithm,
              "tensorboard": tensorboard} for s, c in seed_configs(plan["config"], seeds, reseed_data)]
    todo = [t for t in tasks if finished_run(t["dir"], t["config"]["rounds"]) is None]
    results = {}
    log_inner = workers.log
    workers.log = lambda msg: None  # the trial's line below says what happened
    try:
        stopped = workers.run(todo, results)
    finally:
        workers.log = log_inner
    if stopped:
        raise workers.interrupt or KeyboardInterrupt()
    sums = [run_status(t["dir"], workers.failed) for t in tasks]
    statuses = [s.get("status", "unfinished") for s in sums]
    stat, value, shown = final_stats(sums).get(metric), None, None  # shown: the line of a completed trial
    if all(s == "completed" for s in statuses):
        state, reason = (TS.COMPLETE, None) if stat is not None else (TS.FAIL, f"the runs logged no {metric}")
        value, shown = (stat["mean"], f"{metric} {stats_cell(stat)}") if stat is not None else (None, None)
    elif "stopped" in statuses and all(st in ("completed", "stopped") for st in statuses):
        state, reason = TS.RUNNING, f"{_BUDGET}; `sweep --resume` continues it"  # True: no new trial asked for
    else:
        bad = [(s, st, (results.get(t["dir"]) or {}).get("message") or sm.get("message"))
               for s, st, t, sm in zip(seeds, statuses, tasks, sums) if st != "completed"]
        reason = "; ".join(f"seed {s}: {st}" + (f" ({m})" if m else "") for s, st, m in bad)
        state = TS.PRUNED if all(st == "diverged" for _, st, _ in bad) else TS.FAIL
    _tell(optuna, study, number, state, value, reason)
    log(f"{head}: {shown or f'{_SHOWN.get(state.name, state.name.lower())} ({reason})'}")
    return state == TS.RUNNING


def _tell(optuna, study, number: int, state, value, reason: Optional[str]) -> None:
    with stop_signals_held():
        if reason:
            trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
            study._storage.set_trial_user_attr(trial_id, "reason", reason)
        if state != optuna.trial.TrialState.RUNNING:  # a running trial is only annotated: a resume continues it
            study.tell(number, value if state == optuna.trial.TrialState.COMPLETE else None, state=state)


def _trial_notes(records: list, trials: int, metric: str) -> list:
    lines = ["", f"random search (Optuna TPE): {trials} trial(s) per algorithm; the value of a trial is the mean "
                 f"{metric} over the seeds"]
    for a in dict.fromkeys(r["algorithm"] for r in records):
        rs = [r for r in records if r["algorithm"] == a]
        counts = collections.Counter(r["state"] for r in rs)
        lines.append(f"- {a}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        for r in rs:
            if r["state"] in ("pruned", "fail") or (r["state"] == "running" and r["reason"]):
                why = ("the point breaks a rule of the algorithm (listed above)"
                       if (r["reason"] or "").startswith(_RULE) else r["reason"])
                lines.append(f"  - trial {r['number'] + 1} {point_name(r['point'] or {})}: {r['state']}: {why}")
    return lines
