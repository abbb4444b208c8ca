"""Gathered batched linear products: many small linear layers applied to rows picked from one
sample matrix, without gathering the rows into a copy first (CPU).

Client j multiplies its own matrix by the rows ``X[idx[j, p]]`` of a shared sample matrix ``X``:
the forward product ``out[j] = W[j] @ X[idx[j]].T`` and the weight gradient
``out[j] = D[j] @ X[idx[j]]``. The kernels read each row in place and prefetch the next ones; the
plain PyTorch path (``torch.index_select`` into a buffer, then ``torch.bmm``) gives the same
values up to rounding and is what to use on CUDA. Exposed as ``fedkernels.raw.linear_gathered``
and ``fedkernels.raw.linear_gathered_weight_grad``; they are executor-internal kernels, so there is
no registered torch op (``fedkernels.ops``) for them and autograd does not see them.

Each client is computed by one thread in one fixed order: its result is bitwise the same for any
thread count, any number of clients and any position of the client in the batch. The AVX2 and
AVX-512 variants use FMA, so results of different CPU variants may differ in the last bits.
"""

from __future__ import annotations

import torch

from . import _validate as V
from ._backend import _C, DTYPE_CODES

__all__ = ["linear_gathered", "linear_gathered_weight_grad"]

_FLOATS = (torch.float32, torch.float64)  # the dtypes the gathered kernels are built for


def linear_gathered(W: torch.Tensor, X: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Forward product of every client on its gathered rows: ``out[j, :, p] = W[j] @ X[idx[j, p]]``.

    ``W``: ``[c, o, i]``; ``X``: ``[n, i]``, contiguous; ``idx``: int64 ``[c, P]``, contiguous, every
    entry in ``[0, n)``; ``out``: ``[c, o, P]``, written. ``W`` and ``out`` may have any client
    stride (``stride(0)``, e.g. a column slice of a ``[c, d]`` parameter stack viewed as
    ``[c, o, i]``) as long as each client's block is contiguous. float32 or float64 (one dtype for
    all), CPU tensors only. Everything is checked before anything is written. Returns ``out``.
    """
    c, o, i, P = _check("W", W, X, idx, out, "out", weight_grad=False)
    _run(False, W, X, idx, out, c, o, i, P)
    return out


def linear_gathered_weight_grad(D: torch.Tensor, X: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Weight gradient of every client on its gathered rows: ``out[j] = D[j] @ X[idx[j]]``, i.e.
    ``sum_p outer(D[j, :, p], X[idx[j, p]])``, summed over p = 0, 1, ... in order.

    ``D``: ``[c, o, P]``; ``X``: ``[n, i]``, contiguous; ``idx``: int64 ``[c, P]``, contiguous, every
    entry in ``[0, n)``; ``out``: ``[c, o, i]``, overwritten (not accumulated into). ``D`` and
    ``out`` may have any client stride as long as each client's block is contiguous. Same dtype,
    device and checking rules as ``linear_gathered``. Returns ``out``.
    """
    c, o, i, P = _check("D", D, X, idx, out, "out", weight_grad=True)
    _run(True, D, X, idx, out, c, o, i, P)
    return out


def _run(weight_grad, mat, X, idx, out, c, o, i, P) -> None:
    if c == 0:
        return
    # A single client's stride is never used; pass its block size so the kernel sees a valid layout.
    ms = mat.stride(0) if c > 1 else o * mat.shape[2]
    os_ = out.stride(0) if c > 1 else o * out.shape[2]
    # The kernel checks 0 <= idx < n (one pass over idx) before it writes anything.
    _C.linear_gathered(weight_grad, DTYPE_CODES[X.dtype], c, o, i, P, X.shape[0], mat.data_ptr(), ms,
                       X.data_ptr(), idx.data_ptr(), out.data_ptr(), os_)
    torch._C._increment_version((out,))


