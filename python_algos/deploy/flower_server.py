"""The server's side of a Flower deployment: :func:`run_server` (a ServerApp's loop on Flower's
``Grid``) and :func:`server_app`. See :mod:`.flower` for what runs where."""

from __future__ import annotations

import json
import secrets
import time
from typing import Callable, Optional, Sequence

import numpy as np
import torch

import fedkernels as fk

from ..algorithms.base import ServerClientAlgorithm
from ..clients.base import seeds
from ..simulate import _clients_per_round
from .nodes import ServerClients, receives, scalars, server_state
from .persist import load_server, save_server
from .wire import (HELLO, ROUND, FlowerResult, NodeFailure, _check_algorithm, _flat_x0, _flwr, _message,
                   decode_vectors, encode_vectors, fingerprint, payload_bytes)

__all__ = ["run_server", "server_app", "load_server_checkpoint", "POLL"]

POLL = 0.1  # seconds between two pulls of replies from the SuperLink


def run_server(grid, algorithm: ServerClientAlgorithm, model_fn: Callable, *, regularizer: fk.Regularizer,
               rounds: int, num_clients: int, clients_per_round: Optional[int] = None,
               participation: Optional[float] = None, seed: int = 0, batch_size: Optional[int] = None,
               round_timeout: float = 300.0, connect_timeout: float = 120.0,
               callbacks: Sequence[Callable] = (), checkpoint: Optional[str] = None, checkpoint_every: int = 1,
               resume: Optional[dict] = None, checkpoint_extra: Optional[Callable[[], dict]] = None,
               run_key: Optional[str] = None) -> FlowerResult:
    """The server's loop on a Flower ``Grid`` (a ServerApp's ``main`` calls it); see the module docstring.

    ``model_fn()`` builds the model with the run's initial parameters (every node calls it too: the
    handshake refuses a node whose initial parameters differ). ``callbacks``: ``cb(t, state, record)``
    after every round. Raises :class:`NodeFailure` naming the client (and Flower node) that failed,
    answered with an error, or did not answer within ``round_timeout`` seconds.

    ``checkpoint``: a file the server's snapshot is written to (atomically) after every
    ``checkpoint_every``-th round and the last, with ``checkpoint_extra()`` (the caller's own data)
    inside; ``resume``: a snapshot read back with :func:`load_server_checkpoint`, from which the run
    continues exactly, provided every node that took part before it was started with the node config
    ``state-dir`` (its own state is saved there; see :mod:`.persist`). ``run_key`` names the run's
    node-state folders (a fresh random one by default; a resume takes the snapshot's).
    """
    _check_algorithm(algorithm)
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 0:
        raise ValueError(f"rounds must be an int >= 0, got {rounds!r}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
    for name, v in (("round_timeout", round_timeout), ("connect_timeout", connect_timeout)):
        if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number of seconds > 0 (a run never waits forever), got {v!r}")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be an int >= 1, got {checkpoint_every!r}")
    algorithm.validate(regularizer)
    n = int(num_clients)
    k = _clients_per_round(algorithm, n, participation, clients_per_round)
    _, x0 = _flat_x0(model_fn)
    cs = ServerClients(n, x0.numel(), x0.dtype, x0.device)
    cs.set_participation(k, seed)  # simulate's participant draw
    rng = torch.Generator().manual_seed(seeds(seed, 1, stream=1)[0])  # simulate's server generator
    with torch.no_grad():
        state = server_state(algorithm, x0, cs)
    fp = fingerprint(algorithm, regularizer, seed, batch_size, n, x0)
    pending: dict = {}  # client -> the download its client_receive still needs (algorithms with one)
    last_round = {i: 0 for i in range(n)}  # client -> the last round it took part in (0: none)
    metrics, elapsed, start, committed = [], 0.0, 0, None
    if resume is not None:
        state, start = _restore(resume, fp, state, rng, cs, rounds)
        pending, last_round = dict(resume["pending"]), {int(i): int(r) for i, r in resume["last_round"].items()}
        metrics, elapsed, committed, run_key = list(resume["metrics"]), float(resume["elapsed"]), start, resume["run_key"]
    run_key = run_key or secrets.token_hex(8)
    restore = {"run_key": run_key, "round": start, "last_round": {str(i): r for i, r in last_round.items()}}
    nodes = _handshake(grid, fp, n, connect_timeout, round_timeout, restore)
    msgs, with_receive = algorithm.messages(), receives(algorithm)
    for t in range(start + 1, int(rounds) + 1):
        t0 = time.perf_counter()
        ids = cs.participants() if algorithm.partial_participation else None
        part = list(range(n)) if ids is None else ids.tolist()
        with torch.no_grad():
            down = algorithm.download(state, rng)
        out, sent_bytes = [], 0
        head = {"round": t, "run_key": run_key, "committed": committed, "num_clients": n}
        for i in part:
            content = _round_content(state, down, pending.get(i), head)
            sent_bytes += payload_bytes(content["vectors"])
            out.append(_message(content, nodes[i], ROUND, t))
        try:
            replies = _exchange(grid, out, nodes, part, round_timeout, t)
        except NodeFailure as e:
            raise NodeFailure(f"{e}. " + (f"The server's checkpoint of round {committed} is {checkpoint}: restart the "
                                          f"node and resume from it" if committed is not None and checkpoint else
                                          "No server checkpoint was written (give checkpoint=PATH to resume a run)")
                              ) from None
        recv_bytes = sum(payload_bytes(replies[i].content["up"]) for i in part)
        ups = {i: decode_vectors(replies[i].content["up"]) for i in part}
        for i in part:
            if set(ups[i]) != set(msgs.up):
                raise NodeFailure(f"round {t}: client {i} (node {nodes[i]}) uploaded {sorted(ups[i])}, "
                                  f"expected {sorted(msgs.up)}")
        stacked = {name: torch.stack([ups[i][name].to(x0.dtype) for i in part]) for name in msgs.up}
        with torch.no_grad(), fk.prox_stats() as stats:
            means = algorithm.aggregate(stacked, cs, ids)
            state, sent = algorithm.server_update(state, means, down, regularizer)
        for i in part:
            pending.pop(i, None)
            last_round[i] = t
        if with_receive:
            keep = {name: sent[name].detach().clone() for name in msgs.down}
            pending.update({i: keep for i in part})
        wall = time.perf_counter() - t0
        elapsed += wall
        rec = {"round": t, "wall_time": wall, "elapsed": elapsed, "participants": part,
               "up": len(msgs.up), "down": len(msgs.down), "sent_bytes": sent_bytes, "recv_bytes": recv_bytes,
               "prox_time": stats.seconds, "prox_evals": stats.evaluations}
        metrics.append(rec)
        stop = any(cb(t, state, rec) is True for cb in callbacks)
        if checkpoint and not stop and (t % checkpoint_every == 0 or t == int(rounds)):
            save_server(checkpoint, {"round": t, "run_key": run_key, "fingerprint": fp, "state": state,
                                     "rng": rng.get_state(), "participation": cs.rng_state(), "pending": pending,
                                     "last_round": dict(last_round), "metrics": metrics, "elapsed": elapsed,
                                     "extra": checkpoint_extra() if checkpoint_extra is not None else {}})
            committed = t
        if stop:
            break
    params = algorithm.report(state, regularizer).detach().clone()
    setup = {**fp, "rounds": int(rounds), "clients_per_round": k, "regularizer": repr(regularizer)}
    return FlowerResult(params=params, state=state, metrics=metrics, nodes=dict(nodes), setup=setup)


