"""Differential fuzzer of the client executors (issue 35, item 8): exact or refused.

Every example is drawn from a seed: a model (Linear chains with activations anywhere, also before
the first Linear, with and without bias; a small convnet; BatchNorm in eval mode, or in training
mode without running statistics; tied weights), a loss from the catalogue of
:mod:`python_algos.clients.losses` with random options (``weight``, ``ignore_index`` — sometimes a
class that occurs —, ``label_smoothing``, ``reduction``, ``pos_weight``) or an unknown callable,
a partition (label-sorted, Dirichlet, unequal sizes down to one sample), a batch size, the
executors' chunk sizes and a participating subset. Each executor runs local SGD steps from the
model's start on the participants, and its metric pass at the start, against a plain PyTorch loop
written here (the model itself, autograd, each client's minibatch drawn as the executors document:
``randperm(n_i)[:B]`` from a generator seeded by ``SeedSequence([0, seed])``): in float64 the
iterates agree to 1e-10 relative to the update, or the executor refuses at construction with a
``ValueError`` that says why; a refusal of minibatches for a loss that is a per-sample mean by
construction is a failure too. float32 / bfloat16 / float16 examples must run or refuse clearly.
The user's data must come back unwritten. The same examples run on a ``Population`` (clients built on
demand; every refusal before anything runs, none mid-run), and an executor built under ``torch.no_grad()``
must give the bits of the one built outside it.

Default run: a fixed set of seeds (``fuzz_budget``); ``--fuzz-long`` for many more,
``--fuzz-seed`` for others. The distributed executor needs a process group: a separate
``processes`` test runs it on 2 spawned ranks (gloo), each inner executor, full participation,
against the same loop.
"""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import time
import warnings
from typing import Callable, Optional

import _dist_cases
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from python_algos.clients import BatchedClients, SequentialClients
from python_algos.clients.population import Population

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EXECUTORS = {"sequential": SequentialClients, "batched": BatchedClients}
# the same executors on clients built on demand (issue 39): a Population whose cache holds 1 to 3 clients
# (by the seed), so that a call's clients are rebuilt and dropped while it runs; held to the same plain loop
ON_DEMAND = {f"{name} on a population": name for name in EXECUTORS}
LR, STEPS = 0.1, 2


class Tied(nn.Module):
    """One Linear applied twice (a tied weight): not a chain, though its leaves look like one."""

    def __init__(self, f, k, bias):
        super().__init__()
        self.lin = nn.Linear(f, f, bias=bias)
        self.out = nn.Linear(f, k)

    def forward(self, x):
        return self.out(torch.tanh(self.lin(torch.tanh(self.lin(x)))))


def _act(r):
    return r.choice([nn.ReLU, nn.Tanh, nn.Sigmoid])()


