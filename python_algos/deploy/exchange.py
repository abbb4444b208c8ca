"""Talking to the nodes through Flower's ``Grid``: the handshake, and one round's replies collected
as they come (pushed once, pulled every ``POLL`` seconds; Flower's own ``send_and_receive``
sleeps 3 s between pulls, which every exchange would pay)."""

from __future__ import annotations

import json
import time

from .wire import HELLO, NodeFailure, flwr_modules, new_message

__all__ = ["handshake", "collect", "check_replies", "POLL"]

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


def handshake(grid, fp: dict, n: int, connect_timeout: float, timeout: float, restore: dict) -> dict:
    """Wait for N nodes, ask each its client id (``partition-id``) and settings, and tell each where the
    run starts (``restore``: run key, round, each client's last round, which a resumed node loads from
    its ``state-dir``); return client -> node id. Raises ValueError if two nodes claim one client or a
    node's settings differ from the server's, NodeFailure if a node fails (e.g. cannot restore its
    state) or no node answers for some client within ``max(timeout, connect_timeout)``.

    The answers get the longer of the two waits: a node's first answer includes starting its first
    ClientApp process (importing torch and building the model), which on a loaded machine can take
    far longer than a round; a short round timeout must not fail a run before it starts.

    More than N nodes may be listed: a node that was killed stays "online" at the SuperLink until its
    heartbeats are missed (about a minute), while the restarted node has joined. The handshake asks
    them all and goes on as soon as one node of every client has answered."""
    fapp, _, _ = flwr_modules()
    deadline = time.monotonic() + connect_timeout
    while True:
        node_ids = sorted(int(i) for i in grid.get_node_ids())
        if len(node_ids) >= n:
            break
        if time.monotonic() > deadline:
            raise NodeFailure(f"only {len(node_ids)} of num_clients={n} client nodes connected within "
                              f"connect_timeout={connect_timeout:g} s")
        time.sleep(0.2)

    def content():
        config = {"fingerprint": json.dumps(fp), "restore": json.dumps(restore)}
        return fapp.RecordDict({"config": fapp.ConfigRecord(config)})

    waiting = dict(zip(node_ids, grid.push_messages([new_message(content(), nid, HELLO, 0) for nid in node_ids])))
    wait = max(timeout, connect_timeout)
    nodes, errors, until = {}, [], time.monotonic() + wait
    while waiting and len(nodes) + len(errors) < n:
        for r in grid.pull_messages(list(waiting.values())):
            nid = int(r.metadata.src_node_id)
            if waiting.pop(nid, None) is None:
                continue
            if r.has_error():
                errors.append(f"node {nid}: {r.error.reason}")
                continue
            cfg = r.content["hello"]
            cid, theirs = int(cfg["client_id"]), json.loads(cfg["fingerprint"])
            if not 0 <= cid < n or cid in nodes:
                raise ValueError(f"node {nid} says it is client {cid}: every node's partition-id must be one of "
                                 f"0..{n - 1}, once each (--node-config \"partition-id=<i>\")")
            diff = [f"{key}: server {fp[key]!r}, client {theirs.get(key)!r}" for key in fp
                    if theirs.get(key) != fp[key]]
            if diff:
                raise ValueError(f"client {cid} (node {nid}) runs other settings than the server: " + "; ".join(diff) +
                                 (" (model_fn must build the same initial parameters everywhere: seed it)"
                                  if any(d.startswith("x0_sha256") for d in diff) else ""))
            nodes[cid] = nid
        if waiting and len(nodes) + len(errors) < n:
            if time.monotonic() > until:
                break
            time.sleep(POLL)
    if errors:
        raise NodeFailure("the handshake: " + "; ".join(errors))
    missing = [i for i in range(n) if i not in nodes]
    if missing:
        raise NodeFailure(f"the handshake: no node answered for client(s) {missing} within {wait:g} s (the longer "
                          f"of round_timeout={timeout:g} s and connect_timeout={connect_timeout:g} s; "
                          f"{len(node_ids)} nodes listed, {len(nodes)} answered)")
    return nodes
