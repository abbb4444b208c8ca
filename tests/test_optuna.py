"""`sweep --optuna N --space ...`: a random search with Optuna's TPE over the grid's machinery.

A study is reproducible with a fixed seed; interrupted (the sweep's test hook, as on Ctrl-C) and
resumed, it never runs a finished run again and ends with the N trials of an uninterrupted study;
a point the algorithm refuses is a pruned trial with the reason, not a crash; bad input is refused
before anything is written. Ground truth: each run's own summary.json (a trial's value is the mean
of its seeds' final metric, computed here with plain Python), an uninterrupted study, and the
folders' bytes before and after the resume.

Needs optuna (pip install optuna, or the `optuna` extra); skipped without it, except the test of
the message that names the install command."""

import json
import os
import sys

import pytest
from test_run_folders import TINY, folder_state

from python_algos.experiments.cli import main
from python_algos.experiments.sweep import STOP_AFTER_ENV

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

try:
    import optuna  # noqa: F401

    HAVE_OPTUNA = True
except ImportError:
    HAVE_OPTUNA = False
needs_optuna = pytest.mark.skipif(not HAVE_OPTUNA, reason="needs optuna: pip install optuna")

# MCP with gamma = 1.5 is 1/1.5-weakly convex: FedCanon needs alpha < 1.5, so alpha >= 1.5 is refused
SPACE = ["--space", "alpha=float:0.1:2.5", "--space", "beta=log:0.01:0.1"]


def _config(tmp_path, **kw):
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps({**TINY, "rounds": 2, "checkpoint_every": 1, "reg": "mcp", "reg_strength": 0.05,
                             "reg_opts": {"gamma": 1.5}, **kw}))
    return str(p)


def _study(out, algorithm="fedcanon"):
    import optuna

    s = optuna.load_study(study_name=algorithm, storage=f"sqlite:///{os.path.join(out, 'optuna.db')}")
    return [(t.number, t.state.name, t.params, t.value, t.user_attrs.get("reason")) for t in s.get_trials()]


def _search(tmp_path, out, *extra, trials=6, seeds=("--seed", "3")):
    return main(["sweep", "-a", "fedcanon", "--optuna", str(trials), *SPACE, *seeds, "--config", _config(tmp_path),
                 "--out", out, "--no-progress", "--no-plot", *extra])


def _value_from_runs(out, trial_params, seeds):
    """The mean final f+h over the seeds, read from the runs' own summary.json files."""
    name = ",".join(f"{k}={float(f'{trial_params[k]:.6g}'):g}" for k in ("alpha", "beta"))
    vals = []
    for s in seeds:
        with open(os.path.join(out, "fedcanon", name, f"seed-{s}", "summary.json")) as f:
            summ = json.load(f)
        assert summ["status"] == "completed"
        vals.append(summ["final"]["f+h"])
    return sum(vals) / len(vals)


@needs_optuna
def test_a_study_is_reproducible_with_a_fixed_seed_and_a_refused_point_is_pruned(tmp_path, capsys):
    a, b, c = (str(tmp_path / n) for n in "abc")
    assert _search(tmp_path, a) == 0
    assert _search(tmp_path, b) == 0
    assert _search(tmp_path, c, seeds=("--seed", "4")) == 0
    ta, tb, tc = _study(a), _study(b), _study(c)
    assert ta == tb  # same parameters, values, states, reasons
    assert [t[2] for t in ta] != [t[2] for t in tc]  # another seed, another study
    assert len(ta) == 6 and all(t[1] in ("COMPLETE", "PRUNED") for t in ta)
    pruned = [t for t in ta if t[1] == "PRUNED"]
    assert pruned and all(t[2]["alpha"] >= 1.5 and "alpha" in t[4] for t in pruned), ta  # refused, with the reason
    assert all(t[2]["alpha"] < 1.5 for t in ta if t[1] == "COMPLETE")
    for t in ta:
        if t[1] == "COMPLETE":
            assert t[3] == pytest.approx(_value_from_runs(a, t[2], [3]), rel=1e-12)
    summary = json.load(open(os.path.join(a, "summary.json")))
    assert len(summary["skipped"]) == len({json.dumps(t[2], sort_keys=True) for t in pruned})
    best = min((t for t in ta if t[1] == "COMPLETE"), key=lambda t: t[3])
    assert summary["best"]["fedcanon"]["f+h"]["mean"] == pytest.approx(best[3], rel=1e-12)
    assert [r["number"] for r in summary["optuna"]["trials"]] == list(range(6))
    assert "pruned" in capsys.readouterr().out


