"""One run of the command line into its run folder (format: :mod:`python_algos.runfolder`).

    cfg = Config(algorithm="fedcanon", dataset="synthetic", partition="natural", num_clients=30,
                 model="linear", reg="l1", reg_strength=1e-3, rounds=100)
    summary = run_experiment(cfg, "results/my-run")        # writes the folder
    summary = run_experiment(None, "results/my-run", resume=True, rounds=200)   # continue / extend

Guarantees: every input is checked (:func:`~.prepare.prepare_run`) before a folder is created or a file
in it changes; every file is replaced atomically except ``metrics.jsonl``, the run's history,
which is appended to (one row a round) and cut back to the checkpoint's round on resume (a
checkpoint holds the state of its round, not the history; rows past its round are dropped),
so a kill at any moment leaves a folder that ``run --resume`` finishes with the bit-identical
result of an uninterrupted run. A resume refuses a checkpoint whose settings differ from
``config.json`` in anything but the execution settings (``executor``, ``threads``,
``checkpoint_every``) and the number of rounds, which may only grow.

Under ``torchrun`` every rank runs the same calls: the clients are split over the ranks (executor
``distributed`` wrapping ``--executor``), every rank checks every input before rank 0 alone writes
the folder files and shows progress, and the checkpoint is sharded (a manifest ``checkpoint.pt``
plus one file per rank in ``checkpoint.pt.shards/``; see :mod:`python_algos.experiments.launch`),
which resumes on any number of processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import warnings
from typing import Callable, Optional

import torch

from ..data import FederatedData
from ..runfolder import callbacks
from ..runfolder import checkpoint as ckpt
from ..runfolder.files import STATE_DIR, read_metrics, remove_leftovers
from ..runfolder.folder import clear_for_fresh_run
from ..runfolder.history import check_f_star
from ..runfolder.records import (
    METRICS,
    RunWarning,
    save_model,
    summary_record,
    write_config,
    write_metrics,
    write_partition,
    write_summary,
)
from ..simulate import simulate
from . import launch
from .config import Config
from .evaluation import make_eval
from .folders import resume_command
from .losses import loss_function
from .prepare import PreparedRun, prepare_run
from .tensorboard import LiveEvents, check_available, live_requested  # imports no tensorboard until used

__all__ = ["run_experiment", "execute_run", "close_run", "Interrupted", "KILL_ENV", "start_folder"]

KILL_ENV = "_FEDKERNELS_TEST_KILL_AT_ROUND"  # test hook: SIGKILL the process after this round


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM / SIGHUP: :mod:`python_algos.runfolder.signals`) during a run, after its
    summary (status ``"interrupted"``) was written; ``summary`` holds it, including
    ``resume_command``; ``signum`` the signal that stopped it (the exit status is 128 + it)."""

    def __init__(self, summary: dict, signum: int = int(signal.SIGINT)):
        super().__init__(summary.get("message"))
        self.summary = summary
        self.signum = int(signum)


def run_experiment(cfg: Optional[Config], out_dir: str, *, fed: Optional[FederatedData] = None,
                   resume: bool = False, rounds: Optional[int] = None, progress: bool = True,
                   extra_eval: Optional[Callable] = None, label: Optional[str] = None,
                   log: Callable[[str], None] = print, replace: bool = False, f_star: Optional[float] = None) -> dict:
    """Run ``cfg`` into ``out_dir`` (see the module docstring); returns the summary dict.

    ``fed``: an already prepared split of this config's data (a comparison shares one).
    ``resume=True``: read ``out_dir/config.json`` and ``checkpoint.pt`` and continue (``cfg`` is
    ignored); ``rounds`` then extends the total (never below the checkpoint's round). Every input
    is checked (:func:`prepare_run`) before anything in ``out_dir`` is created or changed.
    A fresh run into a folder that already holds a run raises :class:`~python_algos.runfolder.files.RunExistsError`
    (nothing is touched) unless ``replace=True``, which first deletes everything of that run (its files,
    checkpoint shards, ``tensorboard/`` events, figures), and refuses a folder that also holds files no
    run writes. ``extra_eval(params) -> dict`` adds metrics (e.g. distance to a known solution). A
    NaN/Inf loss or model stops the run
    with status ``"diverged"``; the checkpoint of the last good round is kept. Ctrl-C writes the
    summary so far (status ``"interrupted"``) and raises :class:`Interrupted`. ``f_star``: the problem's
    optimal value F*, when the caller knows it; recorded in summary.json, where ``plot`` finds it
    and draws the suboptimality f + h − F*. Inside :func:`.tensorboard.live_events` (``--tensorboard``)
    each metrics row is also written to ``out_dir/tensorboard/`` as it is appended.
    """
    check_f_star(f_star)
    prep = prepare_run(cfg, out_dir, fed=fed, resume=resume, rounds=rounds, replace=replace)
    return execute_run(prep, progress=progress, extra_eval=extra_eval, label=label, log=log, f_star=f_star)


