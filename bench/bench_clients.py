"""pytest-benchmark suite for the client executors (see bench/clients_table.py for the table).

    pytest bench/bench_clients.py --benchmark-only                 # N = 10, logreg and MLP
    pytest bench/bench_clients.py --benchmark-only --bench-full    # N = 10, 100; logreg, MLP, CNN

Each case times one round of FedAvg (K = 10, batch 32) on one executor; compare the
``sequential`` and ``batched`` rows of one run. In the default ``python -m pytest`` run each body
runs once (smoke), so the suite cannot rot.
"""

from __future__ import annotations

import pytest

from .clients import ALGORITHMS, make_clients, time_executor, time_plain_loop

CASES = [("logreg", 10), ("mlp", 10), ("logreg", 100), ("mlp", 100), ("cnn", 10), ("cnn", 100)]
SMALL = {("logreg", 10), ("mlp", 10)}


@pytest.fixture(scope="module")
def client_data():
    cache = {}

    def get(N):
        if N not in cache:
            cache[N] = make_clients(N, samples=64)
        return cache[N]

    return get


@pytest.mark.parametrize("executor", ["sequential", "batched", "loop"])
@pytest.mark.parametrize("model, N", CASES, ids=[f"{m}-N{n}" for m, n in CASES])
def test_fedavg_round(benchmark, bench_config, client_data, model, N, executor):
    if not bench_config.full and (model, N) not in SMALL:
        pytest.skip("larger cases run with --bench-full")
    clients = client_data(N)
    result = {}

    def body():
        if executor == "loop":
            result.update(time_plain_loop(model, clients, K=10, rounds=1))
        else:
            result.update(time_executor(model, "FedAvg", clients, executor, K=10, rounds=1))

    benchmark.pedantic(body, rounds=1, warmup_rounds=0, iterations=1)
    benchmark.extra_info["s_per_round"] = result["s_per_round"]
    assert result["s_per_round"] > 0 and "FedAvg" in ALGORITHMS
