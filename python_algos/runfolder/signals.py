"""Termination signals handled like Ctrl-C, so every command has one way to stop.

A command's interrupt path (close the run folder as ``interrupted``, end every process it started,
print how to resume) is written for ``KeyboardInterrupt``. ``kill PID`` (SIGTERM), a closed
terminal or ssh session (SIGHUP) and a batch scheduler's time limit (SIGTERM) must take the same
path: by default Python dies on them at once, leaving child processes running and the folder
without a summary. Inside :func:`terminate_as_interrupt` they raise :class:`Terminated`, a
``KeyboardInterrupt``, in the main thread. A stop signal that comes within :data:`REPEAT_WINDOW`
seconds of the one that stopped the command is the same stop (Ctrl-C pressed two or three times):
it is dropped, so it cannot cut short the summary and resume hint that the first one leads to; one
that comes later stops the stopping. :func:`stop_signals_held` holds them for work that a stop
must not cut in two (a file's write, ending the child processes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Iterator

__all__ = ["Terminated", "terminate_as_interrupt", "STOP_SIGNALS", "HELD_SIGNALS", "exit_code", "signal_of",
           "stop_signals_held", "REPEAT_WINDOW"]

# the signals that stop a command; SIGINT keeps Python's own handler (KeyboardInterrupt)
STOP_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)
HELD_SIGNALS = (signal.SIGINT, *STOP_SIGNALS)
REPEAT_WINDOW = 1.0  # seconds after a stop in which another stop signal is the same stop
_stopped_at: list = []  # when a stop signal last raised here (time.monotonic)


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
    now = time.monotonic()
    if _stopped_at and now - _stopped_at[-1] < REPEAT_WINDOW:
        return  # the same stop, pressed again: the first one's KeyboardInterrupt is being handled
    _stopped_at[:] = [now]
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Terminated` and Ctrl-C KeyboardInterrupt in
    the main thread, once per stop (module docstring). A signal the process was told to ignore
    (``nohup`` ignores SIGHUP) stays ignored, and so does a SIGINT handler set by someone else.
    Outside the main thread (where Python cannot install handlers) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    _stopped_at.clear()  # a new command: no stop yet
    for s in HELD_SIGNALS:
        old = signal.getsignal(s)
        if old is signal.SIG_IGN or (s == signal.SIGINT and old is not signal.default_int_handler):
            continue
        previous[s] = old
        signal.signal(s, _raise)
    try:
        yield
    finally:
        if _stopped_at:  # the stop's repeats still arriving must not end the process after its summary
            time.sleep(max(0.0, REPEAT_WINDOW - (time.monotonic() - _stopped_at[-1])))
        for s, old in previous.items():
            signal.signal(s, old)


@contextlib.contextmanager
def stop_signals_held():
    """Hold SIGINT, SIGTERM and SIGHUP while the block runs, then act on the first that came as it
    would have: a write that a KeyboardInterrupt (or a default SIGTERM death) cut in two would leave
    a broken file behind, and torch reports a half-written zip as an unrelated error; ending child
    processes halfway would leave some running. A signal with a Python handler gets it called; one
    with the default action is sent again once the handler is back (the process then ends as it
    would have, after the block); an ignored signal stays ignored. Only the main thread can swap
    signal handlers; elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list = []
    previous = {}
    for s in HELD_SIGNALS:
        old = signal.getsignal(s)
        if old is signal.SIG_IGN or old is None:  # ignored, or set outside Python: left as it is
            continue
        previous[s] = old
        signal.signal(s, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
        if held:
            signum, frame = held[0]
            old = previous[signum]
            if callable(old):
                old(signum, frame)  # e.g. Python's Ctrl-C handler raises KeyboardInterrupt here
            else:  # SIG_DFL: what the signal would have done, now that the work is whole
                os.kill(os.getpid(), signum)
