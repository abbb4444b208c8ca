"""``run --state disk`` on torchrun ranks, stopped past a checkpoint and resumed on another number of processes.

Ground truth: the uninterrupted one-process ``--state dense`` run (float64). A disk run on 2 workers stopped
after round 4 (checkpoints every 2 rounds: each rank's row log in state/rank<r>/) resumed to round 6 in one
process and on 2 and 4 workers, a run on 4 workers resumed on 2 and a one-process run on 2, end with its model,
its metrics and every client's row (read from the final checkpoint's row logs by a plain reader written here) bit
for bit; the writers' folders that no process of the new run owns are gone once its checkpoint replaced
theirs. A resume killed (SIGKILL at a write point, in the re-cut or its first checkpoint) leaves the
checkpoint resumable, and the resumed run equals the uninterrupted one too; a writer's folder missing is
refused, naming it and what to do, before anything in the run folder changes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_distributed_state import CLI, cli, folder_run, same_bits

from python_algos.clients.state_log import record_dtype
from python_algos.runfolder import checkpoint as ckpt
from python_algos.runfolder.faults import KILL_POINT_ENV

pytestmark = [pytest.mark.processes, pytest.mark.slow]

RESUME = ["--rounds", "6", "--no-progress"]


def client_rows(folder) -> torch.Tensor:
    """The final checkpoint's SCAFFOLD control variates c_i, [N, d]: a dense stack, or each writer's row log read
    record by record (the last record of each row; rows never written: the initial row)."""
    snap = ckpt.load(os.path.join(folder, "checkpoint.pt"))
    info = snap.get("shards")
    if info is None:
        recs = [(snap["state"].c_i, os.path.join(folder, "state", "c_i"))]
    else:
        shards = [torch.load(os.path.join(folder, "checkpoint.pt.shards", f), weights_only=True) for f in info["files"]]
        recs = [(ckpt.decode(s["stacks"])["c_i"], os.path.join(folder, "state", f"rank{q}", "c_i"))
                for q, s in enumerate(shards)]
    if isinstance(recs[0][0], torch.Tensor):
        return torch.cat([r for r, _ in recs])
    out = []
    for rec, where in recs:
        rows = rec.initial.repeat(rec.rows, 1)
        log = np.fromfile(os.path.join(where, rec.log), record_dtype(rec.initial.numel(), rec.initial.dtype),
                          count=rec.records)
        for r in log:
            rows[int(r["id"])] = torch.from_numpy(np.array(r["row"]))
        out.append(rows)
    return torch.cat(out)


def assert_same_run(folder, ref) -> None:
    params, rows = folder_run(folder)
    assert torch.equal(params, ref[0]), folder
    assert len(rows) == len(ref[1]) and all(
        r.keys() == g.keys() and all(same_bits(g[k], r[k]) for k in r) for g, r in zip(rows, ref[1])), folder
    assert torch.equal(client_rows(folder), ref[2]), folder


def test_a_disk_checkpoint_of_1_2_or_4_processes_resumes_on_1_2_and_4_bit_for_bit(tmp_path):
    cli(*CLI, "-T", "6", "--out", str(tmp_path / "one"))
    ref = (*folder_run(tmp_path / "one"), client_rows(tmp_path / "one"))
    assert ref[2].dtype == torch.float64 and (ref[2] != 0).any(1).sum() >= 2  # rows written and rows not
    cli(*CLI, "-T", "4", "--state", "disk", "--workers", "2", "--out", str(tmp_path / "w2"))
    cli(*CLI, "-T", "4", "--state", "disk", "--workers", "4", "--out", str(tmp_path / "w4"))
    cli(*CLI, "-T", "4", "--state", "disk", "--out", str(tmp_path / "o1"))
    for name in ("to1", "to2", "to4", "kill", "gone"):
        shutil.copytree(tmp_path / "w2", tmp_path / name)
    cli("run", "--resume", str(tmp_path / "to1"), *RESUME)
    cli("run", "--resume", str(tmp_path / "to2"), *RESUME, "--workers", "2")
    cli("run", "--resume", str(tmp_path / "to4"), *RESUME, "--workers", "4")
    cli("run", "--resume", str(tmp_path / "w4"), *RESUME, "--workers", "2")
    cli("run", "--resume", str(tmp_path / "o1"), *RESUME, "--workers", "2")
    for name, mine in (("to1", ["c_i"]), ("to2", ["rank0", "rank1"]), ("to4", [f"rank{r}" for r in range(4)]),
                       ("w4", ["rank0", "rank1"]), ("o1", ["rank0", "rank1"])):
        assert_same_run(tmp_path / name, ref)
        assert sorted(os.listdir(tmp_path / name / "state")) == mine, name  # the other writers' folders went
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    for at in (1, 3):  # SIGKILL at each rank's first / third write point: the re-cut, or its first checkpoint
        p = subprocess.run([sys.executable, "-m", "python_algos", "run", "--resume", str(tmp_path / "kill"), *RESUME,
                            "--workers", "4"], env={**env, KILL_POINT_ENV: str(at)}, capture_output=True, text=True,
                           timeout=300, cwd=root)
        assert p.returncode != 0, p.stdout[-2000:]
    cli("run", "--resume", str(tmp_path / "kill"), *RESUME)
    assert_same_run(tmp_path / "kill", ref)
    shutil.rmtree(tmp_path / "gone" / "state" / "rank1")  # a writer's folder left on another machine
    before = {p: p.read_bytes() for p in (tmp_path / "gone").rglob("*") if p.is_file()}
    p = subprocess.run([sys.executable, "-m", "python_algos", "run", "--resume", str(tmp_path / "gone"), *RESUME],
                       env=env, capture_output=True, text=True, timeout=300, cwd=root)
    assert p.returncode != 0 and "rank1" in p.stderr and "another machine's disk" in p.stderr and \
        "--workers P" in p.stderr, p.stderr[-2000:]
    assert {p: p.read_bytes() for p in (tmp_path / "gone").rglob("*") if p.is_file()} == before  # nothing written
