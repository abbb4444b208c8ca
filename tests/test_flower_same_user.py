"""Only the deploying user drives a local Flower deployment: a process of another user that knows the
SuperLink's port can neither start a run (whose ServerApp would run as the deploying user) nor join
a SuperNode; the same commands by the deploying user still work.

The other user is uid 65534 (``nobody``), reached with ``setuid`` in the child: the test runs as root
only (and skips, saying so, elsewhere or where the switch fails). The peer lookup itself is checked
against sockets whose owners the test sets.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from python_algos.deploy import same_user

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(ROOT, "examples", "flower_app")
OTHER = 65534  # nobody


def _as_other():
    os.setgroups([])
    os.setgid(OTHER)
    os.setuid(OTHER)


def _other_python() -> list:
    """A Python command uid 65534 can run, importing this Flower (this Python may live where that
    user cannot read: then the system's Python of the same version, given this Python's packages)."""
    if not hasattr(os, "setuid") or os.getuid() != 0:
        pytest.skip("switching a child process to another user needs root")
    flwr = pytest.importorskip("flwr", reason='Flower is not installed: pip install ".[flower]"')
    packages = os.path.dirname(os.path.dirname(flwr.__file__))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    tried = []
    for py in dict.fromkeys([sys.executable, shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")]):
        if not py:
            continue
        try:
            out = subprocess.run([py, "-c", "import os, flwr.cli.app; print(os.getuid())"], preexec_fn=_as_other,
                                 env={"PYTHONPATH": packages, "HOME": "/"}, capture_output=True, text=True,
                                 timeout=120, cwd="/")
        except (OSError, subprocess.SubprocessError) as e:
            tried.append(f"{py}: {e}")
            continue
        if out.returncode == 0 and out.stdout.strip() == str(OTHER):
            return [py], packages
        tried.append(f"{py}: {out.stderr.strip()[-200:]}")
    pytest.skip(f"no Python with Flower that uid {OTHER} can run: " + "; ".join(tried))


def _linux_only() -> None:
    try:
        same_user.check_peer_lookup()
    except OSError as e:
        pytest.skip(str(e))


# -- the peer lookup, against sockets of known owners --------------------------------------------
def test_the_peer_of_a_loopback_connection_is_its_socket_owner():
    _linux_only()
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with socket.create_connection(srv.getsockname()) as c:
            conn, peer = srv.accept()
            with conn:
                for lookup in (same_user.peer_uid, same_user.listed_peer_uid):  # sock_diag, /proc/net/tcp
                    assert lookup(peer, conn.getsockname()) == os.getuid()
                    assert lookup(("::ffff:" + peer[0], peer[1]), conn.getsockname()) == os.getuid()
                    assert lookup(("127.0.0.1", 1), conn.getsockname()) is None
            c.close()
            # a closed client end names no owner (a closing socket could otherwise pass for root's)
            for lookup in (same_user.peer_uid, same_user.listed_peer_uid):
                assert lookup(peer, srv.getsockname()) is None


def test_a_connection_from_another_users_process_is_named_with_that_user():
    _linux_only()
    py, _ = _other_python()
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        code = ("import socket, sys, time; c = socket.create_connection(('127.0.0.1', %d)); print(1, flush=True); "
                "sys.stdin.read()" % srv.getsockname()[1])
        p = subprocess.Popen([*py, "-c", code], preexec_fn=_as_other, stdin=subprocess.PIPE, cwd="/",
                             stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "1"
            conn, peer = srv.accept()
            with conn:
                assert same_user.peer_uid(peer, conn.getsockname()) == OTHER
                assert same_user.listed_peer_uid(peer, conn.getsockname()) == OTHER
        finally:
            p.stdin.close()
            p.wait(timeout=30)


# -- a real deployment ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _home(port: int, owner: int, python: list = ()) -> str:
    """A Flower CLI home naming the deployment's SuperLink (all another user needs: its port), with a
    copy of the app, owned by ``owner``."""
    home = tempfile.mkdtemp(prefix="pa-flower-other-")
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write(f'[superlink]\ndefault = "dep"\n\n[superlink.dep]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
    shutil.copytree(APP, os.path.join(home, "app"), ignore=shutil.ignore_patterns("__pycache__"))
    if python:
        _superexec_command(home, python)
    for folder, dirs, files in os.walk(home):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.chown(name, owner, owner)
    return home


_FLWR = "import sys; from flwr.cli.app import app; sys.argv[0] = 'flwr'; sys.exit(app())"
_SUPERNODE = ("import sys; from flwr.supernode.cli import flower_supernode; sys.argv[0] = 'flower-supernode'; "
              "sys.exit(flower_supernode())")


def _env(home: str, packages: str = "") -> dict:
    """The environment of a Flower command run with the CLI home ``home`` (``packages``: uid 65534's,
    whose commands are in ``home/bin``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    path = os.pathsep.join(p for p in [ROOT, APP, packages] if p)
    bin_dir = os.path.join(home, "bin") if packages else os.path.dirname(sys.executable)
    return {**env, "FLWR_HOME": home, "HOME": home, "PYTHONPATH": path, "PATH": bin_dir + os.pathsep + env["PATH"]}


def _superexec_command(home: str, python: list) -> None:
    """``home/bin/flower-superexec`` run by ``python``: what a SuperNode of uid 65534 starts."""
    os.makedirs(os.path.join(home, "bin"))
    path = os.path.join(home, "bin", "flower-superexec")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec {" ".join(python)} -c "import sys; from flwr.supercore.cli import '
                f'flower_superexec; sys.argv[0] = \'flower-superexec\'; sys.exit(flower_superexec())" "$@"\n')
    os.chmod(path, 0o755)


