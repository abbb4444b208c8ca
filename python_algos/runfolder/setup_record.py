"""The settings a ``simulate`` snapshot records (``snapshot["setup"]``), and the one resume check.

A snapshot holds the algorithm's state and every generator, but not the run's inputs: resumed with
another data set, regularizer, batch size, seed or participation, the rounds after it would continue
the old state under new settings, and the History describe a run that never happened.
:func:`run_setup` is the record and :func:`check_same_setup` the one resume check, for every engine:
``simulate(resume=...)`` (this record, the algorithm and the model's buffers), the command line
(``experiments.prepare.check_recorded_config``: the config recorded in a checkpoint against
config.json) and a Flower server (``deploy.flower_server.check_checkpoint``: h exactly,
participation, x0). A refusal names each key for its audience from one table, :data:`NAMES` (a
Python keyword, a flag). Everything here is a JSON-like value of built-in types (a checkpoint loads
with ``torch.load(weights_only=True)``).

Recorded: ``clients`` (per-client sample counts and a blake2b hash of tensor clients' exact bits,
dtype and shape, read once, on a GPU in chunks; ``Dataset`` / ``DataLoader`` clients by kind and
length only, as reading them could cost as much as the run), ``loss_fn`` (its qualified name),
``regularizer`` (class and parameters, floats at full precision; a per-parameter mapping by what it
applies where), ``batch_size``, ``seed``, ``clients_per_round`` (k; None: all), ``metrics_every``,
``metric_step`` (the step in use), the model's trainable parameters (names, shapes), dtype and device.
Not recorded: ``rounds`` (a resume may extend a run), ``executor`` (it changes the speed and the
summation order, not the algorithm: ``simulate`` warns when a resume changes it), callbacks,
``eval_fn``, checkpointing.
"""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Optional

import torch
import torch.utils.data
from torch import nn

import fedkernels as fk

__all__ = ["run_setup", "check_same_setup", "SetupMismatch", "describe_regularizer",
           "fingerprint_clients", "NAMES", "AUDIENCES", "label"]

# Every key a setup record holds (simulate's snapshot: run_setup's, the algorithm and the model's
# buffers; a Flower server checkpoint: deploy.flower_server.server_setup's) -> what sets it, for each
# audience a refusal speaks to (AUDIENCES): the Python keyword(s), the command-line flag(s).
AUDIENCES = ("python", "cli")
NAMES = {
    "algorithm": ("algorithm", "the algorithm (-a)"),
    "hparams": ("algorithm (hyper-parameters)", "the algorithm's hyper-parameters (--alg-opt, --lr, ...)"),
    "clients": ("clients", "the clients' data (--dataset, --data-opt and the files they name)"),
    "loss_fn": ("loss_fn", "the loss (--dataset's task)"),
    "regularizer": ("regularizer", "h (--reg, --reg-param, --reg-opt)"),
    "batch_size": ("batch_size", "--batch-size"), "seed": ("seed", "--seed"),
    "num_clients": ("num_clients", "--num-clients"), "metrics_every": ("metrics_every", "--metrics-every"),
    "clients_per_round": ("participation/clients_per_round", "--clients-per-round / --participation"),
    "metric_step": ("metric_step", "--metric-step"), "model_device": ("model (device)", "--device"),
    "model_dtype": ("model (dtype)", "--dtype"), "dtype": ("model_fn (dtype)", "--dtype"),
    "model_parameters": ("model (trainable parameters)", "the model (--model, --model-opt)"),
    "model_buffers": ("model (buffers)", "the model (--model, --model-opt)"),
    "dim": ("model_fn (number of parameters)", "the model (--model, --model-opt)"),
    "x0_sha256": ("model_fn (initial parameters)", "the initial model (--model, --seed)"),
}


def label(key: str, audience="python") -> str:
    """How a refusal names ``key`` to ``audience``: one of :data:`AUDIENCES` (its column of
    :data:`NAMES`), or a function of the key for a record keyed otherwise (the command line's config,
    whose settings name their own flags)."""
    if callable(audience):
        return audience(key)
    if audience not in AUDIENCES:
        raise ValueError(f"audience must be one of {', '.join(AUDIENCES)} or a function, got {audience!r}")
    return NAMES[key][AUDIENCES.index(audience)] if key in NAMES else key


_CHUNK_BYTES = 1 << 26  # hash a tensor 64 MiB at a time (a GPU tensor is copied to the host piecewise)


