"""Per-client state and client data sharded across torchrun ranks (issue 39 item 5).

Ground truth: the one-process sequential run with dense [N, d] stacks on the materialised list of
clients. SCAFFOLD and FedDR (``init_from="code"``: every client starts alike,
as a store needs) with clients_per_round, each rank's rows in its own store (state ram,
disk: its own folder ``<state_folder>/rank<r>``) or dense, on a list or a
:class:`~python_algos.clients.population.Population` (each rank builds only its own clients), in
float64 and float32, on 1, 2 and 4 ranks (gloo, processes spawned as torchrun starts them): the
final model and every recorded metric (loss, gradient and prox-gradient norms, counts) equal the
one-process run bit for bit. N = 11 splits unevenly (5 + 6; 2 + 3 + 3 + 3), and with a cohort of 4
some rounds leave a rank without a participant.
"""

from __future__ import annotations

import functools
import os
import warnings

import _dist_cases
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedkernels as fk

N, COHORT, ROUNDS, DIM = 11, 4, 5, 6
# per process: the timings, the bytes sent, and the gradients this rank computed (checked as a sum over ranks)
TIMING = {"wall_time", "elapsed", "prox_time", "grad_time", "fwd_bwd_time", "sent_bytes", "recv_bytes", "grad_evals"}
DTYPES = {"f64": torch.float64, "f32": torch.float32}


class Tracked:
    """``make_client`` of the test population (client i's rows from (7, i) alone), recording the ids built."""

    def __init__(self, dtype: torch.dtype):
        from python_algos.clients.population import SparseLogistic

        self.inner = SparseLogistic(seed=7, dim=DIM, samples=6, dtype=dtype)
        self.recipe = self.inner.recipe
        self.built: list = []

    def __call__(self, i: int):
        self.built.append(int(i))
        return self.inner(i)


def cases() -> list:
    return [f"{alg}-{state}-{kind}-{dt}" for alg in ("scaffold", "feddr") for state in ("ram", "disk", "dense")
            for kind in ("population", "list") for dt in DTYPES]


def run_case(name: str, executor: str, folder: str) -> dict:
    import python_algos as pa
    from python_algos.algorithms.registry import make
    from python_algos.clients.population import Population

    alg, state, kind, dt = name.split("-")
    maker = Tracked(DTYPES[dt])
    clients = Population(N, maker, cache=3) if kind == "population" else [maker(i) for i in range(N)]
    maker.built.clear()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(DIM, 4), nn.Tanh(), nn.Linear(4, 1)).to(DTYPES[dt])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        algorithm = make(alg, lr=0.1, local_steps=2, **({"init_from": "code"} if alg == "feddr" else {}))
        hist = pa.simulate(algorithm, model, F.binary_cross_entropy_with_logits, clients,
                           ROUNDS, regularizer=fk.L1(0.01), batch_size=3, seed=5, metrics_every=2,
                           clients_per_round=COHORT, executor=executor, state=state,
                           state_folder=os.path.join(folder, name) if state == "disk" else None, threads=1)
    rows = [{k: v for k, v in m.items() if k not in TIMING or executor == "sequential"}
            for m in [hist.initial, *hist.metrics]]
    evals = [m.get("grad_evals") for m in [hist.initial, *hist.metrics]]
    return {"params": hist.params, "rows": rows, "evals": evals, "built": sorted(set(maker.built)),
            "world_size": hist.world_size}


