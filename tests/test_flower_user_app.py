"""A Flower user's own app (issue 38 item 9): a ClientApp that is not ours is named with the fix
(``client_app(...)``), ``client_app`` / ``server_app`` read settings from the run's ``run_config``, and
the user's ``evaluate_fn`` runs on the nodes, its sample-weighted means recorded by the server.

Ground truth: the evaluation is recomputed here in plain PyTorch from the returned model and the
clients' data; the run itself is held to ``simulate`` by tests/test_flower.py (same LocalGrid)."""

from __future__ import annotations

import warnings

import pytest
import torch

flwr = pytest.importorskip("flwr", reason='Flower is not installed: pip install ".[flower]"')

from _problems import LeastSquares  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from test_flower import LocalGrid  # noqa: E402

import fedkernels as fk  # noqa: E402
from python_algos.algorithms.registry import make  # noqa: E402
from python_algos.deploy import flower as pf  # noqa: E402

SEED, ROUNDS, BATCH, REG, N = 3, 3, 5, fk.L1(0.05), 4


@pytest.fixture(scope="module")
def problem():
    return LeastSquares(seed=2, n=N, d=6, m=9 + 0)


def _sq_error(model, data, context):
    X, y = data
    with torch.no_grad():
        return {"mse": float(((model(X).reshape(-1) - y) ** 2).mean()), "rows": float(len(y))}


def _run(problem, app, **kw):
    grid = LocalGrid(app, N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pf.run_server(grid, make("fedavg", lr=0.03, local_steps=2), problem.model, regularizer=REG,
                             rounds=ROUNDS, num_clients=N, seed=SEED, batch_size=BATCH, **kw), grid


def test_a_clientapp_that_is_not_ours_is_named_with_the_fix(problem):
    own = ClientApp()

    @own.train()
    def train(msg, context):  # a user's usual Flower client: train and evaluate handlers, no handshake
        return msg

    with pytest.raises(pf.NodeFailure, match=r"not python_algos'.*client_app\(algorithm, model_fn, loss_fn, "
                                              r"load_data"):
        _run(problem, own, connect_timeout=5.0)


def test_evaluate_fn_runs_on_the_nodes_and_is_averaged_by_sample_count(problem):
    # clients of different sizes, so that a plain mean of the nodes' numbers would differ
    sizes = [9, 4, 7, 2]
    data = [(X[:m], y[:m]) for (X, y), m in zip(problem.data, sizes)]
    calls = []

    def evaluate_fn(model, d, context):
        calls.append(context.node_config["partition-id"])
        return _sq_error(model, d, context)

    app = pf.client_app(make("fedavg", lr=0.03, local_steps=2), problem.model, problem.loss,
                        lambda i, ctx: data[i], regularizer=REG, seed=SEED, batch_size=BATCH, evaluate_fn=evaluate_fn)
    res, _ = _run(problem, app, metrics_every=2)
    assert sorted(calls) == sorted(list(range(N)) * 3)  # rounds 0, 2 and the last (3): every node each time
    model = problem.model()
    with torch.no_grad():
        fk.FlatParams(model).params.copy_(res.params)
    X, y = torch.cat([d[0] for d in data]), torch.cat([d[1] for d in data])
    with torch.no_grad():
        pooled = float(((model(X).reshape(-1) - y) ** 2).mean())  # the sample-weighted mean = the pooled mse
    last = res.metrics[-1]
    assert last["round"] == ROUNDS and abs(last["client_mse"] - pooled) <= 1e-12 * (1 + pooled)
    assert last["client_rows"] == pytest.approx(sum(m * m for m in sizes) / sum(sizes))
    assert "client_mse" not in res.metrics[0]  # round 1 is not a metric round (metrics_every=2)


def test_settings_are_read_from_the_run_config(problem):
    app = pf.client_app(make("fedavg", lr=0.03, local_steps=2), problem.model, problem.loss,
                        lambda i, ctx: problem.data[i], regularizer=REG, seed=pf.from_run_config("seed"),
                        batch_size=pf.from_run_config("batch-size"))
    grid = LocalGrid(app, N)
    for ctx in grid.contexts.values():
        ctx.run_config.update({"seed": SEED, "batch-size": BATCH})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = pf.run_server(grid, make("fedavg", lr=0.03, local_steps=2), problem.model, regularizer=REG,
                            rounds=ROUNDS, num_clients=N, seed=SEED, batch_size=BATCH)
    fixed, _ = _run(problem, pf.client_app(make("fedavg", lr=0.03, local_steps=2), problem.model, problem.loss,
                                           lambda i, ctx: problem.data[i], regularizer=REG, seed=SEED,
                                           batch_size=BATCH))
    assert torch.equal(res.params, fixed.params)


def test_a_missing_run_config_entry_is_named(problem):
    app = pf.client_app(make("fedavg", lr=0.03, local_steps=2), problem.model, problem.loss,
                        lambda i, ctx: problem.data[i], regularizer=REG, seed=pf.from_run_config("seed"))
    with pytest.raises(pf.NodeFailure, match=r"seed=from_run_config\('seed'\): the run's run_config has no 'seed'"):
        _run(problem, app, connect_timeout=5.0)


def test_server_app_reads_its_settings_from_the_run_config(problem):
    got = {}
    app = pf.server_app(make("fedavg", lr=0.03, local_steps=2), problem.model, regularizer=REG,
                        rounds=pf.from_run_config("num-server-rounds"), num_clients=N, seed=SEED,
                        on_result=lambda result, context: got.update(rounds=len(result.metrics)))
    client = pf.client_app(make("fedavg", lr=0.03, local_steps=2), problem.model, problem.loss,
                           lambda i, ctx: problem.data[i], regularizer=REG, seed=SEED)
    grid = LocalGrid(client, N)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={"num-server-rounds": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        app(grid, ctx)
    assert got == {"rounds": 2}
