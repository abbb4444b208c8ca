"""A standing differential fuzzer of the fused ops (issue 35, item 8): random regularizer (every kind,
scaled, per-parameter) x fused op (``fk.fused.*``, both paths, and the kind-based ``fk.raw`` /
``fk.ops`` ops with the penalty's parameters, also bad ones) x dtype x shapes, row-broadcast and
non-contiguous operands, aliasing x valid and invalid arguments.

A valid call must match a float64 reference written here in plain PyTorch (tests/_reference.py's
closed-form separable prox, and the l2-ball, group-lasso and update formulas below); an invalid one
must raise a clear exception (TypeError / ValueError / RuntimeError) and leave every buffer it was
given bitwise unchanged. Seeded: ``--fuzz-seed`` picks the first seed, ``--fuzz-long`` runs 1000x
the default number of examples.

On the base commit 3347ecf (before issue 35) the default run fails 404 of its 5000 fused examples:
389 write the update and then raise on a bad argument of the prox pass (defect 8: tensor Box 98,
PerParameter 111, L2Ball 92, GroupLasso 69, their scalings 19), 15 are a ``Zero`` prox that accepted
a negative or NaN step, an integer or a non-contiguous x.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from _reference import prox as separable_prox

import fedkernels as fk

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# Relative error a valid result may carry: one rounding of the 16-bit storage, a few of float32.
TOL = {torch.float64: 1e-11, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
OPS = ("prox_", "prox_grad_step_", "normal_map_step_", "za1_step_", "depositum_step_")
# Written buffers of each op, in its argument order.
WRITTEN = {"prox_": ("x",), "prox_grad_step_": ("x",), "normal_map_step_": ("z", "x"), "za1_step_": ("zhat", "z"),
           "depositum_step_": ("x", "m")}


# --- random regularizers ------------------------------------------------------------------------


class Case:
    """One generated call: op, regularizer, tensors by name, scalars, and what the test expects."""

    def __init__(self, rng: random.Random, seed: int):
        self.rng, self.seed = rng, seed
        self.dtype = rng.choice(DTYPES)
        self.op = rng.choice(OPS)
        self.fast = rng.random() < 0.5
        self.invalid = None  # description of the broken argument, or None for a valid call


def _randn(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _separable(rng):
    kind = rng.choice(("zero", "l1", "elastic_net", "mcp", "scad", "box", "nonneg"))
    if kind == "zero":
        return fk.Zero(), ("zero", 0.0, 0.0)
    if kind == "l1":
        k = rng.uniform(0, 1)
        return fk.L1(k), ("l1", k, 0.0)
    if kind == "elastic_net":
        a, b = rng.uniform(0, 1), rng.uniform(0, 2)
        return fk.ElasticNet(a, b), ("elastic_net", a, b)
    if kind == "mcp":
        lam, g = rng.uniform(0.05, 1), rng.uniform(1.05, 4)
        return fk.MCP(lam, g), ("mcp", lam, g)
    if kind == "scad":
        lam, a = rng.uniform(0.05, 1), rng.uniform(2.1, 5)
        return fk.SCAD(lam, a), ("scad", lam, a)
    if kind == "box":
        lo = rng.uniform(-1.5, 0)
        hi = lo + rng.uniform(0, 2)
        return fk.Box(lo, hi), ("box", lo, hi)
    return fk.NonNeg(), ("nonneg", 0.0, 0.0)


def _reference_prox(desc, v: torch.Tensor, step: float) -> torch.Tensor:
    """prox_{step h}(v) in float64 for a regularizer description (see _regularizer)."""
    tag = desc[0]
    if tag == "sep":
        kind, p1, p2 = desc[1]
        return separable_prox(kind, v, 0.0 if kind == "box" else step, p1, p2)
    if tag == "scaled":
        return _reference_prox(desc[2], v, step * desc[1])
    if tag == "box_tensor":
        lo, hi = desc[1].double(), desc[2].double()
        return torch.minimum(torch.maximum(v, lo), hi)
    if tag == "l2ball":
        r, c = desc[1], desc[2]
        c = torch.zeros_like(v) if c is None else c.double().expand_as(v)
        d = v - c
        n = d.norm(dim=-1, keepdim=True) if v.dim() == 2 else d.norm()
        return c + d * torch.clamp(r / n, max=1.0).nan_to_num(1.0)
    if tag == "group_lasso":
        lam, groups = desc[1], desc[2]
        n = v.norm(dim=-1 if groups == "rows" else -2, keepdim=True)
        return v * torch.clamp(1 - step * lam / n, min=0).nan_to_num(0.0)
    if tag == "per_parameter":
        out = v.clone()
        for start, stop, shape, sub in desc[1]:
            block = v[..., start:stop]
            if sub is None:
                continue
            if sub[0] == "group_lasso":
                mat = block.reshape(*block.shape[:-1], shape[0], -1)
                out[..., start:stop] = _reference_prox(sub, mat, step).reshape(block.shape)
            else:
                out[..., start:stop] = _reference_prox(sub, block, step)
        return out
    raise AssertionError(tag)


def _regularizer(rng, gen, shape, dtype, depth=0):
    """(Regularizer, description for _reference_prox, separable?) valid for a target of ``shape``."""
    d = shape[-1]
    roll = rng.random()
    if roll < 0.35 or (depth > 0 and roll < 0.6):
        reg, sep = _separable(rng)
        return reg, ("sep", sep), True
    if roll < 0.45 and depth == 0:
        kappa = rng.uniform(0, 2)
        base, desc, sep = _regularizer(rng, gen, shape, dtype, depth + 1)
        return kappa * base, ("scaled", kappa, desc), sep
    if roll < 0.6:
        bshape = rng.choice([shape, (d,)])
        lo = -_randn(bshape, torch.float64, gen).abs()
        hi = _randn(bshape, torch.float64, gen).abs()
        bdt = rng.choice((dtype, torch.float64))
        return fk.Box(lo.to(bdt), hi.to(bdt)), ("box_tensor", lo.to(bdt).to(dtype), hi.to(bdt).to(dtype)), True
    if roll < 0.72:
        r = rng.uniform(0.1, 3)
        center = None if rng.random() < 0.4 else _randn(rng.choice([shape, (d,)]), dtype, gen, 0.3)
        return fk.L2Ball(r, center), ("l2ball", r, center), False
    if roll < 0.84 and len(shape) == 2:
        lam, groups = rng.uniform(0, 1), rng.choice(("rows", "cols"))
        return fk.GroupLasso(lam, groups), ("group_lasso", lam, groups), False
    return _per_parameter(rng, gen, d, dtype)


def _per_parameter(rng, gen, d, dtype):
    """A PerParameter over made-up parameters whose sizes add up to d."""
    sizes, left = [], d
    while left > 0:
        n = min(left, rng.randint(1, max(1, d // 2)))
        sizes.append(n)
        left -= n
    named, mapping, segs, start = [], {}, [], 0
    for i, n in enumerate(sizes):
        rows = next((r for r in (3, 2) if n % r == 0 and n > r), None)
        shape = (rows, n // rows) if rows and rng.random() < 0.6 else (n,)
        name = f"{i}.weight" if len(shape) == 2 else f"{i}.bias"
        named.append((name, shape))
        pick = rng.random()
        if pick < 0.2:
            reg, desc = None, None
        elif pick < 0.4 and len(shape) == 2:
            lam, groups = rng.uniform(0, 1), rng.choice(("rows", "cols"))
            reg, desc = fk.GroupLasso(lam, groups), ("group_lasso", lam, groups)
        elif pick < 0.55:
            lo = -_randn((n,), torch.float64, gen).abs()
            hi = _randn((n,), torch.float64, gen).abs()
            reg, desc = fk.Box(lo, hi), ("box_tensor", lo.to(dtype), hi.to(dtype))
        elif pick < 0.65:
            r = rng.uniform(0.1, 2)
            reg, desc = fk.L2Ball(r), ("l2ball", r, None)
        else:
            reg, sep = _separable(rng)
            desc = ("sep", sep)
        mapping[name] = reg
        segs.append((start, start + n, shape, desc))
        start += n
    return fk.PerParameter(named, mapping), ("per_parameter", segs), False


# --- generating one call ------------------------------------------------------------------------


def _operand(rng, gen, shape, dtype, scale):
    """A read operand: the target's shape or (2-D target) one row, sometimes non-contiguous."""
    oshape = shape if len(shape) == 1 or rng.random() < 0.7 else (shape[-1],)
    t = _randn(oshape, dtype, gen, scale)
    if rng.random() < 0.25:  # the same values in a strided view
        wide = torch.zeros(*oshape[:-1], oshape[-1], 2, dtype=dtype)
        wide[..., 0] = t
        t = wide[..., 0]
    return t


