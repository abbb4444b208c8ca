"""Build facts, the tables shared between Python and C++, threads, profiling counters, and int64
indexing beyond 2^31 elements."""


import pytest
import torch
from conftest import mem_available_gib

import fedkernels as fk
from fedkernels import _C
from fedkernels._backend import DTYPE_CODES, KIND_CODES


def test_backend_info_keys():
    info = fk.backend_info()
    for key in ("cpu_threads", "simd", "cpu_isa", "cpu_isa_source", "cpu_isa_variants", "cuda_compiled", "cuda_archs",
                "cuda_available", "cuda_error"):
        assert key in info
    assert info["cpu_threads"] >= 1
    if info["cuda_compiled"]:
        assert info["cuda_archs"] and all(a.isdigit() for a in info["cuda_archs"])
    if not info["cuda_available"]:
        assert isinstance(info["cuda_error"], str) and info["cuda_error"]


@pytest.mark.skipif(not _C.cpu_only_by_request(), reason="this build was not made with FEDKERNELS_CPU_ONLY=1")
def test_backend_info_says_a_cpu_only_build_was_requested():
    # not "no CUDA compiler at install time": nvcc may well have been on PATH
    error = fk.backend_info()["cuda_error"]
    assert "CPU-only by request" in error and "FEDKERNELS_CPU_ONLY=1" in error
    assert "no CUDA compiler" not in error


def test_kind_table_agrees_with_cpp_planner():
    # the planner's regime choice is visible through its formula id (csrc/math/prox.h ProxImpl)
    impl = {k: _C.plan_prox(code, 1.0, 0.5, 3.7)[0] for k, code in KIND_CODES.items()}
    # scad: 9 at this step (s a > a - 1 - s: two-term thresholds), 5 at step 0.5 (one-term)
    assert impl == {"zero": 0, "l1": 1, "elastic_net": 2, "mcp": 3, "scad": 9, "box": 7, "nonneg": 8}
    assert _C.plan_prox(KIND_CODES["scad"], 0.5, 0.5, 3.7)[0] == 5
    assert _C.plan_prox(KIND_CODES["mcp"], 3.7, 0.5, 3.7)[0] == 4     # step >= gamma: hard threshold
    assert _C.plan_prox(KIND_CODES["scad"], 2.7, 0.5, 3.7)[0] == 6    # step >= a - 1: two candidates
    assert _C.plan_prox(KIND_CODES["mcp"], 3.0, 1.0, 3.0)[1] == pytest.approx(3.0)  # lam sqrt(s gamma)
    with pytest.raises(ValueError, match="unknown prox kind"):
        _C.plan_prox(42, 1.0, 0.0, 0.0)
    assert sorted(DTYPE_CODES.values()) == [0, 1, 2, 3]


def test_set_num_threads_changes_nothing_numerically():
    x = torch.randn(200_000, dtype=torch.float64)
    old = fk.get_num_threads()
    try:
        fk.set_num_threads(1)
        a = fk.raw.prox(x, "scad", 0.5, 1.0, 3.7)
        fk.set_num_threads(2)
        b = fk.raw.prox(x, "scad", 0.5, 1.0, 3.7)
    finally:
        fk.set_num_threads(0 if old == torch.get_num_threads() else old)
    assert torch.equal(a, b)
    with pytest.raises(ValueError):
        fk.set_num_threads(-1)


def test_prox_stats_counts_through_the_kernel_layer():
    X = torch.randn(4, 100)
    with fk.prox_stats() as st:
        fk.raw.prox_(X, "l1", 0.1, 1.0)              # 4 models
        fk.raw.prox_grad_step_(X[0], X[1], 0.1, "l1", 0.1, 1.0)  # 1 model
        fk.raw.prox_(X, "zero", 0.1)                 # identity: not an evaluation
        fk.raw.cv_step_(X, X.clone(), X.clone(), 0.1)  # no prox
        fk.SCAD(1.0).prox(X[0], 0.1)                 # through the registered ops: counted too
    assert st.evaluations == 6 and st.calls == 3 and st.seconds > 0


