"""One record of each kind (issue 26, item 1): the summary.json, model.pt and metrics rows of a
command-line run and of ``History.save`` come from one builder each, so they carry the same keys
with the same meaning. Ground truth: the folder's own metrics.jsonl read line by line, and the
History that was saved."""

import json
import os

import pytest
import torch

from python_algos.experiments.config import Config
from python_algos.experiments.run import run_experiment
from python_algos.runfolder.records import STATUSES, summary_record
from python_algos.simulate import History

TINY = {"algorithm": "fedcanon", "dataset": "sparse_logistic", "data_opts": {"n": 80, "dim": 6, "nnz": 2},
        "num_clients": 3, "lr": 0.1, "local_steps": 2, "rounds": 3, "batch_size": None, "reg": "l1",
        "reg_strength": 0.01, "checkpoint_every": 1, "dtype": "float64", "metrics_every": 2}
SHARED = {"label", "algorithm", "hparams", "status", "message", "rounds", "rounds_done", "final", "initial",
          "elapsed", "regularizer", "num_clients", "dim", "executor", "out_dir", "resume_command"}


def quiet(*a, **k):
    pass


def lines(path) -> list:
    with open(os.path.join(path, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def summary(path) -> dict:
    with open(os.path.join(path, "summary.json")) as f:
        return json.load(f)


def test_run_and_history_save_write_the_same_records(tmp_path):
    run_dir, api_dir = str(tmp_path / "run"), str(tmp_path / "api")
    run_experiment(Config.from_dict(TINY), run_dir, progress=False, log=quiet)
    hist = History.load(run_dir)
    hist.save(api_dir)
    for d in (run_dir, api_dir):
        s, rows = summary(d), lines(d)
        assert SHARED <= set(s), SHARED - set(s)
        assert s["status"] == "completed" and s["rounds_done"] == rows[-1]["round"] == 3
        assert s["initial"] == rows[0]
        # metrics every 2 rounds: round 3 (the last) is evaluated, so it is the final one
        assert s["final"] == rows[-1] and "f+h" in rows[-1] and "f+h" not in rows[1]
        model = torch.load(os.path.join(d, "model.pt"), weights_only=True)
        assert model["round"] == 3 and torch.equal(model["params"], hist.params)
    assert [list(r)[:5] for r in lines(run_dir)[1:]] == [["round", "wall_time", "elapsed", "prox_time",
                                                          "prox_evals"]] * 3
    assert summary(run_dir)["resume_command"] and summary(api_dir)["resume_command"] is None


def test_a_summary_names_only_the_known_statuses():
    with pytest.raises(ValueError, match="status must be one of completed, diverged, interrupted, failed, stopped"):
        summary_record(label="x", algorithm="x", hparams={}, status="done", rows=[], rounds=1, regularizer=None,
                       num_clients=1, dim=1, executor="sequential", out_dir="x", resume_command=None)
    assert STATUSES == ("completed", "diverged", "interrupted", "failed", "stopped")
