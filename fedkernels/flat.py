"""Flat parameter buffers: a module's parameters (and their .grad) as views into one vector.

    flat = fk.FlatParams(model)
    loss.backward()            # gradients land in flat.grad, a single [d] tensor
    fk.raw.prox_(flat.params, "l1", 0.01, 1.0)   # one kernel over the whole model

Clients can then be rows of an ``[N, d]`` stack: ``flat.bind_(X[i])`` points the module's
parameters at row i without copying, so a forward/backward pass reads and its gradient is written
where the algorithm keeps them.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["FlatParams"]


class FlatParams:
    """Make ``module``'s trainable parameters views into one contiguous buffer.

    Args:
        module: the model. Parameters with ``requires_grad=False`` and buffers (e.g. BatchNorm
            running statistics) are left alone.
        dtype, device: of the flat buffer (default: those of the first parameter).

    Attributes:
        params: the [d] buffer the parameters view.
        grad: the [d] buffer the parameters' ``.grad`` view. ``flat.zero_grad()`` zeroes it in
            place. ``module.zero_grad()`` / ``optimizer.zero_grad()`` set every ``.grad`` to None
            (and the next backward allocates new ones): reading ``flat.grad`` notices, copies the
            module's current gradients into the buffer (zero where ``.grad`` is None) and points
            ``.grad`` back at it, so it always holds the gradient the module has.
        numel: d.
    """

    def __init__(self, module: nn.Module, dtype: torch.dtype | None = None, device=None):
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        self.module = module
        self._params = [p for p in module.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("module has no trainable parameters")
        first = self._params[0]
        dtype = dtype or first.dtype
        device = torch.device(device) if device is not None else first.device
        self.shapes = [p.shape for p in self._params]
        self.sizes = [p.numel() for p in self._params]
        self.numel = sum(self.sizes)
        with torch.no_grad():
            params = torch.cat([p.detach().reshape(-1).to(dtype=dtype, device=device) for p in self._params])
        self.params = params
        self._grad = torch.zeros_like(params)
        self._grad_views: list[torch.Tensor] = []
        self.bind_(params, self._grad)

    def views(self, vector: torch.Tensor) -> list[torch.Tensor]:
        """Per-parameter views of a [d] vector, shaped like the parameters."""
        if vector.dim() != 1 or vector.numel() != self.numel:
            raise ValueError(f"vector must have shape ({self.numel},), got {tuple(vector.shape)}")
        return [v.view(s) for v, s in zip(vector.split(self.sizes), self.shapes)]

    def bind_(self, params: torch.Tensor, grad: torch.Tensor | None = None) -> "FlatParams":
        """Point the module's parameters (and optionally their .grad) at other [d] buffers,
        e.g. rows of an [N, d] client stack. No data is copied."""
        if not params.is_contiguous():
            raise ValueError("params must be contiguous")
        for p, v in zip(self._params, self.views(params)):
            p.data = v
        self.params = params
        if grad is not None:
            if grad.shape != params.shape or not grad.is_contiguous():
                raise ValueError("grad must be a contiguous tensor shaped like params")
            self._point_grads(grad, self.views(grad))
        return self

    def _point_grads(self, grad: torch.Tensor, views: list[torch.Tensor]) -> None:
        for p, v in zip(self._params, views):
            p.grad = v
        self._grad = grad
        self._grad_views = views

    @property
    def grad(self) -> torch.Tensor:
        """The [d] gradient buffer, holding the module's current gradients (see the class doc)."""
        views = self._grad_views
        for p, v in zip(self._params, views):
            g = p.grad
            if g is None or g.data_ptr() != v.data_ptr():
                self._rebind_grads()
                break
        return self._grad

    def _rebind_grads(self) -> None:
        """Some .grad no longer views the buffer (set to None by module.zero_grad(), then maybe
        re-allocated by backward): take the module's gradients into the buffer and re-point."""
        with torch.no_grad():
            for p, v in zip(self._params, self._grad_views):
                g = p.grad
                if g is None:
                    v.zero_()
                elif g.data_ptr() != v.data_ptr():
                    v.copy_(g)
                p.grad = v

    def row_binder(self, params_stack: torch.Tensor, grad_stack: torch.Tensor | None = None):
        """A fast ``bind(i)``: point the module at row i of a [N, d] stack (and its gradient stack).

        The per-parameter views of every row are built once here, so each ``bind(i)`` only
        re-points ``.data`` / ``.grad`` (a few microseconds per parameter tensor), instead of
        re-slicing the buffers as ``bind_`` does. The returned callable keeps the stacks alive;
        build a new binder if the stacks are reallocated.
        """
        for name, stack in (("params_stack", params_stack), ("grad_stack", grad_stack)):
            if stack is None:
                continue
            if stack.dim() != 2 or stack.shape[1] != self.numel or not stack.is_contiguous():
                raise ValueError(f"{name} must be a contiguous [N, {self.numel}] tensor, got {tuple(stack.shape)}")
        if grad_stack is not None and grad_stack.shape != params_stack.shape:
            raise ValueError("grad_stack must have the shape of params_stack")
        rows = [self.views(r) for r in params_stack]
        grows = [self.views(r) for r in grad_stack] if grad_stack is not None else None
        params = self._params

        def bind(i: int) -> None:
            for p, v in zip(params, rows[i]):
                p.data = v
            self.params = params_stack[i]
            if grows is not None:
                for p, g in zip(params, grows[i]):
                    p.grad = g
                self._grad = grad_stack[i]
                self._grad_views = grows[i]

        return bind

    def zero_grad(self) -> None:
        """Zero the flat gradient buffer (keeping every .grad a view of it)."""
        self._grad.zero_()
        for p, v in zip(self._params, self._grad_views):
            if p.grad is None or p.grad.data_ptr() != v.data_ptr():
                p.grad = v

    def load_(self, vector: torch.Tensor) -> None:
        """Copy a [d] vector into the bound parameter buffer."""
        with torch.no_grad():
            self.params.copy_(vector)

    def __repr__(self):
        return f"FlatParams(numel={self.numel}, tensors={len(self._params)}, dtype={self.params.dtype})"
