"""Device code without a GPU: every op through the CUDA thread bodies, executed on the host over
tiny grids (so every grid-stride loop takes several trips), must equal the CPU backend bit for bit.
Also: the 16-bit storage conversions shared by both backends against torch's, exhaustively."""

import pytest
import torch

import fedkernels as fk
from fedkernels._backend import _C

SHAPES = [(1,), (257,), (3, 100), (5, 129)]


def rnd(shape, dtype=torch.float32):
    return (torch.randn(shape, dtype=torch.float64) * 2).to(dtype)


def run_both(fn, *tensors, grid=(3, 2, 32)):
    cpu = [t.clone() for t in tensors]
    emu = [t.clone() for t in tensors]
    out_cpu = fn(*cpu)
    with fk.emulate_cuda(*grid):
        out_emu = fn(*emu)
    return cpu, emu, out_cpu, out_emu


def assert_same(a, b):
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.int8) if x.numel() else x, y.view(torch.int8) if y.numel() else y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind,p1,p2,step", [
    ("l1", 0.3, 0, 1.0), ("elastic_net", 0.3, 0.5, 1.0), ("mcp", 0.5, 1.5, 0.5), ("mcp", 0.5, 1.5, 3.0),
    ("scad", 0.5, 3.7, 1.0), ("scad", 0.5, 3.7, 5.0), ("box", -0.5, 0.5, 1.0), ("nonneg", 0, 0, 1.0)])
def test_prox_ops(kind, p1, p2, step, shape, dtype):
    x, g, c, y = (rnd(shape, dtype) for _ in range(4))

    def ops(x, g, c, y):
        fk.raw.prox_(x, kind, step, p1, p2)
        fk.raw.prox_grad_step_(g, x, 0.1, kind, step, p1, p2)
        fk.raw.za1_step_(c, y, x, g, 0.1, kind, step, p1, p2)
        return fk.raw.prox(y, kind, step, p1, p2)

    cpu, emu, oc, oe = run_both(ops, x, g, c, y)
    assert_same(cpu, emu)
    assert_same([oc], [oe])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_update_ops(shape, dtype):
    tensors = [rnd(shape, dtype) for _ in range(6)]
    row = rnd(shape[-1:], dtype)

    def ops(z, x, g, c, m, y):
        fk.raw.cv_step_(x, g, row, 0.1)
        fk.raw.normal_map_step_(z, x, g, c, 0.1, 0.7, "scad", 0.7, 0.5, 3.7)
        fk.raw.depositum_step_(z, m, y, 0.1, 0.8, "mcp", 0.1, 0.5, 1.5, momentum="snag")
        d = fk.raw.normalized_delta(row, x, 0.1, 3)
        fk.raw.control_update_(c, row, d)
        fk.raw.box_tensor_(y, -row.abs(), row.abs())
        return d

    cpu, emu, oc, oe = run_both(ops, *tensors)
    assert_same(cpu, emu)
    assert_same([oc], [oe])


@pytest.mark.parametrize("grid", [(1, 1, 1), (3, 2, 32), (64, 8, 256)])
@pytest.mark.parametrize("shape", SHAPES + [(0,), (2, 0)])
def test_l2_ball_reduction(shape, grid):
    x = rnd(shape, torch.float64) * 10
    c = rnd(shape[-1:], torch.float64)
    cpu, emu, _, _ = run_both(lambda x: fk.raw.l2_ball_(x, 1.5, c), x, grid=grid)
    assert_same(cpu, emu)  # one summation order everywhere (tests/test_reduction_order.py)


@pytest.mark.parametrize("grid", [(1, 1, 1), (2, 3, 7), (5, 1, 64)])
def test_every_element_visited_once(grid):
    # cv_step with g = 1, c = 0, beta = 1 subtracts exactly 1 from each element it visits
    x = torch.zeros(7, 301)
    with fk.emulate_cuda(*grid):
        fk.raw.cv_step_(x, torch.ones_like(x), torch.zeros_like(x), 1.0)
    assert torch.equal(x, -torch.ones_like(x))


