"""The kill harness (issue 36, item 6): every engine — one process, ``run --workers 2``, ``sweep --jobs
2``, ``run --flower``, one process with ``--state disk`` (issue 39 item 2) — started through the command
line with checkpoints, then stopped at a random moment by SIGKILL, SIGTERM, Ctrl-C pressed three times
within 0.3 s (SIGINT to the process group, as a terminal sends it) or SIGKILL to a random process
below the command. Then:

* no process of the run is left: none in the command's process group, none carrying the test's
  marker in its environment (``FK_KILL_HARNESS=<uuid>``, inherited by every process below it), and
  nothing in the folder changes after the command has ended;
* no temporary folder is left (the command runs with ``TMPDIR`` of its own, which must end empty);
* a second command on its folder (``--resume``), started while the command is frozen (SIGSTOP) in
  the middle of its run, is refused, naming it, and changes nothing;
* a stop other than SIGKILL wrote each run's ``summary.json`` and printed how to resume;
* the folder is valid (every JSON file and metrics line parses) and ``--resume`` completes;
* the final model and every metrics row (less its clock readings) equal those of the same command
  run without interruption, bit for bit (float64).

Every check is made and every finding listed (the numbers are issue 36's defects) before the test
fails. Seeded (``--fuzz-seed``): the seed picks each engine's stop (the default seed gives each engine
another one of the four; seeds 0-3 give every engine each) and its moment; ``--fuzz-long`` runs many
seeds. Marked ``processes``: about 5 minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pathlib
import random
import shutil
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
    "flower": (["run", "--flower", "-a", "fedavg", "-N", "2", "-T", "8", *DATA], ["run", "--flower", "--resume"], 8),
    # SCAFFOLD's c_i in a disk store: its files run ahead of the checkpoint, whose rows are in the state/ row log
    "disk": (["run", "-a", "scaffold", "-N", "8", "--clients-per-round", "3", "--state", "disk", "-T", "300", *DATA],
             ["run", "--resume"], 300),
}
STOPS = ("SIGINTx3", "SIGKILL", "SIGKILL a child", "SIGTERM")  # seed s: engine i gets STOPS[(s + i) % 4]
CLOCK = ("wall_time", "elapsed")  # and every *_time key: readings of the clock, not of the run


def _env(tmp, marker: str) -> dict:
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "FK_KILL_HARNESS": marker, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}


def _start(argv, env, cwd) -> subprocess.Popen:
    """The command, its output in files of ``cwd`` (a pipe nobody reads while it runs could fill)."""
    k = len(glob.glob(os.path.join(cwd, "stderr-*")))
    err = pathlib.Path(cwd) / f"stderr-{k}"
    with open(err, "w") as e:
        p = subprocess.Popen([sys.executable, "-m", "python_algos", *argv], env=env, cwd=cwd, text=True,
                             stdout=subprocess.DEVNULL, stderr=e, start_new_session=True,
                             preexec_fn=sigint_as_in_a_terminal)
    p.stderr_file = err
    return p


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


def _kill_marked(marker: str) -> None:
    for pid in _marked(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


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
    """Until a run has more than ``rows`` rounds: lines of its metrics.jsonl, or of the rounds file
    that the Flower server writes beside its checkpoint (the metrics are written at the end)."""
    deadline = time.monotonic() + timeout
    while True:
        found = glob.glob(f"{out}/**/metrics.jsonl", recursive=True) + glob.glob(f"{out}/*rounds.jsonl")
        counts = [len(open(m).read().splitlines()) for m in found]
        if counts and max(counts) > rows:
            return
        if p.poll() is not None or time.monotonic() > deadline:
            os.killpg(p.pid, signal.SIGKILL)
            err = p.stderr_file.read_text()
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


def _frozen(p, marker: str) -> list:
    """SIGSTOP the command's group and every process of the run (those are SIGCONTed after)."""
    os.killpg(p.pid, signal.SIGSTOP)
    pids = _marked(marker)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def _second_command(resume, out, env, cwd, p, marker: str):
    """Defect 4: with the command frozen in the middle of its run, another one on its folder must be
    refused, naming the holder, and change nothing; what it did instead, or None."""
    before = {q: open(q, "rb").read() for q in glob.glob(f"{out}/**/config.json", recursive=True)}
    if p.poll() is not None:
        pytest.fail(f"the command ended before its stop:\n{p.stderr_file.read_text()[-3000:]}")
    frozen = _frozen(p, marker)
    try:
        q = _start([*resume, out], env, cwd)
        try:
            q.wait(timeout=300)
        finally:
            if q.poll() is None:
                os.killpg(q.pid, signal.SIGKILL)
                q.wait()
        err = q.stderr_file.read_text()
    finally:
        os.killpg(p.pid, signal.SIGCONT)
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    if not (q.returncode != 0 and "in use by another command (pid" in err):
        return f"defect 4: a second command entered the running command's folder (exit {q.returncode}): {err[-600:]}"
    if before != {q: open(q, "rb").read() for q in before}:
        return "defect 4: the refused second command changed the folder"
    return None


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


