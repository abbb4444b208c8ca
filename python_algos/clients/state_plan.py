"""Where a run keeps its per-client state: ``simulate(..., state=)`` (docs/population.md).

``state="dense"`` (default): every ``client_fields`` stack is an ``[N, d]`` tensor, as always.
``"ram"`` / ``"disk"``: each is a :class:`~.state_store.ClientStateStore` (rows stored only once
written; the block in RAM or in a memory-mapped file under ``state_folder``), and a round gathers
the cohort's rows into its ``[k, d]`` working stack once and scatters them back once
(:func:`python_algos.algorithms.steps.rows_` / ``put_rows_``), so the algorithm's code is unchanged.
``"auto"``: ``"ram"`` when the up-front estimate (:class:`StateEstimate`) fits the memory this
process may use, else ``"disk"`` when it fits the disk, else the run is refused naming what to
change; under full participation, ``"dense"``.

How the stores start without an ``[N, d]`` stack: ``init`` runs with ``clients.new_stack`` giving
a read-only stride-0 view of the initial row (:meth:`ClientSet.new_stack`), so an init that reads
its stacks works (FedADMM's and FedDR's ``clients.mean`` sum a dense copy when it fits:
:func:`as_summed_densely`), and one that writes every client's row (FedDR's ``init_from="paper"``)
is refused before a round runs.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import tempfile
from typing import Optional

import torch

from .process_group import agree, rank
from .state_log import LoggedRows
from .state_store import ClientStateStore, StoredRows

__all__ = ["MODES", "StateEstimate", "StatePlan", "DoesNotFit", "memory_available", "check_dense_fits",
           "snapshot_state", "as_summed_densely", "data_bytes"]

MODES = ("dense", "ram", "disk", "auto")
WORKSPACES = 4  # [k, d] scratch stacks an algorithm's round keeps besides the gathered rows (FedDR: 3)
RAM_SHARE = 0.8  # of the memory available, what the state may take: the rest is the run's own headroom
_OVERLAP = "more than one element of the written-to tensor refers to a single memory location"


class DoesNotFit(ValueError):
    """The run's state cannot fit in the memory (and disk) this process may use."""


def memory_available() -> int:
    """Bytes this process may still allocate: the least of the kernel's MemAvailable, the address-space
    limit (``RLIMIT_AS``) less what is mapped, and the cgroup's memory.max less its memory.current."""
    out = [v for v in (_meminfo("MemAvailable"),) if v is not None]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        out.append(soft - _status("VmSize"))
    try:
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit = f.read().strip()
            if limit != "max":
                out.append(int(limit) - int(g.read()))
    except (OSError, ValueError):
        pass
    return max(0, min(out)) if out else 1 << 62


def check_dense_fits(nbytes: int, what: str) -> None:
    """Refuse (:class:`DoesNotFit`, naming ``state=``) a dense allocation over the memory available,
    instead of the allocator's raw error or the OOM killer."""
    if nbytes < 1 << 26:  # small stacks never need the check (it reads /proc)
        return
    avail = memory_available()
    if nbytes > RAM_SHARE * avail:
        raise DoesNotFit(f"{what} takes {_gb(nbytes)}, more than this process may use ({_gb(avail)} available): run "
                         f"with state='ram' or state='disk' (simulate's state=; rows kept only for the clients that "
                         f"train), or fewer clients")


def as_summed_densely(S: torch.Tensor) -> torch.Tensor:
    """The stack ``clients.mean`` sums: a dense copy of a stride-0 view (a store's stack during
    ``init``) when one fits in memory, since torch may order the sum of a view's rows differently
    from a dense stack's (float32, ~10^4 rows and more) and the run must equal the dense run bit for
    bit; a view whose dense copy does not fit (no dense run could hold it) is summed as it is."""
    if S.dim() != 2 or S.shape[0] < 2 or S.stride(0) != 0:
        return S
    nbytes = S.shape[0] * S.shape[1] * S.element_size()
    return S.contiguous() if S.device.type != "cpu" or nbytes <= RAM_SHARE * memory_available() else S


