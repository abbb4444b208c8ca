"""Command line entry point: ``main`` and the subcommands ``run``, ``compare``, ``demo``, ``plot``,
``algorithms`` (``sweep`` and several seeds: :mod:`.research`). Usage, examples and exit
status: :mod:`.parser` (what ``--help`` prints)."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
import warnings
from typing import Optional, Sequence

from ...algorithms.registry import installed_algorithms_text, markdown_table
from ...data import DataNotFoundError
from ...runfolder.files import read_json_object
from ...runfolder.folder import unused_claims_removed
from ...runfolder.records import COMPARISON, SUMMARY
from ...runfolder.signals import exit_code, terminate_as_interrupt
from .. import launch
from ..compare import compare_experiments, comparison_table, verdict_line
from ..config import Config, named_as
from ..device import resolve_device
from ..flower_run import check_flower_flags, execute_flower, prepare_flower  # flwr itself: imported when a run starts
from ..folders import default_out_dir
from ..plotting import plot_runs  # matplotlib itself: imported when a figure is drawn
from ..prepare import check_state, check_world_size, estimate_line, prepare_run
from ..run import Interrupted, execute_run
from ..tensorboard import live_events  # the tensorboard package itself: imported when events are written
from .options import (
    AlgorithmsCommand,
    CompareCommand,
    DemoCommand,
    Figures,
    PlotCommand,
    RunCommand,
    SweepCommand,
    command_of,
)
from .parser import DEMO_ALGORITHMS, build_parser, demo_config
from .research import cmd_seeds, cmd_sweep, wants_seeds, write_run_events
from .settings import (
    check_resume_flags,
    compare_settings,
    output_folder,
    overview_figure,
    print_summary,
    quiet,
    replace_requested,
    restarted_run,
    resumed_run,
    seed_settings,
)

__all__ = ["main", "build_parser", "DEMO_ALGORITHMS"]

_SEEDS_AND_WORKERS = ("--workers with several seeds: run the seeds one after another on one process each "
                      "(leave out --workers), or give one seed")


def cmd_run(cmd: RunCommand) -> int:
    if cmd.demo:
        return cmd_demo(DemoCommand(rounds=cmd.settings.get("rounds"), out=cmd.out, no_progress=cmd.no_progress,
                                    figures=Figures(formats=cmd.figures.formats, no_plot=cmd.figures.no_plot),
                                    names=cmd.names))
    if cmd.flower:
        return _cmd_run_flower(cmd)
    if cmd.round_timeout is not None:
        raise ValueError("--round-timeout is the Flower server's wait for a round (run --flower); without --flower "
                         "a run has no server to wait")
    if cmd.workers and wants_seeds(cmd):
        raise ValueError(_SEEDS_AND_WORKERS)
    if cmd.workers and not launch.distributed():  # launch the ranks, then wait
        return _launch_run(cmd)
    if wants_seeds(cmd):
        return cmd_seeds(cmd)
    main = launch.is_main()
    say = print if main else quiet  # under torchrun rank 0 alone prints

    if cmd.resume:
        summary = execute_run(resumed_run(cmd), progress=not cmd.no_progress, log=say)
    else:
        cfg = Config.from_dict(seed_settings(cmd.settings)[0])  # one seed: --reseed-data refused
        out = launch.agree_on(output_folder(cmd, cfg.algorithm) if main else None, cfg.device)  # rank 0's folder
        if launch.agree_on(main and restarted_run(cfg, out)):
            # torchrun restarted the job after a rank failed: continue from the last checkpoint
            prep = prepare_run(None, out, resume=True, rounds=cfg.rounds)
        else:
            prep = prepare_run(cfg, out, replace=replace_requested(cmd))
        h = "per parameter" if cfg.regularizers else cfg.reg
        say(f"{cfg.algorithm} on {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), {cfg.model}, h={h}; "
            f"results -> {out}" + (f" ({launch.world_size()} processes)" if launch.distributed() else ""))
        say(estimate_line(prep.estimate))
        summary = execute_run(prep, progress=not cmd.no_progress, log=say)
    if not main:
        return 3 if summary["status"] == "diverged" else 0
    return _finish_run(summary, cmd.figures)


def _launch_run(cmd: RunCommand) -> int:
    """``run --workers P`` outside torchrun: every check here, then torchrun's P ranks run the command."""
    out = None
    if cmd.resume:  # the ranks resume it (resumed_run), --checkpoint-every included
        check_resume_flags(cmd, "run")
    else:  # check the settings here, and pick the folder once for every rank
        cfg = Config.from_dict(seed_settings(cmd.settings)[0])  # one seed: --reseed-data refused
        out = output_folder(cmd, cfg.algorithm)
        # Every check a rank would make (data, model, regularizers, participation, the folder),
        # here and writing nothing: an error is then one line, not P numbered copies of it
        # followed by torchrun's failure report. It loads the data once more; ranks load theirs.
        prep = prepare_run(cfg, out, replace=replace_requested(cmd))
        check_world_size(len(prep.fed.parts), cmd.workers)
        check_state(prep.cfg, prep.fed.clients, prep.model, prep.algorithm, workers=True, out_dir=prep.out_dir)
    return launch.run_workers(cmd.argv, cmd.workers, out)


