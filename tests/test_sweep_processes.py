"""A sweep's worker processes are supervised.

SIGTERM or SIGHUP to `sweep --jobs 2` ends every worker process before the command exits (none
keeps running its point into the folder), the command exits with 128 + the signal, the folder's
summary says interrupted, and `sweep --resume` finishes it. A worker that dies (SIGKILL, as the
out-of-memory killer sends) fails the run it held, with the reason; the other points finish, the
summary is written, and the command exits 1.

Ground truth: the kernel's process table (/proc: which of the sweep's children are alive, read
independently of the code under test), the runs' own summary.json files."""

import json
import os
import signal
import subprocess
import sys

import pytest
from test_run_folders import ROOT, TINY, env_for_subprocess

from python_algos.experiments.cli import main
from python_algos.experiments.sweep import KILL_POINT_ENV
from python_algos.runfolder.records import read_summary

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.usefixtures("one_torch_thread")]

ON_LINUX = sys.platform.startswith("linux")


def _config(tmp_path, **kw):
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps({**TINY, "checkpoint_every": 50, **kw}))
    return str(p)


def _children(pid: int) -> list:
    """The PIDs of the live processes whose parent is ``pid`` (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _parent(int(name)) == pid:
            out.append(int(name))
    return out


def _stat(pid: int):
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # state, ppid, ...


def _parent(pid: int):
    st = _stat(pid)
    return int(st[1]) if st else None


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def _is_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"spawn_main" in f.read()  # a multiprocessing worker, not its resource tracker
    except OSError:
        return False


def _run_dirs(out):
    return sorted(r for r, _, files in os.walk(out) if "config.json" in files)


@pytest.mark.slow  # a real command and its worker processes, twice (the sweep, then its resume)
@pytest.mark.skipif(not ON_LINUX, reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_every_worker_and_leaves_the_sweep_resumable(tmp_path, sig):
    out = tmp_path / "s"
    cmd = [sys.executable, "-m", "python_algos", "sweep", "-a", "fedcanon", "--grid", "alpha=0.05,0.1,0.3",
           "--jobs", "2", "--config", _config(tmp_path, rounds=400), "--out", str(out), "--no-plot"]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env_for_subprocess(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        for line in p.stderr:  # the progress lines: the first run ended, the next ones are running
            if line.startswith("[1/"):
                break
        workers = [c for c in _children(p.pid) if _is_worker(c)]
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert workers, "no worker process found"
    assert [w for w in workers if _alive(w)] == [], "worker processes outlived the sweep"
    assert p.returncode == 128 + sig, err
    assert "sweep --resume" in err
    summary = json.load(open(out / "summary.json"))
    assert summary["status"] == "interrupted"
    statuses = [(read_summary(d) or {}).get("status") for d in _run_dirs(out)]
    assert "completed" in statuses and set(statuses) - {"completed"} <= {"interrupted", None}, statuses
    assert main(["sweep", "--resume", str(out), "--jobs", "2", "--no-progress", "--no-plot"]) == 0
    assert json.load(open(out / "summary.json"))["status"] == "completed"
    assert len(_run_dirs(out)) == 3
    assert all(read_summary(d)["status"] == "completed" and read_summary(d)["rounds_done"] == 400
               for d in _run_dirs(out))


def test_a_worker_that_dies_fails_its_point_with_the_reason_and_the_others_finish(tmp_path, monkeypatch, capsys):
    out = tmp_path / "s"
    killed = os.path.join("fedcanon", "alpha=0.1", "seed-0")
    monkeypatch.setenv(KILL_POINT_ENV, killed)  # the worker handed this run SIGKILLs itself
    code = main(["sweep", "-a", "fedcanon", "--grid", "alpha=0.05,0.1,0.3", "--jobs", "2",
                 "--config", _config(tmp_path, rounds=4), "--out", str(out), "--no-progress", "--no-plot"])
    captured = capsys.readouterr()
    assert code == 1 and "failed" in captured.err
    summary = json.load(open(out / "summary.json"))
    assert list(summary["failed"]) == [str(out / killed)]
    assert "signal 9" in summary["failed"][str(out / killed)]
    by_name = {p["name"]: p["statuses"] for p in summary["points"]}
    assert by_name == {"alpha=0.05": ["completed"], "alpha=0.1": ["failed"], "alpha=0.3": ["completed"]}
    for name in ("alpha=0.05", "alpha=0.3"):  # the runs' own records agree
        assert read_summary(str(out / "fedcanon" / name / "seed-0"))["status"] == "completed"
    assert "signal 9" in captured.out  # the table's notes name the reason
    monkeypatch.delenv(KILL_POINT_ENV)
    assert main(["sweep", "--resume", str(out), "--jobs", "2", "--no-progress", "--no-plot"]) == 0
    assert read_summary(str(out / killed))["status"] == "completed"


@pytest.mark.slow
def test_every_worker_dying_mid_run_still_writes_the_summary(tmp_path, monkeypatch):
    """The run's own SIGKILL hook (experiments/run.py) kills every run's process at round 2: the
    sweep before the fix ended with BrokenProcessPool and no summary."""
    from python_algos.experiments.run import KILL_ENV

    out = tmp_path / "s"
    monkeypatch.setenv(KILL_ENV, "2")
    code = main(["sweep", "-a", "fedcanon", "--grid", "alpha=0.05,0.1", "--jobs", "2",
                 "--config", _config(tmp_path, rounds=4, checkpoint_every=1), "--out", str(out), "--no-progress",
                 "--no-plot"])
    assert code == 1
    summary = json.load(open(out / "summary.json"))
    assert sorted(summary["failed"]) == sorted(_run_dirs(out))
    assert all("signal 9" in why for why in summary["failed"].values())