@dataclasses.dataclass(frozen=True)
class StateEstimate:
    """Bytes of a run's per-client state, from its shape alone (before anything is allocated)."""

    num_clients: int
    dim: int
    itemsize: int
    fields: int  # per-client stacks (client_fields)
    cohort: int  # k, clients per round
    rounds: int
    data_bytes: int = 0  # the clients' tensors (already in memory)

    @property
    def dense_bytes(self) -> int:
        return self.fields * self.num_clients * self.dim * self.itemsize

    @property
    def store_bytes(self) -> int:
        """Row tables plus every row the run can write: at most min(N, k × rounds) per stack."""
        touched = min(self.num_clients, self.cohort * self.rounds)
        return self.fields * (8 * self.num_clients + (1 + touched) * self.dim * self.itemsize)

    @property
    def log_bytes(self) -> int:
        """A disk store's checkpoint logs at their largest: the last checkpoint's log (at most twice the
        rows written) beside the next one of the live rows, 3 records of 8 + d × itemsize bytes a row."""
        touched = min(self.num_clients, self.cohort * self.rounds)
        return self.fields * 3 * touched * (8 + self.dim * self.itemsize)

    @property
    def working_bytes(self) -> int:
        return (self.fields + WORKSPACES) * self.cohort * self.dim * self.itemsize

    def describe(self) -> str:
        return (f"client state: {self.fields} stack(s) of {self.num_clients} x {self.dim}: dense "
                f"{_gb(self.dense_bytes)}, stored rows at most {_gb(self.store_bytes)}; working stacks "
                f"{_gb(self.working_bytes)}; data {_gb(self.data_bytes)}")


@dataclasses.dataclass
class StatePlan:
    """``simulate``'s ``state`` / ``state_folder``, checked before anything is built (:meth:`checked`)."""

    mode: str
    folder: Optional[str]
    cohort: Optional[int]  # k, None under full participation
    estimate: Optional[StateEstimate] = None  # set by init for a store (the CLI prints it with the setup)
    logged: bool = False  # checkpoints are taken or read: a disk store's rows go to its log too (state_log)

    @classmethod
    def checked(cls, state, state_folder, cohort: Optional[int], executor, backend, checkpoints: bool,
                resume: bool) -> "StatePlan":
        if state not in MODES:
            raise ValueError(f"state must be one of {MODES}, got {state!r}")
        if state_folder is not None and state not in ("disk", "auto"):
            raise ValueError(f"state_folder is where state='disk' keeps its rows; got it with state={state!r}")
        if state in ("ram", "disk"):
            if cohort is None:
                raise ValueError(f"state={state!r} needs partial participation (clients_per_round or participation): "
                                 f"under full participation every client's row is read and written each round, so "
                                 f"a store saves nothing; use state='dense'")
            if backend is not None:
                raise ValueError(f"state={state!r} runs on the sequential, batched and distributed executors only (a "
                                 f"custom backend holds dense [N, d] stacks): use state='dense'")
        if state == "disk" and (checkpoints or resume) and state_folder is None:
            raise ValueError("state='disk' with checkpoints (or resume) needs state_folder: the checkpoints' row log "
                             "lives there (a temporary folder goes with the process, and the checkpoint with it)")
        if state == "auto" and (cohort is None or backend is not None):
            state = "dense"
        if state_folder is not None and executor == "distributed":  # each rank its own rows' folder
            state_folder = os.path.join(state_folder, f"rank{rank()}")
        return cls(mode=state, folder=state_folder, cohort=cohort, logged=bool(checkpoints or resume))

    def init(self, algorithm, x0: torch.Tensor, cs, rounds: int):
        """``algorithm.init(x0, cs)``, its client stacks in the store this plan picks."""
        if self.mode == "dense":
            return algorithm.init(x0, cs)
        if cs.device.type != "cpu":
            raise ValueError(f"state={self.mode!r} keeps rows in host memory and gathers them on the CPU; this run is "
                             f"on {cs.device}: use state='dense'")
        cs.lazy_stacks = True
        try:
            state = algorithm.init(x0, cs)
        except RuntimeError as e:
            if _OVERLAP not in str(e):
                raise
            raise ValueError(f"state={self.mode!r}: {algorithm.name}.init writes every client's row (its clients "
                             f"do not all start alike), so its state cannot start without an [N, d] stack: use "
                             f"state='dense' (or an initialization that starts every client alike)") from None
        finally:
            cs.lazy_stacks = False
        fields = tuple(type(state).client_fields)
        self.estimate = StateEstimate(cs.rows, cs.dim, x0.element_size(), len(fields), self.cohort, int(rounds),
                                      data_bytes(getattr(cs, "clients", ())))
        stores, err = None, None
        try:  # distributed: each rank's shard (cs.rows), estimate and folder; one rank's refusal stops every rank
            backend = self.choose_backend(self.estimate)
            stores = {f: _store(getattr(state, f), backend, self.folder, f) for f in fields}
        except Exception as e:  # noqa: BLE001 - re-raised on every rank by agree()
            err = e
        if cs.world_size > 1:
            agree(err)
        elif err is not None:
            raise err
        return state._replace(**stores)

    def adopt(self, state):
        """A resumed state's client stacks in this run's form (a dense stack or a store, the same rows),
        from a snapshot's dense stacks, stores, :class:`StoredRows` or :class:`LoggedRows` (a checkpoint
        file's: a disk store's rows at the checkpoint, read from its log under ``state_folder``)."""
        out = {}
        for f in type(state).client_fields:
            v = getattr(state, f)
            if isinstance(v, StoredRows):
                v = out[f] = ClientStateStore.from_stored_rows(v)
            elif isinstance(v, LoggedRows):
                if self.folder is None:
                    raise ValueError("the checkpoint's client rows are in the row log under its run's state_folder: "
                                     "resume with that state_folder")
                v = out[f] = ClientStateStore.from_log(v, os.path.join(self.folder, f),
                                                       "disk" if self.mode in ("disk", "auto") else "ram")
            if self.mode == "dense" and isinstance(v, ClientStateStore):
                out[f] = v.to_dense()
            elif self.mode != "dense" and not isinstance(v, ClientStateStore):
                out[f] = _store(v, "ram", None, f)
        return state._replace(**out) if out else state

    def choose_backend(self, est: StateEstimate) -> str:
        """ram or disk (``mode`` ram or auto), checked against what the machine has (:class:`DoesNotFit`
        names what to change)."""
        avail = memory_available() // _ranks_here()
        ram = RAM_SHARE * avail
        if est.working_bytes > ram:
            raise DoesNotFit(f"{est.describe()}: the working stacks alone need more than this process may use "
                             f"({_gb(avail)} available): a smaller clients_per_round, or a smaller model")
        fits_ram = est.store_bytes + est.working_bytes <= ram
        if self.mode == "ram" or (self.mode == "auto" and fits_ram):
            if not fits_ram:
                raise DoesNotFit(f"{est.describe()}: more than this process may use ({_gb(avail)} available): run "
                                 f"with state='disk' (rows in files under state_folder), or fewer clients")
            return "ram"
        if self.logged and self.folder is None:
            raise ValueError(f"{est.describe()}: fits only on disk, and state='disk' with checkpoints (or resume) "
                             f"needs state_folder (the checkpoints' row log lives there)")
        disk = _free_disk(self.folder) // _ranks_here()
        if est.store_bytes + (est.log_bytes if self.logged else 0) > disk:
            raise DoesNotFit(f"{est.describe()}: more than the {_gb(disk)} of free disk (and {_gb(avail)} of memory) "
                             f"this run may use: give state_folder on a larger disk, fewer rounds or clients_per_round "
                             f"(rows written), or fewer clients")
        return "disk"