def _cmd_run_flower(cmd: RunCommand) -> int:
    """``run --flower`` (experiments/flower_run.py): every check, then the local Flower deployment."""
    if cmd.resume:
        check_resume_flags(cmd, "flower")
    check_flower_flags(workers=cmd.workers, seeds=not cmd.resume and wants_seeds(cmd), demo=cmd.demo,
                       distributed=launch.distributed())
    if cmd.resume:
        prep = prepare_flower(None, cmd.resume, resume=True, rounds=cmd.settings.get("rounds"))
    else:
        cfg = Config.from_dict(seed_settings(cmd.settings)[0])  # one seed: --reseed-data refused
        out = output_folder(cmd, cfg.algorithm)
        prep = prepare_flower(cfg, out, replace=replace_requested(cmd))
    cfg, out = prep.run.cfg, prep.run.out_dir
    h = "per parameter" if cfg.regularizers else cfg.reg
    print(f"{cfg.algorithm} on {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), {cfg.model}, h={h}; "
          f"results -> {out} (Flower)")
    return _finish_run(execute_flower(prep, round_timeout=cmd.round_timeout, progress=not cmd.no_progress),
                       cmd.figures)


def _finish_run(summary: dict, figures: Figures) -> int:
    print_summary(summary)
    print(f"results written to {summary['out_dir']}")
    if summary.get("warning"):  # records.run_warning: the run got worse
        print(f"warning: {summary['label']}: {summary['warning']}", file=sys.stderr)
    write_run_events([summary["out_dir"]], figures.tensorboard)
    overview_figure(summary["out_dir"], figures)
    if summary["status"] == "diverged":
        print(summary["message"], file=sys.stderr)
        return 3
    return 0


def cmd_compare(cmd: CompareCommand) -> int:
    if wants_seeds(cmd):
        if cmd.workers:
            raise ValueError(_SEEDS_AND_WORKERS)
        return cmd_seeds(cmd)
    if cmd.workers and not launch.distributed():  # launch the ranks, then wait
        return _launch_compare(cmd)
    main = launch.is_main()
    say = print if main else quiet  # under torchrun rank 0 alone prints
    if cmd.resume:
        check_resume_flags(cmd)
        out = cmd.resume
        say(f"resuming the comparison in {out}")
        summaries = compare_experiments(None, None, out, resume=True, rounds=cmd.settings.get("rounds"),
                                        progress=not cmd.no_progress and main, log=say)
        step = read_json_object(os.path.join(out, COMPARISON))["config"]["metric_step"]
    else:
        cfg, algorithms, per, _, _ = compare_settings(cmd.settings, cmd.algorithms)
        out = launch.agree_on(output_folder(cmd, "compare") if main else None, cfg.device)  # rank 0's folder
        say(f"comparing {', '.join(algorithms)} on {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), "
            f"{cfg.model}, h={cfg.reg}; results -> {out}")
        summaries = compare_experiments(cfg, algorithms, out, alg_opts=per, progress=not cmd.no_progress and main,
                                        replace=replace_requested(cmd), log=say)
        step = cfg.metric_step if cfg.metric_step is not None else cfg.lr * cfg.local_steps
    if not main:
        return 3 if any(s["status"] == "diverged" for s in summaries) else 0
    print(comparison_table(summaries, step))
    print(f"results written to {out}  (more figures: python -m python_algos plot {shlex.quote(out)})")
    write_run_events([s["out_dir"] for s in summaries], cmd.figures.tensorboard)
    overview_figure(out, cmd.figures)
    return 3 if any(s["status"] == "diverged" for s in summaries) else 0


def _launch_compare(cmd: CompareCommand) -> int:
    """``compare --workers P`` outside torchrun: the checks here, then torchrun's P ranks run the command."""
    out = None
    if cmd.resume:
        check_resume_flags(cmd)
    else:  # check the settings here, and pick the folder once for every rank
        cfg, *_ = compare_settings(cmd.settings, cmd.algorithms)  # checks the values and the names
        resolve_device(cfg.device)
        check_world_size(cfg.num_clients, cmd.workers)
        out = output_folder(cmd, "compare")
    return launch.run_workers(cmd.argv, cmd.workers, out)


