"""Default run folders are created when their name is chosen (issue 26, defect 1): two commands
started in the same second without ``--out`` used to get the same name (it did not exist yet when
each looked), and the second deleted the first's run. The clock is frozen here, so "the same second"
is certain, not a matter of timing; ground truth is the file system (distinct folders, each holding
its own complete run)."""

import datetime
import json
import os
import subprocess
import sys
import threading

import pytest

from python_algos.experiments.cli import main
from python_algos.experiments.folders import default_out_dir
from python_algos.runfolder.files import read_metrics

STAMP = datetime.datetime(2026, 1, 2, 3, 4, 5)


class _Frozen(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return STAMP


@pytest.fixture
def frozen_clock(monkeypatch):
    """Every datetime.datetime.now() returns STAMP (the default folder's name is the time to the second)."""
    monkeypatch.setattr(datetime, "datetime", _Frozen)


def test_two_default_folders_in_one_second_are_two_folders(tmp_path, frozen_clock):
    root = str(tmp_path / "results")
    a = default_out_dir("fedcanon", root=root)
    b = default_out_dir("fedcanon", root=root)
    assert a != b
    assert os.path.isdir(a) and os.path.isdir(b)  # created when named: no one else can take them
    assert sorted(os.listdir(root)) == ["20260102-030405-fedcanon", "20260102-030405-fedcanon-2"]


def test_concurrent_claims_in_threads_get_distinct_folders(tmp_path, frozen_clock):
    root, n = str(tmp_path / "results"), 8
    start, got = threading.Barrier(n), []

    def claim():
        start.wait()
        got.append(default_out_dir("sweep", root=root))

    threads = [threading.Thread(target=claim) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == n and len(set(got)) == n
    assert sorted(os.listdir(root)) == sorted(os.path.basename(p) for p in got)


# Two `run` commands as a shell loop with & starts them, with the same clock: a file barrier holds each
# process until both have chosen their folder ("before" prepare_run's checks) or both have checked it
# ("after"), so the interleaving that loses a run is certain, not a matter of timing.
_COMMAND = r"""
import datetime, os, sys, time
STAMP = datetime.datetime(2026, 1, 2, 3, 4, 5)
class Frozen(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return STAMP
datetime.datetime = Frozen
from python_algos.experiments import prepare
real, sync, me, when = prepare.prepare_run, sys.argv[1], sys.argv[2], sys.argv[3]
def both_here():
    open(os.path.join(sync, me), "w").close()
    for _ in range(1200):  # a liveness bound, not a timing assumption
        if len(os.listdir(sync)) == 2:
            break
        time.sleep(0.05)
def held(*a, **k):
    if when == "before":  # the folder is named (and, since the fix, created) before this call
        both_here()
    prep = real(*a, **k)
    if when == "after":  # both have checked the folder; neither has written
        both_here()
    return prep
prepare.prepare_run = held
from python_algos.experiments.cli import main
sys.exit(main(sys.argv[4:]))
"""

SMALL = ["run", "--data-opt", "n=120", "--data-opt", "dim=6", "--data-opt", "nnz=2", "-N", "3", "-K", "2",
         "-T", "3", "--checkpoint-every", "1", "--dtype", "float64", "--no-progress", "--no-plot"]


def _folder_of(stdout: str) -> str:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("results written to ")]
    assert len(lines) == 1, stdout
    return lines[0][len("results written to "):].strip()


def test_two_run_commands_in_one_second_keep_two_complete_runs(tmp_path):
    sync = tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _COMMAND, str(sync), str(i), "before", *SMALL, "--seed", str(i)],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in (1, 2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    folders = [os.path.join(tmp_path, _folder_of(out)) for out, _ in outs]
    assert folders[0] != folders[1]
    assert sorted(os.listdir(tmp_path / "results")) == ["20260102-030405-fedcanon", "20260102-030405-fedcanon-2"]
    for i, d in zip((1, 2), folders):  # each folder holds its own run, whole
        with open(os.path.join(d, "config.json")) as f:
            assert json.load(f)["seed"] == i
        with open(os.path.join(d, "summary.json")) as f:
            s = json.load(f)
        assert s["status"] == "completed" and s["rounds_done"] == 3
        assert [r["round"] for r in read_metrics(d)] == [0, 1, 2, 3]
        assert os.path.isfile(os.path.join(d, "model.pt")) and os.path.isfile(os.path.join(d, "checkpoint.pt"))


def test_a_command_that_fails_after_choosing_its_folder_leaves_none(tmp_path, monkeypatch, capsys):
    """The default folder exists from the moment it is named; an error found later (here: the data)
    removes it again, so a failed command leaves no folder behind, as with --out."""
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--data-opt", "bogus=1"]) == 1
    assert "bogus" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "results")  # nor the results root it made for the folder


def test_two_run_commands_into_one_out_folder_at_once_start_one_run(tmp_path):
    """The same race with ``--out DIR`` given to both: both find DIR free (the barrier holds each after
    its checks, before either writes); the run that writes config.json first runs, the other is refused and changes
    nothing (it used to clear the first's files and run over them, both exiting 0)."""
    sync, out = tmp_path / "sync", tmp_path / "same"
    sync.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _COMMAND, str(sync), str(i), "after", *SMALL, "--seed", str(i),
                               "--out", str(out)],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in (1, 2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], outs
    winner = 1 if procs[0].returncode == 0 else 2
    loser_err = outs[2 - winner][1]
    # refused by the folder's lock (the winner created it first), or by config.json written exclusively
    refused = "another command started a run in this folder" in loser_err or "is in use by another command" in loser_err
    assert refused and loser_err.startswith("error: ") and loser_err.count("\n") == 1, loser_err
    with open(out / "config.json") as f:
        assert json.load(f)["seed"] == winner
    with open(out / "summary.json") as f:
        assert json.load(f)["status"] == "completed"
    assert [r["round"] for r in read_metrics(str(out))] == [0, 1, 2, 3]
