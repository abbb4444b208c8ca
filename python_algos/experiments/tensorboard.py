"""TensorBoard events of run folders (``--tensorboard``; needs ``pip install tensorboard``).

    with live_events():                      # what --tensorboard does around a command
        run_experiment(cfg, "results/my-run")   # -> results/my-run/tensorboard/events.out.tfevents.*
    write_events("results/my-run")          # or afterwards, from metrics.jsonl
    tensorboard --logdir results/my-sweep   # every run (seed, grid point) is one TensorBoard run

Every numeric metric of every round goes under its own tag (step = round), e.g. ``objective/f+h``,
``objective/h`` (the regularizer's value), ``model/sparsity`` (the fraction of exact zeros in the
model), ``stationarity/grad_map_sq``, ``accuracy/test_acc``, ``time/elapsed``: :func:`_scalars` is the
one mapping from a metrics row to scalars, used for the live events and for :func:`write_events`.

Live: inside :func:`live_events` every run that :func:`~.run.execute_run` starts writes its events
while it runs: each row appended to ``metrics.jsonl`` is written and flushed at once, so a TensorBoard
watching the folder shows the curves growing. The switch is the environment variable ``LIVE_ENV``,
so that it reaches the worker processes a sweep spawns. A run starts a new events file with the rows
``metrics.jsonl`` holds as the run leaves it (a resume: the rows up to its checkpoint; the rows past
it are dropped there and here), whose first record is TensorBoard's restart mark at step 0
(``SessionLog.START``, what ``SummaryWriter(purge_step=0)`` writes): TensorBoard drops every point
of the folder's earlier files, so each round shows once, also in a TensorBoard already open. Earlier
files are never deleted: TensorBoard's reader stops following a folder whose current file was
deleted. When the run ends (completed, diverged, interrupted or failed), :func:`write_events` makes
the events equal ``metrics.jsonl`` (a Ctrl-C between the two files' writes cannot leave them apart).
A SIGKILL leaves at most the row being written missing; the next resume or ``write_events`` redoes
it. ``run --flower`` computes its metrics after the deployment ends, so its events are written then.

:func:`write_events` is idempotent: a folder that already shows exactly these scalars is left alone,
so calling it again after a live run (the sweep and seeds do, for the runs they keep) costs a read.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from typing import Iterator, List, Tuple

import numpy as np

from ..runfolder.files import EVENTS_DIR, read_metrics  # EVENTS_DIR: a run folder's events (its format)
from ..runfolder.records import METRICS

__all__ = ["write_events", "check_available", "EVENTS_DIR", "tag_of", "live_events", "live_requested",
           "LiveEvents", "LIVE_ENV"]

LIVE_ENV = "FEDKERNELS_TENSORBOARD"  # "1": runs write their events live (set by live_events)
_GROUPS = {"f": "objective", "h": "objective", "f+h": "objective", "sparsity": "model", "hoyer": "model",
           "nnz": "model", "grad_map_sq": "stationarity", "normal_map_sq": "stationarity", "test_acc": "accuracy",
           "train_acc": "accuracy", "test_loss": "loss", "train_loss": "loss", "elapsed": "time"}


def check_available() -> None:
    """Raise a RuntimeError naming the install command when tensorboard is missing (before any run)."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise RuntimeError("--tensorboard needs the tensorboard package: pip install tensorboard "
                           "(or fedkernels[tensorboard])") from None


def tag_of(key: str) -> str:
    """The TensorBoard tag of metric ``key`` (grouped into sections: objective, model, accuracy, ...)."""
    return f"{_GROUPS.get(key, 'metrics')}/{key}"


