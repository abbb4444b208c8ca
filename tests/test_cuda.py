"""The CUDA backend on a real GPU (pytest marker ``cuda``; skipped without a GPU and a CUDA build).

* every op, on every dtype, bit for bit equal to the CPU backend on the same inputs (both backends
  are built without FMA contraction, so each element is rounded identically), through the
  low-overhead path (``fk.raw``) and the registered ops (``fk.ops``);
* kernels run on torch's current stream: a side stream's earlier work is seen, and results are
  right after ``wait_stream``;
* a tensor on a device other than the current one;
* CUDA graph capture after warm-up (raw and ops paths): replay equals eager;
* more than 2^31 elements of 16-bit data (int64 indexing), where GPU memory allows;
* ``torch.compile(fullgraph=True)`` on CUDA tensors.

The comparison tests also run with ``device="cpu"`` (ops path against raw path) and
``device="emulated"`` (the CUDA thread bodies on the host, ``fk.emulate_cuda``), so the case table
and the calls are exercised on machines without a GPU. Run only the GPU part with
``python -m pytest -m cuda tests/test_cuda.py``; ``FK_REQUIRE_CUDA_TESTS=1`` turns "no GPU" into
a failure instead of a skip (``python -m bench.gpu_check`` sets it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Callable

import pytest
import torch

import fedkernels as fk

ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
        torch.bfloat16: torch.int16}


def _cuda_unavailable() -> str:
    """Why the CUDA tests cannot run here ("" if they can)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    info = fk.backend_info()
    if not info["cuda_compiled"]:
        return "fedkernels was built without CUDA (reinstall with FEDKERNELS_REQUIRE_CUDA=1 pip install .)"
    if not info["cuda_available"]:
        return f"fedkernels' CUDA runtime sees no device: {info['cuda_error']}"
    return ""


_WHY_NOT = _cuda_unavailable()
_REQUIRE = os.environ.get("FK_REQUIRE_CUDA_TESTS", "") == "1"


def _needs_cuda(fn):
    """Marker ``cuda`` plus a skip (or, with FK_REQUIRE_CUDA_TESTS=1, a failure) without a GPU."""
    fn = pytest.mark.cuda(fn)
    if _WHY_NOT and not _REQUIRE:
        fn = pytest.mark.skip(reason=_WHY_NOT)(fn)
    return fn


@pytest.fixture
def cuda():
    if _WHY_NOT:
        pytest.fail(f"FK_REQUIRE_CUDA_TESTS=1 but {_WHY_NOT}")
    return torch.device("cuda", torch.cuda.current_device())


# --------------------------------------------------------------------------- #
# The case table: every op, called identically through fk.raw and fk.ops
# --------------------------------------------------------------------------- #

# name -> (step, p1, p2); MCP and SCAD in both regimes (past gamma / a - 1 the kernels switch formula)
PROX = {
    "zero": (0.3, 0.0, 0.0),
    "l1": (0.7, 0.3, 0.0),
    "elastic_net": (0.7, 0.3, 0.5),
    "mcp_firm": (0.5, 0.5, 1.5),
    "mcp_hard": (3.0, 0.5, 1.5),
    "scad_small": (1.0, 0.5, 3.7),
    "scad_large": (5.0, 0.5, 3.7),
    "box": (1.0, -0.5, 0.7),
    "nonneg": (1.0, 0.0, 0.0),
}


def _kind(name: str) -> str:
    return name.split("_")[0] if name.startswith(("mcp", "scad")) else name


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    run: Callable  # run(api, T) -> list of tensors to compare; api is fk.raw or fk.ops
    exact: bool = True  # False: a reduction whose summation order differs between backends

    def __repr__(self):
        return self.name


