"""Plain-PyTorch prox maps and federated updates: what the benchmarks compare fedkernels against.

These are written the way a typical PyTorch user writes them (and the way the FedCanon authors
timed them for their Table I): composed elementwise torch ops, ``torch.where`` chains and
``sign * clamp``, out of place, one call per parameter tensor. They implement the valid-regime
closed forms of docs/algorithms.md §2 (MCP needs ``step < gamma``, SCAD needs ``step < a - 1``;
``check_regime`` asserts it) and double as readable references for the kernels.

Three forms of each prox:

* ``prox_l1(v, step, kappa)`` ... : one tensor in, a new tensor out (the formula);
* ``paper_style_prox(params, kind, ...)``: the per-parameter loop of the paper (out of place, the
  results are returned, nothing is written back);
* ``flat_prox_(x, kind, ...)``: the same formula written back into one flat buffer, the function
  ``torch.compile`` is given (``make_compiled_prox``).

``composed_*`` are the plain-PyTorch compositions of the fused federated updates
(``fk.raw.cv_step_`` etc.), written as in-place-where-natural torch code.
"""

from __future__ import annotations

from typing import Callable, Iterable, List

import torch
from torch import Tensor

__all__ = [
    "KINDS",
    "DEFAULT_PARAMS",
    "check_regime",
    "prox_l1",
    "prox_mcp",
    "prox_scad",
    "PROX",
    "paper_style_prox",
    "flat_prox_",
    "make_compiled_prox",
    "composed_cv_step_",
    "composed_prox_grad_step_",
    "composed_normal_map_step_",
    "composed_za1_step_",
    "composed_control_update_",
]

#: The three penalties of the paper's Table I, in its column order.
KINDS = ("l1", "mcp", "scad")

#: Benchmark settings (effective step, p1, p2) per kind; all in the valid regime
#: (MCP: step 0.1 < gamma 3; SCAD: step 0.1 < a - 1 = 2.7). The kernels' cost does not depend
#: on the values (branch-free selects), the eager formulas' neither (every branch is computed).
DEFAULT_PARAMS = {
    "l1": (0.1, 1e-3, 0.0),  # step, kappa
    "mcp": (0.1, 1e-3, 3.0),  # step, lam, gamma
    "scad": (0.1, 1e-3, 3.7),  # step, lam, a
}


