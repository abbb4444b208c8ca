"""`run --state`: where the client state lives, chosen on the command line (issue 39 items 1, 4).

--state ram and --state disk equal --state dense bit for bit (they keep the same rows, only where
they live differs); what simulate would refuse (full participation, --workers, --flower) and a run
that cannot fit are refused before the run folder exists, naming the flags; the up-front estimate is
printed with the setup line and recorded in summary.json; a resume keeps the folder's --state; a
--state disk run killed at any write point (a row-log append among them) resumes bit for bit.
"""

import json
import os
import random

import pytest
import torch

from python_algos.clients import state_plan
from python_algos.clients.state_store import LoggedRows, StoredRows
from python_algos.experiments.cli import main
from python_algos.runfolder import checkpoint as ckpt
from python_algos.runfolder.files import read_metrics

TIMES = ("wall_time", "elapsed", "prox_time", "grad_time", "fwd_bwd_time")
BASE = ["run", "--dataset", "sparse_logistic", "--data-opt", "n=240", "--data-opt", "dim=10", "--data-opt", "nnz=3",
        "-N", "12", "-K", "2", "-B", "4", "--dtype", "float64", "--executor", "sequential", "--no-progress",
        "--no-plot"]
RUN = [*BASE, "-a", "scaffold", "--clients-per-round", "2"]


def _results(out):
    rows = [{k: v for k, v in r.items() if k not in TIMES} for r in read_metrics(str(out))]
    return torch.load(os.path.join(out, "model.pt"), weights_only=True)["params"], rows


def _summary(out) -> dict:
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def test_state_ram_equals_dense_bit_for_bit_and_prints_the_estimate(tmp_path, capsys):
    for state in ("dense", "ram"):
        assert main([*RUN, "-T", "4", "--state", state, "--out", str(tmp_path / state)]) == 0
    out = capsys.readouterr().out
    (x_dense, rows_dense), (x_ram, rows_ram) = _results(tmp_path / "dense"), _results(tmp_path / "ram")
    assert x_ram.dtype == torch.float64 and x_ram.tolist() == x_dense.tolist()
    assert rows_ram == rows_dense and [r["round"] for r in rows_ram] == list(range(5))
    # ... and the ram run kept a store: its checkpoint holds the written rows, the dense run's the [N, d] stack
    kept = {s: ckpt.load(str(tmp_path / s / "checkpoint.pt"))["state"].c_i for s in ("dense", "ram")}
    assert isinstance(kept["ram"], StoredRows) and isinstance(kept["dense"], torch.Tensor)
    assert kept["dense"].shape == (12, 11)
    # the estimate, against the shapes: SCAFFOLD keeps one [N, d] stack (c_i), d = 10 + 1, 8-byte floats
    d, n, k, t = 11, 12, 2, 4
    dense, ram = _summary(tmp_path / "dense")["estimate"], _summary(tmp_path / "ram")["estimate"]
    assert dense["kept"] == "dense" and dense["state_bytes"] == n * d * 8
    assert ram["kept"] == "ram" and ram["state_bytes"] == 8 * n + (1 + min(n, k * t)) * d * 8
    assert ram["working_bytes"] == (1 + state_plan.WORKSPACES) * k * d * 8 and ram["data_bytes"] > 0
    lines = [line for line in out.splitlines() if line.startswith("memory: state ")]
    assert len(lines) == 2, out
    assert "(dense: 1 [N, d] stack(s))" in lines[0] and "(ram: rows written only)" in lines[1]
    assert "data " in lines[1] and "working " in lines[1] and "; disk: checkpoints " in lines[1]


