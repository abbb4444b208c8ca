"""pytest configuration of the benchmark suite (pytest-benchmark).

    python -m pytest                                          # tests + this smoke (see below)
    pytest bench/                                             # smoke: small sizes, each body once, no compile
    pytest bench/ --benchmark-only                            # small sizes, timed (compile included)
    pytest bench/ --benchmark-only --bench-full               # every model of Table I, full sizes
    pytest bench/ --benchmark-only --bench-full --benchmark-json=bench/results/pytest.json

Files named ``bench_*.py`` are collected (pytest's default is ``test_*.py``). Sizes default to
small (MLP and CNN, 1 Mi-element vectors for the fused updates) so that the suite never rots in CI;
``--bench-full`` (or ``FK_BENCH_FULL=1``) runs MLP, CNN and ResNet-18/34/50/101 at full size, and
``--bench-models`` (``FK_BENCH_MODELS``) picks models. ``torch.compile`` benchmarks carry the
``compile`` marker (they compile for tens of seconds on a small machine) and use a fresh, empty
inductor cache. Threads: ``--bench-threads`` (``FK_BENCH_THREADS``, default 2) for torch and
fedkernels alike.

Without ``--benchmark-only`` or ``--benchmark-enable`` the suite runs as a smoke test: benchmarks
are disabled (each body runs once) and the ``compile`` ones are skipped, which is how the default
``python -m pytest`` (testpaths: tests, bench) keeps them from rotting in CI.

The one-command table generator is ``python -m bench.prox_table`` (see bench/README.md).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile

import pytest

FULL_MODELS = ("mlp", "cnn", "resnet18", "resnet34", "resnet50", "resnet101")
SMALL_MODELS = ("mlp", "cnn")
FULL_VECTOR = 11_175_370  # ResNet-18 (MNIST) parameter count
SMALL_VECTOR = 1 << 20
OVERHEAD_VECTOR = 109_386  # MLP parameter count


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def pytest_addoption(parser):
    group = parser.getgroup("fedkernels benchmarks")
    group.addoption("--bench-full", action="store_true", default=_env_flag("FK_BENCH_FULL"),
                    help="benchmark every Table I model at full size (default: small sizes; env FK_BENCH_FULL=1)")
    group.addoption("--bench-models", default=os.environ.get("FK_BENCH_MODELS"),
                    help=f"comma-separated models from {','.join(FULL_MODELS)} (env FK_BENCH_MODELS)")
    group.addoption("--bench-threads", type=int, default=int(os.environ.get("FK_BENCH_THREADS", "2")),
                    help="torch and fedkernels threads (default 2; 0 = all cores; env FK_BENCH_THREADS)")


def _timed(config) -> bool:
    return bool(config.getoption("benchmark_only", False) or config.getoption("benchmark_enable", False))


def pytest_configure(config):
    # Runs before pytest-benchmark's own (trylast) configure reads the option.
    if not _timed(config):
        config.option.benchmark_disable = True
    config.addinivalue_line(
        "markers", "compile: torch.compile benchmarks (tens of seconds of compiling; deselect with -m 'not compile')"
    )
    # Cold compile times need an empty inductor cache; set it before anything compiles.
    path = tempfile.mkdtemp(prefix="fk-bench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    # pyproject's addopts always give -m ('not slow and not processes'): only an -m that names
    # compile asks for the compile benchmarks
    if _timed(config) or "compile" in config.getoption("markexpr", ""):
        return
    skip = pytest.mark.skip(reason="torch.compile benchmark: run with --benchmark-only (or -m compile)")
    for item in items:
        if item.get_closest_marker("compile") is not None and "bench" in str(item.fspath):
            item.add_marker(skip)


def pytest_collect_file(file_path, parent):
    """Collect bench_*.py in this folder as test modules (a file named on the command line is
    collected by pytest itself)."""
    if file_path.suffix == ".py" and file_path.name.startswith("bench_") and not parent.session.isinitpath(file_path):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    full: bool
    models: tuple
    threads: int
    vector_numel: int  # length of the vectors of the fused-update benchmarks
    overhead_numel: int
    slow_rounds: int  # rounds for calls of ~0.1 s and more (eager prox, fwd+bwd of big models)


def _config(config) -> BenchConfig:
    full = bool(config.getoption("--bench-full"))
    models = config.getoption("--bench-models")
    if models:
        models = tuple(m.strip().lower() for m in models.split(",") if m.strip())
        bad = [m for m in models if m not in FULL_MODELS]
        if bad:
            raise pytest.UsageError(f"--bench-models: unknown {bad}; choose from {','.join(FULL_MODELS)}")
    else:
        models = FULL_MODELS if full else SMALL_MODELS
    return BenchConfig(
        full=full,
        models=models,
        threads=int(config.getoption("--bench-threads")),
        vector_numel=FULL_VECTOR if full else SMALL_VECTOR,
        overhead_numel=OVERHEAD_VECTOR,
        slow_rounds=3 if full else 2,
    )


def pytest_generate_tests(metafunc):
    """``model`` parameters come from the size setting (computed before collection finishes)."""
    if "model_name" in metafunc.fixturenames:
        metafunc.parametrize("model_name", _config(metafunc.config).models)


@pytest.fixture(scope="session")
def bench_config(pytestconfig) -> BenchConfig:
    return _config(pytestconfig)


@pytest.fixture(scope="session", autouse=True)
def _bench_threads(bench_config):
    from .bandwidth import set_threads

    set_threads(bench_config.threads)
    yield


def record_bytes(benchmark, nbytes: int) -> None:
    """Store the bytes one call moves, and the effective GB/s when the benchmark was timed."""
    benchmark.extra_info["bytes_moved"] = int(nbytes)
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    if stats is not None and stats.median > 0:
        benchmark.extra_info["gbps_median"] = nbytes / stats.median / 1e9
        benchmark.extra_info["gbps_best"] = nbytes / stats.min / 1e9


def run_benchmark(benchmark, fn, *, slow: bool = False, rounds: int = 3):
    """``benchmark(fn)``, or a few pedantic rounds for calls that take a large fraction of a second."""
    if slow:
        return benchmark.pedantic(fn, rounds=rounds, warmup_rounds=1, iterations=1)
    return benchmark(fn)
