"""The watcher of one command's children, run as a script by :mod:`.processes` (it imports nothing of
the package: a process start costs no torch import).

    python lifeline.py TOKEN PARENT_PID        # stdin: the lifeline pipe, held open by PARENT_PID alone

Stdin is read until it closes, which happens when the command ends, however it ends (the kernel
closes a dead process's files: SIGKILL and out-of-memory kills included). A line ``dir PATH`` names
a temporary folder of the command. Then every process whose environment carries ``TOKEN`` in
:data:`MARKER_ENV` is killed (looked for again until none is left: one started meanwhile is caught
by the next look), and the folders are removed. The watcher sits in a session of its own and ignores
Ctrl-C, SIGTERM and SIGHUP: what stops the command must not stop the cleanup after it.
"""

import glob
import os
import shutil
import signal
import sys
import time

MARKER_ENV = "FEDKERNELS_SUPERVISORS"  # ':'-separated tokens: the commands (and children) above a process


def marked(token: str, exclude=()) -> list:
    """Live processes whose :data:`MARKER_ENV` holds ``token`` (Linux: read from /proc; elsewhere none)."""
    found, key = [], MARKER_ENV.encode() + b"="
    for env in glob.glob("/proc/[0-9]*/environ"):
        pid = int(env.split("/")[2])
        if pid in exclude:
            continue
        try:
            with open(env, "rb") as f:
                entries = f.read().split(b"\0")
            value = next((e[len(key):] for e in entries if e.startswith(key)), None)
            if value is None or token.encode() not in value.split(b":"):
                continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":  # a zombie has ended already
                    found.append(pid)
        except (OSError, IndexError):
            continue
    return found


def kill_marked(token: str, timeout: float = 10.0, exclude=()) -> None:
    """SIGKILL every process marked with ``token`` until none is left (or ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    exclude = {os.getpid(), *exclude}
    while (pids := marked(token, exclude)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)


def main(token: str, parent: int) -> None:
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    dirs = []
    for line in sys.stdin.buffer:  # until the command's end closes the pipe
        if line.startswith(b"dir "):
            dirs.append(os.fsdecode(line[4:].rstrip(b"\n")))
    kill_marked(token, timeout=30.0, exclude={parent})
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
