"""Proximal optimizers for your own training loop (the ``torch.optim`` interface).

    opt = fk.optim.ProxSGD(model.parameters(), lr=0.1, regularizer=fk.L1(1e-3), momentum=0.9)
    loss.backward(); opt.step(); opt.zero_grad()     # SGD step, then x <- prox_{lr h}(x)

    opt = fk.optim.Proximal(torch.optim.Adam(model.parameters(), lr=1e-3), fk.L1(1e-3))

``ProxSGD``'s step is exactly ``torch.optim.SGD``'s step followed by the prox of ``lr * h`` on
every parameter of the group that has a gradient (h applied to each parameter tensor: h(x) = sum_p h(p)). A param
group may carry its own ``regularizer`` (``None``: no prox for that group, e.g. biases).

``Proximal`` applies the prox after *any* optimizer's step at each group's ``lr``. For adaptive
methods (Adam, RMSprop, Adagrad) this is the usual heuristic, not an exact proximal method: the
step taken is ``lr`` scaled per coordinate by the optimizer's preconditioner, while the prox uses
the plain ``lr``.

**Per-parameter penalties.** ``regularizer`` (or a group's ``"regularizer"``) may be a mapping from
parameter names or fnmatch patterns to regularizers (``None``: no penalty), with the rules of
``fk.PerParameter`` (an exact name wins, then the first matching pattern; unmatched parameters get
no penalty; a key that decides no parameter is an error). It needs the parameters' names, so pass
``model.named_parameters()`` (torch >= 2.5 optimizers accept named parameters)::

    opt = fk.optim.ProxSGD(model.named_parameters(), lr=0.1,
                           regularizer={"0.weight": fk.GroupLasso(1e-2, groups="cols"), "*.bias": None})

Each parameter then gets its own penalty's prox, a ``GroupLasso`` on the parameter as a matrix
([out, everything else]), any other penalty on the parameter as a flat vector.

Separable penalties (L1, ElasticNet, MCP, SCAD, NonNeg, scalar Box, and their scalings) are
applied with one fused call per parameter, or with one call over the whole flat buffer when the
group's parameters are consecutive views of one buffer (``fk.FlatParams``). Non-separable ones
(L2Ball) and tensor-bound Boxes are applied per parameter tensor. A parameter in another memory
format (``channels_last``, a transposed view) is proxed on a contiguous copy written back in place,
so it gets exactly the result of a contiguous parameter with the same values.

``add_param_group`` takes a group's ``"regularizer"`` (a Regularizer, a mapping, or None) as the
constructor does; a group without one gets the default (a default mapping is then compiled over
the new group's names too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

import torch

from . import ops
from .per_parameter import PerParameter
from .regularizers import GroupLasso, Regularizer, Scaled

__all__ = ["ProxSGD", "Proximal"]


def _check_regularizer(reg, where: str):
    if reg is not None and not isinstance(reg, (Regularizer, Mapping)):
        raise TypeError(f"{where} must be a fedkernels Regularizer, a mapping of parameter names or patterns to "
                        f"Regularizers, or None, got {type(reg).__name__}")
    return reg


def _flat_span(params: list) -> Optional[torch.Tensor]:
    """One [n] tensor covering ``params`` if they are consecutive, contiguous pieces of one buffer
    (``fk.FlatParams`` views) in group order; else None."""
    if len(params) < 2:
        return None
    first = params[0]
    storage = first.untyped_storage()
    ptr, offset, dtype = storage.data_ptr(), first.storage_offset(), first.dtype
    nxt = offset
    for p in params:
        if (p.dtype != dtype or not p.is_contiguous() or p.untyped_storage().data_ptr() != ptr
                or p.storage_offset() != nxt):
            return None
        nxt += p.numel()
    span = torch.empty(0, dtype=dtype, device=first.device)
    span.set_(storage, offset, (nxt - offset,), (1,))
    return span


def _is_group_lasso(reg) -> bool:
    while isinstance(reg, Scaled):
        reg = reg.base
    return isinstance(reg, GroupLasso)


def _check_group_lasso(groups: list, regs: list, default) -> None:
    """A group's GroupLasso treats each parameter as a matrix (``[shape[0], rest]``, as the
    per-parameter form does): a 1-D parameter has no rows or columns to group, and the kernel would
    only say so at the first ``step()``, after the SGD / base step had already changed it."""
    for i, (g, reg) in enumerate(zip(groups, regs)):
        reg = reg if "regularizer" in g else default
        if not _is_group_lasso(reg):
            continue
        names = g.get("param_names") or [None] * len(g["params"])
        for j, (name, p) in enumerate(zip(names, g["params"])):
            if p.dim() < 2:
                which = repr(name) if name else f"parameter {j}"
                raise ValueError(f"param group {i}'s regularizer {reg!r} groups the rows or columns of each parameter, "
                                 f"but {which} has shape {tuple(p.shape)}: put 1-D parameters (biases) in a group "
                                 f"with regularizer=None, or pass named parameters with a mapping such as "
                                 f"{{'0.weight': fk.GroupLasso(...), '*.bias': None}}")


def _prox_param_(p: torch.Tensor, prox_) -> None:
    """Apply the in-place ``prox_`` to parameter ``p`` as its logical (row-major) tensor.

    The kernels write a contiguous tensor in place; a parameter in another memory format
    (``channels_last`` convolution weights, a transposed view) is proxed on a contiguous copy that
    is copied back, so its result is the one a contiguous parameter with the same values gets
    (a GroupLasso's rows and columns, an L2Ball's norm, are those of the logical shape)."""
    if p.is_contiguous():
        prox_(p)
        return
    q = p.contiguous()
    prox_(q)
    p.copy_(q)


class _ProxMixin:
    """The prox pass shared by both optimizers; ``self._default_reg`` is the group fallback."""

    def _compile_mappings(self, groups: list) -> None:
        """Replace every mapping regularizer by a ``PerParameter`` over the names of the groups that
        use it (the default's mapping: every group that does not set its own).

        ``add_param_group`` calls this again over all groups: the mappings compiled before are put
        back first, so a new group that shares a mapping (or takes the default one) is compiled
        together with the old groups, and every key is checked against all their names, exactly as
        in the constructor."""
        compiled = getattr(self, "_compiled", [])  # (PerParameter, the mapping it was built from)

        def source(reg):
            return next((m for pp, m in compiled if pp is reg), reg)

        # Build everything first, assign after: a bad key raises with the groups untouched.
        regs = [source(g["regularizer"]) if "regularizer" in g else None for g in groups]
        default = source(self._default_reg)
        new_compiled = []
        for mapping in {id(r): r for r in regs}.values():
            if not isinstance(mapping, Mapping):
                continue
            named = []
            for g, r in zip(groups, regs):
                if r is not mapping:
                    continue
                if "param_names" not in g:
                    raise TypeError("a regularizer mapping needs the parameters' names: pass model.named_parameters() "
                                    "(or param groups of (name, parameter) pairs) instead of model.parameters()")
                named += list(zip(g["param_names"], g["params"]))
            new_compiled.append((PerParameter(named, mapping), mapping))
        _check_group_lasso(groups, regs, default)  # before assigning: a refusal leaves the groups as they were
        by_id = {id(m): pp for pp, m in new_compiled}
        for g, r in zip(groups, regs):
            if "regularizer" in g:
                g["regularizer"] = by_id.get(id(r), r)
        self._default_reg = by_id.get(id(default), default)
        self._compiled = new_compiled

    def _default_source(self):
        """The default regularizer as the user gave it (a mapping, not its compiled PerParameter)."""
        return next((m for pp, m in getattr(self, "_compiled", []) if pp is self._default_reg), self._default_reg)

    def _recompile_after_add(self, undo) -> None:
        """After a group was added: recompile the mappings over all groups (the new group's names
        join its mapping's); if that raises (a key that decides no parameter, a mapping without
        names), ``undo`` the add so the optimizer is left as it was."""
        try:
            self._compile_mappings(self.param_groups)
        except Exception:
            undo()
            raise

    def _prox_per_parameter(self, group: dict, reg: PerParameter, lr: float, fast: bool) -> None:
        if "param_names" not in group:
            raise TypeError("a PerParameter regularizer needs the parameters' names: pass model.named_parameters() "
                            "(or param groups of (name, parameter) pairs) instead of model.parameters()")
        for name, p in zip(group["param_names"], group["params"]):
            sub = reg.regularizer_of(name)
            if sub is not None and p.grad is not None:
                _prox_param_(p, lambda x, sub=sub, name=name: sub.prox_(reg.view_for(name, x), lr, fast=fast))

    @staticmethod
    def _prox_tensor_lr(group: dict, reg, lr: torch.Tensor) -> bool:
        """Under torch.compile, a separable penalty's prox at a tensor lr through the op that takes
        the step as a tensor (no float(lr), so no graph break); False for other penalties, whose
        prox reads the step as a number."""
        if isinstance(reg, PerParameter) or reg.spec(1.0) is None:
            return False
        spec = reg.spec(lr)  # (kind, lr * kappa as a tensor, p1, p2)
        for p in group["params"]:
            if p.grad is not None:
                _prox_param_(p, lambda x: ops.prox_(x, *spec))
        return True

    def _prox_groups(self) -> None:
        compiling = torch.compiler.is_compiling()
        with torch.no_grad():
            for group in self.param_groups:
                reg = group.get("regularizer", self._default_reg)
                if reg is None:
                    continue
                lr = group["lr"]
                if isinstance(lr, torch.Tensor):
                    if compiling and self._prox_tensor_lr(group, reg, lr):
                        continue
                    lr = lr.item()  # eager (or a penalty without a single-kernel form): the value
                if isinstance(reg, PerParameter):
                    self._prox_per_parameter(group, reg, lr, not compiling)
                    continue
                params = [p for p in group["params"] if p.grad is not None]  # those SGD stepped
                if not params:
                    continue
                # Eager: the low-overhead kernel path (fk.raw) and, for separable penalties, one call
                # over the FlatParams buffer. Under torch.compile: the registered ops, per parameter,
                # so the graph sees every in-place write.
                if not compiling and reg.spec(lr) is not None:
                    span = _flat_span(params)
                    if span is not None:
                        reg.prox_(span, lr, fast=True)
                        continue
                matrix = _is_group_lasso(reg)  # each parameter as [shape[0], rest], like the per-parameter form
                for p in params:
                    _prox_param_(p, lambda x, reg=reg, matrix=matrix, lr=lr:
                                 reg.prox_(x.view(x.shape[0], -1) if matrix else x, lr, fast=not compiling))

    # state_dict: regularizer objects are not tensors (torch.load(weights_only=True) refuses custom
    # classes), so a saved group records only its regularizer's repr; loading keeps this
    # optimizer's own regularizers and checks they describe the same penalties.
    @staticmethod
    def _reg_repr(reg) -> str:
        return repr(reg)

    def _strip(self, sd: dict) -> dict:
        for g in sd["param_groups"]:
            if "regularizer" in g:
                g["regularizer"] = self._reg_repr(g["regularizer"])
        return sd

    def _check_and_restore(self, saved_groups: list, regs: list) -> None:
        for i, (g, reg) in enumerate(zip(saved_groups, regs)):
            if "regularizer" in g and g["regularizer"] != self._reg_repr(reg):
                raise ValueError(f"state_dict param group {i} was saved with regularizer {g['regularizer']}, "
                                 f"this optimizer has {reg!r}; build it with the same regularizer")

    def _regs(self) -> list:
        return [g.get("regularizer", self._default_reg) for g in self.param_groups]


class ProxSGD(_ProxMixin, torch.optim.SGD):
    """Proximal SGD: ``torch.optim.SGD``'s step (momentum, dampening, Nesterov, weight decay as
    there) followed by x <- prox_{lr h}(x) for each param group's regularizer h.

    Args:
        params: parameters or param-group dicts; a group may set ``"regularizer"`` (``None``: no prox).
        lr: learning rate (also the prox step): a float, or a 0-d tensor as PyTorch recommends for
            compiled optimizers with LR schedulers; under ``torch.compile`` a tensor lr reaches the
            prox of a separable penalty as a tensor (no graph break), other penalties read its value.
        regularizer: the default h for groups that do not set one (``None``: plain SGD), or a
            mapping of parameter names / patterns to regularizers (needs named parameters).
        momentum, dampening, nesterov, weight_decay: as in ``torch.optim.SGD``.
    """

    def __init__(self, params, lr: float = 1e-3, regularizer: Optional[Regularizer] = None, momentum: float = 0,
                 dampening: float = 0, nesterov: bool = False, weight_decay: float = 0, **sgd_kwargs):
        self._default_reg = _check_regularizer(regularizer, "regularizer")
        self._ready = False
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
                         weight_decay=weight_decay, **sgd_kwargs)
        for i, g in enumerate(self.param_groups):
            g.setdefault("regularizer", self._default_reg)
            _check_regularizer(g["regularizer"], f"param group {i}'s regularizer")
        self._compile_mappings(self.param_groups)
        self._ready = True

    def add_param_group(self, param_group: dict) -> None:
        """As ``torch.optim.SGD.add_param_group``; the group may set ``"regularizer"`` (a
        Regularizer, a mapping of names / patterns, or None), else it gets the default."""
        if not getattr(self, "_ready", False):  # the constructor's groups: compiled there
            super().add_param_group(param_group)
            return
        param_group.setdefault("regularizer", self._default_source())
        _check_regularizer(param_group["regularizer"], "param_group['regularizer']")
        super().add_param_group(param_group)
        self._recompile_after_add(self.param_groups.pop)

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        self._prox_groups()
        return loss

    def state_dict(self):
        return self._strip(super().state_dict())

    def load_state_dict(self, state_dict: dict) -> None:
        regs = self._regs()
        self._check_and_restore(state_dict["param_groups"], regs)
        super().load_state_dict(state_dict)
        for g, reg in zip(self.param_groups, regs):
            g["regularizer"] = reg


class Proximal(_ProxMixin, torch.optim.Optimizer):
    """``base_optimizer``'s step followed by x <- prox_{lr h}(x) at each group's ``lr``.

    Shares ``param_groups`` and ``state`` with the base optimizer, so LR schedulers built on
    this object (or on the base) change the step the prox uses too. A base param group may set
    its own ``"regularizer"`` (``None``: no prox). With adaptive optimizers (Adam, ...) this is
    the usual heuristic, not an exact proximal-gradient method (see the module docstring).
    """

    def __init__(self, base_optimizer: torch.optim.Optimizer, regularizer: Optional[Regularizer]):
        if not isinstance(base_optimizer, torch.optim.Optimizer):
            raise TypeError(f"base_optimizer must be a torch.optim.Optimizer, got {type(base_optimizer).__name__}")
        self._default_reg = _check_regularizer(regularizer, "regularizer")
        for i, g in enumerate(base_optimizer.param_groups):
            _check_regularizer(g.get("regularizer"), f"param group {i}'s regularizer")
        self.base = base_optimizer
        self._ready = False
        # The base's group dicts are registered as-is (add_param_group keeps the dict objects), so
        # both optimizers see one set of hyper-parameters; the state is the base's.
        super().__init__(base_optimizer.param_groups, base_optimizer.defaults)
        self.state = base_optimizer.state
        if isinstance(self._default_reg, Mapping):
            for g in self.param_groups:
                g.setdefault("regularizer", self._default_reg)
        self._compile_mappings(self.param_groups)
        self._ready = True

    def add_param_group(self, param_group: dict) -> None:
        """Adds the group to the base optimizer too; it may set ``"regularizer"`` (a Regularizer,
        a mapping of names / patterns, or None), else it gets the default."""
        if not getattr(self, "_ready", False):  # the base's groups, registered by the constructor
            super().add_param_group(param_group)
            return
        _check_regularizer(param_group.get("regularizer"), "param_group['regularizer']")
        if isinstance(self._default_source(), Mapping):
            param_group.setdefault("regularizer", self._default_source())
        self.base.add_param_group(param_group)
        super().add_param_group(param_group)

        def undo():
            self.param_groups.pop()
            self.base.param_groups.pop()

        self._recompile_after_add(undo)

    def step(self, closure=None):
        loss = self.base.step(closure)
        self._prox_groups()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none)

    def state_dict(self):
        return self._strip(self.base.state_dict())

    def load_state_dict(self, state_dict: dict) -> None:
        regs = self._regs()
        self._check_and_restore(state_dict["param_groups"], regs)
        had = [("regularizer" in g, g.get("regularizer")) for g in self.base.param_groups]
        self.base.load_state_dict(state_dict)
        for g, (has, reg) in zip(self.base.param_groups, had):
            if has:
                g["regularizer"] = reg
            else:
                g.pop("regularizer", None)
        self.param_groups[:] = self.base.param_groups
        self.state = self.base.state

    def __repr__(self):
        return f"Proximal({self.base!r}, regularizer={self._default_reg!r})"
