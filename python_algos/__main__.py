"""``python -m python_algos``: the command line (see :mod:`python_algos.experiments.cli`); no arguments runs the
demo, ``python -m python_algos algorithms`` prints the algorithm table."""

import sys

from .experiments.cli import main

sys.exit(main())
