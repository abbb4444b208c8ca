"""Argument checks shared by every entry point (raw path, torch ops, regularizers).

All checks run before any kernel, so a rejected call leaves every buffer as it was. Errors name
the argument and the rule: ``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong
value, shape, device or memory layout, ``RuntimeError`` for an in-place op on a tensor that
autograd tracks. A refused scalar argument raises :class:`ParameterError` /
:class:`ParameterTypeError`, whose ``fields`` name the argument(s) the rule reads, so a caller that
set them from other names (a command line's flags) can say which of its own inputs is at fault
without trying the values again.
"""

from __future__ import annotations

import math
import numbers

import torch

from ._backend import _C, DTYPE_CODES, KIND_CODES

# Names of each penalty's two parameters, for error messages.
PARAM_NAMES = {
    "zero": (),
    "l1": ("kappa",),
    "elastic_net": ("l1", "l2"),
    "mcp": ("lam", "gamma"),
    "scad": ("lam", "a"),
    "box": ("lo", "hi"),
    "nonneg": (),
}

_DTYPE_NAMES = "float32, float64, float16 or bfloat16"


class _Fields:
    """``fields``: the names of the arguments whose values broke the rule (all of them, for a rule
    between several); empty when the error cannot say."""

    def __init__(self, message: str, *fields: str):
        super().__init__(message)
        self.fields = fields


class ParameterError(_Fields, ValueError):
    """A parameter's value breaks a rule; ``fields`` names the parameter(s)."""


class ParameterTypeError(_Fields, TypeError):
    """A parameter's value has the wrong type; ``fields`` names the parameter."""


def real(name: str, value) -> float:
    """A finite real scalar (Python number or one-element tensor)."""
    tv = type(value)
    if tv is float or tv is int:  # fast path: the common case costs ~0.2 us
        value = float(value)
        if value - value == 0.0:  # false for +-inf and NaN
            return value
        raise ParameterError(f"{name} must be finite, got {value}", name)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ParameterTypeError(f"{name} must be a real scalar, got a tensor of shape {tuple(value.shape)}", name)
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ParameterTypeError(f"{name} must be a real number, got {type(value).__name__}", name)
    value = float(value)
    if not math.isfinite(value):
        raise ParameterError(f"{name} must be finite, got {value}", name)
    return value


def nonneg(name: str, value) -> float:
    value = real(name, value)
    if value < 0:
        raise ParameterError(f"{name} must be >= 0, got {value}", name)
    return value


def positive(name: str, value) -> float:
    value = real(name, value)
    if value <= 0:
        raise ParameterError(f"{name} must be > 0, got {value}", name)
    return value


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ParameterTypeError(f"{name} must be an int, got {type(value).__name__}", name)
    if value < 1:
        raise ParameterError(f"{name} must be >= 1, got {value}", name)
    return int(value)


def kind_code(kind) -> int:
    if isinstance(kind, str) and kind in KIND_CODES:
        return KIND_CODES[kind]
    raise ValueError(f"kind must be one of {sorted(KIND_CODES)}, got {kind!r}")


def prox_params(kind: str, p1, p2) -> tuple[float, float]:
    """Validate a separable penalty's parameters (docs/algorithms.md §2)."""
    names = PARAM_NAMES[kind]
    if kind == "l1":
        return nonneg(names[0], p1), 0.0
    if kind == "elastic_net":
        return nonneg(names[0], p1), nonneg(names[1], p2)
    if kind == "mcp":
        return positive("lam", p1), positive("gamma", p2)
    if kind == "scad":
        lam = positive("lam", p1)
        a = real("a", p2)
        if a <= 2:
            raise ParameterError(f"a must be > 2 for SCAD, got {a}", "a")
        return lam, a
    if kind == "box":
        lo, hi = bound("lo", p1), bound("hi", p2)
        if lo > hi:
            raise ParameterError(f"lo must be <= hi, got lo={lo} > hi={hi}", "lo", "hi")
        return lo, hi
    return 0.0, 0.0


