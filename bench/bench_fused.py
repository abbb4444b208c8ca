"""Fused federated updates vs. their plain-PyTorch compositions, and the per-call overhead of the
custom-op path vs. the low-overhead path.

    pytest bench/bench_fused.py --benchmark-only [--bench-full]

Vectors have ResNet-18's length (11,175,370) with ``--bench-full``, 1 Mi elements otherwise.
Every fused case is checked against its composition once (a single call, from equal inputs) before
it is timed, so a benchmark cannot time a wrong kernel.
"""

from __future__ import annotations

import pytest
import torch

import fedkernels as fk

from . import reference as R
from .conftest import record_bytes

KINDS = [pytest.param(k, id=k) for k in R.KINDS]
IMPLS = ("torch", "torch+fk", "fused")
BETA, ALPHA, ETA, LAM = 1e-3, 1e-3, 1e-3, 0.1


@pytest.fixture(scope="module")
def vecs(bench_config):
    n = bench_config.vector_numel
    gen = torch.Generator().manual_seed(1)
    return {name: 0.01 * torch.randn(n, generator=gen) for name in ("x", "g", "c", "d", "z")}


def _fresh(vecs, *names):
    return [vecs[n].clone() for n in names]


def _check(fn_ref, fn_fused, make_inputs, n_out):
    """Run the composition and the fused kernel once on equal inputs; their outputs must agree."""
    a, b = make_inputs(), make_inputs()
    fn_ref(*a)
    fn_fused(*b)
    for ta, tb in zip(a[:n_out], b[:n_out]):
        torch.testing.assert_close(tb, ta, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- #
# updates without a prox
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("impl", ("torch", "fused"))
def test_cv_step(benchmark, vecs, impl):
    """Control-variate local step x <- x - beta (g + c): SCAFFOLD / FedCanon clients."""
    benchmark.group = "fused cv_step"
    mk = lambda: _fresh(vecs, "x", "g", "c")  # noqa: E731
    _check(lambda x, g, c: R.composed_cv_step_(x, g, c, BETA), lambda x, g, c: fk.raw.cv_step_(x, g, c, BETA), mk, 1)
    x, g, c = mk()
    fn = R.composed_cv_step_ if impl == "torch" else fk.raw.cv_step_
    with torch.no_grad():
        benchmark(fn, x, g, c, BETA)
    record_bytes(benchmark, 16 * x.numel())


@pytest.mark.parametrize("impl", ("torch", "fused"))
def test_control_update(benchmark, vecs, impl):
    """Control-variate update c <- c + dbar - d."""
    benchmark.group = "fused control_update"
    mk = lambda: _fresh(vecs, "c", "g", "d")  # noqa: E731
    _check(R.composed_control_update_, fk.raw.control_update_, mk, 1)
    c, dbar, d = mk()
    fn = R.composed_control_update_ if impl == "torch" else fk.raw.control_update_
    with torch.no_grad():
        benchmark(fn, c, dbar, d)
    record_bytes(benchmark, 16 * c.numel())


# --------------------------------------------------------------------------- #
# updates with a prox
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", KINDS)
def test_fedcanon_server_step(benchmark, vecs, kind, impl):
    """FedCanon server step z <- prox_{alpha h}(z - alpha dbar) (fk.raw.prox_grad_step_)."""
    benchmark.group = f"fused FedCanon server step {kind}"
    step, p1, p2 = R.DEFAULT_PARAMS[kind]
    fns = {
        "torch": lambda z, g: R.composed_prox_grad_step_(z, g, ALPHA, kind, step, p1, p2),
        "torch+fk": lambda z, g: fk.raw.prox_(z.sub_(g, alpha=ALPHA), kind, step, p1, p2),
        "fused": lambda z, g: fk.raw.prox_grad_step_(z, g, ALPHA, kind, step, p1, p2),
    }
    mk = lambda: _fresh(vecs, "z", "g")  # noqa: E731
    _check(fns["torch"], fns[impl], mk, 1)
    z, g = mk()
    with torch.no_grad():
        benchmark(fns[impl], z, g)
    record_bytes(benchmark, 12 * z.numel())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", KINDS)
def test_normal_map_step(benchmark, vecs, kind, impl):
    """FedNMap: z <- z - eta (g + c + (z - x)/lam); x <- prox_{lam h}(z) (fk.raw.normal_map_step_)."""
    benchmark.group = f"fused normal-map step {kind}"
    step, p1, p2 = R.DEFAULT_PARAMS[kind]
    fns = {
        "torch": lambda z, x, g, c: R.composed_normal_map_step_(z, x, g, c, ETA, LAM, kind, step, p1, p2),
        "torch+fk": lambda z, x, g, c: fk.raw.prox_(x.copy_(z.sub_(ETA * (g + c + (z - x) / LAM))), kind, step, p1, p2),
        "fused": lambda z, x, g, c: fk.raw.normal_map_step_(z, x, g, c, ETA, LAM, kind, step, p1, p2),
    }
    mk = lambda: _fresh(vecs, "z", "x", "g", "c")  # noqa: E731
    _check(fns["torch"], fns[impl], mk, 2)
    z, x, g, c = mk()
    with torch.no_grad():
        benchmark(fns[impl], z, x, g, c)
    record_bytes(benchmark, 24 * z.numel())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", KINDS)
def test_za1_step(benchmark, vecs, kind, impl):
    """ZA1: zhat <- zhat - eta (g + c); z <- prox(zhat) (fk.raw.za1_step_)."""
    benchmark.group = f"fused ZA1 step {kind}"
    step, p1, p2 = R.DEFAULT_PARAMS[kind]
    fns = {
        "torch": lambda zh, z, g, c: R.composed_za1_step_(zh, z, g, c, ETA, kind, step, p1, p2),
        "torch+fk": lambda zh, z, g, c: fk.raw.prox_(z.copy_(zh.add_(g + c, alpha=-ETA)), kind, step, p1, p2),
        "fused": lambda zh, z, g, c: fk.raw.za1_step_(zh, z, g, c, ETA, kind, step, p1, p2),
    }
    mk = lambda: _fresh(vecs, "z", "x", "g", "c")  # noqa: E731
    _check(fns["torch"], fns[impl], mk, 2)
    zh, z, g, c = mk()
    with torch.no_grad():
        benchmark(fns[impl], zh, z, g, c)
    record_bytes(benchmark, 20 * zh.numel())


# --------------------------------------------------------------------------- #
# Python-call overhead: custom op vs. low-overhead path
# --------------------------------------------------------------------------- #

PATHS = ("raw", "ops", "regularizer", "fused_fast", "eager_formula")


@pytest.mark.parametrize("numel", [pytest.param(1, id="1"), pytest.param(None, id="mlp")])
@pytest.mark.parametrize("path", PATHS)
def test_call_overhead(benchmark, bench_config, path, numel):
    """Per-call time of each prox entry point (L1) on a 1-element and a 109,386-element buffer:
    the difference to ``raw`` is the Python/dispatcher overhead of the path."""
    n = numel or bench_config.overhead_numel
    benchmark.group = f"call overhead, {n} elements"
    step, kappa, _ = R.DEFAULT_PARAMS["l1"]
    reg = fk.L1(kappa)
    x = 0.01 * torch.randn(n)
    fn = {
        "raw": lambda: fk.raw.prox_(x, "l1", step, kappa),
        "ops": lambda: fk.ops.prox_(x, "l1", step, kappa),
        "regularizer": lambda: reg.prox_(x, step),
        "fused_fast": lambda: fk.fused.prox_(x, reg, step, fast=True),
        "eager_formula": lambda: R.flat_prox_(x, "l1", step, kappa),
    }[path]
    with torch.no_grad():
        benchmark(fn)
    benchmark.extra_info["numel"] = n
