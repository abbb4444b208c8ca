"""The experiment application on top of the library: command line, runner, data sets and
partitions, models, checkpoints, progress lines and plots.

Nothing in :mod:`python_algos.algorithms` or :mod:`python_algos.clients` imports from here; this
layer turns a configuration (flags or a file) into data, a model, a regularizer and a
:func:`~python_algos.simulate` call, and writes the run folder.
"""
