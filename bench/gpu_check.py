"""One command for a GPU machine with a checkout: build, CUDA tests, sanitizer, bandwidth, clients.

    python -m bench.gpu_check                          # everything; report in bench/results/gpu_check.md
    python -m bench.gpu_check --no-build               # fedkernels already installed with CUDA
    python -m bench.gpu_check --steps roofline,clients --out /tmp/gpu.md
    python -m bench.gpu_check --cpu-smoke --out /tmp/smoke.md   # the pipeline at tiny sizes, no GPU
    python -m bench.gpu_check --no-build --steps clients --readme docs/performance.md   # publish the report there

Steps (``--steps``, default all, in this order):

1. **build**: ``FEDKERNELS_REQUIRE_CUDA=1 pip install --no-build-isolation --no-deps .`` into this
   interpreter (or a venv made with ``--venv DIR``, which sees this interpreter's packages), for the
   GPU's own architecture (``--all-archs``: the project's default list), then checks that the
   installed fedkernels was compiled with CUDA and sees the GPU. Needs scikit-build-core and
   pybind11 installed (no network is used).
2. **tests**: ``pytest -m cuda tests/`` with ``FK_REQUIRE_CUDA_TESTS=1`` (a skipped-for-no-GPU
   test counts as a failure).
3. **sanitizer**: ``compute-sanitizer`` with memcheck, racecheck and synccheck over
   ``python -m bench.gpu_workload --check`` (every kernel, every dtype; memcheck adds a vector longer
   than one grid pass).
4. **roofline**: ``python -m bench.gpu_roofline``: every prox and fused op on ResNet-18 and
   ResNet-101-sized float32 and bfloat16 vectors against the device-to-device copy bandwidth of the
   same run; forward+backward vs prox for ResNet-18/34/50/101.
5. **clients**: ``python -m bench.gpu_clients``: 100 MLP clients, FedAvg, s/round of the batched
   executor against the sequential one and a plain PyTorch loop (the batched row is skipped if
   ``python_algos.clients.EXECUTORS`` has no "batched"); and pfl-research's CIFAR-10 benchmark
   configuration (its 1.63 M-parameter CNN, 50 of 1,000 clients x 50 images per round, one local
   epoch of batch 10) in client updates per second.

Each step writes ``<out without .md>/<step>.json`` (and its logs) and the report is rendered from
every part present, so steps run by separate commands land in one report. Exit status: 0 if every
step run now passed, 1 if one failed, 2 if no CUDA GPU is visible (nothing is run). Missed speed
targets are reported, not failures. ``--cpu-smoke`` (alias ``--dry-run``) runs the pipeline's
pieces on the CPU at tiny sizes (no build, no sanitizer; pytest only collects the CUDA tests), so
tests can check it does not rot.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import List, Optional, Sequence

from . import gpu_report

ROOT = Path(__file__).resolve().parent.parent
STEPS = gpu_report.STEPS
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
NO_GPU = ("python -m bench.gpu_check needs a CUDA GPU visible to torch, and none is ({why}). Run it on a "
          "GPU machine, or use --cpu-smoke to exercise the pipeline on the CPU at tiny sizes.")


class Context:
    def __init__(self, args, python: str, parts: Path):
        self.args, self.python, self.parts = args, python, parts
        self.smoke = bool(args.cpu_smoke)
        self.mode = "cpu-smoke" if self.smoke else "gpu"

    def log(self, msg: str) -> None:
        print(f"[gpu_check] {msg}", flush=True)


def _run(cmd: Sequence[str], log_path: Path, *, env=None, timeout: float = 900, cwd=ROOT) -> tuple:
    """Run ``cmd``, its output to ``log_path``; returns (exit code or None on timeout, seconds, output)."""
    t0 = time.perf_counter()
    full_env = dict(os.environ, **(env or {}))
    try:
        p = subprocess.run(list(cmd), cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
        rc, text = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        rc = None
        text = (e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")) + \
            f"\n[gpu_check] timed out after {timeout:.0f} s"
    log_path.write_text(f"$ {shlex.join(cmd)}\n{text}")
    return rc, time.perf_counter() - t0, text


def _tail(text: str, n: int = 30) -> List[str]:
    lines = text.rstrip().splitlines()[-n:]
    return ["```"] + lines + ["```"]


def _version(cmd: Sequence[str]) -> Optional[str]:
    try:
        p = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
    if p.returncode != 0 or not lines:
        return None
    return next((ln for ln in lines if "release" in ln.lower() or "version" in ln.lower()), lines[-1])


def find_sanitizer() -> Optional[str]:
    """compute-sanitizer on PATH, next to nvcc, or in a CUDA toolkit folder."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    dirs = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs += [os.path.join(os.environ[var], "bin"), os.path.join(os.environ[var], "compute-sanitizer")]
    nvcc = shutil.which("nvcc") or os.environ.get("CUDACXX")
    if nvcc:
        real = os.path.dirname(os.path.realpath(nvcc))
        dirs += [real, os.path.join(os.path.dirname(real), "compute-sanitizer")]
    for base in sorted(glob.glob("/usr/local/cuda*"), reverse=True) + ["/opt/cuda", "/usr/lib/nvidia-cuda-toolkit"]:
        dirs += [os.path.join(base, "bin"), os.path.join(base, "compute-sanitizer")]
    for d in dirs:
        p = os.path.join(d, "compute-sanitizer")
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _fk_info(python: str, smoke: bool) -> dict:
    """fedkernels.backend_info() as the installed package reports it (run outside the checkout)."""
    code = "import json, fedkernels; print(json.dumps(fedkernels.backend_info()))"
    if smoke:
        import fedkernels

        return fedkernels.backend_info()
    try:
        p = subprocess.run([python, "-c", code], cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": repr(e)}
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["import failed"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- #
# Steps: each returns {"status": pass|fail|skip, "summary": str, "details": [markdown lines], ...}
# --------------------------------------------------------------------------- #


def step_machine(ctx: Context) -> dict:
    import torch

    from .bandwidth import _cpu_model

    gpus = []
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            p = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,clocks.max.memory",
                                "--format=csv,noheader"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=60)
            gpus = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()] if p.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired):
            pass
    if not gpus and torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    sanitizer = find_sanitizer()
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python -m bench.gpu_check " + shlex.join(sys.argv[1:]),
        "gpus": gpus,
        "nvcc": _version([shutil.which("nvcc") or os.environ.get("CUDACXX") or "nvcc", "--version"]),
        "compute_sanitizer": (_version([sanitizer, "--version"]) if sanitizer else "not found"),
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda})",
        "python": f"{platform.python_version()} ({ctx.python})",
        "cpu": _cpu_model(),
        "fedkernels": _fk_info(ctx.python, ctx.smoke),
    }


