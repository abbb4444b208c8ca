"""Registry-driven contract tests: every algorithm, every regularizer, through ``simulate``.

A small nonconvex model (a 2-layer tanh MLP, cross-entropy, float64) on 4 heterogeneous clients.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import fedkernels as fk
import python_algos as pa
from python_algos.algorithms.registry import ALGORITHMS, make

N_CLIENTS, IN, HIDDEN, CLASSES = 4, 5, 8, 3
REGULARIZERS = [fk.Zero(), fk.L1(1e-2), fk.MCP(1e-2, 3.0), fk.SCAD(1e-2)]
PROX_OUTPUT = {"fedcanon", "fedcanon2", "za1", "fednmap", "prox_fedavg", "fedmid", "fedda", "fastfedda"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_clients(seed=0, n=12):
    g = torch.Generator().manual_seed(seed)
    clients = []
    for i in range(N_CLIENTS):
        X = torch.randn(n, IN, generator=g, dtype=torch.float64) + 0.5 * i  # feature shift per client
        y = (torch.arange(n) + i) % CLASSES  # label skew per client
        clients.append((X, y))
    return clients


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, CLASSES)).double()


def sim(alg, reg=fk.Zero(), rounds=3, **kw):
    kw.setdefault("metrics_every", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pa.simulate(alg, kw.pop("model", None) or make_model(), nn.functional.cross_entropy,
                           kw.pop("clients", None) or make_clients(), rounds, reg, **kw)


@pytest.mark.parametrize("reg", REGULARIZERS, ids=repr)
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_runs_with_every_regularizer(name, reg):
    alg = make(name, lr=0.1, local_steps=3)
    model = make_model()
    d = sum(p.numel() for p in model.parameters())
    hist = sim(alg, reg, rounds=4, model=model)
    assert hist.params.shape == (d,) and hist.params.dtype == torch.float64
    assert torch.isfinite(hist.params).all()
    assert len(hist.metrics) == 4 and [m["round"] for m in hist.metrics] == [1, 2, 3, 4]
    for m in hist.metrics:
        for key in ("f", "h", "f+h", "grad_map_sq", "sparsity", "wall_time", "prox_time", "grad_time"):
            assert math.isfinite(m[key]), key
        assert m["f+h"] == pytest.approx(m["f"] + m["h"])
    assert hist.last["f+h"] < hist.initial["f+h"]  # small steps, full gradients: progress
    # on return the model holds the reported parameters
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), hist.params)


@pytest.mark.parametrize("name", sorted(PROX_OUTPUT))
def test_prox_output_algorithms_are_sparse(name):
    hist = sim(make(name, lr=0.1, local_steps=3), fk.L1(0.05), rounds=4)
    assert hist.last["sparsity"] > 0


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_state_contract(name):
    """init/round/report: a NamedTuple state whose buffers are updated in place, t advances."""
    alg = make(name, lr=0.05, local_steps=2)
    model = make_model()
    clients = pa.SequentialClients(model, nn.functional.cross_entropy, make_clients())
    reg = fk.L1(1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alg.validate(reg)
    x0 = clients.flat.params.detach().clone()
    state = alg.init(x0, clients)
    assert type(state).__name__.endswith("State") and hasattr(state, "_fields")
    assert torch.equal(alg.report(state, reg), x0) or name == "fednmap"  # FedNMap reports prox(z0)
    new = alg.round(state, clients, reg, torch.Generator().manual_seed(0))
    assert type(new) is type(state) and new.t == state.t + 1
    for a, b in zip(state, new):
        if isinstance(a, torch.Tensor) and a.dim() == 2:
            assert a.data_ptr() == b.data_ptr()  # client stacks stay in place


def test_minibatch_runs_are_seeded():
    alg = make("fedcanon", lr=0.1, local_steps=3)
    a = sim(alg, fk.L1(1e-2), batch_size=5, seed=3, metrics_every=0)
    b = sim(alg, fk.L1(1e-2), batch_size=5, seed=3, metrics_every=0)
    c = sim(alg, fk.L1(1e-2), batch_size=5, seed=4, metrics_every=0)
    assert torch.equal(a.params, b.params)
    assert not torch.equal(a.params, c.params)


def test_full_batch_when_batch_size_covers_the_data():
    alg = make("za1", lr=0.1, local_steps=2)
    assert torch.equal(sim(alg, batch_size=None).params, sim(alg, batch_size=1000).params)


def test_scaffnew_coin_is_seeded():
    alg = pa.SCAFFNEW(lr=0.1, p=0.4)
    a, b, c = (sim(alg, rounds=6, seed=s, metrics_every=0) for s in (1, 1, 2))
    assert a.series("grad_evals") == b.series("grad_evals") and torch.equal(a.params, b.params)
    assert a.series("grad_evals") != c.series("grad_evals")
    assert a.state.iterations * N_CLIENTS == sum(a.series("grad_evals"))


def test_datasets_are_accepted():
    clients = make_clients()
    alg = make("fedmid", lr=0.1, local_steps=2)
    a = sim(alg, fk.L1(1e-2), clients=clients, metrics_every=0)
    b = sim(alg, fk.L1(1e-2), clients=[torch.utils.data.TensorDataset(X, y) for X, y in clients], metrics_every=0)
    assert torch.equal(a.params, b.params)


def test_eval_fn_callbacks_and_metric_schedule():
    model = make_model()
    seen = []

    def eval_fn(params):
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        assert torch.equal(flat, params)  # the model holds the evaluated parameters
        return {"norm": float(params.norm())}

    def stop_after_4(t, state, m):
        seen.append(t)
        return t == 4

    hist = sim(make("fedda", lr=0.1, local_steps=2), fk.SCAD(1e-2), rounds=10, model=model,
               eval_fn=eval_fn, callbacks=[stop_after_4], metrics_every=2)
    assert seen == [1, 2, 3, 4] and len(hist.metrics) == 4
    assert "f" not in hist.metrics[0] and "norm" in hist.metrics[1] and "f" in hist.metrics[3]
    assert "normal_map_sq" in hist.metrics[1]  # FedDA: dual z with the elapsed step


def test_simulate_argument_errors():
    with pytest.raises(TypeError):
        pa.simulate("fedcanon", make_model(), nn.functional.cross_entropy, make_clients(), 1)
    with pytest.raises(ValueError):
        sim(make("fedavg", lr=0.1, local_steps=1), rounds=-1)
    with pytest.raises(ValueError):
        sim(make("fedavg", lr=0.1, local_steps=1), batch_size=0)
    with pytest.raises(TypeError):
        sim(make("fedcanon", lr=0.1, local_steps=1), reg="l1")


def test_registry_table_lists_every_algorithm():
    table = pa.algorithms.registry.markdown_table()
    for name in ALGORITHMS:
        assert f"`{name}`" in table
    assert len(ALGORITHMS) == 15


def test_chunked_full_batch_matches_one_pass():
    """Full local gradients over more samples than one chunk accumulate chunk-weighted backward passes."""
    clients = make_clients(n=24)
    one = pa.SequentialClients(make_model(), nn.functional.cross_entropy, clients)
    chunked = pa.SequentialClients(make_model(), nn.functional.cross_entropy, clients, chunk=5)
    X = one.new_stack(one.flat.params.detach())
    G1, G2 = one.new_stack(), chunked.new_stack()
    one.gradients_(X, G1)
    chunked.gradients_(X.clone(), G2)
    assert float(G1.abs().max()) > 0
    torch.testing.assert_close(G1, G2, rtol=1e-12, atol=1e-14)
    # the metric pass (f and the full gradient of f) agrees with the mean of the clients' gradients
    grad = torch.empty_like(X[0])
    f = chunked.full_objective_(X[0], grad)
    torch.testing.assert_close(grad, G1.mean(0), rtol=1e-12, atol=1e-14)
    with torch.no_grad():
        expected = sum(float(nn.functional.cross_entropy(one.model(Xi), yi)) for Xi, yi in clients) / N_CLIENTS
    assert f == pytest.approx(expected, rel=1e-12)
