"""Differential fuzzer of the distributed executor on populations and client-state stores (issue 39 item 5).

Every example is drawn from a seed: an algorithm with random hyper-parameters and switches (one with partial
participation, a cohort of 1..N-1 clients; or any algorithm under full participation); N = 4..13 clients
as a list, a :class:`~python_algos.clients.population.Population` of
:class:`~python_algos.clients.population.SparseLogistic` clients (client i from (seed, i) alone) or of a data
set's rows dealt to clients (:class:`~python_algos.data.population_sources.RowClients`) or a folder of one
.npz file per client (:class:`~python_algos.data.population_sources.FolderClients`), with a cache of 1..4;
the per-client stacks dense or in a store (``state="ram"``, or ``"disk"``: each rank its own folder; stores
under a cohort only, as the run allows), float64 or float32, full batches or minibatches, a small model and a
regularizer; DEPOSITUM too (full participation, dense stacks). Each example runs with
``executor="distributed"`` on 1, 2 and 4 ranks (gloo, processes spawned as torchrun starts them), each rank's
clients on the sequential executor or (two in five) the batched one; ground truth is the one-process run on that
executor with dense stacks, on the materialised list (a population's one-process run is the list's bit for bit on
either executor): every rank's final model and every
recorded metric, bit for bit, and the gradient counts of the ranks add up to its. Sometimes the ranks stop past a
sharded checkpoint (``launch.checkpointer``) and resume from it, and one process resumes from the same checkpoint
(re-cut for all N clients; a disk store reads every rank's row log into its own): both end as the uninterrupted
run. A refusal must come on every
rank alike, as a ``ValueError``, where the one-process run with that state refuses too.

Default run: 2 seeds on 2 ranks (one spawn); the ``processes`` test draws ``fuzz_budget`` seeds on 1, 2 and 4
ranks (``--fuzz-long`` for many more, ``--fuzz-seed`` for others).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import warnings
from typing import Optional

import _dist_cases
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedkernels as fk

# per process: the timings, the bytes sent, and this rank's gradient count (checked as a sum over ranks)
PER_RANK = {"wall_time", "elapsed", "prox_time", "grad_time", "fwd_bwd_time", "sent_bytes", "recv_bytes",
            "grad_evals", "prox_evals"}
SWITCHES = {"feddr": {"init_from": ["code", "code", "paper"]}, "fedprox": {"server_prox": [False, True]},
            "fedavg": {"lr_global": [1.0, 0.5]}, "scaffold": {"lr_global": [1.0, 0.7]},
            "fedmid": {"lr_server": [1.0, 0.5]}, "fastfedda": {"mu": [0.0, 0.1]},
            "fednmap": {"downlink": ["z_dbar", "z"]}}


@dataclasses.dataclass
class Case:
    seed: int
    alg: str
    hparams: dict
    n: int
    cohort: Optional[int]
    source: str  # "list", "sparse" (a SparseLogistic population), "rows" (RowClients) or "folder" (FolderClients)
    cache: int
    state: str
    dtype: torch.dtype
    dim: int
    hidden: int  # 0: a linear model
    batch_size: Optional[int]
    reg: Optional[float]
    rounds: int
    metrics_every: int
    inner: str = "sequential"  # each rank's executor; ground truth: the one-process run on the same executor
    stop: Optional[tuple] = None  # (round the ranks stop after, checkpoint every), then resumed on the ranks

    def describe(self) -> str:
        return (f"seed {self.seed}: {self.alg}{self.hparams} N {self.n} cohort {self.cohort} {self.source} "
                f"(cache {self.cache}) state {self.state} {self.dtype} dim {self.dim} hidden {self.hidden} "
                f"batch_size {self.batch_size} reg {self.reg} {self.rounds} rounds metrics_every {self.metrics_every} "
                f"inner {self.inner} stop/checkpoint {self.stop}")


def draw(seed: int) -> Case:
    from python_algos.algorithms.registry import ALGORITHMS

    r = random.Random(seed)
    n = r.randint(4, 13)  # at least one client per rank on 4 ranks
    partial = [a for a, e in ALGORITHMS.items() if e.cls.partial_participation]
    full = list(ALGORITHMS)
    alg = r.choice(partial) if r.random() < 0.75 else r.choice(full)
    # a cohort of N is full participation, where the distributed executor refuses a store (it streams on one process)
    cohort = r.randint(1, n - 1) if ALGORITHMS[alg].cls.partial_participation and r.random() < 0.85 else None
    hparams = {"lr": r.choice([0.05, 0.1, 0.2]), "local_steps": r.randint(1, 3),
               **{k: r.choice(v) for k, v in SWITCHES.get(alg, {}).items()}}
    state = r.choice(["dense", "ram", "disk"]) if cohort is not None else "dense"
    source = r.choice(["list", "sparse", "sparse", "rows", "folder"])
    inner = "batched" if random.Random(seed * 31 + 7).random() < 0.4 else "sequential"
    more = random.Random(seed * 31 + 11)
    # a disk store stops more often: its one-process resume re-cuts the ranks' row logs
    stop = (more.randint(1, 3), more.randint(1, 2)) if more.random() < (0.6 if state == "disk" else 0.3) else None
    return Case(seed, alg, hparams, n, cohort, source, r.randint(1, 4), state,
                r.choice([torch.float64, torch.float64, torch.float32]), r.randint(2, 7), r.choice([0, 3]),
                r.choice([None, 1, 2, 4]), r.choice([None, 0.01, 0.1]), 4 if stop else r.randint(2, 4),
                r.choice([1, 2]), inner, stop)


def write_folder(case: Case, root: str) -> None:
    """The "folder" source's files: one .npz per client (1 to 5 samples, labels 0/1), written before the ranks start."""
    g = torch.Generator().manual_seed(case.seed)
    os.makedirs(path := os.path.join(root, "data", f"f{case.seed}"))
    for i in range(case.n):
        m = int(torch.randint(1, 6, (), generator=g))
        np.savez(os.path.join(path, f"c{i:03d}.npz"), X=torch.randn(m, case.dim, generator=g, dtype=torch.float64),
                 y=torch.randint(0, 2, (m,), generator=g).double())