def rank_main(rank: int, world: int, port: int, out_dir: str, names: list) -> None:
    """torch.multiprocessing entry point: join the group through the environment, as under torchrun."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from python_algos.experiments.launch import finish

    try:
        res = {name: run_case(name, "distributed", out_dir) for name in names}
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        finish(ok=False)
        raise
    _dist_cases.finish_released()


def rank_sums_main(rank: int, world: int, port: int, out_dir: str, names: list) -> None:
    """Means of a [300, 5] stack over 2 or 3 ranks (rows of magnitudes 1e-3..1e3, so the order shows): all
    rows, and a cohort of 200; each rank saves the means and the cohort's ids it holds."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from python_algos.clients.distributed import DistributedClients

    cs = DistributedClients(nn.Linear(4, 1), F.mse_loss, [(torch.zeros(1, 4), torch.zeros(1, 1))] * 300,
                            inner="sequential")
    cs.set_participation(200, seed=1)
    out = {}
    for dt, dtype in DTYPES.items():
        full = sums_stack(dtype)
        out[f"all-{dt}"] = cs.mean(full[cs.lo : cs.hi].contiguous())
        ids = cs.participants()
        out[f"ids-{dt}"] = ids + cs.lo
        out[f"cohort-{dt}"] = cs.mean(full[ids + cs.lo], ids)
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    _dist_cases.finish_released()


