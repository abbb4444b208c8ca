"""The gathered linear kernels against the plain PyTorch path, per layer width o.

    python -m bench.gather_linear                       # o = 10, 64, 128; c = 40, P = 32, i = 784
    python -m bench.gather_linear --o 10 --rounds 100 --threads 2
    python -m bench.gather_linear --huge-pages          # the sample matrix on huge pages

One call is one local step of c clients of a batched executor, each with a minibatch of P rows of
a shared sample matrix X ([n, i] float32, n = 256,000 rows: 800 MB, far beyond the caches). Client
j of a call owns a block of 256 rows of X and draws its P rows at random in it; successive calls
take the next c blocks (1,000 blocks: a round of 25 calls), so every call reads its rows from DRAM.

fedkernels: ``fk.raw.linear_gathered`` (forward, ``W[j] @ X[idx[j]].T``) then
``fk.raw.linear_gathered_weight_grad`` (``D[j] @ X[idx[j]]``) on the same rows, read in place.
torch (the current path): ``torch.index_select`` of the c*P rows into a buffer, then
``torch.bmm(W, xb.transpose(1, 2))`` and ``torch.bmm(D, xb)``. Both write preallocated outputs.
The two are called in turn (which one goes first alternates), each on fresh rows, ``--rounds``
times; a cell is the median ms per call. ``speedup`` = torch total / fedkernels total.

The machine (CPU, caches, SIMD variant), its load before and after, and whether X sits on
transparent huge pages are printed above the table: random 3 KiB rows cost a TLB miss each on 4 KiB
pages, and torch allocates its CPU tensors on huge pages only with THP_MEM_ALLOC_ENABLE=1 (when the
system's setting is "madvise").
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Optional, Sequence

import torch

import fedkernels as fk

from .bandwidth import machine_info, machine_line

BLOCK = 256  # rows of X each client owns


def _huge_pages() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            system = f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        system = "unknown"
    env = os.environ.get("THP_MEM_ALLOC_ENABLE", "")
    return f"transparent huge pages: system '{system}', THP_MEM_ALLOC_ENABLE={env!r}"


def _draw(gen, call, c, P, blocks):
    """idx [c, P]: client j of this call draws P rows of its own block of BLOCK rows."""
    first = (torch.arange(c) + call * c) % blocks
    return (first[:, None] * BLOCK + torch.randint(0, BLOCK, (c, P), generator=gen)).contiguous()


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(o: int, X: torch.Tensor, c: int, P: int, rounds: int, seed: int = 0) -> dict:
    """Median ms per call of each part, fedkernels and torch called in turn on fresh rows."""
    i = X.shape[1]
    gen = torch.Generator().manual_seed(seed)
    W, D = torch.randn(c, o, i, generator=gen), torch.randn(c, o, P, generator=gen)
    out, grad, xb = torch.empty(c, o, P), torch.empty(c, o, i), torch.empty(c, P, i)
    blocks = X.shape[0] // BLOCK
    t = {k: [] for k in ("fk_fwd", "fk_grad", "gather", "bmm_fwd", "bmm_grad")}

    def fedkernels_step(idx):
        t["fk_fwd"].append(_time(lambda: fk.raw.linear_gathered(W, X, idx, out)))
        t["fk_grad"].append(_time(lambda: fk.raw.linear_gathered_weight_grad(D, X, idx, grad)))

    def torch_step(idx):
        t["gather"].append(_time(lambda: torch.index_select(X, 0, idx.view(-1), out=xb.view(-1, i))))
        t["bmm_fwd"].append(_time(lambda: torch.bmm(W, xb.transpose(1, 2), out=out)))
        t["bmm_grad"].append(_time(lambda: torch.bmm(D, xb, out=grad)))

    call = 0
    for r in range(rounds + 2):  # 2 warm-up rounds, not recorded
        steps = (fedkernels_step, torch_step) if r % 2 == 0 else (torch_step, fedkernels_step)
        for step in steps:
            step(_draw(gen, call, c, P, blocks))
            call += 1
        if r < 2:
            for v in t.values():
                v.clear()
    ms = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    ms["fk_total"] = ms["fk_fwd"] + ms["fk_grad"]
    ms["torch_total"] = ms["gather"] + ms["bmm_fwd"] + ms["bmm_grad"]
    ms["gflops"] = 2 * 2 * c * o * i * P / (ms["fk_total"] * 1e-3) / 1e9
    return ms


COLUMNS = [("o", "{:>4}"), ("fk fwd", "{:>7.3f}"), ("fk grad", "{:>7.3f}"), ("fk total", "{:>8.3f}"),
           ("gather", "{:>7.3f}"), ("bmm fwd", "{:>7.3f}"), ("bmm grad", "{:>8.3f}"), ("torch total", "{:>11.3f}"),
           ("speedup", "{:>7.2f}"), ("fk GFLOP/s", "{:>10.1f}")]


def _row(o, ms) -> str:
    vals = [o, ms["fk_fwd"], ms["fk_grad"], ms["fk_total"], ms["gather"], ms["bmm_fwd"], ms["bmm_grad"],
            ms["torch_total"], ms["torch_total"] / ms["fk_total"], ms["gflops"]]
    return "  ".join(fmt.format(v) for (_, fmt), v in zip(COLUMNS, vals))


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--o", type=int, nargs="+", default=[10, 64, 128], help="layer widths (default 10 64 128)")
    ap.add_argument("--clients", type=int, default=40, help="clients per call, c (default 40)")
    ap.add_argument("--batch", type=int, default=32, help="rows per client, P (default 32)")
    ap.add_argument("--inputs", type=int, default=784, help="row length, i (default 784)")
    ap.add_argument("--rows", type=int, default=256_000, help="rows of X, n (default 256,000)")
    ap.add_argument("--rounds", type=int, default=50, help="timed calls of each path (default 50)")
    ap.add_argument("--threads", type=int, default=1, help="threads for torch and fedkernels (default 1)")
    ap.add_argument("--huge-pages", action="store_true",
                    help="X copied onto transparent huge pages (fedkernels.raw.huge_page_copy), as the executor does")
    args = ap.parse_args(argv)
    for flag, v in (("--clients", args.clients), ("--batch", args.batch), ("--inputs", args.inputs),
                    ("--rounds", args.rounds), ("--threads", args.threads), ("--o", min(args.o))):
        if v < 1:
            ap.error(f"{flag} must be >= 1, got {v}")
    if args.rows < args.clients * BLOCK:
        ap.error(f"--rows must be at least clients * {BLOCK} = {args.clients * BLOCK}")
    torch.set_num_threads(args.threads)
    fk.set_num_threads(args.threads)
    info = machine_info()
    X = torch.randn(args.rows, args.inputs)
    if args.huge_pages:
        X = fk.raw.huge_page_copy(X)
    print(machine_line(info))
    print(f"fedkernels CPU variant: {fk.backend_info().get('cpu_isa_gather', '?')}; {_huge_pages()}; "
          f"--huge-pages: {args.huge_pages}")
    print(f"c={args.clients} P={args.batch} i={args.inputs} n={args.rows} float32, {args.threads} thread(s), "
          f"median of {args.rounds} alternated calls; ms per call")
    print("load average before: " + ", ".join(f"{x:.2f}" for x in info["loadavg"]))
    print("  ".join(f"{name:>{len(fmt.format(0))}}" for name, fmt in COLUMNS))
    for o in args.o:
        print(_row(o, measure(o, X, args.clients, args.batch, args.rounds)), flush=True)
    print("load average after: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