def clients(case: Case, root: str, listed: bool = False):
    """The case's N clients: a Population (or a list; ``listed``: always the materialised list)."""
    from python_algos.clients.population import Population, SparseLogistic
    from python_algos.data.population_sources import FolderClients, RowClients

    if case.source == "folder":  # labels 0/1 as classes: a two-class model and cross-entropy (see ``loss``)
        make = FolderClients(os.path.join(root, "data", f"f{case.seed}"), classes=[0, 1], test_fraction=0.0)
    elif case.source == "rows":
        g = torch.Generator().manual_seed(case.seed)
        rows = case.n * 3 + 5
        X = torch.randn(rows, case.dim, generator=g, dtype=torch.float64).to(case.dtype)
        y = (torch.rand(rows, 1, generator=g) < 0.5).to(case.dtype)
        rs = np.random.default_rng(case.seed)
        parts = [rs.choice(rows, size=int(rs.integers(1, 6)), replace=False) for _ in range(case.n)]
        make = RowClients(X, y, parts, name=f"fuzz{case.seed}")
    else:
        make = SparseLogistic(seed=case.seed, dim=case.dim, samples=2 + case.seed % 5, dtype=case.dtype)
    if listed or case.source == "list":
        return [make(i) for i in range(case.n)]
    return Population(case.n, make, cache=case.cache, recipe=make.recipe)


def model(case: Case) -> nn.Module:
    torch.manual_seed(case.seed)
    layers = [nn.Linear(case.dim, 1)] if not case.hidden else \
        [nn.Linear(case.dim, case.hidden), nn.Tanh(), nn.Linear(case.hidden, 1)]
    if case.source == "folder":
        layers[-1] = nn.Linear(layers[-1].in_features, 2)
    return nn.Sequential(*layers).to(case.dtype)


def loss(case: Case):
    return F.cross_entropy if case.source == "folder" else F.binary_cross_entropy_with_logits


