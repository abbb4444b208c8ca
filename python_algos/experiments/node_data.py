"""One node's rows of a command-line run's data, for the ClientApps of ``run --flower``.

The command line's data come from a computation over the whole data set (a seeded generator or the
files, a seeded train/test split, then the partition), so client i's rows cannot be made without
the others. A node does that once, at its first message, and keeps its own rows in its state folder
(:func:`~python_algos.deploy.data_cache.cached_client_data`), keyed by every setting that decides
them (:func:`data_key`): the following messages, each in a process of its own, read only those rows.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..deploy.data_cache import cached_client_data
from .build import prepare_data
from .config import SETTINGS, Config

__all__ = ["DataShape", "data_key", "node_rows", "DATA_SETTINGS", "KEY_VERSION"]

# the settings prepare_data reads (every "data" setting), the seeds and the dtype
DATA_SETTINGS = tuple(name for name, s in SETTINGS.items() if s.group == "data") + ("seed", "data_seed", "dtype")
KEY_VERSION = 1  # raised when the data a key stands for are built differently


@dataclasses.dataclass(frozen=True)
class DataShape:
    """What the model builder and the loss read from a data set (``build_model``, ``loss_function``)."""

    name: str
    task: str
    in_shape: tuple
    outputs: int
    source: str


def data_key(cfg: Config, client_id: int) -> dict:
    """The settings that decide client ``client_id``'s rows (a cached copy of other settings is rebuilt)."""
    return {"version": KEY_VERSION, "client": int(client_id), **{k: getattr(cfg, k) for k in DATA_SETTINGS}}


def _build(cfg: Config, client_id: int) -> dict:
    fed = prepare_data(cfg)
    if not 0 <= client_id < len(fed.clients):
        raise ValueError(f"client {client_id}: the run's data have {len(fed.clients)} clients "
                         f"(0..{len(fed.clients) - 1})")
    X, y = fed.clients[client_id]
    ds = fed.dataset
    return {"tensors": {"X": X, "y": y},
            "info": {"name": ds.name, "task": ds.task, "in_shape": list(ds.in_shape), "outputs": int(ds.outputs),
                     "source": ds.source}}


def node_rows(cfg: Config, client_id: int, state_dir: Optional[str]) -> tuple:
    """``((X, y), DataShape)`` of client ``client_id``: read from the node's cache in ``state_dir``
    when it holds these settings' rows, else built from the whole data set (and cached there)."""
    got = cached_client_data(state_dir, client_id, data_key(cfg, client_id), lambda: _build(cfg, client_id))
    info = got["info"]
    shape = DataShape(info["name"], info["task"], tuple(info["in_shape"]), int(info["outputs"]), info["source"])
    return (got["tensors"]["X"], got["tensors"]["y"]), shape
