"""A :func:`~python_algos.simulate` result (:class:`~python_algos.simulate.History`) as a run folder.

    hist = simulate(FedCanon(alpha=0.1, beta=0.01, local_steps=10), model, loss_fn, clients, rounds=100)
    hist.save("results/my-api-run")            # config.json, metrics.jsonl, summary.json, model.pt
    python -m python_algos plot results/my-api-run
    hist = History.load("results/my-api-run")   # also reads folders written by `run` / `compare`

The files are those of a command-line run (see :mod:`python_algos.runfolder`), so ``plot`` and every
reader of run folders work on them. ``config.json`` holds what ``simulate`` knew (algorithm and its
hyper-parameters, regularizer, rounds, seed, batch size, executor, number of clients, ...) and
``"api_run": true``: such a folder has no checkpoint and no data recipe, so ``run --resume``
refuses it. No ``checkpoint.pt`` or ``partition.json`` is written.

The folder is written in full under a temporary name beside the target and renamed into place, so
a failure (or a kill) leaves either no folder or the previous one, never a mix. The rename is also
the check that the target holds no run: of several processes saving to one path at once (every rank
of a torchrun job), exactly one succeeds and the others raise ``FileExistsError``.

``model.pt`` records the round of its model. ``History.load`` returns that model with the metrics of
rounds 0 up to that round: a command-line run whose resumed continuation stopped early (Ctrl-C, a
kill, divergence) has metrics rows past model.pt's round; they are left out with a warning saying
what the folder holds. It refuses a folder where model.pt cannot be paired with its metrics.
"""

from __future__ import annotations

import errno
import math
import os
import shlex
import shutil
import uuid
import warnings
from typing import Optional

import torch

from .files import RunExistsError, RunFolderError, exchange_paths, holds_run, read_json_object, read_metrics
from .folder import foreign_entries
from .records import (
    API_MARK,
    COMPARISON,
    CONFIG,
    FORMAT_KEY,
    METRICS,
    MODEL,
    SEEDS,
    SUMMARY,
    group_runs,
    load_model,
    read_config,
    save_model,
    summary_record,
    write_config,
    write_metrics,
    write_summary,
)

__all__ = ["save_history", "load_history", "API_MARK"]



def _replaceable(path: str) -> bool:
    """``path`` holds a run and nothing a run does not write (overwrite=True swaps out the whole
    folder, so a user's file there would go with the old run)."""
    return holds_run(path) and not foreign_entries(path)


def _check_target(path: str, overwrite: bool) -> None:
    """Refuse a target the save must not touch, before anything is written. The answer can change
    before the folder is published (another process may save there meanwhile): :func:`_publish`
    decides for good."""
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False, got {overwrite!r}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"History.save: {path} is a file, not a folder (nothing was changed)")
    if os.path.isdir(path) and os.listdir(path):
        if not _replaceable(path):
            raise FileExistsError(_not_a_run(path))
        if not overwrite:
            raise RunExistsError(f"History.save: {path} already holds a run; pass overwrite=True to replace it, "
                                 f"or choose another path (nothing was changed)")


def _not_a_run(path: str) -> str:
    foreign = foreign_entries(path)
    what = f" ({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''})" if foreign else ""
    return (f"History.save: {path} holds files that are not a run folder{what}; choose another path (nothing was "
            f"changed, overwrite=True replaces only run folders)")