def _simulate(case: Case, executor: str, folder: str, state: str, listed: bool, root: Optional[str] = None, **kw):
    import python_algos as pa
    from python_algos.algorithms.registry import make

    alg = make(case.alg, lr=case.hparams["lr"], local_steps=case.hparams["local_steps"],
               **{k: v for k, v in case.hparams.items() if k not in ("lr", "local_steps")})
    return pa.simulate(alg, model(case), loss(case), clients(case, folder, listed), case.rounds,
                       fk.Zero() if case.reg is None else fk.L1(case.reg), case.batch_size, seed=case.seed,
                       metrics_every=case.metrics_every, clients_per_round=case.cohort, executor=executor,
                       executor_options={"inner": case.inner} if executor == "distributed" else None, state=state,
                       state_folder=state_folder(case, folder, root or executor) if state == "disk" else None,
                       threads=1, **kw)


def state_folder(case: Case, folder: str, root: str) -> str:
    return os.path.join(folder, f"s{case.seed}-{root}")


def run(case: Case, executor: str, folder: str, state: Optional[str] = None, listed: bool = False,
        resume: bool = False):
    """The case's run: (final model, metrics rows, gradient counts, the round it resumed after), or the refusal's
    message. ``resume``: stopped after round ``case.stop[0]`` with a checkpoint every ``case.stop[1]`` rounds
    (sharded on ranks: launch.checkpointer), then resumed from the last one (re-cut for this process's rows; a
    disk store's from the ranks' row logs, under their state folder)."""
    from python_algos.experiments import launch
    from python_algos.runfolder.callbacks import Checkpoint
    from python_algos.runfolder.checkpoint import Diverged

    state, first = state or case.state, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if not resume:
                hist = _simulate(case, executor, folder, state, listed)
            else:
                path = os.path.join(folder, f"ck{case.seed}.pt")
                if executor == "distributed":  # the ranks write it; one process (check) only reads it
                    stop, every = case.stop
                    _simulate(case, executor, folder, state, listed, callbacks=[
                        lambda t, s, m: t == stop, Checkpoint(launch.checkpointer(path, case.n), every)])
                root = state_folder(case, folder, "distributed") if state == "disk" else None
                snap = launch.load_checkpoint(path, case.n, state_folder=root)
                first = int(snap["round"])
                hist = _simulate(case, executor, folder, state, listed, "distributed", resume=snap)
        except (ValueError, Diverged) as e:
            return f"{type(e).__name__}: {e}"
    rows = [{k: v for k, v in m.items() if k not in PER_RANK} for m in [hist.initial, *hist.metrics]]
    return hist.params, rows, [m.get("grad_evals") for m in [hist.initial, *hist.metrics]], first


def rank_main(rank: int, world: int, port: int, out_dir: str, seeds: list) -> None:
    """Spawned rank: every seed's case with the distributed executor; saves {seed: result} to rank<r>.pt."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from python_algos.experiments.launch import finish

    try:
        out = {seed: run(case, "distributed", out_dir, resume=case.stop is not None) for seed in seeds
               if (case := draw(seed))}
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        finish(ok=False)
        raise
    _dist_cases.finish_released()


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex() or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


def check(case: Case, got: list, root: str) -> Optional[str]:
    """None when every rank's run is one process's bit for bit (or every rank refused as one process does)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # a population's one-process run is the list's bit for bit on either executor (tests/test_population.py)
        ref = run(case, case.inner, root, state="dense", listed=True)
        if isinstance(ref, str):
            return None if all(isinstance(g, str) for g in got) else f"one process refused, the ranks ran: {ref}"
        if any(isinstance(g, str) for g in got):
            if all(isinstance(g, str) and g.startswith("Diverged") for g in got):
                return None if not bool(torch.isfinite(ref[0]).all()) else f"the ranks diverged alone: {got[0]}"
            if len({g if isinstance(g, str) else "" for g in got}) > 1:
                return f"the ranks disagree: {[g if isinstance(g, str) else 'ran' for g in got]}"
            alone = run(case, case.inner, root)  # as one process with the case's state refuses
            return None if isinstance(alone, str) else f"refused on the ranks only: {got[0][:300]}"
    finally:
        torch.set_num_threads(n)
    params, rows, evals, _ = ref
    why = _compare(got, params, rows, evals)
    if why is None and case.stop is not None:
        alone = run(case, case.inner, root, listed=False, resume=True)  # the ranks' checkpoint re-cut for one process
        why = _compare([alone], params, rows, evals) if not isinstance(alone, str) else f"one process: {alone}"
        why = why and f"resumed in one process from the ranks' checkpoint: {why}"
    return why


