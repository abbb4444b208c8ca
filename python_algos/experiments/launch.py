"""Runs on several processes: ``torchrun`` ranks, the ``--workers`` launcher, sharded checkpoints.

    torchrun --nproc-per-node 2 -m python_algos run -a fedavg ...      # one node, 2 ranks
    python -m python_algos run --workers 2 -a fedavg ...                # the same, launched for you

A process started by ``torchrun`` (``RANK`` / ``WORLD_SIZE`` in its environment) runs its share of
the clients with the ``distributed`` executor (:class:`~python_algos.clients.DistributedClients`),
wrapping the executor the config names (``--executor``, default auto). Rank 0 alone prints
progress and writes the run folder; every rank writes its shard of the checkpoint.

**Sharded checkpoints.** ``checkpoint.pt`` is then a manifest: the replicated part of the run (server
state, generators, metrics) plus the list of shard files ``checkpoint.pt.shards/round<t>.rank<r>-of-<P>.pt``,
each holding one rank's rows of every client stack and its clients' minibatch generators. Each
rank writes its shard atomically; once every rank has, rank 0 replaces the manifest (atomically),
then deletes the previous round's shards — so a kill at any moment leaves a manifest whose shards
are all on disk. A checkpoint resumes on any number of processes: the client rows (and the
per-client generators) are re-cut for the new world size, one process included; a single-process
``checkpoint.pt`` resumes on P ranks the same way.

**Restarts.** Under ``torchrun --max-restarts R`` a failed rank makes torchrun restart every rank
with the same command; a restarted rank (``TORCHELASTIC_RESTART_COUNT`` > 0) whose ``--out`` folder
holds a checkpoint resumes from it, so the job finishes with the uninterrupted result.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import sys
from typing import Optional, Sequence

import torch
import torch.distributed as dist  # loaded with process_group, which the module imports anyway

from ..clients import process_group, state_log
from ..clients.shard_rows import cut_rows, join_rows, remove_other_writers
from ..clients.state_log import LogCut, LoggedRows
from ..runfolder import checkpoint as ckpt
from ..runfolder.signals import exit_code, signal_of
from ..system import processes
from ..system.lock import lock_folder
from .device import resolve_device

__all__ = ["distributed", "is_main", "rank", "world_size", "join", "agree_on", "agree", "barrier", "restarting",
           "executor_for", "workers_command", "run_workers", "ShardedCheckpointer", "SingleFileCheckpointer",
           "checkpointer",
           "load_checkpoint", "local_rows", "remove_shards", "remove_shard_leftovers", "maybe_kill",
           "KILL_RANK_ENV", "finish", "leave_interrupted", "first_message"]

# test hook "RANK:ROUND": SIGKILL that rank after that round (first attempt)
KILL_RANK_ENV = "_FEDKERNELS_TEST_KILL_RANK_AT"

rank, world_size, is_main = process_group.rank, process_group.world_size, process_group.is_main
distributed = process_group.under_launcher  # a rank started by torchrun (the run uses the distributed executor)


def restarting() -> bool:
    """True in a rank that torchrun restarted after a failure (``--max-restarts``)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0


def join(device: str = "cpu") -> None:
    """Join the job's process group now (under torchrun; nothing otherwise)."""
    if distributed():
        resolve_device(device)  # --device cuda without a GPU: the flag's error, not one from set_device
        dev = torch.device("cuda") if str(device).startswith("cuda") or (
            device == "auto" and torch.cuda.is_available()) else torch.device("cpu")
        process_group.ensure_group(dev)


def agree_on(value, device: str = "cpu"):
    """Rank 0's ``value`` on every rank (e.g. the default results folder, which has a timestamp)."""
    if not distributed():
        return value
    join(device)
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait for every rank (under torchrun; nothing otherwise)."""
    if distributed() and world_size() > 1:
        dist.barrier()


def agree(error: Optional[BaseException]) -> None:
    """Raise on every rank if any rank passes an exception (under torchrun); else raise ``error`` if given."""
    if distributed():
        process_group.agree(error)
    elif error is not None:
        raise error


def first_message(message: Optional[str]) -> Optional[str]:
    """The first rank's non-None ``message`` on every rank (None if none has one)."""
    if not distributed() or world_size() == 1:
        return message
    got = [None] * world_size()
    dist.all_gather_object(got, message)
    return next((m for m in got if m is not None), None)


FINISH_WAIT = 10.0  # seconds a rank that failed waits for its peers before it leaves the group


