"""A real local Flower deployment: one SuperLink and one SuperNode per client as local processes.

    with LocalDeployment(num_clients=4) as dep:
        result = dep.run("examples/flower_app", {"rounds": 5, ...})   # the ServerApp's result.pt

Every process listens on 127.0.0.1 only (Flower 1.41 speaks HTTP between them; ``--insecure`` is
used on loopback only) and answers only the deploying user's processes (:mod:`.same_user`: another
account that knows the port can neither start a run nor join a SuperNode), in its own process group,
so that leaving the ``with`` block, on success, error, Ctrl-C, SIGTERM or SIGHUP (inside the block
they raise ``KeyboardInterrupt``: :func:`~python_algos.runfolder.signals.terminate_as_interrupt`),
ends the processes and everything they started (Flower's SuperExec and app processes, the ServerApp
included: after the block no process of the deployment writes anything). Stopping is not itself
interrupted: a second signal waits until every process has ended. The Flower CLI's home
(``FLWR_HOME``) is a temporary folder: the user's is not touched.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

import torch

from ..runfolder.signals import STOP_SIGNALS, terminate_as_interrupt
from . import same_user
from .wire import ERROR_FILE

__all__ = ["LocalDeployment", "FlowerRun", "DeploymentError", "marked_processes", "stop_signals_held"]


class DeploymentError(RuntimeError):
    """The deployment failed (a process did not start, the run failed or did not finish in time)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