def step_build(ctx: Context) -> dict:
    if ctx.smoke:
        return {"status": "skip", "summary": "not built (--cpu-smoke)"}
    import torch

    env = {"FEDKERNELS_REQUIRE_CUDA": "1"}
    if not ctx.args.all_archs and "CUDAARCHS" not in os.environ:
        major, minor = torch.cuda.get_device_capability()
        env["CUDAARCHS"] = f"{major}{minor}"
    cmd = [ctx.python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-v", "."]
    ctx.log(f"build: {' '.join(f'{k}={v}' for k, v in env.items())} {shlex.join(cmd)}")
    rc, secs, text = _run(cmd, ctx.parts / "build.log", env=env, timeout=ctx.args.timeout)
    res = {"seconds": secs, "env": env, "command": shlex.join(cmd)}
    if rc != 0:
        hint = ""
        if re.search(r"No module named .?(scikit_build_core|pybind11)|Could not find a version", text):
            hint = " (scikit-build-core and pybind11 must be installed: the build runs without isolation, offline)"
        elif "externally-managed-environment" in text:
            hint = " (this Python refuses pip installs: use --venv DIR)"
        return dict(res, status="fail", summary=f"pip install failed (exit {rc}){hint}; log build.log",
                    details=_tail(text))
    info = _fk_info(ctx.python, False)
    res["fedkernels"] = info
    if "error" in info or not info.get("cuda_compiled") or not info.get("cuda_available"):
        why = info.get("error") or ("built without CUDA" if not info.get("cuda_compiled") else info.get("cuda_error"))
        return dict(res, status="fail", summary=f"installed, but fedkernels cannot use the GPU: {why}",
                    details=_tail(text))
    return dict(res, status="pass", summary=f"installed with CUDA (archs {','.join(info['cuda_archs'])}, "
                                            f"runtime {info['cuda_runtime']}, {info['cuda_device_count']} device(s))")


def _junit(path: Path) -> dict:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    if not path.exists():
        return {"counts": counts, "failures": failures}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds or "error" in kinds:
            counts["failed" if "failure" in kinds else "errors"] += 1
            child = case.find("failure") if "failure" in kinds else case.find("error")
            msg = (child.get("message") or "").strip().splitlines()
            failures.append(f"{name}: {msg[0][:300] if msg else ''}")
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {"counts": counts, "failures": failures}


def step_tests(ctx: Context) -> dict:
    xml = ctx.parts / "tests.xml"
    if xml.exists():
        xml.unlink()
    if ctx.smoke:  # collection only: the CUDA tests import and parametrize cleanly
        cmd = [ctx.python, "-m", "pytest", "-q", "-m", "cuda", "--collect-only", "-p", "no:cacheprovider",
               "tests/test_cuda.py"]
        env = {}
    else:
        # only the files that carry CUDA tests: collecting the others needs their optional packages
        files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                       if "mark.cuda" in p.read_text())
        cmd = [ctx.python, "-m", "pytest", "-m", "cuda", "-q", "-rfE", "-p", "no:cacheprovider",
               f"--junitxml={xml}", *files]
        env = {"FK_REQUIRE_CUDA_TESTS": "1"}
    ctx.log(f"tests: {shlex.join(cmd)}")
    rc, secs, text = _run(cmd, ctx.parts / "tests.log", env=env, timeout=ctx.args.timeout)
    if ctx.smoke:
        m = re.search(r"(\d+)(?:/\d+)? tests? collected", text)
        ok = rc == 0 and m is not None and int(m.group(1)) > 0
        return {"status": "pass" if ok else "fail", "seconds": secs,
                "summary": (f"{m.group(1)} CUDA tests collected (not run: --cpu-smoke)" if m else
                            f"collection failed (exit {rc}); log tests.log"),
                "details": [] if ok else _tail(text)}
    j = _junit(xml)
    c = j["counts"]
    summary = ", ".join(f"{v} {k}" for k, v in c.items() if v) or "no tests ran"
    ok = rc == 0 and c["failed"] == 0 and c["errors"] == 0 and c["passed"] > 0
    details = []
    if j["failures"]:
        details = [f"* `{f}`" for f in j["failures"][:60]]
        if len(j["failures"]) > 60:
            details.append(f"* ... and {len(j['failures']) - 60} more (tests.log)")
    elif not ok:
        details = _tail(text)
    return {"status": "pass" if ok else "fail", "seconds": secs, "counts": c, "summary": summary + "; log tests.log",
            "details": details}


