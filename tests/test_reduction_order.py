"""l2_ball_ is bit-identical on every backend, thread count and CPU instruction set (FedCanon II
keeps replicas that must stay identical), and equals an independent float64 evaluation of the
documented summation order (csrc/math/reduce.h):

  chunks of 8192 elements; in a chunk, lane l in [0, 256) adds elements l, l + 256, ... in
  sequence; lanes combine by the tree lane[t] += lane[t + s], s = 128 ... 1; chunk sums add in
  order; factor = min(1, radius / sqrt(total)); x <- c + (x - c) * factor in the compute type.
"""

import contextlib

import pytest
import torch

import fedkernels as fk
from fedkernels._backend import _C

LANES, PER_LANE = 256, 32
CHUNK = LANES * PER_LANE


def reference_l2_ball(x: torch.Tensor, radius: float, center=None) -> torch.Tensor:
    """The documented order, written with plain torch float64 ops (each add is one IEEE add)."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    X = x.reshape(1, -1) if x.dim() != 2 else x
    rows, cols = X.shape
    c = torch.zeros(cols, dtype=x.dtype) if center is None else center
    C = c.expand(rows, cols) if c.dim() == 1 else c
    d = X.to(torch.float64) - C.to(torch.float64)
    sq = d * d
    chunks = max(1, -(-cols // CHUNK))
    padded = torch.zeros(rows, chunks * CHUNK, dtype=torch.float64)
    padded[:, :cols] = sq
    blocks = padded.view(rows, chunks, PER_LANE, LANES)
    lanes = torch.zeros(rows, chunks, LANES, dtype=torch.float64)
    for i in range(PER_LANE):  # adding the +0.0 padding leaves a non-negative sum unchanged
        lanes = lanes + blocks[:, :, i, :]
    s = LANES // 2
    while s > 0:
        lanes = torch.cat([lanes[:, :, :s] + lanes[:, :, s : 2 * s], lanes[:, :, s:]], dim=2)
        s //= 2
    total = torch.zeros(rows, dtype=torch.float64)
    for k in range(chunks):
        total = total + lanes[:, k, 0]
    norm = total.sqrt()
    # (not radius / norm: torch computes a scalar over a tensor as reciprocal(norm) * radius)
    factor = torch.where(norm <= radius, torch.ones_like(norm), torch.full_like(norm, radius) / norm).to(compute)
    Xc, Cc = X.to(compute), C.to(compute)
    out = Cc + (Xc - Cc) * factor[:, None]
    return out.to(x.dtype).reshape(x.shape)


@contextlib.contextmanager
def cpu_isa(name):
    _C.set_cpu_isa(name)
    try:
        yield
    finally:
        _C.set_cpu_isa("auto")


@contextlib.contextmanager
def threads(n):
    before = fk.get_num_threads()
    fk.set_num_threads(n)
    try:
        yield
    finally:
        fk.set_num_threads(before)


def bits(t):
    if t.element_size() == 2:
        return t.view(torch.int16)
    return t.view(torch.int32 if t.element_size() == 4 else torch.int64)


SHAPES = [(40_001,), (3, 20_000), (2, 2 * CHUNK + 7), (64, 700)]


def project(x, center, radius, setting):
    y = x.clone()
    if setting[0] == "cpu":
        with threads(setting[1]), cpu_isa(setting[2]):
            fk.raw.l2_ball_(y, radius, center)
    else:
        with fk.emulate_cuda(*setting[1]):
            fk.raw.l2_ball_(y, radius, center)
    return y


def settings():
    out = [("cpu", n, isa) for n in (1, 2) for isa in _C.cpu_isa_variants().split(",")]
    return out + [("emulated", g) for g in ((1, 1, 32), (3, 2, 32), (64, 8, 256))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("centered", [False, True])
def test_bitwise_identical_everywhere_and_equal_to_the_documented_order(shape, dtype, centered):
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3).to(dtype)
    center = (torch.randn(shape[-1:], generator=gen, dtype=torch.float64)).to(dtype) if centered else None
    radius = 0.37 * float((x.double().reshape(-1, shape[-1]) ** 2).sum(1).sqrt().min())  # every row moves
    want = reference_l2_ball(x, radius, center)
    for setting in settings():
        got = project(x, center, radius, setting)
        assert torch.equal(bits(got), bits(want)), setting


def test_every_variant_is_reachable():
    for isa in _C.cpu_isa_variants().split(","):
        with cpu_isa(isa):
            assert _C.cpu_isa() == isa
    with pytest.raises(ValueError, match="isa must be"):
        _C.set_cpu_isa("sse9")
