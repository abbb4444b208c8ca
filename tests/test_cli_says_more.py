"""Issue 38 items 5 and 8 on the command line: a run that got worse says so (summary.json's
``"warning"``, the terminal, the comparison and seeds tables); NaN / Inf data is refused before
anything is written; ``--version``; ``run --help`` shows each option's default; the folder of a
user's ``package.module:Class`` run has no ``:`` in its name. Each test failed on base 3347ecf.

Ground truth: values written in the test (the issue's defaults T = 100, N = 10, lr 0.05;
pyproject.toml's version read as text), hand-made summaries, and a least-squares step past 2/L.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from python_algos.experiments import build
from python_algos.experiments.aggregate import seed_table
from python_algos.experiments.cli import main
from python_algos.experiments.compare import comparison_table
from python_algos.experiments.folders import default_out_dir
from python_algos.experiments.sweep import summarize
from tests._doc_blocks import ROOT
from tests.test_own_classes import COMMON, OWN, lab  # noqa: F401  (lab: the fixture of the user's module)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# least squares with a step far past 2/L: f+h grows each round, a few rounds stay below the 1000x divergence rule
WORSE = ["run", "-a", "fedavg", "--dataset", "sparse_linear", "--data-opt", "n=120", "--data-opt", "dim=6",
         "--data-opt", "nnz=3", "-N", "3", "-K", "1", "-T", "2", "--lr", "1.2", "--reg", "zero", "--dtype", "float64",
         "--no-progress", "--no-plot", "--executor", "sequential"]


def test_a_run_that_got_worse_is_flagged_in_its_summary_and_on_the_terminal(tmp_path, capsys):
    assert main([*WORSE, "--out", str(tmp_path / "w")]) == 0
    s = json.loads((tmp_path / "w" / "summary.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert s["status"] == "completed" and rows[-1]["f+h"] > rows[0]["f+h"]  # worse, yet not diverged
    assert s["warning"].startswith(f"f+h ended at {rows[-1]['f+h']:.4g} (round 2), above its start "
                                   f"{rows[0]['f+h']:.4g} (round 0)")
    err = capsys.readouterr().err
    assert f"warning: fedavg: {s['warning']}" in err and "RunWarning" not in err  # once, as a line, not a traceback
    ok = ["--lr" if a == "--lr" else "0.01" if a == "1.2" else a for a in WORSE]
    assert main([*ok, "--out", str(tmp_path / "ok")]) == 0
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["warning"] is None
    assert "warning:" not in capsys.readouterr().err


def test_tables_mark_runs_with_a_warning_and_name_it_below():
    runs = [{"label": "fedavg", "status": "completed", "final": {"f+h": 791.0}, "elapsed": 1.0,
             "warning": "f+h ended at 791 (round 10), above its start 16.05 (round 0)"},
            {"label": "fedcanon", "status": "completed", "final": {"f+h": 0.3}, "elapsed": 1.0, "warning": None}]
    table = comparison_table(runs)
    row = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| fed")}
    assert "completed ⚠" in row["fedavg"] and "⚠" not in row["fedcanon"]
    assert "⚠ fedavg: f+h ended at 791 (round 10), above its start 16.05 (round 0)" in table
    seeds = seed_table([{"label": "fedavg", "seeds": [0, 1], "summaries": runs}])
    assert "completed, ⚠ 1" in seeds and "⚠ fedavg seed 0: f+h ended at 791" in seeds


def test_the_sweep_table_marks_a_point_whose_run_has_a_warning(tmp_path):
    for name, warning in (("lr=0.1", None), ("lr=9", "f+h ended at 50 (round 3), above its start 2 (round 0)")):
        for seed in (0, 1):
            run = tmp_path / "fedavg" / name / f"seed-{seed}"
            run.mkdir(parents=True)
            (run / "summary.json").write_text(json.dumps({"status": "completed", "final": {"f+h": 1.0 + seed},
                                                          "warning": warning if seed == 1 else None}))
    plans = [{"config": {}, "algorithm": "fedavg", "point": {"lr": v}, "name": f"lr={v}"} for v in ("0.1", "9")]
    table = summarize(str(tmp_path), plans, [0, 1])["table"]
    row = {line.split("|")[2].strip(" *"): line for line in table.splitlines() if line.startswith("| fedavg")}
    assert "completed, ⚠ 1" in row["lr=9"] and "⚠" not in row["lr=0.1"]
    assert "⚠ fedavg lr=9 seed 1: f+h ended at 50 (round 3), above its start 2 (round 0)" in table


def test_nonfinite_data_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    real = build.load_dataset

    def with_nan(*a, **kw):
        ds = real(*a, **kw)
        ds.X[7, 2] = float("nan")
        return ds

    monkeypatch.setattr(build, "load_dataset", with_nan)
    assert main([*WORSE, "--lr", "0.01", "--out", str(tmp_path / "nan")]) == 1
    assert re.search(r"client \d+: row \d+ of its X holds a NaN or an infinity", capsys.readouterr().err)
    assert not (tmp_path / "nan").exists()


def test_version_is_the_packages_one_source(capsys):
    import fedkernels

    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        version = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    assert fedkernels.__version__ == version
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"fedkernels {version}"


def test_run_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    for flag, default in (("-T ROUNDS, --rounds ROUNDS", "100"), ("-N NUM_CLIENTS, --num-clients NUM_CLIENTS", "10"),
                          ("--lr LR", "0.05"), ("-K LOCAL_STEPS, --local-steps LOCAL_STEPS", "10"),
                          ("-a ALGORITHM, --algorithm ALGORITHM", "fedcanon")):
        assert re.search(re.escape(flag) + r" [^-]*?\(default: " + re.escape(default) + r"\)", text), flag


def test_the_folder_of_a_users_class_has_no_colon(lab):  # noqa: F811
    assert ":" not in os.path.basename(default_out_dir("mylab:ProxAvgM", root=str(lab / "r")))
    assert main(["run", *OWN, *COMMON]) == 0
    made = os.listdir(lab / "results")
    assert len(made) == 1 and made[0].endswith("-mylab-ProxAvgM") and ":" not in made[0]
    assert torch.isfinite(torch.load(lab / "results" / made[0] / "model.pt")["params"]).all()
