"""A client node's own data, kept in its state folder so that only its first message builds it.

Flower starts a process for every message a node handles, so a node whose data come out of a
computation over the whole federation (a generator seeded for the whole data set, then a partition)
would redo it for every round. :func:`cached_client_data` does it once: the node's rows and a few
facts about them are written to ``<state-dir>/data-cache/client-<i>.pt`` (atomically: a kill leaves
the old file or the new one) together with the key they were built for (the settings that decide
them) and a SHA-256 of their bytes. The file is the client's training rows: readable by its owner only
(0600, in a 0700 folder). A later message reads the file only if its key equals the one
asked for and its bytes still hash to the recorded digest; a file of other settings, an unreadable
or damaged one is rebuilt and replaced, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Optional

import torch

from ..runfolder import checkpoint as ckpt

__all__ = ["ClientDataCache", "cached_client_data", "CACHE_DIR", "CACHE_FORMAT"]

CACHE_DIR = "data-cache"
CACHE_FORMAT = "python_algos.node-data/1"


def _key_text(key: dict) -> str:
    return json.dumps(key, sort_keys=True, default=repr)


def _digest(tensors: dict) -> str:
    """SHA-256 of the tensors' names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"")
    return h.hexdigest()


class ClientDataCache:
    """The cache file of client ``client_id`` in ``state_dir`` (see the module docstring)."""

    def __init__(self, state_dir: str, client_id: int):
        self.path = os.path.join(os.fspath(state_dir), CACHE_DIR, f"client-{int(client_id)}.pt")

    def load(self, key: dict) -> Optional[dict]:
        """``{"tensors": {...}, "info": {...}}`` cached for ``key``, or None: no file, a file of
        another key, or one that cannot be read or whose bytes do not match its digest."""
        try:  # any failure below is a file not to trust (torch reports a damaged one as many types)
            blob = torch.load(self.path, map_location="cpu", weights_only=True)
            tensors = blob["tensors"]
            if (blob["format"], blob["key"], blob["digest"]) != (CACHE_FORMAT, _key_text(key), _digest(tensors)):
                return None
            return {"tensors": tensors, "info": json.loads(blob["info"])}
        except Exception:  # noqa: BLE001 - no file, a damaged or an edited one: rebuilt
            return None

    def save(self, key: dict, tensors: dict, info: dict) -> None:
        """Write the entry of ``key`` (replacing any other), atomically."""
        tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        ckpt.atomic_save({"format": CACHE_FORMAT, "key": _key_text(key), "digest": _digest(tensors),
                          "info": json.dumps(info), "tensors": tensors}, self.path, private=True)


def cached_client_data(state_dir: Optional[str], client_id: int, key: dict, build: Callable[[], dict]) -> dict:
    """``build()`` (``{"tensors": {name: tensor}, "info": JSON-able dict}``) once per ``key``: read
    from client ``client_id``'s cache file in ``state_dir`` when it holds ``key``'s entry, else
    built and written there. Without a ``state_dir`` it is built every time."""
    if not state_dir:
        return build()
    cache = ClientDataCache(state_dir, client_id)
    got = cache.load(key)
    if got is None:
        got = build()
        cache.save(key, got["tensors"], got["info"])
    return got