def test_half_to_float_exhaustive():
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    h = bits.view(torch.float16)
    # identity prox loads every half into float and stores it back
    out = fk.raw.prox(h, "nonneg", 0.0)  # max(v, 0): exercises load, compare, store
    want = torch.clamp(h.float(), min=0).half()
    nan = torch.isnan(h)
    assert torch.equal(torch.isnan(out), nan)
    assert torch.equal(out[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("emulated", [False, True])
def test_float_to_16bit_rounding_matches_torch(dtype, emulated):
    """x <- x - beta (g + c) on 16-bit storage is computed in float32 and rounded once (RNE),
    exactly as torch does it op by op: bit-identical for random finite bit patterns, which cover
    subnormals, overflow to inf and rounding ties."""
    gen = torch.Generator().manual_seed(1)
    bits = torch.randint(-(2**15), 2**15, (200000,), generator=gen, dtype=torch.int32).to(torch.int16)
    vals = bits.view(dtype)
    vals = vals[torch.isfinite(vals)]
    x, g = vals, vals.flip(0)
    c = torch.zeros_like(x)
    beta = float(torch.tensor(0.7071, dtype=torch.float32))
    want = (x.float() - torch.tensor(beta, dtype=torch.float32) * (g.float() + c.float())).to(dtype)
    ours = x.clone()
    if emulated:
        with fk.emulate_cuda(64, 1, 256):
            fk.raw.cv_step_(ours, g, c, beta)
    else:
        fk.raw.cv_step_(ours, g, c, beta)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(ours), nan)
    assert torch.equal(ours[~nan].view(torch.int16), want[~nan].view(torch.int16))


# --- [N, small d] stacks ------------------------------------------------------------------------


def busy_fraction(rows, cols):
    """Share of a real launch's threads that get at least one element."""
    gx, gy, block, flat = _C.cuda_launch_config(rows, cols)
    threads = gx * gy * block
    if flat:
        return min(rows * cols, gx * block) / threads
    return min(rows, gy) * min(cols, gx * block) / threads


@pytest.mark.parametrize("rows,cols", [(1000, 10), (4096, 3), (100, 100), (50, 300), (20, 1000)])
def test_short_rows_keep_the_threads_busy(rows, cols):
    assert busy_fraction(rows, cols) >= 0.5


@pytest.mark.parametrize("rows,cols", [(1, 10), (3, 10**5), (2, 5000)])
def test_long_rows_keep_one_block_row_per_row(rows, cols):
    gx, gy, block, flat = _C.cuda_launch_config(rows, cols)
    assert not flat and gy == rows and gx * block >= cols


@pytest.mark.parametrize("grid", [(1, 1, 1), (2, 3, 7), (5, 1, 64), (3, 2, 32)])
@pytest.mark.parametrize("shape", [(7, 3), (33, 1), (5, 129), (2, 4095)])
def test_short_rows_every_element_visited_once(grid, shape):
    x = torch.zeros(shape)
    with fk.emulate_cuda(*grid):
        fk.raw.cv_step_(x, torch.ones_like(x), torch.zeros(shape[-1]), 1.0)
    assert torch.equal(x, -torch.ones_like(x))


@pytest.mark.parametrize("shape", [(300, 7), (1000, 33), (64, 100)])
def test_short_rows_same_bits_on_every_path(shape):
    """Row-broadcast operands and 16-bit storage through the flat grid, the CPU row split
    (1 and 2 threads) and plain torch: the same bits (elementwise ops have one result)."""
    x, g = rnd(shape, torch.bfloat16), rnd(shape, torch.bfloat16)
    c = rnd(shape[-1:], torch.bfloat16)
    want = (x.float() - torch.tensor(0.25) * (g.float() + c.float())).to(torch.bfloat16)
    results = []
    for n in (1, 2):
        before = fk.get_num_threads()
        fk.set_num_threads(n)
        try:
            y = x.clone()
            fk.raw.cv_step_(y, g, c, 0.25)
            results.append(y)
        finally:
            fk.set_num_threads(before)
    with fk.emulate_cuda(4, 2, 32):
        y = x.clone()
        fk.raw.cv_step_(y, g, c, 0.25)
        results.append(y)
    for y in results:
        assert torch.equal(y.view(torch.int16), want.view(torch.int16))


def test_cpu_gives_whole_short_rows_to_threads():
    assert _C.cpu_splits_rows(10_000, 10)
    assert _C.cpu_splits_rows(100, 1000)
    assert not _C.cpu_splits_rows(1, 100_000)
    assert not _C.cpu_splits_rows(4, 1_000_000)
