"""Regenerate FedCanon's Table I (prox time per model vs. forward+backward) on this machine.

    python -m bench.prox_table                        # full table, ~3-5 min on 2 cores
    python -m bench.prox_table --readme bench/README.md   # ... and update the README's table
    python -m bench.prox_table --quick --no-compile   # MLP, CNN, ResNet-18 only, ~30 s

For each model (batch 32, MNIST-shaped 1x28x28 input by default, float32) it times one
forward+backward pass and the prox of L1, MCP and SCAD on all parameters, four ways:

* **eager**: the paper-style implementation (``bench/reference.py``): composed torch ops per
  parameter tensor, out of place; this is what the paper's Table I measured;
* **compile**: the same formula on the flat buffer under ``torch.compile`` (steady state; the
  cold compile time, with a fresh inductor cache, is reported separately);
* **fk flat**: ``fk.raw.prox_`` on the model's flat parameter buffer (``fk.FlatParams``), one
  fused kernel;
* **fk per-param**: the regularizer objects (``fk.SCAD(...).prox_``) called on every tensor.

Fast variants are timed side by side (round-robin) with an in-place bandwidth probe
(``buf.mul_(1.0)``) on the same buffer, so "% of bandwidth" compares like with like. It also
times the fused federated updates against plain-PyTorch compositions, and the per-call overhead
of the custom-op path vs. the low-overhead path. Results go to ``--out`` (default
``bench/results/``) as ``prox_table.md`` and ``prox_table.json``.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

import fedkernels as fk
from python_algos.experiments.models import build_model, count_parameters

from . import reference as R
from .bandwidth import (
    MiB,
    Timing,
    cpu_busy,
    gbps,
    inplace_bandwidth,
    machine_info,
    machine_line,
    measure,
    measure_interleaved,
    set_threads,
    sync_for,
)
from .readme_block import markers, update_readme

ALL_MODELS = ("mlp", "cnn", "resnet18", "resnet34", "resnet50", "resnet101")
QUICK_MODELS = ("mlp", "cnn", "resnet18")
DISPLAY = {
    "mlp": "MLP",
    "cnn": "CNN",
    "resnet18": "ResNet-18",
    "resnet34": "ResNet-34",
    "resnet50": "ResNet-50",
    "resnet101": "ResNet-101",
}
KIND_LABEL = {"l1": "L1", "mcp": "MCP", "scad": "SCAD"}
INPUTS = {"mnist": (1, 28, 28), "cifar": (3, 32, 32)}

#: FedCanon Table I (ms; their device, MNIST), for comparison in the output.
PAPER_TABLE_I = {
    "resnet18": (86.6, 119.8, 222.4, 387.4),
    "resnet34": (159.1, 226.8, 371.9, 751.9),
    "resnet50": (302.5, 248.3, 401.8, 836.2),
    "resnet101": (561.3, 430.0, 718.7, 1589.1),
}

README_BEGIN, README_END = markers("prox-table")


# --------------------------------------------------------------------------- #
# Measurements
# --------------------------------------------------------------------------- #


def fresh_inductor_cache() -> str:
    """Point inductor at an empty cache directory (removed at exit) so compile times are cold."""
    path = tempfile.mkdtemp(prefix="fk-bench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _regularizer(kind: str):
    step, p1, p2 = R.DEFAULT_PARAMS[kind]
    return {"l1": lambda: fk.L1(p1), "mcp": lambda: fk.MCP(p1, p2), "scad": lambda: fk.SCAD(p1, p2)}[kind]()


def _dynamo_graphs() -> int:
    """Graphs dynamo has compiled so far in this process (to spot recompiles); -1 if unknown."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - private API; the table only loses the recompile note
        return -1


