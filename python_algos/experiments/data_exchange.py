"""``run --flower`` on ``folder:PATH`` data: each node reads only its own file, and what the others'
files decide (the pooled mean and standard deviation of ``--standardize global``, the classes) comes
from one exchange before the handshake.

The server asks every node (``query.datastats``) for its client id, the count, mean and sum of
squares about its mean of its training rows (:func:`~python_algos.data.standardize.client_moments`)
and the label values it holds; it combines them as one process does
(:func:`~python_algos.data.standardize.combine_moments`) and sends each node (``query.datascale``)
the mean and std, the classes and the data's shape, from which the node builds its rows
(:func:`.node_data.folder_rows`) and keeps them in its state folder for the run's later messages.
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch

from ..data.standardize import combine_moments
from ..deploy.exchange import check_replies, collect
from ..deploy.flower import NodeFailure, decode_vectors, encode_vectors, flwr_modules, node_client_id
from ..deploy.wire import new_message

__all__ = ["STATS", "SCALE", "exchange_data", "handle_stats", "handle_scale"]

STATS, SCALE = "query.datastats", "query.datascale"


def _wait_for_nodes(grid, n: int, connect_timeout: float) -> list:
    until = time.monotonic() + connect_timeout
    while True:
        nodes = sorted(int(i) for i in grid.get_node_ids())
        if len(nodes) >= n:
            return nodes
        if time.monotonic() > until:
            raise NodeFailure(f"only {len(nodes)} of num_clients={n} client nodes connected within "
                              f"connect_timeout={connect_timeout:g} s (the data exchange before the handshake)")
        time.sleep(0.1)


def exchange_data(grid, fed, n: int, connect_timeout: float, timeout: float) -> None:
    """The server's side (see the module): ``fed`` is the server's own view of the data (its shape,
    task and classes, which the nodes' answers must agree with)."""
    fapp, _, _ = flwr_modules()
    ds = fed.dataset
    ids = _wait_for_nodes(grid, n, connect_timeout)
    ask = fapp.ConfigRecord({"features": json.dumps(list(ds.in_shape))})
    got = collect(grid, [new_message(fapp.RecordDict({"config": ask}), nid, STATS, 0) for nid in ids],
                  max(timeout, connect_timeout))
    replies = check_replies(got, dict(enumerate(ids)), list(range(len(ids))), 0, f"{max(timeout, connect_timeout):g} s")
    by_client = {}
    for r in replies.values():
        cid = int(r.content["stats"]["client_id"])
        if not 0 <= cid < n or cid in by_client:
            raise ValueError(f"node {r.metadata.src_node_id} says it is client {cid}: every node's partition-id must "
                             f"be one of 0..{n - 1}, once each")
        by_client[cid] = (int(r.metadata.src_node_id), int(r.content["stats"]["n"]), decode_vectors(r.content["up"]))
    if len(by_client) < n:
        raise NodeFailure(f"the data exchange: no node answered for client(s) "
                          f"{sorted(set(range(n)) - set(by_client))}")
    mean, std = combine_moments([(c, v["mean"], v["m2"]) for _, c, v in (by_client[i] for i in range(n))])
    values = np.unique(np.concatenate([v["labels"].numpy() for _, _, v in by_client.values()]))
    if ds.task == "multiclass" and len(values) != ds.num_classes:
        raise ValueError(f"{ds.source}: the clients' files hold {len(values)} label values, the data set "
                         f"{ds.num_classes} classes (a pooled test/ file has labels no client's file has): give "
                         f"every class some client's rows")
    vec = {"mean": mean, "std": std} | ({"classes": torch.from_numpy(values)} if ds.task == "multiclass" else {})
    info = fapp.ConfigRecord({"info": json.dumps({"name": ds.name, "task": ds.task, "in_shape": list(ds.in_shape),
                                                  "outputs": int(ds.outputs), "source": ds.source})})
    out = [new_message(fapp.RecordDict({"vectors": encode_vectors(vec), "config": info}), by_client[i][0], SCALE, 0)
           for i in range(n)]
    nodes = {i: by_client[i][0] for i in range(n)}
    check_replies(collect(grid, out, timeout), nodes, list(range(n)), 0, f"{timeout:g} s")


def handle_stats(msg, context, cfg):
    """A node's answer to ``query.datastats``: its client id, the moments of its own rows, its label values."""
    from .node_data import folder_moments

    fapp, _, _ = flwr_modules()
    cid = node_client_id(context)
    n, mean, m2, labels = folder_moments(cfg, cid, tuple(json.loads(msg.content["config"]["features"])))
    return fapp.Message(reply_to=msg, content=fapp.RecordDict({
        "stats": fapp.ConfigRecord({"client_id": cid, "n": n}),
        "up": encode_vectors({"mean": mean, "m2": m2, "labels": labels})}))


def handle_scale(msg, context, cfg):
    """A node's answer to ``query.datascale``: its rows built with the pooled statistics and kept in
    its state folder (:func:`.node_data.keep_folder_rows`)."""
    from .node_data import keep_folder_rows

    fapp, _, _ = flwr_modules()
    state_dir = context.node_config.get("state-dir")
    vec = decode_vectors(msg.content["vectors"])
    keep_folder_rows(cfg, node_client_id(context), str(state_dir) if state_dir else None, vec,
                     json.loads(msg.content["config"]["info"]))
    return fapp.Message(reply_to=msg, content=fapp.RecordDict({"done": fapp.ConfigRecord({"ok": 1})}))
