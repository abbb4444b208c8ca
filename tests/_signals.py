"""Signals for the tests' subprocesses."""

import signal
import time


def sigint_as_in_a_terminal():
    """``preexec_fn`` giving the child the SIGINT a terminal gives it. A job started with `&` from a
    script (as CI may start the tests) inherits SIGINT *ignored*, and Python keeps it ignored, so a
    test's Ctrl-C would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_rows(metrics, proc, rows: int = 5, timeout: float = 120.0) -> None:
    """Wait until the run's ``metrics`` file (a ``pathlib.Path`` to metrics.jsonl) holds more than
    ``rows`` lines, so a signal sent next finds the run going; fails the test when ``proc`` ends first
    or after ``timeout`` seconds (a liveness bound, not a timing assumption)."""
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and len(metrics.read_text().splitlines()) > rows):
        assert time.monotonic() < deadline and proc.poll() is None, "the run did not get going"
        time.sleep(0.2)
