"""The CPU kernel variants (baseline, AVX2, AVX-512; csrc/cpu/isa_dispatch.cpp): every elementwise op
gives the same bits in every variant and thread count, on aligned and misaligned buffers; each
thread's share of a pass starts on a cache line; FEDKERNELS_CPU_ISA picks the variant of a process.
"""

import os
import subprocess
import sys

import pytest
import torch

import fedkernels as fk
from fedkernels import _C

VARIANTS = _C.cpu_isa_variants().split(",")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (kind, step, p1, p2): every formula of csrc/math/prox.h, each regime of MCP and SCAD
# (SCAD at step 2.0 is the small step near its regime edge: kScadSmallEdge, whose AVX-512 loop runs
# 16-lane blocks of its own, csrc/cpu/lanes_avx512.h)
PROX_CASES = [("l1", 0.3, 1.0, 0.0), ("elastic_net", 0.3, 1.0, 0.5), ("mcp", 0.3, 1.0, 3.0), ("mcp", 3.5, 1.0, 3.0),
              ("scad", 0.3, 1.0, 3.7), ("scad", 2.0, 1.0, 3.7), ("scad", 3.0, 1.0, 3.7), ("box", 0.0, -0.5, 0.7),
              ("nonneg", 0.0, 0.0, 0.0)]


SIGNALING_NAN = {torch.float32: 0x7F800001, torch.float64: 0x7FF0000000000001}


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _inputs(n, dtype, count, offset):
    """`count` buffers of n values starting `offset` elements into their allocation (0: aligned),
    with values in every piece of every prox (and some exact thresholds, 0, +-inf, a quiet nan of
    either sign and, in float32 and float64, a signaling one)."""
    gen = torch.Generator().manual_seed(n + offset)
    out = []
    for _ in range(count):
        v = torch.randn(n + offset, generator=gen, dtype=torch.float64) * 3
        v[offset: offset + 9] = torch.tensor([0.0, -0.0, 0.3, -1.3, 3.7, float("inf"), -float("inf"), float("nan"),
                                              -float("nan")])
        v = v.to(dtype)
        if dtype in SIGNALING_NAN:  # quiet bit clear, payload 1: what any arithmetic turns into a quiet nan
            v[offset + 9: offset + 10].view(_bits(v).dtype).fill_(SIGNALING_NAN[dtype])
        out.append(v[offset:])
    return out


def _ops():
    """name -> fn(list of buffers) that runs one kernel in place."""
    ops = {f"prox {k} s={s}": (1, lambda b, k=k, s=s, p=p, q=q: fk.raw.prox_(b[0], k, s, p, q))
           for k, s, p, q in PROX_CASES}
    ops.update({
        "prox_grad_step scad": (2, lambda b: fk.raw.prox_grad_step_(b[0], b[1], 0.1, "scad", 0.3, 1.0, 3.7)),
        "normal_map_step mcp": (4, lambda b: fk.raw.normal_map_step_(b[0], b[1], b[2], b[3], 0.1, 0.5, "mcp", 0.5,
                                                                     1.0, 3.0)),
        "za1_step scad": (4, lambda b: fk.raw.za1_step_(b[0], b[1], b[2], b[3], 0.1, "scad", 3.0, 1.0, 3.7)),
        "depositum_step l1": (3, lambda b: fk.raw.depositum_step_(b[0], b[1], b[2], 0.1, 0.9, "l1", 0.1, 1.0,
                                                                  momentum="snag")),
        "cv_step": (3, lambda b: fk.raw.cv_step_(b[0], b[1], b[2], 0.1)),
        "control_update": (3, lambda b: fk.raw.control_update_(b[0], b[1], b[2])),
        "normalized_delta_": (2, lambda b: fk.raw.normalized_delta_(b[0], b[1], 0.1, 3)),
        "box_tensor_": (3, lambda b: fk.raw.box_tensor_(b[0], torch.minimum(b[1], b[2]), torch.maximum(b[1], b[2]))),
    })
    return ops


def _run(op, n, dtype, offset, isa, threads):
    count, fn = op
    bufs = _inputs(n, dtype, count, offset)
    before = fk.get_num_threads()
    _C.set_cpu_isa(isa)
    fk.set_num_threads(threads)
    try:
        fn(bufs)
    finally:
        _C.set_cpu_isa("auto")
        fk.set_num_threads(before)
    return bufs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(_ops()))
