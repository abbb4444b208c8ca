"""Atomic checkpoints of a :func:`~python_algos.simulate.simulate` run, and their restoration.

    from python_algos import simulate
    from python_algos.runfolder import checkpoint
    from python_algos.runfolder.callbacks import Checkpoint
    hist = simulate(..., callbacks=[Checkpoint(checkpoint.Checkpointer("run/checkpoint.pt"), 10)])
    snap = checkpoint.load("run/checkpoint.pt")               # after a crash / kill
    hist = simulate(..., resume=snap)                           # continues bit-identically

A checkpoint holds the run state that ``simulate`` hands to its ``Checkpoint`` callback: the
algorithm state (a NamedTuple of tensors: models, control variates, duals, trackers, counters),
the server generator, every client generator (minibatch sampler positions), torch's global RNG,
module buffers, round 0's metrics and the elapsed time: the state of one round, O(N·d), not the
history of the run (the metrics rows live in the run folder's append-only ``metrics.jsonl``). It
is written with ``torch.save`` to a
temporary file in the same folder, flushed to disk, then ``os.replace``-d over the previous one,
so a kill at any moment leaves either the old or the new checkpoint, never a torn one. Ctrl-C,
SIGTERM and SIGHUP during the write are held until the write is done: a KeyboardInterrupt raised inside ``torch.save``
would leave its zip writer half-finished, and torch then reports that as an unrelated error.

Files are loaded with ``torch.load(weights_only=True)``: NamedTuple states are stored as plain
dicts tagged with their class and rebuilt from already-imported modules, so loading a file runs
no code from it. Every algorithm's state class is imported by then: importing this module runs
``python_algos/__init__.py`` first, which imports every algorithm module.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Optional

import torch

from .files import write_atomically

__all__ = ["save", "load", "atomic_save", "encode", "decode", "Checkpointer", "Diverged", "CheckpointError", "FORMAT",
           "nonfinite_entry"]

FORMAT = 1
_NT = "__namedtuple__"


class Diverged(RuntimeError):
    """The run produced NaN / Inf values; the last good checkpoint is kept."""


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read (damaged, truncated, or not a checkpoint)."""


def encode(obj: Any) -> Any:
    """NamedTuples -> tagged dicts (recursively), so the result loads with ``weights_only=True``."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        cls = type(obj)
        return {_NT: f"{cls.__module__}:{cls.__qualname__}", "fields": {k: encode(v) for k, v in obj._asdict().items()}}
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(encode(v) for v in obj)
    return obj


def decode(obj: Any) -> Any:
    """Inverse of :func:`encode`. NamedTuple classes are looked up in already-imported modules."""
    if isinstance(obj, dict):
        if _NT in obj:
            mod, _, qual = obj[_NT].partition(":")
            module = sys.modules.get(mod)
            cls = module
            for part in qual.split("."):
                cls = getattr(cls, part, None)
            if module is None or not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")):
                raise ValueError(f"checkpoint names state class {obj[_NT]!r}, which is not an imported NamedTuple "
                                 f"(import the algorithm's module first)")
            return cls(**{k: decode(v) for k, v in obj["fields"].items()})
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(decode(v) for v in obj)
    return obj


def atomic_save(obj: Any, path: str, private: bool = False) -> None:
    """``torch.save(obj, path)`` atomically (:func:`~.files.write_atomically`); ``private``: the file is
    created readable by its owner only (0600), a missing folder 0700."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700 if private else 0o777, exist_ok=True)
    write_atomically(path, lambda f: torch.save(obj, f), private=private, point="checkpoint write")


def save(path: str, snapshot: dict, extra: Optional[dict] = None, fmt=FORMAT) -> None:
    """Write a ``simulate`` snapshot (or one of format ``fmt``) plus ``extra`` user data atomically to ``path``.

    The file holds the state of the snapshot's round, O(N·d), never the run's history: the
    snapshot's ``metrics`` (the rows so far, which grow with the round) are left out. A run folder
    keeps them in ``metrics.jsonl``, appended to once per round and read back on resume; writing
    them into every checkpoint would cost O(T²/c) bytes over a run of T rounds checkpointed every c."""
    kept = {k: v for k, v in snapshot.items() if k != "metrics"}
    atomic_save({"format": fmt, "snapshot": encode(kept), "extra": encode(extra or {})}, path)


def load(path: str, map_location="cpu", fmt=FORMAT) -> dict:
    """Read a checkpoint written by :func:`save`; returns the snapshot (``extra`` under key ``"extra"``)."""
    path = os.fspath(path)
    try:
        blob = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001  (torch reports damage as many types; its text advises unsafe loading)
        size = os.path.getsize(path) if os.path.exists(path) else 0
        raise CheckpointError(
            f"{path} is damaged and cannot be read ({type(e).__name__}; {size} bytes). Checkpoints are written "
            f"atomically, so this comes from outside the run (a disk error, a copy cut short, an edit): restore "
            f"the file from a copy, or start the run again in a new folder") from None
    if not isinstance(blob, dict) or blob.get("format") != fmt or "snapshot" not in blob:
        raise CheckpointError(f"{path} is another file, or an older python_algos version's checkpoint (this one reads "
                              f"format {fmt}; an older run still plots): restore the run's own from a copy")
    snap = decode(blob["snapshot"])
    snap["extra"] = decode(blob.get("extra", {}))
    return snap


def saved_round(path: str) -> Optional[int]:
    """The round of the checkpoint at ``path`` as it is on disk (None: no file), without reading its
    tensors (memory-mapped). A run stopped by Ctrl-C asks the file: the interrupt may land between
    the atomic rename of a new checkpoint and the bookkeeping that follows it."""
    if not os.path.isfile(path):
        return None
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(blob["snapshot"]["round"])
    except Exception:  # noqa: BLE001 - damaged or foreign: reported by load() when it is resumed
        return None


def nonfinite_entry(obj) -> Optional[str]:
    """Name of the first non-finite tensor field in a (nested) state, or None."""
    if isinstance(obj, torch.Tensor):
        return None if (not obj.is_floating_point() or bool(torch.isfinite(obj).all())) else "tensor"
    if isinstance(obj, float):
        return None if math.isfinite(obj) else "value"
    named = isinstance(obj, tuple) and hasattr(obj, "_fields")  # a NamedTuple: the field's name
    for k, v in obj._asdict().items() if named else enumerate(obj) if isinstance(obj, (list, tuple)) else ():
        if bad := nonfinite_entry(v):
            return k if named else bad
    return None


class Checkpointer:
    """A ``Checkpoint(save)`` callback's ``save``: writes every snapshot it receives to ``path``.

    A snapshot whose algorithm state holds NaN/Inf is not written: :class:`Diverged` is raised
    instead, so the file keeps the last good state. ``last_round`` is the round of the last checkpoint
    written.
    """

    def __init__(self, path: str, extra: Optional[dict] = None):
        self.path = os.fspath(path)
        self.extra = extra
        self.last_round: Optional[int] = None

    def __call__(self, snapshot: dict) -> None:
        if bad := nonfinite_entry(snapshot["state"]):
            raise Diverged(f"round {snapshot['round']}: the algorithm state field {bad!r} holds NaN/Inf")
        save(self.path, snapshot, self.extra)
        self.last_round = int(snapshot["round"])