def _near_regime_edge(case: Case, S: dict, seed: int) -> None:
    """Half of the MCP / SCAD cases take a prox step within 2^-6 .. 2^-22 (relative) of the regime
    edge, γ for MCP and a − 1 for SCAD, or on it, and a plain prox of such a case gets a few inputs
    planted in the narrow middle piece that the edge makes (MCP: sλ < |x| < γλ; SCAD: (1 + s)λ <
    |x| < aλ), or at MCP's hard threshold λ√(sγ) past it: where float32 erred by up to 3 (issue 35,
    defect 11, found by review). A generator of its own, so every other draw of the seed is unchanged."""
    desc = case.desc
    if desc[0] != "sep" or desc[1][0] not in ("mcp", "scad"):
        return
    r = random.Random(seed * 1_000_003 + 11)
    if r.random() < 0.5:
        return
    kind, lam, p2 = desc[1]
    edge = p2 if kind == "mcp" else p2 - 1.0
    key = "lam" if "lam" in S else "step"
    S[key] = s = edge * (1.0 + r.choice((-1.0, 0.0, 1.0)) * 2.0 ** -r.randint(6, 22))
    if case.op != "prox_":
        return
    if kind == "mcp":
        lo, hi = (s * lam, p2 * lam) if s < p2 else (lam * (s * p2) ** 0.5, lam * (s * p2) ** 0.5)
    else:
        lo, hi = (1 + s) * lam, p2 * lam
    x = case.T["x"].reshape(-1)
    for i in r.sample(range(x.numel()), min(8, x.numel())):
        x[i] = r.choice((-1.0, 1.0)) * (lo + r.random() * (hi - lo))


