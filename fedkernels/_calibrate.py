"""The CPU variant of the elementwise kernels, chosen by measurement on first use (issue 40).

Every elementwise kernel family (the separable proxes, the fused updates, the row reductions of
l2_ball_ and group_lasso_) gives the same bits in every compiled variant (baseline, AVX2,
AVX-512; tests/test_isa_variants.py), so which one runs is a question of speed only, and the
answer differs by CPU: an AVX-512 variant is not the fastest on every AVX-512 CPU. At import, unless
``FEDKERNELS_CPU_ISA`` names a variant, each variant this CPU runs is timed on a few kernels over
L2-resident buffers (compute-bound: where the variants differ; in DRAM they tie) and the fastest is
used, chosen apart for the two kinds of family: those with a prox formula (timed on four proxes) and
the plain updates and row reductions (timed on ``cv_step``); the best variant the CPU supports is
kept unless another is faster by more than ``MARGIN``
(a loaded machine's noise does not flip the choice). The result is cached per CPU model, library
version and build in ``$XDG_CACHE_HOME/fedkernels`` (``~/.cache/fedkernels``), so the measurement
(a few tens of milliseconds) runs once per machine and build. The gathered linear kernels keep the
best variant the CPU supports: their AVX variants contract to FMA, other bits than the baseline;
the batched executor's first-layer path is calibrated apart (fedkernels/first_layer.py), in the
same cache entry.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time

import torch

CACHE_FILE = "cpu_isa.json"
MARGIN = 0.05
# 16 K float32 values (64 KiB per buffer): below the parallel threshold (one thread) and in L2.
_NUMEL = 1 << 14
_CALLS, _ROUNDS = 8, 5
# (kind code, step, p1, p2): L1, MCP firm, SCAD's small- and large-step formulas (csrc/math/prox.h)
_PROX_CASES = ((1, 0.5, 1.0, 0.0), (3, 0.5, 1.0, 3.0), (4, 0.5, 1.0, 3.7), (4, 4.0, 1.0, 3.7))


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fedkernels")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform module knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cache_key(C) -> str:
    """CPU model, library version and this build of the extension (its size and mtime)."""
    from importlib import metadata

    try:
        version = metadata.version("fedkernels")
    except metadata.PackageNotFoundError:
        version = "unknown"
    st = os.stat(C.__file__)
    return f"{cpu_model()} | fedkernels {version} | {st.st_size}:{st.st_mtime_ns} | {C.cpu_isa_variants()}"


def read_cache(path: str, key: str, variants: list[str]) -> tuple[str, str] | None:
    """The cached (prox, plain) variants for `key`, or None if the file is missing, unreadable or
    corrupt."""
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)[key]
        chosen = entry["isa"], entry["plain"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return chosen if all(isinstance(v, str) and v in variants for v in chosen) else None


def write_cache(path: str, key: str, chosen: tuple[str, str], seconds: dict) -> None:
    """Records the elementwise choice under `key` (see update_cache)."""
    update_cache(path, key, {"isa": chosen[0], "plain": chosen[1], "seconds": seconds})


def read_entry(path: str, key: str) -> dict:
    """The cache file's entry for `key`, or {} if the file or the entry is missing, unreadable or
    not a JSON object."""
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)[key]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return entry if isinstance(entry, dict) else {}


def update_cache(path: str, key: str, fields: dict) -> None:
    """Sets `fields` in `key`'s entry of the cache file, atomically, keeping the entry's other fields
    (the elementwise choice and the first-layer paths share an entry); a corrupt file is replaced,
    and a read-only cache folder is not an error: the next process measures again."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    # one entry per CPU model (a home folder shared by machines): an older build's entry goes
    entry = data.get(key) if isinstance(data.get(key), dict) else {}
    data = {k: v for k, v in data.items() if k.split(" | ")[0] != key.split(" | ")[0]}
    data[key] = {**entry, **fields}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".cpu_isa.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass


def measure(C, variants: list[str]) -> dict[str, dict[str, float]]:
    """Seconds per variant for one call of the prox kernels together and of cv_step (``{variant:
    {"prox": s, "plain": s}}``; the fastest of `_ROUNDS` rounds each, variants interleaved within each
    round so that load changes hit all alike)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(_NUMEL, generator=gen) * 3
    out, g, c = torch.empty_like(x), torch.randn(_NUMEL, generator=gen), torch.randn(_NUMEL, generator=gen)
    n, xp, op = _NUMEL, x.data_ptr(), out.data_ptr()
    calls = [(C.prox, (0, 0, -1, 0, 1, n, xp, n, op, n, *case)) for case in _PROX_CASES]
    # cv_step in place on a copy: out <- out - beta * (g - c); three reads, one write
    calls.append((C.cv_step, (0, 0, -1, 0, 1, n, op, n, g.data_ptr(), n, c.data_ptr(), n, 1e-3)))
    best = {v: [float("inf")] * len(calls) for v in variants}
    try:
        for _ in range(_ROUNDS):
            for v in variants:
                C.set_cpu_isa(v)
                for i, (fn, args) in enumerate(calls):
                    fn(*args)  # warm
                    t0 = time.perf_counter()
                    for _ in range(_CALLS):
                        fn(*args)
                    best[v][i] = min(best[v][i], (time.perf_counter() - t0) / _CALLS)
    finally:
        C.set_cpu_isa("auto")
    return {v: {"prox": sum(times[:-1]), "plain": times[-1]} for v, times in best.items()}


def choose(seconds: dict[str, float], variants: list[str]) -> str:
    """The fastest variant, unless the best one the CPU supports (last) is within MARGIN of it."""
    fastest = min(variants, key=lambda v: seconds[v])
    return variants[-1] if seconds[variants[-1]] <= seconds[fastest] * (1 + MARGIN) else fastest


def calibrate(C) -> None:
    """Sets the elementwise kernels' variant from the cache or a measurement; does nothing when
    FEDKERNELS_CPU_ISA names a variant or the CPU runs only one."""
    variants = C.cpu_isa_variants().split(",")
    if C.cpu_isa_source() != "detected" or len(variants) < 2:
        return
    key, path = cache_key(C), os.path.join(cache_dir(), CACHE_FILE)
    cached = read_cache(path, key, variants)
    if cached is not None:
        C.choose_elementwise_isa(*cached, "calibration cache")
        return
    seconds = measure(C, variants)
    chosen = tuple(choose({v: s[kind] for v, s in seconds.items()}, variants) for kind in ("prox", "plain"))
    C.choose_elementwise_isa(*chosen, "calibrated")
    write_cache(path, key, chosen, seconds)
