"""``python -m python_algos``: the command line (see :mod:`python_algos.experiments.cli`); no arguments runs the
demo, ``python -m python_algos algorithms`` prints the algorithm table."""

import os
import sys

from .experiments.cli import main

try:
    sys.exit(main())
except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as other command-line tools do
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
    sys.exit(141)  # 128 + SIGPIPE, what a shell reports for a tool killed by a closed pipe
