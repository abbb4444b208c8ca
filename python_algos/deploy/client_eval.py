"""Evaluation on the nodes: a user's ``evaluate_fn(model, data, context)`` run by each client node on
its own data with the server's model, on the run's metric rounds, averaged by the server weighted by
each node's sample count. The server holds no data, so this is how a deployment measures what only
the nodes can (e.g. accuracy on each hospital's held-out rows)."""

from __future__ import annotations

import math
from typing import Callable, Mapping

import torch

import fedkernels as fk

from .exchange import check_replies, collect
from .wire import NodeFailure, decode_vectors, encode_vectors, flwr_modules, new_message

__all__ = ["EVALUATE", "handle_evaluate", "evaluate_on_nodes"]

EVALUATE = "evaluate.model"
_PREFIX = "client_"  # the row key of a node metric: client_<its name>, beside the server's own metrics


def handle_evaluate(msg, context, model_fn: Callable, load_data: Callable, evaluate_fn: Callable, cid: int):
    """The node's answer to an evaluation request: ``evaluate_fn`` on a fresh model holding the server's
    parameters and the node's data, its numbers and the node's sample count (the weight)."""
    fapp, _, _ = flwr_modules()
    model = model_fn()
    flat = fk.FlatParams(model)
    with torch.no_grad():
        flat.params.copy_(decode_vectors(msg.content["vectors"])["x"].to(flat.params))
    data = load_data(cid, context)
    got = evaluate_fn(model, data, context)
    if not isinstance(got, Mapping) or not all(isinstance(k, str) and isinstance(v, (int, float, torch.Tensor))
                                               and not isinstance(v, bool) for k, v in got.items()):
        raise TypeError(f"client {cid}: evaluate_fn must return a dict of metric name -> number, got {got!r}")
    values = {k: float(v) for k, v in got.items()}
    values["num_examples"] = len(data[0]) if isinstance(data, (tuple, list)) else len(data)  # (X, y) or a Dataset
    return fapp.Message(reply_to=msg, content=fapp.RecordDict({"metrics": fapp.MetricRecord(values)}))


def evaluate_on_nodes(grid, nodes: dict, evaluators: set, x: torch.Tensor, t: int, timeout: float) -> dict:
    """The nodes' metrics of the model ``x`` (round ``t``): each evaluating client's ``evaluate_fn``,
    averaged weighted by its sample count, keys ``client_<name>`` ({} without evaluators)."""
    if not evaluators:
        return {}
    fapp, _, _ = flwr_modules()
    part = sorted(evaluators)
    out = [new_message(fapp.RecordDict({"vectors": encode_vectors({"x": x})}), nodes[i], EVALUATE, t) for i in part]
    got = check_replies(collect(grid, out, timeout), nodes, part, t, f"{timeout:g} s")
    total, sums = 0.0, {}
    for i in part:
        rec = got[i].content.get("metrics")
        if rec is None:
            raise NodeFailure(f"client {i} (node {nodes[i]}) answered the evaluation without metrics")
        w = float(rec["num_examples"])
        total += w
        for k, v in rec.items():
            if k != "num_examples":
                sums[k] = sums.get(k, 0.0) + w * float(v)
    return {_PREFIX + k: (s / total if total > 0 else math.nan) for k, s in sums.items()}
