"""History.load pairs model.pt with the metrics of its own round (issue 17, item 4).

A command-line run appends a metrics row every round and writes model.pt when it completes, so a run
resumed to more rounds that then stops early (Ctrl-C, SIGKILL, divergence) leaves rows past model.pt's
round. These tests build that situation for real (run_experiment / the CLI with its kill hook) and check
that History.load returns model.pt's model with the rows of rounds 0..its round (and says so), compared
with an independent, uninterrupted run of that many rounds; folders it cannot pair are refused."""

import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from python_algos.experiments.config import Config
from python_algos.experiments.run import KILL_ENV, Interrupted, run_experiment
from python_algos.runfolder.files import RunFolderError, read_metrics
from python_algos.simulate import History

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(algorithm="fedcanon", dataset="sparse_logistic", data_opts={"n": 160, "dim": 8, "nnz": 3},
            num_clients=4, lr=0.1, local_steps=2, rounds=4, batch_size=10, reg="l1", reg_strength=0.01,
            checkpoint_every=2, dtype="float64")
# full-gradient FedAvg with a step just too large: f+h 200 -> 414 -> ... x2.3 a round, 3.4e5 at round 9,
# the first round above 1e3 x its round-0 value (the divergence rule, runfolder.callbacks.divergence)
DIVERGES = dict(algorithm="fedavg", dataset="sparse_linear", lr=0.024, local_steps=5, batch_size=None, reg="zero",
                data_opts={"n": 160, "dim": 8, "nnz": 3, "shift": 4.0, "num_groups": 4}, rounds=5)
OBJ = ("f", "h", "f+h", "grad_map_sq", "sparsity", "test_loss", "test_acc")


def tiny(**kw) -> Config:
    return Config.from_dict({**TINY, **kw})


def quiet(*a, **k):
    pass


def model_file(path) -> dict:
    return torch.load(os.path.join(path, "model.pt"), weights_only=True)


def same_run(h: History, ref_dir: str, rounds: int):
    """``h`` is the model and metrics of the uninterrupted run in ``ref_dir`` (of ``rounds`` rounds)."""
    ref = read_metrics(ref_dir)
    assert [r["round"] for r in ref] == list(range(rounds + 1))
    assert [h.initial["round"]] + [m["round"] for m in h.metrics] == list(range(rounds + 1))
    for mine, theirs in zip([h.initial, *h.metrics], ref):
        for k in OBJ:
            if k in theirs:
                a, b = mine[k], theirs[k]
                assert (a == b) or (a != a and b is None), (mine["round"], k, a, b)  # NaN stored as null
    assert torch.equal(h.params, model_file(ref_dir)["params"])


def stop_at_eval(n, exc):
    """An extra_eval that raises ``exc`` at its n-th call (the evaluation of the n-th resumed round)."""
    calls = [0]

    def extra(params):
        calls[0] += 1
        if calls[0] == n:
            raise exc
        return {}

    return extra


def test_model_pt_records_its_round(tmp_path):
    out = str(tmp_path / "run")
    run_experiment(tiny(), out, progress=False, log=quiet)
    assert model_file(out)["round"] == 4
    h = History.load(out)
    h.save(str(tmp_path / "api"))
    assert model_file(str(tmp_path / "api"))["round"] == 4