@pytest.mark.parametrize("args, says", [
    (["-a", "depositum", "--state", "ram"], "--state ram: under full participation: DEPOSITUM's mixing matrix W of "
                                            "the 'ring' topology on 12 clients is dense"),
    (["-a", "depositum", "--state", "ram"], "use --state dense, or --alg-opt mixing=sparse"),
    (["-a", "scaffold", "--clients-per-round", "2", "--state", "ram", "--flower"],
     "--state ram: --flower keeps each client's state on its node: use --state dense"),
])
def test_what_simulate_refuses_is_refused_before_the_folder_exists(tmp_path, capsys, args, says):
    out = tmp_path / "never"
    rc = main([*BASE, *args, "-T", "2", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and says in err and "Traceback" not in err, err
    assert not out.exists()


def test_a_run_that_cannot_fit_is_refused_naming_the_flags(tmp_path, capsys, monkeypatch):
    # 2,300 bytes of memory (80%, 1,840 B, for the state): the working stacks (5 x [2, 11] float64: 880 B) fit; with
    # the row table and the 12 rows that 20 rounds of 2 clients can write (96 + 13 x 88 B) they do not, with the 8
    # of 4 rounds (96 + 9 x 88 B) they do
    monkeypatch.setattr(state_plan, "memory_available", lambda: 2300)
    out = tmp_path / "never"
    assert main([*RUN, "-T", "20", "--state", "ram", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: client state: 1 stack(s) of 12 x 11") and "Traceback" not in err, err
    assert "run with --state disk" in err and "or fewer clients (--num-clients)" in err, err
    assert not out.exists()
    assert main([*RUN, "-T", "20", "--state", "auto", "--out", str(tmp_path / "auto")]) == 0  # fits on disk alone
    assert _summary(tmp_path / "auto")["estimate"]["kept"] == "disk"
    assert isinstance(ckpt.load(str(tmp_path / "auto" / "checkpoint.pt"))["state"].c_i, LoggedRows)
    monkeypatch.setattr(state_plan, "memory_available", lambda: 1000)  # the working stacks alone do not fit
    assert main([*RUN, "-T", "4", "--state", "ram", "--out", str(out)]) == 1
    assert "a smaller --clients-per-round" in capsys.readouterr().err and not out.exists()
    monkeypatch.setattr(state_plan, "memory_available", lambda: 2300)
    assert main([*RUN, "-T", "4", "--state", "ram", "--out", str(out)]) == 0


def test_resume_keeps_the_folders_state_and_refuses_another(tmp_path, capsys):
    run = str(tmp_path / "r")
    assert main([*RUN, "-T", "2", "--state", "ram", "--out", run]) == 0
    capsys.readouterr()
    assert main(["run", "--resume", run, "-T", "4", "--state", "dense", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "--state" in err and "keeps the folder's --state" in err, err
    assert main(["run", "--resume", run, "-T", "4", "--no-progress", "--no-plot"]) == 0  # ram, resumed bit for bit
    assert main([*RUN, "-T", "4", "--state", "ram", "--out", str(tmp_path / "whole")]) == 0
    (x, rows), (x_ref, rows_ref) = _results(run), _results(tmp_path / "whole")
    assert x.tolist() == x_ref.tolist() and rows == rows_ref


def test_auto_keeps_a_store_under_partial_participation_and_dense_stacks_under_full(tmp_path):
    assert main([*RUN, "-T", "2", "--state", "auto", "--out", str(tmp_path / "partial")]) == 0
    assert main([*BASE, "-a", "fednmap", "-T", "2", "--state", "auto", "--out", str(tmp_path / "full")]) == 0
    assert _summary(tmp_path / "partial")["estimate"]["kept"] == "ram"
    assert isinstance(ckpt.load(str(tmp_path / "partial" / "checkpoint.pt"))["state"].c_i, StoredRows)
    full = _summary(tmp_path / "full")["estimate"]
    assert full["kept"] == "dense" and full["stacks"] == 2 and full["state_bytes"] == 2 * 12 * 11 * 8  # c, d


def test_state_disk_equals_dense_bit_for_bit_its_checkpoint_a_row_log(tmp_path, capsys):
    for state in ("dense", "disk"):
        assert main([*RUN, "-T", "6", "--checkpoint-every", "1", "--state", state, "--out", str(tmp_path / state)]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("memory: state ")][-1]
    assert "(disk: rows written only, in files)" in line and "; disk: the checkpoints' row log at most " in line
    (x_dense, rows_dense), (x_disk, rows_disk) = _results(tmp_path / "dense"), _results(tmp_path / "disk")
    assert x_disk.tolist() == x_dense.tolist() and rows_disk == rows_dense
    rec = ckpt.load(str(tmp_path / "disk" / "checkpoint.pt"))["state"].c_i
    assert isinstance(rec, LoggedRows) and rec.rows == 12 and rec.initial.shape == (11,)
    logs = sorted(os.listdir(tmp_path / "disk" / "state" / "c_i"))
    assert logs == ["index.bin", rec.log, "rows.bin"], logs  # one log: the one the checkpoint names
    # 6 rounds of 2 clients, a checkpoint each: at most 2 rows appended per checkpoint (8 + 11 x 8 bytes each), and
    # the log holds at most twice the rows written (then the next log starts with the live rows alone)
    size = os.path.getsize(tmp_path / "disk" / "state" / "c_i" / rec.log)
    assert size == rec.records * (8 + 11 * 8) and rec.records <= 2 * 12
    est = _summary(tmp_path / "disk")["estimate"]
    assert est["kept"] == "disk" and est["checkpoint_bytes"] == 3 * min(12, 2 * 6) * (8 + 11 * 8) >= size


def test_a_disk_run_killed_at_any_write_point_resumes_bit_for_bit(tmp_path, write_points, fuzz_budget, capsys):
    """A kill in the middle of a row-log append, between an append and the checkpoint that counts it
    (inside its atomic write), or in a round: `run --resume` ends with the uninterrupted run's model
    and rows (the store's files ran past the checkpoint; the log's torn tail is never read)."""
    args = [*RUN, "-T", "14", "--checkpoint-every", "1", "--state", "disk"]
    names = write_points.record()
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    assert names.count("state log append") >= 14 and "checkpoint write" in names, names
    assert ckpt.load(str(tmp_path / "whole" / "checkpoint.pt"))["state"].c_i.log != "log-1.bin"  # a compaction ran
    first, n = fuzz_budget(6)
    for seed in range(first, first + n):
        rng = random.Random(seed)
        at = rng.choice([i for i, name in enumerate(names, 1) if name == "state log append"] if seed % 2 else
                        range(1, len(names) + 1))
        write_points.kill_at(at)
        out = str(tmp_path / f"k{seed}")
        with pytest.raises(write_points.Killed):
            main([*args, "--out", out])
        write_points.off()
        resumed = main(["run", "--resume", out, "--no-progress", "--no-plot"] if os.path.exists(
            os.path.join(out, "config.json")) else [*args, "--out", out, "--replace"])
        assert resumed == 0, (seed, at, names[at - 1], capsys.readouterr().err[-2000:])
        (x, rows), (x_ref, rows_ref) = _results(out), _results(tmp_path / "whole")
        assert x.tolist() == x_ref.tolist() and rows == rows_ref, (seed, at, names[at - 1])


# --- the estimate of what a run holds beyond its stacks (issue 39 item 4) ---------------------------------- #


@pytest.mark.parametrize("topology", ["ring", "torus", "star", "complete"])
def test_the_estimate_counts_depositums_streamed_round_and_kept_rows(topology, monkeypatch):
    """DEPOSITUM streamed in chunks of 3 of 12 clients, a gossip every 2nd iteration: the estimate's bytes
    moved a round are those its gossip rounds gather and scatter (counted on every store, the kept rows'
    included), and it counts the store of pre-mix rows the run made (2 rows on a ring, ~N on the complete
    graph). The server–client formula (16 N rows, nothing kept) fails both."""
    import warnings

    from torch import nn

    import fedkernels as fk
    from python_algos import simulate
    from python_algos.algorithms import depositum, depositum_stream
    from python_algos.clients.state_store import ClientStateStore

    monkeypatch.setattr(state_plan, "stream_rows", lambda *a: 3)
    plans, moved, counting = [], [], []
    real_init, real_round = state_plan.StatePlan.init, depositum.streamed_round
    monkeypatch.setattr(state_plan.StatePlan, "init", lambda self, *a: plans.append(self) or real_init(self, *a))

    def round_(*a):
        counting.append(1)
        moved.append(0)
        try:
            return real_round(*a)
        finally:
            counting.clear()
    monkeypatch.setattr(depositum, "streamed_round", round_)
    def counted(real):
        def spy(self, ids, rows):
            if counting:
                moved[-1] += rows.shape[0] * rows.shape[1] * rows.element_size()
            return real(self, ids, rows)
        return spy
    for name in ("gather_", "scatter_"):
        monkeypatch.setattr(ClientStateStore, name, counted(getattr(ClientStateStore, name)))
    g = torch.Generator().manual_seed(1)
    clients = [(torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g))
               for n in (3, 9, 5, 17, 2, 6, 30, 4, 8, 11, 7, 5)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    alg = depositum.DEPOSITUM(alpha=0.05, gamma=0.7, beta=0.8, topology=topology, mixing="sparse", period=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = simulate(alg, model, nn.functional.cross_entropy, clients, 4, fk.L1(0.01), seed=4, batch_size=4,
                       state="ram")
    est = plans[-1].estimate
    assert est.chunk == 3 and len(moved) == 4 and moved[0] < moved[1] == moved[3]  # local, gossip, local, gossip
    assert est.streamed_bytes == max(moved), (est.streamed_bytes, moved)
    side = depositum_stream._SIDES[got.state.x]
    W, q = alg.mixing_matrix(12).to_dense(), torch.arange(12) // 3  # chunks of 3
    held = [sum(any(W[i, j] != 0 and q[i] > c for i in range(12)) for j in range(3 * c + 3)) for c in range(4)]
    assert est.stream.kept == side.rows == max(max(held), 1)  # the most pre-mix rows a later chunk still reads
    assert side.rows == {"ring": 2, "complete": 9}.get(topology, side.rows)
    stacks = est.fields * (8 + 43 * 8) * (12 + 1)
    assert est.store_bytes == stacks + (8 + 43 * 8) * (side.rows + 1)


def test_the_estimate_counts_the_rows_staged_for_the_disk_writer(tmp_path, monkeypatch):
    """A disk store whose rows fill whole pages stages a write's rows (a cohort's) for its O_DIRECT writer, up
    to row_file.STAGE_BYTES (3 rows here): the estimate's stage bytes are the buffer the store holds after a
    cohort's write, and a disk run whose working stacks fit but not with the stage is refused."""
    from python_algos.clients import row_file
    from python_algos.clients.state_store import ClientStateStore

    monkeypatch.setattr(row_file, "STAGE_BYTES", 3 * 4096)
    for k in (2, 5):
        est = state_plan.StateEstimate(20, 1024, 4, 1, cohort=k, rounds=2)
        store = ClientStateStore(20, 1024, torch.float32, backend="disk", folder=str(tmp_path / f"s{k}"))
        if not store._file.direct:
            pytest.skip("this file system refuses O_DIRECT: nothing is staged")
        store.scatter_(torch.arange(k), torch.randn(k, 1024))
        store.gather_(torch.arange(k), torch.empty(k, 1024))  # the write settled
        assert est.stage_bytes == store._file._stage.untyped_storage().nbytes() == min(k, 3) * 4096
    assert state_plan.StateEstimate(20, 124, 4, 1, cohort=5, rounds=2).stage_bytes == 0  # rows through the mapping
    plan = state_plan.StatePlan("disk", str(tmp_path / "run"), 5)
    ram = est.working_bytes + est.stage_bytes // 2
    monkeypatch.setattr(state_plan, "memory_available", lambda: int(ram / state_plan.RAM_SHARE))
    with pytest.raises(state_plan.DoesNotFit, match="staged for the disk.*clients_per_round"):
        plan.choose_backend(est)
    monkeypatch.setattr(state_plan, "memory_available", lambda: 1 << 40)
    assert plan.choose_backend(est) == "disk"


def test_the_setup_line_prints_the_chunk_the_run_streams(tmp_path, capsys, monkeypatch):
    """A population (--partition cyclic: 128 clients kept built) of 300 clients streamed on the sequential
    executor runs chunks of 128, not the 300 the memory budget holds: the setup line and summary.json say
    the chunk the rounds ran."""
    from python_algos.clients.base import ClientSet

    ran, real = [], ClientSet.stream_chunks
    monkeypatch.setattr(ClientSet, "stream_chunks", lambda self, n: ran.append(real(self, n)) or ran[-1])
    out = tmp_path / "pop"
    args = [*BASE, "-a", "fedcanon", "-T", "1", "--state", "ram", "--out", str(out)]
    args[args.index("n=240")], args[args.index("12")] = "n=600", "300"
    assert main([*args, "--partition", "cyclic"]) == 0
    chunk = max(b - a for a, b in ran[-1])  # the last round's chunks
    assert state_plan.stream_rows(2, 11, 8) >= 300 > chunk == 128 and ran[0] == ran[-1]
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("memory: state "))
    assert f"streamed in chunks of {chunk} clients" in line, line
    assert _summary(out)["estimate"]["chunk"] == chunk