def _prox_cases():
    for name, (step, p1, p2) in PROX.items():
        kind = _kind(name)
        yield Case(f"prox_/{name}", lambda api, T, k=kind, s=step, a=p1, b=p2: [api.prox_(T["x"], k, s, a, b)])
        yield Case(f"prox/{name}", lambda api, T, k=kind, s=step, a=p1, b=p2: [api.prox(T["x_t"], k, s, a, b)])
        yield Case(f"prox_grad_step_/{name}",
                   lambda api, T, k=kind, s=step, a=p1, b=p2:
                   [api.prox_grad_step_(T["x"], T["g_row"], 0.3, k, s, a, b)])
    for name in ("l1", "mcp_hard", "scad_large", "box"):
        step, p1, p2 = PROX[name]
        kind = _kind(name)
        yield Case(f"normal_map_step_/{name}", lambda api, T, k=kind, s=step, a=p1, b=p2: list(
            api.normal_map_step_(T["z"], T["x"], T["g"], T["c_row"], 0.1, 0.7, k, s, a, b)))
        yield Case(f"za1_step_/{name}", lambda api, T, k=kind, s=step, a=p1, b=p2: list(
            api.za1_step_(T["z"], T["x"], T["g"], T["c_row"], 0.1, k, s, a, b)))
        for momentum in ("shb", "snag"):
            for normalized in (True, False):
                yield Case(f"depositum_step_/{name}/{momentum}/{'norm' if normalized else 'plain'}",
                           lambda api, T, k=kind, s=step, a=p1, b=p2, mo=momentum, nz=normalized: list(
                               api.depositum_step_(T["x"], T["m"], T["y_row"], 0.1, 0.8, k, s, a, b,
                                                   momentum=mo, normalized=nz)))


def _update_cases():
    yield Case("box_tensor_", lambda api, T: [api.box_tensor_(T["x"], -T["r_row"].abs(), T["r_row"].abs())])
    yield Case("box_tensor", lambda api, T: [api.box_tensor(T["x_t"], -T["r"].abs(), T["r"].abs())])
    yield Case("cv_step_", lambda api, T: [api.cv_step_(T["x"], T["g"], T["c_row"], 0.1)])
    yield Case("normalized_delta", lambda api, T: [api.normalized_delta(T["z_row"], T["x"], 0.05, 7)])
    yield Case("normalized_delta_", lambda api, T: [api.normalized_delta_(T["x"], T["z_row"], 0.05, 7)])
    yield Case("control_update_", lambda api, T: [api.control_update_(T["c"], T["y_row"], T["g"])])
    yield Case("l2_ball_/origin", lambda api, T: [api.l2_ball_(T["x"], 1.5, None)], exact=False)
    yield Case("l2_ball_/center", lambda api, T: [api.l2_ball_(T["x"], 1.5, T["r_row"])], exact=False)
    yield Case("l2_ball_/inside", lambda api, T: [api.l2_ball_(T["x"], 1e9, T["r_row"])], exact=False)
    yield Case("group_lasso_/rows", lambda api, T: [_group_lasso(api, T["x"], "rows")], exact=False)
    yield Case("group_lasso_/cols", lambda api, T: [_group_lasso(api, T["x"], "cols")], exact=False)


