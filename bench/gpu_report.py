"""The markdown report of ``python -m bench.gpu_check``, rendered from the JSON its steps leave.

    python -m bench.gpu_report bench/results/gpu_check          # re-render gpu_check.md from the parts
    python -m bench.gpu_report bench/results/gpu_check --readme docs/performance.md   # and publish it there

Each step (machine, build, tests, sanitizer, roofline, clients, distributed) writes ``<parts>/<step>.json``; the
report shows every part present, so steps run by separate commands (``--steps``) end up in one
report. The targets are those of the GPU issue: every prox and fused op at >= 85 % of the copy
bandwidth on ResNet-sized buffers, the batched executor >= 30x the sequential one (100 MLP clients),
and pfl-research's CIFAR-10 benchmark configuration in client updates per second (a number to publish).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

STEPS = ("build", "tests", "sanitizer", "roofline", "clients", "distributed")
TITLES = {"build": "Build", "tests": "CUDA tests", "sanitizer": "compute-sanitizer", "roofline": "Roofline",
          "clients": "Client executors", "distributed": "torchrun on the GPU(s)"}
ROOFLINE_TARGET = 85.0  # % of the same-size copy
SPEEDUP_TARGET = 30.0
DISPLAY = {"resnet18": "ResNet-18", "resnet34": "ResNet-34", "resnet50": "ResNet-50", "resnet101": "ResNet-101",
           "mlp": "MLP", "cnn": "CNN", "linear": "Linear"}


def load_parts(parts: Path) -> dict:
    out = {}
    for name in ("machine",) + STEPS:
        p = parts / f"{name}.json"
        if p.exists():
            with open(p) as f:
                out[name] = json.load(f)
    return out


def _t(seconds) -> str:
    if seconds is None:
        return "–"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.1f} s"


def _us(s) -> str:
    us = s * 1e6
    return f"{us:.0f}" if us >= 100 else f"{us:.1f}"


def _ms(s) -> str:
    ms = s * 1e3
    return f"{ms:.2f}" if ms >= 1 else f"{ms:.3f}"


def _model(m) -> str:
    return DISPLAY.get(m, m)


def roofline_worst(roof: dict, large: bool = False) -> Optional[tuple]:
    """(pct, op, model, dtype) of the op furthest below the same-size copy bandwidth (``large``: below
    the large-buffer copy's)."""
    worst = None
    for r in roof.get("results", []):
        for name, o in r["ops"].items():
            pct = 100 * o["gbps"] / roof["hbm_copy"]["gbps"] if large else o["pct_of_copy"]
            if worst is None or pct < worst[0]:
                worst = (pct, name, r["model"], r["dtype"])
    return worst


def targets(parts: dict) -> List[tuple]:
    rows = []
    roof = parts.get("roofline", {}).get("result")
    if roof:
        same_size = roofline_worst(roof)
        resnet = all(r["model"].startswith("resnet") for r in roof.get("results", []))
        note = "" if resnet else " (not ResNet sizes: smoke run)"
        for w, what in ((same_size, "the same-size copy"), (roofline_worst(roof, large=True), "the large (HBM) copy")):
            if w:
                rows.append((f"every prox and fused op >= {ROOFLINE_TARGET:.0f} % of {what}'s bandwidth{note}",
                             f"worst {w[0]:.1f} % ({w[1]}, {_model(w[2])}, {w[3]})",
                             "yes" if w[0] >= ROOFLINE_TARGET else "**no**"))
    cl = parts.get("clients", {}).get("result")
    if cl:
        if "speedup" in cl:
            rows.append((f"batched executor >= {SPEEDUP_TARGET:.0f}x sequential ({cl['clients']} MLP clients, FedAvg)",
                         f"{cl['speedup']:.1f}x", "yes" if cl["speedup"] >= SPEEDUP_TARGET else "**no**"))
        else:
            rows.append((f"batched executor >= {SPEEDUP_TARGET:.0f}x sequential", cl.get("skipped", "not measured"),
                         "–"))
        c10 = cl.get("cifar10")
        if c10:
            b = c10["best"]
            pfl = next((r for r in c10["rows"] if r["executor"].startswith("pfl")), None)
            vs = f"; pfl-research {pfl['client_updates_per_s']:.1f}" if pfl else ""
            rows.append(("pfl-research's CIFAR-10 configuration, client updates per second (no target: "
                         "the number to publish)", f"{b['client_updates_per_s']:.1f} (fedkernels {b['executor']}){vs}",
                         "–"))
    return rows


def _machine(m: dict) -> List[str]:
    lines = []
    gpu = m.get("gpus") or ["no GPU"]
    lines.append(f"GPU: {'; '.join(gpu)}")
    for key, label in (("nvcc", "nvcc"), ("compute_sanitizer", "compute-sanitizer"), ("torch", "torch"),
                       ("python", "Python"), ("cpu", "CPU")):
        if m.get(key):
            lines.append(f"{label}: {m[key]}")
    fk = m.get("fedkernels") or {}
    if fk:
        if "error" in fk:
            lines.append(f"fedkernels: {fk['error']}")
        else:
            lines.append(f"fedkernels: CUDA compiled {fk.get('cuda_compiled')} (archs "
                         f"{','.join(fk.get('cuda_archs') or []) or '–'}, "
                         f"runtime {fk.get('cuda_runtime')}), {fk.get('cuda_device_count')} device(s) usable"
                         + (f" ({fk.get('cuda_error')})" if not fk.get("cuda_available") else "")
                         + f"; CPU SIMD {fk.get('simd')}")
    return [f"* {line}" for line in lines]


def render(parts: dict) -> str:
    m = parts.get("machine", {})
    smoke = any(p.get("mode") == "cpu-smoke" for p in parts.values())
    out = ["# GPU check", ""]
    if smoke:
        out += ["**CPU smoke run**: the pipeline's pieces at tiny sizes on the CPU; no number below says "
                "anything about a GPU.", ""]
    out += [f"Written by `{m.get('command', 'python -m bench.gpu_check')}` on {m.get('date', '?')}.", ""]
    out += _machine(m) + [""]

    out += ["## Summary", "", "| step | status | time | result |", "|---|---|---:|---|"]
    for s in STEPS:
        p = parts.get(s)
        if p:
            out.append(f"| {TITLES[s]} | {p['status']} | {_t(p.get('seconds'))} | {p.get('summary', '')} |")
        else:
            out.append(f"| {TITLES[s]} | not run | – | – |")
    rows = targets(parts)
    if rows:
        out += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
        out += [f"| {a} | {b} | {c} |" for a, b, c in rows]

    roof = parts.get("roofline", {}).get("result")
    if roof:
        out += _roofline(roof)
    cl = parts.get("clients", {}).get("result")
    if cl:
        out += _clients(cl)
    for s in ("tests", "sanitizer", "build"):
        p = parts.get(s)
        if p and p.get("details"):
            out += ["", f"## {TITLES[s]}: details", ""] + p["details"]
    return "\n".join(out) + "\n"


def _roofline(roof: dict) -> List[str]:
    hbm = roof["hbm_copy"]
    out = ["", "## Ops against the copy bandwidth", "",
           f"Device {roof.get('device_name', roof['device'])}. Copy of {hbm['buffers_mib']:.0f} MiB (src + dst, beyond "
           f"L2): **{hbm['gbps']:.0f} GB/s** read + write (best round {hbm['gbps_best']:.0f}). Each op runs on one "
           f"flat vector of the model's parameter count (input {'x'.join(map(str, roof['input']))}), every operand "
           f"full-sized; GB/s counts every vector read and written. Median of {roof['rounds']} round-robin samples, "
           + ("CUDA events around a CUDA graph of back-to-back calls (eager: the same calls launched from Python)."
              if roof["device"].startswith("cuda") else "time.perf_counter around back-to-back calls (CPU).")
           + " A same-size copy whose source and destination fit in L2 together (ResNet-18 in bfloat16 is "
           "2 x 22 MB; an H100 has 50 MB of L2) can beat HBM speed, while ops touching more vectors cannot "
           "stay in L2: read the large-copy column for those."]
    for r in roof["results"]:
        c = r["copy"]
        out += ["", f"**{_model(r['model'])}** ({r['params']:,} parameters), {r['dtype']}: same-size copy "
                f"{c['gbps']:.0f} GB/s ({_us(c['median_s'])} us)", "",
                "| op | vectors r+w | us (graph) | us (eager) | GB/s | % of same-size copy | % of large copy |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for name, o in r["ops"].items():
            mode = "" if o["mode"] in ("graph", "cpu") else " (eager: capture failed)"
            out.append(f"| {name}{mode} | {o['accesses']} | {_us(o['median_s'])} | {_us(o['eager_median_s'])} | "
                       f"{o['gbps']:.0f} | {o['pct_of_copy']:.1f} % | {100 * o['gbps'] / hbm['gbps']:.1f} % |")
        errs = {o.get("capture_error") for o in r["ops"].values() if o.get("capture_error")}
        for e in errs:
            out.append(f"\nGraph capture failed: `{e}`")
    if roof.get("table"):
        out += ["", "## Prox time vs one forward+backward pass (FedCanon Table I, GPU rows)", "",
                f"float32, batch {roof['batch']}, input {'x'.join(map(str, roof['input']))}; fk prox = `fk.raw.prox_` "
                "on the flat buffer (graph-timed), ms (x forward+backward).", "",
                "| model | params | fwd+bwd (ms) | fk L1 | fk MCP | fk SCAD | SCAD GB/s (% of same-size copy) |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for row in roof["table"]:
            fb = row["fwd_bwd"]["median_s"] if row.get("fwd_bwd") else None
            cells = []
            for k in ("l1", "mcp", "scad"):
                s = row["prox"][k]["median_s"]
                cells.append(f"{_ms(s)}" + (f" ({s / fb:.3f}x)" if fb else ""))
            sc = row["prox"]["scad"]
            out.append(f"| {_model(row['model'])} | {row['params'] / 1e6:.2f} M | {_ms(fb) if fb else '–'} | "
                       + " | ".join(cells) + f" | {sc['gbps']:.0f} ({sc['pct_of_copy']:.0f} %) |")
    return out


def _clients(cl: dict) -> List[str]:
    out = ["", "## Client executors", "",
           f"FedAvg, {cl['clients']} clients x {cl['samples']} samples, MLP ({cl['params']:,} parameters), K = "
           f"{cl['local_steps']}, batch {cl['batch']}, {cl['rounds']} timed rounds after one warm-up, on "
           f"{cl['device']}.", "",
           "| executor | s/round | × sequential speed | final model vs sequential (max abs diff) |",
           "|---|---:|---:|---:|"]
    seq = cl["rows"][0]["s_per_round"]
    for r in cl["rows"]:
        diff = f"{r['max_abs_diff']:.2e}" if "max_abs_diff" in r else "–"
        out.append(f"| {r['executor']} | {r['s_per_round']:.4f} | {seq / r['s_per_round']:.1f}x | {diff} |")
    out += ["", "Same cohorts and minibatches in every row: the final models differ by summation order only. "
            "Plain loop: `copy.deepcopy(model)` + `torch.optim.SGD` per client."]
    if cl.get("skipped"):
        out += ["", cl["skipped"]]
    c10 = cl.get("cifar10")
    if c10:
        out += ["", "## pfl-research's CIFAR-10 benchmark configuration", "",
                f"FedAvg, {c10['description']}, {c10['rounds']} timed rounds after one warm-up, on {cl['device']} "
                "(synthetic images of CIFAR-10's shape; the CNN's dropout masks differ between rows).", "",
                "| executor | s/round | client updates / s |", "|---|---:|---:|"]
        for r in c10["rows"]:
            out.append(f"| {r['executor']} | {r['s_per_round']:.4f} | {r['client_updates_per_s']:.1f} |")
        for r in c10.get("failed", []):
            out.append(f"| {r['executor']} | failed: {r['failure']} | – |")
        if c10.get("pfl") not in (None, "measured") and not c10.get("failed"):
            out += ["", f"pfl-research: {c10['pfl']}."]
    return out


README_BLOCK = "gpu-check"  # the block of docs/performance.md that --readme rewrites


def demote_headings(md: str, levels: int) -> str:
    """``md`` with every heading ``levels`` deeper (``#`` -> ``###``), code blocks left alone: the
    report as a section of a longer page."""
    out, fenced = [], False
    for line in md.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out)


def not_publishable(parts: dict) -> Optional[str]:
    """Why these parts must not go into the docs, or None: a CPU smoke run, or no GPU in the machine part."""
    if not parts:
        return "no parts of a gpu_check run"
    if any(p.get("mode") == "cpu-smoke" for p in parts.values()):
        return "they are a --cpu-smoke run, whose numbers say nothing about a GPU"
    if not parts.get("machine", {}).get("gpus"):
        return "their machine part names no GPU"
    return None


def publish_readme(parts: dict, readme: str) -> None:
    """Replace the ``gpu-check`` block of ``readme`` with the report (headings two levels deeper).
    Refuses (ValueError, ``readme`` untouched) parts that are not a GPU run's."""
    why = not_publishable(parts)
    if why:
        raise ValueError(f"--readme {readme}: not writing these results into the docs: {why}")
    from .readme_block import markers, update_readme

    update_readme(readme, demote_headings(render(parts), 2), *markers(README_BLOCK))


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.gpu_report",
                                 description="Re-render a gpu_check report (PARTS_DIR.md) from its parts.")
    ap.add_argument("parts", help="the folder of a gpu_check run's parts (the report's path without .md)")
    ap.add_argument("--readme", help="also replace the gpu-check block of this file (docs/performance.md) with "
                    "the report; refused for a --cpu-smoke run")
    args = ap.parse_args(argv)
    parts = Path(args.parts)
    if not parts.is_dir():
        print(f"gpu_report: {parts} is not a folder of gpu_check parts", file=sys.stderr)
        return 2
    if args.readme and not Path(args.readme).is_file():
        print(f"gpu_report: --readme {args.readme}: no such file", file=sys.stderr)
        return 2
    loaded = load_parts(parts)
    if args.readme:
        try:
            publish_readme(loaded, args.readme)
        except ValueError as e:
            print(f"gpu_report: {e}", file=sys.stderr)
            return 2
        print(f"updated the {README_BLOCK} block of {args.readme}")
    md = parts.with_suffix(".md")
    md.write_text(render(loaded))
    print(f"wrote {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
