"""One run-folder format version (issue 36 item 7): every new run and group folder records it, a
resume refuses a folder of another version in one place with a one-line error naming the folder,
its version and the fix, and such a folder still plots."""

import json
import os
import shutil

import pytest

from python_algos.experiments.cli import main
from python_algos.runfolder.files import read_metrics
from python_algos.runfolder.records import FORMAT_KEY, FORMAT_VERSION

SMALL = ["-a", "fedcanon", "--dataset", "sparse_logistic", "--data-opt", "n=60", "--data-opt", "dim=5",
         "--data-opt", "nnz=2", "-N", "2", "-K", "1", "--no-progress", "--no-plot"]


def _files(folder) -> dict:
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, names in os.walk(folder) for f in names}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run stopped at round 2 of 4 (checkpointed), and the uninterrupted 4-round run."""
    root = tmp_path_factory.mktemp("format")
    assert main(["run", *SMALL, "-T", "2", "--checkpoint-every", "1", "--out", str(root / "stopped")]) == 0
    assert main(["run", *SMALL, "-T", "4", "--out", str(root / "whole")]) == 0
    return root


def test_a_current_folder_records_its_version_and_resumes(runs, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(runs / "stopped", out)
    assert json.loads((out / "config.json").read_text())[FORMAT_KEY] == FORMAT_VERSION
    assert main(["run", "--resume", str(out), "-T", "4", "--no-progress", "--no-plot"]) == 0
    # the uninterrupted run is the ground truth, row for row (timings aside)
    got, want = read_metrics(str(out)), read_metrics(str(runs / "whole"))
    assert [r["f+h"] for r in got] == [r["f+h"] for r in want] and len(got) == 5


@pytest.mark.parametrize("version", [None, FORMAT_VERSION + 1])
def test_a_folder_of_another_version_is_refused_in_one_line_and_still_plots(runs, tmp_path, capsys, version):
    """None: a folder written before versions were recorded (format 1), as the older code wrote it."""
    out = tmp_path / "old run"
    shutil.copytree(runs / "stopped", out)
    config = json.loads((out / "config.json").read_text())
    config.pop(FORMAT_KEY)
    if version is not None:
        config[FORMAT_KEY] = version
    (out / "config.json").write_text(json.dumps(config))
    before = _files(out)
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "-T", "4", "--no-progress", "--no-plot"]) == 1
    err = capsys.readouterr().err.strip()
    shown = 1 if version is None else version
    assert err.count("\n") == 0, err
    assert (f"cannot resume {out}: it was written in run-folder format {shown}, this version continues format "
            f"{FORMAT_VERSION}: start the run again in a new folder") in err, err
    assert f"python -m python_algos plot '{out}'" in err, err
    assert _files(out) == before  # nothing was changed
    pytest.importorskip("matplotlib")
    figs = tmp_path / "figs"
    assert main(["plot", str(out), "--out", str(figs), "--formats", "png"]) == 0
    assert (figs / "f_plus_h_vs_round.png").read_bytes()[:4] == b"\x89PNG"


def test_a_group_is_refused_by_the_same_check_of_its_runs(tmp_path, capsys):
    """A comparison (as seeds, sweeps and Optuna) continues each of its runs through the run's resume,
    so a run folder of another version inside it is refused by the one check, naming that run."""
    out = tmp_path / "cmp"
    assert main(["compare", *SMALL[2:], "-a", "fedcanon", "fedavg", "-T", "1", "--out", str(out)]) == 0
    for run in ("fedcanon", "fedavg"):
        assert json.loads((out / run / "config.json").read_text())[FORMAT_KEY] == FORMAT_VERSION
    config = json.loads((out / "fedavg" / "config.json").read_text())
    config.pop(FORMAT_KEY)
    (out / "fedavg" / "config.json").write_text(json.dumps(config))
    before = _files(out)
    capsys.readouterr()
    assert main(["compare", "--resume", str(out), "-T", "2", "--no-progress", "--no-plot"]) == 1
    err = capsys.readouterr().err
    assert f"cannot resume {out / 'fedavg'}: it was written in run-folder format 1" in err, err
    assert _files(out) == before