def _sanitizer_errors(text: str) -> Optional[int]:
    m = re.search(r"ERROR SUMMARY:\s*(\d+)\s+error", text)
    if m:
        return int(m.group(1))
    m = re.search(r"RACECHECK SUMMARY:\s*(\d+)\s+hazard", text)
    return int(m.group(1)) if m else None


def step_sanitizer(ctx: Context) -> dict:
    tools = [t for t in ctx.args.sanitizer_tools.split(",") if t]
    if ctx.smoke:
        from . import gpu_workload

        r = gpu_workload.run("cpu", check=True, dtypes=("float32", "bfloat16"), shapes=[(1,), (257,), (3, 129)],
                             log=ctx.log)
        ok = not r["mismatches"]
        return {"status": "pass" if ok else "fail", "seconds": r["seconds"],
                "summary": f"no sanitizer (--cpu-smoke); the workload ran on the CPU: {r['calls']} calls of "
                           f"{len(r['ops'])} ops, {len(r['mismatches'])} mismatches", "ops": r["ops"]}
    exe = find_sanitizer()
    if exe is None:
        return {"status": "fail", "summary": "compute-sanitizer not found (PATH, next to nvcc, /usr/local/cuda*/bin)"}
    t0 = time.perf_counter()
    per_tool, details, ok = {}, [], True
    for tool in tools:
        # memcheck: every dtype and a vector longer than one grid pass. racecheck / synccheck only
        # concern shared memory and barriers (the row reduction, whose shared buffer is float64
        # whatever the dtype): float32 keeps their much slower instrumentation short.
        extra = ["--large"] if tool == "memcheck" else ["--dtypes", "float32"]
        cmd = [exe, "--tool", tool, "--error-exitcode", "86", "--print-limit", "20",
               ctx.python, "-m", "bench.gpu_workload", "--device", "cuda", "--check", *extra]
        ctx.log(f"sanitizer: {shlex.join(cmd)}")
        rc, secs, text = _run(cmd, ctx.parts / f"sanitizer_{tool}.log", timeout=ctx.args.timeout)
        errors = _sanitizer_errors(text)
        passed = rc == 0 and errors == 0
        ok &= passed
        work = re.search(r"gpu_workload: .*", text)
        per_tool[tool] = {"exit": rc, "errors": errors, "seconds": secs, "passed": passed}
        details += [f"**{tool}**: exit {rc}, {errors if errors is not None else '?'} errors, {secs:.0f} s"
                    + (f"; {work.group(0)}" if work else "")]
        if not passed:
            details += _tail(text, 40)
        details.append("")
    summary = ", ".join(f"{t} {v['errors'] if v['errors'] is not None else '?'} errors" for t, v in per_tool.items())
    return {"status": "pass" if ok else "fail", "seconds": time.perf_counter() - t0, "tools": per_tool,
            "summary": summary + "; logs sanitizer_*.log", "details": details}


