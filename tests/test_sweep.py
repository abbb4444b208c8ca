"""`sweep`: a grid × seeds on worker processes, interrupted and resumed, ends with the table of one
uninterrupted sweep and never runs a finished point again; invalid points are skipped with the
reason; the best point follows --select; grid values and errors.

Ground truth: an uninterrupted sweep run one point after another in this process (--jobs 1), the
runs' own summary.json files, and the folders' bytes before and after the resume."""

import json
import os

import pytest
import torch
from test_run_folders import TINY, folder_state, params_of

from python_algos.experiments.cli import main
from python_algos.experiments.sweep import STOP_AFTER_ENV, parse_grid, parse_grid_values

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

GRID = ["--grid", "alpha=0.05,0.3", "--grid", "beta=0.01,0.05,0.1"]


def _config(tmp_path, **kw):
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps({**TINY, "rounds": 4, "checkpoint_every": 2, "reg": "mcp", "reg_strength": 0.05,
                             "reg_opts": {"gamma": 3.0}, **kw}))
    return str(p)


def _runs(out):
    return sorted(os.path.join(r, "") for r, _, files in os.walk(out) if "config.json" in files)


@pytest.mark.slow
def test_interrupted_and_resumed_sweep_equals_an_uninterrupted_one(tmp_path, monkeypatch, capsys):
    cfg = _config(tmp_path)
    ref, out = str(tmp_path / "ref"), str(tmp_path / "out")
    common = ["sweep", "-a", "fedcanon", *GRID, "--seeds", "3", "--config", cfg, "--no-progress"]
    assert main([*common, "--jobs", "1", "--out", ref, "--no-plot"]) == 0
    monkeypatch.setenv(STOP_AFTER_ENV, "5")  # Ctrl-C after 5 runs ended, with others running
    assert main([*common, "--jobs", "2", "--out", out, "--no-plot"]) == 130
    assert "sweep --resume" in capsys.readouterr().err
    monkeypatch.delenv(STOP_AFTER_ENV)
    status = {}
    for d in _runs(out):
        s = json.load(open(os.path.join(d, "summary.json"))) if os.path.isfile(os.path.join(d, "summary.json")) else {}
        status[d] = s.get("status")
    done = [d for d, s in status.items() if s == "completed"]
    assert 5 <= len(done) < 18, status
    assert json.load(open(os.path.join(out, "summary.json")))["status"] == "interrupted"
    kept = {d: folder_state(d) for d in done}
    assert main(["sweep", "--resume", out, "--jobs", "2", "--formats", "png"]) == 0
    for d in done:  # a finished point is never run again
        assert folder_state(d) == kept[d], d
    assert open(os.path.join(out, "summary.md")).read() == open(os.path.join(ref, "summary.md")).read()
    assert len(_runs(out)) == len(_runs(ref)) == 18
    for a, b in zip(_runs(out), _runs(ref)):
        assert os.path.relpath(a, out) == os.path.relpath(b, ref)
        assert torch.equal(params_of(a), params_of(b)), a
    for f in ("heatmap-fedcanon.png", "best.png"):
        assert os.path.isfile(os.path.join(out, f)), f


def test_invalid_points_are_skipped_with_the_reason_and_select_picks_the_best(tmp_path, capsys):
    out = str(tmp_path / "s")
    # MCP with gamma = 1.5 is 1/1.5-weakly convex: FedCanon needs alpha * rho < 1, so alpha = 2 breaks it
    cfg = _config(tmp_path, rounds=2, reg_opts={"gamma": 1.5})
    assert main(["sweep", "-a", "fedcanon", "fedavg", "--grid", "alpha=0.1,0.4,2", "--grid", "lr=0.05,0.1",
                 "--config", cfg, "--select", "test_acc", "--out", out, "--no-progress", "--no-plot"]) == 0
    printed = capsys.readouterr().out
    summary = json.load(open(os.path.join(out, "summary.json")))
    skipped = summary["skipped"]
    assert [(s["algorithm"], s["point"]["alpha"]) for s in skipped] == [("fedcanon", 2), ("fedcanon", 2)]
    assert all("alpha" in s["reason"] for s in skipped) and "skipped" in printed and "alpha=2" in printed
    # alpha is not a hyper-parameter of FedAvg: it varies lr only
    assert sorted(p["name"] for p in summary["points"] if p["algorithm"] == "fedavg") == ["lr=0.05", "lr=0.1"]
    for a in ("fedcanon", "fedavg"):
        accs = {}
        for p in summary["points"]:
            if p["algorithm"] == a:
                s = json.load(open(os.path.join(p["dir"], "seed-0", "summary.json")))
                accs[p["name"]] = s["final"]["test_acc"]
        best = max(accs.values())
        assert accs[summary["best"][a]["name"]] == best


def test_grid_values_and_errors(tmp_path, capsys):
    assert parse_grid_values("alpha", "log:1e-3:1e-1:3") == [0.001, 0.01, 0.1]
    assert parse_grid({"alpha": "0.1,0.2", "local-steps": [1, 2]}) == {"alpha": [0.1, 0.2], "local_steps": [1, 2]}
    for spec in ("log:0:1:3", "log:1e-3:1e-1", "0.1,0.1"):
        with pytest.raises(ValueError, match="--grid alpha="):
            parse_grid_values("alpha", spec)
    out = tmp_path / "s"
    assert main(["sweep", "-a", "fedcanon", "--grid", "gamma=1,2", "--config", _config(tmp_path), "--out", str(out),
                 "--no-progress"]) == 1
    assert "--grid gamma" in capsys.readouterr().err and not out.exists()
    toml = tmp_path / "sweep.toml"
    toml.write_text('algorithms = ["fedcanon"]\nrounds = 1\nnum_clients = 4\ndata_opts = {n = 160, dim = 8, nnz = 3}\n'
                    'seeds = 2\n[grid]\nalpha = "log:0.01:0.1:2"\n')
    assert main(["sweep", "--config", str(toml), "--out", str(out), "--no-progress", "--no-plot"]) == 0
    assert sorted(os.listdir(out / "fedcanon")) == ["alpha=0.01", "alpha=0.1"]
    assert sorted(os.listdir(out / "fedcanon" / "alpha=0.1")) == ["seed-0", "seed-1"]
