"""Client data as a population (python_algos/clients/population.py): a population run equals the run on
the materialised list bit for bit; only the cohorts' clients (and the few the start-up probe reads) are
built; a NaN in a client built on demand is refused naming it; the resume fingerprint tells populations
apart; 10^6 clients run in a few seconds without their data in memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms import SCAFFOLD, FedAvg
from python_algos.clients import BatchedClients, SequentialClients, client_generators
from python_algos.clients.base import DRAW_DISTINCT_MIN, distinct_draws
from python_algos.clients.population import PROBE_CLIENTS, LazyGenerators, Population, SparseLogistic
from python_algos.runfolder import checkpoint as ckpt
from python_algos.runfolder.callbacks import Checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEN = SparseLogistic(seed=3, dim=12, samples=10, density=0.3, dtype=torch.float64)


class Counted:
    """make_client wrapper recording which clients were built (independent of the population's count)."""

    def __init__(self, make):
        self.make, self.ids = make, []
        self.recipe = getattr(make, "recipe", None)

    def __call__(self, i):
        self.ids.append(i)
        return self.make(i)


def _run(clients, algorithm="scaffold", **kw):
    torch.manual_seed(0)
    model = nn.Linear(12, 1).double()
    alg = SCAFFOLD(lr_local=0.1, local_steps=3) if algorithm == "scaffold" else FedAvg(lr_local=0.1, local_steps=2)
    return simulate(alg, model, F.binary_cross_entropy_with_logits, clients, **{"rounds": 4, **kw})


@pytest.mark.parametrize("executor", ["sequential", "batched"])
@pytest.mark.parametrize("case", [
    dict(algorithm="scaffold", clients_per_round=7, batch_size=4),
    dict(algorithm="scaffold", clients_per_round=7, batch_size=4, state="ram"),
    dict(algorithm="scaffold", clients_per_round=7, state="ram"),
    dict(algorithm="fedavg", batch_size=4),  # full participation: every round streams all clients
    dict(algorithm="fedavg", participation=0.2, batch_size=None),
])
def test_a_population_run_equals_the_run_on_the_materialised_list(case, executor):
    n = 70
    listed = _run([GEN(i) for i in range(n)], executor=executor, **case)
    pop = Population(n, GEN, cache=3)  # smaller than a cohort: the executor raises it
    lazy = _run(pop, executor=executor, **case)
    assert lazy.executor == listed.executor == executor
    assert torch.equal(lazy.params, listed.params)
    assert lazy.series("f+h") == listed.series("f+h") and lazy.initial["f"] == listed.initial["f"]
    assert lazy.series("grad_map_sq") == listed.series("grad_map_sq")


def test_the_batched_metric_pass_of_a_population_in_one_block_is_the_lists():
    n = 70
    listed = _run([GEN(i) for i in range(n)], executor="batched", algorithm="fedavg")
    lazy = _run(Population(n, GEN, cache=n), executor="batched", algorithm="fedavg")
    assert torch.equal(lazy.params, listed.params) and lazy.series("f+h") == listed.series("f+h")


def test_an_mlp_under_cross_entropy_batched_on_a_population_equals_the_list():
    """The explicit Linear/activation chain (clients.chain; samples read in place on the CPU): a cohort's
    samples sit elsewhere in its block than in the list's, which must not change a bit."""
    def make(i):
        g = torch.Generator().manual_seed(i)
        m = 6 + i % 5
        return torch.randn(m, 9, generator=g, dtype=torch.float64), torch.randint(0, 3, (m,), generator=g)

    def run(clients):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(9, 8), nn.ReLU(), nn.Linear(8, 3)).double()
        return simulate(SCAFFOLD(lr_local=0.1, local_steps=3), model, F.cross_entropy, clients, rounds=4,
                        clients_per_round=9, batch_size=4, executor="batched", metrics_every=0)

    listed, lazy = run([make(i) for i in range(80)]), run(Population(80, make))
    assert torch.equal(lazy.params, listed.params) and torch.equal(lazy.state.c_i, listed.state.c_i)


