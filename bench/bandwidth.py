"""Timing helpers, the in-place memory-bandwidth probe and the machine description.

    python -m bench.bandwidth                 # probe this machine (256 MiB buffer, 2 threads)
    python -m bench.bandwidth --mib 64 256 1024 --threads 1 2

Bandwidth is counted as bytes read + bytes written: an in-place elementwise op on a float32
buffer of n elements moves 8 n bytes. The probe is ``x.mul_(1.0)`` (torch's vectorized in-place
kernel, the same access pattern as an in-place prox). Buffers much larger than the last-level
cache measure DRAM bandwidth; smaller ones measure cache bandwidth, so the prox table also probes
each model's own buffer size side by side with the kernels.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import statistics
import time
from typing import Callable, Dict, Optional, Sequence

import torch

__all__ = [
    "Timing",
    "sync_for",
    "measure",
    "measure_interleaved",
    "inplace_bandwidth",
    "gbps",
    "machine_info",
    "machine_line",
    "cpu_busy",
    "cache_sizes",
    "set_threads",
]

MiB = 1 << 20


# --------------------------------------------------------------------------- #
# Timing
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class Timing:
    """Per-call seconds over ``len(samples)`` samples of ``number`` calls each."""

    samples: list  # seconds per call, one entry per sample
    number: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def iqr(self) -> float:
        if len(self.samples) < 4:
            return max(self.samples) - min(self.samples)
        q = statistics.quantiles(self.samples, n=4)
        return q[2] - q[0]

    def as_dict(self) -> dict:
        return {
            "median_s": self.median,
            "min_s": self.min,
            "mean_s": self.mean,
            "iqr_s": self.iqr,
            "rounds": len(self.samples),
            "calls_per_round": self.number,
        }


def sync_for(device) -> Callable[[], None]:
    """A function that waits for queued work on ``device`` (a no-op on CPU)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


def _calls_for(fn: Callable[[], object], sync: Callable[[], None], min_sample_s: float) -> int:
    """How many back-to-back calls make one sample last at least ``min_sample_s``."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = time.perf_counter() - t0
    if one <= 0:
        return 1000
    return max(1, min(100_000, math.ceil(min_sample_s / one)))


def measure(fn: Callable[[], object], *, rounds: int = 5, warmup: int = 1, min_sample_s: float = 0.0,
            sync: Callable[[], None] = lambda: None) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``rounds`` samples. Each sample repeats the
    call enough times to last ``min_sample_s`` (use ~1e-3 for microsecond-scale calls)."""
    for _ in range(warmup):
        fn()
    number = _calls_for(fn, sync, min_sample_s) if min_sample_s > 0 else 1
    samples = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / number)
    return Timing(samples, number)