def _publish(tmp: str, path: str, overwrite: bool) -> None:
    """Put the finished folder ``tmp`` at ``path``; the rename itself is the check, so of several
    processes saving to one path at once exactly one succeeds without ``overwrite``.

    ``rename(2)`` of a folder onto a non-empty folder fails (ENOTEMPTY / EEXIST) and onto an empty one
    replaces it, atomically. With ``overwrite`` an existing run is swapped out in one step where the
    system can (``renameat2`` RENAME_EXCHANGE), else with two renames that put the old folder back if
    the second fails; ``path`` never holds a mix of two runs, and after the call it is never missing."""
    try:
        os.rename(tmp, path)
        return
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.EISDIR):  # a file appeared at path
            raise FileExistsError(f"History.save: {path} is a file, not a folder (nothing was changed)") from None
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        if not overwrite:
            if not _replaceable(path):
                raise FileExistsError(_not_a_run(path)) from None
            raise RunExistsError(
                f"History.save: another process saved a run at {path} first (after this call had checked the "
                f"folder), so this call saved nothing; pass overwrite=True to replace it, or choose another path. "
                f"Under torchrun every rank holds the same History: save it on rank 0 only "
                f"(if torch.distributed.get_rank() == 0: hist.save(path))") from None
    if not _replaceable(path):  # files appeared there after the check: never replace them
        raise FileExistsError(_not_a_run(path))
    if exchange_paths(tmp, path):  # tmp now holds the old run, which the caller removes with tmp
        if os.path.isdir(tmp) and os.listdir(tmp) and not _replaceable(tmp):  # swapped in meanwhile: put it back
            exchange_paths(tmp, path)
            raise FileExistsError(_not_a_run(path))
        return
    old = tmp + ".old"
    try:
        os.rename(path, old)
    except FileNotFoundError:  # another overwriting saver is between its two renames: publish, or fail clearly
        os.rename(tmp, path)
        return
    try:
        os.rename(tmp, path)
    except BaseException:
        if not os.path.lexists(path):
            os.rename(old, path)  # the swap failed: the old run goes back
        raise
    shutil.rmtree(old, ignore_errors=True)


def check_f_star(f_star) -> None:
    """The optimal value F* a run folder records (``f_star``): None or a finite number."""
    if f_star is not None and (isinstance(f_star, bool) or not isinstance(f_star, (int, float))
                               or not math.isfinite(f_star)):
        raise ValueError(f"f_star must be a finite number (the optimal value F*), got {f_star!r}")