def _check(mat_name, mat, X, idx, out, out_name, *, weight_grad):
    named = ((mat_name, mat), ("X", X), ("idx", idx), (out_name, out))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in named:
        if not t.is_cpu:
            raise ValueError(f"{name} is on {t.device}: the gathered linear kernels run on CPU tensors only; on "
                             f"CUDA use torch.index_select (or X[idx]) and torch.bmm")
    for name, t in ((mat_name, mat), ("X", X), (out_name, out)):
        if t.dtype not in _FLOATS:
            raise TypeError(f"{name} must be float32 or float64, got {t.dtype}")
    for name, t in ((mat_name, mat), (out_name, out)):
        if t.dtype != X.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but X has {X.dtype}; all float operands must share a dtype")
    if idx.dtype != torch.int64:
        raise TypeError(f"idx must be an int64 tensor, got {idx.dtype}")
    for name, t, dims in ((mat_name, mat, 3), ("X", X, 2), ("idx", idx, 2), (out_name, out, 3)):
        if t.dim() != dims:
            raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    i, (c, P) = X.shape[1], idx.shape
    o = mat.shape[1]
    mat_shape, out_shape = ((c, o, P), (c, o, i)) if weight_grad else ((c, o, i), (c, o, P))
    if mat.shape != mat_shape:
        raise ValueError(f"{mat_name} has shape {tuple(mat.shape)}, expected {mat_shape} (from idx [c, P] = "
                         f"{tuple(idx.shape)} and X [n, i] = {tuple(X.shape)})")
    if out.shape != out_shape:
        raise ValueError(f"{out_name} has shape {tuple(out.shape)}, expected {out_shape}")
    if not X.is_contiguous():
        raise ValueError("X must be contiguous (the sample matrix is read row by row in place)")
    if not idx.is_contiguous():
        raise ValueError("idx must be contiguous")
    _check_client_blocks(mat_name, mat)
    _check_client_blocks(out_name, out)
    V.not_tracked(out_name, out)
    if out.numel() > 0 and not _C.is_writable(out.data_ptr(), 1):
        raise ValueError(f"{out_name} is backed by read-only memory")
    for name, t in ((mat_name, mat), ("X", X), ("idx", idx)):
        if _overlap(out, t):
            raise ValueError(f"{out_name} shares memory with {name}; the output must not overlap an input")
    return c, o, i, P


def _check_client_blocks(name: str, t: torch.Tensor) -> None:
    """Each client's [o, k] block contiguous; clients at least a block apart (any stride(0))."""
    c, o, k = t.shape
    s0, s1, s2 = t.stride()
    if c == 0 or o * k == 0:
        return
    if (o > 1 and s1 != k) or (k > 1 and s2 != 1):
        raise ValueError(f"{name} must have a contiguous [{o}, {k}] block per client (strides (s, {k}, 1) with any "
                         f"s >= {o * k}), got strides {t.stride()}")
    if c > 1 and s0 < o * k:
        raise ValueError(f"{name} has stride(0) = {s0}, less than its per-client block of {o * k} elements: the "
                         f"clients' blocks overlap")


def _blocks(t: torch.Tensor) -> tuple[int, int, int, int]:
    """Memory of t as `count` byte intervals [start + k * step, start + k * step + length)."""
    size = t.element_size()
    if t.dim() == 3 and t.shape[0] > 1:
        return t.data_ptr(), t.stride(0) * size, t.shape[1] * t.shape[2] * size, t.shape[0]
    return t.data_ptr(), 0, t.numel() * size, 1


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if a and b (each a set of equally spaced, non-overlapping byte blocks) share a byte."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, astep, alen, acount = _blocks(a)
    b0, bstep, blen, bcount = _blocks(b)
    if a0 >= b0 + (bcount - 1) * bstep + blen or b0 >= a0 + (acount - 1) * astep + alen:
        return False  # the overall spans are apart: the common case, decided in O(1)
    if acount > bcount:
        a0, astep, alen, acount, b0, bstep, blen, bcount = b0, bstep, blen, bcount, a0, astep, alen, acount
    for k in range(acount):  # each block of a against the last block of b starting before its end
        s = a0 + k * astep
        e = s + alen
        if e <= b0:
            continue
        m = min((e - 1 - b0) // bstep, bcount - 1) if bstep else 0
        if b0 + m * bstep + blen > s:
            return True
    return False
