"""The experiment application on top of the library: command line, runs and comparisons, data sets and
partitions, models, launching on several processes, plots.

The top layer: nothing below it (:mod:`python_algos.runfolder`, :mod:`python_algos.clients`,
:mod:`python_algos.algorithms`, :mod:`python_algos.simulate`) imports from here. It turns a
configuration (flags or a file) into data, a model, a regularizer and a
:func:`~python_algos.simulate` call, and writes the run folder (whose format is
:mod:`python_algos.runfolder`'s).

* :mod:`.cli` — ``python -m python_algos``; :mod:`.config` — ``Config`` and the checks of its values;
* :mod:`.build` — a Config's data, model, algorithm and regularizer (:mod:`.regularizer_specs`:
  regularizers by name; :mod:`.losses`; :mod:`.device`);
* :mod:`.prepare` — every check of a run before anything is written (``prepare_run``);
* :mod:`.run` — one run into its folder (``run_experiment``, ``execute_run``); :mod:`.evaluation` — its
  ``eval_fn``; :mod:`.folders` — default folders, resume commands, ``config.json`` read back;
* :mod:`.compare` — several algorithms on one split, and the tables;
* :mod:`.launch` — torchrun ranks, ``--workers``, sharded checkpoints; :mod:`.threads` — the thread policy;
* :mod:`.data`, :mod:`.models`, :mod:`.plotting`.
"""
