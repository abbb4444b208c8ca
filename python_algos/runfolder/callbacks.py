"""What happens around the rounds of a run, as callbacks of the one engine loop.

The loop (:func:`run_rounds`, driven by :func:`~python_algos.simulate.simulate`) only runs rounds::

    for t in rounds:
        state, row = step(t, state)
        said = [cb.after_round(t, state, row) for cb in callbacks]    # True / FINAL: stop after this round
        if agreed(any(said)):                                          # every process stops together
            if agreed(True in said): break                             # True: the round is refused
            for cb in callbacks: cb.final_round(t)                     # FINAL: the round is kept,
            for cb in callbacks: cb.commit(t, state)                   # committed as the run's last
            break
        for cb in callbacks: cb.commit(t, state)                       # the round is final (checkpoints)

Everything else is a :class:`Callback`, the same objects for ``simulate`` from Python and the
command line (:func:`python_algos.experiments.run.execute_run`):

* :class:`Checkpoint` — the run's state every ``every`` rounds (and round 0 and the last);
* :class:`MetricsFile` — ``metrics.jsonl``, one appended row per round (the run's history);
* :class:`TensorBoard` — each row also to a live events writer;
* :class:`ShowProgress` — the progress bar / periodic lines;
* :class:`StopOnDivergence` — stops a run whose objective blew up (rule: :data:`DIVERGENCE_FACTOR`);
* :class:`TimeBudget` — stops a run after a number of seconds, at a round that is kept (:data:`FINAL`):
  checkpointed, so a resume continues it;
* :class:`FunctionCallback` — a plain ``cb(t, state, row)`` function (True stops), as
  ``simulate(callbacks=[...])`` has always taken.

A checkpoint holds the state of one round (O(N·d)), never the history: the history is the
append-only metrics file, read back on resume (:func:`rows_up_to`).

This module, like the rest of :mod:`python_algos.runfolder`, imports nothing from the package above it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Optional, Sequence

import torch

from .files import append_row
from .progress import Progress

__all__ = ["Callback", "RunView", "run_rounds", "as_callbacks", "Checkpoint", "MetricsFile", "TensorBoard",
           "ShowProgress", "StopOnDivergence", "TimeBudget", "FunctionCallback", "DIVERGENCE_FACTOR", "FINAL",
           "divergence", "rows_up_to"]


class _Final:
    def __repr__(self) -> str:
        return "FINAL"


# What ``after_round`` returns to stop the run after a round that stays good (a time budget): unlike
# True (a round refused, e.g. diverged), the round is committed, and checkpointed, as the run's last.
FINAL = _Final()


@dataclasses.dataclass
class RunView:
    """What the engine tells its callbacks about the run before its first round."""

    rounds: int  # the last round of the run (T)
    start: int  # the first round this call runs (1, or the resumed checkpoint's round + 1)
    initial: dict  # the row of round 0 (objective metrics at the starting point; {"round": 0} without them)
    main: bool  # the process that writes files and shows progress (rank 0 of a distributed run)
    report: Callable[[Any], torch.Tensor]  # state -> the model the algorithm reports
    snapshot: Callable[[int], dict]  # round -> what a resume needs (references to live buffers)
    fresh: bool  # a run from its starting point; False: resumed (also from a checkpoint of round 0)


class Callback:
    """One concern of a run. Every hook is optional; :func:`run_rounds` calls, in list order:

    * :meth:`on_start` once, before the first round (a fresh run: after round 0's metrics);
    * :meth:`after_round` after each round; returning True stops the run after it (the round is not
      committed), returning :data:`FINAL` stops it after committing the round;
    * :meth:`final_round` when a callback returned FINAL (and none True), before that round's commit;
    * :meth:`commit` after each round that no callback (on any process) refused;
    * :meth:`on_end` once, however the run ends (also on an exception or Ctrl-C)."""

    def on_start(self, run: RunView) -> None:
        pass

    def after_round(self, t: int, state, row: dict) -> Optional[bool]:
        return None

    def final_round(self, t: int) -> None:
        pass

    def commit(self, t: int, state) -> None:
        pass

    def on_end(self) -> None:
        pass


def run_rounds(view: RunView, state, step: Callable, callbacks: Sequence[Callback],
               agree: Callable[[bool], bool] = bool):
    """The engine loop (module docstring): rounds ``view.start .. view.rounds``; ``step(t, state)``
    returns ``(state, row)``; ``agree(flag)`` makes every process take the same decision to stop.
    Returns the last state."""
    started = []
    try:
        for cb in callbacks:
            started.append(cb)
            cb.on_start(view)
        for t in range(view.start, view.rounds + 1):
            state, row = step(t, state)
            verdicts = [cb.after_round(t, state, row) for cb in callbacks]
            refused = any(v is True for v in verdicts)
            stop = agree(refused or any(v is FINAL for v in verdicts))
            if stop and agree(refused):  # a second agreement only when stopping: every process stops alike
                break
            if stop:
                for cb in callbacks:
                    cb.final_round(t)
            for cb in callbacks:
                cb.commit(t, state)
            if stop:
                break
    finally:
        for cb in started:
            cb.on_end()
    return state


class FunctionCallback(Callback):
    """``fn(t, state, row)`` after every round; returning True stops the run."""

    def __init__(self, fn: Callable):
        if not callable(fn):
            raise TypeError(f"a callback must be a Callback or a function cb(t, state, metrics), got {fn!r}")
        self.fn = fn

    def after_round(self, t, state, row):
        return self.fn(t, state, row)


def as_callbacks(items: Sequence) -> list:
    """:class:`Callback` objects as they are, functions wrapped in :class:`FunctionCallback`."""
    return [c if isinstance(c, Callback) else FunctionCallback(c) for c in items]


class Checkpoint(Callback):
    """``save(snapshot)`` after round 0 of a fresh run, every ``every`` rounds and after the last
    round ``rounds`` (``every=0``: round 0 and the last only), or the round a run stops on with
    :data:`FINAL`, once every callback has accepted the round (a round refused is never checkpointed).
    ``save`` is e.g. a :class:`~.checkpoint.Checkpointer`. ``before_save()`` hooks run first (e.g.
    :meth:`MetricsFile.sync`: the history a resume reads back is on disk before the checkpoint that names
    its round)."""

    def __init__(self, save: Callable[[dict], None], every: int = 0, before_save: Sequence[Callable] = ()):
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"checkpoint_every must be an int >= 0, got {every!r}")
        self.save, self.every, self.before_save = save, every, list(before_save)
        self.view: Optional[RunView] = None
        self.final: Optional[int] = None  # the round a FINAL stop ends the run at

    def _write(self, t: int) -> None:
        for hook in self.before_save:
            hook()
        self.save(self.view.snapshot(t))

    def on_start(self, run):
        self.view = run
        if run.fresh:
            self._write(0)

    def final_round(self, t):
        self.final = t

    def commit(self, t, state):
        if (self.every and t % self.every == 0) or t in (self.view.rounds, self.final):
            self._write(t)


class MetricsFile(Callback):
    """Appends every row (round 0 of a fresh run first) to ``path`` (``metrics.jsonl``), one line
    each, flushed; the file is the run's history. ``path=None`` (a process that writes no files)
    does nothing."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self.file = None

    def on_start(self, run):
        if self.path is None or not run.main:
            return
        self.file = open(self.path, "a")
        if run.fresh:
            append_row(self.file, run.initial)

    def after_round(self, t, state, row):
        if self.file is not None:
            append_row(self.file, row)

    def sync(self) -> None:
        """The rows written so far, on disk (a checkpoint is durable; the rows it counts on must be too)."""
        if self.file is not None:
            os.fsync(self.file.fileno())

    def on_end(self):
        if self.file is not None:
            self.file.close()
            self.file = None


class TensorBoard(Callback):
    """Every row to ``events`` (``add(row)``, then ``close()`` when the run ends), e.g.
    :class:`python_algos.experiments.tensorboard.LiveEvents`. Put it after :class:`MetricsFile`:
    its ``close`` reads the metrics file back."""

    def __init__(self, events):
        self.events = events

    def on_start(self, run):
        if run.fresh:
            self.events.add(run.initial)

    def after_round(self, t, state, row):
        if self.events is not None:
            self.events.add(row)

    def on_end(self):
        if self.events is not None:  # once, however often the run's end is signalled
            self.events.close()
            self.events = None


class ShowProgress(Callback):
    """The progress display (:class:`~.progress.Progress`) on the main process: rounds, f+h,
    accuracy, ETA."""

    def __init__(self, desc: str = "", enabled: bool = True, stream=None):
        self.desc, self.enabled, self.stream = desc, enabled, stream
        self.bar: Optional[Progress] = None

    def on_start(self, run):
        if run.main:  # a disabled display still counts the rounds (Progress prints nothing then)
            self.bar = Progress(run.rounds, initial=run.start - 1, desc=self.desc, enabled=self.enabled,
                                stream=self.stream)

    def after_round(self, t, state, row):
        if self.bar is not None:
            self.bar.update(t, row)

    def on_end(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# A run is stopped as diverged when f+h exceeds its value at round 0 by more than this factor times
# max(|f+h at round 0|, 1): "orders of magnitude" above where it started. The max(., 1) keeps an
# objective that starts near 0 (or one that the run drives to near 0) from tripping the rule on
# noise; only growth counts, so an objective that decreases, to any value, never does.
DIVERGENCE_FACTOR = 1e3


def divergence(f0: Optional[float], f: Optional[float], model_finite: bool = True,
               factor: float = DIVERGENCE_FACTOR) -> Optional[str]:
    """Why a round with objective ``f`` (f+h) diverged from a run that started at ``f0``, or None.
    Diverged: the model has NaN/Inf entries, f is NaN/Inf, or f > f0 + factor * max(|f0|, 1)."""
    if not model_finite:
        return "the model has NaN/Inf entries"
    if f is None:
        return None
    if not math.isfinite(f):
        return f"f+h = {f}"
    if f0 is not None and math.isfinite(f0) and f > f0 + factor * max(abs(f0), 1.0):
        return (f"f+h = {f:.6g}, more than {factor:g} x max(|f+h at round 0|, 1) above its value at round 0 "
                f"({f0:.6g})")
    return None


class StopOnDivergence(Callback):
    """Stops the run when :func:`divergence` says a round diverged; ``reason`` then reads
    "round t: ..." with the values. The reference is round 0's f+h (a resumed run: the same
    round 0, from its snapshot)."""

    def __init__(self, factor: float = DIVERGENCE_FACTOR):
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"factor must be a finite number > 0, got {factor!r}")
        self.factor = float(factor)
        self.reason: Optional[str] = None
        self.f0: Optional[float] = None
        self.report: Optional[Callable] = None

    def on_start(self, run):
        self.f0, self.report = run.initial.get("f+h"), run.report

    def after_round(self, t, state, row):
        x = self.report(state)
        why = divergence(self.f0, row.get("f+h"), bool(torch.isfinite(x).all()), self.factor)
        if why is not None:
            self.reason = f"round {t}: {why}"
            return True
        return None


class TimeBudget(Callback):
    """Stops the run after the first round that ends more than ``seconds`` after its rounds started
    (wall clock of this call), unless that is the last round anyway; ``reason`` then says so. The
    round is kept (:data:`FINAL`): committed and checkpointed as the run's last, so a resume continues
    from it with the bits of an uninterrupted run."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        if not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds)
                and seconds > 0):
            raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
        self.seconds, self.clock = float(seconds), clock
        self.t0 = None
        self.last = None  # the run's last round: reaching it is no stop
        self.reason: Optional[str] = None

    def on_start(self, run):
        self.t0, self.last = self.clock(), run.rounds

    def after_round(self, t, state, row):
        spent = self.clock() - self.t0
        if spent > self.seconds and t < self.last:
            self.reason = f"round {t}: the time budget of {self.seconds:g} s is spent ({spent:.1f} s)"
            return FINAL
        return None


def rows_up_to(rows: list, last: int, where: str) -> list:
    """The rows of rounds 0..``last`` of a metrics file (``rows``, as read back), the history a run
    resumed from the checkpoint of round ``last`` continues; rows past it are dropped. Raises
    ValueError naming ``where`` when a round is missing (the file was cut or edited)."""
    kept = [r for r in rows if int(r.get("round", -1)) <= last]
    have = {int(r.get("round", -1)) for r in kept}
    missing = [t for t in range(last + 1) if t not in have]
    if missing or len(kept) != last + 1:
        what = f"lacks round {missing[0]}" if missing else "holds a round twice"
        raise ValueError(f"{where} {what} of the rounds 0..{last} that the checkpoint of round {last} continues "
                         f"(the file was cut or edited): restore it from a copy, or start the run again")
    return kept