def time_fwd_bwd(model: torch.nn.Module, in_shape, batch: int, device, rounds: int) -> Timing:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((batch, *in_shape), generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()

    return measure(step, rounds=rounds, warmup=1, min_sample_s=0.05, sync=sync_for(device))


def bench_model(name: str, args, device, compiled: Dict[str, object], log) -> dict:
    torch.manual_seed(0)
    in_shape = INPUTS[args.input]
    model = build_model(name, in_shape).to(device)
    numel = count_parameters(model)
    sync = sync_for(device)
    rec: dict = {"model": name, "params": numel, "buffer_bytes": 4 * numel, "input": [args.batch, *in_shape]}

    t = time_fwd_bwd(model, in_shape, args.batch, device, max(2, args.repeats))
    rec["fwd_bwd"] = t.as_dict()
    log(f"  {DISPLAY[name]:<10} {numel:>11,d} params  fwd+bwd {t.median * 1e3:9.2f} ms")

    with torch.no_grad():
        flat = fk.FlatParams(model)
        buf = flat.params
        views = [p.detach() for p in model.parameters()]
        nbytes_inplace = 2 * buf.numel() * buf.element_size()

        # (a) paper-style eager, per tensor, out of place
        rec["eager"] = {}
        for kind in R.KINDS:
            step, p1, p2 = R.DEFAULT_PARAMS[kind]
            te = measure(lambda views=views, prox=(kind, step, p1, p2): R.paper_style_prox(views, *prox),
                         rounds=max(2, args.repeats), warmup=1, min_sample_s=0.02, sync=sync)
            rec["eager"][kind] = te.as_dict()
        gc.collect()

        # (b) first call of each compiled function on this buffer size (compile or recompile)
        rec["compile_first_call_s"] = {}
        for kind, fn in compiled.items():
            if isinstance(fn, str):
                continue
            graphs = _dynamo_graphs()
            sync()
            t0 = time.perf_counter()
            fn(buf)
            sync()
            rec["compile_first_call_s"][kind] = {"seconds": time.perf_counter() - t0,
                                                 "recompiled": _dynamo_graphs() > graphs}

        # (b), (c), (d) and the bandwidth probe, side by side
        fns = {"probe": lambda buf=buf: buf.mul_(1.0)}
        for kind in R.KINDS:
            step, p1, p2 = R.DEFAULT_PARAMS[kind]
            reg = _regularizer(kind)
            fns[f"fk_flat/{kind}"] = lambda prox=(kind, step, p1, p2), buf=buf: fk.raw.prox_(buf, *prox)
            fns[f"fk_param/{kind}"] = lambda reg=reg, step=step, views=views: [reg.prox_(v, step) for v in views]
            if not isinstance(compiled.get(kind, "off"), str):
                fns[f"compile/{kind}"] = lambda fn=compiled[kind], buf=buf: fn(buf)
        res = measure_interleaved(fns, rounds=args.fast_rounds, warmup=2, min_sample_s=0.01, sync=sync)
    rec["probe"] = res.pop("probe").as_dict()
    rec["probe"]["bytes_moved"] = nbytes_inplace
    for impl in ("fk_flat", "fk_param", "compile"):
        rec[impl] = {k.split("/")[1]: v.as_dict() for k, v in res.items() if k.startswith(impl + "/")}
    for impl in ("fk_flat", "compile", "eager", "fk_param"):
        for d in rec.get(impl, {}).values():
            d["bytes_moved"] = nbytes_inplace
    cells = "  ".join(
        f"{KIND_LABEL[k]}: eager {rec['eager'][k]['median_s'] * 1e3:8.2f} | fk "
        f"{rec['fk_flat'][k]['median_s'] * 1e3:7.3f} ms"
        + (f" | compile {rec['compile'][k]['median_s'] * 1e3:7.3f}" if k in rec["compile"] else "")
        for k in R.KINDS
    )
    log(f"             {cells}  (probe {_gb(rec['probe']):.1f} GB/s)")
    del flat, buf, views, model, fns  # fns's closures hold buf and views
    gc.collect()
    return rec


def bench_fused(args, device) -> dict:
    """Fused federated updates vs. their plain-PyTorch compositions on one d-vector."""
    n = args.fused_numel
    sync = sync_for(device)
    gen = torch.Generator().manual_seed(1)

    def vec():
        return (0.01 * torch.randn(n, generator=gen)).to(device)

    x, g, c, d, z, z2, x2 = vec(), vec(), vec(), vec(), vec(), vec(), vec()
    beta, alpha, eta, lam = 1e-3, 1e-3, 1e-3, 0.1
    rows = []

    def row(name, nbytes_per_elem, nvectors, fns):
        # the roofline: an in-place pass over a buffer as large as the update's working set
        probe_buf = torch.ones(nvectors * n, device=device)
        fns = {"probe": lambda probe_buf=probe_buf: probe_buf.mul_(1.0), **fns}
        res = measure_interleaved(fns, rounds=args.fast_rounds, warmup=1, min_sample_s=0.01, sync=sync)
        del probe_buf, fns  # fns["probe"] holds probe_buf
        entry = {"update": name, "numel": n, "bytes_per_elem": nbytes_per_elem, "vectors": nvectors}
        for k, t in res.items():
            entry[k] = t.as_dict()
            entry[k]["bytes_moved"] = (8 * nvectors if k == "probe" else nbytes_per_elem) * n
        rows.append(entry)

    with torch.no_grad():
        row("cv_step: x -= beta (g + c)", 16, 3, {
            "torch": lambda: R.composed_cv_step_(x, g, c, beta),
            "fused": lambda: fk.raw.cv_step_(x, g, c, beta),
        })
        row("control_update: c += dbar - d", 16, 3, {
            "torch": lambda: R.composed_control_update_(c, g, d),
            "fused": lambda: fk.raw.control_update_(c, g, d),
        })
        for kind in R.KINDS:
            step, p1, p2 = R.DEFAULT_PARAMS[kind]
            k = KIND_LABEL[kind]
            prox = (kind, step, p1, p2)
            row(f"FedCanon server: z = prox(z - alpha dbar), {k}", 12, 2, {
                "torch": lambda prox=prox: R.composed_prox_grad_step_(z, g, alpha, *prox),
                "torch+fk": lambda prox=prox: fk.raw.prox_(z.sub_(g, alpha=alpha), *prox),
                "fused": lambda prox=prox: fk.raw.prox_grad_step_(z, g, alpha, *prox),
            })
            row(f"FedNMap normal map + prox, {k}", 24, 4, {
                "torch": lambda prox=prox: R.composed_normal_map_step_(z, x2, g, c, eta, lam, *prox),
                "torch+fk": lambda prox=prox: fk.raw.prox_(x2.copy_(z.sub_(eta * (g + c + (z - x2) / lam))), *prox),
                "fused": lambda prox=prox: fk.raw.normal_map_step_(z, x2, g, c, eta, lam, *prox),
            })
            row(f"ZA1 local step + prox, {k}", 20, 4, {
                "torch": lambda prox=prox: R.composed_za1_step_(z2, x2, g, c, eta, *prox),
                "torch+fk": lambda prox=prox: fk.raw.prox_(x2.copy_(z2.add_(g + c, alpha=-eta)), *prox),
                "fused": lambda prox=prox: fk.raw.za1_step_(z2, x2, g, c, eta, *prox),
            })
    return {"numel": n, "rows": rows}


def bench_overhead(args, device, compiled) -> dict:
    """Per-call time of each prox entry point on tiny and MLP-sized buffers (L1)."""
    step, kappa, _ = R.DEFAULT_PARAMS["l1"]
    reg = fk.L1(kappa)
    sync = sync_for(device)
    out = {"sizes": [1, args.overhead_numel], "rows": {}}
    for n in out["sizes"]:
        x = (0.01 * torch.randn(n)).to(device)
        fns = {
            "fk.raw.prox_": lambda x=x: fk.raw.prox_(x, "l1", step, kappa),
            "fk.ops.prox_ (custom op)": lambda x=x: fk.ops.prox_(x, "l1", step, kappa),
            "fk.L1(kappa).prox_ (custom op)": lambda x=x: reg.prox_(x, step),
            "fk.fused.prox_(fast=True)": lambda x=x: fk.fused.prox_(x, reg, step, fast=True),
            "eager torch formula (flat)": lambda x=x: R.flat_prox_(x, "l1", step, kappa),
        }
        if not isinstance(compiled.get("l1", "off"), str):
            fns["torch.compile formula (flat)"] = lambda x=x: compiled["l1"](x)
        with torch.no_grad():
            res = measure_interleaved(fns, rounds=args.fast_rounds, warmup=3, min_sample_s=0.01, sync=sync)
        for k, t in res.items():
            out["rows"].setdefault(k, {})[str(n)] = t.as_dict()
    return out


def run(args, log=print) -> dict:
    threads = set_threads(args.threads)
    info = machine_info()
    info["threads_used"] = threads
    log(f"# {machine_line(info)}")
    log(f"# load average at start: {info['loadavg']}; CPUs busy with other work: {_pct(info.get('cpu_busy_before'))}")
    results: dict = {
        "command": args.command,
        "machine": info,
        "settings": {
            "models": list(args.models),
            "input": args.input,
            "input_shape": list(INPUTS[args.input]),
            "batch": args.batch,
            "dtype": "float32",
            "threads": threads,
            "repeats": args.repeats,
            "fast_rounds": args.fast_rounds,
            "prox_params": {k: dict(zip(("step", "p1", "p2"), v)) for k, v in R.DEFAULT_PARAMS.items()},
            "compile": not args.no_compile,
            "stat": args.stat,
        },
        "devices": {},
    }
    t_start = time.perf_counter()
    for device in args.devices:
        log(f"## device {device}")
        dres: dict = {}
        probe = inplace_bandwidth(int(args.probe_mib * MiB), device=device)
        dres["probe_large"] = probe
        log(f"  in-place bandwidth probe ({args.probe_mib:g} MiB, read+write): {probe['gbps']:.2f} GB/s")

        compiled: Dict[str, object] = {}
        dres["compile_cold_s"] = {}
        if not args.no_compile:
            cache = fresh_inductor_cache()
            log(f"  torch.compile (inductor cache {cache}) ...")
            first_numel = count_parameters(build_model(args.models[0], INPUTS[args.input]))
            for kind in R.KINDS:
                step, p1, p2 = R.DEFAULT_PARAMS[kind]
                try:
                    fn = R.make_compiled_prox(kind, step, p1, p2, dynamic=True)
                    xb = (0.01 * torch.randn(max(first_numel, 2))).to(device)
                    sync_for(device)()
                    t0 = time.perf_counter()
                    with torch.no_grad():  # grad mode is a dynamo guard: compile as the benchmarks call
                        fn(xb)
                    sync_for(device)()
                    dres["compile_cold_s"][kind] = time.perf_counter() - t0
                    compiled[kind] = fn
                    log(f"    {KIND_LABEL[kind]}: cold compile {dres['compile_cold_s'][kind]:.1f} s")
                except Exception as e:  # noqa: BLE001 - report and go on without compile
                    compiled[kind] = f"failed: {type(e).__name__}: {e}"
                    log(f"    {KIND_LABEL[kind]}: compile failed ({e})")
            dres["compile_errors"] = {k: v for k, v in compiled.items() if isinstance(v, str)}

        dres["models"] = [bench_model(name, args, device, compiled, log) for name in args.models]
        if not args.no_fused:
            log("  fused federated updates ...")
            dres["fused"] = bench_fused(args, device)
            log("  call overhead ...")
            dres["overhead"] = bench_overhead(args, device, compiled)
        results["devices"][device] = dres
    results["elapsed_s"] = time.perf_counter() - t_start
    results["machine"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    results["machine"]["cpu_busy_after"] = cpu_busy(1.0)
    results["limits"] = evaluate_limits(results)
    return results


# --------------------------------------------------------------------------- #
# The measured figures against this machine's limit
# --------------------------------------------------------------------------- #


_STAT = {"key": "median_s"}  # which statistic the tables use (--stat)


def _s(d: dict) -> float:
    return d[_STAT["key"]]


def _ms(d: dict) -> float:
    return _s(d) * 1e3


def _gb(d: dict) -> float:
    """Effective GB/s of a timing that carries ``bytes_moved``."""
    return gbps(d["bytes_moved"], _s(d))


def _probe_gb(p: dict) -> float:
    """GB/s of the large-buffer probe under the chosen statistic."""
    return p["gbps_best"] if _STAT["key"] == "min_s" else p["gbps"]


def _use_stat(results: dict) -> None:
    _STAT["key"] = {"median": "median_s", "min": "min_s"}[results["settings"].get("stat", "median")]


def _roofline_s(m: dict) -> float:
    """Time of one in-place pass over the model's buffer at the same-size probe's bandwidth."""
    return _s(m["probe"])


def evaluate_limits(results: dict) -> List[dict]:
    """The headline figures, each with what a kernel streaming at the same-size probe's bandwidth
    (this machine's limit for one read and one write per value) would score."""
    _use_stat(results)
    out = []
    for device, dres in results["devices"].items():
        models = dres["models"]
        resnets = [m for m in models if m["model"].startswith("resnet")] or models
        out += _penalty_cost_rows(device, resnets)
        out += _bandwidth_rows(device, dres, resnets)
        out += _speedup_rows(device, models)
    return out


def _penalty_cost_rows(device: str, resnets: list) -> List[dict]:
    """SCAD and MCP against L1: the same traffic, so the limit is the same time."""
    worst = max(((m["fk_flat"][k][_STAT["key"]] / m["fk_flat"]["l1"][_STAT["key"]], m["model"], k)
                 for m in resnets for k in ("mcp", "scad")), default=None)
    if not worst:
        return []
    return [{"device": device, "figure": "fused SCAD or MCP time / fused L1 time (ResNets, largest)",
             "value": f"{worst[0]:.2f} ({KIND_LABEL[worst[2]]}, {DISPLAY[worst[1]]})", "limit": "1.00 (same bytes "
                                                                                                "moved)"}]


def _bandwidth_rows(device: str, dres: dict, resnets: list) -> List[dict]:
    """Kernel bandwidth as a share of the in-place probe's, on the same buffer and on a large one."""
    worst = min(((_gb(m["fk_flat"][k]) / _gb(m["probe"]), m["model"], k) for m in resnets for k in R.KINDS),
                default=None)
    if not worst:
        return []
    large = dres["probe_large"]
    worst_large = min(_gb(m["fk_flat"][k]) / _probe_gb(large) for m in resnets for k in R.KINDS)
    return [{"device": device, "figure": "fused prox bandwidth / in-place probe's (x.mul_(1.0)), ResNets, slowest",
             "value": f"{worst[0] * 100:.0f} % of the same-size probe ({KIND_LABEL[worst[2]]}, {DISPLAY[worst[1]]}); "
                      f"{worst_large * 100:.0f} % of the {large['buffer_bytes'] / MiB:.0f} MiB probe",
             "limit": f"100 % ({_probe_gb(large):.1f} GB/s on the {large['buffer_bytes'] / MiB:.0f} MiB probe)"}]


def _speedup_rows(device: str, models: list) -> List[dict]:
    """Speed-ups over the eager and compiled formulas, and the prox's share of a training step."""
    out = []
    r18 = next((m for m in models if m["model"] == "resnet18"), None)
    if r18:
        value = ", ".join(f"{KIND_LABEL[k]} {_s(r18['eager'][k]) / _s(r18['fk_flat'][k]):.0f}x" for k in R.KINDS)
        limit = ", ".join(f"{KIND_LABEL[k]} {_s(r18['eager'][k]) / _roofline_s(r18):.0f}x" for k in R.KINDS)
        out.append({"device": device, "figure": "speed-up over the paper-style eager prox, ResNet-18",
                    "value": value, "limit": limit})
    pairs = [(m["compile"][k][_STAT["key"]] / m["fk_flat"][k][_STAT["key"]], m["model"], k)
             for m in models for k in R.KINDS if k in m.get("compile", {})]
    if pairs:
        worst = min(pairs)
        wm = next(m for m in models if m["model"] == worst[1])
        out.append({"device": device, "figure": "speed-up over torch.compile's steady state, smallest",
                    "value": f"{worst[0]:.2f}x ({KIND_LABEL[worst[2]]}, {DISPLAY[worst[1]]})",
                    "limit": f"{_s(wm['compile'][worst[2]]) / _roofline_s(wm):.2f}x"})
    worst = max((_s(m["fk_flat"][k]) / _s(m["fwd_bwd"]), m["model"], k) for m in models for k in R.KINDS)
    wm = next(m for m in models if m["model"] == worst[1])
    out.append({"device": device, "figure": "fused prox time / forward+backward time, largest",
                "value": f"{worst[0] * 100:.2f} % ({KIND_LABEL[worst[2]]}, {DISPLAY[worst[1]]})",
                "limit": f"{100 * _roofline_s(wm) / _s(wm['fwd_bwd']):.2f} %"})
    return out


# --------------------------------------------------------------------------- #
# Markdown
# --------------------------------------------------------------------------- #


def _pct(v) -> str:
    return "?" if v is None else f"{100 * v:.0f} %"


def _cell(ms: float, base_ms: float) -> str:
    ratio = ms / base_ms
    ms_s = f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" if ms >= 1 else f"{ms:.3f}" if ms >= 0.1 else f"{ms:.4f}"
    r_s = f"{ratio:.3f}" if ratio >= 0.1 else f"{ratio:.2g}"
    return f"{ms_s} ({r_s}×)"


def _params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.0f} k"


def _prox_table(models, impl: str) -> List[str]:
    lines = ["| Model | Params | Fwd & Bwd (ms) | L1 | MCP | SCAD |", "|---|---:|---:|---:|---:|---:|"]
    for m in models:
        if not m.get(impl):
            continue
        fb = _ms(m["fwd_bwd"])
        cells = " | ".join(_cell(_ms(m[impl][k]), fb) if k in m[impl] else "–" for k in R.KINDS)
        lines.append(f"| {DISPLAY[m['model']]} | {_params(m['params'])} | {fb:.2f} | {cells} |")
    return lines


def render_markdown(results: dict) -> str:
    _use_stat(results)
    info = results["machine"]
    s = results["settings"]
    L: List[str] = []
    L.append(f"Measured {info['date']} on {machine_line(info)}.")
    L.append(f"Command: `{results['command']}` ({results['elapsed_s'] / 60:.1f} min). "
             f"Load average at start {', '.join(f'{v:.2f}' for v in info['loadavg'] or [])}, "
             f"at end {', '.join(f'{v:.2f}' for v in info.get('loadavg_end') or [])}; CPUs busy with other jobs "
             f"just before / after the run: {_pct(info.get('cpu_busy_before'))} / {_pct(info.get('cpu_busy_after'))}.")
    pp = s["prox_params"]
    L.append(f"Batch {s['batch']}, {s['input']}-shaped input {'x'.join(map(str, s['input_shape']))}, float32, "
             f"{s['threads']} threads. Prox steps: L1 step {pp['l1']['step']:g}, kappa {pp['l1']['p1']:g}; "
             f"MCP step {pp['mcp']['step']:g}, lam {pp['mcp']['p1']:g}, gamma {pp['mcp']['p2']:g}; "
             f"SCAD step {pp['scad']['step']:g}, lam {pp['scad']['p1']:g}, a {pp['scad']['p2']:g}. "
             f"Cells: ms (× forward+backward), the {s['stat']} over rounds: {s['repeats']} rounds for forward+backward "
             f"and the eager prox, {s['fast_rounds']} round-robin rounds for the fast paths.")
    L.append("")
    for device, d in results["devices"].items():
        models = d["models"]
        probe = d["probe_large"]
        if len(results["devices"]) > 1:
            L.append(f"### Device: {device}")
            L.append("")
        L.append(f"In-place memory bandwidth (`x.mul_(1.0)` on {probe['buffer_bytes'] / MiB:.0f} MiB, read + write): "
                 f"**{_probe_gb(probe):.1f} GB/s**.")
        L.append("")
        L.append("**(a) Paper-style eager prox** (composed torch ops per parameter tensor, out of place; what Table I "
                 "measured):")
        L.append("")
        L += _prox_table(models, "eager")
        L.append("")
        if any(m.get("compile") for m in models):
            cold = ", ".join(f"{KIND_LABEL[k]} {v:.1f} s" for k, v in d["compile_cold_s"].items())
            rec = [f"{DISPLAY[m['model']]}/{KIND_LABEL[k]}" for m in models
                   for k, v in m.get("compile_first_call_s", {}).items() if v["recompiled"]]
            L.append("**(b) `torch.compile` of the same formula on the flat buffer** (steady state; `dynamic=True`, "
                     "one "
                     f"compile per penalty; cold compile with an empty inductor cache: {cold}; the first includes "
                     f"inductor's one-time start-up{'; recompiled for ' + ', '.join(rec) if rec else ''}):")
            L.append("")
            L += _prox_table(models, "compile")
            L.append("")
        L.append("**(c) fedkernels, one fused kernel on the flat buffer** (`fk.raw.prox_(flat.params, ...)`):")
        L.append("")
        L += _prox_table(models, "fk_flat")
        L.append("")
        L.append("**(d) fedkernels per-parameter API** (`fk.SCAD(lam, a).prox_(p, step)` on every tensor, through the "
                 "custom op):")
        L.append("")
        L += _prox_table(models, "fk_param")
        L.append("")
        L.append("**Bandwidth.** Effective GB/s counts read + write of the flat buffer (8 bytes per float32 "
                 "parameter); "
                 "% is of the in-place probe on a buffer of the same size, measured side by side "
                 f"(a buffer that fits in cache beats the {probe['buffer_bytes'] / MiB:.0f} MiB probe).")
        L.append("")
        L.append("| Model | Buffer | Probe, same size | fk L1 | fk MCP | fk SCAD | compile SCAD |")
        L.append("|---|---:|---:|---:|---:|---:|---:|")
        for m in models:
            pg = _gb(m["probe"])
            cells = [f"{_gb(m['fk_flat'][k]):.1f} ({100 * _gb(m['fk_flat'][k]) / pg:.0f} %)" for k in R.KINDS]
            comp = m.get("compile", {}).get("scad")
            cells.append(f"{_gb(comp):.1f} ({100 * _gb(comp) / pg:.0f} %)" if comp else "–")
            L.append(f"| {DISPLAY[m['model']]} | {m['buffer_bytes'] / MiB:.1f} MiB | {pg:.1f} GB/s | "
                     + " | ".join(cells) + " |")
        L.append("")
        L.append("**Speed-ups of fk flat** (median time of the other path / fk flat):")
        L.append("")
        L.append("| Model | vs eager L1 / MCP / SCAD | vs compile L1 / MCP / SCAD | vs fk per-param L1 / MCP / SCAD |")
        L.append("|---|---:|---:|---:|")
        for m in models:
            def sp(impl, m=m):
                if not m.get(impl):
                    return "–"
                return " / ".join(f"{_s(m[impl][k]) / _s(m['fk_flat'][k]):.1f}" for k in R.KINDS)
            L.append(f"| {DISPLAY[m['model']]} | {sp('eager')} | {sp('compile')} | {sp('fk_param')} |")
        L.append("")
        paper = [m for m in models if m["model"] in PAPER_TABLE_I]
        if paper:
            L.append("For reference, the paper's Table I (their machine, MNIST): " + "; ".join(
                f"{DISPLAY[m['model']]} fwd+bwd {PAPER_TABLE_I[m['model']][0]} ms, L1 {PAPER_TABLE_I[m['model']][1]}, "
                f"MCP {PAPER_TABLE_I[m['model']][2]}, SCAD {PAPER_TABLE_I[m['model']][3]} ms" for m in paper) + ".")
            L.append("")
        if d.get("fused"):
            fu = d["fused"]
            L.append(f"**Fused federated updates** on d = {fu['numel']:,} vectors (ResNet-18-sized), fedkernels fused "
                     "kernel "
                     "vs. the plain-PyTorch composition (`bench/reference.py`) and vs. PyTorch for the linear part + "
                     "the fk prox. "
                     "% probe: of the in-place probe on a buffer as large as the update's working set (all its "
                     "vectors).")
            L.append("")
            L.append("| Update | Bytes/elem | PyTorch (ms) | PyTorch + fk prox (ms) | fused (ms) | speed-up vs "
                     "PyTorch | fused GB/s (% probe) |")
            L.append("|---|---:|---:|---:|---:|---:|---:|")
            for r in fu["rows"]:
                tf = _ms(r["fused"])
                two = f"{_ms(r['torch+fk']):.2f}" if "torch+fk" in r else "–"
                L.append(f"| {r['update']} | {r['bytes_per_elem']} | {_ms(r['torch']):.2f} | {two} | {tf:.2f} | "
                         f"{_ms(r['torch']) / tf:.1f}× | {_gb(r['fused']):.1f} "
                         f"({100 * _gb(r['fused']) / _gb(r['probe']):.0f} %) |")
            L.append("")
        if d.get("overhead"):
            ov = d["overhead"]
            n1, n2 = (str(v) for v in ov["sizes"])
            L.append("**Per-call time of the prox entry points** (L1, µs per call; median):")
            L.append("")
            L.append(f"| Path | 1 element | {int(n2):,} elements (MLP) |")
            L.append("|---|---:|---:|")
            for k, v in ov["rows"].items():
                L.append(f"| {k} | {_s(v[n1]) * 1e6:.1f} | {_s(v[n2]) * 1e6:.1f} |")
            L.append("")
    if results.get("limits"):
        L.append("**Against this machine's limit** (the limit: a kernel streaming at the same-size in-place probe's "
                 "bandwidth, one read and one write per value):")
        L.append("")
        L.append("| Figure | Measured | Limit on this machine |")
        L.append("|---|---|---|")
        for t in results["limits"]:
            dev = f" [{t['device']}]" if len(results["devices"]) > 1 else ""
            L.append(f"| {t['figure']}{dev} | {t['value']} | {t['limit']} |")
        L.append("")
    return "\n".join(L)


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #


def parse_args(argv: Optional[Sequence[str]] = None):
    ap = argparse.ArgumentParser(prog="python -m bench.prox_table", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(ALL_MODELS),
                    help=f"comma-separated subset of {','.join(ALL_MODELS)} (default: all)")
    ap.add_argument("--quick", action="store_true", help=f"models {','.join(QUICK_MODELS)}, 2 repeats, 7 fast rounds")
    ap.add_argument("--input", choices=sorted(INPUTS), default="mnist", help="input shape (default mnist 1x28x28, as "
                                                                             "the paper)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="rounds for fwd+bwd and the eager prox (default 3)")
    ap.add_argument("--fast-rounds", type=int, default=15, help="round-robin rounds for the fast paths (default 15)")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                    help="torch and fedkernels threads (default 2; 0 = all cores)")
    ap.add_argument("--device", default="auto",
                    help="cpu, cuda, or auto (cpu, plus cuda when fedkernels can use a GPU)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (saves ~1 min of compiling)")
    ap.add_argument("--no-fused", action="store_true", help="skip the fused-update and call-overhead sections")
    ap.add_argument("--probe-mib", type=float, default=256.0, help="bandwidth probe buffer (default 256 MiB, >> L3)")
    ap.add_argument("--fused-numel", type=int, default=11_175_370, help="vector length for the fused updates "
                                                                        "(ResNet-18)")
    ap.add_argument("--overhead-numel", type=int, default=109_386, help="buffer for the call-overhead section (MLP)")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="statistic of the tables (min suits a machine shared with other jobs)")
    ap.add_argument("--out", default=os.path.join("bench", "results"), help="output folder (default bench/results)")
    ap.add_argument("--readme", default=None, help="also replace the table block in this markdown file")
    ap.add_argument("--from-json", default=None, metavar="JSON",
                    help="measure nothing: re-render the tables (and --readme) from a prox_table.json")
    args = ap.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    args.command = " ".join(["python -m bench.prox_table", *(shlex.quote(a) for a in given)])
    if args.quick:
        args.models = ",".join(QUICK_MODELS) if args.models == ",".join(ALL_MODELS) else args.models
        args.repeats = min(args.repeats, 2)
        args.fast_rounds = min(args.fast_rounds, 7)
    args.models = [m.strip().lower() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.models if m not in DISPLAY]
    if bad:
        ap.error(f"unknown model(s) {bad}; choose from {','.join(ALL_MODELS)}")
    if args.device == "auto":
        args.devices = ["cpu"] + (["cuda"] if fk.backend_info()["cuda_available"] and torch.cuda.is_available() else [])
    else:
        args.devices = [d.strip() for d in args.device.split(",")]
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        results["limits"] = evaluate_limits(results)
    else:
        results = run(args, log=lambda s: print(s, flush=True))
    md = render_markdown(results)
    os.makedirs(args.out, exist_ok=True)
    md_path = os.path.join(args.out, "prox_table.md")
    json_path = os.path.join(args.out, "prox_table.json")
    with open(md_path, "w") as f:
        f.write("# Prox timing table (FedCanon Table I) on this machine\n\n" + md + "\n")
    if os.path.abspath(json_path) != os.path.abspath(args.from_json or ""):
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1, default=str)
    if args.readme:
        update_readme(args.readme, md, README_BEGIN, README_END)
    print()
    print(md)
    print(f"\nwrote {md_path} and {json_path}" + (f"; updated {args.readme}" if args.readme else ""))
    return results


if __name__ == "__main__":
    main()
