"""Loading of the compiled extension and the tables shared with C++.

The codes below mirror ``csrc/math/common.h`` (dtypes) and ``csrc/math/prox.h`` (penalty kinds);
tests/test_backend.py checks both sides agree by planning every kind through ``_C.plan_prox``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.machinery
import importlib.util
import os
import sys

import torch

from . import _calibrate


def _load_extension():
    """Import fedkernels._C.

    In an installed copy it sits next to this file. When this package is imported from a source
    checkout (e.g. ``python -m pytest`` in the repository root, which puts the checkout first on
    sys.path), the compiled module is not in the tree: use the one ``pip install .`` put in
    site-packages, built from the same sources.
    """
    try:
        from . import _C

        return _C
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        pkg = os.path.join(os.path.abspath(entry or os.curdir), "fedkernels")
        if os.path.abspath(pkg) == here or not os.path.isdir(pkg):
            continue
        spec = importlib.machinery.PathFinder.find_spec("fedkernels._C", [pkg])
        if spec is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules["fedkernels._C"] = module
        spec.loader.exec_module(module)
        return module
    raise ImportError(
        "fedkernels' compiled extension (fedkernels._C) was not found. Install the package first: "
        "pip install torch==2.13.0 (or any torch >= 2.4), then pip install . in the repository root"
    )


_C = _load_extension()
# A bad FEDKERNELS_CPU_ISA is reported at import (ValueError naming the variable and the variants
# this CPU runs), not at the first kernel call.
_C.cpu_isa()
# Without it, the elementwise kernels' variant is the fastest one here (measured once, then cached).
_calibrate.calibrate(_C)

__all__ = ["backend_info", "set_num_threads", "get_num_threads", "emulate_cuda"]

DTYPE_CODES = {
    torch.float32: 0,
    torch.float64: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
}

# Penalty kinds for the separable prox kernels (csrc/math/prox.h, enum ProxKind).
KIND_CODES = {
    "zero": 0,
    "l1": 1,
    "elastic_net": 2,
    "mcp": 3,
    "scad": 4,
    "box": 5,
    "nonneg": 6,
}

# Backends understood by _C (csrc/bindings.cpp, enum Backend).
CPU, CUDA, CUDA_EMULATED = 0, 1, 2

# Emulation is a process-wide test switch (a plain global keeps backend_for at ~0.2 us: it runs on
# every kernel call).
_emulate = False
_CPU_LAUNCH = (CPU, -1, 0)
_EMULATED_LAUNCH = (CUDA_EMULATED, -1, 0)


@contextlib.contextmanager
def emulate_cuda(max_grid_x: int = 3, max_grid_y: int = 2, block: int = 32):
    """Route CPU tensors through the CUDA thread bodies, executed on the host.

    Inside this context every kernel call on CPU tensors runs the *device* code path
    (``csrc/cuda/launch_body.h``): each (block, thread) of a deliberately small grid runs serially,
    so grid-stride loops take several trips. It is slow and exists for tests, so that device code is
    exercised on machines without a GPU. The switch is process-wide (not per thread).
    """
    global _emulate
    _C.set_emulation_config(int(max_grid_x), int(max_grid_y), int(block))
    previous = _emulate
    _emulate = True
    try:
        yield
    finally:
        _emulate = previous


def backend_for(t: torch.Tensor) -> tuple[int, int, int]:
    """(backend code, device index, stream handle) for a tensor."""
    if t.is_cpu:
        return _EMULATED_LAUNCH if _emulate else _CPU_LAUNCH
    dev = t.device
    if dev.type == "cuda":
        if not _C.cuda_compiled():
            raise RuntimeError(
                "fedkernels was built without CUDA support, but got a CUDA tensor. Reinstall "
                "with a CUDA compiler on PATH (or CUDACXX set), e.g. FEDKERNELS_REQUIRE_CUDA=1 "
                "pip install ."
            )
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return CUDA, index, torch.cuda.current_stream(index).cuda_stream
    raise ValueError(f"fedkernels supports CPU and CUDA tensors, got a tensor on {dev}")


# At most this many threads (also the command line's --threads bound): OpenMP would try to start
# every thread asked for at the next kernel call, and a failed thread creation ends the process.
MAX_THREADS = 1024


def max_num_threads() -> int:
    """The largest ``set_num_threads`` accepts: 1024, or OpenMP's thread limit (OMP_THREAD_LIMIT) if lower."""
    return min(MAX_THREADS, _C.thread_limit())


def set_num_threads(num_threads: int) -> None:
    """Number of OpenMP threads the CPU kernels use: 1 <= num_threads <= ``max_num_threads()``, or 0
    for OpenMP's default."""
    n = num_threads
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"num_threads must be an int, got {type(n).__name__}")
    cap = max_num_threads()
    if not (n == 0 or 1 <= n <= cap):
        raise ValueError(f"num_threads must be 0 (OpenMP's default) or between 1 and {cap} (at most {MAX_THREADS}, "
                         f"and at most OMP_THREAD_LIMIT), got {n}")
    _C.set_num_threads(n)


def get_num_threads() -> int:
    return _C.get_num_threads()