def generate(seed: int) -> Case:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    case = Case(rng, seed)
    dtype = case.dtype
    d = rng.choice((1, 2, 5, 13, 64, 200))
    shape = (d,) if rng.random() < 0.4 else (rng.randint(1, 4), d)
    case.shape = shape
    case.reg, case.desc, case.separable = _regularizer(rng, gen, shape, dtype)
    # a third of the separable cases call the kind-based ops (fk.raw / fk.ops) with the penalty's
    # (kind, p1, p2) instead of fk.fused with the object, so that bad parameters can be passed too
    case.params = case.desc[1] if case.desc[0] == "sep" and rng.random() < 0.35 else None
    scale = rng.choice((1.0, 1.0, 3.0, 0.05))
    T = {}
    for name in WRITTEN[case.op]:
        T[name] = _randn(shape, dtype, gen, scale)
    S = {"step": rng.choice((0.0, rng.uniform(0, 2), rng.uniform(0, 6)))}
    if case.op == "prox_grad_step_":
        T["g"] = _operand(rng, gen, shape, dtype, scale)
        S["lr"] = rng.uniform(0, 2)
    elif case.op in ("normal_map_step_", "za1_step_"):
        T["g"] = _operand(rng, gen, shape, dtype, scale)
        T["c"] = T["g"] if rng.random() < 0.15 else _operand(rng, gen, shape, dtype, scale)  # aliasing
        S["eta"] = rng.uniform(0, 1)
        if case.op == "normal_map_step_":
            S["lam"] = rng.uniform(0.1, 3)
            del S["step"]
    elif case.op == "depositum_step_":
        T["y"] = T["m"] if rng.random() < 0.15 else _operand(rng, gen, shape, dtype, scale)  # y is m
        S["alpha"], S["beta"] = rng.uniform(0, 1), rng.choice((0.0, rng.uniform(0, 0.99)))
        S["momentum"], S["normalized"] = rng.choice(("shb", "snag")), rng.random() < 0.5
    if case.op == "prox_grad_step_" and rng.random() < 0.15:
        T["g"] = T["x"]  # g is x itself: allowed, read before written element by element
    case.T, case.S = T, S
    _near_regime_edge(case, S, seed)
    if rng.random() < 0.45:
        _break(case, rng, gen)
    return case