def _unequal_client(i: int):
    """Client i of 3 to 9 float32 samples of very different scales (so the last bits show)."""
    g = torch.Generator().manual_seed(100 + i)
    m = 3 + i % 7
    return torch.randn(m, 5, generator=g) * 10.0 ** (i % 3 - 1) + 0.3 * i, torch.randint(0, 3, (m,), generator=g)


def _layer_norm_mlp() -> nn.Module:
    """Not a Linear chain: the batched executor's torch.func path, where a client's float32 gradient can take
    other last bits with its row in a vmap pass and with the pass's rows."""
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.Tanh(), nn.Linear(7, 3))


@pytest.mark.parametrize("algorithm,batch_size,state", [("fedcanon", None, "dense"), ("fedcanon", 2, "ram"),
                                                        ("za1", None, "ram"), ("za1", 2, "dense")])
def test_full_participation_on_the_torch_func_path_is_the_lists_bit_for_bit_in_float32(algorithm, batch_size,
                                                                                        state):
    """Issue 39, a population's full-participation calls and metric pass laid out as the list run's: 23 unequal
    clients, passes of 4 (``chunk_clients``, so windows of W = 4 clients), a cache of 5 (not a multiple of W).
    Before, a population's blocks started their windows at each block's start and padded to the block's longest
    client: FedCanon's c and every round's f differed from the list run's in their last bits."""
    from python_algos.algorithms.registry import make

    def run(clients):
        return simulate(make(algorithm, lr=0.05, local_steps=2), _layer_norm_mlp(), F.cross_entropy, clients, 3,
                        fk.L1(0.01), batch_size, seed=3, metrics_every=1, executor="batched",
                        executor_options={"chunk_clients": 4}, threads=1, state=state)

    n = 23
    listed, lazy = run([_unequal_client(i) for i in range(n)]), run(Population(n, _unequal_client, cache=5))
    assert torch.equal(lazy.params, listed.params)
    untimed = [[{k: v for k, v in m.items() if "time" not in k and k != "elapsed"} for m in [h.initial, *h.metrics]]
               for h in (lazy, listed)]
    assert untimed[0] == untimed[1]
    for f in type(listed.state).client_fields:
        rows = [getattr(h.state, f) for h in (lazy, listed)]
        assert torch.equal(*[r.to_dense() if hasattr(r, "to_dense") else r for r in rows]), f


def test_a_populations_calls_over_any_clients_are_the_list_calls_bits_in_float32():
    """Gradients over any consecutive clients under full participation (a streamed chunk: blocks whose edges cut
    the list run's windows, their passes run with other clients' rows as copies) and the metric pass equal the
    list's dense call bit for bit, float32 on the torch.func path."""
    n = 17
    listed = BatchedClients(_layer_norm_mlp(), F.cross_entropy, [_unequal_client(i) for i in range(n)],
                            chunk_clients=4)
    lazy = BatchedClients(_layer_norm_mlp(), F.cross_entropy, Population(n, _unequal_client, cache=3),
                          chunk_clients=4)
    x = listed.flat.params.detach().clone()
    X = x + 0.01 * torch.arange(n, dtype=x.dtype)[:, None]
    dense = listed.gradients_(X.clone(), torch.empty_like(X))
    for a in range(n):
        for b in range(a + 1, n + 1):
            got = lazy.gradients_(X[a:b].clone(), torch.empty_like(X[a:b]), torch.arange(a, b))
            assert torch.equal(got, dense[a:b]), (a, b, float((got - dense[a:b]).abs().max()))
    g, want = torch.empty_like(x), torch.empty_like(x)
    assert lazy.full_objective_(x, g) == listed.full_objective_(x, want) and torch.equal(g, want)