def save_history(hist, path: str, *, overwrite: bool = False, label: Optional[str] = None,
                 f_star: Optional[float] = None, model=None) -> str:
    """See :meth:`python_algos.simulate.History.save`."""
    path = os.fspath(path)
    if label is not None and not isinstance(label, str):
        raise TypeError(f"label must be a string, got {type(label).__name__}")
    check_f_star(f_star)
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_target(path, overwrite)
    rows = [hist.initial, *hist.metrics]
    setup = dict(hist.setup or {})
    # what simulate knew, marked api_run: no checkpoint or data recipe, so `run --resume` refuses the folder
    config = {API_MARK: True, "saved_by": "python_algos History.save", "algorithm": hist.algorithm,
              "hparams": hist.hparams, "executor": hist.executor, **setup}
    summary = summary_record(
        label=label or hist.algorithm, algorithm=hist.algorithm, hparams=hist.hparams, status="completed", rows=rows,
        rounds=setup.get("rounds", rows[-1].get("round", 0)), regularizer=setup.get("regularizer"),
        num_clients=setup.get("num_clients"), dim=hist.params.numel(), executor=hist.executor, out_dir=path,
        resume_command=None, f_star=None if f_star is None else float(f_star), threads=hist.threads,
        **{API_MARK: True})
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    # a name no other saver (process or thread) uses: concurrent saves never write into each other's folder
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(path))}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        os.makedirs(tmp)
        write_config(tmp, config)
        write_metrics(tmp, rows)
        save_model(tmp, hist.params, rows[-1].get("round", 0), None if model is None else model.state_dict())
        write_summary(tmp, summary)
        _publish(tmp, path, overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _nan_for_null(row: dict) -> dict:
    """metrics.jsonl stores non-finite numbers as null; give them back as NaN."""
    return {k: (math.nan if v is None else v) for k, v in row.items()}


def _why_past_model(summary: dict) -> str:
    """Why metrics.jsonl goes past model.pt's round, as far as summary.json tells."""
    how = {"interrupted": "was interrupted", "diverged": "diverged"}.get(summary.get("status"))
    return (f"the resumed run {how} after round {summary.get('rounds_done')}" if how
            else "a resumed run stopped (was killed?) before it finished")


def _rows_of_model(path: str, rows: list, model_round, summary: dict, api_run: bool) -> list:
    """The metrics rows up to the round of model.pt, never rows of another model's rounds.

    The command line appends a row to metrics.jsonl every round and writes model.pt when a run
    completes, so a resumed run that then stops early (Ctrl-C, a kill, divergence) leaves rows past
    model.pt's round. Those rows are dropped with a warning saying so; a model.pt whose round has no
    row, or an older model.pt (no ``round``) that summary.json does not vouch for, is refused."""
    last = int(rows[-1].get("round", 0))
    resume = ("" if api_run or summary.get("status") == "diverged"  # nothing to resume / it would diverge again
              else f" `python -m python_algos run --resume {shlex.quote(path)}` finishes the run.")
    if model_round is None:  # written before model.pt recorded its round: summary.json must vouch for it
        # (model.pt is written just before summary.json, and only when a run completes)
        if summary.get("status") == "completed" and summary.get("rounds_done") == last:
            return rows
        raise RunFolderError(
            f"History.load: {path}: model.pt does not record its round (an older version wrote it) and summary.json "
            f"(status {summary.get('status')}, rounds_done {summary.get('rounds_done')}) does not show it is the "
            f"model of metrics.jsonl's last round {last} ({_why_past_model(summary)}), so the model cannot be paired "
            f"with its metrics; nothing was loaded.{resume}")
    model_round = int(model_round)
    kept = [r for r in rows if int(r.get("round", 0)) <= model_round]
    if int(kept[-1].get("round", 0)) != model_round:
        raise RunFolderError(
            f"History.load: {path}: model.pt is the model of round {model_round} but metrics.jsonl holds rounds "
            f"0–{last} only (a resumed run rewrote them from an earlier checkpoint and stopped), so the model cannot "
            f"be paired with its metrics; nothing was loaded.{resume}")
    if last > model_round:
        warnings.warn(
            f"History.load: {path}: metrics up to round {last}, model.pt of round {model_round} "
            f"({_why_past_model(summary)}): loaded rounds 0–{model_round}, the metrics of model.pt's model."
            f"{resume}", stacklevel=4)
    return kept


# Folders that hold runs rather than being one: the file that marks them and what they are
_GROUPS = ((COMPARISON, "a comparison of runs (`compare`)"), (SEEDS, "a folder of runs of several seeds (`--seeds`)"))


def _not_a_run_folder(path: str, missing: list) -> str:
    """Why ``path`` cannot be loaded; a comparison or a folder of seeds names the run folders inside
    it that can (loading one of them is what the user meant), in the group's order."""
    for mark, what in _GROUPS:
        if not os.path.isfile(os.path.join(path, mark)):
            continue
        subs = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
        order = group_runs(path) or []  # a damaged record: the folder listing alone
        subs = [d for d in order if d in subs] + [d for d in subs if d not in order]
        names = ", ".join(subs) if subs else "none yet"
        return (f"History.load: {path} is {what}, not one run: load one of {os.path.join(path, '<name>')} "
                f"({names})")
    return f"History.load: {path} is not a run folder (no {', '.join(missing)})"


def load_history(path: str) -> dict:
    """See :meth:`python_algos.simulate.History.load`: the History's fields (all but ``state``) as a
    dict, which ``History.load`` builds the History from (this layer sits below ``simulate``)."""
    path = os.fspath(path)
    missing = [f for f in (CONFIG, METRICS) if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise FileNotFoundError(_not_a_run_folder(path, missing))
    config = {k: v for k, v in read_config(path).items() if k != FORMAT_KEY}  # the format is no setting
    summary = read_json_object(os.path.join(path, SUMMARY)) if os.path.isfile(os.path.join(path, SUMMARY)) else {}
    rows = [_nan_for_null(r) for r in read_metrics(path)]
    if not rows:
        raise ValueError(f"History.load: {os.path.join(path, METRICS)} holds no rows")
    model_path = os.path.join(path, MODEL)
    if not os.path.isfile(model_path):
        raise FileNotFoundError(f"History.load: {path} holds no model.pt (the run did not complete)")
    saved = load_model(path)
    rows = _rows_of_model(path, rows, saved.get("round"), summary, bool(config.get(API_MARK)))
    if config.get(API_MARK):
        setup = {k: v for k, v in config.items() if k not in (API_MARK, "saved_by", "algorithm", "hparams", "executor")}
        algorithm, hparams, executor = config["algorithm"], config["hparams"], config.get("executor", "sequential")
    else:  # a folder of `run` / `compare`: the Config is the setup
        setup = dict(config)
        algorithm = summary.get("algorithm", config.get("algorithm"))
        hparams, executor = summary.get("hparams", {}), summary.get("executor", config.get("executor"))
    return dict(params=saved["params"], metrics=rows[1:], initial=rows[0], algorithm=algorithm, hparams=hparams,
                executor=executor, setup=setup)
