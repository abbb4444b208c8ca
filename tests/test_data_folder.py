"""Federated standardisation (``--standardize``, issue 38 item 2) and the data-set options derived from
the generators' signatures (issue 36 item 7).

Ground truth: numpy's pooled / per-client statistics in float64, ``inspect.signature`` of the
generators, and options written here."""

from __future__ import annotations

import inspect
import json
import os
from typing import Annotated

import numpy as np
import pytest
import torch

from python_algos.data import check_data_options, standardize, synthetic
from python_algos.data.datasets import DATA_OPTIONS, MAKERS
from python_algos.data.options import Opt, options_of
from python_algos.experiments.build import prepare_data
from python_algos.experiments.cli import main
from python_algos.experiments.config import Config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COLUMNS = ["age", "bmi", "chol", "x4", "outcome"]


def _hospitals(folder, k=6, seed=0, test=True):
    """``k`` CSV files (with a header, the label in column ``outcome``), label-skewed and on very
    different scales; ``test/`` with 6 rows per client. Returns {name: (X, y)} of the training files."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder / "test", exist_ok=True)
    w, data = rng.normal(size=4), {}
    for i in range(k):
        n = 20 + 5 * i
        X = rng.normal(loc=i, scale=1 + i, size=(n + 6, 4)) * [1.0, 10.0, 100.0, 0.1] + [50, 0, 200, 0]
        y = ((X - X.mean(0)) / X.std(0) @ w + rng.normal(size=n + 6) > 0.3 * (i - 2)).astype(int)
        for where, rows in ((folder, slice(0, n)), (folder / "test", slice(n, n + 6))):
            if where == folder / "test" and not test:
                continue
            lines = [",".join(COLUMNS)] + [",".join(repr(float(v)) for v in x) + f",{c}" for x, c in zip(X[rows],
                                                                                                     y[rows])]
            (where / f"site{i}.csv").write_text("\n".join(lines) + "\n")
        data[f"site{i}"] = (X[:n], y[:n])
    if not test:
        os.rmdir(folder / "test")
    return data


# --- issue 36 item 7: the options are the generators' parameters ------------------------------------- #

def _gen(k: Annotated[int, Opt(2, 9, "things")] = 3, rate: float = 0.5, on: bool = True, seed: int = 0):
    return k


def test_each_data_sets_options_are_its_generators_parameters():
    for name, (fn, hidden) in MAKERS.items():
        params = {k: p.default for k, p in inspect.signature(fn).parameters.items()
                  if k not in (*hidden, "seed") and p.kind is p.POSITIONAL_OR_KEYWORD}
        assert {k: o.default for k, o in DATA_OPTIONS[name].items()} == params, name
    assert "n" in DATA_OPTIONS["sparse_logistic"] and "task" not in DATA_OPTIONS["sparse_logistic"]

    opts = options_of(_gen)
    assert set(opts) == {"k", "rate", "on"}  # a new parameter is an option, with no table to update
    assert opts["k"].rule_broken("k", 10) == "k must be an integer in [2, 9] (things), got 10"
    assert opts["rate"].rule_broken("rate", "x") == "rate must be a finite number, got 'x'"
    assert opts["on"].rule_broken("on", 1) == "on must be true or false"


def test_a_bad_option_is_named_with_its_rule_before_anything_runs(tmp_path, capsys):
    assert check_data_options("image_like", {"shape": [1, 8]}) == (
        "shape", "shape must be a list of 3 integers in [1, 4096] (channels, height, width), got [1, 8]")
    assert check_data_options("synthetic", {"samples": None}) is None  # Optional: null allowed
    assert check_data_options("synthetic", {"num_classes": 1})[0] == "num_classes"
    assert main(["run", "--dataset", "image_like", "--data-opt", "modes=0", "--out", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err == ("error: --data-opt modes=0: modes must be an integer in [1, 2147483647] "
                                       "(prototypes per class), got 0\n")
    assert not (tmp_path / "r").exists()
    # the defaults the size check uses are the signature's: synthetic's 30 clients x 2000 x dim
    assert check_data_options("synthetic", {"dim": 40_000})[1].startswith("synthetic would generate 2,400,000,000")
    assert synthetic.fedprox_synthetic.__defaults__[2:4] == (30, 60)


# --- item 2: standardisation --------------------------------------------------------------------------- #

def test_standardize_equals_pooled_and_per_client_numpy_statistics():
    rng = np.random.default_rng(1)
    clients = [(torch.from_numpy(rng.normal(1e4 + i, 1 + 3 * i, size=(5 + 7 * i, 3))), torch.zeros(5 + 7 * i))
               for i in range(4)]
    clients[2][0][:, 1] = 7.0  # constant within a client: local leaves it centred, unscaled
    pooled = np.concatenate([X.numpy() for X, _ in clients])
    got, test = standardize(clients, "global", test=(clients[0][0][:2], torch.zeros(2)))
    mean, std = pooled.mean(0), pooled.std(0)
    for (X, _), (Z, _) in zip(clients, got):
        np.testing.assert_allclose(Z.numpy(), (X.numpy() - mean) / std, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(test[0].numpy(), (clients[0][0][:2].numpy() - mean) / std, rtol=1e-10, atol=1e-10)
    for (X, _), (Z, _) in zip(clients, standardize(clients, "local")):
        s = X.numpy().std(0)
        np.testing.assert_allclose(Z.numpy(), (X.numpy() - X.numpy().mean(0)) / np.where(s > 0, s, 1), atol=1e-9)
    assert standardize(clients, "none")[1][0] is clients[1][0]
    with pytest.raises(ValueError, match="a pooled test set's rows belong to no client"):
        standardize(clients, "local", test=(clients[0][0], None))
    with pytest.raises(ValueError, match="standardize mode must be one of global, local, none"):
        standardize(clients, "pooled")


def test_standardize_from_the_command_line_is_the_pooled_scaling_and_recorded(tmp_path, capsys):
    base = dict(dataset="sparse_logistic", data_opts={"n": 200, "dim": 5, "nnz": 2, "num_groups": 4, "shift": 3.0},
                num_clients=4, partition="natural")
    raw, fed = prepare_data(Config(**base)), prepare_data(Config(**base, standardize="global"))
    pooled = torch.cat([X for X, _ in raw.clients]).double().numpy()
    mean, std = pooled.mean(0), pooled.std(0)
    for (X, _), (Z, _) in zip(raw.clients, fed.clients):
        np.testing.assert_allclose(Z.numpy(), (X.double().numpy() - mean) / std, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fed.dataset.X_test.numpy(), (raw.dataset.X_test.double().numpy() - mean) / std,
                               rtol=1e-6, atol=1e-6)
    assert raw.dataset.source in fed.dataset.source and "standardized global" in fed.dataset.source
    out = tmp_path / "r"
    flags = ["run", "--data-opt", "n=200", "--data-opt", "dim=5", "--data-opt", "nnz=2", "-T", "1", "--no-plot",
             "--out", str(out)]
    assert main([*flags, "--standardize", "local"]) == 1
    assert capsys.readouterr().err.startswith("error: --standardize local: 'local' scales each client by its own "
                                              "statistics, and the test rows of sparse_logistic belong to no client")
    assert not out.exists()
    assert main([*flags, "--standardize", "global", "--no-progress"]) == 0
    assert "standardized global (pooled statistics" in json.loads((out / "summary.json").read_text())["dataset"]
    assert json.loads((out / "config.json").read_text())["standardize"] == "global"
