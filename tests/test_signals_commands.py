"""SIGINT, SIGTERM and SIGHUP to `run`, `compare`, `run --seeds` and `run --workers P` (issue 26,
item 5): the command ends every process it started within seconds, exits with 128 + the signal,
leaves its folder whole with the interrupted run's summary.json `interrupted`, and `--resume`
finishes with the model of an uninterrupted run, bit for bit (float64).

Ground truth: the same command run without interruption (in this process) into another folder."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from _signals import sigint_as_in_a_terminal, wait_for_rows
from test_run_folders import TINY, env_for_subprocess, params_of

from python_algos.experiments.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

LONG = dict(rounds=20000, checkpoint_every=5, batch_size=None)  # far longer than a test waits


def _config(tmp_path, **kw):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({**TINY, **LONG, **kw}))
    return str(p)


COMMANDS = {  # name -> (argv after `python -m python_algos`, the run folders inside OUT)
    "run": (["run"], [""]),
    "compare": (["compare", "-a", "fedcanon", "fedavg"], ["fedcanon", "fedavg"]),
    "seeds": (["run", "--seeds", "2"], ["seed-0", "seed-1"]),
}


def _start(argv, **popen):
    return subprocess.Popen([sys.executable, "-m", "python_algos", *argv], env=env_for_subprocess(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_in_a_terminal, **popen)


def _signal_after_first_progress(p, sig):
    """Wait until a round is done (the first progress line), then send ``sig``; the process's output."""
    try:
        while True:
            line = p.stderr.readline()
            assert line, "the command ended before it printed progress"
            if " round " in line:
                break
        time.sleep(0.3)
        p.send_signal(sig)
        return p.communicate(timeout=60)  # within seconds: the run closes its folder and exits
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _name(v):
    return v.name if isinstance(v, signal.Signals) else None


SLOW = pytest.mark.slow  # the same paths as the fast cases, with another signal (each about 7 s)


@pytest.mark.parametrize("command, sig", [
    ("run", signal.SIGTERM), ("run", signal.SIGHUP),
    ("compare", signal.SIGTERM), pytest.param("compare", signal.SIGHUP, marks=SLOW),
    pytest.param("compare", signal.SIGINT, marks=SLOW),
    pytest.param("seeds", signal.SIGTERM, marks=SLOW), ("seeds", signal.SIGHUP),
    pytest.param("seeds", signal.SIGINT, marks=SLOW),
], ids=_name)
def test_a_stop_signal_leaves_a_resumable_folder(tmp_path, command, sig):
    argv, runs = COMMANDS[command]
    cfg = _config(tmp_path)
    out = str(tmp_path / "o")
    p = _start([*argv, "--config", cfg, "--out", out, "--no-plot"])
    _, stderr = _signal_after_first_progress(p, sig)
    assert p.returncode == 128 + sig, stderr[-3000:]
    assert "Traceback" not in stderr and "resume with: python -m python_algos" in stderr, stderr[-3000:]
    first = os.path.join(out, runs[0])
    summary = json.loads(open(os.path.join(first, "summary.json")).read())
    assert summary["status"] == "interrupted", summary
    last = summary["last_checkpoint_round"]
    assert last is not None and last % 5 == 0
    rounds = str(last + 3)  # past the checkpoint: the resume runs rounds of its own
    resume = "compare" if command == "compare" else "run"
    assert main([resume, "--resume", out, "--rounds", rounds, "--no-progress", "--no-plot"]) == 0
    ref = str(tmp_path / "ref")
    assert main([*argv, "--config", cfg, "--out", ref, "--rounds", rounds, "--no-progress", "--no-plot"]) == 0
    for r in runs:
        assert json.loads(open(os.path.join(out, r, "summary.json")).read())["status"] == "completed"
        assert torch.equal(params_of(os.path.join(out, r)), params_of(os.path.join(ref, r))), r


def _descendants(pid):
    """Process ids under ``pid`` (from /proc): what the command started."""
    kids = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out += [c]
            todo += [c]
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=_name)
def test_a_stop_signal_to_the_workers_launcher_ends_every_rank(tmp_path, sig):
    """`kill PID` of `run --workers 2` (the launcher alone, not its process group): torchrun and both
    ranks end, rank 0 writes the interrupted summary, and the folder resumes in one process."""
    out = tmp_path / "w"
    p = _start(["run", "--config", _config(tmp_path, executor="sequential"), "--workers", "2", "--out", str(out),
                "--no-progress", "--no-plot"], start_new_session=True)
    try:
        wait_for_rows(out / "metrics.jsonl", p)
        started = _descendants(p.pid)
        assert len(started) >= 3, started  # torchrun and its two ranks
        p.send_signal(sig)
        _, err = p.communicate(timeout=90)
        assert p.returncode == 128 + sig, err[-3000:]
        assert not [pid for pid in started if _alive(pid)], "processes the command started outlived it"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert err.count(f"resume with: python -m python_algos run --resume {out}") == 1, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["world_size"] == 2
    assert summary["last_checkpoint_round"] is not None
    assert main(["run", "--resume", str(out), "--rounds", str(summary["rounds_done"] + 1), "--no-progress",
                 "--no-plot"]) == 0
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
