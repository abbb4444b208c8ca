"""Talking to the nodes through Flower's ``Grid``: the handshake, and one round's replies collected
as they come (pushed once, pulled every ``POLL`` seconds; Flower's own ``send_and_receive``
sleeps 3 s between pulls, which every exchange would pay)."""

from __future__ import annotations

import json
import time
from typing import Optional

import torch

from .wire import HELLO, NodeFailure, decode_vectors, flwr_modules, new_message

__all__ = ["handshake", "collect", "check_replies", "check_upload", "nonfinite_entries", "POLL"]

POLL = 0.1  # seconds between two pulls of replies from the SuperLink


def collect(grid, out: list, timeout: float) -> list:
    """Push ``out`` and pull the replies until every node has answered, one has answered with an
    error, or ``timeout`` seconds have passed; the replies received."""
    waiting = {int(m.metadata.dst_node_id): mid for m, mid in zip(out, grid.push_messages(out))}
    got, until = [], time.monotonic() + timeout
    while waiting:
        for r in grid.pull_messages(list(waiting.values())):
            if waiting.pop(int(r.metadata.src_node_id), None) is not None:
                got.append(r)
        if not waiting or any(r.has_error() for r in got) or time.monotonic() > until:
            break
        time.sleep(POLL)
    return got


def check_replies(replies, nodes: dict, part: list, t: int, waited: str) -> dict:
    """client -> reply for every participant of round ``t``, or NodeFailure naming those that
    answered with an error or not at all (``waited``: how long the server waited, for the message)."""
    by_node = {int(r.metadata.src_node_id): r for r in replies}
    errors, missing, got = [], [], {}
    for i in part:
        r = by_node.get(int(nodes[i]))
        who = f"client {i} (node {nodes[i]})"
        if r is None:
            missing.append(who)
        elif r.has_error():
            errors.append(f"{who}: {r.error.reason}")
        else:
            got[i] = r
    if errors:
        raise NodeFailure(f"round {t}: " + "; ".join(errors))
    if missing:
        raise NodeFailure(f"round {t}: {', '.join(missing)} did not answer within {waited} (the node stopped, or "
                          f"its round is slower than that: wait longer)")
    return got


def check_upload(record, names, dim: int, dtype: torch.dtype, who: str, t: int) -> dict:
    """The vectors of one participant's upload (``record``: its reply's ``up`` ArrayRecord), checked
    against what the algorithm declares before any enters the server's average: exactly the names
    ``names`` (``messages().up``), each a vector of ``dim`` entries of the run's ``dtype`` (a float32
    upload is not widened: the run would no longer be the one-process run). Raises
    :class:`NodeFailure` naming ``who`` (client and node), the vector and the rule.

    NaN/Inf entries are not refused here: a client whose local steps blew up uploads them in one
    process too, where they reach the server's model and the run ends "diverged" at that round
    (``StopOnDivergence``); a Flower run must end the same way (:func:`nonfinite_entries` names the
    client for a warning)."""
    got, want = sorted(record.keys()), sorted(names)
    if got != want:
        raise NodeFailure(f"round {t}: {who} uploaded {got}, expected {want} (the algorithm's messages().up)")
    wanted_dtype = str(dtype).replace("torch.", "")
    for name, a in record.items():
        if str(a.dtype) != wanted_dtype or tuple(a.shape) != (int(dim),):
            raise NodeFailure(f"round {t}: {who} uploaded {name!r} as {a.dtype} of shape {tuple(a.shape)}, expected "
                              f"{wanted_dtype} of shape ({int(dim)},) (every node must build the server's model)")
    return decode_vectors(record)


def nonfinite_entries(ups: dict, who: str, t: int) -> Optional[str]:
    """What is not finite in one participant's checked upload (:func:`check_upload`), naming ``who``
    (client and node), or None when every entry is finite."""
    bad = {name: int((~torch.isfinite(v)).sum()) for name, v in ups.items()}
    bad = {name: n for name, n in bad.items() if n}
    if not bad:
        return None
    what = ", ".join(f"{name!r} with {n} NaN/Inf entries of {ups[name].numel()}" for name, n in bad.items())
    return (f"round {t}: {who} uploaded {what} (its local steps diverged, or the node is faulty: a smaller "
            f"step size, or check the node)")


