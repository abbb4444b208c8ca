"""pytest-benchmark suite for python_algos: the FedCanon Table V analogue (see bench/table_v.py).

    pytest bench/bench_algorithms.py --benchmark-only                # K = 10; T = 1 round
    pytest bench/bench_algorithms.py --benchmark-only --bench-full   # K = 10, 20, 40, 80; T = 2
    python -m bench.table_v                                          # the same, as markdown tables

Each case times T rounds of one algorithm (CNN, 268,362 parameters, 10 clients, SCAD, batch 32)
through ``python_algos.simulate``; ``extra_info`` holds the breakdown (forward/backward, prox
kernels, share of round time outside forward/backward). The goal is an outside share < 10 % for
every algorithm; it is reported, not asserted (timings on a shared machine are noisy).
"""

from __future__ import annotations

import pytest

from .table_v import ALGORITHMS, make_clients, run_one

SMALL_K = (10,)


@pytest.fixture(scope="module")
def table_v_clients():
    return make_clients(num_clients=10, samples=256)


@pytest.mark.parametrize("K", [10, 20, 40, 80])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_table_v(benchmark, bench_config, table_v_clients, algorithm, K):
    if not bench_config.full and K not in SMALL_K:
        pytest.skip("K = 20, 40, 80 run with --bench-full")
    rounds = 2 if bench_config.full else 1
    result = {}

    def body():
        result.update(run_one(algorithm, K, rounds, table_v_clients))

    benchmark.pedantic(body, rounds=1, warmup_rounds=0, iterations=1)
    benchmark.extra_info.update(result)
    assert result["rounds"] == rounds and result["total_s"] > 0
