"""The kill harness (issue 36, item 6): every engine — one process, ``run --workers 2``, ``sweep --jobs
2``, ``run --flower`` — started through the command line with checkpoints, then stopped at a random
moment by SIGKILL, SIGTERM, Ctrl-C pressed three times within 0.3 s (SIGINT to the process group, as
a terminal sends it) or SIGKILL to a random process below the command. Then:

* no process of the run is left: none in the command's process group, none carrying the test's
  marker in its environment (``FK_KILL_HARNESS=<uuid>``, inherited by every process below it);
* no temporary folder is left (the command runs with ``TMPDIR`` of its own, which must end empty);
* while the command ran, a second command on its folder (``--resume``) was refused, naming it;
* a stop other than SIGKILL wrote each run's ``summary.json`` and printed how to resume;
* the folder is valid (every JSON file and metrics line parses) and ``--resume`` completes;
* the final model and every metrics row (less its clock readings) equal those of the same command
  run without interruption, bit for bit (float64).

Seeded (``--fuzz-seed``): the seed picks each engine's stop (the default seed gives each engine
another one of the four; seeds 0-3 give every engine each) and its moment; ``--fuzz-long`` runs many
seeds. Marked ``processes``: about 5 minutes on 2 cores.
"""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid

import pytest
import torch
from _signals import sigint_as_in_a_terminal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.processes, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

DATA = ["--dataset", "sparse_logistic", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt", "nnz=3",
        "--dtype", "float64", "--seed", "1", "--no-plot", "--checkpoint-every", "1", "-B", "10"]
ENGINES = {  # name -> (the command's arguments after `python -m python_algos`, its resume, the rounds)
    "one": (["run", "-a", "fedavg", "-N", "4", "-T", "400", *DATA], ["run", "--resume"], 400),
    "workers": (["run", "--workers", "2", "-a", "fedavg", "-N", "4", "-T", "150", *DATA],
                ["run", "--workers", "2", "--resume"], 150),
    "sweep": (["sweep", "-a", "fedavg", "--grid", "lr=0.05,0.1,0.2", "--jobs", "2", "-N", "4", "-T", "200", *DATA],
              ["sweep", "--resume"], 200),
    "flower": (["run", "--flower", "-a", "fedavg", "-N", "2", "-T", "12", *DATA], ["run", "--flower", "--resume"], 12),
}
STOPS = ("SIGINTx3", "SIGKILL", "SIGKILL a child", "SIGTERM")  # seed s: engine i gets STOPS[(s + i) % 4]
CLOCK = ("wall_time", "elapsed")  # and every *_time key: readings of the clock, not of the run


def _env(tmp, marker: str) -> dict:
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "FK_KILL_HARNESS": marker, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}


def _start(argv, env, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "python_algos", *argv], env=env, cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=sigint_as_in_a_terminal)


def _marked(marker: str) -> list:
    """Live (not zombie) processes carrying ``FK_KILL_HARNESS=marker``."""
    found, key = [], f"FK_KILL_HARNESS={marker}".encode()
    for env in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(env, "rb") as f:
                if key not in f.read().split(b"\0"):
                    continue
            pid = int(env.split("/")[2])
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(pid)
        except (OSError, ValueError):
            continue
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _rows(path) -> list:
    with open(path) as f:
        return [json.loads(line) for line in f]  # a torn line fails here: the folder is not valid


def _comparable(rows: list) -> list:
    return [{k: v for k, v in r.items() if k not in CLOCK and not k.endswith("_time")} for r in rows]


def _runs(out) -> list:
    """The run folders under ``out`` (relative), those that wrote metrics."""
    found = glob.glob(f"{out}/**/metrics.jsonl", recursive=True)
    return sorted(os.path.relpath(os.path.dirname(p), out) for p in found)


def _check_valid(out) -> None:
    for path in glob.glob(f"{out}/**/*.json", recursive=True):
        with open(path) as f:
            json.load(f)
    for path in glob.glob(f"{out}/**/metrics.jsonl", recursive=True):
        _rows(path)


def _wait_rows(p, out, rows: int, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        counts = [len(open(m).read().splitlines()) for m in glob.glob(f"{out}/**/metrics.jsonl", recursive=True)]
        if counts and max(counts) > rows:
            return
        if p.poll() is not None or time.monotonic() > deadline:
            os.killpg(p.pid, signal.SIGKILL)
            err = p.communicate()[1]
            pytest.fail(f"the command ended or stalled before its stop (exit {p.poll()}):\n{err[-3000:]}")
        time.sleep(0.1)


def _below(pid: int, marker: str) -> list:
    """The processes below ``pid``: its descendants and every process carrying the marker."""
    children: dict = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(stat.split("/")[2]))
        except (OSError, ValueError, IndexError):
            continue
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return sorted((out | set(_marked(marker))) - {pid})