def _break(case: Case, rng, gen) -> None:
    """Make exactly one argument invalid (case.invalid says which); the call must then raise."""
    T, S, dtype = case.T, case.S, case.dtype
    target = WRITTEN[case.op][-1]  # the buffer the prox writes
    options = ["negative_step", "nan_scalar", "noncontiguous_written", "wrong_dtype",
               "reg_bad" if case.params is None else "bad_params"]
    if case.op != "prox_":  # prox_ has one tensor: any shape fits it
        options.append("wrong_shape")
    if len(WRITTEN[case.op]) == 2:
        options.append("written_alias")
    if T[target].dim() == 2 and T[target].shape[0] > 1 and T[target].shape[1] > 1:
        options.append("partial_overlap")
    if case.op == "depositum_step_":
        options.append("beta_one")
    what = rng.choice(options)
    case.invalid = what
    if what == "negative_step":
        key = "lam" if case.op == "normal_map_step_" else "step"
        S[key] = -rng.uniform(0.01, 1)
    elif what == "nan_scalar":
        key = rng.choice([k for k in S if k not in ("momentum", "normalized")])
        S[key] = rng.choice((math.nan, math.inf))
    elif what == "noncontiguous_written":
        name = rng.choice(WRITTEN[case.op])
        t = T[name]
        wide = torch.zeros(*t.shape, 2, dtype=dtype)
        wide[..., 0] = t
        if t.numel() <= 1:  # a 1-element view is contiguous whatever its stride: break the dtype instead
            T[name] = t.to(torch.int32)
        else:
            T[name] = wide[..., 0]
    elif what == "wrong_dtype":
        reads = [k for k in T if k not in WRITTEN[case.op]] or list(T)
        name = rng.choice(reads)
        other = torch.int64 if case.op == "prox_" else rng.choice([t for t in DTYPES if t != dtype] + [torch.int64])
        T[name] = T[name].to(other)
    elif what == "wrong_shape":
        name = rng.choice(list(T))
        t = T[name]
        T[name] = torch.cat([t, t[..., :1]], dim=-1).contiguous()
    elif what == "bad_params":
        case.params = rng.choice([("lasso", 0.1, 0.0), ("l1", -0.1, 0.0), ("l1", math.nan, 0.0), ("mcp", 0.0, 3.0),
                                  ("mcp", 0.5, -1.0), ("scad", 0.5, 2.0), ("scad", -1.0, 3.7), ("box", 1.0, -1.0),
                                  ("box", math.nan, 1.0), ("elastic_net", 0.1, -0.5), ("elastic_net", 0.1, math.inf)])
    elif what == "reg_bad":
        _break_reg(case, rng, gen)
    elif what == "written_alias":
        a, b = WRITTEN[case.op]
        T[b] = T[a]
    elif what == "partial_overlap":
        reads = [k for k in T if k not in WRITTEN[case.op]]
        written = T[target]
        if reads:
            name = rng.choice(reads)
            T[name] = written[0]  # one row of the stack that is written as a whole
        else:
            case.invalid = "negative_step"
            S["lam" if case.op == "normal_map_step_" else "step"] = -1.0
    elif what == "beta_one":
        S["beta"] = rng.choice((1.0, 1.5))


def _break_reg(case: Case, rng, gen) -> None:
    """A regularizer that does not fit the target: its own arguments are what is wrong."""
    shape, dtype, d = case.shape, case.dtype, case.shape[-1]
    pick = rng.choice(("box_len", "ball_center", "group_1d", "per_param_len"))
    if pick == "box_len":
        case.reg = fk.Box(-torch.ones(d + 1), torch.ones(d + 1))
    elif pick == "ball_center":
        case.reg = fk.L2Ball(1.0, torch.zeros(d + 2, dtype=dtype))
    elif pick == "group_1d":
        case.reg = fk.GroupLasso(0.3, rng.choice(("rows", "cols")))
        for name in WRITTEN[case.op]:  # a GroupLasso needs a matrix: give it a flat vector
            case.T[name] = case.T[name].reshape(-1).contiguous()
        for name in [k for k in case.T if k not in WRITTEN[case.op]]:
            case.T[name] = case.T[name].expand(shape).reshape(-1).contiguous()
    else:
        case.reg = fk.PerParameter([("w", (d + 1,))], {"w": fk.L2Ball(1.0)})
    case.desc = None


