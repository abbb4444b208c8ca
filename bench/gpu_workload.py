"""A short workload that launches every fedkernels kernel, for ``compute-sanitizer``.

    compute-sanitizer --tool memcheck python -m bench.gpu_workload --device cuda --check --large
    python -m bench.gpu_workload --device emulated --check     # the same calls on a machine without a GPU

Every op (``fk.raw`` on every dtype; ``fk.ops`` on float32) runs on flat vectors and ``[N, d]``
stacks with row-broadcast operands, every penalty kind in both MCP / SCAD regimes, the l2 ball with
and without a center, and a stack with more rows than the grid's y limit (65535), so the row loop
strides. ``--large`` adds a float32 vector longer than one grid pass (65536 blocks of 256 threads),
so the column loop strides too. ``--check`` compares every final buffer with the CPU backend (bit
for bit; the l2-ball rows to a few ulps, their sum is reduced in another order) and exits 1 on a
mismatch. Inputs are built on the CPU and copied over, so torch launches almost no kernels of its
own under the sanitizer.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Dict, List, Optional, Sequence

import torch

import fedkernels as fk

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16, torch.bfloat16: torch.int16}

#: (kind, step, p1, p2): every penalty, MCP and SCAD in both regimes
PENALTIES = [
    ("zero", 0.3, 0.0, 0.0),
    ("l1", 0.7, 0.3, 0.0),
    ("elastic_net", 0.7, 0.3, 0.5),
    ("mcp", 0.5, 0.5, 1.5),
    ("mcp", 3.0, 0.5, 1.5),
    ("scad", 1.0, 0.5, 3.7),
    ("scad", 5.0, 0.5, 3.7),
    ("box", 1.0, -0.5, 0.7),
    ("nonneg", 1.0, 0.0, 0.0),
]
SMALL_SHAPES = [(1,), (1000,), (5, 1031), (70_000, 3)]
LARGE_SHAPE = ((1 << 24) + 1000,)
#: buffers whose final values went through the row reduction (summation order differs by backend)
REDUCED = ("ball", "ball_c", "gl_rows", "gl_cols")


class Counted:
    """``fk.raw`` or ``fk.ops`` with a count of the calls made through it."""

    def __init__(self, api):
        self.api, self.calls, self.names = api, 0, set()

    def __getattr__(self, name):
        fn = getattr(self.api, name)

        def call(*args, **kwargs):
            self.calls += 1
            self.names.add(name)
            return fn(*args, **kwargs)

        return call


def make_inputs(shape, dtype, seed: int = 0) -> Dict[str, torch.Tensor]:
    """CPU tensors from a seeded generator (every backend gets the same bits). ``*_row``: one row of
    a stack (row-broadcast operands)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(s, scale=2.0):
        return (torch.randn(s, generator=gen, dtype=torch.float64) * scale).to(dtype)

    T = {n: rnd(shape) for n in ("a", "b", "x", "z", "x2", "z2", "zh", "g", "c", "m", "ball", "ball_c",
                                     "gl_rows", "gl_cols")}
    T.update({n: rnd(shape[-1:]) for n in ("g_row", "c_row", "y_row", "z_row", "r_row")})
    T["lo_row"], T["hi_row"] = -T["r_row"].abs(), T["r_row"].abs()
    r = rnd(shape)
    T["lo"], T["hi"] = -r.abs(), r.abs()
    return T


