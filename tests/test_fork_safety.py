"""The writability probe (``_C.is_writable``, asked before every in-place write to a CPU tensor)
and ``backend_info()`` must be safe to use around fork() and from many threads.

The probe used to read() each probed byte's own value back into it from a thread_local pipe. The
pipe outlived fork(): forked workers read each other's bytes into their tensors. Each exiting
thread leaked its two descriptors, and a byte written by another thread between the probe's
read and write-back was reverted."""

import os
import sys
import threading
import time

import pytest
import torch

import fedkernels as fk
from fedkernels._backend import _C

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_forked_processes_probing_concurrently_keep_their_own_bytes():
    fk.raw.prox_(torch.ones(4), "l1", 0.1, 1.0)  # the parent probes before forking
    calls = 100_000
    children = []
    for value in (1, 2, 3):
        pid = os.fork()
        if pid == 0:  # child: probe its own buffer over and over; any foreign byte is corruption
            code = 0
            try:
                buf = torch.full((64,), value, dtype=torch.uint8)
                ptr = buf.data_ptr()
                for _ in range(calls):
                    _C.is_writable(ptr, 64)
                    if buf[0] != value or buf[63] != value:
                        code = 1
                        break
            finally:
                os._exit(code)
        children.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    assert codes == [0, 0, 0], "a forked child read another process's byte into its tensor"


def test_short_lived_threads_leak_no_descriptors():
    x = torch.zeros(16)
    before = _open_fds()

    def probe():
        fk.raw.prox_(x, "l1", 0.1, 1.0)

    for _ in range(50):  # 2,000 threads, at most 40 alive at a time
        threads = [threading.Thread(target=probe) for _ in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert _open_fds() - before < 8


def test_probe_does_not_revert_a_concurrent_write():
    # torch's add_ releases the GIL, so the probe (holding it) runs alongside the writer's add. The
    # writer needs the GIL back after every add_, and the probing loop hands it over only when the
    # interpreter's switch interval (5 ms) has passed: 20,000 adds took 157 s on a 2-core machine.
    # A 20 us interval lets the two alternate quickly, and the writer stops after n adds or (once it
    # made 100) after 2 s, whichever comes first, counting what it did: the check stays exact and
    # the test takes a few seconds at most on any machine.
    counter = torch.zeros(1, dtype=torch.int32)
    n, seconds = 20_000, 2.0
    done = threading.Event()
    written = []

    def writer():
        deadline = time.monotonic() + seconds
        i = 0
        while i < n and (i < 100 or time.monotonic() < deadline):
            counter.add_(1)
            i += 1
        written.append(i)
        done.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(2e-5)
    try:
        t = threading.Thread(target=writer)
        t.start()
        ptr = counter.data_ptr()
        probes = 0
        while not done.is_set():
            _C.is_writable(ptr, 4)
            probes += 1
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert probes > 0 and written[0] >= 100
    assert int(counter) == written[0]


def test_probe_answers():
    import mmap

    import numpy as np

    assert _C.is_writable(torch.zeros(8).data_ptr(), 32)
    ro = mmap.mmap(-1, 4096, prot=mmap.PROT_READ)
    rw = mmap.mmap(-1, 4096)
    assert not _C.is_writable(np.frombuffer(ro, dtype=np.uint8).ctypes.data, 1)
    assert _C.is_writable(np.frombuffer(rw, dtype=np.uint8).ctypes.data, 4096)
    assert not _C.is_writable(4096 * 3, 1)  # unmapped (the first pages are never mapped)


def test_backend_info_does_not_initialize_cuda(monkeypatch):
    """backend_info() before fork(): fedkernels' own CUDA runtime (which initializes the driver,
    after which forked children cannot use CUDA) is asked only once torch initialized CUDA."""
    calls = []

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
            calls.append(1)
            return 1, ""

    import fedkernels._backend as backend

    monkeypatch.setattr(backend, "_C", FakeC())
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # NVML-based in torch: fork-safe
    monkeypatch.setattr(backend, "_driver_cuda_version", lambda: (13, 0), raising=False)
    info = fk.backend_info()
    assert calls == []
    assert info["cuda_device_count"] == 2 and info["cuda_available"] and info["cuda_error"] is None
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # now asking is harmless
    info = fk.backend_info()
    assert calls == [1] and info["cuda_available"]