def test_every_op_has_the_same_bits_in_every_variant_and_thread_count(name, dtype):
    op = _ops()[name]
    # 40,003 values: above the parallel threshold (32 K), not a multiple of any vector width;
    # offset 5: no buffer starts on a cache line
    for n, offset in ((40_003, 0), (40_003, 5)):
        want = _run(op, n, dtype, offset, "baseline", 1)
        for isa in VARIANTS:
            for threads in (1, 2):
                got = _run(op, n, dtype, offset, isa, threads)
                for g, w in zip(got, want):
                    assert torch.equal(_bits(g), _bits(w)), (name, n, offset, isa, threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_za1_step_streaming_z_has_the_same_bits_in_every_variant_and_thread_count(dtype):
    # z of 16 MiB or more is written with non-temporal stores (csrc/cpu/kernels.cpp, kStreamMinBytes):
    # 4,194,304 float32 / 8,388,608 bfloat16 values; offset 5: z's head is not on a cache line
    op = _ops()["za1_step scad"]
    n = (16 << 20) // torch.tensor([], dtype=dtype).element_size() + 1003
    for offset in (0, 5):
        want = _run(op, n, dtype, offset, "baseline", 1)
        for isa in VARIANTS:
            for threads in (1, 2):
                got = _run(op, n, dtype, offset, isa, threads)
                for g, w in zip(got, want):
                    assert torch.equal(_bits(g), _bits(w)), (n, offset, isa, threads)


@pytest.mark.parametrize("case", [c for c in PROX_CASES if c[0] in ("l1", "mcp", "scad")], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_prox_pass_from_dram_prefetches_and_keeps_the_same_bits_in_every_variant(case, dtype):
    # over 4 MiB (csrc/cpu/kernels.cpp, kPrefetchMinBytes) a prox pass runs its prefetching loops,
    # instantiations of their own; 1,200,003 values, offset 5: a tail, and no buffer on a cache line
    kind, step, p1, p2 = case
    op = (1, lambda b: fk.raw.prox_(b[0], kind, step, p1, p2))
    n = 1_200_003
    for offset in (0, 5):
        want = _run(op, n, dtype, offset, "baseline", 1)
        for isa in VARIANTS:
            for threads in (1, 2):
                got = _run(op, n, dtype, offset, isa, threads)
                assert torch.equal(_bits(got[0]), _bits(want[0])), (case, offset, isa, threads)


@pytest.mark.parametrize("cols", [0, 1, 63, 64, 65, 4096, 70_003, 5_844_756 * 2 + 1, 11_689_512])
@pytest.mark.parametrize("threads", [1, 2, 3, 16])
def test_each_threads_share_starts_on_a_cache_line_and_the_shares_tile_the_row(cols, threads):
    shares = [_C.cpu_column_share(cols, t, threads) for t in range(threads)]
    assert shares[0][0] == 0 and shares[-1][1] == cols
    for (_, e0), (b1, _) in zip(shares, shares[1:]):
        assert e0 == b1  # contiguous, no overlap
    for b, e in shares:
        assert b <= e
        assert b % 16 == 0 or b == cols  # 16 float32 = 64 bytes: no AVX-512 access straddles two lines
        assert b % 64 == 0 or b == cols  # (64 elements: a line boundary for every storage type)
    sizes = [e - b for b, e in shares]
    assert max(sizes) - min(sizes) <= 2 * 64  # balanced to within a block (and the last, partial one)


def test_the_resnet18_buffer_is_split_on_a_cache_line():
    # schedule(static) split these 11,689,512 floats at 5,844,756 (byte offset 16 mod 64)
    assert _C.cpu_column_share(11_689_512, 1, 2)[0] * 4 % 64 == 0


def _info_in_subprocess(isa_env):
    env = dict(os.environ, FEDKERNELS_CPU_ISA=isa_env)
    code = "import fedkernels as fk; i = fk.backend_info(); print(i['cpu_isa'], i['cpu_isa_source'])"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("isa", VARIANTS)
def test_FEDKERNELS_CPU_ISA_picks_the_variant_and_backend_info_says_so(isa):
    r = _info_in_subprocess(isa)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [isa, "FEDKERNELS_CPU_ISA"]


def test_set_cpu_isa_wins_and_backend_info_says_so():
    # (without FEDKERNELS_CPU_ISA the variant is calibrated: tests/test_isa_calibration.py)
    info = fk.backend_info()
    assert info["cpu_isa_variants"] == VARIANTS
    _C.set_cpu_isa(VARIANTS[0])
    try:
        assert (fk.backend_info()["cpu_isa"], fk.backend_info()["cpu_isa_source"]) == (VARIANTS[0], "set_cpu_isa")
    finally:
        _C.set_cpu_isa("auto")


def test_a_bad_FEDKERNELS_CPU_ISA_fails_at_import_naming_the_variable():
    r = _info_in_subprocess("avx9000")
    assert r.returncode != 0
    assert "FEDKERNELS_CPU_ISA must be 'auto' or a variant this CPU runs" in r.stderr
    assert "avx9000" in r.stderr and VARIANTS[-1] in r.stderr