def _driver_cuda_version() -> tuple[int, int] | None:
    """The newest CUDA version the NVIDIA driver supports, from NVML (as ``nvidia-smi`` shows it),
    or None if NVML is missing. NVML does not initialize CUDA, so this is safe before fork()."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        if nvml.nvmlInit_v2() != 0:
            return None
        try:
            v = ctypes.c_int(0)
            if nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(v)) != 0 or v.value <= 0:
                return None
            return v.value // 1000, (v.value % 1000) // 10
        finally:
            nvml.nvmlShutdown()
    except AttributeError:
        return None


def _driver_too_old(runtime: str, driver: tuple[int, int] | None) -> str:
    """Plain words for a driver older than the CUDA toolkit fedkernels was built with."""
    major = runtime.split(".")[0]
    minimum = {"13": " (driver 580 or newer)", "12": " (driver 525 or newer)"}.get(major, "")
    have = f"supports CUDA up to {driver[0]}.{driver[1]}" if driver else "is older than that"
    torch_cuda = torch.version.cuda
    fix = (f"or reinstall fedkernels with a CUDA {torch_cuda.split('.')[0]} toolkit, the one torch "
           f"uses: CUDACXX=/path/to/cuda-{torch_cuda}/bin/nvcc pip install ." if torch_cuda else
           "or reinstall fedkernels with an older CUDA toolkit (CUDACXX=/path/to/nvcc pip install .)")
    return (f"fedkernels' CUDA kernels were built with the CUDA {runtime} toolkit and need an NVIDIA "
            f"driver that supports CUDA {major}{minimum}, but this machine's driver {have}; torch can "
            f"still use the GPU because it brings its own CUDA. Update the NVIDIA driver, {fix}")


def _cuda_status(runtime: str) -> tuple[int, str | None]:
    """(number of CUDA devices, why fedkernels cannot use them or None) for a CUDA build.

    Never initializes the CUDA driver on its own: a process that did cannot use CUDA in forked
    children (e.g. DataLoader workers or a fork-based process pool). torch.cuda.device_count()
    asks NVML; fedkernels' runtime is asked only once torch has initialized CUDA anyway.
    """
    if torch.cuda.is_initialized():
        count, error = _C.cuda_device_count()
        if count > 0:
            return count, None
        if "insufficient" in (error or "").lower():  # cudaErrorInsufficientDriver
            return 0, _driver_too_old(runtime, _driver_cuda_version())
        return 0, error or "no CUDA device found"
    if not torch.backends.cuda.is_built():
        return 0, f"torch {torch.__version__} is a CPU-only build, so there are no CUDA tensors"
    count = torch.cuda.device_count()
    if count == 0:
        return 0, "no CUDA device found"
    driver = _driver_cuda_version()
    if driver is not None and driver[0] < int(runtime.split(".")[0]):
        return count, _driver_too_old(runtime, driver)
    return count, None


def backend_info() -> dict:
    """What this build of fedkernels can do on this machine.

    Keys: ``cpu_threads``, ``simd`` (instruction sets the CPU kernels were compiled for),
    ``cpu_isa`` (the CPU variant of the elementwise kernels with a prox formula), ``cpu_isa_plain``
    (that of the plain updates and row reductions; calibrated apart), ``cpu_isa_source`` (``"calibrated"``: measured
    the fastest here at import; ``"calibration cache"``: that measurement, cached per CPU model and
    build in ``cpu_isa_cache``; ``"detected"``: the best one this CPU runs, where it runs only one;
    ``"FEDKERNELS_CPU_ISA"``: that environment variable, read once per process, chose it;
    ``"set_cpu_isa"``: a test forced it), ``cpu_isa_gather`` (the gathered linear kernels' variant:
    the best one the CPU runs, or the forced one; never calibrated), ``first_layer`` (the batched
    executor's first-layer path, ``fedkernels.first_layer``: ``override``, FEDKERNELS_FIRST_LAYER's
    request (a path, ``"auto"`` or ``"auto_bf16"``) or None; ``choices``, this process's calibrated
    or cached choices per shape with the seconds measured per path; ``identical``, the paths "auto"
    chooses among), ``cpu_isa_variants`` (the variants this CPU runs), ``cpu_isa_cache`` (the calibration cache file),
    ``cuda_compiled``, ``cuda_archs`` (list of SM versions), ``cuda_runtime`` (the CUDA toolkit
    the kernels were built with; its runtime is linked statically), ``cuda_available`` (fedkernels
    can run on a GPU here), ``cuda_device_count``, ``cuda_error`` (why not, in plain words, if
    not), ``torch_version``, ``extension`` (path of the loaded module).

    Safe to call before fork(): it does not initialize CUDA unless torch already has.
    """
    compiled = bool(_C.cuda_compiled())
    runtime = _C.cuda_runtime_version() or None
    if compiled:
        count, error = _cuda_status(runtime)
    elif _C.cpu_only_by_request():
        count, error = 0, ("fedkernels was built without CUDA support: the build was CPU-only by request "
                           "(FEDKERNELS_CPU_ONLY=1 at install time)")
    else:
        count, error = 0, "fedkernels was built without CUDA support (no CUDA compiler at install time)"
    archs = [a for a in _C.cuda_archs().split(",") if a] if compiled else []
    from . import first_layer  # imports this module

    try:
        override = first_layer.env_path()
    except ValueError as e:
        override = f"invalid: {e}"
    return {
        "cpu_threads": _C.get_num_threads(),
        "simd": _C.simd(),
        "cpu_isa": _C.cpu_isa(),
        "cpu_isa_source": _C.cpu_isa_source(),
        "cpu_isa_plain": _C.cpu_plain_isa(),
        "cpu_isa_gather": _C.cpu_gather_isa(),
        "cpu_isa_cache": os.path.join(_calibrate.cache_dir(), _calibrate.CACHE_FILE),
        "cpu_isa_variants": _C.cpu_isa_variants().split(","),
        "first_layer": {"override": override, "choices": first_layer.choices_made(),
                        "identical": list(first_layer.IDENTICAL)},
        "cuda_compiled": compiled,
        "cuda_archs": archs,
        "cuda_runtime": runtime,
        "cuda_available": count > 0 and error is None,
        "cuda_device_count": count,
        "cuda_error": error,
        "torch_version": torch.__version__,
        "extension": os.path.abspath(_C.__file__),
    }
