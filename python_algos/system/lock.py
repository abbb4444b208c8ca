"""One command per folder: every run folder and group folder (a comparison, seeds, a sweep) a
command opens is locked for as long as the command runs, so a second command given the same folder
(a fresh run, ``--replace`` or ``--resume``) is refused before it reads or writes anything there,
with a one-line error naming the process that holds it.

The lock is an ``flock`` on the folder itself (no file is added to it: an empty folder stays empty,
a run folder holds only what a run writes). The kernel releases it when its holder ends, however it
ends, so the lock of a killed command is simply taken over. The holder is read from ``/proc/locks``
for the message. A process below the holder (torchrun's ranks under ``run --workers``, a sweep's
worker processes, which run in folders the sweep has opened) may use the folder. Under torchrun,
rank 0 alone locks (the other ranks use the folder with it).

Locks are taken only inside :func:`folders_locked` (the command line opens it around every
command, :func:`python_algos.runfolder.folder.unused_claims_removed`), and released when it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator, Optional

__all__ = ["FolderInUseError", "folders_locked", "lock_folder"]

_held: dict = {}  # (st_dev, st_ino) -> the folder's descriptor, holding its lock
_depth = [0]  # folders_locked blocks open


class FolderInUseError(ValueError):
    """Another command holds the folder's lock (a ValueError, as the run folders' own errors are)."""


@contextlib.contextmanager
def folders_locked() -> Iterator[None]:
    """Within the block, :func:`lock_folder` locks; when the outermost block ends, the locks go."""
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if _depth[0] == 0:
            for fd in _held.values():
                os.close(fd)
            _held.clear()


def lock_folder(path: str) -> None:
    """Lock the folder ``path`` for this command (nothing if it does not exist yet, or outside
    :func:`folders_locked`); :class:`FolderInUseError` if another command holds it."""
    if _depth[0] == 0 or (os.environ.get("WORLD_SIZE") and os.environ.get("RANK", "0") != "0"):
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) in _held:
        os.close(fd)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = _holder(st)
        if holder is not None and holder in _ancestors():
            return  # the command this process runs for holds it
        raise FolderInUseError(f"{path} is in use by another command ({_describe(holder)}); nothing was changed: "
                               f"wait until it ends or stop it, or choose another --out") from None
    _held[(st.st_dev, st.st_ino)] = fd


def _holder(st: os.stat_result) -> Optional[int]:
    """The pid holding an flock on the file of ``st`` (from /proc/locks), or None if unknown."""
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    same_inode = []
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue
        if fields[5] == dev:
            return int(fields[4])
        if fields[5].rsplit(":", 1)[-1] == str(st.st_ino):  # a file system that reports another device
            same_inode.append(int(fields[4]))
    return same_inode[0] if len(same_inode) == 1 else None


def _ancestors() -> set:
    """The pids above this process (its parent, the parent's parent, ...), from /proc."""
    out, pid = set(), os.getppid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _describe(pid: Optional[int]) -> str:
    if pid is None:
        return "a process this one cannot see"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = " ".join(f.read().decode(errors="replace").replace("\0", " ").split())  # one line
    except OSError:
        cmd = ""
    return f"pid {pid}" + (f": {cmd[:200]}" if cmd else "")