@needs_optuna
@pytest.mark.slow
def test_an_interrupted_search_resumes_without_running_a_finished_trial_again(tmp_path, monkeypatch, capsys):
    ref, out = str(tmp_path / "ref"), str(tmp_path / "out")
    seeds = ("--seeds", "2", "--seed", "3")
    assert _search(tmp_path, ref, seeds=seeds) == 0
    monkeypatch.setenv(STOP_AFTER_ENV, "5")  # Ctrl-C after the 5th run ended: the 3rd trial has one seed of 2
    assert _search(tmp_path, out, seeds=seeds) == 130
    assert "sweep --resume" in capsys.readouterr().err
    monkeypatch.delenv(STOP_AFTER_ENV)
    cut = _study(out)
    assert cut[-1][1] == "RUNNING" and all(t[1] != "RUNNING" for t in cut[:-1])  # left running, resumed later
    assert json.load(open(os.path.join(out, "summary.json")))["status"] == "interrupted"
    runs = sorted(r for r, _, files in os.walk(out) if "summary.json" in files and "seed-" in r)
    done = [r for r in runs if json.load(open(os.path.join(r, "summary.json")))["status"] == "completed"]
    assert len(done) == 5
    kept = {d: folder_state(d) for d in done}
    before = folder_state(out)
    assert main(["sweep", "--resume", out, "--select", "test_acc"]) == 1  # the study's values are f+h
    assert "--select test_acc: the random search" in capsys.readouterr().err
    assert folder_state(out) == before
    assert main(["sweep", "--resume", out, "--jobs", "2", "--no-plot"]) == 0  # another --jobs: the same study
    for d in done:  # a finished run is never run again
        assert folder_state(d) == kept[d], d
    assert _study(out) == _study(ref)  # N trials, as if never interrupted
    assert open(os.path.join(out, "summary.md")).read() == open(os.path.join(ref, "summary.md")).read()
    for t in _study(out):
        if t[1] == "COMPLETE":
            assert t[3] == pytest.approx(_value_from_runs(out, t[2], [3, 4]), rel=1e-12)


def test_bad_input_is_refused_before_anything_is_written(tmp_path, capsys):
    cfg = _config(tmp_path)
    out = str(tmp_path / "o")
    cases = [
        (["--optuna", "3", "--space", "alpha=log:0:1"], "--space alpha=log:0:1: a log range needs LOW > 0"),
        (["--optuna", "3", "--space", "alpha=float:2:1"], "--space alpha=float:2:1: needs finite LOW < HIGH"),
        (["--optuna", "3", "--space", "alpha=log:1e-3:1:5"], "expected log:LOW:HIGH"),
        (["--optuna", "3", "--space", "alpha=0.1"], "at least two values"),
        (["--optuna", "3", "--space", "local_steps=1,1.0"], "a value is repeated (1 and 1.0"),  # one K: one run
        (["--space", "alpha=log:1e-3:1"], "--space: only with --optuna N"),
        (["--optuna", "3"], "--optuna: give the space"),
        (["--optuna", "3", "--grid", "alpha=0.1,0.2", "--space", "beta=log:0.01:0.1"], "--optuna and --grid"),
    ]
    for flags, message in cases:
        assert main(["sweep", "-a", "fedcanon", *flags, "--config", cfg, "--out", out, "--no-progress"]) == 1
        assert message in capsys.readouterr().err, flags
        assert not os.path.exists(out)
    if HAVE_OPTUNA:
        assert main(["sweep", "-a", "fedcanon", "fedavg", "--optuna", "3", "--space", "alpha=log:0.01:1",
                     "--config", cfg, "--out", out]) == 1
        assert "--space: fedavg has none of alpha" in capsys.readouterr().err
        assert main(["sweep", "-a", "fedcanon", "--optuna", "3", "--space", "gamma=log:0.01:1", "--config", cfg,
                     "--out", out]) == 1
        assert "--space gamma: neither a run setting nor a hyper-parameter" in capsys.readouterr().err
        assert not os.path.exists(out)


def test_without_optuna_the_error_names_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError
    out = str(tmp_path / "o")
    assert main(["sweep", "-a", "fedcanon", "--optuna", "3", *SPACE, "--config", _config(tmp_path), "--out", out]) == 1
    assert "pip install optuna" in capsys.readouterr().err
    assert not os.path.exists(out)
