"""The distributed executor with the batched executor on each rank, on 1, 2 and 4 ranks (issue 39 item 5).

Ground truth: the one-process batched run (``executor="batched"``, one thread, as every rank). SCAFFOLD
(per-client state, a cohort of 4, so some rounds leave a rank without a participant), FedCanon (full
participation, full-batch gradients) and DEPOSITUM on a ring (its dense mixing matrix and a sparse one),
in float64 and float32, on a list of clients and a population (blocks of 3 clients, built on demand, cut
by the ranks): the final model and every recorded metric (loss, gradient and prox-gradient norms,
DEPOSITUM's consensus metrics) equal the one-process run bit for bit; the per-rank gradient counts add up
to its. The clients' sizes differ (5 to 29 samples), so a rank's longest client is not the run's: the
full-batch passes pad to the run's (a population's: to one process's cohort's or block's). And the metric
pass alone on 150 clients (blocks of row_sum.BLOCK = 64 clients cut by the ranks), which adds the
clients' losses and gradients in one process's order where a sum of the ranks' partial sums would not.
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

N, ROUNDS = 9, 4
DTYPES = {"f64": torch.float64, "f32": torch.float32}
PER_RANK = {"wall_time", "elapsed", "prox_time", "grad_time", "fwd_bwd_time", "sent_bytes", "recv_bytes"}
COUNTS = ("grad_evals", "prox_evals")  # per rank: its clients' gradients (checked as a sum over the ranks) and proxes
ALGORITHMS = {"scaffold": ("scaffold", {}, {"batch_size": 4, "clients_per_round": 4}),
              "fedcanon": ("fedcanon", {}, {"batch_size": None}),
              "depositum": ("depositum", {"topology": "ring", "period": 1}, {"batch_size": 4}),
              "depositum_sparse": ("depositum", {"topology": "ring", "period": 2, "mixing": "sparse"},
                                   {"batch_size": None})}


def cases() -> list:
    return [f"{alg}-{dt}-{kind}" for alg in ALGORITHMS for dt in DTYPES for kind in ("list", "population")]


def func_cases() -> list:
    """Cases on the torch.func path (a LayerNorm MLP, which the Linear chain does not take)."""
    return [f"{alg}-{dt}-{kind}-ln" for alg in ("scaffold", "fedcanon") for dt in DTYPES
            for kind in ("list", "population")]


class Clients:
    """``make_client`` of the test population: client i of :func:`problem`."""

    def __init__(self, dtype: torch.dtype):
        self.data = problem(dtype)

    def __call__(self, i: int):
        return self.data[i]


def problem(dtype: torch.dtype, n: int = N, size=lambda i: 5 + 3 * i) -> list:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        X = torch.randn(size(i), 5, generator=g, dtype=torch.float64) * 10.0 ** (i % 3 - 1) + 0.3 * i
        out.append((X.to(dtype), torch.randint(0, 3, (size(i),), generator=g)))
    return out


def model(dtype: torch.dtype, net: str = "chain") -> nn.Module:
    torch.manual_seed(1)
    if net == "ln":  # the torch.func path: a client's last bits can depend on its row in a vmap pass
        return nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.Tanh(), nn.Linear(7, 3)).to(dtype)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).to(dtype)


def run_case(name: str, executor: str) -> dict:
    import python_algos as pa
    from python_algos.algorithms.registry import make
    from python_algos.clients.population import Population

    alg, dt, kind, *net = name.split("-")
    registry_name, over, kw = ALGORITHMS[alg]
    # a population in blocks of 3 clients (cut by the ranks): each block pads to its longest client
    options = {"inner": "batched"} if executor == "distributed" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hist = pa.simulate(make(registry_name, lr=0.05, local_steps=2, **over), model(DTYPES[dt], *net),
                           F.cross_entropy,
                           problem(DTYPES[dt]) if kind == "list" else Population(N, Clients(DTYPES[dt]), cache=3),
                           ROUNDS, regularizer=fk.L1(0.01), seed=3, metrics_every=1,
                           executor=executor, executor_options=options, threads=1, **kw)
    rows = [{k: v for k, v in m.items() if k not in PER_RANK} for m in [hist.initial, *hist.metrics]]
    return {"params": hist.params, "rows": rows, "world_size": hist.world_size}


def rank_main(rank: int, world: int, port: int, out_dir: str, names: list) -> None:
    """torch.multiprocessing entry point: join the group through the environment, as under torchrun."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from python_algos.experiments.launch import finish

    try:
        torch.save({name: run_case(name, "distributed") for name in names}, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        finish(ok=False)
        raise
    _dist_cases.finish_released()


@functools.lru_cache(maxsize=None)
def reference(name: str) -> dict:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_case(name, "batched")
    finally:
        torch.set_num_threads(n)


def same_bits(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex()
    return type(a) is type(b) and a == b


def spawn(world: int, out_dir: str, names: list, main=rank_main) -> list:
    _dist_cases.spawn_ranks(main, world, out_dir, names, timeout=300)
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]


@pytest.mark.processes
@pytest.mark.parametrize("world", [1, 2, 4])
def test_inner_batched_equals_the_one_process_batched_run_bit_for_bit(tmp_path, world):
    check(spawn(world, str(tmp_path), cases()), cases(), world)


@pytest.mark.processes
@pytest.mark.parametrize("world", [1, 2, 4])
def test_the_torch_func_path_on_the_ranks_equals_the_one_process_batched_run_bit_for_bit(tmp_path, world):
    """A LayerNorm MLP (torch.func: a client's last bits depend on its row in a vmap pass and on the pass's
    rows): a rank lays its passes out as one process's over the whole call, another rank's clients' rows filled
    with copies of its own. Before, a rank cut its passes from its own first client: on 4 ranks FedCanon's
    float32 model differed by 1.5e-8 and 6 metric values in their last bits."""
    from python_algos.clients import BatchedClients

    assert BatchedClients(model(torch.float64, "ln"), F.cross_entropy, problem(torch.float64)).chain is None
    check(spawn(world, str(tmp_path), func_cases()), func_cases(), world)


def check(got: list, names: list, world: int) -> None:
    """Every rank's run of each case is the one-process batched run bit for bit."""
    for name in names:
        ref = reference(name)
        for r, res in enumerate(got):
            run = res[name]
            assert run["world_size"] == world
            assert run["params"].dtype == ref["params"].dtype and torch.equal(run["params"], ref["params"]), (name, r)
            assert len(run["rows"]) == len(ref["rows"]), name
            for t, (g, want) in enumerate(zip(run["rows"], ref["rows"])):
                assert g.keys() == want.keys(), (name, t)
                bad = {k: (g[k], want[k]) for k in want if k not in COUNTS and not same_bits(g[k], want[k])}
                assert not bad, (name, world, r, t, bad)
        for t, want in enumerate(ref["rows"]):
            if "grad_evals" in want:
                assert sum(res[name]["rows"][t]["grad_evals"] for res in got) == want["grad_evals"], (name, t)


# --- the metric pass alone, across whole blocks of row_sum.BLOCK clients ---------------------------------


def _blocks_problem(dtype: torch.dtype) -> list:
    return problem(dtype, n=150, size=lambda i: 2 + i % 5)


def rank_objective_main(rank: int, world: int, port: int, out_dir: str, names: list) -> None:
    """f and the gradient of 150 clients' objective at a fixed point, and ``sum_rows`` of a client stack
    through the metric code's view of this rank's rows, in float32 and float64."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from python_algos.clients.distributed import DistributedClients

    out = {}
    for dt, dtype in DTYPES.items():
        cs = DistributedClients(model(dtype), F.cross_entropy, _blocks_problem(dtype), inner="batched")
        x = torch.linspace(-0.5, 0.5, cs.dim, dtype=dtype)
        g = torch.empty_like(x)
        out[f"f-{dt}"] = cs.full_objective_(x, g)
        out[f"g-{dt}"] = g
        rows = _stack(dtype, cs.dim)[cs.lo : cs.hi]
        out[f"sum_rows-{dt}"] = cs.report(SumRows(), _dist_cases.RowsState(rows), None)
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    _dist_cases.finish_released()


class SumRows:
    """An algorithm stand-in whose report is ``sum_rows`` of the state's client stack ``x``."""

    def report(self, state, reg):
        return state.x.sum_rows()


def _stack(dtype: torch.dtype, d: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(4)
    scale = 10.0 ** torch.randint(-3, 4, (150, 1), generator=g)
    return (torch.randn(150, d, generator=g, dtype=torch.float64) * scale).to(dtype)


@pytest.mark.processes
@pytest.mark.parametrize("world", [2, 3])
def test_the_batched_metric_pass_adds_in_one_process_order_across_whole_blocks(tmp_path, world):
    """150 clients over 2 or 3 ranks (75 or 50 each: the blocks of 64 clients are cut by the ranks): every
    rank's f and gradient are one process's batched metric pass bit for bit, in float32 and float64, where
    the ranks' partial means weighted by their shares are not; and a client stack's ``sum_rows`` through the
    metric code's view of a rank's rows is ``row_sum.sum_rows`` of the full stack."""
    import python_algos as pa
    from python_algos.clients.process_group import bounds
    from python_algos.clients.row_sum import sum_rows

    got = spawn(world, str(tmp_path), [], main=rank_objective_main)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    naive_differs = False
    try:
        for dt, dtype in DTYPES.items():
            data = _blocks_problem(dtype)
            one = pa.clients.BatchedClients(model(dtype), F.cross_entropy, data)
            x = torch.linspace(-0.5, 0.5, one.dim, dtype=dtype)
            g = torch.empty_like(x)
            f = one.full_objective_(x, g)
            want = sum_rows(_stack(dtype, one.dim))
            for r, res in enumerate(got):
                assert same_bits(res[f"f-{dt}"], f) and torch.equal(res[f"g-{dt}"], g), (dt, r)
                assert torch.equal(res[f"sum_rows-{dt}"], want), (dt, r)
            naive_f, naive_g = 0.0, torch.zeros_like(g)
            for a, b in bounds(len(data), world):  # what an all-reduce of the ranks' partial results gives
                part = pa.clients.BatchedClients(model(dtype), F.cross_entropy, data[a:b])
                part.pad_to = one.longest_client()
                fp = part.full_objective_(x, gp := torch.empty_like(x))
                naive_f, naive_g = naive_f + fp * (b - a) / len(data), naive_g + gp * ((b - a) / len(data))
            naive_differs |= not (same_bits(naive_f, f) and torch.equal(naive_g, g))
    finally:
        torch.set_num_threads(n)
    assert naive_differs  # the data tell the orders apart
