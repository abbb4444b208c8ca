"""A client node of a Flower deployment: the handlers of its two messages (:func:`handle_hello`,
:func:`handle_round`) and :func:`client_app`. See :mod:`.flower` for what runs where."""

from __future__ import annotations

import json
from typing import Callable, Optional

import fedkernels as fk

from ..algorithms.base import ServerClientAlgorithm
from .client_eval import handle_evaluate
from .nodes import NodeClients, check_no_node_state, node_round, node_state, receives, save_node
from .persist import NodeStore
from .wire import (
    LAYOUT_KEY,
    NODE_KEY,
    check_algorithm,
    decode_vectors,
    encode_vectors,
    fingerprint,
    flat_x0,
    flwr_modules,
    resolve_setting,
)

__all__ = ["client_app", "handle_hello", "handle_round", "node_client_id"]


def node_client_id(context) -> int:
    """The client a node stands for: its node config's ``partition-id`` (a clear error without one)."""
    cfg = context.node_config
    if "partition-id" not in cfg:
        raise ValueError(f"node {context.node_id}: its node config has no partition-id (the client index): start "
                         f"it with --node-config \"partition-id=<i> num-partitions=<N>\"")
    return int(cfg["partition-id"])


def handle_hello(msg, context, algorithm, model_fn, regularizer, seed, batch_size, load_data):
    """The node's answer to the handshake: its client id and its settings' fingerprint (after checking,
    on a few of its samples from ``load_data``, that the model keeps no state outside its parameters)."""
    fapp, _, _ = flwr_modules()
    server = json.loads(msg.content["config"]["fingerprint"])
    cid = node_client_id(context)
    if "num-partitions" in context.node_config and int(context.node_config["num-partitions"]) != server["num_clients"]:
        raise ValueError(f"client {cid}: num-partitions={context.node_config['num-partitions']} in its node config, "
                         f"the server runs num_clients={server['num_clients']}")
    model, x0 = flat_x0(model_fn)
    check_no_node_state(model, load_data(cid, context), f"client {cid}")
    fp = fingerprint(algorithm, regularizer, seed, batch_size, server["num_clients"], x0)
    if fp == server and "restore" in msg.content["config"]:  # other settings: the server refuses the node
        _restore_node(context, cid, json.loads(msg.content["config"]["restore"]))
    return fapp.Message(reply_to=msg, content=fapp.RecordDict({"hello": fapp.ConfigRecord(
        {"client_id": cid, "fingerprint": json.dumps(fp)})}))


def _store(context, cid: int, run_key: str) -> Optional[NodeStore]:
    """The node's on-disk store (node config ``state-dir``), or None without one."""
    folder = context.node_config.get("state-dir")
    return NodeStore(str(folder), run_key, cid) if folder else None


def _restore_node(context, cid: int, restore: dict) -> None:
    """Where the run starts, for this node: at round 0 nothing to do; on a resume from round r, the
    state saved after the last round it took part in (``last_round``, up to r), read from its
    ``state-dir``, and the files of rounds after r dropped (they belong to the rounds that are redone)."""
    r, last = int(restore["round"]), int(restore["last_round"][str(cid)])
    store = _store(context, cid, restore["run_key"])
    for key in (NODE_KEY, LAYOUT_KEY):  # a fresh Flower run's context is empty; a reused one is not
        if key in context.state:
            del context.state[key]
    if store is not None:
        store.drop_after(r)
    if last == 0:
        return
    if store is None:
        raise RuntimeError(f"client {cid} cannot resume: it took part in round {last}, and its state was kept only "
                           f"in memory; start the node with --node-config '... state-dir=\"<folder>\"' so that it "
                           f"keeps its state on disk (a resume needs it)")
    if last not in store.rounds():
        raise RuntimeError(f"client {cid} cannot resume from round {r}: its state of round {last} is not in "
                           f"{store.dir} (found rounds {store.rounds()}); was the node started with another "
                           f"state-dir?")
    context.state[NODE_KEY] = encode_vectors(store.load(last))


