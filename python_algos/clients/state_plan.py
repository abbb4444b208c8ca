"""Where a run keeps its per-client state: ``simulate(..., state=)`` (docs/population.md).

``state="dense"`` (default): every ``client_fields`` stack is an ``[N, d]`` tensor, as always.
``"ram"`` / ``"disk"``: each is a :class:`~.state_store.ClientStateStore` (rows stored only once
written; the block in RAM or in a memory-mapped file under ``state_folder``), and a round gathers
the cohort's rows into its ``[k, d]`` working stack once and scatters them back once
(:func:`python_algos.algorithms.steps.rows_` / ``put_rows_``), so the algorithm's code is unchanged.
Under full participation a round streams every client's rows through the executor in chunks of
:func:`stream_rows` clients (python_algos/algorithms/streamed.py), so N is bounded by the disk, not the RAM.
``"auto"``: ``"ram"`` when the up-front estimate (:class:`StateEstimate`) fits the memory this
process may use, else ``"disk"`` when it fits the disk, else the run is refused naming what to
change; under full participation, ``"dense"`` when the dense stacks fit, else a streamed store.

How the stores start without an ``[N, d]`` stack: ``init`` runs with ``clients.new_stack`` giving
a read-only stride-0 view of the initial row (:meth:`ClientSet.new_stack`), so an init that reads
its stacks works (FedADMM's and FedDR's ``clients.mean``: a view's rows sum as a dense stack's,
:mod:`.row_sum`), and one that writes every client's row (FedDR's ``init_from="paper"``)
is refused before a round runs.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import tempfile
from typing import NamedTuple, Optional

import torch

from . import row_file
from .process_group import agree, rank
from .state_log import LogCut, LoggedRows
from .state_store import ClientStateStore, StoredRows

__all__ = ["MODES", "StateEstimate", "StreamCost", "StatePlan", "DoesNotFit", "memory_available", "check_dense_fits",
           "snapshot_state", "data_bytes", "stream_rows", "stream_chunks", "stream_cost"]

MODES = ("dense", "ram", "disk", "auto")
STREAM_BYTES = 64 << 20  # a streamed round's working stacks: one chunk's rows of each (a cache-sized working set)
WORKSPACES = 4  # [k, d] scratch stacks an algorithm's round keeps besides the gathered rows (FedDR: 3)
RAM_SHARE = 0.8  # of the memory available, what the state may take: the rest is the run's own headroom
_OVERLAP = "more than one element of the written-to tensor refers to a single memory location"


class LazyRow(torch.Tensor):
    """A one-client lazy stack (``ClientSet.new_stack`` during a store's init, a ``[1, d]`` view of the
    initial row): a write to it raises torch's overlap error, as one to a lazy stack of 2 rows or more
    does, so that an init that writes every client's row is refused whatever a process's (a rank's)
    number of clients. Without it a rank holding one client went on into init's collectives while
    the others refused (tests/test_fuzz_distributed.py, seed 50080). Results of reads are plain tensors."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        outs = kwargs.get("out", ())
        written = [args[0]] if args and (name.endswith("_") and not name.startswith("__") or name == "__setitem__") \
            else []
        written += list(outs) if isinstance(outs, (tuple, list)) else [outs]
        schema = getattr(func, "_schema", None)  # a torch.ops op: its mutable arguments
        if schema is not None:
            written += [a for a, s in zip(args, schema.arguments) if s.alias_info is not None and s.alias_info.is_write]
        if any(isinstance(t, LazyRow) for t in written):
            raise RuntimeError(f"unsupported operation: {_OVERLAP} (a client-state store's lazy row)")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


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


def stream_rows(stacks: int, dim: int, itemsize: int) -> int:
    """Clients per chunk of a streamed round: the rows of its ``stacks`` (client fields and uploads)
    and ``WORKSPACES`` scratch stacks that :data:`STREAM_BYTES` holds (at least one)."""
    return max(1, STREAM_BYTES // ((stacks + WORKSPACES) * dim * itemsize))


def stream_chunks(cs, stacks: int, dim: int, itemsize: int) -> list:
    """The ``(first, end)`` client ranges a streamed round runs one after another: the clients whose rows of
    ``stacks`` stacks :func:`stream_rows` holds, as the executor ``cs`` cuts them (``cs.stream_chunks``: a
    batched executor's whole pass windows, a population's blocks). The rounds and the estimate's
    :func:`stream_cost` take their chunks from here, so the estimate counts the chunks the run uses."""
    return cs.stream_chunks(stream_rows(stacks, dim, itemsize))


class StreamCost(NamedTuple):
    """A streamed round's shape (the up-front estimate's): ``chunk`` clients at a time, each holding ``stacks``
    rows; ``rows_moved`` rows read or written a round; ``kept`` rows held beside the stacks (DEPOSITUM's
    pre-mix rows: a store of its own, RAM or disk as the state's)."""

    chunk: int
    stacks: int
    rows_moved: int
    kept: int = 0


@dataclasses.dataclass(frozen=True)
class StateEstimate:
    """Bytes of a run's per-client state, from its shape alone (before anything is allocated)."""

    num_clients: int
    dim: int
    itemsize: int
    fields: int  # per-client stacks (client_fields)
    cohort: Optional[int]  # k, clients per round; None: full participation, streamed in chunks
    rounds: int
    data_bytes: int = 0  # the clients' tensors (already in memory)
    uploads: int = 0  # d-vectors a client uploads (a streamed round keeps them for client_receive)
    streaming: Optional[StreamCost] = None  # under full participation, the streamed round's (stream_cost)

    def __post_init__(self):
        if self.cohort is None and self.streaming is None:
            raise ValueError("a full-participation estimate needs its streamed round's shape (state_plan.stream_cost)")

    @property
    def stream(self) -> Optional[StreamCost]:
        """The streamed round's shape (None: a cohort's round)."""
        return None if self.cohort is not None else self.streaming

    @property
    def chunk(self) -> Optional[int]:
        """Clients per chunk of a streamed round (None: a cohort's round, gathered at once)."""
        return None if self.stream is None else self.stream.chunk

    @property
    def streamed_bytes(self) -> int:
        """Bytes a streamed round reads and writes (:attr:`stream`'s rows moved)."""
        return 0 if self.stream is None else self.stream.rows_moved * self.dim * self.itemsize

    @property
    def dense_bytes(self) -> int:
        return self.fields * self.num_clients * self.dim * self.itemsize

    @property
    def store_bytes(self) -> int:
        """Row tables plus every row the run can write: at most min(N, k × rounds) per stack (N, and the
        uploads' N rows, when streamed, and the rows a streamed round keeps beside them)."""
        row = 8 + self.dim * self.itemsize
        if self.cohort is None:
            kept = self.stream.kept
            return (self.fields + self.uploads) * row * (self.num_clients + 1) + (row * (kept + 1) if kept else 0)
        touched = min(self.num_clients, self.cohort * self.rounds)
        return self.fields * (8 * self.num_clients + (1 + touched) * self.dim * self.itemsize)

    @property
    def log_bytes(self) -> int:
        """A disk store's checkpoint logs at their largest: the last checkpoint's log (at most twice the
        rows written) beside the next one of the live rows, 3 records of 8 + d × itemsize bytes a row."""
        touched = self.num_clients if self.cohort is None else min(self.num_clients, self.cohort * self.rounds)
        return self.fields * 3 * touched * (8 + self.dim * self.itemsize)

    @property
    def working_bytes(self) -> int:
        if self.cohort is not None:
            return (self.fields + WORKSPACES) * self.cohort * self.dim * self.itemsize
        return (self.stream.stacks + WORKSPACES) * self.chunk * self.dim * self.itemsize

    @property
    def stage_bytes(self) -> int:
        """A disk store's staging buffers (:mod:`.row_file`, rows of whole pages written with O_DIRECT): each
        row file's, the rows of its largest write (a cohort, a chunk, a chunk's kept rows) up to
        ``row_file.STAGE_BYTES``, kept while the store lives: memory beside the working stacks."""
        row = self.dim * self.itemsize
        padded = -(-row // row_file.PAGE) * row_file.PAGE
        if (padded - row) * row_file.PAD_SHARE > row:  # copied through the mapping: nothing staged
            return 0
        per = max(1, row_file.STAGE_BYTES // padded)
        if self.cohort is not None:
            return self.fields * min(per, self.cohort) * padded
        files = (self.fields + self.uploads) * min(per, self.chunk)
        return (files + (min(per, self.chunk, self.stream.kept) if self.stream.kept else 0)) * padded

    @property
    def ahead_bytes(self) -> int:
        """A disk store's rows read ahead (:meth:`.row_file.RowFile.prefetch`: the next cohort's rows written
        before, read into the page cache while a round computes): at most a cohort's rows of each stack, as
        the row file lays them out (padded to whole pages where written with O_DIRECT). 0 under full
        participation: a streamed round reads no cohort ahead."""
        if self.cohort is None:
            return 0
        row = self.dim * self.itemsize
        padded = -(-row // row_file.PAGE) * row_file.PAGE
        return self.fields * self.cohort * (row if (padded - row) * row_file.PAD_SHARE > row else padded)

    def describe(self) -> str:
        streamed = "" if self.chunk is None else \
            f", streamed in chunks of {self.chunk} clients ({_gb(self.streamed_bytes)} read and written a round)"
        return (f"client state: {self.fields} stack(s) of {self.num_clients} x {self.dim}: dense "
                f"{_gb(self.dense_bytes)}, stored rows at most {_gb(self.store_bytes)}; working stacks "
                f"{_gb(self.working_bytes)}{streamed}; data {_gb(self.data_bytes)}")


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
            if cohort is None and executor == "distributed":
                raise ValueError(f"state={state!r} under full participation streams every client's rows in chunks on "
                                 f"the sequential and batched executors only (the distributed executor holds each "
                                 f"rank's rows densely then): use state='dense', or executor='sequential'/'batched'")
            if backend is not None:
                raise ValueError(f"state={state!r} runs on the sequential, batched and distributed executors only (a "
                                 f"custom backend holds dense [N, d] stacks): use state='dense'")
        if state == "disk" and (checkpoints or resume) and state_folder is None:
            raise ValueError("state='disk' with checkpoints (or resume) needs state_folder: the checkpoints' row log "
                             "lives there (a temporary folder goes with the process, and the checkpoint with it)")
        if state == "auto" and (backend is not None or (cohort is None and executor == "distributed")):
            state = "dense"
        if state_folder is not None and executor == "distributed":  # each rank its own rows' folder
            state_folder = os.path.join(state_folder, f"rank{rank()}")
        return cls(mode=state, folder=state_folder, cohort=cohort, logged=bool(checkpoints or resume))

    def init(self, algorithm, x0: torch.Tensor, cs, rounds: int):
        """``algorithm.init(x0, cs)``, its client stacks in the store this plan picks (under full
        participation, for ``auto``: the dense stacks when they fit, else a streamed store)."""
        if self.mode == "dense" or self.keeps_dense(algorithm, cs.num_clients):
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
            if self.mode == "auto" and self.cohort is None:  # full participation: the dense stacks, as before
                cs.lazy_stacks = False
                return algorithm.init(x0, cs)
            raise ValueError(f"state={self.mode!r}: {algorithm.name}.init writes every client's row (its clients "
                             f"do not all start alike), so its state cannot start without an [N, d] stack: use "
                             f"state='dense' (or an initialization that starts every client alike)") from None
        finally:
            cs.lazy_stacks = False
        fields = tuple(type(state).client_fields)
        uploads = len(algorithm.messages().up) if self.cohort is None else 0  # kept by a streamed round
        self.estimate = StateEstimate(cs.rows, cs.dim, x0.element_size(), len(fields), self.cohort, int(rounds),
                                      data_bytes(getattr(cs, "clients", ())), uploads, None if self.cohort is not None
                                      else stream_cost(algorithm, cs, len(fields), uploads, x0.element_size()))
        stores, err = None, None
        try:  # distributed: each rank's shard (cs.rows), estimate and folder; one rank's refusal stops every rank
            backend = self.kept(self.estimate)
            stores = {f: getattr(state, f).contiguous() if backend == "dense" else  # new_stack's dense rows
                      _store(getattr(state, f), backend, self.folder, f) for f in fields}
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
            elif isinstance(v, (LoggedRows, LogCut)):  # a LogCut: re-cut from the logs of other processes
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

    def keeps_dense(self, algorithm, num_clients: int) -> bool:
        """Whether a full-participation run keeps dense stacks whatever they take: ``auto`` with an algorithm
        whose clients cannot stream (``algorithm.stream_refusal(num_clients)``); ``ram`` / ``disk`` with one are
        refused."""
        why = algorithm.stream_refusal(num_clients) if self.cohort is None and self.mode != "dense" else ""
        if why and self.mode in ("ram", "disk"):
            raise ValueError(f"state={self.mode!r} under full participation: {why}")
        return bool(why)

    def kept(self, est: StateEstimate) -> str:
        """Where the stacks of ``est`` live: dense (``mode`` dense; ``auto`` under full participation while the
        dense stacks fit, a streamed store otherwise), else :meth:`choose_backend`'s ram or disk."""
        if self.mode == "dense" or (self.mode == "auto" and est.cohort is None and _dense_fits(est)):
            return "dense"
        return self.choose_backend(est)

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
        if est.working_bytes + est.stage_bytes + est.ahead_bytes > ram:
            raise DoesNotFit(f"{est.describe()}: on disk, the working stacks, the rows staged for the disk "
                             f"({_gb(est.stage_bytes)}) and those read ahead ({_gb(est.ahead_bytes)}) need more than "
                             f"this process may use ({_gb(avail)} "
                             f"available): a smaller clients_per_round, or a smaller model")
        return "disk"


def stream_cost(algorithm, cs, fields: int, uploads: int, itemsize: int) -> StreamCost:
    """The shape of ``algorithm``'s streamed round on the executor ``cs``, in the chunks it runs
    (:func:`stream_chunks`): the algorithm's own (``algorithm.stream_cost``: DEPOSITUM's gossip), else the
    server–client round's (algorithms/streamed.py): each of the ``fields`` stacks' rows read and written
    twice (the uploads, then client_receive), each of the ``uploads`` written and read once, a chunk
    holding the stacks and uploads."""
    own = getattr(algorithm, "stream_cost", None)
    if own is not None:
        return own(cs, cs.dim, itemsize)
    chunks = stream_chunks(cs, fields + uploads, cs.dim, itemsize)
    return StreamCost(max(b - a for a, b in chunks), fields + uploads, (4 * fields + 2 * uploads) * cs.num_clients)


def _dense_fits(est: StateEstimate) -> bool:
    """Whether a full-participation run's dense stacks (and their round's workspaces) fit in memory."""
    return (est.fields + WORKSPACES) * est.num_clients * est.dim * est.itemsize <= RAM_SHARE * memory_available()


def snapshot_state(state):
    """The state a snapshot holds: each store as its checkpoint (:meth:`ClientStateStore.checkpoint`: a
    RAM store's :class:`StoredRows`, references, as the snapshot's other entries; a disk store's
    :class:`LoggedRows`, its rows appended to its log now), dense stacks as they are."""
    stores = {f: getattr(state, f).checkpoint() for f in getattr(type(state), "client_fields", ())
              if isinstance(getattr(state, f), ClientStateStore)}
    return state._replace(**stores) if stores else state


def _store(v: torch.Tensor, backend: str, folder: Optional[str], field: str) -> ClientStateStore:
    """The store of one init stack: a stride-0 view (every row its first) or a :class:`LazyRow` stores no row (its
    row is the initial one, as on a rank of more clients: a checkpoint's pieces re-cut together start alike); a
    dense stack all."""
    where = os.path.join(folder, field) if folder is not None and backend == "disk" else None  # auto may pick ram
    if v.stride(0) == 0 or isinstance(v, LazyRow):  # a [1, d] expand of one row keeps stride d
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
