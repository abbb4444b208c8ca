"""docs/flower.md's "Several machines" recipe, run for real: a SuperLink in one network namespace, the
SuperNodes in another, joined only by a veth pair (10.77.0.1 <-> 10.77.0.2), with the TLS certificate
and SuperNode keys of ``python -m python_algos.deploy.credentials``, SuperNode authentication on and
each node's public key registered with ``flwr supernode register``. The example app's final model
equals ``python_algos.simulate``'s to 1e-10 (float64); a SuperNode whose key was not registered, and
one that trusts another CA, are refused. Needs root and ``ip netns`` (skipped, with the reason,
elsewhere). Every process left in the two namespaces is killed and the namespaces are deleted, on
success or failure.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("flwr", reason='Flower is not installed: pip install ".[flower]"')

import _example_app as example_app  # noqa: E402

from python_algos.deploy import credentials  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(ROOT, "examples", "flower_app")
BIN = os.path.dirname(sys.executable)  # Flower's commands, installed beside this Python
SERVER_IP, CLIENT_IP, PORT = "10.77.0.1", "10.77.0.2", 9092
NODES = 3
pytestmark = [pytest.mark.slow, pytest.mark.processes]








# -- two network namespaces joined by a veth pair ------------------------------------------------------
def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60, check=check)


def _netns_pids(ns):
    p = _ip("netns", "pids", ns, check=False)
    return [int(x) for x in p.stdout.split()] if p.returncode == 0 else []


def _end_netns_processes(names):
    """Kill every process in the namespaces ``names`` (only this test's processes live there: Flower's
    SuperExec starts app processes in process groups of their own) and wait until they are gone."""
    for ns in names:
        for pid in _netns_pids(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 30
    while any(_netns_pids(ns) for ns in names) and time.monotonic() < deadline:
        time.sleep(0.2)


def _remove_netns(names):
    """End the processes left in the namespaces, then delete them (the veth pair goes with them)."""
    _end_netns_processes(names)
    for ns in names:
        _ip("netns", "del", ns, check=False)


@pytest.fixture
def netns():
    """(server namespace, clients namespace): 10.77.0.1/24 and 10.77.0.2/24 on the two ends of a veth
    pair, loopback up in each; nothing else (no route to the host's network)."""
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed: network namespaces cannot be made")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (`ip netns add` as uid 0)")
    tag = os.getpid()
    server, clients, veth_s, veth_c = f"pa-srv-{tag}", f"pa-cli-{tag}", f"pas{tag}", f"pac{tag}"
    made = []
    try:
        for ns in (server, clients):
            p = _ip("netns", "add", ns, check=False)
            if p.returncode != 0:
                pytest.skip(f"`ip netns add` failed here: {p.stderr.strip()}")
            made.append(ns)
        _ip("link", "add", veth_s, "type", "veth", "peer", "name", veth_c)
        for ns, dev, addr in ((server, veth_s, SERVER_IP), (clients, veth_c, CLIENT_IP)):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield server, clients
    finally:
        _remove_netns(made)
        _ip("link", "del", veth_s, check=False)  # only if it never moved into a namespace


# -- Flower's processes, each in a namespace, in its own process group ---------------------------------
class Processes:
    def __init__(self, folder, env, namespaces):
        self.folder, self.env, self.namespaces, self.procs = folder, env, namespaces, {}

    def start(self, name, ns, args, home):
        log = open(os.path.join(self.folder, name + ".log"), "w")
        p = subprocess.Popen(["ip", "netns", "exec", ns, *args], stdout=log, stderr=subprocess.STDOUT,
                             env={**self.env, "FLWR_HOME": home}, cwd=self.folder, start_new_session=True)
        self.procs[name] = p
        return p

    def run(self, name, ns, args, home, timeout):
        p = self.start(name, ns, args, home)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{' '.join(args[:3])} did not end within {timeout} s:\n{self.log(name)}")
        return p.returncode

    def log(self, name, tail=4000):
        with open(os.path.join(self.folder, name + ".log")) as f:
            return f.read()[-tail:] if tail else f.read()

    def wait_for(self, name, text, timeout):
        deadline = time.monotonic() + timeout
        while text not in self.log(name):
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{name} did not log {text!r} within {timeout} s:\n{self.log(name)}")
            time.sleep(0.3)

    def close(self):
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the group's stragglers
            except ProcessLookupError:
                pass
            p.wait()
        _end_netns_processes(self.namespaces)


def _flwr_home(folder, creds):
    """The Flower CLI's home on the machine that runs `flwr`: the connection to the SuperLink over TLS."""
    os.makedirs(folder, mode=0o700)
    with open(os.path.join(folder, "config.toml"), "w") as f:
        f.write(f'[superlink]\ndefault = "pa-net"\n\n[superlink.pa-net]\naddress = "{SERVER_IP}:{PORT}"\n'
                f'root-certificates = "{creds["ca.crt"]}"\n')
    return folder


def _peers(log):
    """The client addresses of the SuperLink's logged HTTP requests (uvicorn's access log)."""
    return set(re.findall(r"\[uvicorn\.access\] ([0-9a-fA-F.:\[\]]+):\d+ - ", log))


def _toml(v):
    return repr(v) if isinstance(v, (int, float)) else '"' + str(v) + '"'


