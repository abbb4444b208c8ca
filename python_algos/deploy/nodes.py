"""What each party of a deployment runs, without any framework: a client node on its own data, the
server on none (docs/algorithms.md §0.1).

A deployed client node holds one row of the State's ``client_fields``, its own ``client_copies``,
its minibatch generator (seeded from (run seed, client id), so it draws what ``simulate`` draws for
that client) and its last upload, whose ``client_receive`` it runs at the start of its next round.
The server holds the other fields. Both build the State with the algorithm's own ``init`` (on a
1-row :class:`NodeClients` / an N-row data-less :class:`ServerClients`) and then drop the fields that
are not theirs (``None``): a program reading another party's field fails loudly instead of
silently using a stale copy.
"""

from __future__ import annotations

import importlib
import json
from typing import Optional

import torch

import fedkernels as fk

from ..algorithms.base import ServerClientAlgorithm
from ..clients.base import ClientSet, client_generators
from ..clients.data import client_data
from ..clients.separable import side_effect_free, training_side_effects
from ..clients.sequential import SequentialClients

__all__ = ["NodeClients", "ServerClients", "NeedsClientData", "client_names", "receives",
           "node_state", "state_layout", "save_node", "node_round", "server_state", "scalars", "check_no_node_state"]


class NeedsClientData(RuntimeError):
    """The server's program asked for client gradients (only clients hold data)."""


class NodeClients(SequentialClients):
    """One deployed client: its own data as a 1-row client set in a federation of ``num_clients``.

    ``client_id`` is the client's global index: its generator is ``client_generators(seed, ·)[id]``,
    and the programs address it as ``ids = [client_id]``.
    """

    executor = "flower-node"

    def __init__(self, model, loss_fn, data, client_id: int, num_clients: int, batch_size=None, seed: int = 0,
                 check_data: bool = True):
        super().__init__(model, loss_fn, [data], batch_size=batch_size, seed=seed, first_client=int(client_id),
                         check_data=check_data)
        self.client_id, self.num_clients = int(client_id), int(num_clients)
        self.generators = client_generators(seed, 1, self.client_id)  # a list: its node files keep rng:generators#0

    def gradients_(self, X, G, ids=None):
        if ids is not None and ids.tolist() != [self.client_id]:
            raise RuntimeError(f"client node {self.client_id} was asked for the gradients of clients {ids.tolist()}")
        return super().gradients_(X, G, None)


class ServerClients(ClientSet):
    """The server's view of the federation: N clients, no data. ``mean`` / ``broadcast`` are the
    sequential executor's (so the averages are computed as ``simulate`` computes them), and the
    participation draw is ``ClientSet``'s, from the same seeded generator."""

    executor = "flower-server"

    def __init__(self, num_clients: int, dim: int, dtype: torch.dtype, device=torch.device("cpu")):
        super().__init__()
        self.num_clients = self.rows = int(num_clients)
        self.dim, self.dtype, self.device = int(dim), dtype, torch.device(device)

    def gradients_(self, X, G, ids=None):
        raise NeedsClientData("the server holds no data")

    _mean, _broadcast = SequentialClients._mean, SequentialClients._broadcast  # simulate's averages, not a copy

    def full_objective_(self, x, grad_out):
        raise NeedsClientData("the server holds no data: objective metrics need the clients")


def client_names(alg: ServerClientAlgorithm, state) -> tuple[tuple, tuple]:
    """(client_fields, client_copies) of the State: the fields a client node keeps."""
    cls = type(state)
    copies = tuple(f for f in getattr(cls, "client_copies", ()) if getattr(state, f) is not None)
    return tuple(cls.client_fields), copies


def receives(alg: ServerClientAlgorithm) -> bool:
    """Whether the algorithm's clients do anything with the download (``client_receive`` overridden):
    if not, the server never sends it for that purpose."""
    return type(alg).client_receive is not ServerClientAlgorithm.client_receive


def scalars(state) -> dict:
    """The State's non-tensor fields (round counters), which the server sends with every download."""
    return {f: v for f, v in state._asdict().items() if not isinstance(v, torch.Tensor) and v is not None}


def server_state(alg: ServerClientAlgorithm, x0: torch.Tensor, clients: ServerClients):
    """``alg.init`` on the server, the clients' fields dropped. Raises ValueError if the algorithm's
    init or reported model needs the clients (e.g. FedDR's gradient-based start, FedCanonII's model
    kept in the clients' replicas)."""
    try:
        state = alg.init(x0, clients)
    except NeedsClientData:
        switches = ", ".join(f"{s}={getattr(alg, s)!r}" for s in alg.switches) or "its hyper-parameters"
        raise ValueError(f"{alg.name}: with {switches} its init takes the clients' gradients to set the server's "
                         f"state, which a deployed server cannot do (it holds no data): choose a start that needs "
                         f"none (e.g. FedDR's init_from='code')") from None
    fields, copies = client_names(alg, state)
    state = state._replace(**{f: None for f in fields + copies})
    try:
        alg.report(state, fk.Zero())
    except (AttributeError, TypeError):
        raise ValueError(f"{alg.name} reports a model held by the clients ({alg.reports}): a deployed server cannot "
                         f"output it; use the algorithm with a server-side model") from None
    return state


