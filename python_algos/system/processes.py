"""Child processes that end with the command that started them, however it ends: the one place
that starts, signals and reaps them (sweep workers, torchrun and its ranks, Flower's SuperLink,
SuperNodes and apps).

* :func:`spawn` starts a program in a process group of its own (a stop reaches it and what it
  started in that group, never the terminal's other jobs), with ``PR_SET_PDEATHSIG``: the kernel
  SIGKILLs it when the thread that started it dies (SIGKILL, an out-of-memory kill, a closed
  terminal), and it refuses to start when its parent is already gone.
* Every child carries the command's token in its environment (:data:`MARKER_ENV`), and so does
  every process below it, those that left its group included (torchrun's ranks, Flower's apps).
* A watcher (:mod:`.lifeline`, one per command, in a session of its own) reads a pipe that only
  the command holds open, so it sees the command end however it ends (PDEATHSIG reaches only the
  direct children, and follows the thread that forked): it then kills every process carrying the
  token and removes the command's temporary folders (:func:`temp_dir`). A temporary folder whose
  owner died with its watcher is removed by the next :func:`temp_dir` of that prefix.
* :func:`stop_all` is the one way to stop children: a signal to each group, SIGKILL to the group
  and to every process carrying the child's token after a grace period, then the reaping.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import glob
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional, Sequence

from . import lifeline
from .lifeline import MARKER_ENV

__all__ = ["Child", "spawn", "stop_all", "supervise", "temp_dir", "die_with_parent", "marked_processes",
           "MARKER_ENV"]

_PR_SET_PDEATHSIG = 1
_lock = threading.Lock()
_watch: dict = {}  # this process's watcher: {"pid": owner pid, "token", "proc", "fd": the pipe's write end}


def _prctl():
    """libc's ``prctl`` (Linux), resolved before any fork: a child between fork and exec may not load
    a library; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def die_with_parent(parent: int) -> None:
    """In a child: be SIGKILLed when the thread that started it dies; exit at once when ``parent``
    is already gone (it died before the request took effect)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def supervise() -> str:
    """This command's token, starting its watcher on the first call: every process started after
    this (by :func:`spawn`, ``multiprocessing`` or anything else) carries the token and is killed
    when the command ends."""
    with _lock:
        if _watch.get("pid") == os.getpid():
            return _watch["token"]
        token = f"{os.getpid()}-{secrets.token_hex(4)}"
        r, w = os.pipe()  # both ends non-inheritable: no other child holds the write end open
        try:
            proc = subprocess.Popen([sys.executable, lifeline.__file__, token, str(os.getpid())], stdin=r,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                    close_fds=True)
        finally:
            os.close(r)
        _watch.update(pid=os.getpid(), token=token, proc=proc, fd=w)
        os.environ[MARKER_ENV] = ":".join(filter(None, [os.environ.get(MARKER_ENV), token]))
        atexit.register(_end_watch)
        return token


def _end_watch() -> None:
    """At a normal exit: close the lifeline and wait for the watcher's last look, so that no process
    of this command (the watcher included) outlives it."""
    if _watch.get("pid") == os.getpid():
        os.close(_watch["fd"])
        with contextlib.suppress(subprocess.TimeoutExpired):
            _watch["proc"].wait(timeout=30)


def temp_dir(prefix: str) -> str:
    """A new temporary folder ``<tmp>/<prefix><pid>-XXXX``, owner-only, removed by the watcher if this
    command dies before removing it; folders of this prefix left by dead processes are removed."""
    supervise()
    base = tempfile.gettempdir()
    for old in glob.glob(os.path.join(glob.escape(base), glob.escape(prefix) + "*")):
        owner = os.path.basename(old)[len(prefix):].split("-", 1)[0]
        with contextlib.suppress(OSError, ValueError):
            if os.stat(old).st_uid == os.getuid() and not _alive(int(owner)):
                shutil.rmtree(old, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")  # mode 0700
    os.write(_watch["fd"], b"dir " + os.fsencode(path) + b"\n")
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def marked_processes(token: str) -> list:
    """Live processes whose environment carries ``token`` (:data:`MARKER_ENV`)."""
    return lifeline.marked(token, exclude={os.getpid()})


class Child:
    """One started program: ``popen`` (its :class:`subprocess.Popen`) and ``token``, which every
    process below it carries."""

    def __init__(self, popen: subprocess.Popen, token: str):
        self.popen, self.token = popen, token
        self.pid, self.args = popen.pid, popen.args

    @property
    def returncode(self) -> Optional[int]:
        return self.popen.returncode

    def poll(self) -> Optional[int]:
        return self.popen.poll()

    def wait(self, timeout: Optional[float] = None) -> int:
        return self.popen.wait(timeout)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to its process group (nothing if it has ended)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL its group and every process below it (those in other groups too), then reap it."""
        self.signal(signal.SIGKILL)
        lifeline.kill_marked(self.token)
        self.popen.wait()


def spawn(args: Sequence[str], *, env: Optional[dict] = None, cwd: Optional[str] = None, stdout=None,
          stderr=None) -> Child:
    """Start ``args`` as a :class:`Child` of this command (module docstring): its own process group,
    PDEATHSIG, the command's token and one of its own in its environment."""
    chain = supervise()
    token = f"{chain}.{secrets.token_hex(4)}"
    env = dict(os.environ if env is None else env)
    env[MARKER_ENV] = ":".join(filter(None, [os.environ.get(MARKER_ENV), token]))
    parent = os.getpid()
    popen = subprocess.Popen(list(args), env=env, cwd=cwd, stdout=stdout, stderr=stderr, start_new_session=True,
                             preexec_fn=lambda: die_with_parent(parent))
    return Child(popen, token)


def stop_all(children: Sequence[Child], sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Send ``sig`` to every child's group, wait up to ``grace`` seconds for them all, then kill each
    with everything below it (:meth:`Child.kill`). A KeyboardInterrupt while waiting skips the
    rest of the grace: the children are killed, and it is raised again."""
    for c in children:
        c.signal(sig)
    deadline = time.monotonic() + grace
    try:
        for c in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.wait(timeout=max(0.05, deadline - time.monotonic()))
    finally:
        for c in children:
            c.kill()
