"""Command line entry point: ``main`` and the subcommands ``run``, ``compare``, ``demo``, ``plot``,
``algorithms`` (``sweep`` and several seeds: :mod:`.research`). Usage, examples and exit
status: :mod:`.parser` (what ``--help`` prints)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import time
import warnings
from typing import Optional, Sequence

from ...algorithms.registry import markdown_table
from ...runfolder.folder import unused_claims_removed
from ...runfolder.signals import exit_code, terminate_as_interrupt
from .. import launch
from ..compare import compare_experiments, comparison_table, verdict_line
from ..config import Config, named_as
from ..data import DataNotFoundError
from ..device import resolve_device
from ..flower_run import check_flower_flags, execute_flower, prepare_flower  # flwr itself: imported when a run starts
from ..folders import default_out_dir
from ..plotting import plot_runs  # matplotlib itself: imported when a figure is drawn
from ..prepare import check_algorithm_names, check_world_size, prepare_run
from ..run import Interrupted, execute_run
from ..tensorboard import live_events  # the tensorboard package itself: imported when events are written
from .parser import DEMO_ALGORITHMS, build_parser, demo_config
from .research import cmd_compare_seeds, cmd_run_seeds, cmd_sweep, wants_seeds, write_run_events
from .settings import (
    RESUME_OK,
    RUN_RESUME_OK,
    check_resume_flags,
    compare_settings,
    merge_settings,
    output_folder,
    overview_figure,
    print_summary,
    quiet,
    restarted_run,
    resumed_run,
    user_names,
)

__all__ = ["main", "build_parser", "DEMO_ALGORITHMS"]

def _replace(args) -> bool:
    """``--replace``: only a folder the user named (``--out`` / ``--name``) is replaced; a default
    folder is new by construction (:func:`~python_algos.runfolder.folder.claim_new_folder`)."""
    if not getattr(args, "replace", False):
        return False
    if not (getattr(args, "out", None) or getattr(args, "name", None)):
        raise ValueError("--replace: needs --out DIR or --name NAME (the folder to replace); without them every "
                         "command writes to a new folder")
    return True


def cmd_run(args) -> int:
    if args.demo:
        return cmd_demo(argparse.Namespace(rounds=getattr(args, "rounds", None), out=args.out,
                                           no_progress=args.no_progress, formats=args.formats, no_plot=args.no_plot))

    if getattr(args, "flower", False):
        return _cmd_run_flower(args)
    if getattr(args, "round_timeout", None) is not None:
        raise ValueError("--round-timeout is the Flower server's wait for a round (run --flower); without --flower "
                         "a run has no server to wait")
    if getattr(args, "workers", None) and wants_seeds(args):
        raise ValueError("--workers with several seeds: run the seeds one after another on one process each "
                         "(leave out --workers), or give one seed")
    if getattr(args, "workers", None) and not launch.distributed():  # launch the ranks, then wait
        out = None
        if args.resume:  # the ranks resume it (resumed_run), --checkpoint-every included
            check_resume_flags(args, RUN_RESUME_OK)
        else:  # check the settings here, and pick the folder once for every rank
            try:
                cfg = Config.from_dict(merge_settings(args))
                out = output_folder(args, cfg.algorithm)
                # Every check a rank would make (data, model, regularizers, participation, the folder),
                # here and writing nothing: an error is then one line, not P numbered copies of it
                # followed by torchrun's failure report. It loads the data once more; ranks load theirs.
                prep = prepare_run(cfg, out, replace=_replace(args))
                check_world_size(len(prep.fed.parts), args.workers)
            except ValueError:  # named where raised (config.named_as): this try can go
                raise
        return launch.run_workers(args.argv, args.workers, out)
    if wants_seeds(args):
        return cmd_run_seeds(args)
    main = launch.is_main()
    say = print if main else quiet  # under torchrun rank 0 alone prints

    if args.resume:
        summary = execute_run(resumed_run(args), progress=not args.no_progress, log=say)
    else:
        try:
            cfg = Config.from_dict(merge_settings(args))
            out = launch.agree_on(output_folder(args, cfg.algorithm) if main else None, cfg.device)  # rank 0's folder
            if launch.agree_on(main and restarted_run(cfg, out)):
                # torchrun restarted the job after a rank failed: continue from the last checkpoint
                prep = prepare_run(None, out, resume=True, rounds=cfg.rounds)
            else:
                prep = prepare_run(cfg, out, replace=_replace(args))
        except ValueError:  # named where raised (config.named_as): this try can go
            raise
        h = "per parameter" if cfg.regularizers else cfg.reg
        say(f"{cfg.algorithm} on {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), {cfg.model}, h={h}; "
            f"results -> {out}" + (f" ({launch.world_size()} processes)" if launch.distributed() else ""))
        summary = execute_run(prep, progress=not args.no_progress, log=say)
    if not main:
        return 3 if summary["status"] == "diverged" else 0
    return _finish_run(summary, args)


def _cmd_run_flower(args) -> int:
    """``run --flower`` (experiments/flower_run.py): every check, then the local Flower deployment."""
    if args.resume:
        # --workers is Flower's refusal to make (check_flower_flags), with its own reason
        check_resume_flags(args, allowed=tuple(k for k in RESUME_OK if k != "workers") + ("flower", "round_timeout"))
    check_flower_flags(workers=getattr(args, "workers", None), seeds=not args.resume and wants_seeds(args),
                       demo=args.demo, distributed=launch.distributed())
    try:
        if args.resume:
            prep = prepare_flower(None, args.resume, resume=True, rounds=getattr(args, "rounds", None))
        else:
            cfg = Config.from_dict(merge_settings(args))
            out = output_folder(args, cfg.algorithm)
            prep = prepare_flower(cfg, out, replace=_replace(args))
    except ValueError:  # named where raised (config.named_as): this try can go
        raise
    cfg, out = prep.run.cfg, prep.run.out_dir
    h = "per parameter" if cfg.regularizers else cfg.reg
    print(f"{cfg.algorithm} on {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), {cfg.model}, h={h}; "
          f"results -> {out} (Flower)")
    return _finish_run(execute_flower(prep, round_timeout=getattr(args, "round_timeout", None),
                                      progress=not args.no_progress), args)


def _finish_run(summary: dict, args) -> int:
    print_summary(summary)
    print(f"results written to {summary['out_dir']}")
    write_run_events([summary["out_dir"]], args)
    overview_figure(summary["out_dir"], args)
    if summary["status"] == "diverged":
        print(summary["message"], file=sys.stderr)
        return 3
    return 0




def cmd_compare(args) -> int:
    if wants_seeds(args):
        if getattr(args, "workers", None):
            raise ValueError("--workers with several seeds: run the seeds one after another on one process each "
                             "(leave out --workers), or give one seed")
        return cmd_compare_seeds(args)
    if getattr(args, "workers", None) and not launch.distributed():  # launch the ranks, then wait
        out = None
        if args.resume:
            check_resume_flags(args)
        else:  # check the settings here, and pick the folder once for every rank
            try:
                cfg, algorithms, _ = compare_settings(args)
                cfg.check()
                check_algorithm_names(algorithms)
                resolve_device(cfg.device)
                check_world_size(cfg.num_clients, args.workers)
            except ValueError:  # named where raised (config.named_as): this try can go
                raise
            out = output_folder(args, "compare")
        return launch.run_workers(args.argv, args.workers, out)
    main = launch.is_main()
    say = print if main else quiet  # under torchrun rank 0 alone prints
    if args.resume:
        check_resume_flags(args)
        out = args.resume
        say(f"resuming the comparison in {out}")
        summaries = compare_experiments(None, None, out, resume=True, rounds=getattr(args, "rounds", None),
                                        progress=not args.no_progress and main, log=say)
        with open(os.path.join(out, "comparison.json")) as f:
            step = json.load(f)["config"]["metric_step"]
    else:
        try:
            cfg, algorithms, per = compare_settings(args)
        except ValueError:  # named where raised (config.named_as): this try can go
            raise
        out = launch.agree_on(output_folder(args, "compare") if main else None, cfg.device)  # rank 0's folder
        say(f"comparing {', '.join(algorithms)} on {cfg.dataset} ({cfg.partition}, N={cfg.num_clients}), "
              f"{cfg.model}, h={cfg.reg}; results -> {out}")
        try:
            summaries = compare_experiments(cfg, algorithms, out, alg_opts=per, progress=not args.no_progress and main,
                                            replace=_replace(args), log=say)
        except ValueError:  # named where raised (config.named_as): this try can go
            raise
        step = cfg.metric_step if cfg.metric_step is not None else cfg.lr * cfg.local_steps
    if not main:
        return 3 if any(s["status"] == "diverged" for s in summaries) else 0
    print(comparison_table(summaries, step))
    print(f"results written to {out}  (more figures: python -m python_algos plot {shlex.quote(out)})")
    write_run_events([s["out_dir"] for s in summaries], args)
    overview_figure(out, args)
    return 3 if any(s["status"] == "diverged" for s in summaries) else 0


# --------------------------------------------------------------------------- #
# Several seeds (experiments/seeds.py)
# --------------------------------------------------------------------------- #


def cmd_demo(args) -> int:
    t0 = time.perf_counter()
    cfg = demo_config()
    if args.rounds is not None:
        cfg = cfg.replace(rounds=args.rounds)
    main = launch.is_main()
    say = print if main else quiet  # under torchrun rank 0 alone prints
    out = launch.agree_on((args.out or default_out_dir("demo")) if main else None, cfg.device)  # rank 0's folder
    say(f"fedkernels demo: sparse logistic regression (d = 100, 10-sparse ground truth), 10 heterogeneous "
        f"clients, h = {cfg.reg_strength:g}·||x||_1, full gradients, K = {cfg.local_steps}, T = {cfg.rounds}")
    summaries = compare_experiments(cfg, list(DEMO_ALGORITHMS), out, progress=not args.no_progress and main, log=say)
    if not main:
        return 0
    print()
    print(comparison_table(summaries, cfg.lr * cfg.local_steps))
    print()
    print("f+h: final objective; ‖G_s‖²: stationarity (prox-gradient mapping, common s = lr·K); sparsity: "
          "fraction of exact zeros;\nsupport F1: recovered non-zero pattern vs the ground truth. FedAvg ignores h "
          "(smooth method), so its model is dense.")
    print(f"results written to {out}  (more figures: python -m python_algos plot {shlex.quote(out)})")
    overview_figure(out, args)
    print(f"demo finished in {time.perf_counter() - t0:.1f} s")
    print(verdict_line(summaries))  # the last line: what the table and the figure show, in words
    return 0




def cmd_plot(args) -> int:
    files = plot_runs(args.runs, out_dir=args.out, metrics=args.metrics, x_axes=args.x, title=args.title,
                      formats=args.formats, f_star=args.f_star, setup=not args.no_setup, band=args.band)
    for f in files:
        print(f)
    return 0


def cmd_algorithms(args) -> int:
    print(markdown_table())
    return 0


def show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv or ["demo"])
    args.argv = argv
    if args.command is None:
        parser.print_help()
        return 2

    handler = {"run": cmd_run, "compare": cmd_compare, "sweep": cmd_sweep, "demo": cmd_demo, "plot": cmd_plot,
               "algorithms": cmd_algorithms}[args.command]

    with warnings.catch_warnings():
        warnings.showwarning = show_warning
        if launch.rank() != 0:  # rank 0 alone reports (every rank would print the same warnings)
            warnings.simplefilter("ignore")
        try:
            live = contextlib.nullcontext()
            if getattr(args, "tensorboard", False):  # every run writes its events as it goes (../tensorboard.py)
                live = live_events()
            # SIGTERM / SIGHUP take Ctrl-C's path: the folder is closed as interrupted, children end
            # an error about a setting names it as the user gave it (the flag as typed, or the config file's key);
            # a default folder claimed by a command that then failed before writing is removed
            with terminate_as_interrupt(), unused_claims_removed(), live, named_as(user_names(args)):
                code = handler(args)
        except (DataNotFoundError, FileNotFoundError, ValueError, RuntimeError) as e:
            where = f" on rank {launch.rank()} of {launch.world_size()}" if launch.distributed() else ""
            print(f"error{where}: {e}", file=sys.stderr)
            launch.finish(ok=False)
            return 1
        except Interrupted as e:  # Ctrl-C during a run: its summary is written
            if launch.is_main():
                print(f"\ninterrupted: {e.summary['message']}; the summary so far is in "
                      f"{os.path.join(e.summary['out_dir'], 'summary.json')}\nresume with: "
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