def finish(ok: bool = True) -> None:
    """Leave the process group at the end of a command. Ranks wait for each other first: a rank
    tearing its connections down while a peer still uses them makes that peer abort (SIGABRT)
    instead of exiting with its own error. ``ok``: every rank got here normally; after an error
    (often raised on every rank, see :func:`agree`) a rank waits at most :data:`FINISH_WAIT`
    seconds (gloo), then leaves anyway (a peer may be gone or stuck)."""
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() > 1:
            try:
                if ok:
                    dist.barrier()
                elif dist.get_backend() == "gloo":
                    dist.monitored_barrier(timeout=datetime.timedelta(seconds=FINISH_WAIT))
            except Exception:  # noqa: BLE001 - leaving after an error: the peers' state is unknown
                pass
        dist.destroy_process_group()


def leave_interrupted(code: int = 130) -> None:
    """After Ctrl-C in a rank of several: exit now with ``code``. A peer may still be blocked in a
    collective that this rank will never join, so neither a barrier nor a clean teardown of the
    group can be waited for (torchrun would kill the rank after its grace period); the run's files
    are already complete (atomic writes), and exiting closes the connections, which releases the
    peers. Outside a job of several ranks: leave the group (if any) normally and return."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    finish(ok=False)


def executor_for(executor: str) -> tuple[str, Optional[dict]]:
    """(executor, executor_options) for simulate: under torchrun, ``distributed`` wrapping ``executor``."""
    if distributed():
        return "distributed", {"inner": executor}
    return executor, None


def workers_command(argv: Sequence[str], workers: int, out: Optional[str]) -> list:
    """The torchrun command that runs ``python -m python_algos <argv>`` on ``workers`` local ranks."""
    # every argument but --workers P / --workers=P: each rank is one of the P
    forwarded = [a for i, a in enumerate(argv) if a != "--workers" and not a.startswith("--workers=")
                 and (i == 0 or argv[i - 1] != "--workers")]
    if out is not None and "--out" not in forwarded and not any(a.startswith("--out=") for a in forwarded):
        forwarded += ["--out", out]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(int(workers)),
            "-m", "python_algos", *forwarded]


STOP_GRACE = 60.0  # seconds the ranks get to write the interrupted summary after a stop signal


def run_workers(argv: Sequence[str], workers: int, out: Optional[str]) -> int:
    """Launch the ranks with torchrun and wait; returns its exit status (a rank's error: 1).

    torchrun is a child of this command (:mod:`~python_algos.system.processes`: it and its
    ranks end when this command dies, however it dies), in a group of its own, so a stop signal
    reaches it exactly once, from here: Ctrl-C (SIGINT), SIGTERM or SIGHUP to this command (inside
    :func:`~python_algos.runfolder.signals.terminate_as_interrupt`, all a ``KeyboardInterrupt``)
    is passed on to torchrun, which passes it to every rank (each in a session of its own); rank 0
    writes the summary ``interrupted``. The return value is then 128 + the signal's number. If
    the ranks have not ended after :data:`STOP_GRACE` seconds, or another stop signal arrives,
    torchrun and every process under it are killed. ``out`` (a folder that exists) is locked for
    the command's lifetime (:func:`~python_algos.system.lock.lock_folder`): the ranks, below
    this command, use it; another command is refused."""
    if out is not None and os.path.isdir(out):
        lock_folder(out)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # one thread per rank unless told otherwise (--threads)
    env["TMPDIR"] = processes.temp_dir("pa-torchrun-")  # torchrun's own files go with it, however it ends
    proc = processes.spawn(workers_command(argv, workers, out), env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt as e:
        processes.stop_all([proc], signal_of(e), STOP_GRACE)
        return exit_code(e)
    finally:
        shutil.rmtree(env["TMPDIR"], ignore_errors=True)


def maybe_kill(t: int) -> None:
    """Test hook: SIGKILL this rank after round t, on the first attempt only (see KILL_RANK_ENV)."""
    spec = os.environ.get(KILL_RANK_ENV)
    if not spec or restarting():
        return
    r, at = (int(v) for v in spec.split(":"))
    if r == rank() and t == at:
        os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------- #
# Sharded checkpoints
# --------------------------------------------------------------------------- #

def _shard_dir(path: str) -> str:
    return f"{path}.shards"


def _shard_name(t: int, r: int, world: int) -> str:
    return f"round{t}.rank{r}-of-{world}.pt"


class ShardedCheckpointer(ckpt.Checkpointer):
    """:class:`~python_algos.experiments.checkpoint.Checkpointer` for a distributed run: every rank
    writes its shard, rank 0 the manifest last (module docstring). ``num_clients``: N."""

    def __init__(self, path: str, num_clients: int, extra: Optional[dict] = None, state_folder: Optional[str] = None):
        super().__init__(path, extra)
        self.num_clients, self.state_folder = int(num_clients), state_folder

    def __call__(self, snapshot: dict) -> None:
        r, world = rank(), world_size()
        lo, hi = process_group.bounds(self.num_clients, world)[r]
        t = int(snapshot["round"])
        bad = ckpt.nonfinite_entry(snapshot["state"])
        if process_group.any_rank(bad is not None):  # every rank stops, the last good checkpoint stays
            raise ckpt.Diverged(f"round {t}: the algorithm state field {bad or '(on another rank)'} holds NaN/Inf")
        state = snapshot["state"]
        fields = process_group.client_fields(state, hi - lo)
        rng = snapshot["client_rng"]
        per_client = {k: v for k, v in rng.items() if isinstance(v, dict)}  # by global client index: this shard's
        names = [_shard_name(t, q, world) for q in range(world)]
        err = None
        try:
            ckpt.atomic_save({"format": ckpt.FORMAT, "round": t, "rank": r, "world_size": world, "lo": lo, "hi": hi,
                              "stacks": ckpt.encode({k: getattr(state, k) for k in fields}), "client_rng": per_client},
                             os.path.join(_shard_dir(self.path), names[r]))
        except Exception as e:  # noqa: BLE001 - every rank learns of it through agree()
            err = e
        process_group.agree(err)  # every shard is on disk before the manifest names them
        if r == 0:
            try:
                snap = dict(snapshot)
                snap["state"] = state._replace(**{k: None for k in fields}) if fields else state
                snap["client_rng"] = {k: v for k, v in rng.items() if k not in per_client}
                snap["shards"] = {"world_size": world, "num_clients": self.num_clients, "files": names,
                                  "fields": fields, "bounds": process_group.bounds(self.num_clients, world)}
                ckpt.save(self.path, snap, self.extra)
                # older shards (this run's previous checkpoint, or a run resumed here with another
                # world size): no rank writes before the agree() below, so nothing new is deleted
                for name in os.listdir(_shard_dir(self.path)):
                    if name not in names and name.startswith("round") and name.endswith(".pt"):
                        try:
                            os.remove(os.path.join(_shard_dir(self.path), name))
                        except OSError:
                            pass
                remove_other_writers(self.state_folder, world)  # the row logs of a checkpoint written by more ranks
            except Exception as e:  # noqa: BLE001
                err = e
        process_group.agree(err)
        self.last_round = t


class SingleFileCheckpointer(ckpt.Checkpointer):
    """The one-process checkpoint; a run resumed in one process from a sharded checkpoint deletes
    the shards, and the ranks' row logs under ``state_folder``, once its own ``checkpoint.pt`` (which
    names none) has replaced the manifest."""

    def __init__(self, path: str, extra: Optional[dict] = None, state_folder: Optional[str] = None):
        super().__init__(path, extra)
        self.state_folder = state_folder

    def __call__(self, snapshot: dict) -> None:
        super().__call__(snapshot)
        if os.path.isdir(_shard_dir(self.path)):
            remove_shards(self.path)
        remove_other_writers(self.state_folder, None)


def checkpointer(path: str, num_clients: int, extra: Optional[dict] = None,
                 state_folder: Optional[str] = None) -> ckpt.Checkpointer:
    """The checkpoint hook of a run: sharded under torchrun, a single file otherwise. ``state_folder``: the
    run's (``--state disk``), where the row logs of the processes that wrote the checkpoint it resumed from
    (on another number of processes) go once its own checkpoint replaced that one."""
    if distributed():
        return ShardedCheckpointer(path, num_clients, extra, state_folder)
    return SingleFileCheckpointer(path, extra, state_folder)


def remove_shards(path: str) -> None:
    """Delete the shard folder of the checkpoint ``path`` (a fresh run replacing an older one)."""
    shutil.rmtree(_shard_dir(path), ignore_errors=True)


def remove_shard_leftovers(path: str) -> None:
    """Delete the temporary files of shard writes that a kill interrupted."""
    folder = _shard_dir(path)
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            if ".tmp-" in name:
                try:
                    os.remove(os.path.join(folder, name))
                except OSError:
                    pass


def load_checkpoint(path: str, num_clients: int, map_location="cpu", state_folder: Optional[str] = None) -> dict:
    """A snapshot for ``simulate(resume=...)`` holding this process's rows: all N clients in one
    process, rank r's shard under torchrun — from a single-file or a sharded checkpoint, written
    by any number of processes (the rows and per-client generators are re-cut; ``state_folder``: see
    :func:`local_rows`)."""
    return local_rows(ckpt.load(path, map_location=map_location), path, num_clients, map_location, state_folder)


def local_rows(snap: dict, path: str, num_clients: int, map_location="cpu", state_folder: Optional[str] = None) -> dict:
    """:func:`load_checkpoint` for a snapshot already read with ``checkpoint.load(path)``. A disk store's rows
    (``--state disk``) are re-cut as a :class:`~python_algos.clients.state_log.LogCut`, which the run's store
    reads from the writers' row logs under its ``state_folder``; given here, those logs are checked now
    (missing, or not this checkpoint's), before the run writes anything."""
    snap = dict(snap)
    info = snap.pop("shards", None)
    n = int(num_clients)
    lo, hi = process_group.bounds(n, world_size())[rank()] if distributed() else (0, n)
    reader = f"rank{rank()}" if distributed() else ""  # this process's folder under state_folder (state_plan)
    if info is None:  # one process wrote it: stacks hold all N rows
        st = snap["state"]
        fields = process_group.client_fields(st, n) if (lo, hi) != (0, n) or reader else []
        snap["state"] = st._replace(**{k: join_rows([cut_rows(getattr(st, k), lo, hi)], reader) for k in fields
                                       if (lo, hi) != (0, n) or isinstance(getattr(st, k), LoggedRows)})
        snap["client_rng"] = {k: _own(v, lo, hi) for k, v in snap["client_rng"].items()}
        return _checked_logs(snap, state_folder, reader)
    if int(info["num_clients"]) != n:
        raise ValueError(f"{path} holds {info['num_clients']} clients, the run has {n}")
    stacks = {k: [] for k in info["fields"]}
    rng, kept = {}, {}
    for q, (qlo, qhi) in enumerate(info["bounds"]):
        a, b = max(lo, qlo), min(hi, qhi)
        if a >= b and reader != f"rank{q}":
            continue
        shard = _shard(path, info, q, snap["round"], map_location, a >= b)
        pieces = ckpt.decode(shard["stacks"])  # dense rows, or a store's (StoredRows, a disk store's LoggedRows)
        for k in info["fields"]:
            v = pieces[k]
            if isinstance(v, LoggedRows) and v.rows != qhi - qlo:
                raise ckpt.CheckpointError(f"{path}: rank {q}'s row log of {k} holds {v.rows} clients' rows, not "
                                           f"{qhi - qlo}: a shard of another run; restore the run's own "
                                           f"checkpoint.pt.shards folder from a copy")
            if f"rank{q}" == reader and isinstance(v, LoggedRows):
                kept[k] = v.log  # the log the checkpoint names in this process's own folder
            if a < b:
                whole = (a, b) == (qlo, qhi) and not isinstance(v, LoggedRows)
                stacks[k].append(v if whole else cut_rows(v, a - qlo, b - qlo, f"rank{q}"))
        if a < b:
            for k, v in shard["client_rng"].items():
                rng.setdefault(k, {}).update(_own(v, lo, hi))
    if stacks:
        snap["state"] = snap["state"]._replace(**{k: join_rows(v, reader, kept.get(k)) for k, v in stacks.items()})
    snap["client_rng"] = {**snap["client_rng"], **rng}
    return _checked_logs(snap, state_folder, reader)


def _shard(path: str, info: dict, q: int, t, map_location, mapped: bool = False) -> dict:
    """Rank q's shard file of the checkpoint ``path`` (round ``t``), read (``mapped``: memory-mapped, for a
    shard none of whose rows this process takes: its dense rows are never read)."""
    shard_path = os.path.join(_shard_dir(path), info["files"][q])
    if not os.path.isfile(shard_path):
        raise ckpt.CheckpointError(
            f"{path} names the shard {shard_path}, which is missing: the checkpoint of round {t} is "
            f"incomplete (shards are written before the manifest, so the file was removed or the run folder "
            f"was copied without its checkpoint.pt.shards folder); restore it from a copy")
    try:
        shard = torch.load(shard_path, map_location=map_location, weights_only=True, mmap=mapped)
    except Exception as e:  # noqa: BLE001 - torch reports damage as many types
        raise ckpt.CheckpointError(f"{shard_path} is damaged and cannot be read ({type(e).__name__}); restore "
                                   f"it from a copy") from None
    if not isinstance(shard, dict) or int(shard.get("round", -1)) != int(t):
        raise ckpt.CheckpointError(f"{shard_path} is not the shard of round {t} that {path} names; "
                                   f"restore the run's own checkpoint.pt.shards folder from a copy")
    return shard


def _checked_logs(snap: dict, state_folder: Optional[str], reader: str) -> dict:
    """``snap``, its disk stores' row logs under ``state_folder`` checked (when given) as the store will read them."""
    st = snap["state"]
    for k in getattr(type(st), "client_fields", ()) if state_folder is not None else ():
        v = getattr(st, k)
        if isinstance(v, (LoggedRows, LogCut)):
            state_log.cut_chunks(os.path.join(state_folder, reader, k), state_log.as_cut(v), 1)
    return snap


def _own(states, lo: int, hi: int):
    """Of saved per-client generator states (a dict by global client index), clients ``lo .. hi - 1``'s;
    anything else (a replicated generator's state) as it is."""
    return {i: s for i, s in states.items() if lo <= int(i) < hi} if isinstance(states, dict) else states
