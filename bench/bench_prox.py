"""Benchmarks behind the prox timing table (FedCanon Table I): per model, forward+backward and the
prox of L1, MCP and SCAD four ways (paper-style eager, torch.compile, fedkernels flat, fedkernels
per parameter), plus the in-place bandwidth probe on the same buffer.

    pytest bench/bench_prox.py --benchmark-only [--bench-full] [-m "not compile"]

Groups are per model (``prox resnet18`` ...), so pytest-benchmark's table lines the variants up.
``python -m bench.prox_table`` measures the same things side by side and writes the markdown table.
"""

from __future__ import annotations

import os
import tempfile
import time

import pytest
import torch
import torch.nn.functional as F

import fedkernels as fk
from python_algos.experiments.models import build_model, count_parameters

from . import reference as R
from .bandwidth import MiB, inplace_bandwidth
from .conftest import record_bytes, run_benchmark

INPUT_SHAPE = (1, 28, 28)  # MNIST, as the paper's Table I
BATCH = 32
BIG = ("resnet34", "resnet50", "resnet101")  # fwd+bwd of a few hundred ms and more


class ModelCase:
    """A model, its flat parameter buffer and per-tensor views of it (built once per model)."""

    def __init__(self, name: str):
        torch.manual_seed(0)
        self.name = name
        self.model = build_model(name, INPUT_SHAPE)
        self.numel = count_parameters(self.model)
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn((BATCH, *INPUT_SHAPE), generator=gen)
        self.y = torch.randint(0, 10, (BATCH,), generator=gen)
        self.flat = fk.FlatParams(self.model)
        self.buf = self.flat.params
        self.views = [p.detach() for p in self.model.parameters()]

    @property
    def inplace_bytes(self) -> int:
        return 2 * self.buf.numel() * self.buf.element_size()


_CASES: dict = {}


@pytest.fixture
def case(model_name) -> ModelCase:
    # one model alive at a time keeps the full run's memory at ResNet-101 size
    if model_name not in _CASES:
        _CASES.clear()
        _CASES[model_name] = ModelCase(model_name)
    return _CASES[model_name]


KIND_PARAMS = [pytest.param(k, id=k) for k in R.KINDS]


def _reg(kind):
    step, p1, p2 = R.DEFAULT_PARAMS[kind]
    return step, {"l1": lambda: fk.L1(p1), "mcp": lambda: fk.MCP(p1, p2), "scad": lambda: fk.SCAD(p1, p2)}[kind]()


# --------------------------------------------------------------------------- #
# forward + backward, bandwidth probe
# --------------------------------------------------------------------------- #


def test_fwd_bwd(benchmark, case, bench_config):
    benchmark.group = f"prox {case.name}"
    benchmark.extra_info.update(params=case.numel, batch=BATCH, input=list(INPUT_SHAPE))
    model = case.model
    model.train()

    def step():
        case.flat.zero_grad()
        F.cross_entropy(model(case.x), case.y).backward()

    run_benchmark(benchmark, step, slow=case.name in BIG, rounds=bench_config.slow_rounds)
    assert torch.isfinite(case.flat.grad).all()


def test_bandwidth_probe_same_size(benchmark, case):
    """x.mul_(1.0) on the model's flat buffer: the roofline for an in-place prox of that size."""
    benchmark.group = f"prox {case.name}"
    with torch.no_grad():
        benchmark(case.buf.mul_, 1.0)
    record_bytes(benchmark, case.inplace_bytes)


def test_bandwidth_probe_large(benchmark, bench_config):
    """The same probe on a buffer much larger than the last-level cache (DRAM bandwidth)."""
    benchmark.group = "bandwidth"
    n = (256 * MiB if bench_config.full else 16 * MiB) // 4
    buf = torch.ones(n)
    benchmark(buf.mul_, 1.0)
    record_bytes(benchmark, 8 * n)


def test_bandwidth_helper_smoke():
    r = inplace_bandwidth(1 * MiB, rounds=2)
    assert r["gbps"] > 0 and r["bytes_moved"] == 2 * MiB


