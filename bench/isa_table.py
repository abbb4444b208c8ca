"""Every CPU kernel x every compiled variant x 1 and 2 threads, against the in-place probe.

    python -m bench.isa_table                      # float32, ResNet-18-sized buffers (11.7 M values)
    python -m bench.isa_table --dtype float64 --rounds 30 --threads 1 2
    python -m bench.isa_table --json bench/results/isa_table.json

For each op and thread count, the probe (torch's in-place ``x.mul_(1.0)`` over the op's first
buffer: one read and one write per value, a prox's traffic) and the op in every variant this CPU
runs (``fedkernels._C.set_cpu_isa``) are called in turn, call by call, ``--rounds`` times; before
every call each buffer is refilled with the same random values (untimed), so every call reads the
same data; then (unless ``--warm``) a scratch buffer twice the last-level cache is written, so that
every call, probe and op alike, starts with its buffers in DRAM. (Without it the probe would find
two thirds of its one 47 MB buffer still in a 32 MB L3 after the refill, and an op with 3 or 4
buffers far less of its data: the probe would be favoured.) A cell is the op's bandwidth (bytes it reads and writes
over its median time) as a percentage of the probe's (8 bytes per float32 value over its median
time): 100 % = as fast as torch streams the same memory. The variant the dispatcher picks in this
process (``backend_info()["cpu_isa"]``, ``FEDKERNELS_CPU_ISA`` overrides it) is marked with ``*``.

One core does not stream 3 or 4 buffers at the bandwidth it streams one: torch's own
``x.addcmul_(g, c)`` (3 reads, 1 write) runs below 100 % of the one-buffer probe. So where one torch
call has an op's traffic (the same buffers read and written in place), it is timed alongside as the
``torch`` column: a fair bound for that op. The ops writing two outputs have no such twin.

The machine is named above the table (CPU model, ISA flags, caches) with its load before and after:
on a machine shared with other jobs, the figures are a floor, and the 2-thread ones the noisiest
(a static OpenMP split waits for the slower thread).

A last table times each MCP and SCAD formula against L1 in cache (256 KiB of ``--dtype`` values in and out,
1 thread, fastest of ``--rounds`` batches of 10 calls): the formulas' own cost, which the
DRAM-bound table hides where memory is the limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

import fedkernels as fk
from fedkernels._backend import _C

from .bandwidth import cache_sizes, cpu_busy, machine_info, machine_line, set_threads

RESNET18_NUMEL = 11_689_512
SCAD = (0.1, 1e-3, 3.7)  # step, lam, a (bench.reference.DEFAULT_PARAMS)
PROX_PARAMS = {"l1": (0.1, 1e-3, 0.0), "mcp": (0.1, 1e-3, 3.0), "scad": SCAD}
FAST_ENOUGH = 90.0  # % of the probe every dispatched op should reach
STATS = {"median": statistics.median, "min": min}
STAT_WORDS = {"median": "median", "min": "fastest"}
TWIN = "torch"  # the column of the same-traffic torch op


@dataclasses.dataclass
class Op:
    """One kernel call on named buffers; ``moved`` = values read + values written per element;
    ``twin``: one torch call with the same traffic (which buffers are read, which written in
    place), where one exists."""

    name: str
    buffers: Sequence[str]
    moved: int
    call: Callable[[Dict[str, torch.Tensor]], object]
    twin: Optional[Callable[[Dict[str, torch.Tensor]], object]] = None


# Same traffic as the ops reading x and one or two more buffers and writing x in place.
def _twin_2r1w(b):
    return b["x"].add_(b["g"], alpha=-1e-3)


def _twin_3r1w(b):
    return b["x"].addcmul_(b["g"], b["c"], value=-1e-3)


def _prox(kind: str) -> Op:
    step, p1, p2 = PROX_PARAMS[kind]
    return Op(f"prox {kind.upper()}", ["x"], 2, lambda b: fk.raw.prox_(b["x"], kind, step, p1, p2))


def ops() -> List[Op]:
    """The elementwise kernels (csrc/ops.h's op table), each as the FL algorithms call it."""
    s, p1, p2 = SCAD
    return [
        _prox("l1"), _prox("mcp"), _prox("scad"),
        Op("prox_grad_step SCAD", ["x", "g"], 3,
           lambda b: fk.raw.prox_grad_step_(b["x"], b["g"], 1e-3, "scad", s, p1, p2), _twin_2r1w),
        Op("normal_map_step SCAD", ["z", "x", "g", "c"], 6,
           lambda b: fk.raw.normal_map_step_(b["z"], b["x"], b["g"], b["c"], 1e-3, 0.1, "scad", s, p1, p2)),
        Op("za1_step SCAD", ["zhat", "z", "g", "c"], 5,
           lambda b: fk.raw.za1_step_(b["zhat"], b["z"], b["g"], b["c"], 1e-3, "scad", s, p1, p2)),
        Op("depositum_step SCAD", ["x", "m", "y"], 5,
           lambda b: fk.raw.depositum_step_(b["x"], b["m"], b["y"], 1e-3, 0.9, "scad", s, p1, p2)),
        Op("cv_step", ["x", "g", "c"], 4, lambda b: fk.raw.cv_step_(b["x"], b["g"], b["c"], 1e-3), _twin_3r1w),
        Op("control_update", ["x", "g", "c"], 4, lambda b: fk.raw.control_update_(b["x"], b["g"], b["c"]),
           _twin_3r1w),
        Op("normalized_delta_", ["x", "g"], 3, lambda b: fk.raw.normalized_delta_(b["x"], b["g"], 0.1, 5),
           _twin_2r1w),
        Op("box_tensor_", ["x", "g", "c"], 4, lambda b: fk.raw.box_tensor_(b["x"], b["g"], b["c"]), _twin_3r1w),
    ]


def _sources(op: Op, numel: int, dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = {name: (torch.randn(numel, generator=gen, dtype=torch.float64) * 1e-3).to(dtype) for name in op.buffers}
    if op.name.startswith("box"):  # a box [g, c] = [-1e-3, 1e-3] that clips some values on either side
        out["g"].fill_(-1e-3)
        out["c"].fill_(1e-3)
    return out


def _llc_bytes() -> int:
    """The last-level cache's size (sysfs), 32 MiB where it cannot be read."""
    sizes = cache_sizes()
    last = sizes.get("L3") or sizes.get("L2") or "32768K"
    return int(last.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(last[-1], 1)


def evictor(enabled: bool) -> Callable[[], None]:
    """A function that pushes every buffer out of the caches (writes 2x the LLC), or does nothing."""
    if not enabled:
        return lambda: None
    scratch = torch.empty(2 * _llc_bytes() // 4, dtype=torch.float32)
    return lambda: scratch.fill_(1.0)


def _timed(fill: Callable[[], None], fn: Callable[[], object]) -> float:
    fill()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _with_isa(isa: str, call: Callable[[], object]) -> Callable[[], object]:
    def run():
        _C.set_cpu_isa(isa)
        call()

    return run


def measure_op(op: Op, numel: int, dtype: torch.dtype, variants: Sequence[str], rounds: int,
               stat: Callable[[List[float]], float] = statistics.median, evict: Callable[[], None] = lambda: None
               ) -> Dict[str, float]:
    """``stat`` (median) of the seconds of the probe and of ``op`` in each variant, alternated call by call."""
    src = _sources(op, numel, dtype)
    live = {k: torch.empty_like(v) for k, v in src.items()}

    def fill():
        for k, v in src.items():
            live[k].copy_(v)
        evict()

    first = live[op.buffers[0]]
    fns = {"probe": lambda: first.mul_(1.0)}
    if op.twin is not None:
        fns[TWIN] = lambda: op.twin(live)
    fns.update({isa: _with_isa(isa, lambda: op.call(live)) for isa in variants})
    samples: Dict[str, List[float]] = {k: [] for k in fns}
    try:
        for fn in fns.values():  # warm-up: page faults, OpenMP's thread pool
            fill()
            fn()
        for _ in range(rounds):
            for k, fn in fns.items():
                samples[k].append(_timed(fill, fn))
    finally:
        _C.set_cpu_isa("auto")
    return {k: stat(v) for k, v in samples.items()}


def percent_of_probe(op: Op, times: Dict[str, float]) -> Dict[str, float]:
    """Each variant's bandwidth as a percentage of the probe's (2 values moved per element)."""
    return {k: 100.0 * (op.moved / 2) * times["probe"] / t for k, t in times.items() if k not in ("probe", TWIN)}


def twin_percent(op: Op, times: Dict[str, float]) -> Optional[float]:
    """The same-traffic torch op's bandwidth as a percentage of the probe's (None: no twin)."""
    return 100.0 * (op.moved / 2) * times["probe"] / times[TWIN] if TWIN in times else None


IN_CACHE_NUMEL = 1 << 16  # float32: 256 KiB in + 256 KiB out, in L2 on current x86 server cores


def in_cache_numel(dtype: torch.dtype) -> int:
    """Values per in-cache buffer: IN_CACHE_NUMEL float32 values' bytes (half as many float64 values)."""
    return IN_CACHE_NUMEL * 4 // torch.empty(0, dtype=dtype).element_size()
# (kind, step, lam, p2) of each MCP and SCAD formula (csrc/math/prox.h), step chosen for the regime; SCAD's
# small step at s = 2 has s / (a - 1 - s) * a > 1: the same map with two-term thresholds (kScadSmallEdge)
IN_CACHE_CASES = {"L1": ("l1", 0.5, 1.0, 0.0), "MCP firm": ("mcp", 0.5, 1.0, 3.0), "MCP hard": ("mcp", 4.0, 1.0, 3.0),
                  "SCAD small step": ("scad", 0.5, 1.0, 3.7), "SCAD small step, two-term": ("scad", 2.0, 1.0, 3.7),
                  "SCAD large step": ("scad", 4.0, 1.0, 3.7)}


def in_cache_times(variants: List[str], rounds: int, dtype: torch.dtype = torch.float32) -> Dict[str, Dict[str, float]]:
    """Seconds per call of each IN_CACHE_CASES prox, 1 thread, buffers in L2 (compute-bound: the
    formulas' own cost), fastest of `rounds` batches of 10 calls per variant."""
    from fedkernels._backend import DTYPE_CODES, KIND_CODES

    n = in_cache_numel(dtype)
    x = (torch.randn(n, generator=torch.Generator().manual_seed(0)) * 2).to(dtype)
    out = torch.empty_like(x)
    before, res = fk.get_num_threads(), {}
    fk.set_num_threads(1)
    try:
        for v in variants:
            _C.set_cpu_isa(v)
            res[v] = {}
            for name, (kind, step, p1, p2) in IN_CACHE_CASES.items():
                args = (0, DTYPE_CODES[dtype], -1, 0, 1, n, x.data_ptr(), n, out.data_ptr(), n, KIND_CODES[kind],
                        step, p1, p2)
                best = float("inf")
                for _ in range(max(rounds, 3)):
                    t0 = time.perf_counter()
                    for _ in range(10):
                        _C.prox(*args)
                    best = min(best, (time.perf_counter() - t0) / 10)
                res[v][name] = best
    finally:
        _C.set_cpu_isa("auto")
        fk.set_num_threads(before)
    return res


def run(args) -> dict:
    dtype = getattr(torch, args.dtype)
    variants = _C.cpu_isa_variants().split(",")
    if not args.baseline:
        variants = [v for v in variants if v != "baseline"] or variants
    picked = fk.backend_info()["cpu_isa"]
    info = machine_info()
    evict = evictor(not args.warm)
    rows = []
    for threads in args.threads:
        used = set_threads(threads)
        for op in ops():
            if args.ops and not any(s in op.name for s in args.ops):
                continue
            times = measure_op(op, args.numel, dtype, variants, args.rounds, STATS[args.stat], evict)
            rows.append({"op": op.name, "threads": used, "moved_per_elem": op.moved, "seconds": times,
                         "percent": percent_of_probe(op, times), "twin_percent": twin_percent(op, times)})
            twin = rows[-1]["twin_percent"]
            print(f"  {used} thr  {op.name:22s} " + "  ".join(f"{k} {v:5.0f}%" for k, v in rows[-1]["percent"].items())
                  + (f"  {TWIN} {twin:5.0f}%" if twin is not None else ""), flush=True)
    in_cache = in_cache_times(variants, args.rounds, dtype)
    return {"machine": info, "loadavg_after": list(os.getloadavg()), "cpu_busy_after": cpu_busy(1.0),
            "in_cache_seconds": in_cache,
            "dtype": args.dtype, "numel": args.numel, "rounds": args.rounds, "stat": args.stat, "warm": args.warm,
            "variants": variants, "picked": picked, "rows": rows}


def _load_line(res: dict) -> str:
    m = res["machine"]
    before = ", ".join(f"{v:.2f}" for v in m["loadavg"])
    after = ", ".join(f"{v:.2f}" for v in res["loadavg_after"])
    return (f"Load average (1, 5, 15 min) before: {before}; after: {after}. CPU busy with other jobs "
            f"in the second before / after: {m['cpu_busy_before']:.0%} / {res['cpu_busy_after']:.0%}.")


def _scad_over_l1(res: dict) -> List[str]:
    out = []
    for threads in sorted({r["threads"] for r in res["rows"]}):
        by_op = {r["op"]: r["seconds"] for r in res["rows"] if r["threads"] == threads}
        if "prox SCAD" in by_op and "prox L1" in by_op:
            ratios = ", ".join(f"{v} {by_op['prox SCAD'][v] / by_op['prox L1'][v]:.2f}" for v in res["variants"])
            out.append(f"SCAD/L1 time, {threads} thread(s): {ratios}")
    return out


def render_markdown(res: dict) -> str:
    variants, picked = res["variants"], res["picked"]
    threads = sorted({r["threads"] for r in res["rows"]})
    head = [f"{v}{'*' if v == picked else ''}, {t} thr" for t in threads for v in variants + [TWIN]]
    lines = [
        f"Machine: {machine_line(res['machine'])}; prox variant {res['picked']} "
        f"({res['machine']['fedkernels'].get('cpu_isa_source', '?')}); measured {res['machine']['date']}. CPU flags: "
        f"{', '.join(res['machine']['cpu_flags']) or 'none of note'}.",
        _load_line(res),
        f"{res['dtype']}, {res['numel']:,} values per buffer, {STAT_WORDS[res['stat']]} of {res['rounds']} calls "
        "alternated call by call, buffers refilled before every "
        f"call{' (caches left warm)' if res.get('warm') else ', then evicted from the caches'}. "
        f"Cells: % of the in-place probe's bandwidth (x.mul_(1.0)); "
        f"* = the variant the dispatcher picks here ({picked}); {TWIN}: one torch call with the op's traffic "
        "(x.add_(g) for 2 reads and 1 write in place, x.addcmul_(g, c) for 3 and 1; none for two outputs).",
        "",
        "| op (values moved per element) | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(head),
    ]
    for name in dict.fromkeys(r["op"] for r in res["rows"]):
        cells, moved = [], None
        for t in threads:
            row = next((r for r in res["rows"] if r["op"] == name and r["threads"] == t), None)
            moved = row["moved_per_elem"] if row else moved
            cells += [f"{row['percent'][v]:.0f} %" if row else "" for v in variants]
            cells.append(f"{row['twin_percent']:.0f} %" if row and row.get("twin_percent") is not None else "–")
        lines.append(f"| {name} ({moved}) | " + " | ".join(cells) + " |")
    lines.append("")
    lines += _scad_over_l1(res)
    lines.append(_verdict(res))
    cached = in_cache_numel(getattr(torch, res["dtype"]))
    lines += ["", f"In cache ({res['dtype']}, {cached:,} values in and out, 1 thread, compute-bound): "
              "time / L1's time; L1 in microseconds.", "",
              "| variant | L1 (us) | " + " | ".join(n for n in IN_CACHE_CASES if n != "L1") + " |",
              "|---|" + "---:|" * len(IN_CACHE_CASES)]
    for v, t in res["in_cache_seconds"].items():
        lines.append(f"| {v}{'*' if v == picked else ''} | {t['L1'] * 1e6:.1f} | "
                     + " | ".join(f"{t[n] / t['L1']:.2f}" for n in IN_CACHE_CASES if n != "L1") + " |")
    return "\n".join(lines)


def _verdict(res: dict) -> str:
    picked = [(r["percent"][res["picked"]], r["op"], r["threads"])
              for r in res["rows"] if res["picked"] in r["percent"]]
    if not picked:
        return ""
    worst = min(picked)
    slow = sum(1 for p in picked if p[0] < FAST_ENOUGH)
    line = (f"Dispatched variant ({res['picked']}): {len(picked) - slow} of {len(picked)} op x thread cells at >= "
            f"{FAST_ENOUGH:.0f} % of the probe; slowest {worst[0]:.0f} % ({worst[1]}, {worst[2]} thread(s)).")
    of_twin = [(100.0 * r["percent"][res["picked"]] / r["twin_percent"], r["op"], r["threads"])
               for r in res["rows"] if res["picked"] in r["percent"] and r.get("twin_percent")]
    if of_twin:
        low, fast = min(of_twin), sum(1 for p in of_twin if p[0] >= FAST_ENOUGH)
        line += (f" Against the same-traffic {TWIN} op: {fast} of {len(of_twin)} cells at >= {FAST_ENOUGH:.0f} %; "
                 f"lowest {low[0]:.0f} % ({low[1]}, {low[2]} thread(s)).")
    return line


def parse_args(argv: Optional[Sequence[str]] = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default 1 2)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--numel", type=int, default=RESNET18_NUMEL, help="values per buffer (default: ResNet-18's "
                                                                      "11,689,512)")
    ap.add_argument("--rounds", type=int, default=30, help="calls per op and variant (default 30); the median is shown")
    ap.add_argument("--stat", choices=sorted(STATS), default="median",
                    help="median (default) or min: the fastest call, for a machine shared with other jobs")
    ap.add_argument("--warm", action="store_true",
                    help="do not evict the caches after each refill (the probe then finds part of its buffer in L3)")
    ap.add_argument("--ops", nargs="+", default=None, help="only ops whose name contains one of these (e.g. prox "
                                                           "cv_step)")
    ap.add_argument("--baseline", action="store_true", help="also time the SSE2 baseline variant")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.numel < 1:
        ap.error(f"--numel must be >= 1, got {args.numel}")
    if any(t < 0 for t in args.threads):
        ap.error(f"--threads must be >= 0 (0 = every core), got {args.threads}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    res = run(args)
    print()
    print(render_markdown(res))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return res


if __name__ == "__main__":
    main()