def cmd_demo(cmd: DemoCommand) -> int:
    t0 = time.perf_counter()
    cfg = demo_config()
    if cmd.rounds is not None:
        cfg = cfg.replace(rounds=cmd.rounds)
    main = launch.is_main()
    say = print if main else quiet  # under torchrun rank 0 alone prints
    out = launch.agree_on((cmd.out or default_out_dir("demo")) if main else None, cfg.device)  # rank 0's folder
    say(f"fedkernels demo: sparse logistic regression (d = 100, 10-sparse ground truth), 10 heterogeneous "
        f"clients, h = {cfg.reg_strength:g}·||x||_1, full gradients, K = {cfg.local_steps}, T = {cfg.rounds}")
    summaries = compare_experiments(cfg, list(DEMO_ALGORITHMS), out, progress=not cmd.no_progress and main, log=say)
    if not main:
        return 0
    print()
    print(comparison_table(summaries, cfg.lr * cfg.local_steps))
    print()
    print("f+h: final objective; ‖G_s‖²: stationarity (prox-gradient mapping, common s = lr·K); sparsity: "
          "fraction of exact zeros;\nsupport F1: recovered non-zero pattern vs the ground truth. FedAvg ignores h "
          "(smooth method), so its model is dense.")
    print(f"results written to {out}  (more figures: python -m python_algos plot {shlex.quote(out)})")
    overview_figure(out, cmd.figures)
    print(f"demo finished in {time.perf_counter() - t0:.1f} s")
    print(verdict_line(summaries))  # the last line: what the table and the figure show, in words
    return 0


def cmd_plot(cmd: PlotCommand) -> int:
    files = plot_runs(list(cmd.runs), out_dir=cmd.out, metrics=None if cmd.metrics is None else list(cmd.metrics),
                      x_axes=list(cmd.x), title=cmd.title, formats=cmd.formats, f_star=cmd.f_star, setup=cmd.setup,
                      band=cmd.band)
    for f in files:
        print(f)
    return 0


def cmd_algorithms(cmd: AlgorithmsCommand) -> int:
    print(markdown_table())
    print()
    print(installed_algorithms_text())
    return 0


# Each command's function, by the class of its options (options.command_of).
COMMANDS = {RunCommand: cmd_run, CompareCommand: cmd_compare, SweepCommand: cmd_sweep, DemoCommand: cmd_demo,
            PlotCommand: cmd_plot, AlgorithmsCommand: cmd_algorithms}


def show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


def error_text(e: Exception) -> str:
    """One line: an ``OSError`` as ``PATH: what failed`` (its errno's words, not ``[Errno 28] ...``)."""
    if isinstance(e, OSError) and e.strerror and not isinstance(e, DataNotFoundError):
        paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p)
        return f"{paths}: {e.strerror}" if paths else e.strerror
    return str(e)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv or ["demo"])
    if args.command is None:
        parser.print_help()
        return 2
    command = command_of(parser, args, argv)  # the namespace, once, into the command's typed options
    handler = COMMANDS[type(command)]

    with warnings.catch_warnings():
        warnings.showwarning = show_warning
        if launch.rank() != 0:  # rank 0 alone reports (every rank would print the same warnings)
            warnings.simplefilter("ignore")
        try:
            live = contextlib.nullcontext()
            # --tensorboard: every run writes its events as it goes (../tensorboard.py)
            if getattr(command, "figures", Figures()).tensorboard:
                live = live_events()
            # SIGTERM / SIGHUP take Ctrl-C's path: the folder is closed as interrupted, children end
            # an error about a setting names it as the user gave it (the flag as typed, or the config file's key);
            # a default folder claimed by a command that then failed before writing is removed
            with terminate_as_interrupt(), unused_claims_removed(), live, named_as(command.names):
                code = handler(command)
        except (DataNotFoundError, FileNotFoundError, ValueError, RuntimeError, OSError) as e:
            where = f" on rank {launch.rank()} of {launch.world_size()}" if launch.distributed() else ""
            print(f"error{where}: {error_text(e)}", file=sys.stderr)
            launch.finish(ok=False)
            return 1
        except Interrupted as e:  # Ctrl-C during a run: its summary is written
            if launch.is_main():
                print(f"\ninterrupted: {e.summary['message']}; the summary so far is in "
                      f"{os.path.join(e.summary['out_dir'], SUMMARY)}\nresume with: "
                      f"{e.summary['resume_command']}", file=sys.stderr)
            launch.leave_interrupted(exit_code(e))
            return exit_code(e)
        except KeyboardInterrupt as e:  # before a run folder existed, or while it was being finished
            if launch.is_main():
                print("\ninterrupted", file=sys.stderr)
            launch.leave_interrupted(exit_code(e))
            return exit_code(e)
        launch.finish()
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
