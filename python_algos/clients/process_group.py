"""Process-group helpers for the distributed executor: joining torch.distributed, shard bounds,
and collective agreement on errors and stop decisions.

A run under ``torchrun`` finds ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` in its environment and
joins the default process group with :func:`ensure_group`; a script that already called
``torch.distributed.init_process_group`` keeps its group. Without either, a one-process group is
made, so ``executor="distributed"`` also runs (as one rank) in a plain script.

Timeouts. Every collective waits at most ``timeout`` seconds (default :data:`DEFAULT_TIMEOUT`,
or the ``PYTHON_ALGOS_DIST_TIMEOUT`` environment variable) before raising on the ranks that wait.
A rank that *exits* (error, kill) closes its connections, so gloo fails the peers' pending
collectives at once and ``torchrun`` stops the job; the timeout bounds the other case, a peer that
stops answering without exiting (a hung process, a lost node).
"""

from __future__ import annotations

import datetime
import os
from typing import Optional

import torch
import torch.distributed as dist

from .state_log import LoggedRows
from .state_store import ClientStateStore, StoredRows

__all__ = ["DEFAULT_TIMEOUT", "TIMEOUT_ENV", "ensure_group", "bounds", "rank", "world_size", "is_main",
           "under_launcher", "agree", "any_rank", "local_device", "client_fields"]

DEFAULT_TIMEOUT = 300.0  # seconds a collective may wait for a silent peer
TIMEOUT_ENV = "PYTHON_ALGOS_DIST_TIMEOUT"


def under_launcher() -> bool:
    """True in a process started by torchrun (or any launcher that sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def timeout_seconds(timeout: Optional[float] = None) -> float:
    if timeout is None:
        timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))
    if not timeout > 0:
        raise ValueError(f"the distributed timeout must be > 0 seconds, got {timeout!r}")
    return float(timeout)


def local_device(device: torch.device) -> torch.device:
    """A CUDA device without an index means this rank's GPU: ``cuda:LOCAL_RANK`` (one GPU per rank)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return device


def ensure_group(device: torch.device = torch.device("cpu"), timeout: Optional[float] = None):
    """The default process group, joined now if needed: NCCL for CUDA tensors, gloo otherwise."""
    if not dist.is_available():
        raise RuntimeError("executor 'distributed' needs torch.distributed, which this torch build lacks")
    device = torch.device(device)
    _unbind_world_defaults()
    if dist.is_initialized():
        backend = dist.get_backend()
        if device.type == "cpu" and backend == "nccl":
            raise ValueError("the process group uses NCCL, which cannot reduce CPU tensors: put the model on "
                             "cuda:LOCAL_RANK, or initialize torch.distributed with backend='gloo'")
        return dist.group.WORLD
    backend = "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"
    td = datetime.timedelta(seconds=timeout_seconds(timeout))
    if device.type == "cuda":
        torch.cuda.set_device(local_device(device))
    if under_launcher():
        dist.init_process_group(backend, store=_attempt_store(td), rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=td)
    else:  # a plain script: a group of one
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=td)
    return dist.group.WORLD


def _unbind_world_defaults() -> None:
    """Keep ``torch.distributed.nn.functional`` from holding the default group past its destruction.

    That module's collectives take ``group=group.WORLD`` as a default argument, evaluated when it is first
    imported; ``torch._dynamo`` imports it, and ``torch.func`` (the batched executor) imports ``torch._dynamo``
    on first use. Imported after the group exists, the defaults keep the group alive past
    ``destroy_process_group``: its gloo threads and TCPStore server then run until interpreter teardown,
    where they can abort the process (SIGABRT, "terminate called without an active exception") after the
    run has finished. Imported before the group exists, the defaults are None, which every collective
    reads as the default group; a group made earlier (by the caller) is replaced by None in them."""
    from types import FunctionType

    import torch.distributed.nn.functional as functional

    if not dist.is_initialized():
        return
    world = dist.group.WORLD
    for f in vars(functional).values():
        if isinstance(f, FunctionType) and f.__defaults__ and any(d is world for d in f.__defaults__):
            f.__defaults__ = tuple(None if d is world else d for d in f.__defaults__)