def start_folder(prep: PreparedRun, log) -> None:
    """The first writes of a run (every check has passed): settings, split, and metrics from the checkpoint."""
    out_dir, cfg, fed, snap = prep.out_dir, prep.cfg, prep.fed, prep.snap
    metrics_path = os.path.join(out_dir, METRICS)
    history = _history_of(out_dir, snap) if snap is not None else None  # read (and checked) before any write
    if not prep.resume:
        clear_for_fresh_run(out_dir, prep.replace)  # replace: nothing of the old run outlives it (events, shards, ...)
        # first: a folder with config.json can always be resumed; created exclusively unless replacing, so a run
        # another command started here since prepare_run checked the folder is refused, never cleared
        write_config(out_dir, cfg.to_dict(), exclusive=not prep.replace)
        prep.rewrite_config = False
    else:
        remove_leftovers(out_dir)
        launch.remove_shard_leftovers(os.path.join(out_dir, "checkpoint.pt"))
    if not prep.resume or snap is None:
        write_partition(out_dir, fed.partition, fed.parts, fed.histograms)
    if snap is not None:
        write_metrics(out_dir, history)  # drop the rounds after the checkpoint
        snap["metrics"] = history[1:]  # the History of the resumed run holds the whole run
        log(f"resuming {out_dir} from round {snap['round']} (checkpoint), up to round {cfg.rounds}")
    else:
        if os.path.exists(metrics_path):
            os.remove(metrics_path)
        if prep.resume:
            log(f"resuming {out_dir}: no checkpoint was written yet, starting from round 0")
    if prep.rewrite_config:
        write_config(out_dir, cfg.to_dict())


def _history_of(out_dir: str, snap: dict) -> list:
    """The rows of rounds 0..the checkpoint's round, which the resumed run continues: metrics.jsonl's
    (the history; a checkpoint holds the state only)."""
    path = os.path.join(out_dir, METRICS)
    return callbacks.rows_up_to(read_metrics(out_dir) if os.path.isfile(path) else [], int(snap["round"]), path)


class _KillHooks(callbacks.Callback):
    """Test hooks: SIGKILL this process after round ``KILL_ENV`` (its metrics row written, its
    checkpoint not), or this rank (``launch.maybe_kill``)."""

    def __init__(self, metrics: callbacks.MetricsFile):
        self.metrics = metrics
        self.kill_at = int(os.environ.get(KILL_ENV, "0") or 0)

    def after_round(self, t, state, row):
        if self.kill_at and t == self.kill_at:
            self.metrics.on_end()  # the row is in the file
            os.kill(os.getpid(), signal.SIGKILL)
        launch.maybe_kill(t)


def _run_callbacks(metrics_path: Optional[str], events, label: str, progress: bool, stop, saver, every: int,
                   budget: Optional[float] = None) -> list:
    """The callbacks of a command-line run, in order: the row goes to metrics.jsonl (and TensorBoard)
    first, then the display, the divergence check, the time budget (``--time-budget``), the test hooks,
    and the checkpoint of a round that every callback accepted (after the rows it continues are on disk)."""
    metrics = callbacks.MetricsFile(metrics_path)
    return [metrics, *([callbacks.TensorBoard(events)] if events is not None else []),
            callbacks.ShowProgress(label, enabled=progress), stop,
            *([callbacks.TimeBudget(budget)] if budget is not None else []), _KillHooks(metrics),
            callbacks.Checkpoint(saver, every, before_save=[metrics.sync])]


def _open_folder(prep: PreparedRun, log, main: bool):
    """Rank 0 starts the folder (:func:`start_folder`) and, with ``--tensorboard``, its live events
    (returned; None without); every rank waits for it, and stops too if it failed."""
    err, events = None, None
    if main:
        try:
            if live_requested():  # --tensorboard: a missing package is found before anything is written
                check_available()
            start_folder(prep, log)
            if prep.snap is None:  # a start at round 0: no checkpoint counts on the rows a killed start wrote
                shutil.rmtree(os.path.join(prep.out_dir, STATE_DIR), ignore_errors=True)
            if live_requested():  # from the rows start_folder kept (a resume: up to the checkpoint)
                events = LiveEvents(prep.out_dir)
        except Exception as e:  # noqa: BLE001 - the other ranks stop too (launch.agree)
            err = e
    try:
        launch.agree(err)  # ... and the folder is ready before any rank writes a checkpoint shard
    except BaseException:
        if events is not None:
            events.close()
        raise
    return events


