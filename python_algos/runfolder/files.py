"""The files of a run folder and how they are written: every file is replaced atomically (a temp file
beside it, fsync, rename) except ``metrics.jsonl``, which is appended to one row at a time and read
back skipping a torn last line. The table of files is in :mod:`python_algos.runfolder`.

This module knows the format only; what goes into the files (a configuration, a run, a comparison)
is decided by the layers above (:mod:`python_algos.experiments`, :meth:`History.save
<python_algos.simulate.History.save>`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import math
import os
import shutil
import threading
from typing import Optional, Sequence

import numpy as np
import torch

from . import faults
from .signals import stop_signals_held

__all__ = ["RUN_FILES", "RUN_DIRS", "EVENTS_DIR", "STATE_DIR", "RunFolderError", "RunExistsError", "read_metrics",
           "parse_json", "read_json_object", "holds_run", "as_json", "write_json", "write_jsonl", "create_json",
           "write_text_atomically", "write_atomically", "append_row", "remove_leftovers", "exchange_paths"]

FLOWER_MARK = "flower.json"  # a run through a Flower deployment (run --flower): its engine and node-state key
FLOWER_CHECKPOINT = "flower-checkpoint.pt"  # its server's checkpoint (no client state: the nodes keep theirs)
FLOWER_RECORDS = FLOWER_CHECKPOINT + ".rounds.jsonl"  # its server's round records (deploy.persist.history_path)
FLOWER_DIRS = ("flower-nodes", "flower-points")  # the nodes' own states; the server's recorded models
RUN_FILES = ("config.json", "partition.json", "metrics.jsonl", "checkpoint.pt", "summary.json", "model.pt",
             FLOWER_MARK, FLOWER_CHECKPOINT, FLOWER_RECORDS)
EVENTS_DIR = "tensorboard"  # --tensorboard: the run's TensorBoard events (experiments/tensorboard.py)
CHECKPOINT_SHARDS = "checkpoint.pt.shards"  # a checkpoint written by several processes: one file per rank
RUN_MARKS = ("config.json", "metrics.jsonl", "checkpoint.pt", "summary.json")  # any one: the folder holds a run
STATE_DIR = "state"  # --state disk|auto: the client rows' files and the checkpoints' row log (clients/state_log.py)
RUN_DIRS = (EVENTS_DIR, CHECKPOINT_SHARDS, STATE_DIR, *FLOWER_DIRS)  # the folders a run writes inside its folder


class RunFolderError(ValueError):
    """A run folder that cannot be started, resumed or replaced as asked; nothing in it was changed."""


class RunExistsError(RunFolderError, FileExistsError):
    """The target folder already holds a run (or a comparison) that this call must not replace.

    Both a :class:`RunFolderError` (a ``ValueError``, as every refusal of the command line) and a
    ``FileExistsError`` (as ``History.save`` has always raised), so either ``except`` catches it."""


def _clean(v):
    """JSON-safe: non-finite floats -> None, tensors / numpy scalars -> Python numbers."""
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return v if math.isfinite(v) else None
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return _clean(v.item())
    return v


def write_atomically(path: str, write, *, private: bool = False, exclusive: bool = False,
                     point: Optional[str] = "file write") -> None:
    """``write(f)`` (a binary file) into a temp file beside ``path``, fsync, rename over ``path``, stop
    signals held (a KeyboardInterrupt inside ``torch.save`` leaves a half-written zip that torch reports as
    an unrelated error): a kill leaves the old file or the new one (and at worst a ``*.tmp-*`` file, removed
    by the next resume). ``private``: 0600. ``exclusive``: linked into place instead (``link(2)`` fails on an
    existing name: of several writers one succeeds, the others raise ``FileExistsError``); without hard
    links an ``O_EXCL`` create decides (a kill mid-write can then tear it). ``point``: its fault point."""
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with stop_signals_held():
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666), "wb") as f:
                write(f)
                f.flush()
                if point:
                    faults.point(point)  # a kill here leaves a torn temp file, never a torn `path`
                os.fsync(f.fileno())
            (_link if exclusive else os.replace)(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
    with contextlib.suppress(OSError):  # make the rename itself durable
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _link(tmp: str, path: str) -> None:
    try:
        os.link(tmp, path)
    except OSError as e:
        if isinstance(e, FileExistsError) or e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
            raise
        with open(tmp, "rb") as src, open(path, "xb") as f:
            shutil.copyfileobj(src, f)
            f.flush()
            os.fsync(f.fileno())


def write_text_atomically(path: str, text: str) -> None:
    write_atomically(path, lambda f: f.write(text.encode()))


def write_json(path: str, obj) -> None:
    write_text_atomically(path, json.dumps(_clean(obj), indent=2) + "\n")


def create_json(path: str, obj) -> None:
    """Write ``path`` only if no file of that name exists (:func:`write_atomically`, ``exclusive``)."""
    text = json.dumps(_clean(obj), indent=2) + "\n"
    write_atomically(path, lambda f: f.write(text.encode()), exclusive=True, point=None)


def write_jsonl(path: str, rows: Sequence[dict]) -> None:
    write_text_atomically(path, "".join(json.dumps(_clean(r)) + "\n" for r in rows))


def append_row(f, row: dict) -> None:
    """Append one metrics line. A kill mid-line leaves a torn last line: :func:`read_metrics` skips it
    and a resume rewrites the file from the checkpoint."""
    line = json.dumps(_clean(row)) + "\n"
    f.write(line[: len(line) // 2])
    f.flush()
    faults.point("metrics append")
    f.write(line[len(line) // 2:])
    f.flush()


def read_metrics(run_dir: str) -> list:
    """The rows of ``run_dir/metrics.jsonl`` (round 0 first); a torn last line is skipped."""
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def parse_json(text: str, path: str):
    """The JSON value in ``text`` read from ``path``; a syntax error is a ``ValueError`` of one line
    naming the file and line (``path, line 3: Expecting value``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}, line {e.lineno}: {e.msg}") from None


