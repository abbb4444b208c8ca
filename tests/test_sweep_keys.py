"""Sweep keys mean one thing, and every point has its own folder.

`eta` is both a run setting (the Dirichlet concentration, --eta) and the step η of FedNMap, ZA1,
FedDR and FedADMM: a bare `--grid eta=...` with such an algorithm is refused (naming both meanings
and the qualified spellings); `fednmap.eta=...` varies the algorithm's step, `run.eta=...` the run
setting. A swept run setting gets its flag's checks (`lr=-1` as `--lr -1`; `run.eta` under
`--partition iid`, which no run reads), before anything is written. Grid values that print alike to
6 digits (0.5 and 0.5000001) get distinct folders; the same value twice (1 and 1.0) is refused.

Ground truth: a plain `run` of the same settings (its final model must equal the sweep point's, bit
for bit), and the folder left absent after a refused command."""

import json
import os

import pytest
import torch
from test_run_folders import TINY, params_of

from python_algos.experiments.cli import main
from python_algos.experiments.sweep import parse_grid_values

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.usefixtures("one_torch_thread")]

try:
    import optuna  # noqa: F401

    HAVE_OPTUNA = True
except ImportError:
    HAVE_OPTUNA = False


def _config(tmp_path, **kw):
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps({**TINY, "rounds": 2, "checkpoint_every": 0, **kw}))
    return str(p)


def _sweep(tmp_path, out, *args):
    return main(["sweep", *args, "--config", _config(tmp_path), "--out", str(out), "--no-progress", "--no-plot"])


@pytest.mark.parametrize("algorithm", ["fednmap", "za1", "feddr", "fedadmm"])
def test_bare_eta_with_an_algorithm_that_has_a_step_eta_is_refused_naming_both_meanings(tmp_path, capsys, algorithm):
    out = tmp_path / "s"
    assert _sweep(tmp_path, out, "-a", algorithm, "--grid", "eta=0.05,0.2") == 1
    err = capsys.readouterr().err
    assert "--grid eta" in err and "ambiguous" in err and "--eta" in err, err
    assert f"{algorithm}.eta=" in err and "run.eta=" in err, err
    assert not out.exists()


@pytest.mark.skipif(not HAVE_OPTUNA, reason="needs optuna")
def test_bare_eta_in_an_optuna_space_is_refused_too(tmp_path, capsys):
    out = tmp_path / "s"
    assert _sweep(tmp_path, out, "-a", "fednmap", "--optuna", "2", "--space", "eta=log:0.01:0.1") == 1
    err = capsys.readouterr().err
    assert "--space eta" in err and "fednmap.eta=" in err and "run.eta=" in err, err
    assert not out.exists()


def test_qualified_eta_varies_the_algorithms_step_as_run_with_alg_opt_does(tmp_path):
    out = tmp_path / "s"
    assert _sweep(tmp_path, out, "-a", "fednmap", "--grid", "fednmap.eta=0.05,0.2") == 0
    runs = {}
    for eta in ("0.05", "0.2"):
        d = tmp_path / f"run-{eta}"
        assert main(["run", "-a", "fednmap", "--alg-opt", f"eta={eta}", "--config", _config(tmp_path),
                     "--out", str(d), "--no-progress", "--no-plot"]) == 0
        runs[eta] = params_of(d)
    assert not torch.equal(runs["0.05"], runs["0.2"])  # the step matters: the points must differ
    for eta, ref in runs.items():
        point = out / "fednmap" / f"fednmap.eta={eta}" / "seed-0"
        assert torch.equal(params_of(point), ref), eta


def test_qualified_run_eta_is_the_dirichlet_concentration_and_is_refused_where_no_partition_reads_it(tmp_path,
                                                                                                      capsys):
    out = tmp_path / "s"
    assert _sweep(tmp_path, out, "-a", "fednmap", "--grid", "run.eta=0.1,1") == 1  # the partition is iid
    err = capsys.readouterr().err
    assert "--grid run.eta=0.1" in err and "--partition dirichlet" in err, err
    assert not out.exists()
    assert _sweep(tmp_path, out, "-a", "fednmap", "--partition", "dirichlet", "--grid", "run.eta=0.1,1") == 0
    for eta in ("0.1", "1"):
        cfg = json.load(open(out / "fednmap" / f"run.eta={eta}" / "seed-0" / "config.json"))
        assert cfg["eta"] == float(eta) and "eta" not in cfg["alg_opts"]


@pytest.mark.parametrize("grid, shown", [("lr=0.1,-1", "--grid lr=-1"), ("local_steps=1,1.5", "--grid local_steps=1.5"),
                                         ("reg_strength=0.01,abc", "--grid reg_strength=abc")])
def test_a_swept_setting_gets_its_flags_checks_before_anything_is_written(tmp_path, capsys, grid, shown):
    out = tmp_path / "s"
    assert _sweep(tmp_path, out, "-a", "fedcanon", "--grid", grid) == 1
    err = capsys.readouterr().err
    assert shown in err, err
    assert not out.exists()


def test_values_that_print_alike_to_six_digits_get_their_own_folders_and_rows(tmp_path, capsys):
    out = tmp_path / "s"
    assert _sweep(tmp_path, out, "-a", "fedcanon", "--grid", "lr=0.5,0.5000001") == 0
    printed = capsys.readouterr().out
    assert sorted(os.listdir(out / "fedcanon")) == ["lr=0.5", "lr=0.5000001"]
    for lr in (0.5, 0.5000001):
        run = out / "fedcanon" / f"lr={lr!r}" / "seed-0"
        assert json.load(open(run / "config.json"))["lr"] == lr
    points = json.load(open(out / "summary.json"))["points"]
    assert sorted(p["name"] for p in points) == ["lr=0.5", "lr=0.5000001"]
    assert "lr=0.5000001" in printed


def test_the_same_value_twice_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"--grid local_steps=1,1.0: a value is repeated \(1 and 1.0"):
        parse_grid_values("local_steps", "1,1.0")
    out = tmp_path / "s"
    assert _sweep(tmp_path, out, "-a", "fedcanon", "--grid", "lr=1,1.0") == 1
    assert "a value is repeated" in capsys.readouterr().err and not out.exists()


def test_a_key_and_its_qualified_form_together_are_refused():
    from python_algos.experiments.sweep import check_keys

    with pytest.raises(ValueError, match=r"--grid lr and --grid run.lr: both set fedcanon's lr"):
        check_keys(["lr", "run.lr"], ["fedcanon"])
    with pytest.raises(ValueError, match=r"--space fedcanon.eta: fedcanon has no hyper-parameter eta"):
        check_keys(["fedcanon.eta"], ["fedcanon"], "--space")
    with pytest.raises(ValueError, match=r"--grid fedavg.alpha: fedavg is not one of the swept algorithms"):
        check_keys(["fedavg.alpha"], ["fedcanon"])
    check_keys(["lr", "local_steps"], ["scaffnew"])  # scaffnew's lr and every K are set by the run settings