@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_only_the_cohorts_clients_are_built(executor):
    n, k, rounds = 1000, 5, 6
    make = Counted(GEN)
    h = _run(Population(n, make), clients_per_round=k, rounds=rounds, state="ram", metrics_every=0, executor=executor)
    trained = set(torch.nonzero((h.state.c_i.to_dense() != 0).any(1))[:, 0].tolist())  # c_i moved: trained
    assert 0 < len(trained) <= k * rounds
    built = set(make.ids)
    assert built <= trained | set(range(PROBE_CLIENTS)), sorted(built - trained)
    assert trained <= built
    # a cohort is built once per round, not once per local step (3 here): the cache holds it
    assert len(make.ids) <= PROBE_CLIENTS + k * rounds


def test_a_nan_in_a_client_built_on_demand_is_refused_naming_it():
    def bad(i):
        X, y = GEN(i)
        if i == 17:
            X[2, 5] = float("nan")
        return X, y

    with pytest.raises(ValueError, match=r"client 17: row 2 of its X holds a NaN"):
        _run(Population(30, bad), algorithm="fedavg", metrics_every=0)


def test_the_finite_check_on_build_sees_every_nan_and_inf_and_no_false_alarm():
    big = torch.full((4, 3), 3e38)  # finite values whose sum overflows to inf
    assert Population(1, lambda i: (big, torch.zeros(4, 1))).build(0)[0] is big
    for where, value in (("y", float("inf")), ("X", float("-inf")), ("y", float("nan"))):
        X, y = torch.zeros(5, 3), torch.zeros(5, 1)
        (X if where == "X" else y)[3, 0] = value
        with pytest.raises(ValueError, match=rf"client 0: row 3 of its {where} holds a NaN or an infinity"):
            Population(1, lambda i, X=X, y=y: (X, y)).build(0)


def test_a_make_client_returning_no_data_is_refused_naming_the_client():
    with pytest.raises(TypeError, match=r"client 2 \(make_client\(2\)\).*got str"):
        _run(Population(30, lambda i: GEN(i) if i < 2 else "oops"), algorithm="fedavg", metrics_every=0)


def test_lazy_generators_are_the_listed_ones():
    listed = client_generators(5, 50, first_client=7)
    lazy = LazyGenerators(5, 50, first_client=7)
    for i in (0, 13, 49):
        assert torch.equal(lazy[i].get_state(), listed[i].get_state())
    assert sorted(lazy.touched_states()) == [7, 20, 56]  # by global client index


def test_a_client_never_depends_on_n_and_builds_are_counted():
    small, big = Population(10, GEN), Population(10**7, GEN)
    for i in (0, 3, 9):
        assert all(torch.equal(a, b) for a, b in zip(small[i], big[i]))
    assert big.builds == 3
    big[3]
    assert big.builds == 3  # cached
    assert not torch.equal(GEN(0)[0], SparseLogistic(seed=4, dim=12, samples=10, density=0.3)(0)[0].double())
    with pytest.raises(IndexError, match="client 10 is not in the population of 10 clients"):
        small[10]


def test_a_population_resumes_bit_identically_and_refuses_another_population(tmp_path):
    n, kw = 60, dict(clients_per_round=6, batch_size=4, rounds=5, state="ram")
    full = _run(Population(n, GEN), **kw)
    _run(Population(n, GEN), **kw, callbacks=[lambda t, s, m: t == 3, Checkpoint(ckpt.Checkpointer(tmp_path / "c"), 2)])
    snap = ckpt.load(tmp_path / "c")
    assert snap["round"] == 2 and len(snap["client_rng"]["generators"]) <= 2 * 6  # the touched generators only
    resumed = _run(Population(n, GEN), **kw, resume=snap)
    assert torch.equal(resumed.params, full.params)
    assert resumed.series("f+h") == full.series("f+h")[2:]
    other_n = Population(n + 1, GEN)
    other_recipe = Population(n, SparseLogistic(seed=4, dim=12, samples=10, density=0.3, dtype=torch.float64))
    for other in (other_n, other_recipe):
        with pytest.raises(ValueError, match="clients.*population of"):
            _run(other, **kw, resume=ckpt.load(tmp_path / "c"))