def _attempt_store(timeout: datetime.timedelta):
    """The launcher's key-value store, under a prefix of its own per restart attempt.

    After ``torchrun --max-restarts`` restarts a job, the agent's store can still hold the keys
    that the previous attempt's ranks published (their gloo addresses); a restarted rank reading
    one would wait on a dead peer. A prefix per attempt (``TORCHELASTIC_RESTART_COUNT``) gives
    every attempt fresh keys."""
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"])
    world, r = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # else rank 0 hosts it
    store = dist.TCPStore(host, port, world, is_master=(not agent_hosts and r == 0), timeout=timeout,
                          multi_tenant=not agent_hosts)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"python_algos/attempt{attempt}/", store)


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", 0))


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() \
        else int(os.environ.get("WORLD_SIZE", 1))


def is_main() -> bool:
    """Rank 0 (or a process outside any distributed job): the one that prints and writes results."""
    return rank() == 0


def bounds(n: int, world: int) -> list[tuple[int, int]]:
    """Contiguous, balanced shards: rank r holds clients ``[r n / P, (r + 1) n / P)``."""
    return [(r * n // world, (r + 1) * n // world) for r in range(world)]


def agree(error: Optional[BaseException]) -> None:
    """Collective error check: if any rank passes an exception, every rank raises one naming the
    first failing rank and its message (so all ranks stop together instead of some waiting forever
    in the next collective). The exception type of a ValueError / TypeError is kept."""
    if world_size() == 1:
        if error is not None:
            raise error
        return
    msg = None if error is None else (type(error).__name__, str(error))
    got = [None] * world_size()
    dist.all_gather_object(got, msg)
    for r, m in enumerate(got):
        if m is not None:
            kind, text = m
            cls = {"ValueError": ValueError, "TypeError": TypeError}.get(kind, RuntimeError)
            if error is not None and r == rank():
                raise cls(f"rank {r} of {len(got)}: {text}") from error
            raise cls(f"rank {r} of {len(got)}: {text}")


def any_rank(flag: bool, device: torch.device = torch.device("cpu")) -> bool:
    """True on every rank if ``flag`` is true on any rank (one tiny all-reduce)."""
    if world_size() == 1:
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def client_fields(state, rows: int) -> list:
    """The fields of a NamedTuple algorithm state that are client stacks (one row per client held
    here, ``rows`` of them), as the State class declares them in ``client_fields``.

    Sharded checkpoints and distributed metrics split or all-reduce exactly these fields; a shape
    test cannot tell them from a server-side 2-D field that happens to have ``rows`` rows, so an
    undeclared state holding a 2-D tensor is refused (naming the declaration to add) rather than
    guessed. A declared field that is None (an optional buffer) is skipped."""
    if not hasattr(state, "_asdict"):
        return []
    cls = type(state)
    declared = getattr(cls, "client_fields", None)
    items = state._asdict()
    if declared is None:
        two_d = [k for k, v in items.items() if isinstance(v, torch.Tensor) and v.dim() == 2]
        if two_d:
            raise ValueError(f"{cls.__name__} does not declare which of its fields are per-client [N, d] stacks, so "
                             f"a distributed run cannot tell them from server-side matrices (2-D fields: "
                             f"{', '.join(two_d)}): add a class attribute client_fields = (...) naming the "
                             f"per-client fields (() if none) to the {cls.__name__} NamedTuple")
        return []
    if isinstance(declared, str) or not all(isinstance(k, str) for k in declared):
        raise TypeError(f"{cls.__name__}.client_fields must be a tuple of field names, got {declared!r}")
    out = []
    for k in declared:
        if k not in items:
            raise ValueError(f"{cls.__name__}.client_fields names {k!r}, which is not one of its fields "
                             f"{', '.join(cls._fields)}")
        v = items[k]
        if v is None:
            continue
        if isinstance(v, (ClientStateStore, StoredRows, LoggedRows)):  # a store (state_plan), or its checkpoint form
            held = v.table.numel() if isinstance(v, StoredRows) else v.rows
            if held != rows:
                raise ValueError(f"{cls.__name__}.{k} is a store of {held} clients' rows, not of the {rows} held here")
        elif not isinstance(v, torch.Tensor) or v.dim() < 1 or v.shape[0] != rows:
            shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise ValueError(f"{cls.__name__}.{k} is declared per-client (client_fields) but is {shape}, not one "
                             f"row per client ({rows} rows here)")
        out.append(k)
    return out
