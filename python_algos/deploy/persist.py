"""What a deployment keeps on disk so that a run stopped by a failed node continues exactly.

Two parties, two kinds of file, each written atomically (a kill leaves the old file or the new one):

* **The server's checkpoint** (:func:`save_server` / :func:`load_server`): after every
  ``checkpoint_every``-th round, the server's fields of the State, its generator, the participation
  generator, the downloads that participants still have to ``client_receive``, the round in which
  each client last took part, the per-round records and the caller's ``extra`` (e.g. the recorded
  models). No client data and no client state: those never leave the nodes.
* **Each node's own state** (:class:`NodeStore`, enabled by the node config ``state-dir``): after
  each round it takes part in, its rows of the client fields, its copies, its generators and its
  last upload, one file per round under ``state-dir/<run key>/client-<i>/``.

On resume the server tells every node the round in which it last took part before the checkpoint,
and the node restores that round's file; the rounds after the checkpoint are thrown away on both
sides. A node keeps, besides the files of the rounds after the server's last checkpoint, the newest
file at or before it (``prune``), which is all a resume can ask for.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Optional

import torch

from ..runfolder import checkpoint as ckpt

__all__ = ["save_server", "load_server", "RoundFiles", "NodeStore", "SERVER_FORMAT"]

SERVER_FORMAT = "python_algos.flower-server/1"


def save_server(path: str, snapshot: dict) -> None:
    """Write the server's snapshot (see :func:`~python_algos.deploy.flower.run_server`) atomically."""
    ckpt.atomic_save({"format": SERVER_FORMAT, "snapshot": ckpt.encode(snapshot)}, path)


def load_server(path: str) -> dict:
    """Read a server checkpoint written by :func:`save_server` (``torch.load(weights_only=True)``:
    loading runs no code from the file). Raises CheckpointError if it is damaged or something else."""
    path = os.fspath(path)
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - torch reports damage as many types
        raise ckpt.CheckpointError(f"{path} is damaged and cannot be read ({type(e).__name__}): restore it from a "
                                   f"copy, or start the run again") from None
    if not isinstance(blob, dict) or blob.get("format") != SERVER_FORMAT:
        raise ckpt.CheckpointError(f"{path} is not a Flower server checkpoint of python_algos ({SERVER_FORMAT})")
    return ckpt.decode(blob["snapshot"])


_ROUND_FILE = re.compile(r"^round-(\d+)\.pt$")


class RoundFiles:
    """A folder of one file per round, ``round-<t>.pt``, each written atomically: a node's saved
    states (:class:`NodeStore`), the server's recorded models of ``run --flower``."""

    def __init__(self, folder: str):
        self.dir = os.fspath(folder)

    def path(self, t: int) -> str:
        return os.path.join(self.dir, f"round-{int(t)}.pt")

    def rounds(self) -> list:
        """The rounds saved, ascending."""
        names = (os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(self.dir), "round-*.pt")))
        return sorted(int(m.group(1)) for m in map(_ROUND_FILE.match, names) if m)

    def save(self, t: int, tensors: dict) -> None:
        ckpt.atomic_save(dict(tensors), self.path(t))

    def load(self, t: int) -> dict:
        return torch.load(self.path(t), map_location="cpu", weights_only=True)

    def drop_after(self, t: int) -> None:
        """Forget the rounds after ``t`` (on resume from the server's checkpoint of round ``t``)."""
        for r in self.rounds():
            if r > t:
                os.remove(self.path(r))


class NodeStore(RoundFiles):
    """One client's saved states in ``state_dir/<run_key>/client-<client_id>/round-<t>.pt``."""

    def __init__(self, state_dir: str, run_key: str, client_id: int):
        if not re.fullmatch(r"[0-9a-f]{8,64}", str(run_key)):
            raise ValueError(f"run key {run_key!r} is not a hex string (the server sends it)")
        super().__init__(os.path.join(os.fspath(state_dir), str(run_key), f"client-{int(client_id)}"))

    def prune(self, committed: Optional[int]) -> None:
        """Drop what no resume can ask for: files older than the newest one at or before the server's
        last checkpoint round ``committed`` (None: the server writes none, keep only the newest)."""
        saved = self.rounds()
        upto = [t for t in saved if committed is not None and t <= committed]
        keep_from = upto[-1] if upto else (saved[-1] if committed is None and saved else None)
        for t in saved:
            if keep_from is not None and t < keep_from:
                os.remove(self.path(t))
