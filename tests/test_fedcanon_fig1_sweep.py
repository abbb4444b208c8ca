"""The FedCanon Fig. 1 sweep config (examples/sweeps/fedcanon_fig1.toml), which examples/RESULTS.md
reports over 3 seeds, run for 2 rounds on two points of each of the paper's slices: it runs on the
bundled A9A (the file's 32,561 rows, 20 % held out, a 2-class linear model of 2·123 + 2 parameters),
its seeds vary the initial model and keep the split, and examples/sweeps/plot_fedcanon.py draws both
of the paper's panels from its folder. Ground truth: the A9A file's published shape and the runs'
own records."""

import importlib.util
import json
import os

import pytest

from python_algos.experiments.cli import main

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.filterwarnings("ignore::UserWarning")]

CONFIG = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "sweeps", "fedcanon_fig1.toml")


def _read(path):
    with open(path) as f:
        return json.load(f)


def test_fig1_sweep_config_runs_on_a9a_and_draws_both_panels(tmp_path):
    out = str(tmp_path / "fig1")
    plot = importlib.util.find_spec("matplotlib") is not None
    # the paper's slices meet at (α, β) = (0.05, 0.02); one more value of each gives both panels two curves
    assert main(["sweep", "--config", CONFIG, "--grid", "alpha=0.05,0.1", "--grid", "beta=0.02,0.05",
                 "--seeds", "2", "-T", "2", "--out", out, "--no-progress", "--no-plot"]) == 0
    rec = _read(os.path.join(out, "sweep.json"))
    assert rec["config"]["dataset"] == "a9a" and rec["config"]["data_dir"] is None  # the bundled copy
    seeds = [os.path.join(out, "fedcanon", "alpha=0.05,beta=0.02", f"seed-{s}") for s in (0, 1)]
    runs = [_read(os.path.join(d, "summary.json")) for d in seeds]
    assert all(r["status"] == "completed" and r["dim"] == 2 * 123 + 2 for r in runs)
    parts = [_read(os.path.join(d, "partition.json")) for d in seeds]
    assert sum(parts[0]["sizes"]) == 32561 - 6512 and len(parts[0]["sizes"]) == 10  # 20 % of 32,561 held out
    assert parts[0] == parts[1]  # the seed keeps the data and the split ...
    assert runs[0]["initial"]["f"] != runs[1]["initial"]["f"]  # ... and draws another initial model
    if plot:
        from examples.sweeps import plot_fedcanon

        assert plot_fedcanon.main(["--fig1", out, "--out", str(tmp_path / "fig")]) == 0
        assert sorted(os.listdir(tmp_path / "fig")) == ["fedcanon_fig1_alpha.png", "fedcanon_fig1_beta.png"]