def _hash_tensor(h, t: torch.Tensor) -> None:
    t = t.detach()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.layout != torch.strided:  # sparse data: hash its dense form (rare; such data are small)
        t = t.to_dense()
    if t.dim() == 0:
        t = t.reshape(1)
    rows = int(t.shape[0])
    per_row = t.numel() // rows * t.element_size() if rows else 0
    if per_row == 0:
        return
    step = max(1, _CHUNK_BYTES // per_row)
    for i in range(0, rows, step):
        piece = t[i : i + step].contiguous().reshape(-1)
        h.update(piece.view(torch.uint8).cpu().numpy())


def _client_tensors(client) -> Optional[tuple]:
    """The (X, y) tensors ``python_algos.clients.data.client_data`` would take, or None for a
    Dataset / DataLoader client (or something it will refuse, with its own message)."""
    if isinstance(client, (tuple, list)) and len(client) == 2:
        try:
            return torch.as_tensor(client[0]), torch.as_tensor(client[1])
        except Exception:  # noqa: BLE001 - not data; the executor raises the user-facing error
            return None
    if isinstance(client, torch.utils.data.TensorDataset) and len(client.tensors) >= 2:
        return client.tensors[0], client.tensors[1]
    return None


def fingerprint_clients(clients) -> dict:
    """``{"samples": [n_i, ...], "content": hex}``: per-client sample counts (None: a DataLoader
    whose dataset has no length) and a hash of every client's kind, length and, for tensor
    clients, data. A ``Population`` gives its own record (``Population.fingerprint``: N, its recipe and a
    hash of a few sampled clients), never reading every client."""
    if callable(getattr(clients, "fingerprint", None)):
        return clients.fingerprint()
    h = hashlib.blake2b(digest_size=8)
    samples = []
    for c in clients:
        tensors = _client_tensors(c)
        if tensors is not None:
            X, y = tensors
            n = int(X.shape[0]) if X.dim() else None
            h.update(b"tensors")
            _hash_tensor(h, X)
            _hash_tensor(h, y)
        else:  # a DataLoader or a Dataset by its kind and length
            kind, sized = (("loader", c.dataset) if isinstance(c, torch.utils.data.DataLoader) else
                           ("dataset", c) if isinstance(c, torch.utils.data.Dataset) else (None, None))
            try:
                n = len(sized) if kind else None
            except TypeError:  # an IterableDataset without a length: not iterated here
                n = None
            h.update((f"{kind}:{n}" if kind else f"other:{type(c).__qualname__}").encode())
        samples.append(n)
    return {"samples": samples, "content": h.hexdigest()}


def _value(v) -> str:
    """An exact, process-independent text for one attribute of a regularizer."""
    if isinstance(v, float):
        return repr(v)  # full precision (reprs elsewhere round to 6 digits)
    if v is None or isinstance(v, (bool, int, str)):
        return repr(v)
    if isinstance(v, torch.Tensor):
        h = hashlib.blake2b(digest_size=8)
        _hash_tensor(h, v)
        return f"tensor{list(v.shape)}[{h.hexdigest()}]"
    if isinstance(v, fk.Regularizer):
        return describe_regularizer(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {_value(x)}" for k, x in v.items()) + "}"
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        try:
            return _value(v.item())
        except Exception:  # noqa: BLE001
            pass
    return type(v).__qualname__


def describe_regularizer(reg) -> str:
    """Class and public attributes, floats at full precision; a ``PerParameter`` by its segments
    (which flat range gets which penalty, as which matrix), i.e. by what it computes."""
    if isinstance(reg, fk.PerParameter):
        parts = [f"[{s.start}:{s.stop}]" + (f" as {s.matrix[0]}x{s.matrix[1]}" if s.matrix else "")
                 + f" {describe_regularizer(s.reg)}" for s in reg.segments]
        return f"PerParameter({'; '.join(parts) if parts else 'no penalty'})"
    attrs = sorted((k, v) for k, v in vars(reg).items() if not k.startswith("_"))
    return f"{type(reg).__qualname__}({', '.join(f'{k}={_value(v)}' for k, v in attrs)})"


def _callable_name(f) -> str:
    """A name of ``loss_fn`` that is the same in another process (no object addresses)."""
    if isinstance(f, functools.partial):
        args = [_value(a) for a in f.args] + [f"{k}={_value(v)}" for k, v in sorted(f.keywords.items())]
        return f"partial({_callable_name(f.func)}{''.join(', ' + a for a in args)})"
    if isinstance(f, nn.Module):  # e.g. nn.CrossEntropyLoss(label_smoothing=0.1): its settings too
        attrs = sorted((k, v) for k, v in vars(f).items()
                       if not k.startswith("_") and k != "training" and not isinstance(v, (nn.Module, torch.Tensor)))
        return f"{type(f).__module__}.{type(f).__qualname__}({', '.join(f'{k}={_value(v)}' for k, v in attrs)})"
    name = getattr(f, "__qualname__", None)
    if isinstance(name, str):
        return f"{getattr(f, '__module__', None) or ''}.{name}".lstrip(".")
    return f"{type(f).__module__}.{type(f).__qualname__}"


def _plain(v):
    """An int as a built-in int (numpy integers too); anything else as its text (the executor
    refuses it with its own message later)."""
    if v is None or isinstance(v, bool):
        return v
    try:
        return int(v) if int(v) == v else repr(v)
    except (TypeError, ValueError):
        return repr(v)


def run_setup(*, model: nn.Module, loss_fn, clients, regularizer, batch_size, seed, clients_per_round,
              metrics_every: int, metric_step: float) -> dict:
    """The record of a run's settings kept in every snapshot (module docstring)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    first = params[0][1] if params else None
    return {
        "clients": fingerprint_clients(clients),
        "loss_fn": _callable_name(loss_fn),
        "regularizer": describe_regularizer(regularizer),
        "batch_size": _plain(batch_size),
        "seed": _plain(seed),
        "clients_per_round": clients_per_round,
        "metrics_every": int(metrics_every),
        "metric_step": float(metric_step),
        "model_parameters": [[n, list(p.shape)] for n, p in params],
        "model_dtype": None if first is None else str(first.dtype).replace("torch.", ""),
        "model_device": None if first is None else first.device.type,
    }


def _show(key: str, v) -> str:
    if key == "clients" and isinstance(v, dict) and "population" in v:
        return (f"a population of {v['population']} clients built by {v.get('recipe')}, content hash "
                f"{v.get('content')} (of clients {v.get('sampled')})")
    if key == "clients" and isinstance(v, dict):
        s = v.get("samples") or []
        shown = ", ".join(str(n) for n in s[:8]) + (f", ... ({len(s)} clients)" if len(s) > 8 else "")
        return f"{len(s)} client(s) with [{shown}] samples, content hash {v.get('content')}"
    if key == "algorithm" and isinstance(v, dict):  # simulate's resume check: name and hyper-parameters
        return f"{v.get('name')} {v.get('hparams')}"
    if key == "clients_per_round":
        return "all clients" if v is None else f"{v} client(s) per round"
    if key == "model_parameters" and isinstance(v, list):
        d = sum(math.prod(shape) for _, shape in v)
        shown = ", ".join(f"{n} {tuple(shape)}" for n, shape in v[:6]) + (", ..." if len(v) > 6 else "")
        return f"d = {d}: {shown}"
    return v if isinstance(v, str) else repr(v)


class SetupMismatch(ValueError):
    """A resume under other settings than the recorded run's; ``lines``: one per differing setting."""

    def __init__(self, message: str, lines: list):
        super().__init__(message)
        self.lines = list(lines)


def check_same_setup(saved: Optional[dict], now: dict, *, what: str, audience="python",
                     fix: str = "resume with the recorded settings, or start a new run", error=SetupMismatch) -> None:
    """The one resume check: refuse (``error``, a :class:`SetupMismatch` by default) when the setup
    recorded with ``what`` (a checkpoint, a snapshot) differs from ``now`` in any setting recorded in
    both, naming every such setting for ``audience`` (:func:`label`: ``"python"``, ``"cli"``), with
    both values. Call it before anything is written. ``saved`` None (nothing was recorded) passes."""
    lines = [f"{label(key, audience)}: snapshot {_show(key, saved[key])}, given {_show(key, now[key])}"
             for key in (saved or {}) if key in now and saved[key] != now[key]]
    if not lines:
        return
    message = (f"cannot resume {what}: it was recorded under other settings, and its state would continue under "
               f"these (nothing was changed): {'; '.join(lines)}. Either {fix}")
    raise SetupMismatch(message, lines) if error is SetupMismatch else error(message)
