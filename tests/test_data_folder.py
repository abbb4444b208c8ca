"""The data-set options derived from the generators' signatures (issue 36 item 7).

Ground truth: ``inspect.signature`` of the generators and loaders, and options written here."""

from __future__ import annotations

import inspect
from typing import Annotated

from python_algos.experiments.cli import main
from python_algos.experiments.data import check_data_options, synthetic
from python_algos.experiments.data.datasets import DATA_OPTIONS, MAKERS
from python_algos.experiments.data.options import Opt, options_of

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
