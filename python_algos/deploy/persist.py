"""What a deployment keeps on disk so that a run stopped by a failed node continues exactly.

Two parties, two kinds of file, each written atomically (a kill leaves the old file or the new one):

* **The server's checkpoint** (:func:`save_server` / :func:`load_server`): when the engine's
  ``Checkpoint`` callback says (round 0, every ``checkpoint_every``-th round and the last), the
  server's fields of the State, its generator, the participation generator, round 0's row, the
  downloads that participants still have to ``client_receive``, the round in which each client last
  took part and the caller's ``extra`` (e.g. the recorded models): the state of one round, never
  the history. No client data and no client state: those never leave the nodes.
* **The server's round records** (:func:`history_path`, beside the checkpoint): one JSON line per
  round (round 0 first), appended as the rounds end by the engine's ``MetricsFile`` callback, as
  ``metrics.jsonl`` is beside a one-process checkpoint; :func:`load_server` reads the rounds up to
  the checkpoint's back into the snapshot's ``metrics`` (rewriting every record into every checkpoint
  would cost O(T²/c) bytes over T rounds checkpointed every c).
* **Each node's own state** (:class:`NodeStore`, enabled by the node config ``state-dir``): after
  each round it takes part in, its rows of the client fields, its copies, its generators and its
  last upload, one file per round under ``state-dir/<run key>/client-<i>/``.

On resume the server tells every node the round in which it last took part before the checkpoint,
and the node restores that round's file; the rounds after the checkpoint are thrown away on both
sides. A node keeps, besides the files of the rounds after the server's last checkpoint, the newest
file at or before it (``prune``), which is all a resume can ask for.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
from typing import Optional

import torch

from ..runfolder import checkpoint as ckpt
from ..runfolder.callbacks import rows_up_to

__all__ = ["save_server", "load_server", "history_path", "NodeStore", "SERVER_FORMAT"]

# one format: a checkpoint of another (an older version's, whose setup and records lay elsewhere) is refused
# by load_server, the one place a Flower resume reads it
SERVER_FORMAT = "python_algos.flower-server/3"  # 3: extra beside the snapshot, as in checkpoint.save


def history_path(path: str) -> str:
    """The round records of the server whose checkpoint is ``path`` (JSON lines, appended)."""
    return f"{os.fspath(path)}.rounds.jsonl"


def _records_up_to(path: str, last: int) -> list:
    """Rounds 1..``last`` of the records of checkpoint ``path`` (round 0's row is the snapshot's
    ``initial``), by the rule of a one-process resume (:func:`~python_algos.runfolder.callbacks.rows_up_to`:
    rows past ``last`` dropped, a missing or repeated round refused)."""
    rows = []
    with contextlib.suppress(FileNotFoundError), open(history_path(path)) as f:
        for line in f:
            with contextlib.suppress(json.JSONDecodeError):  # a torn last line
                rows.append(json.loads(line))
    try:
        return rows_up_to(rows, last, history_path(path))[1:]
    except ValueError as e:  # the checkpoint cannot be continued: refused as a damaged one is
        raise ckpt.CheckpointError(str(e)) from None


def save_server(path: str, snapshot: dict) -> None:
    """Write the server's snapshot (see :func:`~python_algos.deploy.flower.run_server`) as a one-process
    checkpoint is written (:func:`~python_algos.runfolder.checkpoint.save`: atomically, without its
    ``metrics``, which :func:`history_path` holds), in its own format, its ``extra`` beside it."""
    ckpt.save(path, {k: v for k, v in snapshot.items() if k != "extra"}, snapshot.get("extra"), SERVER_FORMAT)


def load_server(path: str) -> dict:
    """Read a server checkpoint written by :func:`save_server` (:func:`~python_algos.runfolder.checkpoint.load`:
    no code run from the file; CheckpointError if it is damaged or something else), with its records."""
    snap = ckpt.load(path, fmt=SERVER_FORMAT)
    snap["metrics"] = _records_up_to(path, int(snap["round"]))  # the records lie beside the checkpoint
    return snap


_ROUND_FILE = re.compile(r"^round-(\d+)\.pt$")


class NodeStore:
    """One client's saved states, one file per round it took part in, each written atomically:
    ``state_dir/<run_key>/client-<client_id>/round-<t>.pt``."""

    def __init__(self, state_dir: str, run_key: str, client_id: int):
        if not re.fullmatch(r"[0-9a-f]{8,64}", str(run_key)):
            raise ValueError(f"run key {run_key!r} is not a hex string (the server sends it)")
        self.dir = os.path.join(os.fspath(state_dir), str(run_key), f"client-{int(client_id)}")

    def path(self, t: int) -> str:
        return os.path.join(self.dir, f"round-{int(t)}.pt")

    def rounds(self) -> list:
        """The rounds saved, ascending."""
        names = (os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(self.dir), "round-*.pt")))
        return sorted(int(m.group(1)) for m in map(_ROUND_FILE.match, names) if m)

    def save(self, t: int, tensors: dict) -> None:
        ckpt.atomic_save(dict(tensors), self.path(t), private=True)  # state the client's data made: 0600, 0700

    def load(self, t: int) -> dict:
        return torch.load(self.path(t), map_location="cpu", weights_only=True)

    def drop_after(self, t: int) -> None:
        """Forget the rounds after ``t`` (on resume from the server's checkpoint of round ``t``)."""
        for r in self.rounds():
            if r > t:
                os.remove(self.path(r))

    def prune(self, committed: Optional[int]) -> None:
        """Drop what no resume can ask for: files older than the newest one at or before the server's
        last checkpoint round ``committed`` (None: the server writes none, keep only the newest)."""
        saved = self.rounds()
        upto = [t for t in saved if committed is not None and t <= committed]
        keep_from = upto[-1] if upto else (saved[-1] if committed is None and saved else None)
        for t in saved:
            if keep_from is not None and t < keep_from:
                os.remove(self.path(t))