def _restore(snap: dict, fp: dict, state, rng, cs, rounds):
    """The server's State and generators from a snapshot of this run (refused if its settings differ)."""
    diff = [f"{k}: checkpoint {snap['fingerprint'].get(k)!r}, now {fp[k]!r}" for k in fp
            if snap["fingerprint"].get(k) != fp[k]]
    if diff:
        raise ValueError("resume: the checkpoint belongs to a run with other settings: " + "; ".join(diff))
    if int(rounds) < int(snap["round"]):
        raise ValueError(f"rounds={rounds}: the checkpoint is at round {snap['round']} and a run cannot go back")
    saved = snap["state"]
    if type(saved) is not type(state):
        raise ValueError(f"resume: the checkpoint holds a {type(saved).__name__}, this algorithm's state is a "
                         f"{type(state).__name__}")
    rng.set_state(snap["rng"])
    cs.set_rng_state(snap["participation"])
    return saved, int(snap["round"])


def load_server_checkpoint(path: str) -> dict:
    """A server checkpoint written by :func:`run_server` (``checkpoint=path``), to pass as ``resume``;
    its ``extra`` is what ``checkpoint_extra()`` returned."""
    return load_server(path)


def _round_content(state, down: dict, recv: Optional[dict], head: dict):
    """One participant's message: the vectors its ``client_receive`` needs (``recv:``) and those its
    round starts from (``down:``), a vector equal to one already sent travelling once; the plan
    (JSON) maps names to keys and carries the round counters, the non-tensor round settings and
    ``head`` (round, run key, the server's last checkpoint round, N)."""
    fapp, _, _ = _flwr()
    vectors, plan = {}, {"recv": None, "down": {}, "settings": {}, "scalars": scalars(state), **head}
    if recv is not None:
        plan["recv"] = {}
        for name, v in recv.items():
            vectors["recv:" + name] = v
            plan["recv"][name] = "recv:" + name
    for name, v in down.items():
        if not isinstance(v, torch.Tensor):
            plan["settings"][name] = v
        elif recv is not None and name in recv and torch.equal(recv[name], v):
            plan["down"][name] = "recv:" + name
        else:
            vectors["down:" + name] = v
            plan["down"][name] = "down:" + name
    return fapp.RecordDict({"vectors": encode_vectors(vectors),
                            "config": fapp.ConfigRecord({"plan": json.dumps(plan, default=_jsonable)})})


