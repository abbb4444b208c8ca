"""Independent seeds of one run or comparison (``run --seeds K``, ``compare --seed 1,2,3``).

    OUT/seeds.json          the settings: config, seeds, reseed_data, and for a comparison the algorithms
    OUT/seed-<k>/           seed k: a run folder (``run``) or a comparison folder (``compare``)
    OUT/aggregate.*         per-round and final statistics over the seeds (:mod:`.aggregate`)

Seed k sets ``Config.seed`` (the model's initialization, minibatch and participation sampling).
The data (generated samples, train/test split, client partition) stay those of the first seed
(``Config.data_seed``), so the seeds measure the algorithm's variability on one problem;
``reseed_data=True`` redraws the data with each seed as well.

Every seed is checked (:func:`~.prepare.prepare_run`) before anything is written. A seed that
finished (completed, or diverged: it would diverge again) is never run again; resuming
(``run --resume OUT``) continues the others (interrupted, or never started) from their
checkpoints, like ``run --resume`` on one run, and says which it keeps and why.

The tables and ``aggregate.*`` cover the seeds that completed, in every column and round alike; a
diverged seed is left out whole and named below the table (:mod:`.aggregate`).
"""

from __future__ import annotations

import os
import shlex
from typing import Callable, List, Optional, Sequence

from ..runfolder.files import RunFolderError, read_json_object, write_json
from ..runfolder.folder import check_group_start, open_group_folder
from ..runfolder.records import COMPARISON, CONFIG, METRICS, SEEDS, read_metrics, run_folder_name
from ..system.lock import lock_folder
from .aggregate import SEED_DIR, write_aggregate
from .config import Config, ConfigError

__all__ = ["parse_seed_list", "seed_list", "seed_configs", "run_seeds", "compare_seeds", "aggregate_comparison",
           "is_seeds_folder", "read_seeds", "SEEDS_FILE", "SEEDS_RECORDS"]

SEEDS_FILE = SEEDS
# the files of a folder of seeds beside its seed-<k>/ folders (a replacement deletes them with the runs);
# the comparisons of `compare` seeds hold their own records
SEEDS_RECORDS = (SEEDS, "aggregate.*", COMPARISON, "comparison.md")


def parse_seed_list(text: str) -> List[int]:
    """``"1,2,3"`` -> [1, 2, 3] (``--seed``); each an integer >= 0, no repeats."""
    try:
        seeds = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seed {text}: expected an integer or a comma-separated list such as 1,2,3") from None
    return _check_seeds(seeds, f"--seed {text}")


def _check_seeds(seeds, what: str) -> List[int]:
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"{what}: seeds must be integers >= 0")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{what}: a seed is repeated (each seed is one independent run)")
    return list(seeds)


def seed_list(seed, seeds) -> Optional[List[int]]:
    """The seeds asked for: ``seeds`` (K: seeds ``seed``, ..., ``seed`` + K − 1, or an explicit list
    from a config file) or a list given to ``--seed``; None for a single run."""
    if isinstance(seed, (list, tuple)):
        if seeds is not None:
            raise ValueError(f"--seeds {seeds} with --seed {','.join(map(str, seed))}: give the number of seeds "
                             f"(--seeds K) or the list (--seed 1,2,3), not both")
        return _check_seeds(list(seed), "--seed")
    if seeds is None:
        return None
    if isinstance(seeds, (list, tuple)):
        return _check_seeds(list(seeds), "seeds")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"--seeds {seeds}: must be an integer >= 1 (the number of independent runs)")
    base = 0 if seed is None else seed
    return list(range(base, base + seeds))


def seed_configs(cfg: Config, seeds: Sequence[int], reseed_data: bool = False) -> list:
    """``[(seed, Config)]``: the run of each seed (see the module docstring for the data seed)."""
    if reseed_data and cfg.data_seed is not None:
        raise ConfigError("data_seed", cfg.data_seed, "--reseed-data draws the data with each seed; give "
                          "--data-seed (one data set for every seed) or --reseed-data, not both")
    data_seed = None if reseed_data else (cfg.data_seed if cfg.data_seed is not None else seeds[0])
    return [(s, cfg.replace(seed=s, data_seed=data_seed)) for s in seeds]


def is_seeds_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, SEEDS_FILE))


_HOLDS = {"run": "seeds of one run", "compare": "seeds of a comparison"}