@pytest.mark.slow
@pytest.mark.bigmem
@pytest.mark.skipif(mem_available_gib() < 10, reason="needs ~7 GiB free memory")
def test_more_than_2_31_elements():
    n = 2**31 + 1000
    x = torch.zeros(n, dtype=torch.float16)  # 4 GiB
    head = torch.tensor([3.0, -3.0, 0.5], dtype=torch.float16)
    x[:3] = head
    x[-3:] = head
    x[2**31 - 1 : 2**31 + 2] = head
    fk.raw.prox_(x, "l1", 1.0, 1.0)
    want = torch.tensor([2.0, -2.0, 0.0], dtype=torch.float16)
    assert torch.equal(x[:3], want)
    assert torch.equal(x[2**31 - 1 : 2**31 + 2], want)
    assert torch.equal(x[-3:], want)
    # a stack whose rows*cols exceeds 2^31 but each row fits in int32
    X = x.view(2, n // 2)
    X[1, -1] = 5.0
    g = torch.zeros(n // 2, dtype=torch.float16)  # a row of X itself would overlap X: rejected
    fk.raw.prox_grad_step_(X, g, 0.0, "l1", 1.0, 1.0)
    assert X[1, -1] == 4.0


# --- CUDA device guard (csrc/cuda/device_guard.h), through a recording device API -----------------
# The real guard needs a GPU; its switching rule is a template that the host runs here.


def test_device_guard_does_not_switch_when_the_device_is_current():
    assert _C.device_guard_trace(1, 1, [0, 1]) == []


def test_device_guard_restores_only_a_device_with_a_context():
    # a thread with no current context reports device 0, which has no context: leave it alone
    assert _C.device_guard_trace(0, 1, [1]) == [1]
    # the previous device has a context: switch back, as torch's CUDAGuard does
    assert _C.device_guard_trace(0, 1, [0, 1]) == [1, 0]
    assert _C.device_guard_trace(2, 1, [1, 2]) == [1, 2]


# --- CUDA toolkit newer than the driver -----------------------------------------------------------


def _fake_cuda_build(monkeypatch, *, initialized, count_error=(1, ""), torch_count=1, driver=(13, 0)):
    import fedkernels._backend as backend

    class FakeC:
        def __getattr__(self, name):
            return getattr(_C, name)

        def cuda_compiled(self):
            return True

        def cuda_runtime_version(self):
            return "13.0"

        def cuda_archs(self):
            return "90"

        def cuda_device_count(self):
            return count_error

    monkeypatch.setattr(backend, "_C", FakeC())
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: torch_count)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(backend, "_driver_cuda_version", lambda: driver, raising=False)


@pytest.mark.parametrize("initialized", [False, True])
def test_backend_info_explains_a_driver_older_than_the_toolkit(monkeypatch, initialized):
    _fake_cuda_build(monkeypatch, initialized=initialized, driver=(12, 4),
                     count_error=(0, "CUDA driver version is insufficient for CUDA runtime version"))
    info = fk.backend_info()
    assert not info["cuda_available"]
    msg = info["cuda_error"]
    for words in ("CUDA 13.0 toolkit", "driver 580 or newer", "supports CUDA up to 12.4",
                  "Update the NVIDIA driver", "CUDA 12 toolkit"):
        assert words in msg, (words, msg)


def test_backend_info_with_a_new_enough_driver(monkeypatch):
    _fake_cuda_build(monkeypatch, initialized=False, driver=(13, 1))
    info = fk.backend_info()
    assert info["cuda_available"] and info["cuda_error"] is None


def _cmake():
    import shutil

    return shutil.which("cmake")


@pytest.mark.skipif(_cmake() is None, reason="cmake not on PATH")
@pytest.mark.parametrize("nvcc,torch_cuda,warns", [
    ("13.0.88", "12.4", True), ("12.8.93", "12.4", False), ("13.0.88", "13.0", False),
    ("13.0.88", "", False), ("12.1.0", "11.8", True)])
def test_configure_warns_when_nvcc_is_newer_than_torchs_cuda(nvcc, torch_cuda, warns):
    import pathlib
    import subprocess

    script = pathlib.Path(__file__).resolve().parents[1] / "cmake" / "check_cuda_versions.cmake"
    res = subprocess.run([_cmake(), f"-DFK_NVCC_VERSION={nvcc}", f"-DFK_TORCH_CUDA={torch_cuda}", "-P",
                          str(script)], capture_output=True, text=True, check=True)
    out = " ".join((res.stdout + res.stderr).split())  # cmake wraps long messages
    assert ("CMake Warning" in out) == warns, out
    if warns:
        assert f"built with CUDA {torch_cuda}" in out and "nvidia-smi" in out