def _second_command_is_refused(resume, out, env, cwd) -> None:
    """Defect 4: while the command runs, another one on its folder is refused, naming the holder,
    and changes nothing."""
    before = {p: open(p, "rb").read() for p in glob.glob(f"{out}/**/config.json", recursive=True)}
    q = _start([*resume, out], env, cwd)
    try:
        _, err = q.communicate(timeout=120)
    finally:
        if q.poll() is None:
            os.killpg(q.pid, signal.SIGKILL)
    assert q.returncode != 0 and "in use by another command (pid" in err, \
        f"a second command entered the running command's folder (exit {q.returncode}):\n{err[-2000:]}"
    assert before == {p: open(p, "rb").read() for p in before}


def _stop(p, how: str, rng: random.Random, marker: str) -> None:
    if how == "SIGKILL":
        p.send_signal(signal.SIGKILL)
    elif how == "SIGTERM":
        p.send_signal(signal.SIGTERM)
    elif how == "SIGINTx3":  # Ctrl-C pressed three times, as a terminal sends it: to the process group
        for _ in range(3):
            os.killpg(p.pid, signal.SIGINT)
            time.sleep(0.1)
    else:
        below = _below(p.pid, marker)
        victim = rng.choice(below) if below else p.pid
        os.kill(victim, signal.SIGKILL)


def _nothing_left(p, marker: str, tmp) -> None:
    """No process of the run and no temporary folder, within 30 s of the command's end."""
    deadline = time.monotonic() + 30
    while True:
        left, group, files = _marked(marker), _group_alive(p.pid), os.listdir(tmp)
        if not (left or group or files):
            return
        if time.monotonic() > deadline:
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            if group:
                os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"left behind {time.monotonic() - deadline + 30:.0f} s after the command ended: processes "
                        f"{left} (group alive: {group}), temporary files {files}")
        time.sleep(0.2)


def _check_same(out, ref) -> None:
    assert _runs(out) == _runs(ref)
    for run in _runs(ref):
        assert _comparable(_rows(os.path.join(out, run, "metrics.jsonl"))) == \
            _comparable(_rows(os.path.join(ref, run, "metrics.jsonl"))), run
        got, want = (torch.load(os.path.join(d, run, "model.pt"), weights_only=True)["params"] for d in (out, ref))
        assert torch.equal(got, want), run


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Each engine's command run without interruption (made on first use)."""
    made = {}

    def get(engine: str) -> str:
        if engine not in made:
            base = tmp_path_factory.mktemp(f"ref-{engine}")
            out = str(base / "out")
            p = _start([*ENGINES[engine][0], "--out", out], _env(base / "tmp", uuid.uuid4().hex), str(base))
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
            made[engine] = out
        return made[engine]
    return get


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_command_killed_at_a_random_moment_leaves_nothing_running_and_resumes_exactly(
        engine, tmp_path, fuzz_budget, references):
    first, n = fuzz_budget(1)
    argv, resume, rounds = ENGINES[engine]
    for seed in range(first, first + n):
        rng = random.Random(f"{engine}-{seed}")
        how, at = STOPS[(seed + list(ENGINES).index(engine)) % len(STOPS)], rng.randint(1, max(1, rounds // 4))
        case = tmp_path / f"seed-{seed}"
        case.mkdir()
        marker, out = uuid.uuid4().hex, str(case / "out")
        env = _env(case / "tmp", marker)
        p = _start([*argv, "--out", out], env, str(case))
        _wait_rows(p, out, at)
        _second_command_is_refused(resume, out, env, str(case))
        time.sleep(rng.uniform(0.0, 0.3))
        _stop(p, how, rng, marker)
        try:
            _, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"{engine}, {how}: the command did not end within 120 s")
        _nothing_left(p, marker, case / "tmp")
        if how in ("SIGTERM", "SIGINTx3") and p.returncode != 0:  # stopped (not finished first)
            assert p.returncode == 128 + (signal.SIGTERM if how == "SIGTERM" else signal.SIGINT), err[-2000:]
            assert "resume with:" in err, f"{engine}, {how}: no resume command printed:\n{err[-2000:]}"
            for run in _runs(out):
                assert os.path.isfile(os.path.join(out, run, "summary.json")), f"{engine}, {how}: no summary in {run}"
        _check_valid(out)
        q = _start([*resume, out], env, str(case))
        _, err = q.communicate(timeout=600)
        assert q.returncode == 0, f"{engine}, {how} at row {at}: the resume failed:\n{err[-3000:]}"
        _nothing_left(q, marker, case / "tmp")
        _check_same(out, references(engine))
