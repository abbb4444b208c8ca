"""The Python API against the command line on the same workloads (issue 38 item 3): the README's
federated quick-start block and the own-algorithm tutorial's comparison block, each pasted into a
fresh interpreter as a reader runs it, side by side with the command that runs a problem of the same
size, model, algorithm, rounds and executor through ``python -m python_algos``. Wall seconds of the
whole process (interpreter start and imports included, for both), the ratio API / CLI, and the
blocks once more with ``simulate(threads=None)`` (torch's default thread count: how they ran before
``simulate`` took the command line's thread rule). ``uptime`` before and after says how loaded the
machine was.

    python -m bench.api_speed                # each process once (~1 min idle; minutes on a loaded machine)
    python -m bench.api_speed --repeats 3    # the median of 3
    python -m bench.api_speed --no-old       # without the threads=None rows (the slow ones when loaded)

The command-line twins use built-in generated data of the blocks' shapes (the blocks draw random
tensors in Python, which no flag reproduces): README: FedCanon (alpha 0.1, beta 0.01, K = 10), an
MLP 20-16-C, 5 clients of ~50 samples, 30 rounds, L1 1e-3; tutorial: ProxFedAvgM and FedMiD (lr 0.05,
K = 5), a linear model 10-2, 8 clients of 60 samples, batch 16, 10 rounds, L1 1e-3, 3 seeds. Both sides
run the sequential executor (simulate's default) and draw no figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests._doc_blocks import blocks, read  # noqa: E402  (the doc tests' reader: the blocks as a reader pastes them)

OLD = "import functools, python_algos\npython_algos.simulate = functools.partial(python_algos.simulate, threads=None)\n"
CLI = [sys.executable, "-m", "python_algos"]
COMMON = ["--executor", "sequential", "--no-plot", "--no-progress", "--reg", "l1", "--reg-strength", "1e-3"]


def _block(page: str, needle: str) -> str:
    """The ```python block of ``page`` that contains ``needle``."""
    found = [code for _, _, code, _ in blocks(read(os.path.join(ROOT, page)), "python", page) if needle in code]
    if len(found) != 1:
        raise SystemExit(f"{page}: expected one python block containing {needle!r}, found {len(found)}")
    return found[0]


def workloads() -> list:
    """(name, setup script, API script, CLI argv) of each workload; the setup runs before both, untimed."""
    readme = _block("README.md", "pa.simulate(alg, model, loss_fn, clients, rounds=30")
    module = _block("docs/own-algorithm.md", 'pathlib.Path("prox_fedavgm.py")')  # writes prox_fedavgm.py
    tutorial = "from prox_fedavgm import ProxFedAvgM\n" + _block("docs/own-algorithm.md", "def final_objective(")
    readme_cli = [*CLI, "run", "-a", "fedcanon", "--alg-opt", "alpha=0.1", "--alg-opt", "beta=0.01", "-K", "10",
                  "--dataset", "synthetic", "--data-opt", "num_clients=5", "--data-opt", "dim=20",
                  "--data-opt", "num_classes=3", "--data-opt", "samples=63", "--partition", "natural", "-N", "5",
                  "--model", "mlp", "--model-opt", "hidden=[16]", "-T", "30", *COMMON]
    tutorial_cli = [*CLI, "compare", "-a", "prox_fedavgm:ProxFedAvgM", "fedmid", "--lr", "0.05", "-K", "5", "-B", "16",
                    "-T", "10", "--seeds", "3", "--dataset", "sparse_logistic", "--data-opt", "n=600",
                    "--data-opt", "dim=10", "-N", "8", "--model", "linear", *COMMON]
    return [("README federated quick start", "", readme, readme_cli),
            ("own-algorithm comparison (2 algorithms x 3 seeds)", module, tutorial, tutorial_cli)]


def _timed(argv: list, cwd: str, env: dict) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(argv)}\n{p.stderr[-3000:]}")
    return seconds


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=1, help="processes per cell; the median is shown (default 1)")
    ap.add_argument("--no-old", action="store_true", help="leave out the simulate(threads=None) rows")
    args = ap.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the thread rule's first case: not wanted
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["MPLBACKEND"] = "Agg"
    before = _uptime()
    rows = []
    for name, setup, script, cli in workloads():
        cells = {}
        for label, argv in (("cli", cli), ("api", [sys.executable, "-c", script]),
                            *(() if args.no_old else (("old", [sys.executable, "-c", OLD + script]),))):
            times = []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as work:  # a fresh folder, as a reader's: results/ lands there
                    if setup:
                        subprocess.run([sys.executable, "-c", setup], cwd=work, env=env, check=True)
                    times.append(_timed(argv, work, env))
            cells[label] = statistics.median(times)
        rows.append((name, cells))
        print(f"{name}: " + ", ".join(f"{k} {v:.2f} s" for k, v in cells.items()), flush=True)
    after = _uptime()
    print()
    print("| workload | CLI (s) | simulate (s) | simulate / CLI |"
          + ("" if args.no_old else " simulate, threads=None (s) | threads=None / CLI |"))
    print("|---|---:|---:|---:|" + ("" if args.no_old else "---:|---:|"))
    for name, c in rows:
        line = f"| {name} | {c['cli']:.2f} | {c['api']:.2f} | {c['api'] / c['cli']:.2f} |"
        if "old" in c:
            line += f" {c['old']:.2f} | {c['old'] / c['cli']:.2f} |"
        print(line)
    import torch

    print(f"\n{os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), torch {torch.__version__} "
          f"(default threads {torch.get_num_threads()}); median of {args.repeats} process(es) per cell; "
          f"`uptime` before: {before}; after: {after}. `python -m bench.api_speed`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