def _model(r: random.Random, f: int, k: int):
    """(description, builder(dtype) -> a fresh model with the same start, input shape)."""
    kind = r.choice(["chain"] * 5 + ["conv", "bn-eval", "bn-train", "tied"])  # chains: the special path
    seed = r.randrange(1 << 30)
    if kind == "chain":
        widths = [f] + [r.randint(2, 6) for _ in range(r.randint(0, 2))] + [k]
        flat_input = r.random() < 0.25 and f % 2 == 0
        layers = [nn.Flatten()] if flat_input else []
        layers += [_act(r) for _ in range(r.random() < 0.5)]  # an activation before the first Linear
        for a, b in zip(widths, widths[1:]):
            layers.append(nn.Linear(a, b, bias=r.random() < 0.7))
            if r.random() < (0.6 if b != k else 0.15):
                layers.append(_act(r))
        shape = (2, f // 2) if flat_input else (f,)
    elif kind == "conv":
        L = max(f, 4)
        layers, shape = [nn.Conv1d(2, 3, 3, bias=r.random() < 0.5), _act(r), nn.Flatten(),
                         nn.Linear(3 * (L - 2), k)], (2, L)
    elif kind.startswith("bn"):
        layers, shape = [nn.Linear(f, 5), nn.BatchNorm1d(5, track_running_stats=kind == "bn-eval"), nn.ReLU(),
                         nn.Linear(5, k)], (f,)
    else:
        layers, shape = None, (f,)
    bias = r.random() < 0.5

    def build(dtype):
        torch.manual_seed(seed)
        m = Tied(f, k, bias) if layers is None else nn.Sequential(*[_clone(lay) for lay in layers])
        if kind == "bn-eval":
            bn = m[1]
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.eval()
        return m.to(dtype)
    return f"{kind}:{layers if layers is not None else 'Tied'}", build, shape


def _clone(layer):
    """A fresh module of the same configuration (parameters re-drawn from torch's seeded state)."""
    if isinstance(layer, nn.Linear):
        return nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
    if isinstance(layer, nn.Conv1d):
        return nn.Conv1d(layer.in_channels, layer.out_channels, layer.kernel_size, bias=layer.bias is not None)
    if isinstance(layer, nn.BatchNorm1d):
        return nn.BatchNorm1d(layer.num_features, track_running_stats=layer.track_running_stats)
    return type(layer)()


def _loss(r: random.Random, k: int, classes: bool):
    """(description, loss_fn, is a per-sample mean for every batch by construction, labels to plant)."""
    w = torch.rand(k, generator=torch.Generator().manual_seed(r.randrange(1 << 30)), dtype=torch.float64) * 2 + 0.2
    if classes:
        pick = r.choice(["F.ce", "F.ce", "CE", "CE", "CE", "NLL", "weighted-callable", "per-sample-weighted",
                         "sum-callable"])
        if pick == "F.ce":
            return "F.cross_entropy", F.cross_entropy, True, None
        if pick in ("CE", "NLL"):
            opts = {}
            if r.random() < 0.35:
                opts["weight"] = w
            if r.random() < 0.35:
                opts["ignore_index"] = r.randrange(k)
            if pick == "CE" and r.random() < 0.3:
                opts["label_smoothing"] = r.choice([0.05, 0.2])
            if r.random() < 0.2:
                opts["reduction"] = "sum"
            fn = (nn.CrossEntropyLoss if pick == "CE" else nn.NLLLoss)(**opts)
            mean = not {"weight", "ignore_index"} & set(opts) and opts.get("reduction", "mean") == "mean"
            return f"{pick}({opts})", fn, mean, opts.get("ignore_index")
        if pick == "weighted-callable":
            return "lambda: F.cross_entropy(o, y, weight=w)", lambda o, y: F.cross_entropy(o, y, weight=w.to(o)), \
                False, None
        if pick == "per-sample-weighted":
            return "lambda: (w[y] * CE(none)).mean()", \
                lambda o, y: (w.to(o)[y] * F.cross_entropy(o, y, reduction="none")).mean(), True, None
        return "lambda: F.cross_entropy(o, y, reduction='sum')", \
            lambda o, y: F.cross_entropy(o, y, reduction="sum"), False, None
    pick = r.choice(["MSE", "L1", "Huber", "F.mse", "BCE"])
    red = "sum" if r.random() < 0.15 else "mean"
    if pick == "F.mse":
        return "F.mse_loss", F.mse_loss, True, None
    if pick == "BCE":
        opts = {"reduction": red}
        if r.random() < 0.4:
            opts["pos_weight"] = w
        if r.random() < 0.4:
            opts["weight"] = w.flip(0)
        return f"BCEWithLogits({list(opts)})", nn.BCEWithLogitsLoss(**opts), red == "mean", None
    opts = {"reduction": red, **({"delta": 0.5} if pick == "Huber" else {})}
    fn = {"MSE": nn.MSELoss, "L1": nn.L1Loss, "Huber": nn.HuberLoss}[pick](**opts)
    return f"{pick}({opts})", fn, red == "mean", None


def _partition(r: random.Random, keys: torch.Tensor, n_clients: int) -> tuple[str, list]:
    """Index sets of ``n_clients`` non-empty clients of unequal sizes."""
    n = keys.shape[0]
    how = r.choice(["label-sorted", "dirichlet", "unequal"])
    if how == "dirichlet":
        rs = np.random.default_rng(r.randrange(1 << 30))
        p = rs.dirichlet([0.5] * n_clients, size=int(keys.max()) + 1)
        owner = [int(rs.choice(n_clients, p=p[int(kk)])) for kk in keys.tolist()]
        parts = [[j for j in range(n) if owner[j] == i] for i in range(n_clients)]
        if all(parts):
            return how, [torch.tensor(q) for q in parts]
        how = "unequal"
    shuffled = torch.randperm(n, generator=torch.Generator().manual_seed(r.randrange(1 << 30)))
    order = keys.argsort(stable=True) if how == "label-sorted" else shuffled
    cuts = sorted(r.sample(range(1, n), n_clients - 1))
    return how, [order[a:b] for a, b in zip([0, *cuts], [*cuts, n])]


@dataclasses.dataclass
class Example:
    desc: str
    build: Callable
    loss_fn: Callable
    mean: bool
    data: list
    batch_size: Optional[int]
    seed: int
    ids: Optional[list]
    options: dict
    dtype: torch.dtype


def draw(seed: int) -> Example:
    r = random.Random(seed)
    f, k = r.randint(3, 6) * 2, r.randint(2, 4)
    mdesc, build, shape = _model(r, f, k)
    classes = r.random() < 0.75
    ldesc, loss_fn, mean, planted = _loss(r, k, classes)
    n_clients = r.randint(2, 6)
    n = r.randint(n_clients, 36)
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, *shape, generator=g, dtype=torch.float64)
    if classes:
        y = torch.randint(k, (n,), generator=g)
        if planted is not None:  # the ignored class occurs, but never makes a whole client ignored
            y[torch.rand(n, generator=g) < 0.3] = planted
        keys = y
    else:
        y = torch.randn(n, k, generator=g, dtype=torch.float64)
        if "BCE" in ldesc:
            y = (y > 0).to(torch.float64)
        keys = (y[:, 0] * 4).round().long() - int((y[:, 0] * 4).round().min())
    how, parts = _partition(r, keys, n_clients)
    data = [(X[p].clone(), y[p].clone()) for p in parts]
    if planted is not None:
        for _, yi in data:
            if bool((yi == planted).all()):
                yi[0] = (planted + 1) % k
    biggest = max(p.numel() for p in parts)
    batch_size = r.choice([None, None, r.randint(1, biggest)])
    ids = sorted(r.sample(range(n_clients), r.randint(1, n_clients))) if r.random() < 0.3 else None
    options = {"sequential": {"chunk": r.choice([2, 3, 5, 2048])},
               "batched": {"chunk": r.choice([2, 4, 2048]), "chunk_clients": r.choice([None, 2, 3])}}
    dtype = r.choices([torch.float64, torch.float32, torch.bfloat16, torch.float16], [6, 1, 1, 1])[0]
    desc = (f"seed {seed}: {mdesc}; loss {ldesc}; {how} partition sizes {[p.numel() for p in parts]}; "
            f"batch_size {batch_size}; ids {ids}; options {options}; {dtype}")
    return Example(desc, build, loss_fn, mean, data, batch_size, seed, ids, options, dtype)


