"""Issue 26 item 9: a run whose objective blows up is reported as diverged, not "completed".

The rule (python_algos.runfolder.callbacks.divergence): the model or f+h NaN/Inf, or
f+h > f0 + 1e3 * max(|f0|, 1), f0 = f+h at round 0. Checked both ways: blow-ups are caught, and
runs that decrease (to any value, near 0 included) or start near 0 are not."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms import FedAvg
from python_algos.experiments.config import Config
from python_algos.experiments.run import run_experiment
from python_algos.runfolder.callbacks import DIVERGENCE_FACTOR, StopOnDivergence, TimeBudget, divergence

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("f0, f", [(2.99, 2.3e6), (2.99, math.inf), (2.99, math.nan), (0.0, 1e4),
                                   (1e-9, 2e3), (-5.0, 5e3), (1e3, 2e6), (0.5634, 2625.6)])
def test_the_rule_catches_blow_ups(f0, f):
    assert divergence(f0, f) is not None


@pytest.mark.parametrize("f0, f", [(2.99, 2.99), (2.99, 1e-12), (2.99, 0.0), (2.99, 1e3), (1e-9, 1.0),
                                   (1e-9, 1e-15), (-5.0, -1e9), (-5.0, 100.0), (1e3, 5e5), (None, 1e30)])
def test_the_rule_leaves_decreasing_and_moderate_runs_alone(f0, f):
    assert divergence(f0, f) is None


def test_the_rule_catches_a_nonfinite_model_without_objective_metrics():
    assert divergence(2.0, None, model_finite=False) == "the model has NaN/Inf entries"
    assert divergence(2.0, None) is None
    assert DIVERGENCE_FACTOR == 1e3


def _cfg(**kw):
    base = dict(algorithm="fedavg", dataset="sparse_logistic", data_opts={"n": 160, "dim": 8, "nnz": 3},
                num_clients=4, lr=0.1, local_steps=2, rounds=4, batch_size=None, reg="zero",
                checkpoint_every=1, dtype="float64", metrics_every=1)
    base.update(kw)
    return Config.from_dict(base)


def test_a_run_whose_objective_blows_up_is_reported_diverged(tmp_path):
    """Failed before: f+h grew by orders of magnitude (finite) and the run was 'completed'."""
    s = run_experiment(_cfg(lr=1e6, dataset="sparse_linear"), str(tmp_path / "big"), progress=False,
                       log=lambda m: None)  # f+h 8.3 -> 6.9e26 in one round
    assert s["status"] == "diverged", s["status"]
    assert s["rounds_done"] == 1 and s["last_checkpoint_round"] == 0
    assert s["message"].startswith("fedavg diverged at round 1: f+h = ") and "round 0" in s["message"]
    assert f"{s['initial']['f+h']:.6g}" in s["message"] and "--lr" in s["message"]


def test_a_normal_run_completes(tmp_path):
    s = run_experiment(_cfg(), str(tmp_path / "ok"), progress=False, log=lambda m: None)
    assert s["status"] == "completed" and s["rounds_done"] == 4
    assert s["final"]["f+h"] < s["initial"]["f+h"]


def test_an_objective_that_goes_to_zero_is_not_diverged():
    """Least squares on noiseless data: f+h falls from ~1 to ~0 (orders of magnitude down)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 1, generator=g, dtype=torch.float64)
    clients = []
    for _ in range(3):
        X = torch.randn(20, 4, generator=g, dtype=torch.float64)
        clients.append((X, X @ w))
    torch.manual_seed(0)
    model = nn.Linear(4, 1, bias=False).double()
    stop = StopOnDivergence()
    hist = simulate(FedAvg(lr_local=0.1, local_steps=5), model, nn.functional.mse_loss, clients, 30,
                    regularizer=fk.Zero(), callbacks=[stop])
    assert stop.reason is None and len(hist.metrics) == 30
    assert hist.metrics[-1]["f+h"] < 1e-8 * hist.initial["f+h"]


def test_a_time_budget_stops_after_the_round_that_spends_it():
    clock = iter(float(s) for s in range(100))  # one "second" per reading
    budget = TimeBudget(2.5, clock=lambda: next(clock))
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(8, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (8,), generator=g))
               for _ in range(2)]
    torch.manual_seed(0)
    hist = simulate(FedAvg(lr_local=0.1, local_steps=1), nn.Linear(3, 2).double(), nn.functional.cross_entropy,
                    clients, 10, callbacks=[budget], metrics_every=0)
    assert len(hist.metrics) == 3 and budget.reason.startswith("round 3: the time budget of 2.5 s is spent")
