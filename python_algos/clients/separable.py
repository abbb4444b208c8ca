"""Is a client's loss a mean of independent per-sample losses?  And a guard for side-effect-free passes.

Two shortcuts of the executors are exact only when ``loss_fn(model(X), y)`` is the *mean* of
per-sample losses and each sample's output depends on that sample alone:

* the batched executor pads a short batch with zero-weight copies of one sample, so that clients
  of unequal batch sizes share one vectorized pass;
* both executors split a batch too large for one pass into pieces weighted by their share.

A BatchNorm in training mode (batch statistics, with or without running statistics), a layer such
as ``x - x.mean(0)``, a ``reduction="sum"`` loss or a class-weighted mean couple the samples of a
batch: padding or splitting would then change the loss. :func:`separability` finds them before any
round: the module types, a probe of the model's rows on samples chosen to expose coupling (several
clients and labels, :func:`probe_samples`), and the loss's kind (:mod:`.losses`: known losses by
their type, options and labels; other callables probed on copies). The executors then compute
every batch whole, exactly as ``loss_fn(model(X), y)`` is written (never a silent change of the
objective).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from .data import ClientData, TensorData
from .losses import LossKind, loss_kind

__all__ = ["PROBE_SAMPLES", "Separability", "all_labels", "probe_samples", "separability", "side_effect_free",
           "training_side_effects"]

_BATCH_STAT_NORMS = (nn.modules.batchnorm._BatchNorm,)  # BatchNorm1d/2d/3d, SyncBatchNorm, Lazy*
PROBE_SAMPLES = 4  # samples of each probed client run through model and loss


@contextlib.contextmanager
def side_effect_free(model: nn.Module, device: torch.device):
    """Run passes that must leave no trace: every module buffer (BatchNorm running statistics,
    ``num_batches_tracked``) is restored afterwards, and so is torch's global random state (a
    dropout layer in a metric pass must not shift the random numbers of the training that follows)."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to the rounding of the dtype (coupling effects are O(1)); float32: 1e-4. Tight: a
    false "coupled" only costs speed (batches computed whole), a false "independent" is wrong."""
    if a.shape != b.shape:
        return False
    if not a.numel():
        return True
    tol = 1e-9 if a.dtype == torch.float64 else 1e-4 if a.dtype == torch.float32 else 4 * torch.finfo(a.dtype).eps
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-30)
    return bool(((a.double() - b.double()).abs() <= tol * scale).all())


@dataclasses.dataclass
class Separability:
    """``coupled``: why the samples of a batch are coupled ("" when they are not: padding and
    splitting batches are exact); ``loss``: the loss's kind (:mod:`.losses`); ``X, y``: the probe
    samples (None when no client could be read)."""

    coupled: str
    loss: LossKind
    X: Optional[torch.Tensor] = None
    y: Optional[torch.Tensor] = None


def _distinct_label_rows(clients: Sequence[ClientData], most: int = 8) -> list:
    """(client, row) of the first sample of each of the first ``most`` label values met (integer
    labels of in-memory clients): a class-weighted mean is a plain mean on samples of one label."""
    seen, rows = set(), []
    for j, c in enumerate(clients):
        if not isinstance(c, TensorData) or c.y.is_floating_point() or c.y.dim() != 1:
            continue
        for v in c.y.unique().tolist():
            if v not in seen and len(rows) < most:
                seen.add(v)
                rows.append((j, int((c.y == v).nonzero()[0, 0])))
        if len(rows) >= most:
            break
    return rows


def probe_samples(clients: Sequence[ClientData], per_client: int = PROBE_SAMPLES) -> Optional[tuple]:
    """``(X, y)``: samples chosen to expose coupling: the first ``per_client`` samples of the first,
    the largest, the smallest and the last client, and one sample of each label value (in-memory
    clients); those of the first readable client's shape and dtype. None when none can be read."""
    sizes = [c.n if c.n is not None else 0 for c in clients]
    picks = dict.fromkeys([0, max(range(len(sizes)), key=sizes.__getitem__),
                           min(range(len(sizes)), key=sizes.__getitem__), len(clients) - 1])
    parts = [b for j in picks if (b := clients[j].first(per_client)) is not None]
    parts += [(clients[j].X[r : r + 1], clients[j].y[r : r + 1]) for j, r in _distinct_label_rows(clients)]
    if not parts:
        return None
    kind = (parts[0][0].shape[1:], parts[0][0].dtype, parts[0][1].shape[1:], parts[0][1].dtype)
    parts = [p for p in parts if (p[0].shape[1:], p[0].dtype, p[1].shape[1:], p[1].dtype) == kind]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def all_labels(clients: Sequence[ClientData]) -> Optional[list]:
    """Every client's labels (one tensor each) when all are in memory (None otherwise)."""
    if not all(isinstance(c, TensorData) for c in clients):
        return None
    return [c.y for c in clients]