def _jsonable(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    raise TypeError(f"round setting {v!r} ({type(v).__name__}) cannot be sent to the clients")


def _exchange(grid, out: list, nodes: dict, part: list, timeout: float, t) -> dict:
    """Send one round's messages (``out[j]`` to participant ``part[j]``) and collect the replies as
    they come, pulling every ``POLL`` seconds (Flower's ``send_and_receive`` sleeps 3 s between
    pulls, which a round would pay on every exchange); every participant's reply, or NodeFailure
    naming those that answered with an error (the wait stops at the first) or not in time."""
    waiting = {int(nodes[i]): mid for i, mid in zip(part, grid.push_messages(out))}
    by_node, until = {}, time.monotonic() + timeout
    while waiting:
        for r in grid.pull_messages(list(waiting.values())):
            nid = int(r.metadata.src_node_id)
            if waiting.pop(nid, None) is not None:
                by_node[nid] = r
        if not waiting or any(r.has_error() for r in by_node.values()) or time.monotonic() > until:
            break
        time.sleep(POLL)
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
        raise NodeFailure(f"round {t}: {', '.join(missing)} did not answer within round_timeout={timeout:g} s "
                          f"(the node stopped, or its round is slower than that: raise round_timeout)")
    return got


def _handshake(grid, fp: dict, n: int, connect_timeout: float, timeout: float, restore: dict) -> dict:
    """Wait for N nodes, ask each its client id (``partition-id``) and settings, and tell each where the
    run starts (``restore``: run key, round, each client's last round, which a resumed node loads from
    its ``state-dir``); return client -> node id. Raises ValueError if two nodes claim one client or a
    node's settings differ from the server's, NodeFailure if a node fails (e.g. cannot restore its
    state) or no node answers for some client within ``timeout``.

    More than N nodes may be listed: a node that was killed stays "online" at the SuperLink until its
    heartbeats are missed (about a minute), while the restarted node has joined. The handshake asks
    them all and goes on as soon as one node of every client has answered."""
    fapp, _, _ = _flwr()
    deadline = time.monotonic() + connect_timeout
    while True:
        node_ids = sorted(int(i) for i in grid.get_node_ids())
        if len(node_ids) >= n:
            break
        if time.monotonic() > deadline:
            raise NodeFailure(f"only {len(node_ids)} of num_clients={n} client nodes connected within "
                              f"connect_timeout={connect_timeout:g} s")
        time.sleep(0.2)
    content = lambda: fapp.RecordDict({"config": fapp.ConfigRecord({"fingerprint": json.dumps(fp),
                                                                      "restore": json.dumps(restore)})})
    waiting = dict(zip(node_ids, grid.push_messages([_message(content(), nid, HELLO, 0) for nid in node_ids])))
    nodes, errors, until = {}, [], time.monotonic() + timeout
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
        raise NodeFailure(f"the handshake: no node answered for client(s) {missing} within round_timeout="
                          f"{timeout:g} s ({len(node_ids)} nodes listed, {len(nodes)} answered)")
    return nodes


def server_app(algorithm: ServerClientAlgorithm, model_fn: Callable, *, on_result: Optional[Callable] = None,
               **settings):
    """A Flower ``ServerApp`` running :func:`run_server` with these settings; ``on_result(result,
    context)`` receives the :class:`FlowerResult` (e.g. to write the run folder)."""
    _check_algorithm(algorithm)
    _, _, fserver = _flwr()
    app = fserver.ServerApp()

    @app.main()
    def main(grid, context) -> None:
        result = run_server(grid, algorithm, model_fn, **settings)
        if on_result is not None:
            on_result(result, context)

    return app
