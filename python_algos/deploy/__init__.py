"""Deployments of the server–client algorithms outside one process (top layer, beside ``experiments``).

:mod:`python_algos.deploy.nodes` holds what a deployed party runs, free of any framework: the
client sets of one node (its own data, one row) and of the server (no data), and the node's
program step. :mod:`python_algos.deploy.flower` wraps them as Flower apps (``flwr`` is imported
only there, lazily: ``pip install ".[flower]"``).
"""