def node_state(alg: ServerClientAlgorithm, clients: NodeClients, saved: Optional[dict], server_scalars: dict,
               layout: Optional[str] = None):
    """The node's State, its client field and copy names, and its :func:`state_layout`.

    The first time (``saved`` None): ``init`` on its own row (its draws are simulate's init draws for
    this client). Later: the saved rows and copies, and the generators as they were after the node's
    last round; with the ``layout`` recorded then, the State is assembled from them directly (no
    ``init``, whose tensors would be overwritten anyway), else ``init`` runs and they are copied in.
    The server's tensor fields are ``None``, its counters as sent."""
    built = _from_layout(layout, saved, clients) if saved is not None and layout else None
    if built is not None:
        state, names = built
    else:
        state = alg.init(clients.flat.params.detach().clone(), clients)
        fields, copies = client_names(alg, state)
        names = fields + copies
    if saved is not None:
        bases = {k[4:].split("#")[0] for k in saved if k.startswith("rng:")}
        clients.set_rng_state({b: _rng_value(saved, "rng:" + b) for b in bases})
        if built is None:
            for f in names:
                getattr(state, f).copy_(saved["state:" + f])
    drop = {f: None for f, v in state._asdict().items() if isinstance(v, torch.Tensor) and f not in names}
    state = state._replace(**drop, **server_scalars)
    return state, names, layout if built is not None else state_layout(state, names, server_scalars)


def state_layout(state, names: tuple, server_scalars: dict) -> Optional[str]:
    """What a node needs, besides its saved tensors, to assemble its State without ``init``: the
    State's class, its client fields and copies, and the fields that neither they nor the server's
    counters set (as ``init`` left them). None if one of those is not a JSON value (``init`` then
    runs every round)."""
    cls = type(state)
    own = {f: v for f, v in state._asdict().items() if f not in names and f not in server_scalars
           and not isinstance(v, torch.Tensor)}
    if not all(v is None or type(v) in (bool, int, float, str) for v in own.values()):
        return None  # JSON would not give it back as it was (a tuple comes back a list)
    try:
        return json.dumps({"class": f"{cls.__module__}:{cls.__qualname__}", "names": list(names), "own": own},
                          allow_nan=False)
    except ValueError:  # inf or nan
        return None


def _from_layout(layout: str, saved: dict, clients: NodeClients) -> Optional[tuple]:
    """(State, names) assembled from ``saved`` as a :func:`state_layout` describes it, or None where
    the layout cannot be used: unreadable, naming no State class, or not the State ``saved`` holds."""
    try:
        spec = json.loads(layout)
        module, qualname = spec["class"].split(":")
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")):
            return None
        names = tuple(spec["names"])
        tensors = {f: saved["state:" + f].to(dtype=clients.dtype, device=clients.device) for f in names}
        return cls(**dict.fromkeys(cls._fields))._replace(**spec["own"], **tensors), names
    except (ValueError, KeyError, AttributeError, ImportError, TypeError):
        return None


def _rng_value(saved: dict, key: str):
    if key in saved:
        return saved[key]
    return [saved[f"{key}#{j}"] for j in range(sum(1 for k in saved if k.startswith(key + "#")))]


def save_node(state, names, clients: NodeClients, last_up: Optional[dict]) -> dict:
    """What the node keeps between rounds, as named tensors (its rows, copies, generators, last upload):
    the State's own tensors, not copies (they are serialized at once, and the State is not used after)."""
    out = {"state:" + f: getattr(state, f).detach() for f in names}
    for k, v in clients.rng_state().items():
        if isinstance(v, list):
            out.update({f"rng:{k}#{j}": s for j, s in enumerate(v)})
        else:
            out["rng:" + k] = v
    for name, v in (last_up or {}).items():
        out["up:" + name] = v.detach()
    return out


def node_round(alg: ServerClientAlgorithm, reg, clients: NodeClients, state, saved: Optional[dict],
               recv: Optional[dict], down: dict) -> dict:
    """One participation of the node: ``client_receive`` of the download it got after its previous
    upload (``recv``, with that upload), then ``client_update`` from this round's ``down``. Returns
    the upload (``[1, d]`` stacks, by name)."""
    ids = torch.tensor([clients.client_id])
    with torch.no_grad():
        if recv is not None:
            if saved is None or not any(k.startswith("up:") for k in saved):
                raise RuntimeError(f"client {clients.client_id} got a download for client_receive but has no "
                                   f"upload of its own (its saved state was lost)")
            last = {k[3:]: v for k, v in saved.items() if k.startswith("up:")}
            alg.client_receive(state, {n: v.to(clients.dtype) for n, v in recv.items()}, last, clients, reg, ids)
        return alg.client_update(state, down, clients, reg, ids)


def check_no_node_state(model, data, where: str, fix: Optional[str] = None) -> None:
    """Refuse a model whose training pass updates buffers (BatchNorm running statistics) or draws
    random numbers (Dropout), probed on a few of ``data``'s samples: in simulation every client
    shares one module and one generator in turn, while a deployed node would keep its own (and
    rebuild them every round), so the deployment would silently run another algorithm."""
    p = next(model.parameters(), None)
    dtype = p.dtype if p is not None else torch.get_default_dtype()
    device = p.device if p is not None else torch.device("cpu")
    with side_effect_free(model, device):  # a loader's first batch may draw from torch's generator
        X = next(client_data(data, dtype, device).batches(None, None, 4))[0][:4]  # as a gradient call reads
    why = training_side_effects(model, X)
    if why:
        raise ValueError(f"{where}: {why}. In one process every client shares that state in turn; a deployed node "
                         f"would keep its own, so the deployment would not run the algorithm that simulate runs. " +
                         (fix or "Build the model without it (LayerNorm or GroupNorm instead of BatchNorm, no "
                                 "Dropout), or return it in eval mode from model_fn (model.eval(): running statistics "
                                 "fixed, dropout off)"))
