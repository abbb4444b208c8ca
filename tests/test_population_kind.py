"""Issue 39: whether the batched executor may pad batches follows the labels (a chosen ``ignore_index`` some client
holds, a class-weighted callable). Every executor of a run judges it on the run's clients (python_algos/clients/
run_kind.py): a population's blocks and a rank's shard pad as one process over the list does.

Ground truth: ``separability`` over every client (witnesses), the list's one-process run (populations, ranks).
"""

from __future__ import annotations

import os
import random
import tempfile

import _dist_cases
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms import SCAFFOLD, FedAvg
from python_algos.clients.data import client_data
from python_algos.clients.population import Population
from python_algos.clients.run_kind import candidates, run_separability
from python_algos.clients.separable import separability

WEIGHT = torch.tensor([1.0, 3.0, 0.5, 2.0], dtype=torch.float64)


def weighted(o, t):  # a class-weighted callable: a plain mean on samples of one class only
    return F.cross_entropy(o, t, weight=WEIGHT.to(o.dtype))


LOSSES = {"weighted": weighted, "ignore_index": nn.CrossEntropyLoss(ignore_index=3)}


def problem(seed: int, n: int = 9, dtype=torch.float32) -> list:
    """Clients of unequal sizes; the first half hold one class (so alone they look like a plain mean), the others
    every class (label 3, the chosen ignore_index, only there)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        m = int(torch.randint(3, 14, (1,), generator=g))
        y = torch.zeros(m, dtype=torch.long) if i < n // 2 else torch.randint(0, 4, (m,), generator=g)
        out.append((torch.randn(m, 5, generator=g, dtype=torch.float64).to(dtype), y))
    return out


def model(dtype) -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 4)).to(dtype)


@pytest.mark.parametrize("seed", range(40))
def test_the_witnesses_judge_as_every_client(seed):
    """run_separability over the clients it names == separability over every client (brute force), for label
    layouts drawn at random: classes held by few clients, many values, the ignored label anywhere or nowhere."""
    r = random.Random(seed)
    n = r.randint(1, 12)
    data = []
    for _ in range(n):
        m, top = r.randint(1, 6), r.choice([1, 2, 4, 12])
        data.append(client_data((torch.randn(m, 5), torch.tensor([r.randrange(top) for _ in range(m)])),
                                torch.float32, torch.device("cpu")))
    for loss_fn in [*LOSSES.values(), nn.CrossEntropyLoss(ignore_index=r.randrange(12))]:
        whole = separability(model(torch.float32), loss_fn, data)
        sizes, flags = [c.n for c in data], candidates([c.y for c in data], loss_fn)
        got = run_separability(model(torch.float32), loss_fn, sizes, flags, data.__getitem__)
        assert (got.coupled, got.loss.mean) == (whole.coupled, whole.loss.mean)
        assert torch.equal(got.X, whole.X) and torch.equal(got.y, whole.y)


def _run(data, loss_fn, dtype, cohort: bool, executor="batched", **kw):
    alg = SCAFFOLD(lr_local=0.3, local_steps=2) if cohort else FedAvg(lr_local=0.3, local_steps=2)
    return simulate(alg, model(dtype), loss_fn, data, 3, fk.Zero(), None, seed=0, metrics_every=1,
                    clients_per_round=4 if cohort else None, executor=executor, threads=1, **kw)


def _same(a, b) -> str:
    if not torch.equal(a.params, b.params):
        return f"the model, by {float((a.params - b.params).abs().max()):.3g}"
    timed = ("time", "seconds", "elapsed")
    ra, rb = ([{k: v for k, v in m.items() if not any(w in k for w in timed)} for m in h.metrics] for h in (a, b))
    return "" if ra == rb else f"the metrics: {[(x, y) for x, y in zip(ra, rb) if x != y][:1]}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_a_population_pads_as_the_list(loss, dtype):
    """A population under full participation (cache of 2: blocks of one class) against the list, bit for bit. On
    6766d86 the blocks judged the kind on their own labels: off in float32 and float64. (A cohort still judges it
    on its own clients, so that only they are built: cohort_batched's docstring.)"""
    data = problem(5, dtype=dtype)
    listed = _run(data, LOSSES[loss], dtype, False)
    pop = _run(Population(len(data), data.__getitem__, cache=2), LOSSES[loss], dtype, False)
    assert not (why := _same(pop, listed)), why


def rank_main(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)

    res = {}
    for seed in range(4):
        for loss in sorted(LOSSES):
            data = problem(seed)
            for listed in (True, False):
                clients = data if listed else Population(len(data), data.__getitem__, cache=2)
                for cohort in (False, True) if listed else (False,):  # a population's cohort: its own clients'
                    res[seed, loss, listed, cohort] = _run(clients, LOSSES[loss], torch.float32, cohort,
                                                           "distributed", executor_options={"inner": "batched"}).params
    torch.save(res, f"{out}/rank{rank}.pt")
    _dist_cases.finish_released()


@pytest.mark.processes
def test_ranks_pad_as_one_process():
    """2 ranks (rank 0's shard holds one class) against the list's one-process run, list clients (full participation
    and cohorts) and a population's (full participation), float32. On 6766d86 a rank judged the kind on its
    shard's labels: the list on ranks off by up to 2.2e-8."""
    import _dist_cases

    with tempfile.TemporaryDirectory() as d:
        _dist_cases.spawn_ranks(rank_main, 2, d, timeout=400)
        got = torch.load(f"{d}/rank0.pt")
    finds = []
    for (seed, loss, listed, cohort), params in got.items():
        one = _run(problem(seed), LOSSES[loss], torch.float32, cohort).params
        if not torch.equal(params, one):
            finds.append(f"seed {seed} {loss} {'list' if listed else 'population'} cohorts={cohort}: "
                         f"{float((params - one).abs().max()):.3g}")
    assert not finds, "\n".join(finds)