def check_regime(kind: str, step: float, p1: float, p2: float) -> None:
    """Raise if (step, p1, p2) is outside the regime where the closed forms below are valid."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if kind == "mcp" and not step < p2:
        raise ValueError(f"MCP closed form needs step < gamma, got step={step}, gamma={p2}")
    if kind == "scad" and not (p2 > 2 and step < p2 - 1):
        raise ValueError(f"SCAD closed form needs a > 2 and step < a - 1, got step={step}, a={p2}")
    if kind not in PROX:
        raise ValueError(f"kind must be one of {sorted(PROX)}, got {kind!r}")


# --------------------------------------------------------------------------- #
# Per-tensor formulas (docs/algorithms.md §2.1, §2.3, §2.4), out of place
# --------------------------------------------------------------------------- #


def prox_l1(v: Tensor, step: float, kappa: float) -> Tensor:
    """Soft thresholding: sgn(v) * max(|v| - step * kappa, 0)."""
    return torch.sign(v) * torch.clamp(v.abs() - step * kappa, min=0)


def prox_mcp(v: Tensor, step: float, lam: float, gamma: float) -> Tensor:
    """Firm thresholding (MCP, valid for step < gamma)::

        0                              if |v| <= step*lam
        sgn(v) (|v| - step*lam) / (1 - step/gamma)   if step*lam < |v| <= gamma*lam
        v                              if |v| > gamma*lam
    """
    t = v.abs()
    mid = torch.sign(v) * (t - step * lam) / (1 - step / gamma)
    return torch.where(t <= step * lam, torch.zeros_like(v), torch.where(t <= gamma * lam, mid, v))


def prox_scad(v: Tensor, step: float, lam: float, a: float) -> Tensor:
    """SCAD thresholding (valid for step < a - 1)::

        0                                          if |v| <= step*lam
        sgn(v) (|v| - step*lam)                    if step*lam < |v| <= (1+step)*lam
        sgn(v) ((a-1)|v| - step*a*lam) / (a-1-step)  if (1+step)*lam < |v| <= a*lam
        v                                          if |v| > a*lam
    """
    t = v.abs()
    sgn = torch.sign(v)
    soft = sgn * (t - step * lam)
    mid = sgn * ((a - 1) * t - step * a * lam) / (a - 1 - step)
    return torch.where(
        t <= step * lam,
        torch.zeros_like(v),
        torch.where(t <= (1 + step) * lam, soft, torch.where(t <= a * lam, mid, v)),
    )


def _prox_l1_3(v: Tensor, step: float, p1: float, p2: float) -> Tensor:
    return prox_l1(v, step, p1)


#: kind -> f(v, step, p1, p2), out of place.
PROX: dict[str, Callable[[Tensor, float, float, float], Tensor]] = {
    "l1": _prox_l1_3,
    "mcp": prox_mcp,
    "scad": prox_scad,
}


# --------------------------------------------------------------------------- #
# The three shapes the benchmarks time
# --------------------------------------------------------------------------- #


@torch.no_grad()
def paper_style_prox(params: Iterable[Tensor], kind: str, step: float, p1: float, p2: float = 0.0) -> List[Tensor]:
    """The paper-style eager prox: one out-of-place formula per parameter tensor.

    Returns the new tensors (a user would then assign them back, e.g. ``p.data = out``).
    """
    f = PROX[kind]
    return [f(p, step, p1, p2) for p in params]


@torch.no_grad()
def flat_prox_(x: Tensor, kind: str, step: float, p1: float, p2: float = 0.0) -> Tensor:
    """The same formula on one flat buffer, written back in place (``x.copy_(prox(x))``)."""
    return x.copy_(PROX[kind](x, step, p1, p2))


def make_compiled_prox(kind: str, step: float, p1: float, p2: float = 0.0, *,
                       dynamic: bool = True) -> Callable[[Tensor], Tensor]:
    """``torch.compile`` of ``flat_prox_`` with the scalars baked in.

    Inductor fuses the ``torch.where`` chain and the write-back into one in-place loop, the best
    case for compile. ``dynamic=True`` compiles one kernel for every buffer length (one compile per
    kind, reused across models). The first call compiles; time it separately.
    """
    f = PROX[kind]

    def prox_inplace(x: Tensor) -> Tensor:
        return x.copy_(f(x, step, p1, p2))

    prox_inplace.__name__ = f"compiled_{kind}_prox_"
    return torch.compile(prox_inplace, dynamic=dynamic, fullgraph=True)


# --------------------------------------------------------------------------- #
# Plain-PyTorch compositions of the fused federated updates
# --------------------------------------------------------------------------- #


@torch.no_grad()
def composed_cv_step_(x: Tensor, g: Tensor, c: Tensor, beta: float) -> Tensor:
    """Control-variate local step: x <- x - beta (g + c) (SCAFFOLD / FedCanon client step)."""
    return x.add_(g + c, alpha=-beta)


@torch.no_grad()
def composed_prox_grad_step_(z: Tensor, dbar: Tensor, alpha: float, kind: str, step: float, p1: float,
                             p2: float = 0.0) -> Tensor:
    """FedCanon server step: z <- prox_{step p}(z - alpha dbar)."""
    return z.copy_(PROX[kind](z - alpha * dbar, step, p1, p2))


@torch.no_grad()
def composed_normal_map_step_(z: Tensor, x: Tensor, g: Tensor, c: Tensor, eta: float, lam: float, kind: str,
                              step: float, p1: float, p2: float = 0.0) -> tuple[Tensor, Tensor]:
    """FedNMap local step: z <- z - eta (g + c + (z - x)/lam); x <- prox_{step p}(z)."""
    z.sub_(eta * (g + c + (z - x) / lam))
    x.copy_(PROX[kind](z, step, p1, p2))
    return z, x


@torch.no_grad()
def composed_za1_step_(zhat: Tensor, z: Tensor, g: Tensor, c: Tensor, eta: float, kind: str, step: float,
                       p1: float, p2: float = 0.0) -> tuple[Tensor, Tensor]:
    """ZA1 local step: zhat <- zhat - eta (g + c); z <- prox_{step p}(zhat)."""
    zhat.add_(g + c, alpha=-eta)
    z.copy_(PROX[kind](zhat, step, p1, p2))
    return zhat, z


@torch.no_grad()
def composed_control_update_(c: Tensor, dbar: Tensor, d: Tensor) -> Tensor:
    """Control-variate update: c <- c + dbar - d."""
    return c.add_(dbar - d)