def test_the_fingerprint_sees_n_recipe_and_sampled_data_but_not_unsampled_data():
    def edited(i):  # client 1 is not sampled, client 0 is
        X, y = GEN(i)
        return (X + 1, y) if i in (1, 0) else (X, y)

    base = Population(30, GEN, recipe="r").fingerprint()
    assert Population(30, GEN, recipe="r").fingerprint() == base
    assert Population(31, GEN, recipe="r").fingerprint()["content"] != base["content"]
    assert Population(30, GEN, recipe="r2").fingerprint()["content"] != base["content"]
    assert Population(30, edited, recipe="r").fingerprint()["content"] != base["content"]
    assert 1 not in base["sampled"]  # what it cannot see: a change confined to unsampled clients


def test_a_million_clients_run_without_their_data_in_memory():
    """SCAFFOLD, N = 10^6 a9a-sized clients (~25 kB each: 25 GB as a list), cohort 10, 3 rounds, state='ram'."""
    code = textwrap.dedent("""
        import resource, time, torch
        import torch.nn.functional as F
        from torch import nn
        from python_algos import simulate
        from python_algos.algorithms import SCAFFOLD
        from python_algos.clients.population import Population, SparseLogistic
        torch.manual_seed(0)
        model = nn.Linear(123, 1)
        pop = Population(10**6, SparseLogistic(seed=0))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.perf_counter()
        h = simulate(SCAFFOLD(lr_local=0.1, local_steps=2), model, F.binary_cross_entropy_with_logits, pop,
                     rounds=3, clients_per_round=10, state="ram", metrics_every=0)
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
        print(pop.builds, grew, time.perf_counter() - t, h.state.c_i.rows_written)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    builds, grew, seconds, written = out.stdout.split()
    assert int(builds) <= PROBE_CLIENTS + 30 and 0 < int(written) <= 30
    per_client = sum(t.untyped_storage().nbytes() for t in SparseLogistic(seed=0)(0))
    assert int(grew) < 0.02 * 10**6 * per_client, (grew, per_client)  # far below N x data (~25 GB)
    assert float(seconds) < 20


def test_large_populations_draw_cohorts_uniformly_in_o_k():
    """From N = 2^16 (k <= N/16) a cohort is the first k distinct of uniform draws, not randperm(N)[:k]
    (69 ms a round at N = 10^6): every client equally likely (chi-square), k distinct sorted ids."""
    g = torch.Generator().manual_seed(1)
    n, k, trials = 64, 8, 20000
    counts = torch.zeros(n)
    for _ in range(trials):
        ids = distinct_draws(n, k, g)
        assert ids.unique().numel() == k
        counts[ids] += 1
    expected = trials * k / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 130, chi2  # 63 degrees of freedom: P(chi2 > 130) < 1e-6
    cs = SequentialClients(nn.Linear(2, 1), F.mse_loss, Population(DRAW_DISTINCT_MIN, lambda i: (
        torch.ones(2, 2), torch.ones(2, 1))))
    cs.set_participation(10, seed=3)
    ids = cs.participants()
    assert ids.numel() == 10 and torch.equal(ids, ids.unique()) and int(ids.max()) < DRAW_DISTINCT_MIN


def test_the_population_benchmark_runs_scaled_down(tmp_path):
    """A smoke of `python -m bench.population` (the 10^6-client table is not a test): both rows, and the
    on-demand run built only its cohorts and the probed clients."""
    from bench import population as bench

    out = tmp_path / "population.md"
    bench.main(["--clients", "3000", "--small", "50", "--cohort", "5", "--rounds", "2", "-K", "1", "--repeats", "1",
                "--out", str(out)])
    rows = [line for line in out.read_text().splitlines() if line.startswith("| SCAFFOLD |")]
    assert len(rows) == 2 and "| 3,000 | on demand |" in rows[0] and "| 50 | list in RAM |" in rows[1]
    assert int(rows[0].split("|")[8]) <= PROBE_CLIENTS + 2 * 5


def test_generators_are_created_only_for_minibatches_of_trained_clients():
    pop = Population(10**5, GEN)
    for batch_size, want in ((None, set()), (3, "cohort")):
        torch.manual_seed(0)
        model = nn.Linear(12, 1).double()
        cs = SequentialClients(model, F.binary_cross_entropy_with_logits, pop, batch_size=batch_size)
        cs.set_participation(5, seed=1)
        ids = cs.participants()
        X = torch.zeros(5, 13, dtype=torch.float64)
        cs.gradients_(X, torch.empty_like(X), ids)
        assert set(cs.generators.touched_states()) == (set(ids.tolist()) if want == "cohort" else want)


# -- the loss's kind, decided once for every client (probe.check_population) ------------------------------------

def _labelled(ignore=None, at=()):
    """make_client of 10-sample clients of 5 features, labels 0 and 1 of 3 classes; clients ``at`` (all past
    the probed 0-3) get label ``ignore`` in rows 1 and 4, and client 5 holds 40 samples (more than a batch of 8)."""
    def make(i):
        g = torch.Generator().manual_seed(i)
        m = 40 if i == 5 else 10
        X, y = torch.randn(m, 5, generator=g, dtype=torch.float64), torch.randint(0, 2, (m,), generator=g)
        if i in at:
            y[[1, 4]] = ignore
        return X, y
    return make


def _executor(executor, loss_fn, clients, batch_size, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    cls = SequentialClients if executor == "sequential" else BatchedClients
    return cls(model, loss_fn, clients, batch_size=batch_size, **kw)


@pytest.mark.parametrize("executor", ["sequential", "batched"])
@pytest.mark.parametrize("loss_fn", [nn.CrossEntropyLoss(reduction="sum"),
                                     nn.CrossEntropyLoss(weight=torch.ones(3).double()), nn.NLLLoss(ignore_index=1),
                                     lambda o, y: F.cross_entropy(o, y, weight=torch.tensor([1.0, 2.0, 3.0]).to(o))],
                         ids=["sum", "class-weighted", "chosen-ignore-index", "weighted-callable"])
def test_a_loss_not_a_mean_is_refused_before_the_run_when_a_later_client_has_minibatches(executor, loss_fn):
    """Clients 0-3 hold 10 samples (no minibatch of 16), client 5 holds 40: the refusal came when the
    run first trained client 5. The callable's probed clients hold one label, whose weighted mean is a
    plain mean: the probe tries labels of every class. Full batches run."""
    def one_label(i):
        X, y = _labelled()(i)
        return X, (y if i >= PROBE_CLIENTS else torch.zeros_like(y))

    pop = Population(8, one_label)
    with pytest.raises(ValueError, match=r"(not the mean|out of its mean).*batch_size=16.*batch_size=None.*list"):
        _executor(executor, loss_fn, pop, 16)
    assert pop.builds <= PROBE_CLIENTS  # nothing past the probed clients was read
    _executor(executor, loss_fn, Population(8, one_label), None)


def _full_batch_rows(loss_fn, make, n, executor, **kw):
    """(each client's gradient at the start from the executor, from autograd on its whole data)."""
    cs = _executor(executor, loss_fn, Population(n, make, cache=2), None, **kw)
    x0 = cs.flat.params.detach().clone()
    G = cs.gradients_(cs.new_stack(x0), cs.new_stack())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    want = [torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss_fn(model(X), y), list(model.parameters()))])
            for X, y in (make(i) for i in range(n))]
    return G, torch.stack(want)


