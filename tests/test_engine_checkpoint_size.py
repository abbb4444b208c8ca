"""Defect 10: a checkpoint holds the state of its round, O(N·d), not the history of the run.

Before, every checkpoint rewrote every metrics row so far (O(T²/c) bytes over a run). Ground truth:
the algorithm state does not grow with the round, so the file of round 10 and the file of round 100
of one run have the same size up to a few bytes (the pickled integers), and a run folder resumed
from its checkpoint gets its rows back from metrics.jsonl."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms import FedAvg
from python_algos.experiments.config import Config
from python_algos.experiments.run import run_experiment
from python_algos.runfolder import checkpoint as ckpt
from python_algos.runfolder.callbacks import Checkpoint
from python_algos.runfolder.files import read_metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tiny():
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (6,), generator=g))
               for _ in range(3)]
    torch.manual_seed(0)
    return nn.Linear(3, 2).double(), clients


def test_checkpoint_file_size_does_not_grow_with_the_round(tmp_path):
    sizes = {}

    def keep_size(snapshot):
        path = tmp_path / "c.pt"
        ckpt.save(path, snapshot)
        sizes[snapshot["round"]] = os.path.getsize(path)

    model, clients = _tiny()
    simulate(FedAvg(lr_local=0.05, local_steps=1), model, nn.functional.cross_entropy, clients, 100,
             regularizer=fk.Zero(), callbacks=[Checkpoint(keep_size, 10)], metrics_every=0)
    assert abs(sizes[100] - sizes[10]) <= 64, sizes  # before: +150 bytes a round (its metrics row)


def _small_run(rounds: int) -> Config:
    """A float64 FedAvg run on a tiny sparse-logistic problem, checkpointed every 2 rounds."""
    return Config.from_dict(dict(algorithm="fedavg", dataset="sparse_logistic", data_opts={"n": 80, "dim": 4, "nnz": 2},
                                 num_clients=2, lr=0.1, local_steps=1, rounds=rounds, reg="zero", checkpoint_every=2,
                                 dtype="float64"))


def test_run_folder_resume_reads_the_history_from_metrics_jsonl(tmp_path):
    cfg = _small_run(6)
    ref = str(tmp_path / "ref")
    run_experiment(cfg, ref, progress=False, log=lambda m: None)
    out = str(tmp_path / "r")
    run_experiment(cfg.replace(rounds=4), out, progress=False, log=lambda m: None)
    snap = ckpt.load(os.path.join(out, "checkpoint.pt"))
    assert snap["round"] == 4 and "metrics" not in snap
    s = run_experiment(None, out, resume=True, rounds=6, progress=False, log=lambda m: None)
    assert s["status"] == "completed" and s["rounds_done"] == 6
    got, want = read_metrics(out), read_metrics(ref)
    assert [r["round"] for r in got] == list(range(7))
    assert [r["f+h"] for r in got] == [r["f+h"] for r in want]
    a = torch.load(os.path.join(ref, "model.pt"), weights_only=True)
    b = torch.load(os.path.join(out, "model.pt"), weights_only=True)
    assert torch.equal(a["params"], b["params"]) and b["round"] == 6


def test_resume_refuses_a_metrics_file_without_the_checkpoints_rounds(tmp_path):
    cfg = _small_run(4)
    out = str(tmp_path / "r")
    run_experiment(cfg, out, progress=False, log=lambda m: None)
    path = os.path.join(out, "metrics.jsonl")
    lines = open(path).read().splitlines(keepends=True)
    cut = "".join(lines[:2])  # rounds 0 and 1; the checkpoint is round 4
    with open(path, "w") as f:
        f.write(cut)
    with pytest.raises(ValueError, match=r"metrics.jsonl lacks round 2 of the rounds 0..4"):
        run_experiment(None, out, resume=True, rounds=6, progress=False, log=lambda m: None)
    assert open(path).read() == cut  # nothing was changed
