"""What travels between a Flower server and its client nodes, shared by both sides: named vectors as
Flower ``ArrayRecord`` bytes (float64 stays float64), the settings both sides must share
(:func:`fingerprint`), the message names, and the files a ServerApp leaves (``result.pt``,
``error.txt``). The programs themselves: :mod:`.flower_server`, :mod:`.flower_client`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Callable

import numpy as np
import torch

import fedkernels as fk

from ..algorithms.base import ServerClientAlgorithm
from ..runfolder.checkpoint import atomic_save
from ..runfolder.setup_record import describe_regularizer

__all__ = ["INSTALL", "HELLO", "ROUND", "NODE_KEY", "LAYOUT_KEY", "NodeFailure", "FlowerResult", "encode_vectors",
           "decode_vectors", "payload_bytes", "fingerprint", "save_result", "write_error", "ERROR_FILE",
           "flwr_modules", "check_algorithm", "flat_x0", "new_message", "from_run_config", "resolve_setting"]

INSTALL = 'pip install ".[flower]"  (flwr==1.41.0)'
HELLO, ROUND = "query.hello", "train.round"
NODE_KEY = "python_algos.node"  # context.state record of a client node: its saved tensors
LAYOUT_KEY = "python_algos.node.layout"  # and the layout of its State (nodes.state_layout), a ConfigRecord
ERROR_FILE = "error.txt"  # written by a ServerApp that stopped on an error, beside where result.pt would be


def flwr_modules():
    """The Flower modules, imported on first use (an optional dependency)."""
    try:
        import flwr.app as fapp
        import flwr.clientapp as fclient
        import flwr.serverapp as fserver
    except ImportError as e:
        raise ImportError(f"python_algos.deploy.flower needs Flower: {INSTALL}") from e
    return fapp, fclient, fserver


class NodeFailure(RuntimeError):
    """A client node failed, or did not answer in time: the run stops (resumable from the server's checkpoint)."""


@dataclasses.dataclass
class FlowerResult:
    """What the server's loop returns: the reported model, the server's state, per-round records,
    the client id -> Flower node id map and the run's settings."""

    params: torch.Tensor
    state: object
    metrics: list
    nodes: dict
    setup: dict


@dataclasses.dataclass(frozen=True)
class FromRunConfig:
    """A setting read from the Flower run's ``run_config`` when a message arrives (:func:`from_run_config`)."""

    key: str


def from_run_config(key: str) -> FromRunConfig:
    """A setting of ``client_app`` / ``server_app`` (``seed``, ``batch_size``, ``rounds``, ...) taken from the
    run's ``run_config[key]`` (``[tool.flwr.app.config]`` of the app's pyproject, or ``flwr run
    --run-config "key=value"``) instead of fixed when the app is built: one app, many runs."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"from_run_config: key must be a non-empty string, got {key!r}")
    return FromRunConfig(key)


def resolve_setting(name: str, value, context):
    """``value``, or the run_config entry it names (:func:`from_run_config`): a clear error without it."""
    if not isinstance(value, FromRunConfig):
        return value
    if value.key not in context.run_config:
        raise ValueError(f"{name}=from_run_config({value.key!r}): the run's run_config has no {value.key!r} (it has "
                         f"{sorted(context.run_config) or 'nothing'}); set it in [tool.flwr.app.config] of the app's "
                         f"pyproject.toml or with flwr run --run-config \"{value.key}=...\"")
    return context.run_config[value.key]


def encode_vectors(vectors: dict):
    """Named tensors -> a Flower ``ArrayRecord`` (numpy arrays, exact bytes: float64 stays float64).
    A contiguous CPU tensor is handed over as a numpy view: Flower's serialization is its only copy."""
    fapp, _, _ = flwr_modules()
    return fapp.ArrayRecord({k: fapp.Array(np.ascontiguousarray(v.detach().cpu().numpy()))
                             for k, v in vectors.items()})


def decode_vectors(record) -> dict:
    """An ``ArrayRecord`` -> named writable tensors. Flower's deserialization already gives each
    array a buffer of its own, which the tensor shares (``torch.from_numpy``); an array that is not
    writable is copied once."""
    out = {}
    for k, a in record.items():
        arr = a.numpy()
        out[k] = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
    return out


def payload_bytes(record) -> int:
    """Bytes of a record's arrays as serialized (the array data, each with its small .npy header)."""
    return sum(len(a.data) for a in record.values())


def fingerprint(alg, reg, seed, batch_size, num_clients, x0) -> dict:
    """The settings server and nodes must share, compared at the handshake (h exactly: its class and
    parameters at full precision, not ``repr``'s 6 digits)."""
    return {"algorithm": alg.name, "hparams": json.dumps(alg.hparams(), sort_keys=True, default=repr),
            "regularizer": describe_regularizer(reg), "seed": int(seed), "batch_size": batch_size,
            "num_clients": int(num_clients),
            "dim": int(x0.numel()), "dtype": str(x0.dtype).replace("torch.", ""),
            "x0_sha256": hashlib.sha256(x0.detach().cpu().contiguous().numpy().tobytes()).hexdigest()}


def check_algorithm(algorithm) -> None:
    if not isinstance(algorithm, ServerClientAlgorithm):
        raise TypeError(f"algorithm must be a server–client python_algos algorithm (a ServerClientAlgorithm), got "
                        f"{type(algorithm).__name__}" + (": DEPOSITUM is peer-to-peer, it has no server to deploy"
                                                          if getattr(algorithm, "name", "") == "DEPOSITUM" else ""))


def flat_x0(model_fn: Callable) -> tuple:
    model = model_fn()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model_fn must return an nn.Module, got {type(model).__name__}")
    flat = fk.FlatParams(model)
    return model, flat.params.detach().clone()


def new_message(content, node_id: int, kind: str, t: int):
    fapp, _, _ = flwr_modules()
    return fapp.Message(content, int(node_id), kind, group_id=str(t))


def write_error(folder: str, error: BaseException) -> None:
    """Leave the ServerApp's error in ``folder/error.txt`` (what :class:`~.local.LocalDeployment`
    reports; Flower's own log buries it in a traceback)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, ERROR_FILE), "w") as f:
        f.write(f"{type(error).__name__}: {error}\n")


def save_result(result: FlowerResult, folder: str) -> str:
    """Write ``folder/result.pt`` (model, per-round records, node map, setup) atomically: a reader sees
    the whole file or none (the ServerApp of a deployment hands its result over this way)."""
    path = os.path.join(folder, "result.pt")
    atomic_save({"params": result.params, "metrics": result.metrics, "nodes": result.nodes, "setup": result.setup},
                path)
    return path
