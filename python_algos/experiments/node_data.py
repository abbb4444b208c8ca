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

import numpy as np
import torch

from ..data.folder import PREFIX, read_client
from ..data.standardize import client_moments, client_scales, scaled
from ..deploy.data_cache import ClientDataCache, cached_client_data
from .build import prepare_data
from .config import SETTINGS, Config

__all__ = ["DataShape", "data_key", "node_rows", "folder_moments", "keep_folder_rows", "DATA_SETTINGS", "KEY_VERSION"]

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


def _own_file(cfg: Config, client_id: int, features: Optional[tuple]) -> tuple:
    """``(X, y, X_test, y_test)`` of client ``client_id``'s own file(s) (:func:`.read_client`)."""
    seed = cfg.seed if cfg.data_seed is None else cfg.data_seed  # as prepare_data reads the folder
    return read_client(cfg.dataset[len(PREFIX):], client_id, **cfg.data_opts, seed=seed,
                       test_fraction=cfg.test_fraction, features=features)


def folder_moments(cfg: Config, client_id: int, features: tuple) -> tuple:
    """What a node shares of its own file: ``(n, mean, M2, label values)`` of its training rows (the
    label values of its test rows too: one process maps the labels of every file to classes)."""
    X, y, _, yt = _own_file(cfg, client_id, features)
    n, mean, m2 = client_moments(torch.from_numpy(X))
    return n, mean, m2, torch.from_numpy(np.unique(np.concatenate([y] + ([] if yt is None else [yt]))))


def keep_folder_rows(cfg: Config, client_id: int, state_dir: Optional[str], vectors: dict, info: dict) -> None:
    """Client ``client_id``'s training rows from its own file, standardised as ``cfg.standardize`` says
    (``global``: the server's pooled ``vectors["mean"]``, ``["std"]``), labels mapped to the server's
    ``vectors["classes"]``, written to the node's cache for :func:`node_rows`."""
    if not state_dir:
        raise ValueError(f"client {client_id}: folder data under --flower need the node's state-dir (its rows are "
                         f"built once, from the server's statistics, and kept there)")
    X, y, _, _ = _own_file(cfg, client_id, tuple(info["in_shape"]))
    X = torch.from_numpy(X)
    mode = cfg.standardize or "global"  # the folder's default (data.federate)
    X = X if mode == "none" else scaled(X, vectors["mean"], vectors["std"]) if mode == "global" else \
        scaled(X, *client_scales([X], "local")[0])
    classes = vectors.get("classes")
    y = torch.from_numpy(y) if classes is None else torch.from_numpy(np.searchsorted(classes.numpy(), y)).long()
    ClientDataCache(state_dir, client_id).save(data_key(cfg, client_id), {"X": X, "y": y}, info)


def _no_rows(cfg: Config, client_id: int):
    raise ValueError(f"client {client_id}: its rows of folder data were not built: the server's data exchange "
                     f"(query.datascale) did not reach this node, or the node has no state-dir")


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
    build = _no_rows if cfg.dataset.startswith(PREFIX) else _build  # a folder node never reads the others' files
    got = cached_client_data(state_dir, client_id, data_key(cfg, client_id), lambda: build(cfg, client_id))
    info = got["info"]
    shape = DataShape(info["name"], info["task"], tuple(info["in_shape"]), int(info["outputs"]), info["source"])
    return (got["tensors"]["X"], got["tensors"]["y"]), shape
