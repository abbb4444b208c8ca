"""Termination signals handled like Ctrl-C, so every command has one way to stop.

A command's interrupt path (close the run folder as ``interrupted``, end every process it started,
print how to resume) is written for ``KeyboardInterrupt``. ``kill PID`` (SIGTERM), a closed
terminal or ssh session (SIGHUP) and a batch scheduler's time limit (SIGTERM) must take the same
path: by default Python dies on them at once, leaving child processes running and the folder
without a summary. Inside :func:`terminate_as_interrupt` they raise :class:`Terminated`, a
``KeyboardInterrupt``, in the main thread.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

__all__ = ["Terminated", "terminate_as_interrupt", "STOP_SIGNALS", "exit_code", "signal_of"]

# the signals that stop a command; SIGINT keeps Python's own handler (KeyboardInterrupt)
STOP_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)


class Terminated(KeyboardInterrupt):
    """A stop signal other than SIGINT arrived; ``signum`` says which."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(signal.Signals(signum).name)


def signal_of(exc: BaseException) -> int:
    """The signal that stopped a command with ``exc``: the one ``exc`` kept (``signum``: a
    :class:`Terminated`, or an exception that recorded it), else that of the exception it was raised
    from (``raise Interrupted(...) from stop``), else SIGINT (Ctrl-C, Python's KeyboardInterrupt)."""
    while exc is not None:
        signum = getattr(exc, "signum", None)
        if signum is not None:
            return int(signum)
        exc = exc.__cause__
    return int(signal.SIGINT)


def exit_code(exc: BaseException) -> int:
    """The shell's exit status for a command stopped by ``exc``: 128 + :func:`signal_of`."""
    return 128 + signal_of(exc)


def _raise(signum, _frame):
    raise Terminated(signum)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Terminated` in the main thread. A signal
    the process was told to ignore (``nohup`` ignores SIGHUP) stays ignored. Outside the main
    thread (where Python cannot install handlers) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for s in STOP_SIGNALS:
        old = signal.getsignal(s)
        if old is signal.SIG_IGN:
            continue
        previous[s] = old
        signal.signal(s, _raise)
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
