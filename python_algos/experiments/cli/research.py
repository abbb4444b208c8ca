"""The command line's research loop: several seeds of ``run`` / ``compare``, and ``sweep``."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Union

from ..config import Config
from ..optuna_search import parse_space, run_study  # optuna itself: imported when a study starts
from ..plotting import plot_sweep  # matplotlib itself: imported when a figure is drawn
from ..seeds import compare_seeds, is_seeds_folder, run_seeds
from ..sweep import SELECT, SweepInterrupted, parse_grid, read_sweep, run_sweep
from ..tensorboard import write_events  # the tensorboard package: imported when events are written
from .options import Common, CompareCommand, GivenSettings, RunCommand, SweepCommand
from .parser import formats_flag
from .settings import (
    check_resume_flags,
    compare_settings,
    output_folder,
    overview_figure,
    read_config_file,
    replace_requested,
    seed_settings,
    split_alg_opts,
)


def write_run_events(run_dirs, tensorboard: bool) -> None:
    """--tensorboard: the runs' TensorBoard events (see experiments/tensorboard.py). A run of this command
    wrote them live, so write_events leaves them alone; a run a resume kept may have none yet."""
    if tensorboard:
        for d in run_dirs:
            write_events(d)
        print(f"TensorBoard events: tensorboard --logdir {shlex.quote(os.path.commonpath(run_dirs))}")


def wants_seeds(cmd: Common) -> bool:
    """Several seeds asked for: --seeds, a --seed list, a seeds/reseed_data key of the config file, or
    --resume of a folder of seeds."""
    if cmd.resume:
        return is_seeds_folder(cmd.resume)
    given = cmd.settings
    if "seeds" in given.values or isinstance(given.get("seed"), list):
        return True
    if given.config:
        keys = {k.replace("-", "_") for k in read_config_file(given.config)}
        return bool(keys & {"seeds"}) or isinstance(read_config_file(given.config).get("seed"), list)
    return False


def cmd_seeds(cmd: Union[RunCommand, CompareCommand]) -> int:
    """``run`` or ``compare`` with several seeds (seeds.py): new, or resumed (``--resume`` of a folder of seeds)."""
    compare = isinstance(cmd, CompareCommand)
    # --tensorboard (main checked the package): after each seed, its events (a no-op for a run that wrote them
    # live, see write_run_events; a seed a resume kept may have none yet)
    kw = dict(progress=not cmd.no_progress, after_run=write_events if cmd.figures.tensorboard else None)
    if cmd.resume:
        check_resume_flags(cmd)
        print(f"resuming the seeds in {cmd.resume}")
        kw.update(resume=True, rounds=cmd.settings.get("rounds"))
        result = (compare_seeds(None, None, None, cmd.resume, **kw) if compare
                  else run_seeds(None, None, cmd.resume, **kw))
    else:
        if compare:
            cfg, algorithms, per, seeds, reseed = compare_settings(cmd.settings, cmd.algorithms)
        else:
            merged, seeds, reseed = seed_settings(cmd.settings)
            cfg, algorithms = Config.from_dict(merged), None
        out = output_folder(cmd, "compare" if compare else cfg.algorithm)
        what = f"comparing {', '.join(algorithms)} on" if compare else f"{cfg.algorithm} on"
        print(f"{what} {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), {cfg.model}, seeds "
              f"{', '.join(map(str, seeds))}{' (data redrawn per seed)' if reseed else ''}; results -> {out}")
        kw.update(reseed_data=reseed, replace=replace_requested(cmd))
        result = (compare_seeds(cfg, algorithms, seeds, out, alg_opts=per, **kw) if compare
                  else run_seeds(cfg, seeds, out, **kw))
    print(result["table"])
    out = result["out_dir"]
    print(f"mean ± std over the seeds that completed, of {len(result['seeds'])} (seeds "
          f"{', '.join(map(str, result['seeds']))}); results "
          f"written to {out}  (per-round statistics: {os.path.join(out, 'aggregate.jsonl')})")
    overview_figure(out, cmd.figures)
    flat = [s for per_seed in result["summaries"] for s in per_seed] if compare else result["summaries"]
    return 3 if any(s.get("status") == "diverged" for s in flat) else 0


def _given(argv, *flags) -> dict:
    """The figure flags among ``flags`` that the command line ``argv`` gave (argparse fills in their
    defaults, so its namespace alone cannot tell a given ``--formats png,pdf`` from none): their parsed
    values."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--formats", type=formats_flag, default=None)
    p.add_argument("--band", default=None)
    known, _ = p.parse_known_args([a for a in argv if a != "--"])
    return {k: v for k, v in vars(known).items() if v is not None and "--" + k in flags}


def _grid_and_space(given: GivenSettings, merged: dict) -> tuple:
    """(grid, trials, space) of a new sweep, from the flags and the config file: exactly one of a
    grid (--grid) and a random search (--optuna N over --space), each parsed and checked."""
    grid = merged.pop("grid", None) or {}
    if not isinstance(grid, dict):
        raise ValueError(f"{given.config}: grid must be a table of KEY = [values] or \"log:LOW:HIGH:COUNT\"")
    grid = {**grid, **dict(given.grid)}
    trials, space = merged.pop("optuna", None), merged.pop("space", None) or {}
    if not isinstance(space, dict):
        raise ValueError(f"{given.config}: space must be a table of KEY = \"log:LOW:HIGH\" (or float:, int:, "
                         f"intlog:) or KEY = [choices]")
    space = {**space, **dict(given.space)}
    if trials is not None and grid:
        raise ValueError("--optuna and --grid: give one (a random search over --space, or a grid)")
    if space and trials is None:
        raise ValueError("--space: only with --optuna N (the number of trials); a grid takes --grid")
    if trials is not None:
        if not space:
            raise ValueError("--optuna: give the space to search with --space KEY=SPEC (e.g. --space "
                             "alpha=log:1e-3:1), or a [space] table in --config")
        return grid, trials, parse_space(space)
    if not grid:
        raise ValueError("--grid: give at least one KEY=VALUES (e.g. --grid alpha=0.01,0.1), or a [grid] "
                         "table in --config")
    return parse_grid(grid), trials, space