@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_ignore_index_on_full_batches_of_a_population_is_exact(executor):
    """Found by the executor fuzzer (seed 128): the probed clients hold no ignored label, so the
    sequential executor took the loss for a per-sample mean and split client 5's batch in weighted
    pieces (chunk 8), which for a mean that leaves labels out is another loss."""
    loss_fn = nn.NLLLoss(ignore_index=2)
    got, want = _full_batch_rows(loss_fn, _labelled(2, at=(5, 6)), 8, executor, chunk=8)
    assert float((got - want).abs().max()) <= 1e-12 * float(want.abs().max())


@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_a_default_ignore_index_label_is_refused_when_its_client_is_built(executor):
    """Under minibatches a label of -100 (F.cross_entropy's ignore_index) makes the mean a weighted one;
    a population's labels are read as each client is built: refused there naming client and row, like a
    NaN, and at construction when a probed client holds one. Full batches take -100 labels."""
    kw = dict(rounds=2, clients_per_round=3, batch_size=4, metrics_every=0, executor=executor, algorithm="fedavg")
    with pytest.raises(ValueError, match=r"client 6 \(make_client\(6\)\) holds label -100 at row 1.*batch_size=None"):
        _simulate_ce(Population(8, _labelled(-100, at=(6,))), participation=1.0, **{**kw, "clients_per_round": None})
    with pytest.raises(ValueError, match=r"client 2 \(make_client\(2\)\) holds label -100 at row 1"):
        _executor(executor, F.cross_entropy, Population(8, _labelled(-100, at=(2,))), 4)
    # the list's batched passes are whole for every client (a label of -100 somewhere); a population's only
    # for a cohort that holds one (its own labels): the same sums, up to rounding
    listed = _simulate_ce([_labelled(-100, at=(6,))(i) for i in range(8)], **{**kw, "batch_size": None})
    lazy = _simulate_ce(Population(8, _labelled(-100, at=(6,))), **{**kw, "batch_size": None})
    assert float((lazy.params - listed.params).abs().max()) <= 1e-13


