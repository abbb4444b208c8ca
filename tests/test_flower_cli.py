"""``python -m python_algos run ... --flower`` (python_algos/experiments/flower_run.py).

Ground truth: the one-process ``run`` of the same settings (the sequential executor, float64). The
Flower run goes through real processes (a SuperLink and one SuperNode per client), so those tests
are marked ``slow``; the refusals are checked up front and are fast. Leftover processes are found
by their environment: the command runs with ``TMPDIR`` in the test's folder, so the deployment's
folder (and the ``FLWR_HOME`` every Flower process inherits) lies there.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("flwr", reason='Flower is not installed: pip install ".[flower]"')

from _signals import sigint_as_in_a_terminal  # noqa: E402

from python_algos.experiments import flower_run  # noqa: E402
from python_algos.experiments.cli import main  # noqa: E402
from python_algos.simulate import History  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ["--dataset", "sparse_logistic", "--data-opt", "n=240", "--data-opt", "dim=12", "-N", "3", "-T", "2", "-B", "8",
        "--dtype", "float64", "--executor", "sequential", "--seed", "3", "--no-progress", "--no-plot"]
ARGS = ["-a", "scaffold", "--clients-per-round", "2", *BASE]  # partial participation, minibatches: the seeded draws


def _procs_with(marker: str) -> list:
    """Live processes whose environment mentions ``marker`` (the Flower processes of one command)."""
    found = []
    for env in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(env, "rb") as f:
                if marker.encode() in f.read():
                    pid = int(env.split("/")[2])
                    with open(f"/proc/{pid}/stat") as s:
                        if s.read().split(")")[-1].split()[0] != "Z":  # a zombie is gone
                            found.append(pid)
        except OSError:
            continue
    return found


def _cli(args, tmp_path, **kw):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONFAULTHANDLER": "1",  # see _output
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.Popen([sys.executable, "-m", "python_algos", "run", *args], env=env, cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=sigint_as_in_a_terminal, **kw)


def _output(p, timeout: float) -> str:
    """What the command printed once it has exited; if it has not within ``timeout`` seconds, fail with
    where it is stuck: SIGABRT makes Python's faulthandler (PYTHONFAULTHANDLER, set by _cli) print
    every thread's stack."""
    try:
        return p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)
        out = p.communicate(timeout=60)[0]
        pytest.fail(f"the command did not exit within {timeout:g} s; its output and stacks:\n{out[-6000:]}")


def _rows(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


# -- refused before anything is written --------------------------------------------------------
@pytest.mark.parametrize("extra, words", [
    (["--workers", "2"], "--flower with --workers"),
    (["--seeds", "2"], "--flower with several seeds"),
    (["-a", "depositum"], "-a depositum: --flower deploys server–client algorithms"),  # the flag as typed
    (["-a", "feddr", "--alg-opt", "init_from=paper"], "--flower -a feddr: FedDR"),
])
def test_a_combination_flower_cannot_run_is_refused_before_anything(tmp_path, capsys, extra, words):
    out = tmp_path / "run"
    assert main(["run", "-a", "fedcanon", *BASE, "--flower", "--out", str(out), *extra]) == 1
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert not out.exists()


def test_resume_across_engines_is_refused(tmp_path, capsys):
    """A folder of run --flower resumes only with --flower (its checkpoint is the server's alone), and a
    one-process folder only without it; nothing is changed."""
    one = tmp_path / "one"
    assert main(["run", *ARGS, "-T", "1", "--out", str(one)]) == 0
    before = sorted(os.listdir(one))
    assert main(["run", "--resume", str(one), "--flower"]) == 1
    assert "ran in this process, not through Flower: continue it without --flower" in capsys.readouterr().err
    (one / "flower.json").write_text('{"engine": "flower", "run_key": "0123456789abcdef"}')
    assert main(["run", "--resume", str(one)]) == 1
    assert f"ran through Flower (run --flower): continue it the same way, with `python -m python_algos run " \
           f"--resume {one} --flower`" in capsys.readouterr().err
    assert sorted(os.listdir(one)) == sorted(before + ["flower.json"])
    assert main(["run", *ARGS, "--round-timeout", "5", "--out", str(tmp_path / "x")]) == 1
    assert "--round-timeout is the Flower server's wait" in capsys.readouterr().err


def test_a_model_with_batchnorm_is_refused_before_anything(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "-a", "fedavg", "--dataset", "image_like", "--model", "resnet18", "-N", "2", "-T", "1",
                 "--no-progress", "--no-plot", "--flower", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "--flower with --model resnet18: a training pass updates module buffers ('bn1' (BatchNorm2d)" in err, err
    assert "Choose a model without it (e.g. --model mlp)" in err
    assert not out.exists()


def test_flower_missing_names_the_install_line(monkeypatch):
    monkeypatch.setattr(flower_run.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r'--flower needs Flower .*pip install "\.\[flower\]"'):
        flower_run.check_flower_flags()


# -- real processes ---------------------------------------------------------------------------
def _kill_supernode(marker: str, client: int) -> None:
    """SIGKILL the SuperNode of ``client`` (and what it started) among the processes of one command."""
    for pid in _procs_with(marker):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "flower-supernode" in cmd and f"partition-id={client} " in cmd:
            os.killpg(pid, signal.SIGKILL)
            return
    raise AssertionError(f"no SuperNode of client {client} found")


def _checkpoint_round(path) -> int:
    """The round of the server checkpoint at ``path`` (-1: none yet)."""
    from python_algos.deploy.persist import load_server

    try:
        return int(load_server(str(path))["round"])
    except FileNotFoundError:
        return -1


@pytest.mark.processes
@pytest.mark.slow
def test_a_killed_node_stops_the_run_and_the_resume_is_exact(tmp_path):
    """Client 1's SuperNode dies after round 1 (it takes part in rounds 2 and 3): the command fails at
    once (the local deployment watches its nodes; the server alone would wait --round-timeout), naming
    client 1, every process ends, and the folder is whole: metrics up to the server's last
    checkpoint, status "failed", the resume command, no model.pt. Resuming (all nodes started anew,
    each restoring its own state) ends exactly where the one-process run of 3 rounds ends: the model,
    every metric of every round, the messages, the summary, History.load."""
    one, fl = tmp_path / "one", tmp_path / "fl"
    assert main(["run", *ARGS, "-T", "3", "--out", str(one)]) == 0
    p = _cli([*ARGS, "-T", "3", "--checkpoint-every", "1", "--flower", "--out", str(fl)],
             tmp_path)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and _checkpoint_round(fl / "flower-checkpoint.pt") < 1 and p.poll() is None:
        time.sleep(0.2)  # the server's checkpoint of round 1 (a fresh run's first is round 0's)
    _kill_supernode(str(tmp_path), 1)
    log = _output(p, 400)
    assert p.returncode == 1, log
    assert "client 1's SuperNode stopped during the run (killed by signal 9)" in log, log
    assert f"python -m python_algos run --resume {fl} --flower" in log, log
    with open(fl / "summary.json") as f:
        summary = json.load(f)
    done = summary["last_checkpoint_round"]
    assert summary["status"] == "failed" and 1 <= done < 3 and summary["rounds_done"] == done
    assert [r["round"] for r in _rows(fl)] == list(range(done + 1)) and not (fl / "model.pt").exists()
    assert _procs_with(str(tmp_path)) == []

    p = _cli(["--resume", str(fl), "--flower"], tmp_path)
    log = _output(p, 500)
    assert p.returncode == 0, log
    assert f"resuming {fl} from round {done} (the server's checkpoint), up to round 3" in log
    want, got = torch.load(one / "model.pt"), torch.load(fl / "model.pt")
    assert got["params"].dtype == torch.float64 and got["round"] == want["round"] == 3
    assert float((got["params"] - want["params"]).abs().max()) <= 1e-10 * (1 + float(want["params"].abs().max()))
    for a, b in zip(_rows(one), _rows(fl), strict=True):  # every metric of every round, from the same model
        assert a["round"] == b["round"]
        for k in ("f", "h", "f+h", "grad_map_sq", "test_acc", "sparsity"):
            assert abs(a[k] - b[k]) <= 1e-10 * (1 + abs(a[k])), (a["round"], k, a[k], b[k])
        if b["round"] > 0:
            assert (b["up"], b["down"]) == (a["up"], a["down"]) and b["sent_bytes"] > 0 and b["recv_bytes"] > 0
            assert len(b["participants"]) == 2
    with open(fl / "summary.json") as f:
        summary = json.load(f)
    assert (summary["engine"], summary["status"], summary["rounds_done"]) == ("flower", "completed", 3)
    assert History.load(str(fl)).params.tolist() == got["params"].tolist()
    assert _procs_with(str(tmp_path)) == []
    assert glob.glob(str(tmp_path / "pa-flower-*")) == []  # the deployments' folders are gone too


@pytest.mark.processes
@pytest.mark.slow
def test_a_flower_run_that_blows_up_ends_diverged_as_the_one_process_run(tmp_path):
    """FedAvg with a step far above 1/L: f+h exceeds 1e3 x its round-0 value at round 5. The one-process
    run stops there as "diverged", keeping the checkpoint of round 4; the Flower run's server, whose loop
    runs the same StopOnDivergence on f+h, stops at the same round: the same status, rounds, rows,
    checkpoint round and message, no model.pt. Before, the server ran every round and checkpointed round
    8 while the folder said it diverged at round 5."""
    args = ["-a", "fedavg", "--dataset", "sparse_linear", "--data-opt", "n=160", "--data-opt", "dim=8",
            "--data-opt", "nnz=3", "-N", "3", "-T", "8", "--local-steps", "2", "--lr", "1", "--dtype", "float64",
            "--executor", "sequential", "--seed", "3", "--no-progress", "--no-plot", "--checkpoint-every", "1"]
    one, fl = tmp_path / "one", tmp_path / "fl"
    status = main(["run", *args, "--out", str(one)])  # a diverged run's exit status
    p = _cli([*args, "--flower", "--out", str(fl)], tmp_path)
    log = _output(p, 400)
    assert status != 0 and p.returncode == status, log
    summaries = []
    for folder in (one, fl):
        with open(folder / "summary.json") as f:
            summaries.append(json.load(f))
    want, got = summaries
    assert want["status"] == "diverged" and 1 < want["rounds_done"] < 8, want  # the premise
    for key in ("status", "rounds_done", "last_checkpoint_round"):
        assert got[key] == want[key], (key, got[key], want[key])
    assert _checkpoint_round(fl / "flower-checkpoint.pt") == want["last_checkpoint_round"]
    assert got["message"] == want["message"].replace(str(one / "checkpoint.pt"), str(fl / "flower-checkpoint.pt"))
    assert [r["round"] for r in _rows(fl)] == [r["round"] for r in _rows(one)]
    assert abs(_rows(fl)[-1]["f+h"] - _rows(one)[-1]["f+h"]) <= 1e-10 * abs(_rows(one)[-1]["f+h"])
    assert not (fl / "model.pt").exists() and not (one / "model.pt").exists()
    assert _procs_with(str(tmp_path)) == []


@pytest.mark.processes
@pytest.mark.slow
def test_ctrl_c_ends_every_process_and_leaves_a_resumable_folder(tmp_path):
    out = tmp_path / "fl"
    p = _cli([*ARGS, "-T", "50", "--flower", "--out", str(out)], tmp_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not glob.glob(str(tmp_path / "pa-flower-*" / "flwr-run.log")):
        time.sleep(0.5)
    assert _procs_with(str(tmp_path)), "the deployment did not start"
    time.sleep(3)
    p.send_signal(signal.SIGINT)
    log = _output(p, 120)
    assert p.returncode == 130, log
    assert f"resume with: python -m python_algos run --resume {out} --flower" in log, log
    with open(out / "summary.json") as f:
        assert json.load(f)["status"] == "interrupted"
    assert _procs_with(str(tmp_path)) == []
    assert glob.glob(str(tmp_path / "pa-flower-*")) == []


def test_a_gpu_device_is_refused(tmp_path, monkeypatch, capsys):
    """--device auto on a machine with a GPU picks cuda: the Flower path runs on the CPU and says so."""
    from python_algos.experiments import prepare

    monkeypatch.setattr(prepare, "resolve_device", lambda name: torch.device("cuda"))
    out = tmp_path / "run"
    assert main(["run", *ARGS, "--device", "auto", "--flower", "--out", str(out)]) == 1
    assert "--device auto: --flower runs the clients and the server on the CPU" in capsys.readouterr().err
    assert not out.exists()