def handle_round(msg, context, algorithm, model_fn, loss_fn, load_data, regularizer, seed, batch_size):
    """One round on a client node (see the module docstring); its state lives in ``context.state``.

    Its first round runs the data probe and ``init``; later ones take the State from the saved one
    (:func:`~.nodes.node_state`). Each vector is converted once each way (:func:`decode_vectors`,
    :func:`encode_vectors`), a download shared by two names copied once more."""
    fapp, _, _ = flwr_modules()
    plan = json.loads(msg.content["config"]["plan"])
    vecs = decode_vectors(msg.content["vectors"])
    cid = node_client_id(context)
    store = _store(context, cid, plan["run_key"])
    saved = decode_vectors(context.state[NODE_KEY]) if NODE_KEY in context.state else None
    layout = str(context.state[LAYOUT_KEY]["layout"]) if saved is not None and LAYOUT_KEY in context.state else None
    clients = NodeClients(model_fn(), loss_fn, load_data(cid, context), cid, plan["num_clients"], batch_size, seed,
                          check_data=saved is None)
    state, names, layout = node_state(algorithm, clients, saved, plan["scalars"], layout)
    taken: set = set()

    def cast(key):  # a vector handed out twice (to recv and down, or under two names) is copied for the second
        v = vecs[key].to(dtype=clients.dtype, device=clients.device)
        if key in taken and v.data_ptr() == vecs[key].data_ptr():
            v = v.clone()
        taken.add(key)
        return v

    recv = None if plan["recv"] is None else {n: cast(key) for n, key in plan["recv"].items()}
    down = {n: cast(key) for n, key in plan["down"].items()}
    down.update(plan["settings"])
    up = node_round(algorithm, regularizer, clients, state, saved, recv, down)
    reply = encode_vectors({name: v[0] for name, v in up.items()})
    keep = save_node(state, names, clients, up if receives(algorithm) else None)
    context.state[NODE_KEY] = encode_vectors(keep)
    if layout is not None:  # None for every round of a State that has none (nodes.state_layout)
        context.state[LAYOUT_KEY] = fapp.ConfigRecord({"layout": layout})
    if store is not None:  # on disk too: a resume after a failure (this node's or another's) reads it
        store.save(plan["round"], keep)
        store.prune(plan["committed"])
    return fapp.Message(reply_to=msg, content=fapp.RecordDict({"up": reply}))


def client_app(algorithm: ServerClientAlgorithm, model_fn: Callable, loss_fn: Callable, load_data: Callable, *,
               regularizer: fk.Regularizer, seed=0, batch_size=None, evaluate_fn: Optional[Callable] = None):
    """A Flower ``ClientApp`` for one client node: ``load_data(client_id, context)`` returns the node's
    data (an ``(X, y)`` pair or a ``Dataset``; ``client_id`` is the node config's ``partition-id``;
    ``context.run_config`` holds the run's settings, e.g. a data path); ``model_fn``, ``algorithm``,
    ``regularizer``, ``seed`` and ``batch_size`` must be the server's (checked at the handshake);
    ``seed`` and ``batch_size`` may be :func:`~.wire.from_run_config` entries. ``evaluate_fn(model,
    data, context) -> {name: number}``: run by the node on its own data with the server's model on each
    metric round; the server records the sample-weighted means as ``client_<name>``."""
    check_algorithm(algorithm)
    _, fclient, _ = flwr_modules()
    app = fclient.ClientApp()

    def settings(context):
        return resolve_setting("seed", seed, context), resolve_setting("batch_size", batch_size, context)

    @app.query("hello")
    def hello(msg, context):
        reply = handle_hello(msg, context, algorithm, model_fn, regularizer, *settings(context), load_data)
        reply.content["hello"]["evaluates"] = evaluate_fn is not None
        return reply

    @app.train("round")
    def train(msg, context):
        return handle_round(msg, context, algorithm, model_fn, loss_fn, load_data, regularizer, *settings(context))

    if evaluate_fn is not None:  # the server asks only the nodes whose handshake said so
        @app.evaluate("model")
        def evaluate(msg, context):
            return handle_evaluate(msg, context, model_fn, load_data, evaluate_fn, node_client_id(context))

    return app