# --- running and checking -----------------------------------------------------------------------


def call(case: Case):
    if case.params is not None:
        return call_kind(case)
    T, S, reg, fast = case.T, case.S, case.reg, case.fast
    op = getattr(fk.fused, case.op)
    if case.op == "prox_":
        return op(T["x"], reg, S["step"], fast=fast)
    if case.op == "prox_grad_step_":
        return op(T["x"], T["g"], S["lr"], reg, S["step"], fast=fast)
    if case.op == "normal_map_step_":
        return op(T["z"], T["x"], T["g"], T["c"], S["eta"], S["lam"], reg, fast=fast)
    if case.op == "za1_step_":
        return op(T["zhat"], T["z"], T["g"], T["c"], S["eta"], reg, S["step"], fast=fast)
    return op(T["x"], T["m"], T["y"], S["alpha"], S["beta"], reg, S["step"], momentum=S["momentum"],
              normalized=S["normalized"], fast=fast)


def call_kind(case: Case):
    """The same call on the kind-based ops: fk.raw (fast) or the registered fk.ops."""
    T, S = case.T, case.S
    kind, p1, p2 = case.params
    ops = fk.raw if case.fast else fk.ops
    op = getattr(ops, case.op)
    if case.op == "prox_":
        return op(T["x"], kind, S["step"], p1, p2)
    if case.op == "prox_grad_step_":
        return op(T["x"], T["g"], S["lr"], kind, S["step"], p1, p2)
    if case.op == "normal_map_step_":
        return op(T["z"], T["x"], T["g"], T["c"], S["eta"], S["lam"], kind, S["lam"], p1, p2)
    if case.op == "za1_step_":
        return op(T["zhat"], T["z"], T["g"], T["c"], S["eta"], kind, S["step"], p1, p2)
    return op(T["x"], T["m"], T["y"], S["alpha"], S["beta"], kind, S["step"], p1, p2, momentum=S["momentum"],
              normalized=S["normalized"])


def reference(case: Case, before: dict) -> dict:
    """The written buffers' expected values in float64: {name: (pre-prox value or None, result)}."""
    R = {k: v.double() for k, v in before.items()}
    S = case.S
    if case.op == "prox_":
        return {"x": (R["x"], None)}
    if case.op == "prox_grad_step_":
        return {"x": (R["x"] - S["lr"] * R["g"], None)}
    if case.op == "normal_map_step_":
        z = R["z"] - S["eta"] * (R["g"] + R["c"] + (R["z"] - R["x"]) / S["lam"])
        return {"z": (None, z), "x": (z, None)}
    if case.op == "za1_step_":
        zhat = R["zhat"] - S["eta"] * (R["g"] + R["c"])
        return {"zhat": (None, zhat), "z": (zhat, None)}
    beta = S["beta"]
    w = 1 - beta if S["normalized"] else 1.0
    m = beta * R["m"] + w * R["y"]
    direction = m if S["momentum"] == "shb" else beta * m + w * R["y"]
    return {"m": (None, m), "x": (R["x"] - S["alpha"] * direction, None)}


def _bits(t: torch.Tensor) -> torch.Tensor:
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
    return t.detach().view(ints[t.element_size()]).clone() if t.is_floating_point() else t.clone()


