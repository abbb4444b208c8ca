"""Per-parameter regularizers: h(x) = sum_p h_p(x_p), one penalty per parameter of a model.

    reg = fk.PerParameter(model, {"0.weight": fk.GroupLasso(1e-2, groups="cols"),
                                  "*.bias": None,
                                  "*": fk.L1(1e-4)})
    reg.prox_(flat.params, step)       # the model's flat [d] vector, or a [N, d] client stack
    reg.value(flat.params)             # sum over the parameters

``simulate(..., regularizer={...})`` and ``fk.optim.ProxSGD(model.named_parameters(),
regularizer={...})`` build one from a plain mapping.

**Which key decides a parameter.** Keys are parameter names as ``model.named_parameters()`` spells
them (``"0.weight"``, ``"net.fc1.bias"``) or ``fnmatch`` patterns (``"*.bias"``, ``"encoder.*"``;
``*`` also crosses dots). A key equal to the parameter's name wins; otherwise the first pattern
that matches, in the mapping's order. A parameter that no key matches gets no penalty: give
``"*"`` as the last key for a default. ``None`` (or ``fk.Zero()``) means no penalty. A key that
decides no parameter raises ``ValueError`` naming it: a pattern that matches no name (a typo) and
one that only matches parameters an earlier key already decides (put it before that key).

**Layout.** The mapping is compiled once, from the parameters' names, shapes and offsets in the
flat vector (the order of ``fk.FlatParams``: trainable parameters in ``named_parameters()``
order), into segments [start, stop). Each prox is one fused call per segment; consecutive
parameters under equal separable penalties (L1, ElasticNet, MCP, SCAD, NonNeg, scalar Box, their
scalings) share one segment. A non-separable penalty applies to each parameter on its own: an
``L2Ball`` keeps every parameter in its own ball, a ``GroupLasso`` sees the parameter's shape
(dims past the second folded into the columns). Every other penalty sees the parameter as a flat
vector (tensor bounds of a ``Box`` are therefore [numel] vectors).

**Cost.** On a flat [d] vector every segment is a contiguous slice: no copies. On a [N, d] client
stack a segment is a column block: separable penalties and ``GroupLasso`` address it with strides
(no copy) on the low-overhead path (``fast=True``, what the algorithms use); ``L2Ball``, tensor
``Box`` and the traced path (``fast=False``) copy the block out and back (two extra passes over
it). In fused updates (``fk.fused.*``) the prox is a second pass after the update, as for every
regularizer without a single-kernel form. ``rho`` is the largest of the segments'; algorithms
check their prox step against each segment.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Optional

import torch
from torch import nn

from . import _validate as V
from . import ops, profiling, raw
from .regularizers import GroupLasso, Regularizer, Scaled, Zero

__all__ = ["PerParameter", "Segment"]


@dataclasses.dataclass(frozen=True)
class Segment:
    """One fused call: elements [start, stop) of the flat vector under ``reg``.

    ``names``: the parameters it covers; ``key``: the mapping key that chose ``reg``; ``matrix``:
    (R, C) of the parameter for a GroupLasso (None otherwise)."""

    start: int
    stop: int
    reg: Regularizer
    names: tuple
    key: str
    matrix: Optional[tuple] = None


def _unscale(reg: Regularizer) -> tuple[float, Regularizer]:
    kappa = 1.0
    while isinstance(reg, Scaled):
        kappa *= reg.kappa
        reg = reg.base
    return kappa, reg


def _is_none(reg) -> bool:
    if reg is None:
        return True
    kappa, base = _unscale(reg)
    return kappa == 0.0 or isinstance(base, Zero)


def _separable(reg: Regularizer) -> bool:
    return reg.spec(1.0) is not None


def _mergeable(a: Regularizer, b: Regularizer) -> bool:
    """Equal separable penalties: one fused call may cover both parameters."""
    if not (_separable(a) and _separable(b)):
        return False
    return a is b or (a.spec(1.0) == b.spec(1.0) and a.spec(2.0) == b.spec(2.0) and a.rho == b.rho)


def _named_shapes(model) -> list[tuple[str, tuple]]:
    if isinstance(model, nn.Module):
        return [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]
    out = []
    for item in model:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError("model must be an nn.Module or (name, parameter or shape) pairs, "
                            f"got an item {item!r}")
        name, p = item
        out.append((name, tuple(p.shape) if isinstance(p, torch.Tensor) else tuple(p)))
    return out


def resolve(names: list[str], mapping) -> dict:
    """{parameter name: deciding key or None} under the rules of this module; raises for a key
    that decides nothing, or for a value that is not a Regularizer or None."""
    if not isinstance(mapping, Mapping):
        raise TypeError(f"the regularizer mapping must be a dict of name or pattern -> Regularizer or None, "
                        f"got {type(mapping).__name__}")
    for k, v in mapping.items():
        if not isinstance(k, str) or not k:
            raise TypeError(f"regularizer mapping keys must be non-empty strings (names or patterns), got {k!r}")
        if v is not None and not isinstance(v, Regularizer):
            raise TypeError(f"regularizer mapping key {k!r}: the value must be a fedkernels Regularizer or None, "
                            f"got {type(v).__name__}")
    decided = {}
    for n in names:
        decided[n] = n if n in mapping else next((k for k in mapping if fnmatchcase(n, k)), None)
    used = set(decided.values())
    for k in mapping:
        if k in used:
            continue
        matches = [n for n in names if fnmatchcase(n, k)]
        if not matches:
            shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
            raise V.ParameterError(f"regularizer key {k!r} matches no parameter of the model; its parameters: "
                                   f"{shown}", k)
        winner = decided[matches[0]]
        raise V.ParameterError(f"regularizer key {k!r} decides no parameter: {matches[0]!r} goes to {winner!r} (an "
                               f"exact name wins, then the first matching pattern in order); put {k!r} before "
                               f"{winner!r}", k, winner)
    return decided


class PerParameter(Regularizer):
    """h(x) = sum_p h_p(x_p) for the parameters of ``model`` (see the module docstring).

    Args:
        model: an ``nn.Module`` (its trainable parameters, in the flat order of ``fk.FlatParams``),
            or a list of ``(name, parameter or shape)`` pairs in flat order.
        mapping: parameter name or fnmatch pattern -> Regularizer or None.

    Attributes: ``segments`` (list of :class:`Segment`), ``numel`` (d), ``rho`` (max over segments).
    """

    def __init__(self, model, mapping):
        named = _named_shapes(model)
        names = [n for n, _ in named]
        decided = resolve(names, mapping)
        self.mapping = dict(mapping)
        self._by_name = {n: (decided[n], None if decided[n] is None else mapping[decided[n]]) for n in names}
        self._shapes = dict(named)
        segments: list[Segment] = []
        offset = 0
        for name, shape in named:
            numel = _numel(shape)
            start, offset = offset, offset + numel
            key, reg = self._by_name[name]
            if _is_none(reg) or numel == 0:
                continue
            matrix = self._matrix(name, shape, key, reg)
            last = segments[-1] if segments else None
            if (last is not None and matrix is None and last.matrix is None and last.stop == start
                    and _mergeable(last.reg, reg)):
                segments[-1] = dataclasses.replace(last, stop=offset, names=last.names + (name,))
            else:
                segments.append(Segment(start, offset, reg, (name,), key, matrix))
        self.segments = segments
        self.numel = offset
        self.rho = max((float(s.reg.rho) for s in segments), default=0.0)

    @staticmethod
    def _matrix(name, shape, key, reg) -> Optional[tuple]:
        _, base = _unscale(reg)
        if not isinstance(base, GroupLasso):
            return None
        if len(shape) < 2:
            raise V.ParameterError(f"regularizer key {key!r}: {reg!r} needs a parameter with 2 or more dimensions "
                                   f"(its rows or columns are the groups), but {name!r} has shape {shape}", key)
        rows = shape[0]
        return (rows, _numel(shape) // rows)

    def regularizer_of(self, name: str) -> Optional[Regularizer]:
        """The penalty of parameter ``name`` (None: no penalty)."""
        if name not in self._by_name:
            raise KeyError(f"{name!r} is not a trainable parameter of the model this PerParameter was built for")
        reg = self._by_name[name][1]
        return None if _is_none(reg) else reg

    def view_for(self, name: str, p: torch.Tensor) -> torch.Tensor:
        """A view of parameter ``p`` as the penalty of ``name`` sees it: [R, C] for a GroupLasso,
        flat otherwise (so an L2Ball keeps the whole parameter in one ball)."""
        reg = self.regularizer_of(name)
        if reg is not None and isinstance(_unscale(reg)[1], GroupLasso):
            return p.view(p.shape[0], -1)
        return p.view(-1)

    def parts(self) -> list[tuple[str, Regularizer]]:
        """(description, regularizer) per segment, for per-segment step-rule checks."""
        return [(f"{s.key!r} on {', '.join(s.names)}", s.reg) for s in self.segments]

    def _check(self, x) -> None:
        V.float_tensor("x", x)
        if x.dim() not in (1, 2) or x.shape[-1] != self.numel:
            raise ValueError(f"x has shape {tuple(x.shape)}, expected ({self.numel},) or (N, {self.numel}): the flat "
                             f"parameters of the model this per-parameter regularizer was built for")

    def check_prox_(self, x, step) -> None:
        """Every check of ``prox_``, segment by segment, before any segment is written: a bad
        argument of the last segment (a tensor Box bound of the wrong length, say) must not leave
        the first ones already proxed."""
        step = V.nonneg("step", step)
        self._check(x)
        V.mutable("x", x)
        for seg in self.segments:
            if seg.matrix is not None:
                kappa, base = _unscale(seg.reg)
                raw._group_lasso_layout(x, base.lam, step * kappa, base.groups, seg.matrix, seg.start)
            elif x.dim() == 1 or x.shape[0] == 1:
                seg.reg.check_prox_(x[..., seg.start:seg.stop], step)
            else:  # _apply proxes a contiguous copy of the column block: check one of its shape
                seg.reg.check_prox_(x.new_empty((x.shape[0], seg.stop - seg.start)), step)

    def prox_(self, x, step, *, fast=False):
        self.check_prox_(x, step)
        step = V.nonneg("step", step)
        stats = profiling.active()
        t0 = time.perf_counter()
        with profiling.paused():  # one evaluation per model (row), however many segments
            for seg in self.segments:
                self._apply(seg, x, step, fast)
        if stats is not None and self.segments:
            stats.seconds += time.perf_counter() - t0
            stats.evaluations += V.extent(x)[0]
            stats.calls += 1
        return x

    def _apply(self, seg: Segment, x: torch.Tensor, step: float, fast: bool) -> None:
        impl = raw if fast else ops
        if seg.matrix is not None:
            kappa, base = _unscale(seg.reg)
            impl.group_lasso_(x, base.lam, step * kappa, base.groups, shape=seg.matrix, start=seg.start)
            return
        if x.dim() == 1 or x.shape[0] == 1:  # a contiguous slice
            seg.reg.prox_(x[..., seg.start:seg.stop], step, fast=fast)
            return
        spec = seg.reg.spec(step) if fast else None
        if spec is not None:  # a strided column block of the stack, no copy
            raw._prox_columns_(x, seg.start, seg.stop, *spec)
            return
        block = x[:, seg.start:seg.stop].contiguous()
        seg.reg.prox_(block, step, fast=fast)
        x[:, seg.start:seg.stop].copy_(block)

    def prox(self, x, step, *, fast=False):
        self._check(x)
        out = x.detach().clone(memory_format=torch.contiguous_format)
        return self.prox_(out, step, fast=fast)

    def value(self, x):
        self._check(x)
        total = x.new_zeros(())
        for seg in self.segments:
            block = x[..., seg.start:seg.stop]
            if seg.matrix is not None:
                block = block.reshape(*x.shape[:-1], *seg.matrix)
            total = total + seg.reg.value(block)
        return total

    def __repr__(self):
        body = ", ".join(f"{k!r}: {v!r}" for k, v in self.mapping.items())
        return f"PerParameter({{{body}}})"


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