def _group_lasso(api, x, groups):
    """A stack is one matrix; a vector of n elements holds an [8, n / 8] (or [1, n]) matrix."""
    if x.dim() == 2:
        return api.group_lasso_(x, 0.5, 1.0, groups)
    n = x.shape[0]
    return api.group_lasso_(x, 0.5, 1.0, groups, shape=(8, n // 8) if n % 8 == 0 else (1, n))


CASES = list(_prox_cases()) + list(_update_cases())


def test_case_table_covers_every_op():
    assert {c.name.split("/")[0] for c in CASES} == set(fk.ops.__all__)


@functools.lru_cache(maxsize=16)
def _cpu_inputs(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)

    def rnd(s):
        return (torch.randn(s, generator=gen, dtype=torch.float64) * 2).to(dtype)

    row = shape[-1:]
    T = {name: rnd(shape) for name in ("x", "z", "g", "c", "m", "r")}
    T.update({f"{name}_row": rnd(row) for name in ("g", "c", "y", "z", "r")})
    T["xt"] = rnd(tuple(reversed(shape)))
    return T


def make_inputs(shape, dtype, device, seed=0):
    """Inputs built on the CPU from a seeded generator (cached; never written) and copied to
    ``device``, so every backend gets the same bits. ``*_row`` operands are one row of a 2-D stack
    (row-broadcast); ``x_t`` is a non-contiguous tensor shaped like x (out-of-place ops copy it)."""
    src = _cpu_inputs(tuple(shape), dtype, seed)
    T = {k: v.to(device, copy=True) for k, v in src.items() if k != "xt"}
    xt = src["xt"].to(device, copy=True)
    T["x_t"] = xt.t() if len(shape) == 2 else xt
    return T


def _device_of(device):
    return "cpu" if device in ("cpu", "emulated") else device


def run_case(case, api, shape, dtype, device, seed=0):
    T = make_inputs(shape, dtype, _device_of(device), seed)
    if device == "emulated":
        with fk.emulate_cuda():
            outs = case.run(api, T)
    else:
        outs = case.run(api, T)
    return [o.cpu() for o in outs]


def assert_bitwise(got, want, what=""):
    """Equal bit patterns, except that any NaN matches any NaN (payloads and signs of a NaN differ
    between x86 and CUDA and carry no meaning here)."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), f"{what}: NaN positions differ"
    bits = BITS[got.dtype]
    g, w = got[~nan].contiguous().view(bits), want[~nan].contiguous().view(bits)
    if not torch.equal(g, w):
        bad = (g != w).nonzero()[:5].flatten().tolist()
        raise AssertionError(f"{what}: {int((g != w).sum())} elements differ in bits, e.g. at "
                             f"{bad}: got {got[~nan][bad].tolist()}, want {want[~nan][bad].tolist()}")


def assert_matches(got_list, want_list, exact, what):
    assert len(got_list) == len(want_list)
    for i, (got, want) in enumerate(zip(got_list, want_list)):
        if exact:
            assert_bitwise(got, want, f"{what} output {i}")
        else:
            # the row norm is summed in another order: a few roundings of the result apart, and at
            # most 1e-10 relative in float64 over millions of terms (one missed term of n = 2^24
            # would show as ~3e-8)
            tol = max(4 * torch.finfo(want.dtype).eps, 1e-10)
            torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol,
                                       msg=lambda m, i=i: f"{what} output {i}: {m}")


DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("emulated", id="emulated"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda] + ([pytest.mark.skip(reason=_WHY_NOT)]
                                                                if _WHY_NOT and not _REQUIRE else [])),
]


def _shapes(device, dtype):
    small = [(1,), (1000,), (7, 333)]
    if device != "cuda":
        return small
    # more rows than the grid's y limit (65535), so the row loop strides; for float32 also a vector
    # longer than one grid pass (65536 blocks of 256 threads = 2^24 elements), so the column loop
    # strides, and long rows with an odd tail (every op shares one launcher: one dtype suffices)
    big = [((1 << 24) + 4099,), (3, (1 << 22) + 1)] if dtype == torch.float32 else []
    return small + [(70_000, 3)] + big


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_matches_cpu_backend(case, dtype, device):
    if device == "cuda" and _WHY_NOT:
        pytest.fail(f"FK_REQUIRE_CUDA_TESTS=1 but {_WHY_NOT}")
    for shape in _shapes(device, dtype):
        want = run_case(case, fk.raw, shape, dtype, "cpu")
        for api in (fk.raw, fk.ops):
            got = run_case(case, api, shape, dtype, device)
            assert_matches(got, want, case.exact, f"{case.name} {api.__name__} {shape} {dtype} on {device}")


SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-45, 1e-40, -3e-39,
            1e-310, -1e-310, 6e-8, -6e-8, 1e-5, 3.4e38, -3.4e38, 1e300, 0.5, -0.5, 0.7, -0.7, 0.21,
            -0.21, 0.75, 1.5, -1.5, 1.85, 2.0, 3.7, -3.7, 1.0, -1.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_special_values_match_cpu_backend(dtype, device):
    """Signed zeros, infinities, NaN, subnormals, huge values and values on the prox thresholds:
    the device rounds, selects and propagates exactly like the CPU."""
    if device == "cuda" and _WHY_NOT:
        pytest.fail(f"FK_REQUIRE_CUDA_TESTS=1 but {_WHY_NOT}")
    vals = torch.tensor(SPECIALS, dtype=torch.float64).to(dtype)
    g = vals.roll(7)
    dev = _device_of(device)
    for name, (step, p1, p2) in PROX.items():
        kind = _kind(name)

        def prox(x, g, kind=kind, step=step, p1=p1, p2=p2):
            return fk.raw.prox_(x, kind, step, p1, p2)

        def prox_grad_step(x, g, kind=kind, step=step, p1=p1, p2=p2):
            return fk.raw.prox_grad_step_(x, g, 0.5, kind, step, p1, p2)

        for label, fn in (("prox_", prox), ("prox_grad_step_", prox_grad_step)):
            want = fn(vals.clone(), g)
            x = vals.clone().to(dev)
            if device == "emulated":
                with fk.emulate_cuda():
                    fn(x, g.to(dev))
            else:
                fn(x, g.to(dev))
            assert_bitwise(x.cpu(), want, f"{label} {name} {dtype} on {device}")
    want = fk.raw.cv_step_(vals.clone(), g, g.roll(3), 0.25)
    x = vals.clone().to(dev)
    if device == "emulated":
        with fk.emulate_cuda():
            fk.raw.cv_step_(x, g.to(dev), g.roll(3).to(dev), 0.25)
    else:
        fk.raw.cv_step_(x, g.to(dev), g.roll(3).to(dev), 0.25)
    assert_bitwise(x.cpu(), want, f"cv_step_ {dtype} on {device}")


# --------------------------------------------------------------------------- #
# Streams, devices, graphs, int64 indexing, torch.compile (GPU only)
# --------------------------------------------------------------------------- #

N_STREAM = 1 << 22  # 16 MiB of float32: a kernel takes long enough for a missed dependency to show


def _spin(ms: float = 50.0) -> None:
    """Keep the current stream busy for about ``ms`` (so work queued behind it runs late)."""
    torch.cuda._sleep(int(ms * 1e-3 * 2e9))  # ~2 GHz SM clock; the exact length does not matter


@_needs_cuda
def test_side_stream_sees_prior_work_on_that_stream(cuda):
    """Delay a fill on a side stream, then run the kernels on that stream: they must see the fill
    (they run on torch's current stream, not the legacy default one) and the main stream, after
    wait_stream, must see their result."""
    x0 = (torch.randn(N_STREAM, dtype=torch.float64) * 2).float()
    g0 = torch.randn(N_STREAM).float()
    want = fk.raw.prox_grad_step_(x0.clone(), g0, 0.3, "scad", 1.0, 0.5, 3.7)
    want = fk.raw.prox_(want, "l1", 0.5, 0.1)
    src, g = x0.to(cuda), g0.to(cuda)
    for api in (fk.raw, fk.ops):
        x = torch.zeros_like(src)
        torch.cuda.synchronize()
        side = torch.cuda.Stream(device=cuda)
        side.wait_stream(torch.cuda.current_stream(cuda))
        with torch.cuda.stream(side):
            _spin()
            x.copy_(src)  # prior work, finishing ~50 ms from now
            api.prox_grad_step_(x, g, 0.3, "scad", 1.0, 0.5, 3.7)
            api.prox_(x, "l1", 0.5, 0.1)
        torch.cuda.current_stream(cuda).wait_stream(side)
        x.record_stream(side)
        out = x * 1.0  # on the main stream, ordered after the side stream's kernels
        assert_bitwise(out.cpu(), want, f"{api.__name__} on a side stream")


@_needs_cuda
def test_main_stream_work_is_not_overtaken(cuda):
    """The reverse order: a kernel queued on the current stream behind a slow producer waits for it."""
    x0 = torch.randn(N_STREAM)
    want = fk.raw.cv_step_(x0.clone(), torch.ones(N_STREAM), torch.zeros(N_STREAM), 0.5)
    src = x0.to(cuda)
    x = torch.zeros_like(src)
    g, c = torch.ones_like(src), torch.zeros_like(src)
    torch.cuda.synchronize()
    _spin()
    x.copy_(src)
    fk.raw.cv_step_(x, g, c, 0.5)
    assert_bitwise(x.cpu(), want, "cv_step_ behind a slow producer")


@_needs_cuda
def test_l2_ball_on_side_stream(cuda):
    """The two-pass op (reduction into a temporary, then scale) keeps both passes on the caller's stream."""
    x0 = torch.randn(5, 100_003, dtype=torch.float64)
    want = fk.raw.l2_ball_(x0.clone(), 3.0)
    src = x0.to(cuda)
    x = torch.zeros_like(src)
    torch.cuda.synchronize()
    side = torch.cuda.Stream(device=cuda)
    with torch.cuda.stream(side):
        _spin()
        x.copy_(src)
        fk.raw.l2_ball_(x, 3.0)
    torch.cuda.current_stream(cuda).wait_stream(side)
    torch.testing.assert_close(x.cpu(), want, rtol=1e-10, atol=1e-12)


@_needs_cuda
def test_tensor_on_non_current_device(cuda):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    other = torch.device("cuda", 1 if cuda.index == 0 else 0)
    before = torch.cuda.current_device()
    shape = (4, 100_001)
    for case in CASES:
        for api in (fk.raw, fk.ops):
            want = run_case(case, fk.raw, shape, torch.float32, "cpu")
            got = run_case(case, api, shape, torch.float32, other)
            assert_matches(got, want, case.exact, f"{case.name} {api.__name__} on {other}")
            assert torch.cuda.current_device() == before, f"{case.name} changed the current device"
    # the kernels must run on the other device's current stream: delay that stream, go back to the
    # current device, and queue the kernel; it must wait for the delayed copy
    x0 = torch.randn(N_STREAM)
    want = fk.raw.prox_(x0.clone(), "mcp", 3.0, 0.5, 1.5)
    src = x0.to(other)
    x = torch.zeros_like(src)
    torch.cuda.synchronize(other)
    with torch.cuda.device(other):
        _spin()
        x.copy_(src)
    assert torch.cuda.current_device() == before
    fk.raw.prox_(x, "mcp", 3.0, 0.5, 1.5)
    assert_bitwise(x.cpu(), want, "prox_ behind slow work on the non-current device's stream")


def _graph_round(api, T):
    """One federated-round-like sequence touching every kind of kernel, fully on device."""
    api.cv_step_(T["x"], T["g"], T["c_row"], 0.1)
    api.normal_map_step_(T["z"], T["x"], T["g"], T["c_row"], 0.1, 0.7, "scad", 5.0, 0.5, 3.7)
    api.za1_step_(T["m"], T["r"], T["g"], T["c"], 0.1, "mcp", 3.0, 0.5, 1.5)
    api.depositum_step_(T["c"], T["g"], T["y_row"], 0.1, 0.8, "l1", 0.1, 0.3, 0.0, momentum="snag")
    api.prox_grad_step_(T["x"], T["g_row"], 0.3, "elastic_net", 0.7, 0.3, 0.5)
    api.control_update_(T["c"], T["y_row"], T["g"])
    d = api.normalized_delta(T["z_row"], T["x"], 0.05, 7)
    api.normalized_delta_(T["m"], T["z_row"], 0.05, 7)
    api.box_tensor_(T["z"], -T["r_row"].abs(), T["r_row"].abs())
    api.l2_ball_(T["r"], 1.5, T["r_row"])
    p = api.prox(T["x"], "box", 1.0, -0.5, 0.7)
    return [T[k] for k in ("x", "z", "m", "r", "c", "g")] + [d, p]


GRAPH_SHAPE = (6, 50_001)


@pytest.mark.parametrize("device", ["cpu", "emulated"])
def test_graph_round_on_cpu(device):
    """The captured sequence itself, eagerly on the CPU: ops path equals raw path equals CPU."""
    want = [t.cpu() for t in _graph_round(fk.raw, make_inputs((3, 301), torch.float32, "cpu", seed=1))]
    for api in (fk.raw, fk.ops):
        with (fk.emulate_cuda() if device == "emulated" else contextlib.nullcontext()):
            got = _graph_round(api, make_inputs((3, 301), torch.float32, "cpu", seed=1))
        for i, (o, e) in enumerate(zip(got, want)):
            torch.testing.assert_close(o, e, rtol=1e-6, atol=1e-6) if i == 3 else assert_bitwise(o, e, f"output {i}")


@_needs_cuda
@pytest.mark.parametrize("api", [fk.raw, fk.ops], ids=["raw", "ops"])
def test_cuda_graph_capture_replays_like_eager(cuda, api):
    eager = [t.cpu() for t in _graph_round(api, make_inputs(GRAPH_SHAPE, torch.float32, cuda, seed=1))]
    static = make_inputs(GRAPH_SHAPE, torch.float32, cuda, seed=2)
    # warm-up on a side stream, as torch's graph docs ask (first launches load kernels lazily)
    side = torch.cuda.Stream(device=cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.cuda.stream(side):
        for _ in range(2):
            _graph_round(api, make_inputs(GRAPH_SHAPE, torch.float32, cuda, seed=3))
    torch.cuda.current_stream(cuda).wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = _graph_round(api, static)
    for _ in range(2):  # replaying twice from the same inputs gives the same result twice
        fresh = make_inputs(GRAPH_SHAPE, torch.float32, cuda, seed=1)
        for k in static:
            static[k].copy_(fresh[k])
        graph.replay()
        torch.cuda.synchronize()
        for i, (o, e) in enumerate(zip(outs, eager)):
            if i == 3:  # r went through l2_ball_: the device reduction order may vary run to run
                torch.testing.assert_close(o.cpu(), e, rtol=1e-6, atol=1e-6)
            else:
                assert_bitwise(o.cpu(), e, f"graph output {i} ({api.__name__})")


def check_long_buffers(device, dtype, n, rows, cols, boundary, w=4096):
    """On a 1-D buffer of n elements and a [rows, cols] stack: every element is written exactly once,
    and windows at the start, across ``boundary`` and at the end equal the CPU backend's values
    (each element depends only on the same element of the inputs, so windows suffice)."""
    # x <- x - 1 * g with g = 1, x = 0: every element becomes -1 (0 if missed, -2 if visited twice)
    x = torch.zeros(n, dtype=dtype, device=device)
    g = torch.ones(n, dtype=dtype, device=device)
    fk.raw.prox_grad_step_(x, g, 1.0, "zero", 0.0)
    assert bool((x == -1).all()), f"{int((x != -1).sum())} elements not written exactly once"
    del g
    x.normal_()
    windows = [slice(0, w), slice(boundary - w // 2, boundary + w // 2), slice(n - w, n)]
    before = [x[s].to("cpu", copy=True) for s in windows]
    fk.raw.prox_(x, "scad", 1.0, 0.5, 3.7)
    for s, b in zip(windows, before):
        assert_bitwise(x[s].cpu(), fk.raw.prox_(b.clone(), "scad", 1.0, 0.5, 3.7), f"prox_ window {s}")
    out = fk.ops.prox(x, "l1", 0.5, 0.3)
    for s in windows:
        assert_bitwise(out[s].cpu(), fk.raw.prox(x[s].cpu(), "l1", 0.5, 0.3), f"prox window {s}")
    del x, out
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    # a stack with row-broadcast operands: the last row's elements lie past ``boundary``
    assert rows * cols > boundary
    X = torch.zeros(rows, cols, dtype=dtype, device=device)
    fk.raw.cv_step_(X, torch.ones(cols, dtype=dtype, device=device), torch.zeros(cols, dtype=dtype, device=device), 1.0)
    assert bool((X == -1).all()), f"{int((X != -1).sum())} stack elements not written exactly once"
    X.normal_()
    y = torch.randn(cols, dtype=torch.float64).to(dtype)
    x_last = X[-1, -w:].to("cpu", copy=True)
    fk.raw.depositum_step_(X, torch.zeros_like(X), y.to(device), 0.1, 0.8, "mcp", 3.0, 0.5, 1.5)
    want, _ = fk.raw.depositum_step_(x_last, torch.zeros_like(x_last), y[-w:].clone(), 0.1, 0.8, "mcp", 3.0, 0.5, 1.5)
    assert_bitwise(X[-1, -w:].cpu(), want, "depositum_step_ on the last row of the stack")
    del X
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


@pytest.mark.parametrize("emulated", [False, True])
def test_long_buffer_check_on_cpu(emulated):
    """The same check at a small size on the CPU (and through the device code, emulated)."""
    with (fk.emulate_cuda() if emulated else contextlib.nullcontext()):
        check_long_buffers("cpu", torch.bfloat16, 3 * 4096 + 5, 3, 2 * 4096 + 1, 2 * 4096 + 7)


@_needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_more_than_2_31_elements(cuda, dtype):
    """16-bit buffers past 2^31 elements (int64 indexing), where GPU memory allows."""
    n = (1 << 31) + (1 << 20) + 3
    cols = (1 << 31) // 3 + 4096  # 3 rows: the last row crosses element 2^31
    need = 3 * n * 2 + (1 << 30)  # peak: two buffers and a bool mask, plus slack
    free, _ = torch.cuda.mem_get_info(cuda)
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    check_long_buffers(cuda, dtype, n, 3, cols, 1 << 31)


@_needs_cuda
def test_torch_compile_fullgraph_on_cuda(cuda, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    reg = fk.SCAD(0.5, 3.7)

    def server_round(z, X, C, beta, alpha):
        D = fk.ops.normalized_delta(z, X, beta, 4)
        dbar = D.mean(0)
        fk.ops.control_update_(C, dbar, D)
        fk.ops.prox_grad_step_(z, dbar, alpha, "scad", alpha, reg.lam, reg.a)
        fk.fused.normal_map_step_(X, C, D, dbar, 0.1, 0.7, reg)
        return z * 2.0, reg.prox(z, 0.1), fk.ops.l2_ball_(X.clone(), 1.0, None)

    compiled = torch.compile(server_round, fullgraph=True)
    z, X, C = (torch.randn(s, device=cuda) for s in [(50_001,), (4, 50_001), (4, 50_001)])
    z2, X2, C2 = z.clone(), X.clone(), C.clone()
    out_c = compiled(z, X, C, 0.1, 0.2)
    out_e = server_round(z2, X2, C2, 0.1, 0.2)
    # inductor may sum D.mean(0) in another order than eager: close, not bitwise
    for a, b in zip(out_c + (z, X, C), out_e + (z2, X2, C2)):
        torch.testing.assert_close(a, b)