def step_roofline(ctx: Context) -> dict:
    a = ctx.args
    if ctx.smoke:
        from . import gpu_roofline

        t0 = time.perf_counter()
        res = gpu_roofline.run(device="cpu", models=("linear",), table_models=("linear",),
                               dtypes=("float32", "bfloat16"), rounds=1, hbm_mib=1, sample_ms=0.1, log=ctx.log)
        secs = time.perf_counter() - t0
    else:
        out = ctx.parts / "roofline_raw.json"
        cmd = [ctx.python, "-m", "bench.gpu_roofline", "--models", a.models, "--table-models", a.table_models,
               "--dtypes", a.dtypes, "--rounds", str(a.rounds), "--json", str(out)]
        ctx.log(f"roofline: {shlex.join(cmd)}")
        rc, secs, text = _run(cmd, ctx.parts / "roofline.log", timeout=a.timeout)
        if rc != 0 or not out.exists():
            return {"status": "fail", "seconds": secs, "summary": f"failed (exit {rc}); log roofline.log",
                    "details": _tail(text)}
        res = json.loads(out.read_text())
    w = gpu_report.roofline_worst(res)
    summary = f"large copy {res['hbm_copy']['gbps']:.0f} GB/s" + (
        f"; worst op {w[0]:.1f} % of the same-size copy ({w[1]}, {gpu_report._model(w[2])} {w[3]})" if w else "")
    return {"status": "pass", "seconds": secs, "summary": summary, "result": res}


def step_clients(ctx: Context) -> dict:
    a = ctx.args
    if ctx.smoke:
        from . import gpu_clients

        t0 = time.perf_counter()
        res = gpu_clients.run(device="cpu", clients=3, samples=8, rounds=1, local_steps=1, batch=4,
                              cifar10=gpu_clients.cifar10_workload(2), pfl=False, log=ctx.log)
        secs = time.perf_counter() - t0
    else:
        out = ctx.parts / "clients_raw.json"
        cmd = [ctx.python, "-m", "bench.gpu_clients", "--clients", str(a.clients), "--json", str(out)]
        ctx.log(f"clients: {shlex.join(cmd)}")
        rc, secs, text = _run(cmd, ctx.parts / "clients.log", timeout=a.timeout)
        if rc != 0 or not out.exists():
            return {"status": "fail", "seconds": secs, "summary": f"failed (exit {rc}); log clients.log",
                    "details": _tail(text)}
        res = json.loads(out.read_text())
    if "speedup" in res:
        summary = (f"batched {res['rows'][1]['s_per_round']:.4f} s/round, sequential "
                   f"{res['rows'][0]['s_per_round']:.4f} s/round: {res['speedup']:.1f}x")
    else:
        summary = f"sequential {res['rows'][0]['s_per_round']:.4f} s/round; batched: {res['skipped']}"
    if "cifar10" in res:
        best = res["cifar10"]["best"]
        summary += f"; CIFAR-10 configuration {best['client_updates_per_s']:.1f} client updates/s ({best['executor']})"
    return {"status": "pass", "seconds": secs, "summary": summary, "result": res}


