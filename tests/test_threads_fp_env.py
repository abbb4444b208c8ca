"""Thread count and floating-point environment (issue 35, defects 4 and 10): after
``torch.set_flush_denormal(True)`` results are bitwise independent of the thread count (every OpenMP
worker computes with the calling thread's FTZ/DAZ bits) and equal to torch's own under the same flag;
``fk.set_num_threads`` refuses counts that would end the process at the next kernel call."""

import contextlib

import pytest
import torch

import fedkernels as fk

N = 1 << 17  # above the kernels' parallel threshold (32 K elements), so 2 threads split the pass


@contextlib.contextmanager
def kernel_threads(n):
    before = fk.get_num_threads()
    fk.set_num_threads(n)
    try:
        yield
    finally:
        fk.set_num_threads(before)


@contextlib.contextmanager
def flush_denormal():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode (torch.set_flush_denormal needs SSE3)")
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _denormal_inputs(dtype):
    tiny = torch.finfo(dtype).tiny  # the smallest normal number
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(N, generator=gen, dtype=torch.float64).add(1.0).mul(tiny).to(dtype)  # in [tiny, 2 tiny)
    g = torch.full((N,), tiny, dtype=dtype)
    sub = (torch.rand(N, generator=gen, dtype=torch.float64) * tiny).to(dtype)  # subnormal values
    sub[::2] *= -1
    return x, g, sub


def _ops():
    return {
        # x - 1 * (g + 0): exact in IEEE arithmetic, a subnormal result that FTZ flushes to 0
        "cv_step_": lambda x, g, sub: fk.raw.cv_step_(x, g, torch.zeros_like(x), 1.0),
        # subnormal inputs that DAZ reads as 0: |v| <= 0 gives 0, else v itself
        "prox_ l1": lambda x, g, sub: fk.raw.prox_(sub, "l1", 1.0, 0.0),
        "prox_ scad": lambda x, g, sub: fk.raw.prox_(sub, "scad", 0.5, 1e-40, 3.7),
        "za1_step_": lambda x, g, sub: fk.raw.za1_step_(x, sub, g, torch.zeros_like(x), 1.0, "l1", 0.0, 0.0),
        "l2_ball_": lambda x, g, sub: fk.raw.l2_ball_(sub.view(4, -1), 1e-45),
    }


def _run(name, dtype, threads):
    x, g, sub = _denormal_inputs(dtype)
    with kernel_threads(threads):
        _ops()[name](x, g, sub)
    return x, sub


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(_ops()))
def test_flush_denormal_results_do_not_depend_on_the_thread_count(name, dtype):
    _run(name, dtype, 2)  # start the OpenMP workers before the flag changes: they keep their own FP state
    with flush_denormal():
        one = _run(name, dtype, 1)
        two = _run(name, dtype, 2)
    for a, b in zip(one, two):
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} of {a.numel()} elements differ, 1 vs 2 threads"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_flush_denormal_matches_torch(dtype):
    x, g, sub = _denormal_inputs(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # torch's own intra-op workers do not see the flag either: its 1-thread result
    try:
        with flush_denormal():
            want = x - 1.0 * (g + torch.zeros_like(x))  # torch's own arithmetic under the same flag
    finally:
        torch.set_num_threads(threads)
    with flush_denormal():
        with kernel_threads(2):
            fk.raw.cv_step_(x, g, torch.zeros_like(x), 1.0)
    assert torch.equal(x, want)
    assert bool((want == 0).all())  # the flag did act: every result is flushed


def test_set_num_threads_is_bounded():
    before = fk.get_num_threads()
    try:
        cap = fk.max_num_threads()
        assert 1 <= cap <= 1024
        for bad in (50_000, cap + 1, -1):
            with pytest.raises(ValueError, match=r"num_threads must be 0 .* or between 1 and"):
                fk.set_num_threads(bad)
        for bad in (2.0, True, "2"):
            with pytest.raises(TypeError, match="num_threads must be an int"):
                fk.set_num_threads(bad)
        fk.set_num_threads(1)
        assert fk.get_num_threads() == 1
        fk.set_num_threads(0)  # OpenMP's default
        assert fk.get_num_threads() >= 1
    finally:
        fk.set_num_threads(0 if before == torch.get_num_threads() else before)
    y = fk.raw.prox(torch.randn(N), "l1", 0.1, 1.0)  # the kernels still run
    assert y.shape == (N,)
