"""A heterogeneous least-squares test problem with closed-form gradients (the reference side) and a
closed-form client backend for long convergence runs.

f_i(x) = (1/m) ||A_i x − b_i||², client-specific optima; the model is ``nn.Linear(d, 1, bias=False)``
with an MSE loss, so ``SequentialClients`` computes the same f_i by autograd. ``ClosedFormClients``
(for ``simulate(..., backend=problem.backend)``) replaces the per-client autograd passes by one
batched closed-form gradient: the algorithms under test run unchanged, only faster. Everything
here is plain torch, independent of python_algos' algorithms and of fedkernels.
"""

from __future__ import annotations

import torch
from torch import nn

import python_algos as pa


def soft(v, t):
    return v.sign() * (v.abs() - t).clamp_min(0)


class LeastSquares:
    def __init__(self, seed=0, n=6, d=20, m=40, spread=0.5):
        g = torch.Generator().manual_seed(seed)
        x_true = torch.randn(d, generator=g, dtype=torch.float64) * (torch.rand(d, generator=g) < 0.5)
        As, bs = [], []
        for _ in range(n):
            A = torch.randn(m, d, generator=g, dtype=torch.float64)
            x_i = x_true + spread * torch.randn(d, generator=g, dtype=torch.float64)
            As.append(A)
            bs.append(A @ x_i + 0.1 * torch.randn(m, generator=g, dtype=torch.float64))
        self.A, self.b = torch.stack(As), torch.stack(bs)  # [n, m, d], [n, m]
        self.data = list(zip(As, bs))
        self.n, self.d, self.m = n, d, m
        self.H = 2.0 / m * torch.einsum("nmd,nme->nde", self.A, self.A)  # Hessians of f_i
        self.q = 2.0 / m * torch.einsum("nmd,nm->nd", self.A, self.b)  # ∇f_i(x) = H_i x − q_i
        self.L = float(torch.linalg.eigvalsh(self.H.mean(0)).max())
        torch.manual_seed(seed + 1)
        self.x0 = nn.Linear(d, 1, bias=False).double().weight.detach().reshape(-1).clone()

    # -- closed forms ----------------------------------------------------------------------
    def grad_i(self, i, x):
        return self.H[i] @ x - self.q[i]

    def grads(self, X, ids=None):
        """[k, d] gradients, row j of client ids[j] (all clients when ids is None)."""
        H, q = (self.H, self.q) if ids is None else (self.H[ids], self.q[ids])
        return torch.einsum("nde,ne->nd", H, X) - q

    def grad(self, x):
        return self.H.mean(0) @ x - self.q.mean(0)

    def f(self, x):
        return float(((torch.einsum("nmd,d->nm", self.A, x) - self.b) ** 2).mean())

    def prox_f_i(self, i, v, eta):
        """prox_{η f_i}(v) = argmin f_i(x) + ||x − v||²/(2η) = (I + η H_i)^{-1} (v + η q_i)."""
        return torch.linalg.solve(torch.eye(self.d, dtype=torch.float64) + eta * self.H[i], v + eta * self.q[i])

    def solution(self, kappa, gamma=1.0):
        """argmin γ f + kappa ||x||_1 by centralized proximal gradient, to machine precision."""
        x = torch.zeros(self.d, dtype=torch.float64)
        s = 1.0 / (gamma * self.L)
        for _ in range(5000):  # linear rate 1 − μ/L ≈ 2/3: machine precision in ~100 steps
            x_new = soft(x - s * gamma * self.grad(x), s * kappa)
            done = float((x_new - x).norm()) <= 1e-15 * (1.0 + float(x.norm()))  # round-off level
            x = x_new
            if done:
                break
        G = (x - soft(x - s * gamma * self.grad(x), s * kappa)) / s
        assert float(G.norm()) < 1e-12
        return x

    # -- python_algos side ---------------------------------------------------------------------
    def model(self):
        model = nn.Linear(self.d, 1, bias=False).double()
        with torch.no_grad():
            model.weight.copy_(self.x0.reshape(1, -1))
        return model

    @staticmethod
    def loss(out, y):
        return nn.functional.mse_loss(out.squeeze(-1), y)

    def clients(self, **kw):
        """The real in-process client set (autograd gradients)."""
        return pa.SequentialClients(self.model(), self.loss, self.data, **kw)

    def backend(self, model, loss_fn, data, **kw):
        """``simulate(..., backend=problem.backend)``: closed-form gradients."""
        return ClosedFormClients(self, model, loss_fn, data, **kw)


class ClosedFormClients(pa.SequentialClients):
    """SequentialClients whose gradients (full local ones only) come from the closed form."""

    def __init__(self, problem, *args, **kw):
        super().__init__(*args, **kw)
        assert self.batch_size is None
        self.problem = problem
        self.sampled = []  # every participant set drawn (None: full participation)

    def participants(self):
        ids = super().participants()
        self.sampled.append(None if ids is None else ids.clone())
        return ids

    def gradients_(self, X, G, ids=None):
        G.copy_(self.problem.grads(X, ids))
        self.grad_evals += X.shape[0]
        return G

    def full_objective_(self, x, grad_out):
        grad_out.copy_(self.problem.grad(x))
        return self.problem.f(x)
