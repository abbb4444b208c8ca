"""--time-budget SECONDS: a run stops after the first round that ends past the budget, with a checkpoint
of that round (summary status "stopped", exit status 0), and its folder resumes to the model an
uninterrupted run ends with, bit for bit (float64). Ground truth: the uninterrupted run, and the
engine's rounds counted against a fake clock."""

import json

import pytest
import torch
from torch import nn

from python_algos import simulate
from python_algos.algorithms import FedAvg
from python_algos.experiments.cli import main
from python_algos.runfolder.callbacks import Checkpoint, TimeBudget
from python_algos.runfolder.files import read_metrics
from python_algos.runfolder.records import load_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["--dataset", "sparse_logistic", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt", "nnz=3",
         "-N", "4", "-K", "2", "-T", "4", "--dtype", "float64", "--checkpoint-every", "0", "--no-progress",
         "--no-plot"]


def _summary(folder) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_a_spent_budget_stops_checkpointed_and_the_folder_resumes_to_the_uninterrupted_model(tmp_path, capsys):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["run", *SMALL, "--out", str(whole)]) == 0
    # a budget every round overruns: each invocation runs one round, checkpoints it (--checkpoint-every 0
    # would write none before the last round otherwise) and stops; config.json keeps the budget for a resume
    assert main(["run", *SMALL, "--time-budget", "1e-9", "--out", str(cut)]) == 0
    s = _summary(cut)
    assert (s["status"], s["rounds_done"], s["last_checkpoint_round"]) == ("stopped", 1, 1), s
    assert "--time-budget" in s["message"] and s["resume_command"] in s["message"], s["message"]
    assert load_model(str(cut))["round"] == 1
    for done in (2, 3, 4):
        assert main(["run", "--resume", str(cut), "--no-progress", "--no-plot"]) == 0
        assert _summary(cut)["rounds_done"] == done
    s = _summary(cut)
    assert s["status"] == "completed" and s["message"] is None, s
    assert [r["round"] for r in read_metrics(str(cut))] == [0, 1, 2, 3, 4]
    got, want = load_model(str(cut)), load_model(str(whole))
    assert got["params"].dtype == torch.float64 and torch.equal(got["params"], want["params"])
    capsys.readouterr()


def test_a_resume_may_change_the_budget(tmp_path, capsys):
    """--time-budget is accepted by `run --resume` (an execution setting): the resume runs under the
    new budget, and config.json records it, so a later resume keeps it."""
    out = tmp_path / "r"
    assert main(["run", *SMALL, "--time-budget", "1e-9", "--out", str(out)]) == 0
    assert _summary(out)["rounds_done"] == 1
    assert main(["run", "--resume", str(out), "--time-budget", "3600", "--no-progress", "--no-plot"]) == 0
    assert _summary(out)["status"] == "completed"
    assert json.loads((out / "config.json").read_text())["time_budget"] == 3600
    capsys.readouterr()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "abc"])
def test_a_bad_budget_names_the_flag(tmp_path, capsys, value):
    out = tmp_path / "r"
    try:
        rc = main(["run", *SMALL, "--time-budget", value, "--out", str(out)])
    except SystemExit as e:  # a text that is no number: argparse's usage error
        rc = e.code
    err = capsys.readouterr().err
    assert rc in (1, 2) and f"error: --time-budget {value}: must be a" in err, err
    assert not out.exists()


def test_a_bad_budget_in_a_config_file_names_the_key(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("time_budget = -2.5\n")
    out = tmp_path / "r"
    assert main(["run", "--config", str(cfg), *SMALL, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {cfg}: time_budget = -2.5: must be a finite number > 0"), err
    assert not out.exists()


def _problem():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (8,), generator=g))
            for _ in range(2)]


def test_the_round_a_budget_stops_on_is_checkpointed_and_the_last_round_is_no_stop():
    """Callback level: the clock reads 0 at the start and one more "second" per round, so a budget of
    2.5 s is spent at round 3, which is checkpointed (checkpoint_every=0: else only round 0); a budget
    spent at the run's last round is no stop."""
    for rounds, stops_at in ((10, 3), (3, None)):
        clock = iter(float(s) for s in range(100))
        budget = TimeBudget(2.5, clock=lambda c=clock: next(c))
        saved = []
        torch.manual_seed(0)
        hist = simulate(FedAvg(lr_local=0.1, local_steps=1), nn.Linear(3, 2).double(), nn.functional.cross_entropy,
                        _problem(), rounds, metrics_every=0,
                        callbacks=[budget, Checkpoint(lambda snap, s=saved: s.append(snap["round"]))])
        assert len(hist.metrics) == (stops_at or rounds)
        assert saved == [0, stops_at or rounds]
        assert (budget.reason is None) == (stops_at is None), budget.reason


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), True, "5"])
def test_time_budget_refuses_a_bad_number(seconds):
    with pytest.raises(ValueError, match="seconds must be a finite number > 0"):
        TimeBudget(seconds)


def test_flower_refuses_a_budget_it_would_not_keep(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--flower", *SMALL, "-a", "fedavg", "--time-budget", "5", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --time-budget 5: --flower has no time budget"), err
    assert not out.exists()
