"""Explicit batched forward/backward for the commonest model: a chain of ``Linear`` layers and
elementwise activations under the cross-entropy loss (logistic regression, MLPs).

``torch.func.vmap(grad(...))`` is general but, for these models, slow on small per-client shapes:
its batching rules pick ``[c, b, in] x [c, in, out]`` products (poor when ``out`` is 10), the
cross-entropy goes through decompositions, and every parameter's gradient is a fresh tensor that
is then concatenated into the gradient stack. Here the pass is a handful of ``torch.bmm`` calls in
a features-by-samples layout, each gradient written by its ``bmm`` / ``sum`` straight into its
slice of the client's row of ``G``.

Which models qualify is decided by :func:`plan_chain`: every leaf module a ``Linear``, ``ReLU``,
``Tanh``, ``Sigmoid``, ``Flatten`` or ``Identity`` (activations may come before the first
``Linear``), every parameter trainable and no buffer, float32 or float64 parameters (float16 /
bfloat16 go to ``torch.func``), the loss the plain mean cross-entropy on integer class labels
(:class:`~python_algos.clients.losses.LossKind` ``plain_ce``: ``F.cross_entropy`` or
``nn.CrossEntropyLoss`` without ``weight`` or ``label_smoothing``, no label equal to
``ignore_index``; the others go to ``torch.func``, exact for them); then the hypothesis "the
forward pass flattens its input and applies the leaves in order" is checked on copies of real
samples and on random ones in float64 against the model itself and ``loss_fn`` (outputs, loss and
gradients); any mismatch, or any exception, leaves the model to ``torch.func``. A pass never
writes its inputs (the samples, the rows).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn
from torch.func import functional_call

import fedkernels as fk

from .losses import LossKind

__all__ = ["LinearChain", "plan_chain"]

_ACTS = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid"}


class LinearChain:
    """The per-client gradients of a Linear/activation chain under the mean cross-entropy.

    ``layers``: ``("linear", w_start, b_start, out, in)`` (offsets into a flat row; ``b_start``
    None without bias) or ``("relu" | "tanh" | "sigmoid",)``."""

    def __init__(self, layers: list, in_features: int, classes: int):
        self.layers = layers
        self.in_features = in_features
        self.classes = classes
        self.act_width = sum(lay[3] for lay in layers if lay[0] == "linear")
        self.first_linear = next(k for k, lay in enumerate(layers) if lay[0] == "linear")

    def reads_rows_in_place(self) -> bool:
        """Whether the first layer can read its samples straight from the clients' sample matrix
        (``idx`` of :meth:`grads_`): the chain starts with a ``Linear`` layer. The kernels that do it
        (``fedkernels.raw.linear_gathered*``, in place of the gather of every step's batch and the
        first layer's two products) run on CPU only: the executor checks the device."""
        return self.layers[0][0] == "linear"

    def grads_(self, rows: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, w: torch.Tensor,
               G: torch.Tensor, idx: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``G[j] <- d/dx sum_p w[j, p] * CE(model_{rows[j]}(xb[j, p]), yb[j, p])`` for every row j;
        returns those weighted losses ``[c]``. ``rows``, ``G``: ``[c, d]`` (rows of a stack);
        ``xb``: ``[c, P, ...]``; ``yb``: ``[c, P]`` class indices; ``w``: ``[c, P]`` sample weights.
        With ``idx`` (``[c, P]`` row numbers; only when :meth:`reads_rows_in_place`), ``xb`` is the
        ``[n, in_features]`` sample matrix and client j's samples are its rows ``idx[j]``."""
        c, P = yb.shape
        # every activation is kept features x samples, [c, f, P]; None: the samples read in place
        hT = None if idx is not None else xb.reshape(c, P, self.in_features).transpose(1, 2)
        saved = []  # (layer, its input transposed) for the backward pass
        for lay in self.layers:
            if lay[0] == "linear":
                _, ws, bs, o, i = lay
                W = rows[:, ws : ws + o * i].view(c, o, i)
                out = aligned(c, o, P, rows)
                if hT is None:
                    z = fk.raw.linear_gathered(W, xb, idx, out)
                elif hT.dtype == torch.bfloat16:  # samples in bfloat16: the "bf16" first-layer path
                    z = fk.first_layer.bmm_bf16(W, hT, out, aligned(c, o, i, hT), aligned(c, o, P, hT))
                else:
                    z = torch.bmm(W, hT, out=out)
                if bs is not None:
                    z.add_(rows[:, bs : bs + o].unsqueeze(2))
                saved.append((lay, hT))
                hT = z
            else:  # before the first Linear, hT is the caller's samples: never written
                hT = _act_(lay[0], hT) if len(saved) > self.first_linear else _act(lay[0], hT)
                saved.append((lay, hT))
        return self._backward(rows, saved, hT, yb, w, G, (xb, idx))

    def _backward(self, rows, saved, logitsT, yb, w, G, source):
        c = logitsT.shape[0]
        # cross-entropy per sample: -log_softmax at the label; d/dlogits = softmax - onehot
        lsm = torch.log_softmax(logitsT, dim=1)  # [c, K, P]
        picked = lsm.gather(1, yb.unsqueeze(1))  # [c, 1, P]
        losses = (picked.squeeze(1) * w).sum(1).neg_()
        d = torch.exp(lsm, out=aligned(c, *lsm.shape[1:], lsm))
        d.scatter_add_(1, yb.unsqueeze(1), torch.full_like(picked, -1.0))
        d.mul_(w.unsqueeze(1))
        for k in range(len(saved) - 1, self.first_linear - 1, -1):  # no parameter before the first Linear
            lay, inT = saved[k]
            if lay[0] != "linear":
                _act_grad_(lay[0], d, inT)
                continue
            _, ws, bs, o, i = lay
            if inT is None:  # the first layer, its samples read in place (grads_'s idx)
                fk.raw.linear_gathered_weight_grad(d, *source, G[:, ws : ws + o * i].view(c, o, i))
            elif inT.dtype == torch.bfloat16:  # the first layer, its samples in bfloat16 ("bf16")
                fk.first_layer.bmm_bf16(d, inT.transpose(1, 2), G[:, ws : ws + o * i].view(c, o, i),
                                        aligned(c, o, d.shape[2], inT), aligned(c, o, i, inT))
            else:
                torch.bmm(d, inT.transpose(1, 2), out=G[:, ws : ws + o * i].view(c, o, i))
            if bs is not None:
                torch.sum(d, 2, out=G[:, bs : bs + o])
            if k > self.first_linear:  # the input's gradient, unless no parameter comes before
                W = rows[:, ws : ws + o * i].view(c, o, i)
                d = torch.bmm(W.transpose(1, 2), d, out=aligned(c, i, d.shape[2], d))
        return losses


def aligned(c: int, a: int, b: int, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised ``[c, a, b]`` tensor whose ``c`` matrices each start on a 64-byte boundary.
    A batched matrix product's bits can depend on its operands' alignment (another BLAS code
    path); aligned operands make a client's gradient independent of its position in a pass, so
    of how clients are cut into passes."""
    n = a * b
    per_line = max(1, 64 // like.element_size())
    return torch.empty(c, -(-n // per_line) * per_line, dtype=like.dtype, device=like.device)[:, :n].view(c, a, b)


def _act_(kind: str, z: torch.Tensor) -> torch.Tensor:
    if kind == "relu":
        return z.clamp_min_(0)
    if kind == "tanh":
        return z.tanh_()
    return z.sigmoid_()


def _act(kind: str, x: torch.Tensor) -> torch.Tensor:
    """The activation into a new tensor (for the samples, which are the caller's)."""
    if kind == "relu":
        return x.clamp_min(0)
    return x.tanh() if kind == "tanh" else x.sigmoid()


def _act_grad_(kind: str, d: torch.Tensor, a: torch.Tensor) -> None:
    """``d <- d * act'(z)`` in place, from the activation's output ``a`` (z itself is not kept)."""
    if kind == "relu":
        d.mul_(a > 0)
    elif kind == "tanh":
        d.mul_(1 - a * a)
    else:
        d.mul_(a * (1 - a))


def _layers(model: nn.Module, flat_sizes: list) -> Optional[tuple]:
    """The chain hypothesis from the leaf modules (None when a leaf is not a chain layer)."""
    if any(True for _ in model.buffers()) or not all(p.requires_grad for p in model.parameters()):
        return None
    layers, offset, width, first = [], 0, None, None
    for m in model.modules():
        if next(m.children(), None) is not None:
            if next(m.parameters(recurse=False), None) is not None:
                return None  # a container with its own parameters: its forward is unknown
            continue
        if isinstance(m, (nn.Flatten, nn.Identity)) and (not isinstance(m, nn.Flatten) or
                                                         (m.start_dim, m.end_dim) == (1, -1)):
            continue
        if type(m) in _ACTS:
            layers.append((_ACTS[type(m)],))
        elif type(m) is nn.Linear:
            if width is not None and m.in_features != width:
                return None
            first = m.in_features if first is None else first
            b = None if m.bias is None else offset + m.weight.numel()
            layers.append(("linear", offset, b, m.out_features, m.in_features))
            offset += m.weight.numel() + (0 if m.bias is None else m.bias.numel())
            width = m.out_features
        else:
            return None
    if first is None or offset != sum(flat_sizes) or width < 2:
        return None
    return layers, first, width


def plan_chain(model: nn.Module, loss_fn: Callable, loss: LossKind, flat_sizes: list, X: Optional[torch.Tensor],
               y: Optional[torch.Tensor], labels: torch.Tensor) -> Optional[LinearChain]:
    """A :class:`LinearChain` when the model is one (see the module docstring), else None.
    ``loss``: the kind of ``loss_fn`` (:mod:`.losses`); ``X``, ``y``: real samples (and labels)
    to check the hypothesis on (copies are used); ``labels``: every client's labels (class
    indices in range, or the loss would not be the plain cross-entropy)."""
    if (not loss.plain_ce or X is None or X.shape[0] < 1 or labels.dtype != torch.int64 or labels.dim() != 1
            or X.dtype not in (torch.float32, torch.float64)):  # float16 / bfloat16: torch.func
        return None
    found = _layers(model, flat_sizes)
    if found is None:
        return None
    layers, first, classes = found
    if X[0].numel() != first or int(labels.min()) < 0 or int(labels.max()) >= classes:
        return None
    chain = LinearChain(layers, first, classes)
    try:
        with torch.enable_grad():  # an executor built under no_grad takes the same path (and bits) as one built with
            return chain if _agrees(chain, model, loss_fn, X, y) else None
    except Exception:  # noqa: BLE001 -- any failure only means: use torch.func
        return None


def _agrees(chain: LinearChain, model: nn.Module, loss_fn: Callable, X: torch.Tensor, y: torch.Tensor) -> bool:
    """The chain's losses and gradients equal the model's and ``loss_fn``'s (float64, autograd) on
    the real samples and on random ones, at random parameters."""
    g = torch.Generator().manual_seed(0)
    names = [n for n, _ in model.named_parameters()]
    d = sum(p.numel() for p in model.parameters())
    P = X.shape[0]
    for Xp in (X.to(torch.float64, copy=True), torch.randn(X.shape, generator=g, dtype=torch.float64)):
        row = torch.randn(1, d, generator=g, dtype=torch.float64) * 0.5
        params, s = {}, 0
        for n, p in zip(names, model.parameters()):
            params[n] = row[0, s : s + p.numel()].view(p.shape).clone().requires_grad_(True)
            s += p.numel()
        loss = loss_fn(functional_call(model, params, (Xp,)), y)
        want = torch.cat([q.reshape(-1) for q in torch.autograd.grad(loss, list(params.values()))])
        G = torch.empty(1, d, dtype=torch.float64)
        w = torch.full((1, P), 1.0 / P, dtype=torch.float64)
        got = chain.grads_(row, Xp.unsqueeze(0), y.unsqueeze(0), w, G)
        if not (torch.allclose(got[0], loss.detach(), rtol=1e-10, atol=0)
                and torch.allclose(G[0], want, rtol=1e-9, atol=1e-12)):
            return False
    return True