def _client_seeds(seed: int, n: int) -> list:
    """The documented seeding of client i's minibatch generator: SeedSequence([0, seed]), stream 0."""
    return [int(s) for s in np.random.SeedSequence([0, seed]).generate_state(n, dtype=np.uint64) >> np.uint64(1)]


def _row(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _set(model, row):
    torch.nn.utils.vector_to_parameters(row, list(model.parameters()))


def reference(ex: Example):
    """Plain PyTorch: each participant's STEPS local SGD steps from the model's start on its own
    minibatches, and f, grad f at the start (each client's loss on its whole data, averaged)."""
    model = ex.build(torch.float64)
    x0 = _row(model)
    gens = [torch.Generator().manual_seed(s) for s in _client_seeds(ex.seed, len(ex.data))]
    params = list(model.parameters())
    rows = []
    for i in ex.ids if ex.ids is not None else range(len(ex.data)):
        X, y = ex.data[i]
        x = x0.clone()
        for _ in range(STEPS):
            Xb, yb = X, y
            if ex.batch_size is not None and ex.batch_size < X.shape[0]:
                idx = torch.randperm(X.shape[0], generator=gens[i])[: ex.batch_size]
                Xb, yb = X[idx], y[idx]
            _set(model, x)
            grads = torch.autograd.grad(ex.loss_fn(model(Xb), yb), params, allow_unused=True, materialize_grads=True)
            x = x - LR * torch.cat([q.reshape(-1) for q in grads])
        rows.append(x)
    _set(model, x0)
    f = sum(ex.loss_fn(model(X), y) for X, y in ex.data) / len(ex.data)
    grad = torch.cat([q.reshape(-1) for q in torch.autograd.grad(f, params, allow_unused=True,
                                                                 materialize_grads=True)])
    return x0, torch.stack(rows), float(f.detach()), grad


def run_executor(name: str, ex: Example, dtype: torch.dtype, build_grad: bool = True):
    """(x0, the participants' rows after STEPS local steps, f, grad f) or the constructor's refusal.
    ``build_grad=False``: the executor is built under ``torch.no_grad()`` (as inside a round)."""
    data = [(X.to(dtype) if dtype != torch.float64 else X, y.to(dtype) if y.is_floating_point() and
             dtype != torch.float64 else y) for X, y in ex.data]
    model = ex.build(dtype)
    base = ON_DEMAND.get(name, name)
    if name in ON_DEMAND:
        data = Population(len(data), data.__getitem__, cache=1 + ex.seed % 3)
    try:
        with torch.set_grad_enabled(build_grad):
            cs = EXECUTORS[base](model, ex.loss_fn, data, batch_size=ex.batch_size, seed=ex.seed, **ex.options[base])
    except ValueError as e:
        return e
    x0 = cs.flat.params.detach().clone()
    if name in ON_DEMAND:  # a metric pass first (it draws nothing): training then follows passes kept for others
        cs.full_objective_(x0, torch.empty_like(x0))
    ids = None if ex.ids is None else torch.tensor(ex.ids)
    X = cs.new_stack(x0) if ids is None else cs.new_stack(x0)[ids]
    G = torch.empty_like(X)
    for _ in range(STEPS):
        cs.gradients_(X, G, ids)
        X -= LR * G
    g = torch.empty_like(x0)
    f = cs.full_objective_(x0, g)
    return x0, X, f, g


def _gap(a: torch.Tensor, b: torch.Tensor, scale: float) -> float:
    """Largest difference over ``scale``; positions nan in both agree."""
    both = torch.isnan(a) & torch.isnan(b)
    d = (a - b).abs().masked_fill(both, 0)
    return float(d.max()) / max(scale, 1e-300) if d.numel() else 0.0


def check(ex: Example, name: str) -> Optional[str]:
    """None when ``name`` ran ``ex`` exactly or refused it clearly; else what went wrong."""
    pristine = [(X.clone(), y.clone()) for X, y in ex.data]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = run_executor(name, ex, ex.dtype)
        except Exception as e:  # noqa: BLE001 -- any error past the constructor's refusal is a find...
            try:
                reference(ex)
            except Exception:  # noqa: BLE001 -- ...unless the plain loop fails too (the model cannot take it)
                return None
            return f"{name} raised {type(e).__name__} after construction: {e}"
    if any(not (torch.equal(X, X0) and torch.equal(y, y0)) for (X, y), (X0, y0) in zip(ex.data, pristine)):
        return f"{name} wrote the user's data"
    if isinstance(got, ValueError):
        msg = str(got)
        if not msg:
            return f"{name} refused without a message"
        if ex.mean and "not the mean" in msg:
            return f"{name} refused a per-sample mean as not one: {msg[:200]}"
        return None
    if ex.dtype != torch.float64:
        return None  # runs: what 16-bit and float32 must do
    x0, rows, f, grad = got
    rx0, rrows, rf, rgrad = reference(ex)
    if not torch.equal(x0, rx0):
        return f"{name}: not the same start"
    upd = float((rrows - rx0).abs().max())
    gap = _gap(rows, rrows, upd)
    if gap > 1e-10:
        return f"{name}: iterates off by {gap:.3g} of the update after {STEPS} local steps"
    if not (f == rf or abs(f - rf) <= 1e-10 * abs(rf) or (f != f and rf != rf)):
        return f"{name}: f = {f!r}, the loop's {rf!r}"
    ggap = _gap(grad, rgrad, float(rgrad.abs().max()))
    if ggap > 1e-10:
        return f"{name}: grad f off by {ggap:.3g} relative"
    return None


def _finds(seeds, executors) -> list:
    """What :func:`check` finds for each drawn example of ``seeds`` on each of ``executors``, with its description."""
    return [f"{why}\n    {ex.desc}" for ex in map(draw, seeds) for name in executors
            if (why := check(ex, name)) is not None]


def test_every_executor_is_exact_or_refuses(fuzz_budget):
    first, n = fuzz_budget(600)
    finds = _finds(range(first, first + n), EXECUTORS)
    assert not finds, f"{len(finds)} finds:\n" + "\n".join(finds)


def test_an_executor_built_under_no_grad_is_the_one_built_with_grad(fuzz_budget):
    """The batched executor built inside ``torch.no_grad()`` took torch.func where built outside it took the
    Linear chain (whose check runs autograd), so its iterates differed in the last bits: every executor's
    results, bit for bit, whatever the grad mode at construction."""
    first, n = fuzz_budget(40)
    finds = []
    for seed in range(first, first + n):
        ex = draw(seed)
        for name in EXECUTORS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    got = [run_executor(name, ex, ex.dtype, build_grad=g) for g in (True, False)]
                except Exception:  # noqa: BLE001 -- a failure past construction is the fuzzer's above
                    continue
            if isinstance(got[0], ValueError) or isinstance(got[1], ValueError):
                if str(got[0]) != str(got[1]):
                    finds.append(f"{name} refused in one grad mode only: {got[0]} / {got[1]}\n    {ex.desc}")
                continue
            same = all(torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(got[0][1::2], got[1][1::2]))
            f0, f1 = got[0][2], got[1][2]
            if not same or not (f0 == f1 or (f0 != f0 and f1 != f1)):
                finds.append(f"{name} built under no_grad differs from the one built with grad\n    {ex.desc}")
    assert not finds, f"{len(finds)} finds:\n" + "\n".join(finds)


# examples of the population variant that found a defect, each failing before its fix (kept whatever the budget)
POPULATION_FINDS = {
    128: "NLL(ignore_index=2) on full batches: the sequential executor judged the loss by the probed clients' labels "
         "and split a later client's batch holding the ignored label in weighted pieces (iterates off by 0.29)",
    221: "a class-weighted callable trained on minibatches: refused when a client past the probed 0-3 was built",
    225: "the same in bfloat16",
    251: "CrossEntropyLoss(weight=...) with minibatches: refused mid-run (client 5, the first with more samples)",
    455: "a reduction='sum' callable with minibatches: refused mid-run",
    1698: "ids [0, 4] reused the batched pass kept for the range of 4 clients from 0 (the probe's): IndexError",
}


@pytest.mark.parametrize("seed", sorted(POPULATION_FINDS))
def test_the_population_finds_stay_fixed(seed):
    finds = _finds([seed], ON_DEMAND)
    assert not finds, f"{POPULATION_FINDS[seed]}:\n" + "\n".join(finds)


def test_every_executor_on_a_population_is_exact_or_refuses(fuzz_budget):
    first, n = fuzz_budget(300)
    finds = _finds(range(first, first + n), ON_DEMAND)
    assert not finds, f"{len(finds)} finds:\n" + "\n".join(finds)


# -- the distributed executor on 2 ranks -------------------------------------------------------------

def _distributed_example(seed: int) -> Example:
    return dataclasses.replace(draw(seed), ids=None, dtype=torch.float64)


def _runs(ex: Example) -> bool:
    """The plain loop runs the example (not, e.g., a BatchNorm in training mode on one sample): an
    error inside a rank's pass would leave the other rank waiting in the next collective."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reference(ex)
    except Exception:  # noqa: BLE001
        return False
    return True


def _rank_main(rank: int, world: int, port: int, out_dir: str, seeds: list) -> None:
    """Spawned rank: every example with the distributed executor (each inner executor); saves, per
    (seed, inner), this rank's rows, f and grad f, or the refusal's message."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from python_algos.clients import DistributedClients

    out = {}
    for seed in seeds:
        ex = _distributed_example(seed)
        for inner in EXECUTORS:
            try:
                cs = DistributedClients(ex.build(torch.float64), ex.loss_fn, ex.data, batch_size=ex.batch_size,
                                        seed=ex.seed, inner=inner, inner_options=ex.options[inner])
            except ValueError as e:
                out[(seed, inner)] = str(e)
                continue
            x0 = cs.flat.params.detach().clone()
            X, G = cs.new_stack(x0), cs.new_stack()
            for _ in range(STEPS):
                cs.gradients_(X, G)
                X -= LR * G
            g = torch.empty_like(x0)
            out[(seed, inner)] = (cs.lo, X, cs.full_objective_(x0, g), g)
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    _dist_cases.finish_released()


@pytest.mark.processes
def test_distributed_executor_is_exact_or_refuses(tmp_path, fuzz_budget):
    import torch.multiprocessing as mp

    first, n = fuzz_budget(24)
    seeds = [s for s in range(first, first + n) if _runs(_distributed_example(s))]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.start_processes(_rank_main, args=(2, port, str(tmp_path), seeds), nprocs=2, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 600
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("2 ranks did not finish within 600 s")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    finds = []
    for seed in seeds:
        ex = _distributed_example(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rx0, rrows, rf, rgrad = reference(ex)
        for inner in EXECUTORS:
            got = [r[(seed, inner)] for r in ranks]
            if isinstance(got[0], str):
                if ex.mean and "not the mean" in got[0]:
                    finds.append(f"distributed/{inner} refused a per-sample mean: {got[0][:200]}\n    {ex.desc}")
                continue
            rows = torch.cat([X for _, X, _, _ in sorted(got, key=lambda t: t[0])])
            gap = _gap(rows, rrows, float((rrows - rx0).abs().max()))
            f, g = got[0][2], got[0][3]
            if gap > 1e-10 or abs(f - rf) > 1e-10 * abs(rf) or _gap(g, rgrad, float(rgrad.abs().max())) > 1e-10:
                finds.append(f"distributed/{inner}: rows off by {gap:.3g}, f {f!r} vs {rf!r}\n    {ex.desc}")
    assert not finds, f"{len(finds)} finds:\n" + "\n".join(finds)


def test_one_participant_with_one_sample_batches_runs_the_in_place_first_layer():
    """Found by the population variant above (a block of one client): one participant, batch_size 1 and
    a Linear chain made a [2, 1] index view of stride 0, which the in-place first layer refused
    ("idx must be contiguous") after construction. Held to the sequential executor."""
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 6, generator=g, dtype=torch.float64), torch.randint(3, (4,), generator=g))
            for _ in range(3)]
    got, sets = [], []
    for cls in (BatchedClients, SequentialClients):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).double()
        cs = cls(model, F.cross_entropy, data, batch_size=1, seed=3)
        ids = torch.tensor([2])
        X = cs.new_stack(cs.flat.params.detach().clone())[ids]
        G = torch.empty_like(X)
        cs.gradients_(X, G, ids)
        got.append(G)
        sets.append(cs)
    assert sets[0].rows_in_place  # the path at fault: the first layer reads the samples in place
    assert float((got[0] - got[1]).abs().max()) <= 1e-12
