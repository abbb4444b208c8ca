"""A real local Flower deployment: one SuperLink and one SuperNode per client as local processes.

    with LocalDeployment(num_clients=4) as dep:
        result = dep.start_run("examples/flower_app", {"rounds": 5, ...}).wait()   # the ServerApp's result.pt

Every process listens on 127.0.0.1 only (Flower 1.41 speaks HTTP between them; ``--insecure`` is
used on loopback only) and answers only the deploying user's processes (:mod:`.same_user`: another
account that knows the port can neither start a run nor join a SuperNode), in its own process group,
so that leaving the ``with`` block, on success, error, Ctrl-C, SIGTERM or SIGHUP (inside the block
they raise ``KeyboardInterrupt``: :func:`~python_algos.runfolder.signals.terminate_as_interrupt`),
ends the processes and everything they started (Flower's SuperExec and app processes, the ServerApp
included: after the block no process of the deployment writes anything). Stopping is not itself
interrupted: a second signal waits until every process has ended. Every process is a child of
:mod:`~python_algos.system.processes`, so the kernel and the command's watcher end them, and the
temporary folder goes, when the command dies without leaving the block (SIGKILL, out of memory).
The SuperLink's port is checked to be its own (no process of another user took it first) before any
SuperNode joins, and each SuperNode checks it again. The Flower CLI's home (``FLWR_HOME``) is in
that temporary folder: the user's is not touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Optional

import torch

from ..runfolder.signals import stop_signals_held, terminate_as_interrupt
from ..system import processes
from . import same_user
from .app_project import toml_value
from .wire import ERROR_FILE

__all__ = ["LocalDeployment", "FlowerRun", "DeploymentError"]


class DeploymentError(RuntimeError):
    """The deployment failed (a process did not start, the run failed or did not finish in time)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalDeployment:
    """SuperLink + ``num_clients`` SuperNodes (``partition-id`` = 0..N-1) on 127.0.0.1."""

    def __init__(self, num_clients: int, env: Optional[dict] = None,
                 node_config: Optional[dict] = None, watch_nodes: bool = True):
        """``node_config``: more node config for every SuperNode (e.g. ``{"state-dir": folder}``, where
        each node keeps its state on disk so that a stopped run can resume). ``watch_nodes``: a run
        waited on here stops as soon as one of these SuperNode processes has exited, naming its
        client (the server itself would wait its round timeout for the missing reply)."""
        if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
            raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
        self.num_clients, self.watch_nodes = num_clients, bool(watch_nodes)
        self.node_config = dict(node_config or {})
        self.dir = processes.temp_dir("pa-flower-")  # removed by close(), or by the watcher if the command dies
        self.bin = os.path.dirname(sys.executable)  # Flower's commands, installed beside this Python
        self.env = {**os.environ, **(env or {}), "FLWR_HOME": os.path.join(self.dir, "flwr-home")}
        # Flower's SuperExecs look for a task (an app process to start) every second by default; on
        # loopback a tenth of that costs nothing and saves about half a second per message
        self.env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
        self.env["PATH"] = self.bin + os.pathsep + self.env.get("PATH", "")  # the SuperLink starts flower-superexec
        self.procs: dict[str, processes.Child] = {}
        self.port: Optional[int] = None
        self.runs, self.result_dir = 0, None
        self._signals = contextlib.ExitStack()

    # -- processes --------------------------------------------------------------------------
    def _start(self, name: str, args: list, guarded: bool = True) -> processes.Child:
        """Start ``args``, logging to ``name``: Flower's ``flower-superlink`` / ``flower-supernode``
        ``guarded`` by :mod:`.same_user` (its HTTP API then answers only this user's processes; run as
        a file, not ``-m``: importing python_algos, torch, would cost each process seconds), or not."""
        args = [sys.executable, same_user.__file__, *args] if guarded else args
        with open(os.path.join(self.dir, name + ".log"), "w") as log:
            p = self.procs[name] = processes.spawn(args, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                   cwd=self.dir)
        return p

    def log(self, name: str, tail: int = 3000) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self.dir, name + ".log")) as f:
            return f.read()[-tail:]
        return ""

    def __enter__(self):
        self._signals.enter_context(terminate_as_interrupt())  # SIGTERM / SIGHUP: leave the block, ending all
        self._signals.callback(self.close)  # run first on leaving, even if start() fails
        try:
            self.start()
        except BaseException:
            self._signals.close()
            raise
        return self

    def __exit__(self, *exc):
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
                                     "--node-config", " ".join(f"{k}={toml_value(k, v)}" for k, v in cfg.items())])

    def _wait_port(self, port: int, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise DeploymentError(f"the {name} exited at start (code {self.procs[name].returncode}):\n"
                                      f"{self.log(name)}")
            child = self.procs[name]
            holder = same_user.listener(port)
            if holder is not None:
                if holder[1] in same_user.socket_inodes([child.pid, *processes.marked_processes(child.token)]):
                    return
                raise DeploymentError(f"127.0.0.1:{port}, the port chosen for the {name}, was taken first by "
                                      f"another process (uid {holder[0]}); the deployment was stopped before "
                                      f"anything joined it: run the command again (it picks another port)")
            time.sleep(0.2)
        raise DeploymentError(f"the {name} did not listen on 127.0.0.1:{port} within {timeout:g} s:\n{self.log(name)}")

    def kill_node(self, i: int) -> None:
        """Kill client i's SuperNode and what it started (tests: a node dying mid-run)."""
        self.procs[f"supernode-{i}"].kill()

    def close(self) -> None:
        """End every process started here and everything they started, those that left its group
        included (Flower's SuperExec starts an app process in a group of its own):
        :func:`~python_algos.system.processes.stop_all`. Ctrl-C, SIGTERM and SIGHUP wait until
        it is done."""
        with stop_signals_held():
            processes.stop_all(list(self.procs.values()), signal.SIGTERM, grace=10.0)
            self.procs.clear()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- a run --------------------------------------------------------------------------------
    def start_run(self, app_dir: str, run_config: dict) -> "FlowerRun":
        """Start ``flwr run app_dir`` with ``run_config`` overrides (``result-dir`` is set here, one
        folder per run) and return at once; several runs may share the SuperNodes (each node handles
        one message at a time, the runs' messages in turn). :meth:`FlowerRun.wait` collects it."""
        self.runs += 1
        k = self.runs
        out = self.result_dir = os.path.join(self.dir, f"result-{k}")
        cfg = " ".join(f"{key}={toml_value(key, v)}" for key, v in {**run_config, "result-dir": out}.items())
        name = "flwr-run" if k == 1 else f"flwr-run-{k}"
        p = self._start(name, [os.path.join(self.bin, "flwr"), "run", os.path.abspath(app_dir), "--run-config", cfg,
                               "--stream"], guarded=False)
        return FlowerRun(self, name, p, out)


class FlowerRun:
    """One ``flwr run`` of a :class:`LocalDeployment` (``result_dir``: where its ServerApp writes)."""

    def __init__(self, dep: LocalDeployment, name: str, proc: processes.Child, result_dir: str):
        self.dep, self.name, self.proc, self.result_dir = dep, name, proc, result_dir

    def wait(self, timeout: float = 600.0, poll: Optional[Callable[[], None]] = None) -> dict:
        """The ServerApp's ``result.pt``, once the run has ended; DeploymentError if it failed (with the
        ServerApp's error, e.g. a NodeFailure naming the client, or Flower's log) or did not end within
        ``timeout`` seconds. ``poll()`` is called while waiting (a few times a second) and at the end."""
        deadline = time.monotonic() + timeout
        poll = poll or (lambda: None)
        while self.proc.poll() is None:
            poll()
            stopped = [(i, p.returncode) for i in range(self.dep.num_clients) if self.dep.watch_nodes
                       and (p := self.dep.procs.get(f"supernode-{i}")) is not None and p.poll() is not None]
            if stopped:  # (client, exit status) of the SuperNodes that are no longer running
                self.proc.signal(signal.SIGTERM)  # the run's server goes with the deployment
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