def _run_rounds(prep: PreparedRun, cbs: list, eval_fn, executor: str, executor_options):
    """The rounds of the run (:func:`~python_algos.simulate.simulate` with the run's callbacks);
    returns (History or None, status). ``status``: ``diverged`` (the reason, or None), ``interrupted``,
    and ``stopped`` (the time budget's reason, or None)."""
    cfg, snap = prep.cfg, prep.snap
    status = {"diverged": None, "interrupted": False, "stopped": None}
    hist = None
    torch.set_rng_state(prep.torch_rng)  # as if the model had just been built (a comparison builds them all first)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RunWarning)  # summary.json's "warning", shown at the end of the command
            hist = simulate(prep.algorithm, prep.model, loss_function(prep.fed.dataset.task), prep.fed.clients,
                            cfg.rounds, regularizer=prep.reg, batch_size=cfg.batch_size, seed=cfg.seed, eval_fn=eval_fn,
                            callbacks=cbs, metrics_every=cfg.metrics_every, metric_step=cfg.metric_step, resume=snap,
                            participation=cfg.participation, clients_per_round=cfg.clients_per_round,
                            executor=executor, executor_options=executor_options, state=cfg.state,
                            state_folder=os.path.join(prep.out_dir, STATE_DIR) if cfg.state in ("disk", "auto")
                            else None,
                            threads=cfg.threads if cfg.threads is not None else "auto")  # prepare_run chose it
        status["diverged"] = next((cb.reason for cb in cbs if isinstance(cb, callbacks.StopOnDivergence)), None)
        # every process stopped at the same round (run_rounds agrees), each by its own clock's reading
        status["stopped"] = next((cb.reason for cb in cbs if isinstance(cb, callbacks.TimeBudget)), None)
    except ckpt.Diverged as e:
        status["diverged"] = str(e)
    except KeyboardInterrupt as e:
        status["interrupted"] = True
        status["signum"] = getattr(e, "signum", int(signal.SIGINT))  # a Terminated names SIGTERM / SIGHUP
    finally:
        for cb in cbs:  # also when simulate failed before its first round; however the run ended, the
            cb.on_end()  # TensorBoard events now equal metrics.jsonl
    if not status["interrupted"]:  # every rank reports the same status (an interrupted peer may be gone)
        status["diverged"] = launch.first_message(status["diverged"])
        status["stopped"] = launch.first_message(status["stopped"])
    return hist, status


def _write_failed(e: OSError, out_dir: str, last_ckpt: Optional[int]) -> OSError:
    """The error of a run that could not write: what failed, and how the folder continues (config.json
    is written first and every file but metrics.jsonl atomically, so the checkpoint is whole)."""
    kept = (f"its checkpoint of round {last_ckpt} is kept" if last_ckpt is not None
            else "no checkpoint was written, so it restarts at round 0")
    return OSError(e.errno, f"{e.strerror or e}; the run stopped and {kept}: once the cause is fixed (free space, "
                            f"a writable folder), continue it with `{resume_command(out_dir)}`", e.filename)


def _status(status: dict) -> str:
    """The run summary's status (``records.SUMMARY``) of a run that ended with ``status`` (:func:`_run_rounds`)."""
    if status["interrupted"]:
        return "interrupted"
    return "diverged" if status["diverged"] else "stopped" if status["stopped"] else "completed"


def execute_run(prep: PreparedRun, *, progress: bool = True, extra_eval: Optional[Callable] = None,
                label: Optional[str] = None, log: Callable[[str], None] = print,
                f_star: Optional[float] = None) -> dict:
    """Run a :class:`PreparedRun` into its folder; returns the summary (see :func:`run_experiment`)."""
    check_f_star(f_star)
    cfg, out_dir, fed, model, algorithm, reg, snap = (prep.cfg, prep.out_dir, prep.fed, prep.model, prep.algorithm,
                                                      prep.reg, prep.snap)
    ds = fed.dataset
    label = label or cfg.algorithm
    ckpt_path = os.path.join(out_dir, "checkpoint.pt")
    main = launch.is_main()  # under torchrun rank 0 alone writes the folder files and shows progress
    launch.barrier()  # every rank has checked its inputs (prepare_run) before rank 0 writes anything
    events = _open_folder(prep, log, main)
    eval_fn = make_eval(ds, model, extra_eval)
    saver = launch.checkpointer(ckpt_path, len(fed.clients), extra={"config": cfg.to_dict()},
                                state_folder=os.path.join(out_dir, STATE_DIR))  # a re-cut's writers' logs go
    cbs = _run_callbacks(os.path.join(out_dir, METRICS) if main else None, events, label, progress and main,
                         callbacks.StopOnDivergence(), saver, cfg.checkpoint_every, cfg.time_budget)
    executor, executor_options = launch.executor_for(cfg.executor)
    t0 = time.perf_counter()
    try:
        hist, status = _run_rounds(prep, cbs, eval_fn, executor, executor_options)
    except OSError as e:  # a write failed (disk full, file system gone read-only): the folder stays resumable
        raise _write_failed(e, out_dir, saver.last_round if saver.last_round is not None else
                            (int(snap["round"]) if snap else None)) from None
    run_seconds = time.perf_counter() - t0

    # rank 0 wrote metrics.jsonl; another rank (maybe on another node) has the same rows in memory
    rows = read_metrics(out_dir) if main else ([hist.initial, *hist.metrics] if hist is not None else [])
    last_ckpt = saver.last_round if saver.last_round is not None else (int(snap["round"]) if snap else None)
    if status["interrupted"] and main:
        last_ckpt = ckpt.saved_round(ckpt_path)  # the file, not the bookkeeping Ctrl-C may have cut short
    summary = summary_record(
        label=label, algorithm=algorithm.name, hparams=algorithm.hparams(),
        status=_status(status),
        rows=rows, rounds=cfg.rounds, regularizer=repr(reg), num_clients=len(fed.parts),
        dim=sum(p.numel() for p in model.parameters()), executor=hist.executor if hist is not None else executor,
        out_dir=out_dir, resume_command=resume_command(out_dir),
        process_seconds=run_seconds, dataset=ds.source, partition=cfg.partition,
        world_size=hist.world_size if hist is not None else launch.world_size(),
        threads=hist.threads if hist is not None else cfg.threads,
        metric_step=algorithm.metric_step() if cfg.metric_step is None else cfg.metric_step,
        last_checkpoint_round=last_ckpt)
    if executor == "distributed":
        summary["inner_executor"] = cfg.executor
    if hist is not None and "first_layer" in hist.setup:  # the batched executor's first-layer path (issue 40)
        summary["first_layer"] = hist.setup["first_layer"]
    if prep.estimate is not None:  # prepare's up-front estimate (bytes), printed with the setup line
        summary["estimate"] = prep.estimate
    if f_star is not None:
        summary["f_star"] = float(f_star)
    return close_run(summary, label=label, cfg=cfg, ckpt_path=ckpt_path, diverged=status["diverged"],
                     stopped=status["stopped"], interrupted=status.get("signum") if status["interrupted"] else None,
                     save=lambda: save_model(out_dir, hist.params, hist.metrics[-1]["round"] if hist.metrics else 0,
                                             model.state_dict()), write=main, log=log)


def close_run(summary: dict, *, label: str, cfg: Config, ckpt_path: str, diverged: Optional[str] = None,
              stopped: Optional[str] = None, interrupted: Optional[int] = None, failure: Optional[str] = None,
              save: Optional[Callable[[], None]] = None, write: bool = True, log: Callable[[str], None] = print
              ) -> dict:
    """The end of a run, one process or Flower: the summary's message (one wording for each way a run
    ends), model.pt (``save()``: a run that did not diverge; it records its round, which a reader pairs
    with the metrics of a resumed run that stopped early) and summary.json, then the summary; raises
    :class:`Interrupted` (``interrupted``: the signal number) or returns one with ``failure`` set
    (the caller raises its error) after writing it. ``write=False``: a rank other than 0 writes nothing."""
    done, k, out_dir = summary["rounds_done"], summary["last_checkpoint_round"], summary["out_dir"]
    where = (f"the last checkpoint is round {k}, where the run resumes" if k is not None
             else "no checkpoint was written, so it restarts at round 0")
    resume = f": `{summary['resume_command']}`"
    if interrupted is not None or failure is not None:
        summary["message"] = (f"{label} was interrupted after round {done} of {cfg.rounds}; {where}"
                              if interrupted is not None else f"{label} {failure}\nThe folder holds the run up to "
                                                              f"round {done}; {where}{resume}")
        if write:
            write_summary(out_dir, summary)
        if interrupted is not None:
            raise Interrupted(summary, interrupted)
        return summary
    if stopped and not diverged:
        summary["message"] = f"{label} stopped at {stopped} (--time-budget); {where}{resume}"
        if write:
            log(summary["message"])
    if diverged:
        keep = f"the last good checkpoint (round {k}) is kept in {ckpt_path}" if k is not None else \
            "no checkpoint was written"
        summary["message"] = (f"{label} diverged at {diverged}; the run was stopped and {keep}. Lower the step size "
                              f"(--lr, currently {cfg.lr:g}) or the local steps.")
    elif write and save is not None:
        save()
    if write:
        write_summary(out_dir, summary)
    return summary