def bound(name: str, value) -> float:
    """A box bound: a real number, +-inf allowed, NaN not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ParameterTypeError(f"{name} must be a real number, got {type(value).__name__}", name)
    value = float(value)
    if math.isnan(value):
        raise ParameterError(f"{name} must not be NaN", name)
    return value


def float_tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in DTYPE_CODES:
        raise TypeError(f"{name} must be a floating-point tensor ({_DTYPE_NAMES}), got {t.dtype}")
    return t


def mutable(name: str, t) -> torch.Tensor:
    """A tensor written in place: contiguous, writable, not tracked by autograd."""
    float_tensor(name, t)
    if not t.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous because it is written in place; use the out-of-place op "
            f"or pass {name}.contiguous() and keep the result"
        )
    not_tracked(name, t)
    if t.is_cpu and t.numel() > 0:
        if not _C.is_writable(t.data_ptr(), 1):
            raise ValueError(f"{name} is backed by read-only memory and cannot be written in place")
    return t


def not_tracked(name: str, t) -> None:
    """In-place writes to a tensor autograd is tracking would silently break its graph."""
    if isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(
            f"{name} requires grad; an in-place fedkernels op would silently break autograd. "
            f"Call it under torch.no_grad() or on {name}.detach()"
        )


def extent(t: torch.Tensor) -> tuple[int, int]:
    """[rows, cols] of a target buffer: a 2-D tensor is a stack of rows, anything else one row."""
    if t.dim() == 2:
        return t.shape[0], t.shape[1]
    return 1, t.numel()


def operand(name: str, t, ref: torch.Tensor, ref_name: str, *, broadcast: bool = False):
    """A tensor read alongside `ref`: same dtype and device, and either ref's shape or (with
    broadcast=True and a 2-D ref) one row of it, shared by every row.

    Returns (tensor, row_stride); a non-contiguous tensor is replaced by a contiguous copy.
    """
    float_tensor(name, t)
    if t.dtype != ref.dtype:
        raise TypeError(
            f"{name} has dtype {t.dtype} but {ref_name} has {ref.dtype}; all tensors of one call "
            f"must share a dtype"
        )
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}")
    rows, cols = extent(ref)
    if t.shape == ref.shape:
        stride = cols
    elif broadcast and ref.dim() == 2 and t.dim() == 1 and t.shape[0] == cols:
        stride = 0
    else:
        expected = f"{tuple(ref.shape)}" + (f" or ({cols},)" if broadcast and ref.dim() == 2 else "")
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {expected} (the shape of {ref_name})")
    if not t.is_contiguous():
        t = t.contiguous()
    return t, stride


def _span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def same_or_disjoint(written_name: str, written: torch.Tensor, *reads) -> None:
    """Each read tensor (``name, tensor`` pairs, after ``operand``) must be the written buffer
    itself or share no memory with it, as torch requires of its own in-place ops.

    A read buffer that overlaps the written one only in part (a row of a stack written as a whole,
    a shifted view) would be read while it is being written, in an order each backend chooses.
    Every tensor here is contiguous, so its memory is one interval.
    """
    if written.numel() == 0:
        return
    w0, w1 = _span(written)
    for i in range(0, len(reads), 2):
        name, t = reads[i], reads[i + 1]
        if t.numel() == 0:
            continue
        r0, r1 = _span(t)
        if r0 < w1 and w0 < r1 and not (r0 == w0 and r1 == w1):
            raise ValueError(
                f"{name} overlaps {written_name} in memory without being {written_name} itself (e.g. "
                f"one row of it, or a shifted view); {written_name} is written while {name} is read, "
                f"so they must be the same tensor or not share memory: pass {name}.clone()"
            )


def distinct(**tensors: torch.Tensor) -> None:
    """Buffers written by one call must not share memory with each other."""
    items = [(n, t) for n, t in tensors.items() if t.numel() > 0]
    for i, (na, a) in enumerate(items):
        a0 = a.data_ptr()
        a1 = a0 + a.numel() * a.element_size()
        for nb, b in items[i + 1 :]:
            b0 = b.data_ptr()
            b1 = b0 + b.numel() * b.element_size()
            if a0 < b1 and b0 < a1:
                raise ValueError(f"{na} and {nb} share memory; both are written, so they must not overlap")