def touch_every_kernel(api, T: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Call every op on the buffers of ``T`` (in place where the op is in place); returns the final
    buffers plus the outputs of the out-of-place ops."""
    out: Dict[str, torch.Tensor] = {}
    for i, (kind, step, p1, p2) in enumerate(PENALTIES):
        api.prox_(T["a"], kind, step, p1, p2)
        out[f"prox/{i}"] = api.prox(T["b"], kind, step, p1, p2)
        api.prox_grad_step_(T["b"], T["g_row"], 0.3, kind, step, p1, p2)
        api.normal_map_step_(T["z"], T["x"], T["g"], T["c_row"], 0.1, 0.7, kind, step, p1, p2)
        api.za1_step_(T["zh"], T["z2"], T["g"], T["c"], 0.1, kind, step, p1, p2)
        api.depositum_step_(T["x2"], T["m"], T["y_row"], 0.1, 0.8, kind, step, p1, p2, momentum="shb")
        api.depositum_step_(T["x2"], T["m"], T["y_row"], 0.1, 0.8, kind, step, p1, p2, momentum="snag",
                            normalized=False)
    api.box_tensor_(T["a"], T["lo_row"], T["hi_row"])
    out["box_tensor"] = api.box_tensor(T["b"], T["lo"], T["hi"])
    api.cv_step_(T["x"], T["g"], T["c_row"], 0.1)
    out["normalized_delta"] = api.normalized_delta(T["z_row"], T["x"], 0.05, 7)
    api.normalized_delta_(T["zh"], T["z_row"], 0.05, 7)
    api.control_update_(T["c"], T["y_row"], T["g"])
    api.l2_ball_(T["ball"], 1.5, None)
    api.l2_ball_(T["ball_c"], 1.5, T["r_row"])
    # group lasso: a stack is one matrix; a vector holds a [2, d // 2] matrix from element 1 on
    d = T["gl_rows"].shape[-1]
    where = {} if T["gl_rows"].dim() == 2 else {"shape": (2, (d - 1) // 2), "start": 1}
    api.group_lasso_(T["gl_rows"], 0.4, 1.5, "rows", **where)
    api.group_lasso_(T["gl_cols"], 0.4, 1.5, "cols", **where)
    out.update(T)
    return out


def _to(T, device):
    return {k: v.to(device, copy=True) for k, v in T.items()}  # copy: T stays the pristine input


def _mismatch(got: torch.Tensor, want: torch.Tensor, reduced: bool) -> Optional[str]:
    got = got.cpu()
    nan = torch.isnan(want)
    if not torch.equal(torch.isnan(got), nan):
        return "NaN positions differ"
    g, w = got[~nan], want[~nan]
    if reduced:
        eps = torch.finfo(want.dtype).eps
        bad = ((g.double() - w.double()).abs() > 4 * eps * (1 + w.double().abs())).sum()
    else:
        bad = (g.contiguous().view(BITS[g.dtype]) != w.contiguous().view(BITS[w.dtype])).sum()
    return f"{int(bad)} of {w.numel()} elements differ" if int(bad) else None


def run(device: str = "cuda", *, check: bool = False, large: bool = False,
        dtypes: Sequence[str] = tuple(DTYPES), shapes: Sequence[tuple] = tuple(SMALL_SHAPES), log=print) -> dict:
    """Run the workload; returns {"calls", "ops" (names called), "cases", "mismatches", "seconds", "device"}."""
    emulated = device == "emulated"
    dev = "cpu" if emulated else device
    cases = [(s, DTYPES[d]) for d in dtypes for s in shapes]
    if large:
        cases.append((LARGE_SHAPE, torch.float32))
    raw, ops = Counted(fk.raw), Counted(fk.ops)
    mismatches: List[str] = []
    t0 = time.perf_counter()
    for shape, dtype in cases:
        T = make_inputs(shape, dtype)
        want = touch_every_kernel(fk.raw, _to(T, "cpu")) if check else {}
        for api in [raw] + ([ops] if dtype == torch.float32 else []):
            if emulated:
                with fk.emulate_cuda():
                    got = touch_every_kernel(api, _to(T, dev))
            else:
                got = touch_every_kernel(api, _to(T, dev))
            for name, w in want.items():
                why = _mismatch(got[name], w, name in REDUCED)
                if why:
                    mismatches.append(f"{api.api.__name__} {name} {tuple(shape)} {dtype}: {why}")
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    res = {"device": device, "calls": raw.calls + ops.calls, "ops": sorted(raw.names | ops.names),
           "cases": len(cases), "checked": check,
           "mismatches": mismatches, "seconds": seconds}
    log(f"gpu_workload: {res['calls']} kernel calls on {device} ({len(cases)} shape/dtype cases) in "
        f"{seconds:.1f} s" + (f"; {len(mismatches)} mismatches against the CPU backend" if check else ""))
    for m in mismatches[:20]:
        log("  MISMATCH " + m)
    return res


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, cpu or emulated (the CUDA thread bodies on the "
                                                     "host)")
    ap.add_argument("--check", action="store_true", help="compare every result with the CPU backend")
    ap.add_argument("--large", action="store_true", help="add a float32 vector longer than one grid pass (16.8 M "
                                                         "elements)")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated subset of " + ",".join(DTYPES))
    args = ap.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        ap.error(f"--dtypes: unknown {bad}; choose from {','.join(DTYPES)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_workload: --device cuda needs a CUDA GPU visible to torch (none here); "
              "use --device emulated on a machine without one", file=sys.stderr)
        return 2
    res = run(args.device, check=args.check, large=args.large, dtypes=dtypes)
    return 1 if res["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