def _same_runs(a, b) -> None:
    """The model, every metric of every round (untimed) and every client row, bit for bit."""
    assert torch.equal(a.params, b.params), float((a.params - b.params).abs().max())
    untimed = [[{k: v for k, v in m.items() if "time" not in k and k != "elapsed"} for m in [h.initial, *h.metrics]]
               for h in (a, b)]
    assert untimed[0] == untimed[1]
    for f in type(b.state).client_fields:
        rows = [getattr(h.state, f) for h in (a, b)]
        assert torch.equal(*[r.to_dense() if hasattr(r, "to_dense") else r for r in rows]), f


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("ignored", [(), (6,)], ids=["no-ignored-label", "client-6-ignored"])
def test_a_sequential_population_splits_the_batches_its_list_splits(dtype, ignored):
    """Issue 39: F.cross_entropy, full batches of 3-9 samples, the sequential executor's chunk of 4. A list's
    labels were all read (none -100: every batch split in weighted pieces of 4), a population's were not (so
    none was split): FedADMM's model, z and xhat and the metrics differed in their last bits (2.8e-17 in
    test_fuzz_streamed's seed 7). Now each batch is split unless it holds a label of -100 itself, for both;
    with client 6 holding one, the list split no batch before and now splits all but client 6's."""
    from python_algos.algorithms.registry import make

    def client(i):
        X, y = _unequal_client(i)
        y[[1, 2]] = -100 if i in ignored else y[[1, 2]]
        return X.to(dtype), y

    def run(clients):
        return simulate(make("fedadmm", lr=0.05, local_steps=2), _layer_norm_mlp().to(dtype), F.cross_entropy,
                        clients, 3, fk.L1(0.01), None, seed=3, metrics_every=1, executor="sequential",
                        executor_options={"chunk": 4}, threads=1)

    n = 11
    _same_runs(run(Population(n, client, cache=3)), run([client(i) for i in range(n)]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("net", ["layer-norm", "chain"])
@pytest.mark.parametrize("batch_size", [None, 5])
def test_a_batched_populations_cohorts_are_the_lists_bit_for_bit(dtype, net, batch_size):
    """Issue 39: cohorts of 3 of 23 clients of 3-9 samples on the batched executor (the torch.func path and a
    Linear chain). A population builds a cohort's clients alone and padded their batches to the cohort's
    longest; the list run padded to the run's longest (9), so when a cohort's clients held fewer samples their
    last bits differed (SCAFFOLD's model, c_i and the metrics: 2.2e-19 in float64, 1.2e-10 in float32). A
    cohort's call now pads, and cuts its passes, by the cohort's longest batch in both."""
    from python_algos.algorithms.registry import make

    def client(i):
        X, y = _unequal_client(i)
        return X.to(dtype), y

    def run(clients):
        torch.manual_seed(1)
        model = _layer_norm_mlp() if net == "layer-norm" else nn.Sequential(nn.Linear(5, 7), nn.Tanh(),
                                                                             nn.Linear(7, 3))
        return simulate(make("scaffold", lr=0.05, local_steps=2), model.to(dtype), F.cross_entropy, clients, 4,
                        fk.L1(0.01), batch_size, seed=3, metrics_every=1, executor="batched", threads=1,
                        clients_per_round=3)

    n = 23
    _same_runs(run(Population(n, client, cache=5)), run([client(i) for i in range(n)]))


def _simulate_ce(clients, algorithm, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    return simulate(FedAvg(lr_local=0.1, local_steps=2), model, F.cross_entropy, clients, rounds=kw.pop("rounds"),
                    **kw)


def test_a_cohort_is_never_taken_for_a_range_of_as_many_clients():
    """Found by the executor fuzzer (seed 1698): the batched executor keeps the vectorized pass of its
    last call's clients, keyed by (first, count) for a range and by the ids otherwise, so ids [0, 2]
    reused the pass over clients 0 and 1 (and ids [0, 4] the probe's over 0..3, which raised)."""
    make = _labelled()
    cs = _executor("batched", F.cross_entropy, Population(5, make), None)
    x0 = cs.flat.params.detach().clone()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    for ids in ([0, 1], [0, 2], [0, 4]):
        X = cs.new_stack(x0)[torch.tensor(ids)]
        G = cs.gradients_(X, torch.empty_like(X), torch.tensor(ids))
        for j, i in enumerate(ids):
            Xi, yi = make(i)
            want = torch.cat([g.reshape(-1) for g in torch.autograd.grad(F.cross_entropy(model(Xi), yi),
                                                                         list(model.parameters()))])
            assert float((G[j] - want).abs().max()) <= 1e-12, (ids, i)


class _Items(torch.utils.data.Dataset):
    """A Dataset read item by item (its labels are not in memory as one tensor)."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, j):
        return self.X[j], self.y[j]


def test_a_later_client_that_breaks_what_the_run_decided_is_refused_when_built():
    """Past the probed clients, what make_client returns can differ in kind: a DataLoader (its batches are
    weighted as means) under a loss that is not a mean, a Dataset (labels read batch by batch) where every
    label must be checked for -100. Refused when built, naming the client, never run silently. A population
    of Datasets is judged as a list of them (labels unknown: batches computed whole, not refused)."""
    make = _labelled()

    def loader_at_6(i):
        X, y = make(i)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=4) if i == 6 else (X, y)

    cs = _executor("sequential", nn.CrossEntropyLoss(reduction="sum"), Population(8, loader_at_6), None)
    x0 = cs.flat.params.detach().clone()
    with pytest.raises(ValueError, match=r"client 6 \(make_client\(6\)\) is a DataLoader.*reduction='sum'"):
        cs.full_objective_(x0, torch.empty_like(x0))
    cs = _executor("sequential", F.cross_entropy, Population(8, lambda i: _Items(*make(i)) if i == 6 else make(i)), 4)
    with pytest.raises(ValueError, match=r"client 6 \(make_client\(6\)\) is a _Items, whose labels are read batch"):
        cs.full_objective_(x0, torch.empty_like(x0))
    got = []
    for clients in (Population(8, lambda i: _Items(*make(i))), [_Items(*make(i)) for i in range(8)]):
        cs = _executor("sequential", F.cross_entropy, clients, 4, chunk=2)
        got.append(cs.gradients_(cs.new_stack(x0), cs.new_stack()))
    assert torch.equal(got[0], got[1])