def check_valid(case: Case, before: dict) -> None:
    step = case.S.get("step", case.S.get("lam"))
    tol = TOL[case.dtype]
    scale = 1.0 + max(float(v.double().abs().max()) for v in before.values() if v.numel())
    scale *= 1.0 + sum(abs(v) for k, v in case.S.items() if isinstance(v, float) and k != "step")
    scale *= 1.0 + case.S.get("eta", 0.0) / case.S.get("lam", 1.0)
    for name, (pre, plain) in reference(case, before).items():
        out = case.T[name].double()
        where = f"seed {case.seed}: {case.op} {case.reg!r} {case.dtype} {case.shape} fast={case.fast}, {name}"
        if plain is not None:
            err = (out - plain).abs().max().item() if out.numel() else 0.0
            assert err <= tol * scale, f"{where}: off by {err:.3g} (tolerance {tol * scale:.3g})"
            continue
        exact = _reference_prox(case.desc, pre, step)
        ok = (out - exact).abs() <= tol * scale
        # prox_'s input is exact, so a float32 / 16-bit result must match without the allowance below (the float64
        # reference's own rounding near the regime edges, ~1e-10, is far inside those dtypes' tolerances)
        if not bool(ok.all()) and (case.op != "prox_" or case.dtype == torch.float64):
            # A 1-D prox is monotone, also where it jumps (MCP's hard threshold, SCAD past a - 1):
            # the result must lie between the prox of the pre-prox value moved by its rounding error.
            delta = tol * scale
            a = _reference_prox(case.desc, pre - delta, step)
            b = _reference_prox(case.desc, pre + delta, step)
            ok = ok | ((out >= torch.minimum(a, b) - delta) & (out <= torch.maximum(a, b) + delta))
        if not bool(ok.all()):
            i = int((~ok).reshape(-1).nonzero()[0])
            raise AssertionError(f"{where}: element {i} is {out.reshape(-1)[i].item()!r}, expected "
                                 f"{exact.reshape(-1)[i].item()!r} (pre-prox {pre.reshape(-1)[i].item()!r})")


def run_case(seed: int) -> None:
    case = generate(seed)
    before = {k: v.clone() for k, v in case.T.items()}
    bits = {k: _bits(v) for k, v in case.T.items()}
    api = f"kind {case.params}" if case.params is not None else repr(case.reg)
    where = f"seed {seed}: {case.op} with {api}, {case.dtype}, shape {case.shape}, fast={case.fast}"
    if case.invalid is None:
        call(case)
        check_valid(case, before)
        return
    try:
        call(case)
    except (TypeError, ValueError, RuntimeError) as e:
        error = e
    else:
        raise AssertionError(f"{where}: an invalid argument ({case.invalid}) was accepted")
    assert str(error), f"{where}: an empty error message for {case.invalid}"
    for k, t in case.T.items():
        assert torch.equal(_bits(t), bits[k]), (
            f"{where}: invalid argument ({case.invalid}) raised {type(error).__name__}: {error} "
            f"but {k} was written first")


def test_fuzz_fused_ops(fuzz_budget):
    first, n = fuzz_budget(5000)
    failures = []
    for seed in range(first, first + n):
        try:
            run_case(seed)
        except AssertionError as e:
            failures.append(str(e).splitlines()[0])
        except Exception as e:  # a valid call that raised, or an invalid one with the wrong exception type
            failures.append(f"seed {seed}: {type(e).__name__}: {e}")
        if len(failures) >= 20:
            break
    assert not failures, f"{len(failures)} failing examples:\n" + "\n".join(failures)


# --- the updates without a prox: fk.raw / fk.ops cv_step_, control_update_, normalized_delta_ ----------

PLAIN = {  # op: (written, reads that may be one row, reads that must match the target, scalars)
    "cv_step_": ("x", ("g", "c"), (), ("beta",)),
    "control_update_": ("c", ("dbar",), ("d",), ()),
    "normalized_delta_": ("x", ("z",), (), ("beta", "K")),
}