GRACE = 10.0  # seconds after the command's end for its processes to be gone (a generous bound: ~0.1 s)


def _left_behind(p, marker: str, tmp):
    """Processes of the run and temporary files still there :data:`GRACE` seconds after the command's
    end (then killed and removed), or None."""
    deadline = time.monotonic() + GRACE
    while True:
        left, group, files = _marked(marker), _group_alive(p.pid), os.listdir(tmp)
        if not (left or group or files):
            return None
        if time.monotonic() > deadline:
            shown = _described(left)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            if group:
                os.killpg(p.pid, signal.SIGKILL)
            for f in files:
                shutil.rmtree(os.path.join(tmp, f), ignore_errors=True)
            return (f"defect 3: left behind {GRACE:g} s after the command ended: processes {shown} (group "
                    f"alive: {group}), temporary files {files}")
        time.sleep(0.2)


def _state(out) -> dict:
    """Every file under ``out``: its size and modification time."""
    found = {}
    for path in glob.glob(f"{out}/**", recursive=True):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            found[path] = (st.st_size, st.st_mtime_ns) if not os.path.isdir(path) else None
    return found


def _changed(before: dict, out):
    """Defect 3 seen in the folder: what changed in it after the command had ended, or None."""
    after = _state(out)
    changed = sorted(os.path.relpath(p, out) for p in set(before) | set(after) if before.get(p) != after.get(p))
    return f"defect 3: the folder changed after the command ended: {changed[:8]}" if changed else None


def _described(pids) -> list:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f"{pid} " + " ".join(f.read().decode(errors="replace").split("\0"))[:100])
        except OSError:
            out.append(str(pid))
    return out


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
            p.wait(timeout=600)
            assert p.returncode == 0, p.stderr_file.read_text()[-3000:]
            made[engine] = out
        return made[engine]
    return get


def _ended(p, engine: str, how: str, timeout: float = 120.0):
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail(f"{engine}, {how}: the command did not end within {timeout:g} s")
    return p.stderr_file.read_text()


def _stopped_properly(p, err: str, out, how: str):
    """Defect 13: a stop other than SIGKILL (of a command it did not find finished) exits 128 + the
    signal, prints the resume command and leaves each run's summary; what was missing, or None."""
    statuses = [json.load(open(os.path.join(out, run, "summary.json"))).get("status")
                for run in _runs(out) if os.path.isfile(os.path.join(out, run, "summary.json"))]
    if how not in ("SIGTERM", "SIGINTx3") or p.returncode == 0 or (statuses and set(statuses) == {"completed"}):
        return None  # the command had finished when the stop came
    want = 128 + (signal.SIGTERM if how == "SIGTERM" else signal.SIGINT)
    missing = [f"exit {p.returncode}, not {want}"] if p.returncode != want else []
    missing += ["no resume command printed"] if "resume with:" not in err else []
    missing += [f"no summary.json in {run}" for run in _runs(out) if not os.path.isfile(os.path.join(out, run,
                                                                                                         "summary.json"))]
    return f"defect 13 ({how}): " + "; ".join(missing) + f": {err[-400:]}" if missing else None


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_command_killed_at_a_random_moment_leaves_nothing_running_and_resumes_exactly(
        engine, tmp_path, fuzz_budget, references, request):
    first, n = fuzz_budget(1)
    argv, resume, rounds = ENGINES[engine]
    findings = []
    for seed in range(first, first + n):
        rng = random.Random(f"{engine}-{seed}")
        how, at = STOPS[(seed + list(ENGINES).index(engine)) % len(STOPS)], rng.randint(1, max(1, rounds // 4))
        case = tmp_path / f"seed-{seed}"
        case.mkdir()
        marker, out = uuid.uuid4().hex, str(case / "out")
        request.addfinalizer(lambda marker=marker: _kill_marked(marker))  # a failed case leaves nothing either
        env = _env(case / "tmp", marker)
        p = _start([*argv, "--out", out], env, str(case))
        _wait_rows(p, out, at)
        findings.append(_second_command(resume, out, env, str(case), p, marker))
        time.sleep(rng.uniform(0.0, 0.3))
        _stop(p, how, rng, marker)
        err = _ended(p, engine, how)
        time.sleep(1.0)  # the processes below it end within a moment (a generous bound: ~0.1 s) ...
        ended = _state(out)
        findings += [_left_behind(p, marker, case / "tmp"), _stopped_properly(p, err, out, how)]
        time.sleep(1.0)  # ... after which nothing writes (the old code's orphans went on appending rows)
        findings.append(_changed(ended, out))
        _check_valid(out)
        q = _start([*resume, out], env, str(case))
        err = _ended(q, engine, "resume", 600.0)
        assert q.returncode == 0, f"{engine}, {how} at row {at}: the resume failed:\n{err[-3000:]}\n{findings}"
        findings.append(_left_behind(q, marker, case / "tmp"))
        findings = [f for f in findings if f]
        assert not findings, f"{engine}, seed {seed}, {how} at row {at}:\n" + "\n".join(findings)
        _check_same(out, references(engine))