def test_interrupted_resumed_run_loads_model_with_its_own_rounds(tmp_path):
    ref = str(tmp_path / "ref")
    run_experiment(tiny(), ref, progress=False, log=quiet)  # the ground truth: 4 rounds, uninterrupted
    out = str(tmp_path / "run")
    run_experiment(tiny(), out, progress=False, log=quiet)
    with pytest.raises(Interrupted):  # Ctrl-C while evaluating round 7 of the resumed run
        run_experiment(None, out, resume=True, rounds=8, progress=False, log=quiet,
                       extra_eval=stop_at_eval(3, KeyboardInterrupt()))
    assert [r["round"] for r in read_metrics(out)] == list(range(7))
    assert model_file(out)["round"] == 4
    with pytest.warns(UserWarning, match=r"metrics up to round 6, model.pt of round 4 \(the resumed run was "
                                         r"interrupted after round 6\): loaded rounds 0–4") as w:
        h = History.load(out)
    assert "run --resume" in str(w[0].message)
    same_run(h, ref, 4)
    # finishing the run gives the 8-round model with its 8 rounds, silently
    run_experiment(None, out, resume=True, progress=False, log=quiet)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h = History.load(out)
    assert h.metrics[-1]["round"] == 8 and torch.equal(h.params, model_file(out)["params"])


def test_sigkilled_resumed_run_loads_model_with_its_own_rounds(tmp_path):
    """The real thing: the CLI resumed to 8 rounds and SIGKILLed after round 6 (its KILL_ENV hook)."""
    ref = str(tmp_path / "ref")
    run_experiment(tiny(), ref, progress=False, log=quiet)
    out = str(tmp_path / "run")
    run_experiment(tiny(), out, progress=False, log=quiet)
    env = {**os.environ, KILL_ENV: "6", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-m", "python_algos", "run", "--resume", out, "--rounds", "8",
                        "--no-progress", "--no-plot"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    assert [r["round"] for r in read_metrics(out)] == list(range(7))
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["rounds_done"] == 4  # the first run's summary: the kill left it
    with pytest.warns(UserWarning, match=r"metrics up to round 6, model.pt of round 4 \(a resumed run stopped"):
        h = History.load(out)
    same_run(h, ref, 4)


def test_diverged_resumed_run_loads_model_with_its_own_rounds(tmp_path):
    ref = str(tmp_path / "ref")
    run_experiment(tiny(**DIVERGES), ref, progress=False, log=quiet)
    out = str(tmp_path / "run")
    assert run_experiment(tiny(**DIVERGES), out, progress=False, log=quiet)["status"] == "completed"
    s = run_experiment(None, out, resume=True, rounds=30, progress=False, log=quiet)
    assert s["status"] == "diverged" and s["rounds_done"] == 9, s
    with pytest.warns(UserWarning, match=r"metrics up to round 9, model.pt of round 5 \(the resumed run "
                                         r"diverged after round 9\): loaded rounds 0–5") as w:
        h = History.load(out)
    assert "run --resume" not in str(w[0].message)  # it would diverge again
    same_run(h, ref, 5)


def _strip_round(path):
    saved = model_file(path)
    saved.pop("round", None)
    torch.save(saved, os.path.join(path, "model.pt"))


def test_older_model_pt_without_round(tmp_path):
    done = str(tmp_path / "done")
    run_experiment(tiny(), done, progress=False, log=quiet)
    _strip_round(done)  # as an older version wrote it: summary.json (completed, round 4) vouches for it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert History.load(done).metrics[-1]["round"] == 4
    out = str(tmp_path / "run")
    shutil.copytree(done, out)
    with pytest.raises(Interrupted):
        run_experiment(None, out, resume=True, rounds=8, progress=False, log=quiet,
                       extra_eval=stop_at_eval(3, KeyboardInterrupt()))
    _strip_round(out)
    with pytest.raises(RunFolderError, match=r"model.pt does not record its round .* summary.json \(status "
                                             r"interrupted, rounds_done 6\) .* last round 6 .*nothing was loaded"):
        History.load(out)


def test_model_round_without_metrics_refused(tmp_path):
    out = str(tmp_path / "run")
    run_experiment(tiny(), out, progress=False, log=quiet)
    rows = read_metrics(out)[:3]  # rounds 0..2, model.pt of round 4
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with pytest.raises(RunFolderError, match=r"model.pt is the model of round 4 but metrics.jsonl holds rounds "
                                             r"0–2 only.*nothing was loaded"):
        History.load(out)
