"""Every prox and fused op on ResNet-sized buffers, against the copy bandwidth measured in the same run.

    python -m bench.gpu_roofline --json bench/results/gpu_check/roofline.json      # on a GPU
    python -m bench.gpu_roofline --device cpu --models mlp --table-models mlp --rounds 2   # smoke

For each model size (``--models``, default ResNet-18 and ResNet-101 with MNIST-shaped 1x28x28 input,
as the prox table) and dtype (``--dtypes``, default float32 and bfloat16), every op runs on one flat
vector of the model's parameter count (``fk.raw``; operands full-sized), and so does the roofline,
``dst.copy_(src)`` on a vector of the same size and dtype. Bandwidth counts bytes read + written:
an op that reads k vectors and writes w moves (k + w) x n x element size bytes; the copy moves 2 x.
"% of copy" is the op's GB/s over the same-size copy's; "% of HBM copy" is over a copy of
``--hbm-mib`` (default 1024 MiB, far beyond any L2), the number to compare with the GPU's datasheet.

Timing: CUDA events around a CUDA graph holding k back-to-back calls (k such that a sample lasts
~2 ms), so Python's per-call cost (~10 us for ``fk.raw``) does not hide behind short kernels; the
eager time (events around k calls launched from Python) is reported beside it. If capture fails the
eager time is used and the table says so. Samples are taken round-robin over the ops and the copy
(``--rounds``, default 20) and the median is reported. On the CPU the same code times with
``time.perf_counter`` (for the smoke test only).

``--table-models`` (default ResNet-18/34/50/101) also get one float32 forward+backward pass
(batch 32) and the fk L1 / MCP / SCAD prox: the GPU rows of the prox table (FedCanon Table I).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

import fedkernels as fk
from python_algos.experiments.models import build_model, count_parameters

from . import reference as R
from .bandwidth import Timing, gbps

INPUT = (1, 28, 28)
BATCH = 32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
TABLE_KINDS = ("l1", "mcp", "scad")


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    accesses: int  # vectors read + vectors written per call
    call: Callable[[Dict[str, torch.Tensor]], object]  # one call on the buffers


def _prox(kind, step, p1, p2):
    return lambda B: fk.raw.prox_(B["x"], kind, step, p1, p2)


# Scalars keep repeated application bounded (the samples call each op hundreds of times on the same
# buffers); the kernels' cost does not depend on the values (branch-free selects).
OPS: List[OpSpec] = [
    OpSpec("prox_ l1", 2, _prox("l1", *R.DEFAULT_PARAMS["l1"])),
    OpSpec("prox_ mcp", 2, _prox("mcp", *R.DEFAULT_PARAMS["mcp"])),
    OpSpec("prox_ scad", 2, _prox("scad", *R.DEFAULT_PARAMS["scad"])),
    OpSpec("prox_ elastic_net", 2, _prox("elastic_net", 0.1, 1e-3, 1e-3)),
    OpSpec("prox_ mcp (hard, step >= gamma)", 2, _prox("mcp", 4.0, 1e-3, 3.0)),
    OpSpec("prox_ scad (step >= a - 1)", 2, _prox("scad", 4.0, 1e-3, 3.7)),
    OpSpec("prox_ box", 2, _prox("box", 0.1, -1.0, 1.0)),
    OpSpec("prox_ nonneg", 2, _prox("nonneg", 0.1, 0.0, 0.0)),
    OpSpec("prox_ zero (identity pass)", 2, _prox("zero", 0.1, 0.0, 0.0)),
    OpSpec("prox scad (out of place)", 2, lambda B: fk.raw.prox(B["x"], "scad", 0.1, 1e-3, 3.7, out=B["out"])),
    OpSpec("box_tensor_", 4, lambda B: fk.raw.box_tensor_(B["x"], B["lo"], B["hi"])),
    OpSpec("l2_ball_ (2 passes)", 3, lambda B: fk.raw.l2_ball_(B["x"], 1e6)),
    OpSpec("group_lasso_ rows of [n/1024, 1024] (2 passes)", 3,
           lambda B: fk.raw.group_lasso_(B["x"], 1e-9, 1.0, "rows", shape=(B["x"].numel() // 1024, 1024))),
    OpSpec("group_lasso_ cols of [n/1024, 1024] (2 passes)", 3,
           lambda B: fk.raw.group_lasso_(B["x"], 1e-9, 1.0, "cols", shape=(B["x"].numel() // 1024, 1024))),
    OpSpec("cv_step_", 4, lambda B: fk.raw.cv_step_(B["x"], B["g"], B["c"], 1e-3)),
    OpSpec("normalized_delta", 3, lambda B: fk.raw.normalized_delta(B["z"], B["x"], 0.5, 2)),
    OpSpec("normalized_delta_", 3, lambda B: fk.raw.normalized_delta_(B["y"], B["z"], 0.5, 2)),
    OpSpec("control_update_", 4, lambda B: fk.raw.control_update_(B["c"], B["g"], B["m"])),
    OpSpec("prox_grad_step_ scad", 3, lambda B: fk.raw.prox_grad_step_(B["x"], B["g"], 1e-3, "scad", 0.1, 1e-3, 3.7)),
    OpSpec("normal_map_step_ scad", 6,
           lambda B: fk.raw.normal_map_step_(B["z"], B["x"], B["g"], B["c"], 1e-3, 0.1, "scad", 0.1, 1e-3, 3.7)),
    OpSpec("za1_step_ scad", 5,
           lambda B: fk.raw.za1_step_(B["z"], B["y"], B["g"], B["c"], 1e-3, "scad", 0.1, 1e-3, 3.7)),
    OpSpec("depositum_step_ scad shb", 5,
           lambda B: fk.raw.depositum_step_(B["x"], B["m"], B["g"], 1e-3, 0.9, "scad", 0.1, 1e-3, 3.7)),
    OpSpec("depositum_step_ scad snag", 5,
           lambda B: fk.raw.depositum_step_(B["x"], B["m"], B["g"], 1e-3, 0.9, "scad", 0.1, 1e-3, 3.7,
                                            momentum="snag")),
]
TABLE_OPS = {"l1": "prox_ l1", "mcp": "prox_ mcp", "scad": "prox_ scad"}


def model_params(name: str) -> int:
    return count_parameters(build_model(name, INPUT))


def buffers(n: int, dtype, device) -> Dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    B = {k: (0.01 * torch.randn(n, generator=gen)).to(dtype).to(device) for k in ("x", "y", "z", "g", "c", "m")}
    B["out"] = torch.empty_like(B["x"])
    B["lo"], B["hi"] = torch.full_like(B["x"], -1.0), torch.full_like(B["x"], 1.0)
    return B


# --------------------------------------------------------------------------- #
# Timing
# --------------------------------------------------------------------------- #


class Sampler:
    """Seconds per call of ``fn``, one sample per ``__call__``: k calls, in a CUDA graph when
    possible (``mode`` "graph"), else launched from Python ("eager"); on the CPU, perf_counter."""

    def __init__(self, fn: Callable[[], object], device: torch.device, *, target_s: float = 2e-3,
                 max_calls: int = 200, graph: bool = True):
        self.fn, self.cuda, self.graph, self.error = fn, device.type == "cuda", None, None
        for _ in range(3):
            fn()
        one = self._eager(3) if self.cuda else self._cpu(3)
        self.k = max(1, min(max_calls, math.ceil(target_s / max(one, 1e-7))))
        self.mode = "eager" if self.cuda else "cpu"
        if self.cuda and graph:
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    fn()
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(self.k):
                        fn()
                self.graph, self.mode = g, "graph"
            except Exception as e:  # noqa: BLE001 - reported in the table; eager timing is used
                self.error = f"{type(e).__name__}: {e}"
                torch.cuda.synchronize()

    def _eager(self, k: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(k):
            self.fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / k

    def _cpu(self, k: int) -> float:
        t0 = time.perf_counter()
        for _ in range(k):
            self.fn()
        return (time.perf_counter() - t0) / k

    def eager(self) -> float:
        return self._eager(self.k) if self.cuda else self._cpu(self.k)

    def __call__(self) -> float:
        if self.graph is None:
            return self.eager()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / self.k


def interleaved(samplers: Dict[str, Sampler], rounds: int) -> Dict[str, dict]:
    """Round-robin samples (one of each per round, so clock and load changes hit all alike);
    one eager sample per op per round as well."""
    s = {n: [] for n in samplers}
    e = {n: [] for n in samplers}
    for _ in range(rounds):
        for n, smp in samplers.items():
            s[n].append(smp())
            e[n].append(smp.eager())
    out = {}
    for n, smp in samplers.items():
        out[n] = Timing(s[n], smp.k).as_dict()
        out[n]["eager_median_s"] = Timing(e[n], smp.k).median
        out[n]["mode"] = smp.mode
        if smp.error:
            out[n]["capture_error"] = smp.error
    return out


# --------------------------------------------------------------------------- #
# Measurements
# --------------------------------------------------------------------------- #


def hbm_copy(device, mib: float, rounds: int, target_s: float) -> dict:
    n = max(1, int(mib * 2**20) // 2 // 4)  # two float32 buffers of mib/2 each
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    t = interleaved({"copy": Sampler(lambda d=dst, s=src: d.copy_(s), device, target_s=target_s)}, rounds)["copy"]
    moved = 2 * n * 4
    t.update(bytes_moved=moved, gbps=gbps(moved, t["median_s"]), gbps_best=gbps(moved, t["min_s"]),
             buffers_mib=2 * n * 4 / 2**20)
    del src, dst
    return t


def measure_model(name: str, numel: int, dtype, device, ops: Sequence[OpSpec], rounds: int, log,
                  target_s: float = 2e-3) -> dict:
    B = buffers(numel, dtype, device)
    esize = B["x"].element_size()
    copy_dst = torch.empty_like(B["x"])
    samplers = {"copy": Sampler(lambda d=copy_dst, s=B["y"]: d.copy_(s), device, target_s=target_s)}
    for op in ops:
        samplers[op.name] = Sampler(lambda op=op, B=B: op.call(B), device, target_s=target_s)
    res = interleaved(samplers, rounds)
    copy = res.pop("copy")
    copy["bytes_moved"] = 2 * numel * esize
    copy["gbps"] = gbps(copy["bytes_moved"], copy["median_s"])
    rec = {"model": name, "params": numel, "dtype": str(dtype).replace("torch.", ""), "element_bytes": esize,
           "copy": copy, "ops": {}}
    for op in ops:
        r = res[op.name]
        r["accesses"] = op.accesses
        r["bytes_moved"] = op.accesses * numel * esize
        r["gbps"] = gbps(r["bytes_moved"], r["median_s"])
        r["pct_of_copy"] = 100.0 * r["gbps"] / copy["gbps"]
        rec["ops"][op.name] = r
    worst = min(rec["ops"].values(), key=lambda r: r["pct_of_copy"]) if rec["ops"] else None
    log(f"  {name:<10} {rec['dtype']:<8} n={numel:,}: copy {copy['gbps']:.0f} GB/s"
        + (f", worst op {worst['pct_of_copy']:.0f} % of it" if worst else ""))
    del B, copy_dst, samplers
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rec


def fwd_bwd(name: str, device, rounds: int) -> dict:
    """One training step (forward, cross-entropy, backward), as the prox table times it."""
    from .prox_table import time_fwd_bwd

    torch.manual_seed(0)
    model = build_model(name, INPUT).to(device)
    t = time_fwd_bwd(model, INPUT, BATCH, device, rounds)
    del model
    return t.as_dict()


def run(*, device="cuda", models=("resnet18", "resnet101"),
        table_models=("resnet18", "resnet34", "resnet50", "resnet101"), dtypes=("float32", "bfloat16"),
        rounds: int = 20, hbm_mib: float = 1024.0, sample_ms: float = 2.0, log=print) -> dict:
    """Measure; returns the dict ``--json`` writes (see gpu_report for its use)."""
    target_s = sample_ms * 1e-3
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    t0 = time.perf_counter()
    out = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "input": list(INPUT), "batch": BATCH, "rounds": rounds,
           "hbm_copy": hbm_copy(device, hbm_mib, rounds, target_s), "results": [], "table": []}
    log(f"  copy of {out['hbm_copy']['buffers_mib']:.0f} MiB: {out['hbm_copy']['gbps']:.0f} GB/s (read + write)")
    sizes = {m: model_params(m) for m in dict.fromkeys([*models, *table_models])}
    with torch.no_grad():
        for m in models:
            for d in dtypes:
                out["results"].append(measure_model(m, sizes[m], DTYPES[d], device, OPS, rounds, log, target_s))
        for m in table_models:
            row = {"model": m, "params": sizes[m], "fwd_bwd": None, "prox": {}}
            done = next((r for r in out["results"] if r["model"] == m and r["dtype"] == "float32"), None)
            if done is None:
                done = measure_model(m, sizes[m], torch.float32, device,
                                     [o for o in OPS if o.name in TABLE_OPS.values()], rounds, log, target_s)
            row["prox"] = {k: done["ops"][TABLE_OPS[k]] for k in TABLE_KINDS}
            row["copy"] = done["copy"]
            out["table"].append(row)
    for row in out["table"]:  # grad mode on for the training step
        row["fwd_bwd"] = fwd_bwd(row["model"], device, max(3, rounds // 4))
        log(f"  {row['model']:<10} fwd+bwd {row['fwd_bwd']['median_s'] * 1e3:.2f} ms; prox "
            + " / ".join(f"{row['prox'][k]['median_s'] * 1e3:.3f}" for k in TABLE_KINDS) + " ms (L1 / MCP / SCAD)")
    out["seconds"] = time.perf_counter() - t0
    return out


def _names(text: str, valid, flag: str) -> List[str]:
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in valid]
    if bad:
        raise SystemExit(f"{flag}: unknown {bad}; choose from {','.join(valid)}")
    return names


def main(argv: Optional[Sequence[str]] = None) -> int:
    from python_algos.experiments.models import MODELS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="resnet18,resnet101", help="sizes for every op (default resnet18,resnet101)")
    ap.add_argument("--table-models", default="resnet18,resnet34,resnet50,resnet101",
                    help="models for the fwd+bwd vs prox rows (default ResNet-18/34/50/101; '' for none)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated, from " + ",".join(DTYPES))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--hbm-mib", type=float, default=1024.0, help="total size of the large copy probe (MiB)")
    ap.add_argument("--sample-ms", type=float, default=2.0, help="length of one timing sample (default 2 ms)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_roofline: --device cuda needs a CUDA GPU visible to torch (none here)", file=sys.stderr)
        return 2
    res = run(device=args.device, models=_names(args.models, MODELS, "--models"),
              table_models=_names(args.table_models, MODELS, "--table-models"),
              dtypes=_names(args.dtypes, DTYPES, "--dtypes"), rounds=args.rounds, hbm_mib=args.hbm_mib,
              sample_ms=args.sample_ms)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