# A small float64 run of the command line: one process vs the same run under torchrun.
DIST_RUN = ["run", "--dataset", "synthetic", "-N", "8", "--model", "mlp", "--model-opt", "hidden=[16]", "--dtype",
            "float64", "-a", "fedcanon", "-B", "8", "--lr", "0.05", "-K", "2", "-T", "4", "--checkpoint-every", "2",
            "--executor", "sequential", "--no-progress", "--no-plot"]


def step_distributed(ctx: Context) -> dict:
    """The command line under torchrun on the GPU(s): NCCL, the GPU of LOCAL_RANK, sharded
    checkpoints. Its final model must equal the one-process run's (float64, 1e-12 relative). One
    rank per GPU (NCCL refuses two ranks on one GPU), 2 at most; the CPU smoke uses 2 gloo ranks."""
    import torch

    from python_algos.runfolder.records import MODEL, SUMMARY  # here: the package is built by an earlier step

    device = "cpu" if ctx.smoke else "cuda"
    procs = 2 if ctx.smoke else max(1, min(2, torch.cuda.device_count()))
    runs = {"one": ctx.parts / "distributed_one", "ranks": ctx.parts / "distributed_ranks"}
    for d in runs.values():
        shutil.rmtree(d, ignore_errors=True)
    args = [*DIST_RUN, "--device", device]
    cmds = {"one": [ctx.python, "-m", "python_algos", *args, "--out", str(runs["one"])],
            "ranks": [ctx.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs),
                      "-m", "python_algos", *args, "--out", str(runs["ranks"])]}
    secs = 0.0
    for name, cmd in cmds.items():
        ctx.log(f"distributed: {shlex.join(cmd)}")
        rc, t, text = _run(cmd, ctx.parts / f"distributed_{name}.log", timeout=ctx.args.timeout)
        secs += t
        if rc != 0:
            return {"status": "fail", "seconds": secs, "summary": f"{name}: exit {rc}; log distributed_{name}.log",
                    "details": _tail(text)}
    one, ranks = (torch.load(d / MODEL, weights_only=True)["params"] for d in (runs["one"], runs["ranks"]))
    rel = float((ranks - one).norm() / one.norm())
    summary_json = json.loads((runs["ranks"] / SUMMARY).read_text())
    ok = rel <= 1e-12 and summary_json.get("executor") == "distributed" and summary_json.get("world_size") == procs
    backend = "gloo" if ctx.smoke else "NCCL"
    return {"status": "pass" if ok else "fail", "seconds": secs, "procs": procs, "rel_dev": rel,
            "summary": f"{procs} rank(s) over {backend} on {device}: final model vs one process {rel:.1e} "
                       f"(float64, limit 1e-12); logs distributed_*.log"}


STEP_FUNCS = {"build": step_build, "tests": step_tests, "sanitizer": step_sanitizer, "roofline": step_roofline,
              "clients": step_clients, "distributed": step_distributed}


# --------------------------------------------------------------------------- #
# Driver
# --------------------------------------------------------------------------- #


