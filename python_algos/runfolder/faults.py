"""Test hooks that kill the process at a chosen write point (crash-consistency tests only).

Every place where a run-folder file or a checkpoint is written calls ``point(name)``.
With the environment variable ``_FEDKERNELS_TEST_KILL_AT_POINT=n`` the n-th call SIGKILLs the
process, so a test can stop a real run in the middle of a checkpoint write or a metrics line
and check that ``run --resume`` still reaches the bit-identical result. In-process tests
replace :func:`point` instead. Without the variable a call costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["point", "KILL_POINT_ENV"]

KILL_POINT_ENV = "_FEDKERNELS_TEST_KILL_AT_POINT"
_calls = [0]


def point(name: str) -> None:
    """A write point called ``name`` (e.g. ``"checkpoint write"``, ``"metrics append"``)."""
    target = os.environ.get(KILL_POINT_ENV)
    if not target:
        return
    _calls[0] += 1
    if _calls[0] == int(target):
        os.kill(os.getpid(), signal.SIGKILL)
