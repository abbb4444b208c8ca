"""The distributed executor (torch.distributed, gloo) against one process.

Ground truth: the sequential executor in one process. The same runs on 2 and 3 ranks (processes
spawned with torch.multiprocessing, joining through the environment exactly as under torchrun)
must give the single-process model and metrics bit for bit (a mean and the metric pass add in
one process's order, the gossip adds each row's products in one process's order, a metric's mean over
the clients is torch's on the gathered rows) for every registered algorithm, full gradients and
minibatches, partial participation where supported, DEPOSITUM on a ring and a complete graph. The measured
communication is checked against the declared costs and against the topology (bytes), and the
command line is run for real under torchrun: 2 processes, ``--workers``, two "nodes" through a
localhost rendezvous, a killed rank restarted by ``--max-restarts 1``, and resuming a checkpoint
on another number of processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import _dist_cases as C
import pytest
import torch
from _signals import sigint_as_in_a_terminal, wait_for_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = {"wall_time", "elapsed", "prox_time", "grad_time", "fwd_bwd_time", "sent_bytes", "recv_bytes"}


_spawn = C.spawn_ranks


@pytest.fixture(scope="module")
def reference():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: C.run_case(name, "sequential") for name in C.cases()}
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def ranks(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"dist{world}")
    _spawn(C.rank_main, world, str(out), list(C.cases()), "sequential")
    return world, {name: [torch.load(out / f"{name}.rank{r}.pt", weights_only=False) for r in range(world)]
                   for name in C.cases()}


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.processes
@pytest.mark.parametrize("name", list(C.cases()))
def test_same_model_and_metrics_as_one_process(ranks, reference, name):
    world, runs = ranks
    ref = reference[name]
    for r, got in enumerate(runs[name]):
        assert got["executor"] == "distributed" and got["world_size"] == world
        assert torch.equal(got["params"], runs[name][0]["params"])  # replicated: the same bits on every rank
        assert torch.equal(got["params"], ref["params"]), (name, r)
        bad = {k: (got["last"][k], v) for k, v in ref["last"].items()  # the evals: this rank's clients'
               if k not in TIMING | {"grad_evals", "prox_evals"} and got["last"][k] != v}
        assert not bad, (name, r, bad)
        assert [{k: c[k] for k in ("up", "down")} for c in got["comm"]] == ref["comm"]


def _ring_or_complete_rows_sent(name: str, world: int, rank: int) -> int:
    """Rows rank ``rank`` sends per gossip (x or y), from the graph alone: client i goes once to
    every other rank holding a neighbour of i."""
    from python_algos.clients.process_group import bounds

    b = bounds(C.N, world)
    owner = lambda i: next(q for q, (lo, hi) in enumerate(b) if lo <= i < hi)  # noqa: E731
    lo, hi = b[rank]
    sent = 0
    for i in range(lo, hi):
        nbrs = [(i - 1) % C.N, (i + 1) % C.N] if "ring" in name else [j for j in range(C.N) if j != i]
        sent += len({owner(j) for j in nbrs} - {rank})
    return sent


@pytest.mark.processes
@pytest.mark.parametrize("name", list(C.cases()))
def test_measured_communication_equals_declared_costs(ranks, name):
    from python_algos.algorithms.registry import make

    world, runs = ranks
    alg_name, over, kw = C.cases()[name]
    alg = make(alg_name, lr=0.05, local_steps=3, **over)
    costs = alg.costs(C.N)
    d = sum(p.numel() for p in C.model().parameters())
    for r, got in enumerate(runs[name]):
        for t, c in enumerate(got["comm"], start=1):
            if alg_name == "depositum":
                talks = t % costs.comm_every == 0
                assert (c["up"], c["down"]) == ((costs.up, costs.down) if talks else (0, 0))
                rows = 2 * _ring_or_complete_rows_sent(name, world, r) if talks else 0  # x̃ and ỹ
                assert c["sent_bytes"] == rows * d * 8
            else:
                if alg_name != "scaffnew":  # SCAFFNEW communicates on a coin flip (declared: expected value)
                    assert (c["up"], c["down"]) == (costs.up, costs.down), (name, t)
                # every uplink d-vector is one chained sum: rank r hands ranks 0..r's running sum (2d + 1
                # float64) to rank r + 1, the last rank broadcasts the d-vector; the server sends nothing
                chain, last = (2 * d + 1) * 8, r == world - 1
                assert c["sent_bytes"] == c["up"] * (d * 8 if last else chain), (name, t, r)
                assert c["recv_bytes"] == c["up"] * ((r > 0) * chain + (not last) * d * 8), (name, t, r)


@pytest.mark.processes
@pytest.mark.parametrize("kind,world,expect", [
    ("bad-data", 2, "rank 1 of 2: client data must be non-empty with matching lengths"),
    ("too-few", 3, "2 clients cannot be split over 3 ranks"),
    ("batchnorm", 2, "rank 0 of 2: module '1' (BatchNorm1d) updates running statistics"),
])
def test_an_error_on_one_rank_is_raised_on_every_rank_with_its_number(tmp_path, kind, world, expect):
    _spawn(C.rank_error_main, world, str(tmp_path), kind, timeout=120)
    for r in range(world):
        msg = (tmp_path / f"rank{r}.txt").read_text()
        assert msg.startswith("ValueError") and expect in msg, (r, msg)


@pytest.mark.processes
def test_inner_batched_executor_matches_one_process(tmp_path, reference):
    names = ["fedavg-mb", "scaffold-pp", "depositum-ring-mb"]
    _spawn(C.rank_main, 2, str(tmp_path), names, "batched")
    for name in names:
        for r in range(2):
            got = torch.load(tmp_path / f"{name}.rank{r}.pt", weights_only=False)
            assert rel(got["params"], reference[name]["params"]) <= 1e-12, (name, r)


@pytest.mark.processes
def test_inner_auto_chooses_as_one_process_with_every_client_would(tmp_path):
    """100 clients: one process picks the batched executor (>= 64 clients); so does every rank of 2,
    although each holds only 50."""
    import torch.nn.functional as F

    import python_algos as pa
    from python_algos.clients import AUTO_MIN_CLIENTS

    n = 100
    assert n // 2 < AUTO_MIN_CLIENTS <= n
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(n)]
    one = pa.clients.resolve_executor("auto", torch.nn.Linear(3, 2))(torch.nn.Linear(3, 2), F.cross_entropy, data)
    _spawn(C.rank_auto_main, 2, str(tmp_path), n, timeout=120)
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)] == [one.executor] * 2 == ["batched"] * 2


@pytest.mark.processes
def test_a_cli_run_leaves_no_thread_of_the_group_on_any_rank(tmp_path):
    """The command line's run on 2 ranks with the batched executor inside (torch.func, which imports
    torch._dynamo after the group exists): when ``main`` returns, no thread of the group still runs."""
    argv = [a if a != "sequential" else "batched" for a in CLI]
    _spawn(C.rank_cli_main, 2, str(tmp_path), argv, timeout=240)
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)] == ["0 []"] * 2


def test_unsupported_inner_executor_is_rejected():
    import python_algos as pa

    with pytest.raises(ValueError, match="inner .* must be one of"):
        pa.DistributedClients(C.model(), C.loss, C.problem(), inner="distributed")


# --------------------------------------------------------------------------- #
# The command line under torchrun (real subprocesses)
# --------------------------------------------------------------------------- #

# a pinned executor: "auto" may pick another one per process, which changes the last bits
CLI = ["run", "--dataset", "synthetic", "-N", "7", "--model", "mlp", "--model-opt", "hidden=[8]", "--dtype",
       "float64", "-B", "8", "--lr", "0.05", "-K", "3", "--checkpoint-every", "2", "--executor", "sequential",
       "--no-progress", "--no-plot"]


def _env(**extra):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    env.update(extra)
    return env


def _run(cmd, timeout=240, **env):
    p = subprocess.run(cmd, env=_env(**env), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def _torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", *args, "-m", "python_algos"]


def _params(folder):
    return torch.load(os.path.join(folder, "model.pt"), weights_only=True)["params"]


@pytest.fixture(scope="module")
def depositum_runs(tmp_path_factory):
    """DEPOSITUM (gossip on a ring) for 8 rounds: one process, and torchrun with 2 processes."""
    base = tmp_path_factory.mktemp("cli")
    args = [*CLI, "-a", "depositum", "-T", "8"]
    _run([sys.executable, "-m", "python_algos", *args, "--out", str(base / "one")])
    _run([*_torchrun("--standalone", "--nproc-per-node", "2"), *args, "--out", str(base / "two")])
    return base, args


@pytest.mark.processes
@pytest.mark.slow
def test_torchrun_cli_matches_one_process(depositum_runs):
    base, _ = depositum_runs
    assert rel(_params(base / "two"), _params(base / "one")) <= 1e-12
    summary = json.loads((base / "two" / "summary.json").read_text())
    assert summary["executor"] == "distributed" and summary["world_size"] == 2 and summary["status"] == "completed"
    rounds = [json.loads(line)["round"] for line in (base / "two" / "metrics.jsonl").read_text().splitlines()]
    assert rounds == list(range(9))  # rank 0 alone writes
    assert summary["inner_executor"] == "sequential"
    assert sorted(os.listdir(base / "two")) == ["checkpoint.pt", "checkpoint.pt.shards", "config.json", "metrics.jsonl",
                                                "model.pt", "partition.json", "summary.json"]
    assert sorted(os.listdir(base / "two" / "checkpoint.pt.shards")) == ["round8.rank0-of-2.pt", "round8.rank1-of-2.pt"]


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "--workers"])
def test_compare_under_torchrun_matches_one_process(tmp_path, launcher):
    args = ["compare", *CLI[1:], "-a", "fedavg", "scaffold", "-T", "3"]
    _run([sys.executable, "-m", "python_algos", *args, "--out", str(tmp_path / "one")])
    if launcher == "torchrun":
        p = _run([*_torchrun("--standalone", "--nproc-per-node", "2"), *args, "--out", str(tmp_path / "two")])
    else:
        p = _run([sys.executable, "-m", "python_algos", *args, "--workers", "2", "--out", str(tmp_path / "two")])
    assert p.stdout.count("comparing fedavg, scaffold") == 1  # rank 0 alone prints
    runs = json.loads((tmp_path / "two" / "comparison.json").read_text())["runs"]
    assert [(r["label"], r["world_size"], r["status"]) for r in runs] == [("fedavg", 2, "completed"),
                                                                         ("scaffold", 2, "completed")]
    for name in ("fedavg", "scaffold"):
        assert rel(_params(tmp_path / "two" / name), _params(tmp_path / "one" / name)) <= 1e-12, name


def _folder_state(path) -> dict:
    import hashlib

    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.relpath(os.path.join(root, f), path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.mark.processes
@pytest.mark.slow
def test_a_missing_shard_is_named_and_nothing_changes(depositum_runs, tmp_path, capsys):
    from python_algos.experiments.cli import main

    base, _ = depositum_runs
    run = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(base / "two"), str(run)], check=True)
    (run / "checkpoint.pt.shards" / "round8.rank1-of-2.pt").unlink()
    before = _folder_state(run)
    assert main(["run", "--resume", str(run), "--rounds", "10", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "round8.rank1-of-2.pt, which is missing" in err and "restore it from a copy" in err, err
    assert _folder_state(run) == before


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("world, bad, expect", [
    (2, ["--clients-per-round", "50"], "--clients-per-round 50"),
    (3, ["-N", "2"], "-N 2: 2 client(s) cannot be split over 3 processes"),  # the flag as typed
], ids=["participation", "fewer-clients-than-ranks"])
def test_an_invalid_setting_under_torchrun_stops_every_rank_before_any_write(tmp_path, world, bad, expect):
    """Found by every rank's checks (after joining the group): each rank exits with its numbered
    error (status 1, not an abort), and no folder is created."""
    out = tmp_path / "bad"
    p = subprocess.run([*_torchrun("--standalone", "--nproc-per-node", str(world)), *CLI, "-a", "fedavg",
                        *bad, "--out", str(out)],
                       env=_env(), capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert p.returncode != 0
    for r in range(world):
        assert f"error on rank {r} of {world}: {expect}" in p.stderr, p.stderr[-3000:]
    assert "exitcode  : 1" in p.stderr and "SIGABRT" not in p.stderr, p.stderr[-3000:]
    assert not out.exists()


@pytest.mark.parametrize("bad, expect", [
    (["--lr", "-1"], "--lr -1"),
    (["-N", "2", "--workers", "3"], "-N 2: 2 client(s) cannot be split over 3 processes"),  # as typed
    (["--device", "cuda"], "--device cuda: CUDA is not available here"),
    (["--reg-param", "net.0.weight=bogus"], "--reg-param net.0.weight=bogus: unknown regularizer"),
    (["-a", "fedavg", "bogus"], "--algorithm bogus: unknown algorithm 'bogus'"),
], ids=["lr", "fewer-clients-than-workers", "cuda-without-gpu", "regularizer-spec", "compare-unknown-algorithm"])
def test_workers_launcher_checks_the_settings_before_starting_processes(tmp_path, capsys, bad, expect):
    """Caught before torchrun starts: one line naming the flag, no torchrun failure report, no folder."""
    if "cuda" in bad and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from python_algos.experiments.cli import main

    out = tmp_path / "bad"
    args = ["compare", *CLI[1:], *bad] if "bogus" in bad else [*CLI, "-a", "fedavg", *bad]
    args += ["--out", str(out)]
    assert main(args + (["--workers", "2"] if "--workers" not in bad else [])) == 1
    err = capsys.readouterr().err
    assert expect in err and "error on rank" not in err, err  # found before torchrun started any rank
    assert not out.exists()


def test_distributed_is_not_an_executor_setting():
    from python_algos.experiments.config import Config, ConfigError

    with pytest.raises(ConfigError, match="--executor distributed: .*--workers P or torchrun"):
        Config.from_dict({"executor": "distributed"})


@pytest.mark.processes
@pytest.mark.slow
def test_killed_rank_restarts_from_checkpoint_with_the_uninterrupted_result(depositum_runs, tmp_path):
    base, args = depositum_runs
    out = tmp_path / "killed"
    p = _run([*_torchrun("--standalone", "--nproc-per-node", "2", "--max-restarts", "1"), *args, "--out", str(out)],
             _FEDKERNELS_TEST_KILL_RANK_AT="1:5")
    assert "resuming" in p.stdout  # the restarted job continued from the round-4 checkpoint
    assert torch.equal(_params(out), _params(base / "two"))


@pytest.mark.processes
@pytest.mark.slow
def test_two_nodes_through_a_localhost_rendezvous(depositum_runs, tmp_path):
    base, args = depositum_runs
    port = C.free_port()
    cmd = [*_torchrun("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                      f"localhost:{port}", "--rdzv-id", "two-nodes"), *args, "--out", str(tmp_path / "nodes")]
    first = subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _run(cmd)
        assert first.wait(timeout=120) == 0, first.stdout.read()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert torch.equal(_params(tmp_path / "nodes"), _params(base / "two"))
    assert json.loads((tmp_path / "nodes" / "summary.json").read_text())["world_size"] == 2


@pytest.mark.processes
@pytest.mark.slow
def test_workers_flag_and_resume_on_other_world_sizes(tmp_path):
    """``--workers 2`` for 4 rounds, then resumed to 6 rounds on 3 workers and on 1 process, and a
    one-process run of 4 rounds resumed on 2 workers: all equal an uninterrupted one-process run bit
    for bit (the checkpoint's rows are re-cut)."""
    args = [*CLI, "-a", "scaffold", "--participation", "0.5"]
    _run([sys.executable, "-m", "python_algos", *args, "-T", "6", "--out", str(tmp_path / "one")])
    _run([sys.executable, "-m", "python_algos", *args, "-T", "4", "--workers", "2", "--out", str(tmp_path / "w2")])
    assert json.loads((tmp_path / "w2" / "summary.json").read_text())["world_size"] == 2
    from python_algos.runfolder import checkpoint as ckpt

    assert ckpt.load(str(tmp_path / "w2" / "checkpoint.pt"))["executor"] == "sequential"  # each rank's executor
    subprocess.run(["cp", "-r", str(tmp_path / "w2"), str(tmp_path / "w2b")], check=True)
    _run([sys.executable, "-m", "python_algos", "run", "--resume", str(tmp_path / "w2"), "--rounds", "6",
          "--workers", "3", "--no-progress"])
    _run([sys.executable, "-m", "python_algos", "run", "--resume", str(tmp_path / "w2b"), "--rounds", "6",
          "--no-progress"])
    ref = _params(tmp_path / "one")
    assert torch.equal(_params(tmp_path / "w2"), ref)
    assert torch.equal(_params(tmp_path / "w2b"), ref)
    assert sorted(os.listdir(tmp_path / "w2" / "checkpoint.pt.shards")) == [f"round6.rank{r}-of-3.pt" for r in range(3)]
    # and the other way: a one-process checkpoint (4 rounds) resumed on 2 ranks
    _run([sys.executable, "-m", "python_algos", *args, "-T", "4", "--out", str(tmp_path / "o4")])
    _run([sys.executable, "-m", "python_algos", "run", "--resume", str(tmp_path / "o4"), "--rounds", "6",
          "--workers", "2", "--no-progress"])
    assert torch.equal(_params(tmp_path / "o4"), ref)
    assert not (tmp_path / "w2b" / "checkpoint.pt.shards").exists()  # one process: a single file, no stale shards
    assert json.loads((tmp_path / "w2" / "summary.json").read_text())["world_size"] == 3


@pytest.mark.processes
@pytest.mark.slow
def test_distributed_table_smoke(tmp_path):
    """The benchmark end to end on a tiny grid: the 2-rank model equals the one-process one and rank 0
    hands torch.distributed exactly one running sum (2d + 1 float32) per FedAvg round, rank 1 the mean."""
    sys.path.insert(0, ROOT)
    from bench import distributed_table as B

    out = tmp_path / "t.md"
    B.main(["--clients", "3", "--samples", "8", "-K", "1", "--rounds", "2", "--memory-clients", "--algorithms",
            "FedAvg", "--executors", "sequential", "--out", str(out)])
    res = json.loads((tmp_path / "t.json").read_text())
    (cell,) = res["cells"]
    assert cell["p2_sent_bytes"] == (2 * res["dim"] + 1) * 4  # the most any rank sent: rank 0's
    assert cell["p2_rel_dev"] == 0  # one process's bits
    assert "| FedAvg | sequential |" in out.read_text()


@pytest.mark.processes
@pytest.mark.slow
def test_ctrl_c_under_workers_writes_the_summary_once_and_resumes_in_one_process(tmp_path):
    """Ctrl-C in a terminal reaches the launcher, torchrun and every rank: rank 0 writes the
    interrupted summary, the resume command is printed once, and the folder resumes in one process."""

    out = tmp_path / "cc"
    p = subprocess.Popen([sys.executable, "-m", "python_algos", *CLI, "-a", "fedavg", "-T", "100000", "--workers", "2",
                          "--out", str(out)], env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, preexec_fn=sigint_as_in_a_terminal)
    try:
        wait_for_rows(out / "metrics.jsonl", p)
        os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err[-3000:]
    assert err.count(f"resume with: python -m python_algos run --resume {out}") == 1, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["world_size"] == 2
    assert summary["last_checkpoint_round"] is not None
    _run([sys.executable, "-m", "python_algos", "run", "--resume", str(out), "--rounds",
          str(summary["rounds_done"] + 1), "--no-progress"])
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
