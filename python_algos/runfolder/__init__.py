"""What a run leaves on disk and shows while it runs: the run-folder format, checkpoints, the progress display.

This is the bottom layer of :mod:`python_algos`: it imports nothing from the rest of the package, so
:func:`~python_algos.simulate.simulate` (``ShowProgress``, ``History.save`` / ``History.load``) and
the command line (:mod:`python_algos.experiments`) share one format and one look without the library
depending on the application.

A run folder holds:

=====================  ======================================================================
``config.json``        the settings of the run (the resolved ``Config`` of the command line; what
                       ``simulate`` knew plus ``"api_run": true`` for :meth:`History.save`), ``format_version``
``partition.json``     client sizes and per-client label histograms (command line only)
``metrics.jsonl``      one JSON object per round (round 0 = the starting point): §3 metrics,
                       timings, communication, test accuracy; non-finite numbers as null
``checkpoint.pt``      the last checkpoint (atomic; see :mod:`.checkpoint`; command line only)
``summary.json``       status (completed / diverged / interrupted), final metrics, totals,
                       the command that resumes the run
``model.pt``           the reported model: flat ``params``, the module's ``state_dict`` and its ``round``
``tensorboard/``       the TensorBoard events of ``metrics.jsonl`` (``--tensorboard``)
``overview.png`` ...   figures (``run`` / ``compare``; ``plot DIR``: ``<metric>_vs_round.png``, ...)
=====================  ======================================================================

Modules:

* :mod:`.folder` — which folder a run gets (a default one is created when named, so two commands
  never share one) and what of an earlier run a replacement removes (all of it: events, shards,
  figures; never a file no run writes);
* :mod:`.records` — one builder each for ``config.json``, ``partition.json``, a ``metrics.jsonl`` row,
  ``summary.json`` and ``model.pt``, used by every engine (one process, ``--flower``, ``History.save``);
* :mod:`.files` — the file names, atomic JSON / JSONL writes, appending and reading ``metrics.jsonl``;
* :mod:`.checkpoint` — the checkpoint file: atomic ``torch.save``, NamedTuple states, ``Checkpointer``;
* :mod:`.history` — a ``simulate`` result (History) as a run folder, and back;
* :mod:`.progress` — the progress bar / periodic lines of a run;
* :mod:`.callbacks` — the engine loop and its callbacks (checkpoint, metrics file, TensorBoard,
  progress, divergence, time budget), shared by ``simulate`` and the command line;
* :mod:`.faults` — the write points where crash-consistency tests kill the process.
"""