def snapshot_state(state):
    """The state a snapshot holds: each store as its checkpoint (:meth:`ClientStateStore.checkpoint`: a
    RAM store's :class:`StoredRows`, references, as the snapshot's other entries; a disk store's
    :class:`LoggedRows`, its rows appended to its log now), dense stacks as they are."""
    stores = {f: getattr(state, f).checkpoint() for f in getattr(type(state), "client_fields", ())
              if isinstance(getattr(state, f), ClientStateStore)}
    return state._replace(**stores) if stores else state


def _store(v: torch.Tensor, backend: str, folder: Optional[str], field: str) -> ClientStateStore:
    """The store of one init stack: a stride-0 view (every row its first) stores no row; a dense stack all."""
    where = os.path.join(folder, field) if folder is not None and backend == "disk" else None  # auto may pick ram
    if v.stride(0) == 0:
        return ClientStateStore(v.shape[0], v.shape[1], v.dtype, v[0], backend=backend, folder=where)
    store = ClientStateStore(v.shape[0], v.shape[1], v.dtype, backend=backend, folder=where)
    store.scatter_(None, v.detach().to("cpu"))
    return store


def data_bytes(clients) -> int:
    """Bytes of the tensors of ``clients`` (a ClientSet's ``clients``; each storage once: clients may share one)."""
    if hasattr(clients, "nbytes_estimate"):  # a population's (population.LazyClients): its cache, never all N
        return clients.nbytes_estimate()
    storages = {}
    for c in clients:  # an executor's clients, or simulate's (X, y) pairs
        for t in (c if isinstance(c, tuple) else (getattr(c, "X", None), getattr(c, "y", None))):
            if isinstance(t, torch.Tensor):
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _ranks_here() -> int:
    """Processes of a torchrun job on this machine (``LOCAL_WORLD_SIZE``), which share its memory and disk."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1) or 1))


def _free_disk(folder: Optional[str]) -> int:
    """Free bytes on the disk of ``folder`` (its nearest existing ancestor), or of the temporary folder."""
    path = os.path.abspath(folder) if folder is not None else tempfile.gettempdir()
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def _meminfo(key: str) -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _gb(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"