def _flwr(home: str, args: list, other=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``flwr ARGS`` with the Flower CLI home ``home``: by this user, or by uid 65534 when ``other`` is
    the (Python command, packages) it can run."""
    if other is None:
        cmd, env = [os.path.join(os.path.dirname(sys.executable), "flwr")], _env(home)
    else:
        cmd, env = [*other[0], "-c", _FLWR], _env(home, other[1])
    return subprocess.run([*cmd, *args], cwd=home, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_as_other if other is not None else None)


def _start_run(home: str, other=None) -> subprocess.CompletedProcess:
    return _flwr(home, ["run", os.path.join(home, "app"), "--run-config", "rounds=1 num-clients=2"], other)


_STATUS = ("import sys, urllib.request, urllib.error\ntry:\n"
           "    print(urllib.request.urlopen(sys.argv[1], timeout=60).status)\n"
           "except urllib.error.HTTPError as e:\n    print(e.code)")


def _wait_listening(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listened on 127.0.0.1:{port} within {timeout:g} s")


def _http_status(url: str, other=None) -> int:
    """The HTTP status of GET ``url``, asked by this user or by uid 65534 (``other``)."""
    out = subprocess.run([*(other[0] if other else [sys.executable]), "-c", _STATUS, url], capture_output=True,
                         text=True, timeout=120, cwd="/", preexec_fn=_as_other if other else None)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def _nodes(home: str) -> list:
    out = _flwr(home, ["supernode", "list", "--format", "json"])
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout).get("nodes", [])


@pytest.mark.processes
def test_only_the_deploying_user_starts_runs_and_joins_nodes():
    _linux_only()
    other = _other_python()
    from python_algos.deploy.local import LocalDeployment

    with LocalDeployment(2, env={"PYTHONPATH": os.pathsep.join([ROOT, APP])}) as dep:
        theirs, mine = _home(dep.port, OTHER, other[0]), _home(dep.port, os.getuid())
        try:
            attack = _start_run(theirs, other)
            assert attack.returncode != 0, "another user started a run:\n" + attack.stdout + attack.stderr
            assert "403" in attack.stdout + attack.stderr, attack.stdout + attack.stderr
            # every API of the SuperLink and of a SuperNode (its ClientApps' Runtime API) answers the same
            node_port = int(dep.procs["supernode-0"].args[dep.procs["supernode-0"].args.index("--port") + 1])
            _wait_listening(node_port)
            assert same_user.is_guarded(dep.port) and same_user.is_guarded(node_port)
            for port in (dep.port, node_port):
                assert _http_status(f"http://127.0.0.1:{port}/health", other) == 403
                assert _http_status(f"http://127.0.0.1:{port}/health") != 403
            node = subprocess.Popen(
                [*other[0], "-c", _SUPERNODE, "--insecure", "--superlink", f"127.0.0.1:{dep.port}",
                 "--host", "127.0.0.1", "--port", str(_free_port()),
                 "--node-config", "partition-id=0 num-partitions=2"],
                cwd=theirs, env=_env(theirs, other[1]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                preexec_fn=_as_other, start_new_session=True)
            try:
                time.sleep(8)  # ample for a SuperNode to register (the deployment's own took well under that)
                listed = _nodes(mine)
            finally:
                os.killpg(node.pid, 9)
                node_log = node.communicate(timeout=30)[0].decode(errors="replace")
            assert len(listed) == 2, f"another user's SuperNode joined: {listed}\n{node_log[-2000:]}"
            assert "403" in node_log, node_log[-2000:]
            mine_run = _start_run(mine)
            assert mine_run.returncode == 0, mine_run.stdout + mine_run.stderr
        finally:
            shutil.rmtree(theirs, ignore_errors=True)
            shutil.rmtree(mine, ignore_errors=True)