def _new_sweep(cmd: SweepCommand, opts: dict) -> tuple:
    """(out, keyword arguments of run_sweep / run_study) of a new sweep; fills ``opts`` (jobs, select)
    from the config file where the flags left them unset."""
    merged, seeds, reseed = seed_settings(cmd.settings, extra=("algorithms", "grid", "select", "jobs", "optuna",
                                                                "space"))
    grid, trials, space = _grid_and_space(cmd.settings, merged)
    algorithms = list(cmd.algorithms or ()) or merged.pop("algorithms", None)
    merged.pop("algorithms", None)
    if not algorithms:
        raise ValueError("-a/--algorithms: give the algorithm(s) to sweep (see `python -m python_algos "
                         "algorithms`)")
    for k in ("jobs", "select"):
        if opts[k] is None:
            opts[k] = merged.pop(k, None)
        merged.pop(k, None)
    per = split_alg_opts(merged.pop("alg_opts", {}) or {}, algorithms)
    cfg = Config.from_dict(merged)
    out = output_folder(cmd, "sweep")
    over = (' x '.join(f'{k} ({len(v)})' for k, v in grid.items()) if trials is None else
            f"{', '.join(space)} ({trials} Optuna trials)")
    print(f"sweep of {', '.join(algorithms)} over {over} on {cfg.dataset} ({cfg.partition}, "
          f"N={cfg.num_clients}), {cfg.model}; results -> {out}")
    kw = dict(cfg=cfg, algorithms=algorithms, grid=grid, seeds=seeds, alg_opts=per, reseed_data=bool(reseed))
    if trials is not None:
        kw.update(grid=None, space=space, trials=trials)
    return out, kw


def _run_points(cmd: SweepCommand, out: str, kw: dict, opts: dict, figures: dict) -> dict:
    """The sweep's runs: a random search (new or resumed) or a grid; returns its result."""
    select = opts["select"]  # None: f_plus_h, or on resume what the sweep (a random search) was run with
    tensorboard = cmd.figures.tensorboard
    if "space" in kw:
        return run_study(kw.pop("cfg"), kw.pop("algorithms"), kw.pop("space"), kw.pop("trials"), kw.pop("seeds"),
                         out_dir=out, jobs=opts["jobs"] or 1, select=select or "f_plus_h",
                         tensorboard=tensorboard, figures=figures, replace=replace_requested(cmd),
                         **{k: v for k, v in kw.items() if k != "grid"})
    if kw.get("resume") and "optuna" in read_sweep(out):  # a random search: its trials continue
        return run_study(None, None, None, None, out_dir=out, jobs=opts["jobs"] or 1, select=select,
                         resume=True, tensorboard=tensorboard)
    return run_sweep(out_dir=out, jobs=opts["jobs"] or 1, select=select, tensorboard=tensorboard,
                     progress=not cmd.no_progress, figures=None if kw.get("resume") else figures,
                     replace=False if kw.get("resume") else replace_requested(cmd), **kw)


def _report_sweep(cmd: SweepCommand, out: str, result: dict, figures: dict) -> int:
    """The table, the figures and the exit status of a finished sweep."""
    print(result["table"])
    print(f"results written to {out}")
    if cmd.figures.tensorboard:
        print(f"TensorBoard events: tensorboard --logdir {shlex.quote(out)}")
    sel = result["select"]
    overview_figure(out, cmd.figures, lambda: plot_sweep(out, result, read_sweep(out)["grid"], SELECT[sel][0], sel,
                                                         formats=tuple(figures["formats"]), band=figures["band"]))
    if result.get("failed"):  # a run raised, or its worker process died: listed with the reason below the table
        print(f"error: {len(result['failed'])} run(s) failed (the reasons are listed below the table); run them "
              f"again with `python -m python_algos sweep --resume {shlex.quote(out)}`", file=sys.stderr)
        return 1
    return 0


def cmd_sweep(cmd: SweepCommand) -> int:
    """`sweep` (experiments/sweep.py): the grid's runs, then the table and the figures."""
    opts = dict(jobs=cmd.jobs, select=cmd.select)
    # what the figures need: recorded in sweep.json, and on --resume taken from there unless given again
    figures = {"formats": list(cmd.figures.formats), "band": cmd.figures.band}
    if cmd.resume:
        check_resume_flags(cmd, "sweep")
        out = cmd.resume
        kw = dict(cfg=None, algorithms=None, grid=None, resume=True)
        figures = {**figures, **(read_sweep(out).get("figures") or {}), **_given(cmd.argv, "--formats", "--band")}
        print(f"resuming the sweep in {out}")
    else:
        out, kw = _new_sweep(cmd, opts)
    try:
        result = _run_points(cmd, out, kw, opts, figures)
    except SweepInterrupted as e:
        print(e.table)
        print(f"\ninterrupted: resume with: {e.resume_command}", file=sys.stderr)
        return e.exit_code  # 130 after Ctrl-C, 128 + the signal after SIGTERM / SIGHUP
    return _report_sweep(cmd, out, result, figures)