# --------------------------------------------------------------------------- #
# prox, four ways
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_prox_eager_paper_style(benchmark, case, kind, bench_config):
    """(a) composed torch ops per parameter tensor, out of place (what Table I measured)."""
    benchmark.group = f"prox {case.name}"
    step, p1, p2 = R.DEFAULT_PARAMS[kind]
    out = run_benchmark(benchmark, lambda: R.paper_style_prox(case.views, kind, step, p1, p2),
                        slow=case.numel > 5_000_000, rounds=bench_config.slow_rounds)
    assert len(out) == len(case.views)
    record_bytes(benchmark, case.inplace_bytes)


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_prox_fk_flat(benchmark, case, kind):
    """(c) one fedkernels kernel on the flat buffer, in place."""
    benchmark.group = f"prox {case.name}"
    step, p1, p2 = R.DEFAULT_PARAMS[kind]
    buf = case.buf
    ref = R.PROX[kind](buf.clone(), step, p1, p2)
    with torch.no_grad():
        benchmark(fk.raw.prox_, buf, kind, step, p1, p2)
    record_bytes(benchmark, case.inplace_bytes)
    if not benchmark.enabled:  # one call: the result must be the reference formula's
        torch.testing.assert_close(buf, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_prox_fk_per_param(benchmark, case, kind):
    """(d) the regularizer objects on every parameter tensor (one custom-op call each)."""
    benchmark.group = f"prox {case.name}"
    step, reg = _reg(kind)
    views = case.views

    def per_param():
        for v in views:
            reg.prox_(v, step)

    with torch.no_grad():
        benchmark(per_param)
    record_bytes(benchmark, case.inplace_bytes)


# --------------------------------------------------------------------------- #
# torch.compile
# --------------------------------------------------------------------------- #

_COMPILED: dict = {}


def _compiled(kind):
    """One dynamic-shape compile per kind, shared by every model (steady-state benchmarks)."""
    if kind not in _COMPILED:
        _COMPILED[kind] = R.make_compiled_prox(kind, *R.DEFAULT_PARAMS[kind], dynamic=True)
    return _COMPILED[kind]


@pytest.mark.compile
@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_compile_cold(benchmark, kind):
    """Cold compile time of the flat formula: fresh function, fresh inductor cache, first call."""
    benchmark.group = "torch.compile cold compile"
    x = 0.01 * torch.randn(4096)

    def setup():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="fk-bench-inductor-cold-")
        fn = R.make_compiled_prox(kind, *R.DEFAULT_PARAMS[kind], dynamic=True)
        return (fn, x.clone()), {}

    t0 = time.perf_counter()
    benchmark.pedantic(lambda fn, xx: fn(xx), setup=setup, rounds=1, iterations=1)
    benchmark.extra_info["wall_s"] = time.perf_counter() - t0


@pytest.mark.compile
@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_prox_compile(benchmark, case, kind):
    """(b) torch.compile of the same formula on the flat buffer, steady state (compiled beforehand)."""
    benchmark.group = f"prox {case.name}"
    fn = _compiled(kind)
    buf = case.buf
    step, p1, p2 = R.DEFAULT_PARAMS[kind]
    ref = R.PROX[kind](buf.clone(), step, p1, p2)
    t0 = time.perf_counter()
    fn(buf)  # compile (first model) or recompile check, outside the timing
    benchmark.extra_info["first_call_s"] = time.perf_counter() - t0
    torch.testing.assert_close(buf, ref, rtol=1e-5, atol=1e-6)
    benchmark(fn, buf)
    record_bytes(benchmark, case.inplace_bytes)


# --------------------------------------------------------------------------- #
# the table generator itself (not a benchmark: skipped by --benchmark-only)
# --------------------------------------------------------------------------- #


def test_prox_table_smoke(tmp_path):
    """`python -m bench.prox_table` end to end at toy sizes, so the one-command table never rots."""
    import json

    from . import prox_table

    readme = tmp_path / "README.md"
    readme.write_text("# title\n\n<!-- prox-table:begin -->\nold\n<!-- prox-table:end -->\n\ntail\n")
    prox_table.main([
        "--models", "mlp", "--no-compile", "--repeats", "1", "--fast-rounds", "1", "--probe-mib", "2",
        "--fused-numel", "4096", "--overhead-numel", "1024", "--out", str(tmp_path), "--readme", str(readme),
    ])
    data = json.loads((tmp_path / "prox_table.json").read_text())
    cpu = data["devices"]["cpu"]
    assert cpu["models"][0]["model"] == "mlp"
    assert set(cpu["models"][0]["fk_flat"]) == set(R.KINDS)
    assert data["limits"]
    md = (tmp_path / "prox_table.md").read_text()
    assert "| MLP |" in md
    assert "Against this machine's limit" in md and "issue" not in md.lower()
    text = readme.read_text()
    assert "old" not in text and "| MLP |" in text and text.endswith("tail\n")
