"""Regularizer objects h for composite objectives f(x) + h(x) (docs/algorithms.md §2).

Each regularizer knows its value, its weak-convexity modulus ``rho`` (h + rho/2 ||.||^2 is convex)
and its prox:

    reg.prox_(x, step)   # in place, x <- argmin_u step * h(u) + ||u - x||^2 / 2; returns x
    reg.prox(x, step)    # out of place
    reg.prox_(x, step, fast=True)   # same, on the low-overhead path (fedkernels.raw)
    reg.value(x)         # h(x), summed over all elements (a 0-d tensor, differentiable)
    reg.check_prox_(x, step)   # raises what prox_(x, step) would raise, writes nothing

``step = 0`` is always the identity. MCP and SCAD are exact for **every** step (the kernels switch
to the hard-threshold / two-candidate formulas past step = gamma / a - 1), so no step range is
rejected here; algorithms that rely on a unique, Lipschitz prox check ``step * rho < 1`` themselves.

``kappa * reg`` scales a regularizer (h = kappa * p): the prox uses the effective step
``step * kappa`` (§1.3), the value and ``rho`` scale by kappa.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import _validate as V
from . import ops, raw

__all__ = ["Regularizer", "Zero", "L1", "ElasticNet", "MCP", "SCAD", "Box", "NonNeg", "L2Ball", "GroupLasso",
           "Scaled", "RegularizerEntry", "REGULARIZER_TABLE", "register_regularizer", "regularizer_entry",
           "make_regularizer", "SAME_AS_STRENGTH"]


def _impl(fast: bool):
    return raw if fast else ops


class Regularizer:
    """Base class. Separable penalties with scalar parameters implement ``spec``; the fused
    kernels then apply their prox inside the same pass. Others override ``prox_``."""

    rho: float = 0.0

    def spec(self, step: float) -> Optional[tuple[str, float, float, float]]:
        """(kind, effective step, p1, p2) for the fused kernels, or None if not expressible."""
        return None

    def prox_(self, x: torch.Tensor, step: float, *, fast: bool = False) -> torch.Tensor:
        """In place: x <- prox_{step h}(x); returns x. ``fast=True`` skips the torch dispatcher
        (``fedkernels.raw``: ~10 us instead of ~80 us per call; not traceable by torch.compile)."""
        kind, s, p1, p2 = self._spec_or_raise(step)
        return _impl(fast).prox_(x, kind, s, p1, p2)

    def prox(self, x: torch.Tensor, step: float, *, fast: bool = False) -> torch.Tensor:
        """Out of place: prox_{step h}(x) as a new contiguous tensor."""
        kind, s, p1, p2 = self._spec_or_raise(step)
        return _impl(fast).prox(x, kind, s, p1, p2)

    def check_prox_(self, x: torch.Tensor, step: float) -> None:
        """Raise exactly what ``prox_(x, step)`` would raise for these arguments, writing nothing.

        The fused updates (``fk.fused``) call it before they write anything, for a regularizer
        whose prox is a second pass after the update (no ``spec``): a bad argument then leaves every
        buffer as it was. A penalty of your own that overrides ``prox_`` should override this too
        if its ``prox_`` checks more than ``x`` (a writable float tensor) and ``step`` (>= 0)."""
        spec = self.spec(V.nonneg("step", step))
        V.mutable("x", x)
        if spec is not None:
            raw._penalty(*spec)

    def value(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _spec_or_raise(self, step):
        spec = self.spec(V.nonneg("step", step))
        if spec is None:
            raise NotImplementedError(f"{type(self).__name__} must override prox_ and prox")
        return spec

    def __rmul__(self, kappa: float) -> "Regularizer":
        return Scaled(kappa, self)

    def __mul__(self, kappa: float) -> "Regularizer":
        return Scaled(kappa, self)


class Zero(Regularizer):
    """h = 0 (smooth problems). Its prox is the identity."""

    def spec(self, step):
        return ("zero", step, 0.0, 0.0)

    def prox_(self, x, step, *, fast=False):
        self.check_prox_(x, step)
        return x

    def prox(self, x, step, *, fast=False):
        V.nonneg("step", step)
        V.float_tensor("x", x)
        return x.clone(memory_format=torch.contiguous_format)

    def value(self, x):
        return x.new_zeros(())

    def __repr__(self):
        return "Zero()"


class L1(Regularizer):
    """h(x) = kappa * ||x||_1; prox = soft thresholding at step * kappa (§2.1)."""

    def __init__(self, kappa: float):
        self.kappa = V.nonneg("kappa", kappa)

    def spec(self, step):
        return ("l1", step, self.kappa, 0.0)

    def value(self, x):
        return self.kappa * x.abs().sum()

    def __repr__(self):
        return f"L1(kappa={self.kappa:g})"


class ElasticNet(Regularizer):
    """h(x) = l1 * ||x||_1 + (l2 / 2) * ||x||^2 (§2.2)."""

    def __init__(self, l1: float, l2: float):
        self.l1, self.l2 = V.prox_params("elastic_net", l1, l2)

    def spec(self, step):
        return ("elastic_net", step, self.l1, self.l2)

    def value(self, x):
        return self.l1 * x.abs().sum() + 0.5 * self.l2 * (x * x).sum()

    def __repr__(self):
        return f"ElasticNet(l1={self.l1:g}, l2={self.l2:g})"


class MCP(Regularizer):
    """Minimax concave penalty MCP(lam, gamma), rho = 1 / gamma (§2.3).

    Prox: firm thresholding for step < gamma, hard thresholding at lam * sqrt(step * gamma) for
    step >= gamma (exact; unique except exactly at the threshold, where 0 is returned).
    """

    def __init__(self, lam: float, gamma: float = 3.0):
        self.lam, self.gamma = V.prox_params("mcp", lam, gamma)
        self.rho = 1.0 / self.gamma

    def spec(self, step):
        return ("mcp", step, self.lam, self.gamma)

    def value(self, x):
        t = x.abs()
        inner = self.lam * t - t * t / (2 * self.gamma)
        outer = torch.full_like(t, 0.5 * self.gamma * self.lam**2)
        return torch.where(t <= self.gamma * self.lam, inner, outer).sum()

    def __repr__(self):
        return f"MCP(lam={self.lam:g}, gamma={self.gamma:g})"


class SCAD(Regularizer):
    """Smoothly clipped absolute deviation SCAD(lam, a), rho = 1 / (a - 1) (§2.4).

    Prox: the four-piece closed form for step < a - 1, the exact best-of-two-candidates rule for
    step >= a - 1 (ties resolved to the smaller magnitude).
    """

    def __init__(self, lam: float, a: float = 3.7):
        self.lam, self.a = V.prox_params("scad", lam, a)
        self.rho = 1.0 / (self.a - 1.0)

    def spec(self, step):
        return ("scad", step, self.lam, self.a)

    def value(self, x):
        lam, a = self.lam, self.a
        t = x.abs()
        p1 = lam * t
        p2 = (2 * a * lam * t - t * t - lam**2) / (2 * (a - 1))
        p3 = torch.full_like(t, lam**2 * (a + 1) / 2)
        return torch.where(t <= lam, p1, torch.where(t <= a * lam, p2, p3)).sum()

    def __repr__(self):
        return f"SCAD(lam={self.lam:g}, a={self.a:g})"


class Box(Regularizer):
    """Indicator of {lo <= x <= hi}; prox = clip, independent of the step (§2.5).

    ``lo`` and ``hi`` are numbers (+-inf allowed) or tensors broadcastable to the parameter vector
    (same shape, or one [d] row for a [N, d] stack); ``lo <= hi`` is checked once, here.
    """

    def __init__(self, lo=-math.inf, hi=math.inf):
        self._tensor = isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor)
        if self._tensor:
            lo_t = lo if isinstance(lo, torch.Tensor) else None
            hi_t = hi if isinstance(hi, torch.Tensor) else None
            ref = lo_t if lo_t is not None else hi_t
            V.float_tensor("lo" if lo_t is not None else "hi", ref)
            lo_t = lo_t if lo_t is not None else torch.full_like(ref, V.bound("lo", lo))
            hi_t = hi_t if hi_t is not None else torch.full_like(ref, V.bound("hi", hi))
            V.operand("hi", hi_t, lo_t, "lo")
            if torch.isnan(lo_t).any() or torch.isnan(hi_t).any():
                raise V.ParameterError("lo and hi must not contain NaN", "lo", "hi")
            if (lo_t > hi_t).any():
                bad = int((lo_t > hi_t).nonzero()[0].item()) if lo_t.dim() == 1 else "some"
                raise V.ParameterError(f"lo must be <= hi elementwise (violated at index {bad})", "lo", "hi")
            self.lo, self.hi = lo_t.contiguous(), hi_t.contiguous()
        else:
            self.lo, self.hi = V.prox_params("box", lo, hi)

    def spec(self, step):
        return None if self._tensor else ("box", step, self.lo, self.hi)

    def _bounds_for(self, x):
        return self.lo.to(x.dtype), self.hi.to(x.dtype)

    def check_prox_(self, x, step):
        if not self._tensor:
            return super().check_prox_(x, step)
        V.nonneg("step", step)
        V.mutable("x", x)
        raw._box_bounds(x, *self._bounds_for(x))

    def prox_(self, x, step, *, fast=False):
        V.nonneg("step", step)
        if not self._tensor:
            return _impl(fast).prox_(x, "box", 0.0, self.lo, self.hi)
        return _impl(fast).box_tensor_(x, *self._bounds_for(x))

    def prox(self, x, step, *, fast=False):
        V.nonneg("step", step)
        if not self._tensor:
            return _impl(fast).prox(x, "box", 0.0, self.lo, self.hi)
        return _impl(fast).box_tensor(x, *self._bounds_for(x))

    def value(self, x):
        lo, hi = (self.lo, self.hi)
        inside = (x >= lo) & (x <= hi)
        return x.new_zeros(()) if bool(inside.all()) else x.new_full((), math.inf)

    def __repr__(self):
        if self._tensor:
            return f"Box(lo=<tensor {tuple(self.lo.shape)}>, hi=<tensor {tuple(self.hi.shape)}>)"
        return f"Box(lo={self.lo:g}, hi={self.hi:g})"


class NonNeg(Regularizer):
    """Indicator of {x >= 0}; prox = max(x, 0) (§2.7)."""

    def spec(self, step):
        return ("nonneg", step, 0.0, 0.0)

    def value(self, x):
        return x.new_zeros(()) if bool((x >= 0).all()) else x.new_full((), math.inf)

    def __repr__(self):
        return "NonNeg()"


class L2Ball(Regularizer):
    """Indicator of {||x - center||_2 <= radius} (§2.6). Not separable: its prox is a reduction
    followed by a scale pass; for a [N, d] stack each row is projected on its own."""

    def __init__(self, radius: float, center: Optional[torch.Tensor] = None):
        self.radius = V.nonneg("radius", radius)
        if center is not None:
            V.float_tensor("center", center)
        self.center = center

    def _center_for(self, x):
        return None if self.center is None else self.center.to(x.dtype)

    def check_prox_(self, x, step):
        V.nonneg("step", step)
        V.float_tensor("x", x)
        raw._l2_ball_args(x, self.radius, self._center_for(x))

    def prox_(self, x, step, *, fast=False):
        V.nonneg("step", step)
        return _impl(fast).l2_ball_(x, self.radius, self._center_for(x))

    def prox(self, x, step, *, fast=False):
        out = x.clone(memory_format=torch.contiguous_format)
        return self.prox_(out, step, fast=fast)

    def value(self, x):
        """0 if x (every row of a 2-D stack, as ``prox_`` projects them) lies in the ball, else inf."""
        d = x if self.center is None else x - self.center
        norms = d.norm(dim=1) if d.dim() == 2 else d.norm()
        inside = bool((norms <= self.radius * (1 + 1e-12)).all())
        return x.new_zeros(()) if inside else x.new_full((), math.inf)

    def __repr__(self):
        c = "0" if self.center is None else f"<tensor {tuple(self.center.shape)}>"
        return f"L2Ball(radius={self.radius:g}, center={c})"


class GroupLasso(Regularizer):
    """h(X) = lam * sum_g ||X_g||_2 over the rows (``groups="rows"``) or the columns
    (``groups="cols"``) of a matrix X; convex (rho = 0). Prox: block soft-thresholding,
    X_g <- X_g * max(0, 1 - step * lam / ||X_g||), so whole rows / columns become exactly 0.

    It needs the matrix's shape: ``prox_``/``value`` take a 2-D [R, C] tensor or a [N, R, C] stack
    of matrices. On a model's flat parameter vector use it for one parameter through a
    per-parameter mapping (``fk.PerParameter``, or ``regularizer={"0.weight": GroupLasso(...)}`` in
    ``simulate`` / ``fk.optim.ProxSGD``), which knows each parameter's shape; a parameter with more
    than two dimensions (a conv weight [out, in, kh, kw]) is taken as [out, in * kh * kw].
    Columns of the first layer's weight are the model's input features: ``groups="cols"`` there
    selects features.
    """

    def __init__(self, lam: float, groups: str = "rows"):
        self.lam = V.nonneg("lam", lam)
        if groups not in raw.GROUPS:
            raise V.ParameterError(f"groups must be one of {raw.GROUPS}, got {groups!r}", "groups")
        self.groups = groups

    def check_prox_(self, x, step):
        V.float_tensor("x", x)
        raw._group_lasso_layout(x, self.lam, step, self.groups, None, 0)

    def prox_(self, x, step, *, fast=False):
        return _impl(fast).group_lasso_(x, self.lam, step, self.groups)

    def prox(self, x, step, *, fast=False):
        V.float_tensor("x", x)
        out = x.clone(memory_format=torch.contiguous_format)
        return self.prox_(out, step, fast=fast)

    def value(self, x):
        if x.dim() not in (2, 3):
            raise ValueError(f"GroupLasso needs a 2-D [R, C] matrix or a [N, R, C] stack, got shape {tuple(x.shape)}")
        return self.lam * x.norm(dim=-1 if self.groups == "rows" else -2).sum()

    def __repr__(self):
        return f"GroupLasso(lam={self.lam:g}, groups={self.groups!r})"


class Scaled(Regularizer):
    """h = kappa * base (write ``kappa * base``). prox_{s h} = prox_{(s kappa) base} (§1.3)."""

    def __init__(self, kappa: float, base: Regularizer):
        if not isinstance(base, Regularizer):
            raise TypeError(f"base must be a Regularizer, got {type(base).__name__}")
        self.kappa = V.nonneg("kappa", kappa)
        self.base = base
        self.rho = self.kappa * base.rho

    def spec(self, step):
        return self.base.spec(step * self.kappa)

    def check_prox_(self, x, step):
        self.base.check_prox_(x, V.nonneg("step", step) * self.kappa)

    def prox_(self, x, step, *, fast=False):
        return self.base.prox_(x, V.nonneg("step", step) * self.kappa, fast=fast)

    def prox(self, x, step, *, fast=False):
        return self.base.prox(x, V.nonneg("step", step) * self.kappa, fast=fast)

    def value(self, x):
        return self.kappa * self.base.value(x)

    def __repr__(self):
        return f"{self.kappa:g} * {self.base!r}"


# --------------------------------------------------------------------------------------------------
# Regularizers by name: one table for the built-ins and for a user's own penalty
# --------------------------------------------------------------------------------------------------

SAME_AS_STRENGTH = object()  # an option whose default is the strength (elastic net's l2)


class RegularizerEntry:
    """How a penalty is built from a name, a strength and options (the command line's ``--reg NAME
    --reg-strength S --reg-opt k=v``, a config file, ``--reg-param``).

    ``strength``: the constructor argument that is the penalty's weight (None for a constraint,
    which no weight scales); ``options``: the other constructor arguments with their defaults
    (a default of ``REQUIRED`` must be given); ``whole_model``: False where the penalty needs a
    parameter's shape (group lasso), so it is only offered per parameter.
    """

    REQUIRED = object()

    def __init__(self, name: str, cls: type, strength: Optional[str] = None, options: Optional[dict] = None,
                 whole_model: bool = True):
        if not (isinstance(cls, type) and issubclass(cls, Regularizer)):
            raise TypeError(f"{name}: {cls!r} is not a fedkernels.Regularizer subclass")
        self.name, self.cls, self.strength, self.whole_model = name, cls, strength, whole_model
        self.options = dict(options or {})

    def build(self, strength: float = 0.0, **opts) -> Regularizer:
        """The penalty; unknown or missing options and a strength given to a constraint are errors."""
        unknown = [k for k in opts if k not in self.options]
        if unknown:
            valid = ", ".join(self.options)
            raise ValueError(f"{self.name} has no option {', '.join(unknown)}; "
                             + (f"its options: {valid}" if valid else "it takes no options"))
        if self.strength is None and strength != 0 and self.name != "zero":
            raise ValueError(f"{self.name} is a constraint and has no strength, got {strength!r}"
                             + (f"; its options: {', '.join(self.options)}" if self.options else ""))
        given = {**self.options, **opts}
        missing = [k for k, v in given.items() if v is self.REQUIRED]
        if missing:
            raise V.ParameterError(f"{self.name} needs the option(s) {', '.join(missing)}", *missing)
        derived = {k for k, v in self.options.items() if v is SAME_AS_STRENGTH}
        kwargs = {k: (strength if v is SAME_AS_STRENGTH or (v is None and k in derived) else v)
                  for k, v in given.items()}
        if self.strength is not None:
            kwargs[self.strength] = strength
        return self.cls(**kwargs)

    @classmethod
    def from_class(cls, ref: str, klass: type) -> "RegularizerEntry":
        """A user's penalty: its options are its constructor's arguments (defaults from the
        signature); a class attribute ``strength_arg`` names the one that ``--reg-strength`` sets."""
        import inspect

        if not (isinstance(klass, type) and issubclass(klass, Regularizer)):
            raise TypeError(f"{ref} is not a fedkernels.Regularizer subclass (got {klass!r})")
        strength = getattr(klass, "strength_arg", None)
        options = {}
        for p in list(inspect.signature(klass.__init__).parameters.values())[1:]:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == strength:
                continue
            options[p.name] = cls.REQUIRED if p.default is p.empty else p.default
        return cls(ref, klass, strength, options)


REGULARIZER_TABLE: dict = {}


def register_regularizer(entry: RegularizerEntry) -> RegularizerEntry:
    """Make a penalty known by ``entry.name`` (to ``make_regularizer`` and the command line)."""
    if entry.name in REGULARIZER_TABLE:
        raise ValueError(f"a regularizer named {entry.name!r} is already registered")
    REGULARIZER_TABLE[entry.name] = entry
    return entry


for _entry in (
    RegularizerEntry("zero", Zero),
    RegularizerEntry("l1", L1, strength="kappa"),
    RegularizerEntry("elastic_net", ElasticNet, strength="l1", options={"l2": SAME_AS_STRENGTH}),
    RegularizerEntry("mcp", MCP, strength="lam", options={"gamma": 3.0}),
    RegularizerEntry("scad", SCAD, strength="lam", options={"a": 3.7}),
    RegularizerEntry("box", Box, options={"lo": -1.0, "hi": 1.0}),
    RegularizerEntry("nonneg", NonNeg),
    RegularizerEntry("l2ball", L2Ball, options={"radius": 1.0}),
    RegularizerEntry("group_lasso", GroupLasso, strength="lam", options={"groups": "rows"}, whole_model=False),
):
    register_regularizer(_entry)


def regularizer_entry(name: str) -> RegularizerEntry:
    """The table's entry for ``name``, or a user's class as ``package.module:Class``."""
    if not isinstance(name, str):
        raise TypeError(f"a regularizer name must be a string, got {name!r}")
    if ":" in name:
        return RegularizerEntry.from_class(name, import_reference(name))
    key = name.lower()
    if key not in REGULARIZER_TABLE:
        raise ValueError(f"unknown regularizer {name!r}; valid: {', '.join(REGULARIZER_TABLE)} "
                         "or your own class as package.module:Class")
    return REGULARIZER_TABLE[key]


def make_regularizer(name: str, strength: float = 0.0, **opts) -> Regularizer:
    """A penalty by name (``"scad"``) or by reference (``"mypkg.penalties:Capped"``), e.g.
    ``make_regularizer("mcp", 1e-3, gamma=2.0)``."""
    return regularizer_entry(name).build(strength, **opts)


def import_reference(ref: str):
    """``package.module:attr`` -> the attribute (the convention of uvicorn, gunicorn and Flower apps);
    errors say which part failed."""
    import importlib

    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ValueError(f"{ref!r} is not of the form package.module:Name")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{ref!r}: cannot import module {module!r} ({e})") from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{ref!r}: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