def read_seeds(out_dir: str, kind: Optional[str] = None) -> dict:
    """``out_dir``'s seeds.json; ``kind`` ("run" / "compare"): the command resuming it, which must
    be the one that wrote it (otherwise the error names the command that continues it)."""
    lock_folder(out_dir)  # a resume: no other command in the folder meanwhile
    path = os.path.join(out_dir, SEEDS_FILE)
    d = read_json_object(path)  # a damaged file: RunFolderError naming the file and line
    from .compare import check_resumable

    check_resumable(out_dir, d)
    try:
        d["config"] = Config.from_dict(d["config"])
        d["seeds"] = _check_seeds(d["seeds"], path)
    except (KeyError, TypeError, ValueError) as e:
        raise RunFolderError(f"{path}: not a seeds experiment written by `run` / `compare` ({e})") from None
    if kind is not None and d.get("kind") != kind:
        other = "compare" if kind == "run" else "run"
        raise RunFolderError(f"{out_dir} holds {_HOLDS[other]}: continue it with "
                             f"`python -m python_algos {other} --resume {shlex.quote(out_dir)}`")
    return d


def _fresh_folder_check(out_dir: str, kind: str, replace: bool) -> None:
    check_group_start(out_dir, SEEDS_RECORDS, replace,
                      how_to_resume=f"python -m python_algos {kind} --resume {shlex.quote(out_dir)}")


def run_seeds(cfg: Optional[Config], seeds: Optional[Sequence[int]], out_dir: str, *, reseed_data: bool = False,
              resume: bool = False, rounds: Optional[int] = None, progress: bool = True,
              log: Callable[[str], None] = print, after_run: Optional[Callable[[str], None]] = None,
              replace: bool = False) -> dict:
    """Run ``cfg`` once per seed into ``out_dir/seed-<k>/``; returns ``{"summaries", "table", "out_dir"}``.

    A new experiment into a folder that holds files raises :class:`~python_algos.runfolder.files.RunExistsError`
    (nothing is touched) unless ``replace=True``, which replaces the whole folder of seeds (refused when
    it holds anything else than its runs and records).

    ``resume=True`` reads the settings from ``out_dir/seeds.json``: finished seeds (completed or
    diverged: :func:`~.compare.finished_run`) are kept untouched, the others continue from their
    checkpoints (or start, if they never did). ``after_run(run_dir)`` is
    called after each seed's run (e.g. to write TensorBoard events). Ctrl-C raises
    :class:`~.run.Interrupted` whose ``resume_command`` resumes the whole experiment.
    """
    from .compare import finished_run, kept_message
    from .prepare import prepare_run
    from .run import Interrupted, execute_run

    if resume:
        saved = read_seeds(out_dir, "run")
        cfg, seeds, reseed_data = saved["config"], saved["seeds"], bool(saved.get("reseed_data"))
    else:
        _fresh_folder_check(out_dir, "run", replace)
    if rounds is not None:
        cfg = cfg.replace(rounds=rounds)
    plans = []
    for s, c in seed_configs(cfg, seeds, reseed_data):  # every check first: nothing is written on an error
        d = os.path.join(out_dir, SEED_DIR.format(s))
        done = finished_run(d, c.rounds) if resume else None
        if done is not None:
            plans.append((d, done))
        elif resume and os.path.isfile(os.path.join(d, CONFIG)):
            plans.append((d, prepare_run(None, d, resume=True, rounds=c.rounds)))
        else:
            # resume: a seed that never wrote its settings; replace: the old group's run is deleted below
            plans.append((d, prepare_run(c, d, replace=resume or replace)))
    _record(out_dir, {"kind": "run", "config": cfg.to_dict(), "seeds": list(seeds), "reseed_data": reseed_data},
            resume, replace)
    summaries = []
    for d, plan in plans:
        if isinstance(plan, dict):
            log(f"{os.path.basename(d)}: {kept_message(plan)}")
            summaries.append(plan)
            continue
        try:
            summaries.append(execute_run(plan, progress=progress, label=cfg.algorithm, log=log))
        except Interrupted as e:
            e.summary["resume_command"] = f"python -m python_algos run --resume {shlex.quote(out_dir)}"
            raise
        finally:
            if after_run is not None:
                after_run(d)
    table = _aggregate_runs(out_dir, [(cfg.algorithm, [d for d, _ in plans], summaries)], cfg.metric_step, seeds)
    return {"summaries": summaries, "table": table, "out_dir": out_dir, "seeds": list(seeds)}


def _record(out_dir: str, record: dict, resume: bool, replace: bool) -> None:
    """seeds.json: a new experiment's is written as it starts its folder
    (:func:`~python_algos.runfolder.folder.open_group_folder`: two commands given the same folder at
    once never share it; ``replace``: nothing of the old one is left); a resumed one's is rewritten."""
    if resume:
        write_json(os.path.join(out_dir, SEEDS_FILE), record)
    else:
        open_group_folder(out_dir, SEEDS_FILE, record, SEEDS_RECORDS, replace=replace)