def generate_plain(seed: int) -> dict:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    op = rng.choice(sorted(PLAIN))
    written, broadcast, full, scalars = PLAIN[op]
    dtype = rng.choice(DTYPES)
    d = rng.choice((1, 3, 64, 130))
    shape = (d,) if rng.random() < 0.4 else (rng.randint(1, 4), d)
    T = {written: _randn(shape, dtype, gen)}
    for name in broadcast:
        T[name] = _operand(rng, gen, shape, dtype, 1.0)
    for name in full:
        T[name] = _randn(shape, dtype, gen)
    if rng.random() < 0.15:  # a read that is the written tensor itself: allowed
        T[rng.choice(broadcast + full)] = T[written]
    S = {"beta": rng.uniform(0.05, 2), "K": rng.randint(1, 6)}
    case = {"op": op, "seed": seed, "dtype": dtype, "shape": shape, "T": T, "S": S, "fast": rng.random() < 0.5,
            "invalid": None}
    if rng.random() < 0.45:
        what = rng.choice(["scalar", "dtype", "shape", "noncontiguous", "overlap"])
        case["invalid"] = what
        reads = [k for k in T if k != written]
        if what == "scalar" and scalars:
            key = rng.choice(scalars)
            S[key] = {"beta": rng.choice((-0.5, math.nan, math.inf) + ((0.0,) if op == "normalized_delta_" else ())),
                      "K": rng.choice((0, -2, 2.0, True))}[key]
        elif what == "dtype" or (what == "scalar" and not scalars):
            case["invalid"] = "dtype"
            name = rng.choice(reads)
            T[name] = T[name].to(rng.choice([t for t in DTYPES if t != dtype] + [torch.int32]))
        elif what == "shape":
            name = rng.choice(reads)
            T[name] = torch.cat([T[name], T[name][..., :1]], dim=-1)
        elif what == "noncontiguous":
            t = T[written]
            wide = torch.zeros(*t.shape, 2, dtype=dtype)
            wide[..., 0] = t
            T[written] = wide[..., 0] if t.numel() > 1 else t.to(torch.int64)
        elif len(shape) == 2 and shape[0] > 1:  # overlap: one row of the stack that is written whole
            T[rng.choice(reads)] = T[written][0]
        else:
            case["invalid"] = "dtype"
            T[reads[0]] = T[reads[0]].to(torch.int64)
    return case


def _plain_reference(case, R):
    S = case["S"]
    if case["op"] == "cv_step_":
        return R["x"] - S["beta"] * (R["g"] + R["c"])
    if case["op"] == "control_update_":
        return R["c"] + R["dbar"] - R["d"]
    return (R["z"] - R["x"]) / (S["beta"] * S["K"])


def run_plain_case(seed: int) -> None:
    case = generate_plain(seed)
    T, S, op = case["T"], case["S"], case["op"]
    before = {k: v.clone() for k, v in T.items()}
    bits = {k: _bits(v) for k, v in T.items()}
    fn = getattr(fk.raw if case["fast"] else fk.ops, op)
    written = PLAIN[op][0]
    args = {"cv_step_": lambda: (T["x"], T["g"], T["c"], S["beta"]),
            "control_update_": lambda: (T["c"], T["dbar"], T["d"]),
            "normalized_delta_": lambda: (T["x"], T["z"], S["beta"], S["K"])}[op]()
    where = f"seed {seed}: {op} {case['dtype']} {case['shape']} fast={case['fast']}"
    if case["invalid"] is None:
        fn(*args)
        want = _plain_reference(case, {k: v.double() for k, v in before.items()})
        scale = (1 + max(float(v.double().abs().max()) for v in before.values())) * (1 + S["beta"])
        scale *= 1 / (S["beta"] * S["K"]) if op == "normalized_delta_" else 1
        err = float((T[written].double() - want).abs().max())
        assert err <= TOL[case["dtype"]] * scale, f"{where}: off by {err:.3g}"
        return
    try:
        fn(*args)
    except (TypeError, ValueError, RuntimeError) as e:
        error = e
    else:
        raise AssertionError(f"{where}: an invalid argument ({case['invalid']}) was accepted")
    for k, t in T.items():
        assert torch.equal(_bits(t), bits[k]), f"{where}: invalid {case['invalid']} raised {error} but {k} was written"


def test_fuzz_plain_updates(fuzz_budget):
    first, n = fuzz_budget(1500)
    failures = []
    for seed in range(first, first + n):
        try:
            run_plain_case(seed)
        except AssertionError as e:
            failures.append(str(e).splitlines()[0])
        except Exception as e:
            failures.append(f"seed {seed}: {type(e).__name__}: {e}")
        if len(failures) >= 20:
            break
    assert not failures, f"{len(failures)} failing examples:\n" + "\n".join(failures)


# examples of test_fuzz_plain_updates past the default seeds that found a defect, each failing before its fix
PLAIN_FINDS = {
    50364: "fk.ops.normalized_delta_ with K=True (float64): torch.ops turned the bool into 1 before the raw call's "
           "refusal, so the op ran",
    50379: "the same in bfloat16",
}


@pytest.mark.parametrize("seed", sorted(PLAIN_FINDS))
def test_the_plain_update_finds_stay_fixed(seed):
    run_plain_case(seed)