def _python_for(args, log) -> str:
    if not args.venv:
        return sys.executable
    venv = Path(args.venv).resolve()
    py = venv / "bin" / "python"
    if not py.exists():
        log(f"creating venv {venv} (with this interpreter's packages: torch, pybind11, scikit-build-core)")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    return str(py)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/gpu_check.md", help="the report (default %(default)s); "
                    "parts and logs go to the folder of the same name without .md")
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated subset of " + ",".join(STEPS))
    ap.add_argument("--no-build", action="store_true", help="skip the build (fedkernels already installed with CUDA)")
    ap.add_argument("--venv", help="build into (and run everything with) a venv here, created if missing")
    ap.add_argument("--all-archs", action="store_true", help="build for the project's default GPU architectures, "
                    "not only this GPU's (slower)")
    ap.add_argument("--cpu-smoke", "--dry-run", dest="cpu_smoke", action="store_true",
                    help="no GPU needed: every step's pieces at tiny sizes on the CPU (for tests)")
    ap.add_argument("--sanitizer-tools", default=",".join(SANITIZER_TOOLS), help="default %(default)s")
    ap.add_argument("--models", default="resnet18,resnet101", help="model sizes for every op (default %(default)s)")
    ap.add_argument("--table-models", default="resnet18,resnet34,resnet50,resnet101",
                    help="models for the fwd+bwd vs prox rows (default %(default)s)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="default %(default)s")
    ap.add_argument("--rounds", type=int, default=20, help="timing rounds per op (default %(default)s)")
    ap.add_argument("--clients", type=int, default=100, help="clients of the executor comparison (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per subprocess (default %(default)s)")
    ap.add_argument("--readme", help="also write the report (every part present, earlier commands' too) into the "
                    "gpu-check block of this file, e.g. docs/performance.md; not with --cpu-smoke")
    args = ap.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        ap.error(f"--steps: unknown {bad}; choose from {','.join(STEPS)}")
    if args.no_build and "build" in steps:
        steps.remove("build")
    bad = [t for t in args.sanitizer_tools.split(",") if t and t not in SANITIZER_TOOLS + ("initcheck",)]
    if bad:
        ap.error(f"--sanitizer-tools: unknown {bad}; choose from {','.join(SANITIZER_TOOLS + ('initcheck',))}")
    if not args.out.endswith(".md"):
        ap.error(f"--out must name a .md file, got {args.out!r}")
    if args.readme and args.cpu_smoke:
        ap.error("--readme: a --cpu-smoke run's numbers say nothing about a GPU; they are never written into the docs")
    if args.readme and not os.path.isfile(args.readme):
        ap.error(f"--readme {args.readme}: no such file")
    if args.rounds < 1 or args.clients < 1 or args.timeout <= 0:
        ap.error("--rounds and --clients must be >= 1 and --timeout > 0")
    args.steps = [s for s in STEPS if s in steps]
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    log = Context(args, "", Path()).log
    if not args.cpu_smoke:
        import torch

        if not torch.cuda.is_available():
            why = "torch.cuda.is_available() is False"
            if torch.version.cuda is None:
                why += f"; torch {torch.__version__} is a CPU-only build"
            print(NO_GPU.format(why=why), file=sys.stderr)
            return 2
    out = Path(args.out)
    if not out.is_absolute():
        out = ROOT / out
    parts = out.with_suffix("")
    parts.mkdir(parents=True, exist_ok=True)
    ctx = Context(args, _python_for(args, log), parts)
    failed = []
    for step in args.steps:
        log(f"--- {step}")
        t0 = time.perf_counter()
        try:
            res = STEP_FUNCS[step](ctx)
        except Exception as e:  # noqa: BLE001 - a crashed step is reported; the next steps still run
            import traceback

            res = {"status": "fail", "summary": f"crashed: {type(e).__name__}: {e}",
                   "details": ["```"] + traceback.format_exc().splitlines()[-25:] + ["```"]}
        res.setdefault("seconds", time.perf_counter() - t0)
        res["mode"] = ctx.mode
        res["date"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        (parts / f"{step}.json").write_text(json.dumps(res, indent=1, default=str))
        log(f"{step}: {res['status']}: {res['summary']}")
        if res["status"] == "fail":
            failed.append(step)
    machine = step_machine(ctx)
    machine["mode"] = ctx.mode
    (parts / "machine.json").write_text(json.dumps(machine, indent=1, default=str))
    loaded = gpu_report.load_parts(parts)
    out.write_text(gpu_report.render(loaded))
    log(f"report: {out}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    if args.readme:
        try:
            gpu_report.publish_readme(loaded, args.readme)
            log(f"report written into the {gpu_report.README_BLOCK} block of {args.readme}")
        except ValueError as e:
            log(str(e))
            return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