def read_json_object(path: str) -> dict:
    """The JSON object in the file ``path`` (every record of a run or group folder is one). Missing:
    ``FileNotFoundError``; not JSON, or not an object: :class:`RunFolderError` naming the file (and
    the line)."""
    with open(path) as f:
        text = f.read()
    try:
        d = parse_json(text, path)
    except ValueError as e:
        raise RunFolderError(str(e)) from None
    if not isinstance(d, dict):
        raise RunFolderError(f"{path}: expected a JSON object")
    return d


def holds_run(out_dir: str) -> bool:
    """Whether ``out_dir`` holds (the start of) a run: one of :data:`RUN_MARKS`."""
    return any(os.path.exists(os.path.join(out_dir, f)) for f in RUN_MARKS)


def remove_leftovers(out_dir: str) -> None:
    """Temp files of writes a kill interrupted."""
    for f in os.listdir(out_dir):
        if ".tmp-" in f:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out_dir, f))


def as_json(v):
    """``v`` as it reads back from a run folder's JSON (non-finite -> None, tuples -> lists, ...):
    what a value recorded in the folder is compared with."""
    return json.loads(json.dumps(_clean(v)))


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
_renameat2 = []  # [libc's renameat2, or None], looked up once


def exchange_paths(a: str, b: str) -> bool:
    """Swap the two existing paths ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``), so
    neither name is ever missing, not even if the process is killed. ``False`` where the system or the
    file system cannot (then nothing happened and the caller swaps with two renames)."""
    if not _renameat2:
        try:
            fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
        except OSError:
            fn = None
        if fn is not None:
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
        _renameat2.append(fn)
    fn = _renameat2[0]
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):  # not supported here
        return False
    raise OSError(err, os.strerror(err), b)
