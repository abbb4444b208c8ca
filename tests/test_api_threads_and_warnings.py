"""Issue 38 items 3 and 5 from Python: ``simulate(threads=...)`` runs under the command line's thread
policy and gives the caller's thread counts back; a run that got worse is flagged (one rule,
``runfolder.records.run_warning``) by a ``RuntimeWarning``, in summary.json and in the tables; NaN /
Inf client data are refused before the run. Each test failed on base 3347ecf (no ``threads``
argument, no warning, NaN data only warned).

Ground truth: the thread counts torch and fedkernels report inside a callback and after the call;
metrics rows written out by hand for the rule; a least-squares step size past 2/L (gradient descent
on a quadratic then grows geometrically, a fact of arithmetic, not of this code).
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedkernels as fk
import python_algos as pa
from python_algos.algorithms.registry import make
from python_algos.runfolder.records import run_warning


@pytest.fixture(autouse=True)
def _threads_kept(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the policy's first rule; these tests want the model rule
    n, m = torch.get_num_threads(), fk.get_num_threads()
    yield
    torch.set_num_threads(n)
    fk.set_num_threads(m)


def _problem(n_clients=3, per=8, dim=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    clients = [(torch.randn(per, dim, generator=g, dtype=torch.float64),
                torch.randn(per, 1, generator=g, dtype=torch.float64)) for _ in range(n_clients)]
    torch.manual_seed(seed)
    return nn.Linear(dim, 1).double(), clients


def _run(threads="auto", lr=0.05, rounds=2, callbacks=(), **kw):
    model, clients = _problem()
    seen = []

    def look(t, state, metrics):
        seen.append((torch.get_num_threads(), fk.get_num_threads()))

    args = {} if threads == "default" else {"threads": threads}
    hist = pa.simulate(make("fedavg", lr=lr, local_steps=1), model, F.mse_loss, clients, rounds,
                       callbacks=[look, *callbacks], **args, **kw)
    return hist, seen


def _set(n):
    torch.set_num_threads(n)
    fk.set_num_threads(n)


def test_auto_is_the_default_one_thread_for_a_small_model_and_the_callers_counts_come_back():
    _set(2)
    hist, seen = _run("default")
    assert seen and all(s == (1, 1) for s in seen)  # the CLI's rule: a model under 10⁶ parameters runs on 1
    assert hist.threads == 1
    assert (torch.get_num_threads(), fk.get_num_threads()) == (2, 2)


def test_none_leaves_the_callers_settings_and_an_int_is_used():
    _set(2)
    hist, seen = _run(None)
    assert all(s == (2, 2) for s in seen) and hist.threads is None
    _set(1)
    hist, seen = _run(2)
    assert all(s == (2, 2) for s in seen) and hist.threads == 2
    assert (torch.get_num_threads(), fk.get_num_threads()) == (1, 1)


def test_the_callers_counts_come_back_when_the_run_raises():
    _set(2)

    def boom(t, state, metrics):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        _run("auto", callbacks=[boom])
    assert (torch.get_num_threads(), fk.get_num_threads()) == (2, 2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", "many", 100_000])
def test_a_bad_thread_count_is_refused_naming_threads(bad):
    _set(2)
    with pytest.raises(ValueError, match="threads must be"):
        _run(bad)
    assert torch.get_num_threads() == 2


def test_the_thread_count_is_saved_with_the_run(tmp_path):
    hist, _ = _run(1)
    summary = json.loads(open(hist.save(str(tmp_path / "run")) + "/summary.json").read())
    assert summary["threads"] == 1


# --------------------------------------------------------------------------- the rule (item 5)


def _rows(*values):
    return [{"round": t, "f+h": v} for t, v in enumerate(values)]


def test_the_rule_on_rows_written_by_hand():
    worse = run_warning(_rows(16.05, 4180.0, 900.0, 791.0))
    assert worse.startswith("f+h ended at 791 (round 3), above its start 16.05 (round 0); f+h rose to 4180")
    assert "f+h rose to 4180 at round 1, 260x its best 16.05 (round 0)" in run_warning(_rows(16.05, 4180.0, 791.0))
    assert run_warning(_rows(1.0, 0.5, 5.5, 0.4)) == "f+h rose to 5.5 at round 2, 11x its best 0.5 (round 1)"
    assert run_warning(_rows(1.0, 0.5, 4.9, 0.4)) is None  # 9.8x its best: not flagged, and it ends below its start
    assert run_warning(_rows(1.0, 0.9, 1.0000001)) == "f+h ended at 1 (round 2), above its start 1 (round 0)"
    assert run_warning(_rows(1.0, float("nan"))) == "f+h became nan at round 1"
    assert run_warning(_rows(1.0, None)) == "f+h became nan at round 1"  # metrics.jsonl's null
    assert run_warning(_rows(-2.0, -1.0, -1.5)) is not None  # a negative f+h: only the end-above-start rule
    assert run_warning(_rows(-2.0, -1.0, -3.0)) is None
    assert run_warning([{"round": 0}, {"round": 1}]) is None  # no objective rows (metrics_every=0)
    assert run_warning([]) is None and run_warning(_rows(5.0)) is None


def test_simulate_warns_of_a_run_that_got_worse_and_not_of_one_that_got_better(tmp_path):
    with pytest.warns(RuntimeWarning, match=r"FedAvg: f\+h ended at .* above its start"):
        hist, _ = _run(lr=1.5, rounds=4)  # past 2/L of this least squares: it grows every round
    assert hist.last["f+h"] > 10 * hist.initial["f+h"]
    summary = json.loads(open(hist.save(str(tmp_path / "worse")) + "/summary.json").read())
    assert summary["warning"] == run_warning([hist.initial, *hist.metrics]) and "above its start" in summary["warning"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        hist, _ = _run(lr=0.05, rounds=4)
    assert hist.last["f+h"] < hist.initial["f+h"]
    assert json.loads(open(hist.save(str(tmp_path / "better")) + "/summary.json").read())["warning"] is None


def test_nonfinite_client_data_is_refused_before_the_run():
    model, clients = _problem()
    clients[1][1][5, 0] = float("inf")
    seen = []
    with pytest.raises(ValueError, match=r"client 1: row 5 of its y holds a NaN or an infinity"):
        pa.simulate(make("fedavg", lr=0.05, local_steps=1), model, F.mse_loss, clients, 2,
                    callbacks=[lambda t, s, m: seen.append(t)])
    assert seen == []