def handshake(grid, fp: dict, n: int, connect_timeout: float, timeout: float, restore: dict,
              evaluators: Optional[set] = None) -> dict:
    """Ask each node as it connects (N within ``connect_timeout``) its client id and settings, and tell it where the
    run starts (``restore``: run key, round, each client's last round, which a resumed node loads from
    its ``state-dir``); return client -> node id. Raises ValueError if two nodes claim one client or a
    node's settings differ from the server's, NodeFailure if a node fails (e.g. cannot restore its
    state) or no node answers for some client within ``max(timeout, connect_timeout)``.

    The answers get the longer of the two waits: a node's first answer includes starting its first
    ClientApp process (importing torch and building the model), which on a loaded machine can take
    far longer than a round; a short round timeout must not fail a run before it starts.

    More than N nodes may be listed: a node that was killed stays "online" at the SuperLink until its
    heartbeats are missed (about a minute), while the restarted node joins. So the node list is read
    again while the answers are awaited (a killed node's stale entry may have made up the N before the
    restarted node registered), every new node is asked too, and the run goes on as soon as one node
    of every client has answered."""
    fapp, _, _ = flwr_modules()
    config = {"fingerprint": json.dumps(fp), "restore": json.dumps(restore)}
    asked: dict = {}  # node id -> the id of the message that asked it
    wait = max(timeout, connect_timeout)
    nodes, errors, answered = {}, [], set()
    connected_by, until, relist = time.monotonic() + connect_timeout, None, 0.0
    while len(nodes) + len(errors) < n:
        if time.monotonic() >= relist:  # 5 times a second until N nodes are listed, then once a second
            new = [nid for nid in sorted(int(i) for i in grid.get_node_ids()) if nid not in asked]
            if new:
                msgs = [new_message(fapp.RecordDict({"config": fapp.ConfigRecord(dict(config))}), nid, HELLO, 0)
                        for nid in new]
                asked.update(zip(new, grid.push_messages(msgs)))
            relist = time.monotonic() + (1.0 if len(asked) >= n else 0.2)
        if until is None and len(asked) >= n:  # the answers' wait starts once N nodes are connected
            until = time.monotonic() + wait
        elif until is None and time.monotonic() > connected_by:
            raise NodeFailure(f"only {len(asked)} of num_clients={n} client nodes connected within "
                              f"connect_timeout={connect_timeout:g} s")
        for r in grid.pull_messages([mid for nid, mid in asked.items() if nid not in answered]):
            nid = int(r.metadata.src_node_id)
            if nid not in asked or nid in answered:
                continue
            answered.add(nid)
            if r.has_error() or "hello" not in r.content:
                errors.append(NOT_OURS.format(nid) if not r.has_error() or HELLO_UNKNOWN in r.error.reason
                              else f"node {nid}: {r.error.reason}")
            else:
                cid = _hello_client(r, nid, fp, n, nodes)
                nodes[cid] = nid
                if evaluators is not None and r.content["hello"].get("evaluates"):
                    evaluators.add(cid)  # its client_app has an evaluate_fn (client_eval)
        if len(nodes) + len(errors) >= n or (until is not None and time.monotonic() > until):
            break
        time.sleep(POLL)
    if errors:
        raise NodeFailure("the handshake: " + "; ".join(errors))
    missing = [i for i in range(n) if i not in nodes]
    if missing:
        raise NodeFailure(f"the handshake: no node answered for client(s) {missing} within {wait:g} s (the longer "
                          f"of round_timeout={timeout:g} s and connect_timeout={connect_timeout:g} s; "
                          f"{len(asked)} nodes listed, {len(nodes)} answered)")
    return nodes


HELLO_UNKNOWN = "registered with name 'hello'"  # what a Flower ClientApp without our handler answers
NOT_OURS = ("node {} runs a ClientApp that is not python_algos' (it has no handler for the handshake 'query.hello'): "
            "the server runs an algorithm whose client program must run on the nodes; build the ClientApp with "
            "python_algos.deploy.flower.client_app(algorithm, model_fn, loss_fn, load_data, ...) from your model and "
            "data loader (docs/flower.md)")  # why a node's reply to the handshake is not one of ours


def _hello_client(r, nid: int, fp: dict, n: int, nodes: dict) -> int:
    """The client id node ``nid`` answered the handshake with (its reply ``r``), after checking that no
    other node claimed it and that the node's settings are the server's (ValueError naming both)."""
    cfg = r.content["hello"]
    cid, theirs = int(cfg["client_id"]), json.loads(cfg["fingerprint"])
    if not 0 <= cid < n or cid in nodes:
        raise ValueError(f"node {nid} says it is client {cid}: every node's partition-id must be one of "
                         f"0..{n - 1}, once each (--node-config \"partition-id=<i>\")")
    diff = [f"{key}: server {fp[key]!r}, client {theirs.get(key)!r}" for key in fp if theirs.get(key) != fp[key]]
    if diff:
        raise ValueError(f"client {cid} (node {nid}) runs other settings than the server: " + "; ".join(diff) +
                         (" (model_fn must build the same initial parameters everywhere: seed it)"
                          if any(d.startswith("x0_sha256") for d in diff) else ""))
    return cid
