"""The example Flower app (examples/flower_app) as the deployment tests use it: its task module, its
run config, and its one-process reference (``simulate`` of the same task), shared by
tests/test_flower_deploy.py and tests/test_flower_netns.py."""

import os
import sys
import warnings

import tomllib

import python_algos as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(ROOT, "examples", "flower_app")


def task():
    sys.path.insert(0, APP)
    try:
        from pa_flower_app import task
    finally:
        sys.path.remove(APP)
    return task


def config(**over):
    with open(os.path.join(APP, "pyproject.toml"), "rb") as f:
        return {**tomllib.load(f)["tool"]["flwr"]["app"]["config"], **over}


def simulate(cfg):
    t = task()
    s = t.settings(cfg)
    data = [t.load_data(cfg)(i, None) for i in range(s["num_clients"])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pa.simulate(t.algorithm(cfg), t.model_fn(cfg)(), t.loss, data, s["rounds"], s["regularizer"],
                           batch_size=s["batch_size"], seed=s["seed"], clients_per_round=s["clients_per_round"],
                           metrics_every=0)