def sums_stack(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return (torch.randn(300, 5, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-3, 4, (300, 1),
                                                                                         generator=g)).to(dtype)


def spawn(world: int, out_dir: str, names: list, timeout: float = 300, main=rank_main) -> list:
    import _dist_cases

    _dist_cases.spawn_ranks(main, world, out_dir, names, timeout=timeout)
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def same_bits(a, b) -> bool:
    """Equal values, floats bit for bit (NaN equal to NaN, 0.0 not equal to -0.0)."""
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex()
    return type(a) is type(b) and a == b


def check_equal(name: str, got: dict, ref: dict, rank: int) -> None:
    assert got["params"].dtype == ref["params"].dtype and torch.equal(got["params"], ref["params"]), (name, rank)
    assert len(got["rows"]) == len(ref["rows"]), name
    for t, (g, r) in enumerate(zip(got["rows"], ref["rows"])):
        assert g.keys() == r.keys() - TIMING, (name, t)
        bad = {k: (g[k], r[k]) for k in g if not same_bits(g[k], r[k])}
        assert not bad, (name, rank, t, bad)


@functools.lru_cache(maxsize=None)
def reference(name: str) -> dict:
    """The one-process sequential run with dense stacks on the list of clients (one thread, as the ranks)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain = name.replace("-ram-", "-dense-").replace("-disk-", "-dense-").replace("population", "list")
        return run_case(plain, "sequential", "")
    finally:
        torch.set_num_threads(n)


def check_ranks(name: str, got: list) -> None:
    """Every rank's model and metrics equal one process's; the per-rank gradient counts add up to its."""
    ref = reference(name)
    for r, res in enumerate(got):
        check_equal(name, res[name], ref, r)
    for t, row in enumerate(ref["rows"][1:], start=1):  # round 0 (init) computes none
        assert sum(res[name]["evals"][t] for res in got) == row["grad_evals"], (name, t)


@pytest.mark.processes
@pytest.mark.parametrize("world", [1, 2, 4])
def test_sharded_state_and_population_equal_one_process_bit_for_bit(tmp_path, world):
    got = spawn(world, str(tmp_path), cases())
    for name in cases():
        check_ranks(name, got)
        for r, res in enumerate(got):
            assert res[name]["world_size"] == world
            lo, hi = bounds_of(N, world)[r]
            if "population" in name:  # never another rank's client
                assert res[name]["built"] and all(lo <= i < hi for i in res[name]["built"]), (name, r)
            if "disk" in name:  # its own folder, its own rows' table
                field = "c_i" if name.startswith("scaffold") else "xhat"
                index = tmp_path / name / f"rank{r}" / field / "index.bin"
                assert index.stat().st_size == 8 * (hi - lo), (name, r)
        if "disk" in name:
            assert sorted(os.listdir(tmp_path / name)) == [f"rank{r}" for r in range(world)]


def test_two_ranks_smoke(tmp_path):
    """One case on 2 ranks in the default run: a RAM store per rank on a population, float32."""
    name = "scaffold-ram-population-f32"
    check_ranks(name, spawn(2, str(tmp_path), [name]))


CLI = ["run", "--dataset", "sparse_logistic", "--data-opt", "n=240", "--data-opt", "dim=10", "--data-opt", "nnz=3",
       "-N", "11", "-K", "2", "-B", "4", "--dtype", "float64", "--executor", "sequential", "--no-progress",
       "--no-plot", "-a", "scaffold", "--clients-per-round", "4", "--lr", "0.1", "--checkpoint-every", "2"]


def cli(*args, timeout: float = 300) -> None:
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "python_algos", *args], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=root)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def folder_run(folder) -> tuple:
    """(model.pt's params, metrics.jsonl's rows without the per-process entries) of a run folder."""
    import json

    params = torch.load(os.path.join(folder, "model.pt"), weights_only=True)["params"]
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        rows = [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f if line.strip()]
    return params, rows


@pytest.mark.processes
@pytest.mark.slow
def test_workers_with_a_store_checkpoint_and_resume_on_other_world_sizes(tmp_path):
    """``run --workers 2 --state ram`` for 4 rounds (checkpoints: each rank's StoredRows in its shard), resumed to 6
    on 3 workers and in one process (the stores' rows re-cut), and a one-process --state ram run of 4 rounds
    resumed on 2 workers: each equals the uninterrupted one-process --state dense run bit for bit."""
    import shutil

    cli(*CLI, "-T", "6", "--out", str(tmp_path / "one"))
    ref = folder_run(tmp_path / "one")
    cli(*CLI, "-T", "4", "--state", "ram", "--workers", "2", "--out", str(tmp_path / "w2"))
    from python_algos.clients.state_store import StoredRows
    from python_algos.runfolder import checkpoint as ckpt

    for r in range(2):  # each rank's shard holds its store's rows, not a dense stack
        shard = torch.load(tmp_path / "w2" / "checkpoint.pt.shards" / f"round4.rank{r}-of-2.pt", weights_only=True)
        assert isinstance(ckpt.decode(shard["stacks"])["c_i"], StoredRows)
    shutil.copytree(tmp_path / "w2", tmp_path / "w2b")
    cli(*CLI, "-T", "4", "--state", "ram", "--out", str(tmp_path / "o4"))
    cli("run", "--resume", str(tmp_path / "w2"), "--rounds", "6", "--workers", "3", "--no-progress")
    cli("run", "--resume", str(tmp_path / "w2b"), "--rounds", "6", "--no-progress")
    cli("run", "--resume", str(tmp_path / "o4"), "--rounds", "6", "--workers", "2", "--no-progress")
    for name in ("w2", "w2b", "o4"):
        params, rows = folder_run(tmp_path / name)
        assert torch.equal(params, ref[0]), name
        assert len(rows) == len(ref[1]) and all(
            r.keys() == g.keys() and all(same_bits(g[k], r[k]) for k in r) for g, r in zip(rows, ref[1])), name


def test_a_stores_rows_cut_and_joined_for_any_world_size_equal_the_dense_rows():
    """The re-cut of a checkpoint (python_algos/experiments/launch.py): a RAM store's StoredRows cut at the
    bounds of P writers and joined at the bounds of Q readers hold the dense stack's rows (random rows written
    in random rounds, some never), and a dense stack cuts and joins as torch.cat of its slices."""
    from python_algos.clients.shard_rows import cut_rows, join_rows
    from python_algos.clients.state_store import ClientStateStore, StoredRows

    g = torch.Generator().manual_seed(0)
    n, d = 13, 3
    store = ClientStateStore(n, d, torch.float64, torch.full((d,), 0.5))
    for _ in range(4):
        ids = torch.randperm(n, generator=g)[: int(torch.randint(1, 5, (), generator=g))].sort().values
        store.scatter_(ids, torch.randn(ids.numel(), d, generator=g, dtype=torch.float64))
    dense = store.to_dense()
    for p in (1, 2, 3, 4, 13):
        pieces = [cut_rows(store.stored_rows(), lo, hi) for lo, hi in bounds_of(n, p)]
        for q in (1, 2, 3, 5):
            for lo, hi in bounds_of(n, q):
                parts = [cut_rows(piece, max(lo, a) - a, min(hi, b) - a)
                         for piece, (a, b) in zip(pieces, bounds_of(n, p)) if max(lo, a) < min(hi, b)]
                joined = join_rows(parts)
                assert isinstance(joined, StoredRows) and joined.block.shape[0] <= 1 + (hi - lo)
                assert torch.equal(ClientStateStore.from_stored_rows(joined).to_dense(), dense[lo:hi]), (p, q, lo)
                assert torch.equal(join_rows([cut_rows(dense, lo, hi)]), dense[lo:hi])
    other = ClientStateStore(n, d, torch.float64).stored_rows()  # zeros as its initial row: another run's
    with pytest.raises(ValueError, match="different initial rows"):
        join_rows([cut_rows(store.stored_rows(), 0, 5), cut_rows(other, 5, n)])
    with pytest.raises(ValueError, match="mix dense rows and a store's rows"):
        join_rows([cut_rows(store.stored_rows(), 0, 5), dense[5:]])


def bounds_of(n: int, world: int) -> list:
    return [(r * n // world, (r + 1) * n // world) for r in range(world)]


@pytest.mark.processes
@pytest.mark.slow
def test_a_population_on_workers_with_a_store_resumes_on_another_world_size(tmp_path):
    """A9A's rows as 2,000 clients of 3 built when sampled (--partition cyclic: a Population) on 2 workers
    with --state ram for 4 rounds, resumed to 6 on 3 workers (the stores' rows and the generators the
    clients made, by global id, re-cut): the one-process dense run's model and metrics, bit for bit."""
    pop = ["--dataset", "a9a", "--partition", "cyclic", "-N", "2000", "--samples-per-client", "3", "-K", "2", "-B",
           "2", "--dtype", "float64", "--executor", "sequential", "--no-progress", "--no-plot", "-a", "scaffold",
           "--clients-per-round", "20", "--lr", "0.1", "--checkpoint-every", "2"]
    cli("run", *pop, "-T", "6", "--out", str(tmp_path / "one"))
    cli("run", *pop, "-T", "4", "--state", "ram", "--workers", "2", "--out", str(tmp_path / "w2"))
    cli("run", "--resume", str(tmp_path / "w2"), "--rounds", "6", "--workers", "3", "--no-progress")
    (params, rows), ref = folder_run(tmp_path / "w2"), folder_run(tmp_path / "one")
    assert torch.equal(params, ref[0]) and len(rows) == len(ref[1]) == 7
    assert all(r.keys() == g.keys() and all(same_bits(g[k], r[k]) for k in r) for g, r in zip(rows, ref[1]))


@pytest.mark.processes
@pytest.mark.parametrize("world", [2, 3])
def test_a_mean_over_ranks_adds_in_one_process_order_across_whole_blocks(tmp_path, world):
    """300 rows over 2 or 3 ranks (150 or 100 each: blocks of row_sum.BLOCK = 64 rows cut by the ranks, whole
    blocks inside a rank summed before the running sum arrives), all rows and a cohort of 200: every rank's
    mean is the one-process mean (sum_rows over the stack in order) bit for bit, in float32 and float64,
    where adding the ranks' partial sums is not."""
    from python_algos.clients.row_sum import sum_rows

    got = spawn(world, str(tmp_path), [], main=rank_sums_main)
    naive_differs = False
    for dt, dtype in DTYPES.items():
        full = sums_stack(dtype)
        ids = torch.cat([res[f"ids-{dt}"] for res in got])
        assert ids.numel() == 200 and torch.equal(ids, ids.sort().values)
        for key, rows in ((f"all-{dt}", full), (f"cohort-{dt}", full[ids])):
            want = sum_rows(rows).div_(rows.shape[0])
            for r, res in enumerate(got):
                assert torch.equal(res[key], want), (key, r)
            cuts = bounds_of(300, world) if key.startswith("all") else None
            parts = [rows[a:b] for a, b in cuts] if cuts else torch.split(rows, [int((res[f"ids-{dt}"]).numel())
                                                                                 for res in got])
            naive = sum(sum_rows(p) for p in parts).div_(rows.shape[0])
            naive_differs |= not torch.equal(naive, want)
    assert naive_differs  # the data tell the orders apart