def _aggregate_runs(out_dir, groups, metric_step, seeds) -> str:
    """Write the aggregate files of ``groups`` (``(label, run folders, summaries)``); returns the table."""
    return write_aggregate(out_dir, [{"label": label, "seeds": list(seeds), "summaries": summaries,
                                      "rows": [read_metrics(d) if os.path.isfile(os.path.join(d, METRICS))
                                               else [] for d in dirs]}
                                     for label, dirs, summaries in groups], metric_step)


def compare_seeds(cfg: Optional[Config], algorithms: Optional[Sequence[str]], seeds: Optional[Sequence[int]],
                  out_dir: str, *, alg_opts: Optional[dict] = None, reseed_data: bool = False, resume: bool = False,
                  rounds: Optional[int] = None, progress: bool = True, log: Callable[[str], None] = print,
                  after_run: Optional[Callable[[str], None]] = None, replace: bool = False) -> dict:
    """A comparison per seed in ``out_dir/seed-<k>/`` (each: same split and initial model for every
    algorithm), aggregated per algorithm; returns ``{"summaries", "table", "out_dir"}``. ``replace``:
    as in :func:`run_seeds`."""
    from .compare import compare_experiments
    from .prepare import check_algorithm_names
    from .run import Interrupted

    if resume:
        saved = read_seeds(out_dir, "compare")
        cfg, seeds, reseed_data = saved["config"], saved["seeds"], bool(saved.get("reseed_data"))
        algorithms, alg_opts = saved["algorithms"], saved.get("alg_opts") or {}
    else:
        _fresh_folder_check(out_dir, "compare", replace)
        check_algorithm_names(algorithms)
        alg_opts = alg_opts or {}
    if rounds is not None:
        cfg = cfg.replace(rounds=rounds)
    if cfg.metric_step is None:  # one s for every algorithm and seed (compare_experiments' rule)
        cfg = cfg.replace(metric_step=cfg.lr * cfg.local_steps)
    configs = seed_configs(cfg, seeds, reseed_data)
    if not resume:  # every algorithm checked on the first seed's data before anything is written
        from .build import prepare_data
        from .prepare import prepare_run

        s0, c0 = configs[0]
        fed = prepare_data(c0)
        errors = []
        for a in algorithms:
            try:
                prepare_run(c0.replace(algorithm=a, alg_opts=dict(alg_opts.get(a, {}))),
                            os.path.join(out_dir, SEED_DIR.format(s0), run_folder_name(a)), fed=fed, replace=replace)
            except ValueError as e:
                errors.append(f"{a}: {e}")
        if errors:
            raise ValueError("; ".join(errors) + " (nothing was written)")
    _record(out_dir, {"kind": "compare", "config": cfg.to_dict(), "seeds": list(seeds), "reseed_data": reseed_data,
                      "algorithms": list(algorithms), "alg_opts": alg_opts}, resume, replace)
    per_seed = []
    for s, c in configs:
        d = os.path.join(out_dir, SEED_DIR.format(s))
        again = os.path.isfile(os.path.join(d, COMPARISON))
        try:
            per_seed.append(compare_experiments(None if again else c, None if again else algorithms, d,
                                                alg_opts=None if again else alg_opts, resume=again,
                                                rounds=c.rounds if again else None, progress=progress, log=log,
                                                replace=False))
        except Interrupted as e:
            e.summary["resume_command"] = f"python -m python_algos compare --resume {shlex.quote(out_dir)}"
            raise
        finally:
            if after_run is not None:
                for a in algorithms:
                    if os.path.isdir(os.path.join(d, run_folder_name(a))):
                        after_run(os.path.join(d, run_folder_name(a)))
    table = aggregate_comparison(out_dir, algorithms, seeds, per_seed, cfg.metric_step)
    return {"summaries": per_seed, "table": table, "out_dir": out_dir, "seeds": list(seeds)}


def aggregate_comparison(out_dir: str, labels: Sequence[str], seeds: Sequence[int], per_seed: Sequence[list],
                         metric_step: Optional[float]) -> str:
    """The aggregate files of a comparison's seeds (``per_seed[j][i]``: the summary of ``labels[i]`` in
    ``seed-<seeds[j]>/<label>/``), for ``compare --seeds`` and :func:`.api.compare`; returns the table."""
    return _aggregate_runs(out_dir, [(a, [os.path.join(out_dir, SEED_DIR.format(s), run_folder_name(a))
                                          for s in seeds], [summ[i] for summ in per_seed])
                                     for i, a in enumerate(labels)], metric_step, seeds)
