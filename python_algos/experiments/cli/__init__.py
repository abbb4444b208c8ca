"""The command line: ``python -m python_algos`` (or the installed ``fedkernels`` command).

- :mod:`.parser`: the subcommands, flags and argument types (what ``--help`` prints);
- :mod:`.options`: each command's typed, frozen options, read once from the parsed flags;
- :mod:`.settings`: config files merged with the flags, output folders, the resume flag checks;
- :mod:`.commands`: ``main`` and the subcommands ``run``, ``compare``, ``demo``, ``plot``, ``algorithms``;
- :mod:`.research`: several seeds of ``run`` / ``compare``, and ``sweep`` (grid or Optuna).
"""

from .commands import main
from .parser import DEMO_ALGORITHMS, build_parser

__all__ = ["main", "build_parser", "DEMO_ALGORITHMS"]