def _supernode(i, creds, state, ca=None, partition=None):
    """Client i's SuperNode (key node-<i>), trusting ``ca`` (default: the deployment's CA)."""
    return [os.path.join(BIN, "flower-supernode"), "--superlink", f"{SERVER_IP}:{PORT}",
            "--root-certificates", ca or creds["ca.crt"], "--auth-supernode-private-key", creds[f"node-{i}.key"],
            "--port", str(9094 + i),  # each node's local API for its ClientApps (127.0.0.1 of its namespace)
            "--max-retries", "3", "--max-wait-time", "60",  # a refused node gives up instead of retrying forever
            "--node-config", f'partition-id={i if partition is None else partition} num-partitions={NODES} '
                             f'state-dir="{state}"']


def _register(procs, ns, home, pub, name):
    """``flwr supernode register``: the node id the SuperLink gave the key."""
    rc = procs.run(name, ns, [os.path.join(BIN, "flwr"), "supernode", "register", pub, "pa-net"], home, 120)
    found = re.search(r"SuperNode (\d+) registered", procs.log(name))
    assert rc == 0 and found, procs.log(name)
    return found.group(1)


def _start_superlink(procs, ns, creds, home):
    procs.start("superlink", ns, [os.path.join(BIN, "flower-superlink"), "--ssl-ca-certfile", creds["ca.crt"],
                                  "--ssl-certfile", creds["server.pem"], "--ssl-keyfile", creds["server.key"],
                                  "--enable-supernode-auth", "--disable-runtime-dependency-installation",
                                  "--host", SERVER_IP, "--port", str(PORT),
                                  "--database", os.path.join(procs.folder, "superlink.db")], home)
    procs.wait_for("superlink", f"running on https://{SERVER_IP}:{PORT}", 120)


def _start_nodes(procs, ns, creds, folder, cli_home):
    """Clients 0..N-1 (registered keys), node N (a key never registered) and node N+1 (a registered
    key, but trusting another CA than the SuperLink's): the node ids of N+1."""
    ids = [_register(procs, ns, cli_home, creds[f"node-{i}.pub"], f"register-{i}") for i in (*range(NODES), NODES + 1)]
    for i in range(NODES + 1):
        procs.start(f"supernode-{i}", ns, _supernode(i, creds, folder / "state"), str(folder / f"node-home-{i}"))
    credentials.make_credentials(str(folder / "other"), [SERVER_IP], 1)
    procs.start(f"supernode-{NODES + 1}", ns, _supernode(NODES + 1, creds, folder / "state",
                                                          ca=str(folder / "other" / "ca.crt"), partition=NODES + 1),
                str(folder / f"node-home-{NODES + 1}"))
    return ids


def _check_refused(procs, untrusting_id):
    """Node N (unregistered key) and node N+1 (another CA) were refused; nothing reached the SuperLink
    but over the veth link."""
    log = procs.log("superlink", tail=None)
    for i in (NODES, NODES + 1):
        assert procs.procs[f"supernode-{i}"].wait(timeout=120) != 0, procs.log(f"supernode-{i}")
    assert "Failed to activate SuperNode" in procs.log(f"supernode-{NODES}", tail=None)
    assert "No SuperNode found with the given public key" in log
    assert "CERTIFICATE_VERIFY_FAILED" in procs.log(f"supernode-{NODES + 1}", tail=None)
    assert f"Activated node_id={untrusting_id}" not in log
    peers = _peers(log)
    # everything came over the veth link: the clients' end, and the server's own app processes
    assert CLIENT_IP in peers and peers <= {CLIENT_IP, SERVER_IP}, peers


def test_superlink_and_supernodes_in_separate_network_namespaces_equal_simulate(netns, tmp_path):
    server, clients = netns
    # as docs/flower.md shows it
    assert credentials.main([str(tmp_path / "creds"), "--server-address", SERVER_IP, "--nodes", str(NODES + 2)]) == 0
    creds = {f: str(tmp_path / "creds" / f) for f in os.listdir(tmp_path / "creds")}
    assert oct(os.stat(tmp_path / "creds").st_mode & 0o777) == "0o700"
    assert {oct(os.stat(p).st_mode & 0o777) for p in creds.values()} == {"0o600"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, APP, os.environ.get("PYTHONPATH", "")]),
           "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    cli_home = _flwr_home(str(tmp_path / "cli-home"), creds)
    cfg = example_app.config(rounds=2, **{"num-clients": NODES, "clients-per-round": 2, "algorithm": "scaffold",
                               "round-timeout": 120.0})
    procs = Processes(str(tmp_path), env, [server, clients])
    try:
        _start_superlink(procs, server, creds, str(tmp_path / "server-home"))
        ids = _start_nodes(procs, clients, creds, tmp_path, cli_home)
        over = {k: cfg[k] for k in ("rounds", "num-clients", "clients-per-round", "algorithm", "round-timeout")}
        run_config = " ".join(f"{k}={_toml(v)}" for k, v in {**over, "result-dir": str(tmp_path / "result")}.items())
        run = [os.path.join(BIN, "flwr"), "run", APP, "pa-net", "--stream", "--run-config", run_config]
        assert procs.run("flwr-run", clients, run, cli_home, 400) == 0, procs.log("flwr-run")
        _check_refused(procs, ids[-1])
    finally:
        procs.close()
    assert [n for n in (server, clients) if _netns_pids(n)] == []
    got = torch.load(tmp_path / "result" / "result.pt", weights_only=True)
    want = example_app.simulate(cfg).params
    assert float((got["params"] - want).abs().max()) <= 1e-10 * (1 + float(want.abs().max()))
    assert not torch.equal(got["params"], example_app.task().model_fn(cfg)().weight.detach().reshape(-1))