def measure_interleaved(fns: Dict[str, Callable[[], object]], *, rounds: int = 15, warmup: int = 1,
                        min_sample_s: float = 0.0, sync: Callable[[], None] = lambda: None) -> Dict[str, Timing]:
    """Time several functions side by side: each round runs one sample of every function in turn,
    so background load and clock changes hit all of them alike."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    number = {n: (_calls_for(fns[n], sync, min_sample_s) if min_sample_s > 0 else 1) for n in names}
    samples: Dict[str, list] = {n: [] for n in names}
    for _ in range(rounds):
        for n in names:
            fn, k = fns[n], number[n]
            sync()
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            sync()
            samples[n].append((time.perf_counter() - t0) / k)
    return {n: Timing(samples[n], number[n]) for n in names}


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


def set_threads(n: int) -> int:
    """Use ``n`` threads in torch and in fedkernels (0 = every core); returns the count used."""
    n = int(n) if n and n > 0 else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                    else os.cpu_count() or 1)
    torch.set_num_threads(n)
    try:
        import fedkernels as fk

        fk.set_num_threads(n)
    except ImportError:  # the probe works without the extension
        pass
    return n


# --------------------------------------------------------------------------- #
# Bandwidth probe
# --------------------------------------------------------------------------- #


def inplace_bandwidth(nbytes: int = 256 * MiB, *, rounds: int = 10, device="cpu", dtype=torch.float32,
                      buffer: Optional[torch.Tensor] = None) -> dict:
    """In-place memory bandwidth: ``x.mul_(1.0)`` on a buffer of ``nbytes``, counted as read + write.

    Pass ``buffer`` to probe an existing tensor (its contents are multiplied by 1, i.e. unchanged).
    Returns a dict with ``gbps`` (median), ``gbps_best`` (fastest round), ``bytes``, ``seconds``.
    """
    if buffer is None:
        n = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
        buffer = torch.ones(n, dtype=dtype, device=device)
    moved = 2 * buffer.numel() * buffer.element_size()
    t = measure(lambda: buffer.mul_(1.0), rounds=rounds, warmup=2, sync=sync_for(buffer.device),
                min_sample_s=2e-3)
    return {
        "op": "x.mul_(1.0)",
        "device": str(buffer.device),
        "dtype": str(buffer.dtype).replace("torch.", ""),
        "buffer_bytes": buffer.numel() * buffer.element_size(),
        "bytes_moved": moved,
        "seconds": t.median,
        "gbps": gbps(moved, t.median),
        "gbps_best": gbps(moved, t.min),
        "threads": torch.get_num_threads(),
    }


# --------------------------------------------------------------------------- #
# Machine description
# --------------------------------------------------------------------------- #


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cpu_model() -> str:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# (vendor, family, lowest model, highest model) -> core generation, for CPUs whose model name does not
# say it (a VM's "AMD EPYC"): the tables of different days are then comparable by microarchitecture.
_MICROARCHITECTURES = [
    ("AuthenticAMD", 0x17, 0x00, 0x2F, "Zen / Zen+"), ("AuthenticAMD", 0x17, 0x30, 0xFF, "Zen 2"),
    ("AuthenticAMD", 0x19, 0x00, 0x0F, "Zen 3"), ("AuthenticAMD", 0x19, 0x10, 0x1F, "Zen 4"),
    ("AuthenticAMD", 0x19, 0x20, 0x5F, "Zen 3"), ("AuthenticAMD", 0x19, 0x60, 0xAF, "Zen 4"),
    ("AuthenticAMD", 0x1A, 0x00, 0xFF, "Zen 5"),
    ("GenuineIntel", 6, 0x55, 0x55, "Skylake-SP / Cascade Lake"), ("GenuineIntel", 6, 0x6A, 0x6C, "Ice Lake-SP"),
    ("GenuineIntel", 6, 0x8F, 0x8F, "Sapphire Rapids"), ("GenuineIntel", 6, 0xCF, 0xCF, "Emerald Rapids"),
    ("GenuineIntel", 6, 0xAD, 0xAE, "Granite Rapids"),
]


def cpu_microarchitecture() -> str:
    """The core generation from /proc/cpuinfo's vendor, family and model ("Zen 5"), else "family F model M"
    ("" where /proc/cpuinfo is unavailable)."""
    fields = {}
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        if not key.strip():
            break  # the first CPU's block only
        fields.setdefault(key.strip(), value.strip())
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return ""
    vendor = fields.get("vendor_id", "")
    for v, f, lo, hi, name in _MICROARCHITECTURES:
        if v == vendor and f == family and lo <= model <= hi:
            return name
    return f"family {family} model {model}"


def _cpu_flags() -> list:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "amx_tile") if f in flags]
    return []


def _cache_sizes() -> dict:
    out = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    if not os.path.isdir(base):
        return out
    for idx in sorted(os.listdir(base)):
        level = _read(os.path.join(base, idx, "level"))
        size = _read(os.path.join(base, idx, "size"))
        typ = _read(os.path.join(base, idx, "type"))
        if level and size and typ and typ.strip() != "Instruction":
            out[f"L{level.strip()}"] = size.strip()
    return out


def cache_sizes() -> dict:
    """Data cache sizes by level as sysfs writes them, e.g. {"L1": "32K", "L2": "1024K", "L3": "32768K"}."""
    return _cache_sizes()


def _mem_total_gib() -> Optional[float]:
    text = _read("/proc/meminfo") or ""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / (1 << 20), 1)
    return None


def _cpu_times():
    text = _read("/proc/stat") or ""
    for line in text.splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
            return sum(v[:8]), idle
    return None


def cpu_busy(seconds: float = 1.0) -> Optional[float]:
    """Fraction of all CPUs' time spent busy over the next ``seconds`` while this process sleeps:
    the load other jobs put on the machine (None where /proc/stat is unavailable)."""
    a = _cpu_times()
    if a is None:
        return None
    time.sleep(seconds)
    b = _cpu_times()
    total = b[0] - a[0]
    return None if total <= 0 else round(1.0 - (b[1] - a[1]) / total, 3)


def machine_info() -> dict:
    """CPU model, cores, caches, memory, load, torch and fedkernels build: everything a table
    needs to be compared with another machine's."""
    info = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_model": _cpu_model(),
        "microarchitecture": cpu_microarchitecture(),
        "cpu_flags": _cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "caches": _cache_sizes(),
        "mem_total_gib": _mem_total_gib(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "cpu_busy_before": cpu_busy(1.0),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import fedkernels as fk

        info["fedkernels"] = fk.backend_info()
    except Exception as e:  # noqa: BLE001 - describe the machine even without the extension
        info["fedkernels"] = {"error": repr(e)}
    return info


def machine_line(info: dict) -> str:
    """One line for a table caption."""
    caches = ", ".join(f"{k} {v}" for k, v in info.get("caches", {}).items())
    fkinfo = info.get("fedkernels", {})
    arch = info.get("microarchitecture")
    parts = [
        info["cpu_model"] + (f" ({arch})" if arch and arch not in info["cpu_model"] else ""),
        f"{info['usable_cpus']} usable CPUs" + (f" ({caches})" if caches else ""),
        f"{info['mem_total_gib']} GiB RAM" if info.get("mem_total_gib") else None,
        f"torch {info['torch']} ({info['torch_threads']} threads)",
        f"fedkernels SIMD: {fkinfo.get('simd', '?')}",
        f"GPU: {info['cuda_device']}" if info.get("cuda_device") else None,
    ]
    return "; ".join(p for p in parts if p)


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=float, nargs="+", default=[256.0], help="buffer sizes in MiB (default 256)")
    ap.add_argument("--threads", type=int, nargs="+", default=[2], help="thread counts (0 = all cores)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args(argv)
    info = machine_info()
    print(machine_line(info))
    print(f"{'threads':>7} {'MiB':>8} {'GB/s (median)':>14} {'GB/s (best)':>12}")
    for th in args.threads:
        used = set_threads(th)
        for mib in args.mib:
            r = inplace_bandwidth(int(mib * MiB), rounds=args.rounds, device=args.device)
            print(f"{used:>7} {mib:>8g} {r['gbps']:>14.2f} {r['gbps_best']:>12.2f}")


if __name__ == "__main__":
    main()