def _compare(got: list, params: torch.Tensor, rows: list, evals: list) -> Optional[str]:
    """What differs between each rank's (model, metrics rows, gradient counts, round resumed after) and one
    uninterrupted process's (params, rows, evals)."""
    for r, (p, rr, _, first) in enumerate(got):
        if p.dtype != params.dtype or not torch.equal(p.nan_to_num(), params.nan_to_num()):
            return f"rank {r}'s model differs by {float((p - params).abs().max()):.3g}"
        want = [rows[0], *rows[1 + first:]]  # a resumed run: round 0's row restored, then the rounds it ran
        if len(rr) != len(want):
            return f"rank {r}: {len(rr)} metrics rows, one process {len(want)}"
        for t, (a, b) in enumerate(zip(rr, want)):
            bad = {k: (a.get(k), b.get(k)) for k in {*a, *b} if not _same(a.get(k), b.get(k))}
            if bad:
                return f"rank {r}, metrics row {t}: {bad}"
    first = got[0][3]
    for t in range(1, len(evals) - first):
        if evals[t + first] is not None and sum(g[2][t] for g in got) != evals[t + first]:
            return f"row {t}: the ranks computed {[g[2][t] for g in got]} gradients, one process {evals[t + first]}"
    return None


def finds(tmp_path, world: int, seeds: list) -> list:
    for seed in seeds:
        if (case := draw(seed)).source == "folder":
            write_folder(case, str(tmp_path))
    _dist_cases.spawn_ranks(rank_main, world, str(tmp_path), seeds, timeout=300 + 20 * len(seeds))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]
    out = []
    for seed in seeds:
        case = draw(seed)
        why = check(case, [res[seed] for res in ranks], str(tmp_path))
        if why is not None:
            out.append(f"{world} ranks: {why}\n    {case.describe()}")
    return out


def test_two_ranks_on_populations_and_stores_smoke(tmp_path):
    """Two seeds of the fuzzer below on 2 ranks in the default run."""
    found = finds(tmp_path, 2, [3, 5])
    assert not found, "\n".join(found)


@pytest.mark.processes
@pytest.mark.parametrize("world", [1, 2, 4])
def test_distributed_populations_and_stores_equal_one_process_bit_for_bit(tmp_path, world, fuzz_budget):
    first, n = fuzz_budget(30)
    found = finds(tmp_path, world, list(range(first, first + n)))
    assert not found, f"{len(found)} finds:\n" + "\n".join(found)


@pytest.mark.processes
def test_ranks_of_one_client_resume_in_one_process(tmp_path):
    """Seeds 149 (disk) and 274 (RAM): FedADMM on 5 and 6 clients over 4 ranks, some holding one client, whose
    lazy stack of x0 (a [1, d] view of stride d) was stored as a written row over zeros, the others' as their
    initial row: the one-process resume refused the ranks' pieces as of different runs (d011f00: seed 274)."""
    found = finds(tmp_path, 4, [149, 274])
    assert not found, "\n".join(found)


def rank_refusal_main(rank: int, world: int, port: int, out_dir: str) -> None:
    """FedDR's paper initialization with a RAM store on 3 clients: what each rank raised (or "ran")."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHON_ALGOS_DIST_TIMEOUT="15")
    torch.set_num_threads(1)
    from python_algos.experiments.launch import finish

    case = dataclasses.replace(draw(50080), n=3, cohort=2, rounds=1, state="ram",
                               hparams={"lr": 0.05, "local_steps": 3, "init_from": "paper"})
    try:
        got = run(case, "distributed", out_dir)
        msg = got if isinstance(got, str) else "ran"
    except Exception as e:  # noqa: BLE001 -- a timeout in a collective: this rank waited for a peer that left
        msg = f"{type(e).__name__}: {e}"
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(msg)
    finish(ok=False)


@pytest.mark.processes
def test_an_init_that_writes_every_row_is_refused_on_every_rank(tmp_path):
    _dist_cases.spawn_ranks(rank_refusal_main, 2, str(tmp_path), timeout=120)
    got = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert all("FedDR.init writes every client's row" in g for g in got), got
