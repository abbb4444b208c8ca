"""Signals for the tests' subprocesses."""

import signal


def sigint_as_in_a_terminal():
    """``preexec_fn`` giving the child the SIGINT a terminal gives it. A job started with `&` from a
    script (as CI may start the tests) inherits SIGINT *ignored*, and Python keeps it ignored, so a
    test's Ctrl-C would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
