"""Which executor runs the clients: the one-process executors by name, and ``"auto"``'s fixed rule.

Kept apart from the package ``__init__`` so that the distributed executor, which runs one of these
executors on each rank's share of the clients, can look them up without an import cycle.
"""

from __future__ import annotations

from typing import Callable, Optional

from torch import nn

from .base import ClientSet
from .batched import BatchedClients
from .sequential import SequentialClients

__all__ = ["LOCAL_EXECUTORS", "resolve_local", "AUTO_MIN_CLIENTS", "AUTO_MIN_CLIENTS_PER_PASS"]

#: the executors that run clients in this process: name -> ClientSet class (constructor
#: ``(model, loss_fn, data, batch_size=, seed=, flat=, **options)``)
LOCAL_EXECUTORS: dict[str, type] = {
    "sequential": SequentialClients,
    "batched": BatchedClients,
}




def resolve_local(executor, model: nn.Module) -> Callable[..., ClientSet]:
    """A ClientSet factory for ``executor`` (a name in :data:`LOCAL_EXECUTORS`, or ``"auto"``).

    Raises ``ValueError`` naming the valid executors, or saying why the model cannot run on the one
    asked for (``cls.unsupported(model)``; the batched executor also probes the model when built).
    ``"auto"`` picks by a fixed rule taken from the measured clients table (docs/performance.md): the batched
    executor when it can run the model and the work is launch- or overhead-bound — the model is on
    a GPU, or there are at least :data:`AUTO_MIN_CLIENTS` clients and no convolution (vmap turns a
    convolution into a grouped one, slower on CPU than one client after another) — and a pass holds
    at least :data:`AUTO_MIN_CLIENTS_PER_PASS` clients (``BatchedClients.clients_per_pass``: the
    memory budget's clients per pass, and, when samples are coupled, the clients sharing a batch
    length) — otherwise the sequential one. A rule, not a timing: timings vary from run to run, and
    two executors differ in
    floating-point summation order, so a timed choice would make identical commands give different
    bits. ``clients.auto_reason`` says why the choice was made."""
    names = ", ".join(["auto", *LOCAL_EXECUTORS])
    if not isinstance(executor, str) or executor.lower() not in ("auto", *LOCAL_EXECUTORS):
        raise ValueError(f"executor must be one of {names}, got {executor!r}")
    name = executor.lower()
    if name != "auto":
        cls = LOCAL_EXECUTORS[name]
        why = cls.unsupported(model)
        if why:
            raise ValueError(f"executor {name!r} cannot run this model: {why}")
        return cls
    return _auto


_COMMON = ("batch_size", "seed", "flat", "first_client")
AUTO_MIN_CLIENTS = 64  # below this, a vectorized pass does not repay its fixed cost (clients table, CPU)
#: fewer clients per vectorized pass than this (the memory budget's, or the clients sharing a batch
#: length when samples are coupled) and the batched executor is the sequential one plus vmap's
#: fixed cost per pass (a 6.3 M-parameter MLP in a 64 MiB budget: 1.6 s vs 65 ms per step)
AUTO_MIN_CLIENTS_PER_PASS = 4


def _auto_prefers_batched(model: nn.Module, n_clients: int, flat) -> tuple[bool, str]:
    params = flat.params if flat is not None else next(model.parameters(), None)
    if params is not None and params.device.type == "cuda":
        return True, "the model is on a GPU, where one vectorized pass saves a launch per client"
    conv = next((name for name, m in model.named_modules() if isinstance(m, nn.modules.conv._ConvNd)), None)
    if conv is not None:
        return False, f"the model has a convolution ({conv!r}), which vmap runs slower than one client at a time"
    if n_clients < AUTO_MIN_CLIENTS:
        return False, f"{n_clients} clients (< {AUTO_MIN_CLIENTS}) do not repay a vectorized pass"
    return True, f"{n_clients} clients of a convolution-free model"


def _auto(model, loss_fn, data, total_clients: Optional[int] = None, **kw) -> ClientSet:
    """``total_clients``: N of the whole run when ``data`` is one process's shard of it (the
    distributed executor), so that every rank makes the choice one process would make."""
    fallback = LOCAL_EXECUTORS["sequential"]
    common = {k: v for k, v in kw.items() if k in _COMMON}
    batched, reason = _auto_prefers_batched(model, total_clients or len(data), kw.get("flat"))
    if batched:
        why = BatchedClients.unsupported(model)
        if not why:
            try:
                cs = BatchedClients(model, loss_fn, data, **kw)
            except ValueError as e:
                if "executor 'batched' cannot run" not in str(e):
                    raise
                why = str(e)
            else:
                per_pass = cs.clients_per_pass()
                if per_pass >= AUTO_MIN_CLIENTS_PER_PASS:
                    cs.auto_reason = reason
                    return cs
                why = (f"{per_pass:g} clients per pass (< {AUTO_MIN_CLIENTS_PER_PASS}) would make it slower than one "
                       f"client at a time" + (f"; samples are coupled ({cs.coupled}), so only batches of equal "
                                              f"length share a pass" if cs.coupled else ""))
                del cs
        reason = f"the batched executor cannot be used ({why})"
    cs = fallback(model, loss_fn, data, **common)
    cs.auto_reason = reason
    return cs