def _scalars(row: dict) -> List[Tuple[str, int, float]]:
    """``(tag, step, value)`` of every finite numeric metric of a metrics row (none without an int round)."""
    t = row.get("round")
    if not isinstance(t, int) or isinstance(t, bool):
        return []
    return [(tag_of(k), t, float(v)) for k, v in row.items()
            if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


class _EventsFile:
    """A new events file in ``folder``, named to sort after every file already there (TensorBoard reads
    a folder's files in name order), starting with TensorBoard's restart mark at step 0: it
    supersedes the folder's earlier files, which stay (deleting a file a TensorBoard is reading
    stops that TensorBoard from reading the folder's new files)."""

    def __init__(self, folder: str):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.record_writer import RecordWriter

        os.makedirs(folder, exist_ok=True)
        stamp = int(time.time())
        for name in os.listdir(folder):  # events.out.tfevents.<seconds>.<host>...: a later stamp sorts last
            parts = name.split(".")
            if "tfevents" in name and len(parts) > 3 and parts[3].isdigit() and int(parts[3]) >= stamp:
                stamp = int(parts[3]) + 1
        self.path = os.path.join(folder, f"events.out.tfevents.{stamp:010d}.{socket.gethostname()}.{os.getpid()}")
        self._file = RecordWriter(open(self.path, "wb"))
        now = time.time()
        self._write(Event(wall_time=now, file_version="brain.Event:2"))
        self._write(Event(wall_time=now, step=0, session_log=SessionLog(status=SessionLog.START)))

    def _write(self, event) -> None:
        self._file.write(event.SerializeToString())

    def add(self, scalars) -> None:
        """Write ``(tag, step, value)`` scalars (float32 summaries, as SummaryWriter.add_scalar) and flush."""
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        now = time.time()
        for tag, t, v in scalars:
            self._write(Event(wall_time=now, step=t, summary=Summary(value=[Summary.Value(tag=tag, simple_value=v)])))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _stored(folder: str) -> List[Tuple[str, int, float]]:
    """The ``(tag, step, value)`` the events in ``folder`` hold, as TensorBoard reads them (restart
    marks applied)."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(folder, size_guidance={SCALARS: 0})  # 0: keep every point (no sampling)
    acc.Reload()
    return sorted((tag, e.step, e.value) for tag in acc.Tags()[SCALARS] for e in acc.Scalars(tag))


def _as_stored(scalars) -> List[Tuple[str, int, float]]:
    """``scalars`` as the events hold them: TensorBoard's scalar summaries are float32 (a float64
    value past its range is held as ±inf, as the writer stores it)."""
    with np.errstate(over="ignore"):
        return sorted((tag, t, float(np.float32(v))) for tag, t, v in scalars)


def write_events(run_dir: str) -> str:
    """Make ``run_dir/tensorboard/`` show exactly the scalars of ``run_dir/metrics.jsonl``; returns the
    events folder. Left alone when it already does; otherwise a new file with every row supersedes
    the earlier ones (see :class:`_EventsFile`)."""
    check_available()
    want = [s for r in read_metrics(run_dir) for s in _scalars(r)]
    out = os.path.join(run_dir, EVENTS_DIR)
    if os.path.isdir(out) and _stored(out) == _as_stored(want):
        return out
    f = _EventsFile(out)
    try:
        f.add(want)
    finally:
        f.close()
    return out


def live_requested() -> bool:
    """Whether runs started now write their events live (inside :func:`live_events`)."""
    return os.environ.get(LIVE_ENV) == "1"


@contextlib.contextmanager
def live_events() -> Iterator[None]:
    """Every run started inside (in this process, or in processes started from it, e.g. a sweep's
    workers) writes its TensorBoard events live. Checks that tensorboard is installed first."""
    check_available()
    before = os.environ.get(LIVE_ENV)
    os.environ[LIVE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LIVE_ENV, None)
        else:
            os.environ[LIVE_ENV] = before


class LiveEvents:
    """The events of one run while it runs: opened after the run has set up ``metrics.jsonl`` (its
    rows are written first), then :meth:`add` with every row appended to it, then :meth:`close`."""

    def __init__(self, run_dir: str):
        check_available()
        self.run_dir = run_dir
        rows = read_metrics(run_dir) if os.path.isfile(os.path.join(run_dir, METRICS)) else []
        self._file = _EventsFile(os.path.join(run_dir, EVENTS_DIR))
        self._file.add([s for r in rows for s in _scalars(r)])

    def add(self, row: dict) -> None:
        """Write one metrics row (flushed: a TensorBoard reading the folder sees it now)."""
        self._file.add(_scalars(row))

    def close(self) -> None:
        """Close the file, then make the folder equal ``metrics.jsonl`` (a no-op when it already is)."""
        self._file.close()
        write_events(self.run_dir)