class LocalDeployment:
    """SuperLink + ``num_clients`` SuperNodes (``partition-id`` = 0..N-1) on 127.0.0.1."""

    def __init__(self, num_clients: int, workdir: Optional[str] = None, env: Optional[dict] = None,
                 node_config: Optional[dict] = None, watch_nodes: bool = True):
        """``node_config``: more node config for every SuperNode (e.g. ``{"state-dir": folder}``, where
        each node keeps its state on disk so that a stopped run can resume). ``watch_nodes``: a run
        waited on here stops as soon as one of these SuperNode processes has exited, naming its
        client (the server itself would wait its round timeout for the missing reply)."""
        if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
            raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
        self.num_clients, self.watch_nodes = num_clients, bool(watch_nodes)
        self.node_config = dict(node_config or {})
        self._own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix="pa-flower-")
        self.bin = os.path.dirname(sys.executable)  # Flower's commands, installed beside this Python
        self.env = {**os.environ, **(env or {}), "FLWR_HOME": os.path.join(self.dir, "flwr-home")}
        # Flower's SuperExecs look for a task (an app process to start) every second by default; on
        # loopback a tenth of that costs nothing and saves about half a second per message
        self.env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
        self.env["PATH"] = self.bin + os.pathsep + self.env.get("PATH", "")  # the SuperLink starts flower-superexec
        self.procs: dict[str, subprocess.Popen] = {}
        self.port: Optional[int] = None
        self.runs, self.result_dir = 0, None
        self._signals = contextlib.ExitStack()

    # -- processes --------------------------------------------------------------------------
    def _start(self, name: str, args: list) -> subprocess.Popen:
        """Start Flower's ``args[0]`` (``flower-superlink`` or ``flower-supernode``): its HTTP API
        answers only this user's processes (:mod:`.same_user`)."""
        log = open(os.path.join(self.dir, name + ".log"), "w")
        # run as a file, not ``-m``: importing python_algos (torch) would cost each process seconds
        p = subprocess.Popen([sys.executable, same_user.__file__, *args], stdout=log, stderr=subprocess.STDOUT,
                             env=self.env, cwd=self.dir, start_new_session=True)  # its own group: killpg ends all
        self.procs[name] = p
        return p

    def log(self, name: str, tail: int = 3000) -> str:
        try:
            with open(os.path.join(self.dir, name + ".log")) as f:
                return f.read()[-tail:]
        except OSError:
            return ""

    def __enter__(self):
        self._signals.enter_context(terminate_as_interrupt())  # SIGTERM / SIGHUP: leave the block, ending all
        try:
            self.start()
        except BaseException:
            self.close()
            self._signals.close()
            raise
        return self

    def __exit__(self, *exc):
        try:
            self.close()
        finally:
            self._signals.close()

    def start(self) -> None:
        try:
            same_user.check_peer_lookup()
        except OSError as e:
            raise DeploymentError(str(e)) from None
        os.makedirs(self.env["FLWR_HOME"], mode=0o700, exist_ok=True)
        self.port = _free_port()
        with open(os.path.join(self.env["FLWR_HOME"], "config.toml"), "w") as f:
            f.write(f'[superlink]\ndefault = "pa-local"\n\n[superlink.pa-local]\n'
                    f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        self._start("superlink", ["flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(self.port),
                                  "--database", os.path.join(self.dir, "superlink.db"),
                                  "--disable-runtime-dependency-installation"])
        self._wait_port(self.port, "superlink", 60)
        if not same_user.is_guarded(self.port):
            raise DeploymentError("the SuperLink answers without the check that only your user's processes reach "
                                  "it: this Flower version builds its HTTP app elsewhere than Flower 1.41 did "
                                  f"({same_user.__file__} would need updating)")
        for i in range(self.num_clients):
            self.start_node(i)

    def start_node(self, i: int) -> None:
        """Start client i's SuperNode (again, after :meth:`kill_node`: it rejoins the SuperLink)."""
        cfg = {"partition-id": i, "num-partitions": self.num_clients, **self.node_config}
        self._start(f"supernode-{i}", ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                                       "--host", "127.0.0.1", "--port", str(_free_port()),
                                       "--node-config", " ".join(f"{k}={_toml(v)}" for k, v in cfg.items())])

    def _wait_port(self, port: int, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise DeploymentError(f"the {name} exited at start (code {self.procs[name].returncode}):\n"
                                      f"{self.log(name)}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise DeploymentError(f"the {name} did not listen on 127.0.0.1:{port} within {timeout:g} s:\n{self.log(name)}")

    def stopped_nodes(self) -> list:
        """(client, exit status) of the SuperNodes started here that are no longer running."""
        return [(i, p.returncode) for i in range(self.num_clients)
                if (p := self.procs.get(f"supernode-{i}")) is not None and p.poll() is not None]

    def kill_node(self, i: int) -> None:
        """Kill client i's SuperNode and what it started (tests: a node dying mid-run)."""
        p = self.procs[f"supernode-{i}"]
        _killpg(p, signal.SIGKILL)
        p.wait()

    def close(self) -> None:
        """End every process started here and everything they started: each runs in its own process
        group, and the processes that left it (Flower's SuperExec starts an app process in a group
        of its own) are found as descendants before anything is stopped (once a parent is gone, its
        orphans no longer point back to it), and then by the deployment's ``FLWR_HOME`` in their
        environment (one started meanwhile). Ctrl-C, SIGTERM and SIGHUP wait until it is done."""
        with stop_signals_held():
            family = _descendants([p.pid for p in self.procs.values() if p.poll() is None])
            for p in self.procs.values():
                _killpg(p, signal.SIGTERM)
            deadline = time.monotonic() + 10
            for p in self.procs.values():
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                _killpg(p, signal.SIGKILL)  # the group's stragglers (SuperExec, app processes) too
                p.wait()
            for pid in family:  # those in other groups (a ServerApp waiting on a node that died)
                _kill(pid)
            _kill_environ_marked("FLWR_HOME=" + self.env["FLWR_HOME"])
            self.procs.clear()
            if self._own_dir:
                shutil.rmtree(self.dir, ignore_errors=True)

    # -- a run --------------------------------------------------------------------------------
    def start_run(self, app_dir: str, run_config: dict) -> "FlowerRun":
        """Start ``flwr run app_dir`` with ``run_config`` overrides (``result-dir`` is set here, one
        folder per run) and return at once; several runs may share the SuperNodes (each node handles
        one message at a time, the runs' messages in turn). :meth:`FlowerRun.wait` collects it."""
        self.runs += 1
        k = self.runs
        out = self.result_dir = os.path.join(self.dir, f"result-{k}")
        cfg = " ".join(f"{key}={_toml(v)}" for key, v in {**run_config, "result-dir": out}.items())
        name = "flwr-run" if k == 1 else f"flwr-run-{k}"
        log = open(os.path.join(self.dir, name + ".log"), "w")
        p = subprocess.Popen([os.path.join(self.bin, "flwr"), "run", os.path.abspath(app_dir), "--run-config", cfg,
                              "--stream"], stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.dir,
                             start_new_session=True)
        self.procs[name] = p
        return FlowerRun(self, name, p, out)

    def run(self, app_dir: str, run_config: dict, timeout: float = 600.0,
            poll: Optional[Callable[[], None]] = None) -> dict:
        """:meth:`start_run` and wait for it: the ServerApp's ``result.pt``. Raises DeploymentError
        with the ServerApp's error (e.g. a NodeFailure naming the client) or Flower's log if the run
        fails, or if it does not finish within ``timeout`` seconds. ``poll()``: called while waiting
        (a few times a second) and once when the run has ended, e.g. to show its progress."""
        return self.start_run(app_dir, run_config).wait(timeout, poll)


class FlowerRun:
    """One ``flwr run`` of a :class:`LocalDeployment` (``result_dir``: where its ServerApp writes)."""

    def __init__(self, dep: LocalDeployment, name: str, proc: subprocess.Popen, result_dir: str):
        self.dep, self.name, self.proc, self.result_dir = dep, name, proc, result_dir

    def wait(self, timeout: float = 600.0, poll: Optional[Callable[[], None]] = None) -> dict:
        """The ServerApp's ``result.pt``, once the run has ended; DeploymentError if it failed or
        did not end within ``timeout`` seconds. ``poll()`` is called while waiting and at the end."""
        deadline = time.monotonic() + timeout
        poll = poll or (lambda: None)
        while self.proc.poll() is None:
            poll()
            stopped = self.dep.stopped_nodes() if self.dep.watch_nodes else []
            if stopped:
                _killpg(self.proc, signal.SIGTERM)  # the run's server goes with the deployment
                raise DeploymentError("; ".join(
                    f"client {i}'s SuperNode stopped during the run ("
                    + (f"killed by signal {-code}" if code < 0 else f"exit status {code}") + ")"
                    for i, code in stopped) + "; the run was stopped")
            if time.monotonic() > deadline:
                raise DeploymentError(f"the Flower run did not finish within {timeout:g} s:\n"
                                      f"{self.dep.log(self.name)}")
            time.sleep(0.2)
        poll()
        path = os.path.join(self.result_dir, "result.pt")
        if not os.path.exists(path):
            failure = os.path.join(self.result_dir, ERROR_FILE)  # the ServerApp's own account of what stopped it
            if os.path.exists(failure):
                with open(failure) as f:
                    raise DeploymentError(f.read().strip())
            raise DeploymentError(f"the Flower run ended without a result:\n{self.dep.log(self.name)}")
        return torch.load(path, weights_only=True)  # tensors and plain containers: no code runs on load


def _descendants(roots: list) -> list:
    """Every live process below ``roots`` (Linux: read from /proc; elsewhere none)."""
    children: dict = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], list(roots)
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def marked_processes(marker: str) -> list:
    """Live processes whose environment holds ``marker`` (Linux: read from /proc; elsewhere none)."""
    found, me = [], os.getpid()
    for env in glob.glob("/proc/[0-9]*/environ"):
        pid = int(env.split("/")[2])
        try:
            with open(env, "rb") as f:
                if pid == me or b"\0" + marker.encode() + b"\0" not in b"\0" + f.read() + b"\0":
                    continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":  # a zombie has ended already
                    found.append(pid)
        except OSError:
            continue
    return found


def _kill_environ_marked(marker: str, timeout: float = 10.0) -> None:
    """SIGKILL every process whose environment holds ``marker`` until none is left (a process
    started while the others were being stopped is caught by the next look)."""
    deadline = time.monotonic() + timeout
    while (pids := marked_processes(marker)) and time.monotonic() < deadline:
        for pid in pids:
            _kill(pid)
        time.sleep(0.05)


@contextlib.contextmanager
def stop_signals_held():
    """Hold Ctrl-C, SIGTERM and SIGHUP in this thread, delivered when the block ends: for work that a
    stop must not cut halfway (stopping the deployment, leaving processes behind; closing a run
    folder without its summary)."""
    held = {signal.SIGINT, *STOP_SIGNALS}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, ValueError, OSError):  # no POSIX signal masks here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _killpg(p: subprocess.Popen, sig) -> None:
    try:
        os.killpg(p.pid, sig)  # the process was started as a group leader (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass
