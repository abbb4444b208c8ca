"""Issue 36, defects 1, 2, 3, 4 and 13: children that outlive a SIGKILLed command, a second command in
a running command's folder, a SuperLink port another process took first, the current folder on
every Flower process's PYTHONPATH, the nodes' data caches readable by all, and Ctrl-C pressed two or
three times cutting the summary short. Each test failed on the code before the issue (3347ecf).

Ground truth: the kernel's own tables, read in /proc (which processes live, which socket a process
holds, which process holds an flock), the files' modes, and files a planted ``sitecustomize.py``
would write.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest
import torch
from _signals import sigint_as_in_a_terminal, wait_for_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
# no empty entry: it would mean the current folder, for the command itself
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
       "OMP_NUM_THREADS": "1"}
RUN = ["-a", "fedavg", "--dataset", "sparse_logistic", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt",
       "nnz=3", "-N", "4", "-B", "10", "--dtype", "float64", "--seed", "1", "--no-plot", "--checkpoint-every", "1"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone_within(pids, seconds: float) -> list:
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# --------------------------------------------------------------------------- #
# defect 3: the children of a SIGKILLed command
# --------------------------------------------------------------------------- #

_PARENT = """
import subprocess, sys, time
from python_algos.system import processes
child = processes.spawn([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE)
print(child.pid, child.popen.stdout.readline().decode().strip(), processes.temp_dir("pa-test-"), flush=True)
time.sleep(600)
"""
# a child that starts a grandchild in a session of its own (as torchrun starts its ranks and Flower's
# SuperExec its apps), then prints the grandchild's pid
_CHILD = ("import subprocess, sys, time; p = subprocess.Popen(['sleep', '600'], start_new_session=True); "
          "print(p.pid, flush=True); time.sleep(600)")


@LINUX
def test_a_sigkilled_command_takes_its_children_their_children_and_its_temp_folder_along(tmp_path):
    """Before: torchrun's ranks, sweep workers and the Flower processes ran on after the command's
    SIGKILL (nothing but a Python ``finally`` ended them). Now the kernel kills the child
    (PDEATHSIG) and the command's watcher every process carrying its token, in any session, and
    removes its temporary folder."""
    env = {**ENV, "TMPDIR": str(tmp_path)}
    cmd = subprocess.Popen([sys.executable, "-c", _PARENT, _CHILD], env=env, stdout=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        child, grandchild, temp = cmd.stdout.readline().split()
        child, grandchild = int(child), int(grandchild)
        assert _alive(child) and _alive(grandchild) and os.path.isdir(temp)
        cmd.send_signal(signal.SIGKILL)
        cmd.wait()
        assert _gone_within([child, grandchild], 20) == []
        deadline = time.monotonic() + 20
        while os.path.exists(temp) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(temp)
    finally:
        for pid in (child, grandchild):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_temp_folder_left_by_a_dead_owner_is_removed_by_the_next_start(tmp_path, monkeypatch):
    """When the watcher died too (both SIGKILLed), the next command's temp folder of that prefix
    removes the leftover (its owner's pid is dead); a live owner's folder stays."""
    from python_algos.system import processes

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    dead = _a_dead_pid()
    stale, live = tmp_path / f"pa-test-{dead}-abc", tmp_path / f"pa-test-{os.getppid()}-def"
    stale.mkdir()
    live.mkdir()
    fresh = processes.temp_dir("pa-test-")
    assert not stale.exists() and live.is_dir() and os.path.isdir(fresh)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o700
    os.rmdir(fresh)


def _a_dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# --------------------------------------------------------------------------- #
# defect 4: one command per folder
# --------------------------------------------------------------------------- #

_HOLDER = """
import sys, time
from python_algos.system.lock import folders_locked, lock_folder
with folders_locked():
    lock_folder(sys.argv[1])
    print("locked", flush=True)
    time.sleep(600)
"""


@LINUX
@pytest.mark.parametrize("argv", [["run", "--resume"], ["run", "--replace", *RUN, "-T", "3", "--out"],
                                  ["sweep", "--resume"], ["compare", "--resume"]],
                         ids=["resume", "replace", "sweep-resume", "compare-resume"])
def test_a_second_command_in_a_locked_folder_is_refused_naming_the_holder(tmp_path, argv, capsys):
    """Before: ``run --resume`` / ``--replace`` entered a folder that a running command still wrote,
    both exited 0 and the folder mixed the two runs. Now the second is refused in one line naming the
    holder (pid and command), and nothing in the folder changes; once the holder is SIGKILLed, its
    lock is taken over."""
    from python_algos.experiments.cli import main

    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"algorithm": "fedavg"}))
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = sorted(os.listdir(out)), (out / "config.json").read_bytes()
        assert main([*argv, str(out)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"is in use by another command (pid {holder.pid}: " in err, err
        assert (sorted(os.listdir(out)), (out / "config.json").read_bytes()) == before
    finally:
        holder.kill()
        holder.wait()
    from python_algos.system.lock import folders_locked, lock_folder

    with folders_locked():
        lock_folder(str(out))  # the dead holder's lock: taken over


# --------------------------------------------------------------------------- #
# defect 13: Ctrl-C pressed two or three times
# --------------------------------------------------------------------------- #

@LINUX
@pytest.mark.parametrize("presses", [2, 3])
def test_ctrl_c_pressed_again_within_a_moment_still_writes_the_summary_and_the_resume_command(tmp_path, presses):
    """Before: the second Ctrl-C cut the first one's path short: only ``interrupted`` printed, no
    summary.json, no resume command. Now the presses within a second are one stop."""
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "python_algos", "run", *RUN, "-T", "100000", "--out", str(out)],
                         env=ENV, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=sigint_as_in_a_terminal)
    try:
        wait_for_rows(out / "metrics.jsonl", p, rows=3)
        for _ in range(presses):
            os.killpg(p.pid, signal.SIGINT)  # as a terminal sends it: to the foreground group
            time.sleep(0.3 / presses)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err
    assert f"resume with: python -m python_algos run --resume {out}" in err, err
    with open(out / "summary.json") as f:
        assert json.load(f)["status"] == "interrupted"


# --------------------------------------------------------------------------- #
# defects 1, 2 and the data caches: the deployment's ports, code path and files
# --------------------------------------------------------------------------- #

class _Squatter(http.server.BaseHTTPRequestHandler):
    """Another user's server on the port: it answers as a guarded SuperLink would."""

    def do_GET(self):  # noqa: N802 - the standard library's name
        self.send_response(200)
        self.send_header("x-same-user-only", "1")
        self.end_headers()

    def log_message(self, *a):
        pass


@LINUX
@pytest.mark.processes
def test_a_superlink_port_taken_first_by_another_process_is_refused_before_any_node_joins(monkeypatch):
    """Before: the deployment took whatever answered on its port for its SuperLink and started its
    SuperNodes against it (another user's server then ran its ClientApps as you). Now the socket
    listening there must be one of its SuperLink's own, else nothing joins."""
    pytest.importorskip("flwr")
    from python_algos.deploy import local
    from python_algos.deploy.local import DeploymentError, LocalDeployment

    squat = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Squatter)
    threading.Thread(target=squat.serve_forever, daemon=True).start()
    ports = iter([squat.server_address[1]])
    free = local._free_port
    monkeypatch.setattr(local, "_free_port", lambda: next(ports, None) or free())
    dep = LocalDeployment(1)
    try:
        with pytest.raises(DeploymentError, match="taken first by another process"):
            dep.start()
        assert not any(name.startswith("supernode") for name in dep.procs)
    finally:
        dep.close()
        squat.shutdown()


def test_a_supernode_refuses_a_superlink_socket_of_another_user(monkeypatch):
    """The client side of the same check: a SuperNode started here does not join a loopback
    SuperLink whose listening socket belongs to another uid."""
    from python_algos.deploy import same_user

    monkeypatch.setattr(same_user, "listener", lambda port: (os.getuid() + 1, 1))
    with pytest.raises(SystemExit, match="not yours"):
        same_user.main(["flower-supernode", "--insecure", "--superlink", "127.0.0.1:9092"])


def test_the_flower_processes_path_holds_no_current_folder_and_no_folder_others_can_write(tmp_path, monkeypatch):
    """Before: the current folder went on every Flower process's PYTHONPATH, so a sitecustomize.py
    there (in /tmp, a shared project folder) ran as you in the SuperLink, SuperNodes and apps. Now
    only a user's class's own folder goes there, and only if others cannot write it."""
    from python_algos.experiments import flower_run
    from python_algos.experiments.config import Config, ConfigError

    monkeypatch.chdir(tmp_path)
    cfg = Config.from_dict({"algorithm": "fedavg"})
    assert str(tmp_path) not in flower_run._python_path(cfg).split(os.pathsep)
    pkg = tmp_path / "mine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "algs.py").write_text("from python_algos.algorithms.fedavg import FedAvg as Mine\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = cfg.replace(algorithm="mine.algs:Mine")
    os.chmod(tmp_path, 0o755)
    assert str(tmp_path) in flower_run._python_path(cfg).split(os.pathsep)
    os.chmod(tmp_path, 0o777)
    with pytest.raises(ConfigError, match="other users can write"):
        flower_run._python_path(cfg)
    os.chmod(tmp_path, 0o755)


@LINUX
@pytest.mark.processes
def test_run_flower_from_a_folder_with_a_sitecustomize_runs_none_of_it(tmp_path):
    """The end-to-end check of the path: a sitecustomize.py in the current folder writes a file from
    any Python process that imports it; after a whole ``run --flower`` there is none."""
    pytest.importorskip("flwr")
    mark = tmp_path / "imported-sitecustomize"
    (tmp_path / "sitecustomize.py").write_text(f"import sys; open({str(mark)!r}, 'a').write(repr(sys.argv))\n")
    env = {**ENV, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    done = subprocess.run([sys.executable, "-m", "python_algos", "run", "--flower", *RUN, "-N", "2", "-T", "1",
                           "--out", str(tmp_path / "out")], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not mark.exists(), f"a Flower process imported the current folder's sitecustomize.py: {mark.read_text()}"


def test_a_nodes_data_cache_is_readable_by_its_owner_only(tmp_path):
    """Before: each node's cache of its client's training rows was written 0644 in a 0755 folder."""
    from python_algos.deploy.data_cache import ClientDataCache

    os.umask(0o022)
    cache = ClientDataCache(str(tmp_path / "state"), 0)
    cache.save({"k": 1}, {"x": torch.ones(3)}, {})
    assert stat.S_IMODE(os.stat(cache.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(cache.path)).st_mode) == 0o700
    assert cache.load({"k": 1}) is not None


def test_a_nodes_saved_state_is_readable_by_its_owner_only(tmp_path):
    """Before: each node's state of a round (its rows of the client fields, its copies, its last upload,
    kept in its state-dir for a resume) was written 0644 in 0755 folders, beside a 0600 data cache."""
    from python_algos.deploy.persist import NodeStore

    os.umask(0o022)
    store = NodeStore(str(tmp_path / "state"), "0123abcd", 1)
    store.save(3, {"state:c_i": torch.ones(3)})
    assert stat.S_IMODE(os.stat(store.path(3)).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(store.dir).st_mode) == 0o700
    assert torch.equal(store.load(3)["state:c_i"], torch.ones(3))


def test_the_port_check_reads_who_listens(tmp_path):
    """:func:`same_user.listener` against a socket bound here: its uid and inode, which this process's
    own file descriptors hold (:func:`same_user.socket_inodes`)."""
    from python_algos.deploy import same_user

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        got = same_user.listener(port)
        assert got is not None and got[0] == os.getuid()
        assert got[1] in same_user.socket_inodes([os.getpid()])
    assert same_user.listener(port) is None