def _rows_independent(model: nn.Module, X: torch.Tensor):
    """(the model's output on X, "" or why a sample's output depends on the others)."""
    def fwd(inp):
        torch.manual_seed(0)  # the same dropout mask for the same shape: only coupling can differ
        return model(inp)

    try:
        out = fwd(X)
        if not isinstance(out, torch.Tensor) or out.shape[:1] != X.shape[:1]:
            return None, "the model's output is not one row per sample"
        if X.shape[0] < 2:
            return out, ""
        Xq = X.clone()
        Xq[-1] = X[0] * 1.5 + 1.0 if X.is_floating_point() else X[0]
        alone = _close(fwd(Xq)[:-1], out[:-1]) and _close(fwd(X[:-1]), out[:-1])
    except Exception as e:  # noqa: BLE001 -- cannot show independence: treat as coupled
        return None, f"the model could not be probed on a few samples ({type(e).__name__}: {e})"
    if not alone:
        return out, ("the model's output for one sample changes with the other samples of its batch "
                     "(a layer mixes samples, e.g. a batch statistic)")
    return out, ""


def separability(model: nn.Module, loss_fn: Callable, clients: Sequence[ClientData], *, every_label: bool = True,
                 kind: Optional[LossKind] = None) -> Separability:
    """Whether padding and splitting batches is exact for ``model`` and ``loss_fn`` on ``clients``:
    (1) a BatchNorm module in training mode couples samples; (2) the model on the probe samples
    (:func:`probe_samples`): row i of ``model(X)`` must not change when another sample is altered
    or dropped; (3) the loss must be a per-sample mean (:func:`.losses.loss_kind`: known losses by
    their type and options and every client's labels, other callables probed on copies). The
    passes run without side effects and without grad; ``clients`` are not consumed.
    ``every_label=False``: ``clients`` are a few of a population's, whose labels do not stand for
    the others' (a known loss is then judged without labels, a callable also on labels of every
    class); ``kind``: the loss's kind when the caller decided it (a population's, for every client)."""
    p = next(model.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    norm = next(((n, m) for n, m in model.named_modules() if isinstance(m, _BATCH_STAT_NORMS) and m.training), None)
    batch = probe_samples(clients)
    with side_effect_free(model, device), torch.no_grad():
        out, rows = _rows_independent(model, batch[0]) if batch is not None else (None, "")
        if kind is None:
            labels = all_labels(clients) if every_label else None
            kind = loss_kind(loss_fn, out, None if batch is None else batch[1], labels, every_class=not every_label)
    if norm is not None:
        coupled = (f"module {norm[0] or 'model'!r} ({type(norm[1]).__name__}) normalises each batch by its own "
                   f"statistics in training mode, so a sample's output depends on the other samples of its batch")
    else:
        coupled = rows or ("" if kind.mean else kind.why)
    return Separability(coupled, kind, *(batch if batch is not None else (None, None)))


def training_side_effects(model: nn.Module, X: torch.Tensor) -> str:
    """What a training-mode forward pass of ``model`` on ``X`` (a few real samples) does besides
    computing its output ("" if nothing): buffers it updates (BatchNorm running statistics) and
    random numbers it draws from torch's global generator (Dropout). In one process these are
    shared by every client in turn; a deployed client node would keep its own, so a deployment can
    only equal the simulation without them. The probe itself leaves no trace (``side_effect_free``)."""
    p = next(model.parameters(), None)
    device = p.device if p is not None else X.device
    owner = {f"{m_name}.{b_name}" if m_name else b_name: m_name
             for m_name, m in model.named_modules() for b_name, _ in m.named_buffers(recurse=False)}
    with side_effect_free(model, device), torch.no_grad():
        before = {n: b.detach().clone() for n, b in model.named_buffers()}
        rng = torch.get_rng_state()
        try:
            model(X)
        except Exception as e:  # noqa: BLE001 -- cannot show there is none: say so
            return f"the model could not be probed on a few samples ({type(e).__name__}: {e})"
        changed = [n for n, b in model.named_buffers() if n in before and not torch.equal(b, before[n])]
        drew = not torch.equal(rng, torch.get_rng_state())
    if changed:
        mods = dict.fromkeys(owner.get(n, "") for n in changed)
        kinds = {name: type(model.get_submodule(name)).__name__ if name else type(model).__name__ for name in mods}
        return ("a training pass updates module buffers (" + ", ".join(f"{n or 'model'!r} ({kinds[n]})" for n in mods)
                + f": {', '.join(changed[:4])}{', ...' if len(changed) > 4 else ''})")
    if drew:
        rand = [n for n, m in model.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.training]
        return ("a training pass draws random numbers from torch's global generator"
                + (f" ({', '.join(repr(n) for n in rand[:4])}: Dropout)" if rand else ""))
    return ""
