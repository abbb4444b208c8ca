"""Flower apps for the server–client algorithms (Flower's Message API, ``flwr==1.41.0``).

    from python_algos.deploy.flower import server_app, client_app
    app = server_app(FedCanon(...), model_fn, regularizer=fk.L1(1e-3), rounds=50, num_clients=4)
    app = client_app(FedCanon(...), model_fn, loss_fn, load_data, regularizer=fk.L1(1e-3))

What runs where (docs/algorithms.md §0.1; the framework-free parts are :mod:`.nodes`):

* The **ServerApp** (:func:`run_server`) holds the algorithm's server fields. Each round it draws the
  participants from the run's seeded generator (``simulate``'s draw), sends each participant its
  download, collects the uploads, averages them (``algorithm.aggregate``: ``(1/|S|) Σ``, or
  ``(1/N) Σ`` for ``up_over_all`` names) and runs ``server_update`` (the server's prox, fused
  kernels). A client that fails or does not answer within ``round_timeout`` stops the run with
  :class:`NodeFailure` naming it; nothing waits forever. With ``checkpoint=PATH`` the server saves
  its side after every round, and ``resume=load_server_checkpoint(PATH)`` continues exactly, each
  node restoring its own state from its node config's ``state-dir`` (:mod:`.persist`).
* The **ClientApp** (node ``partition-id`` = client i, its own data from ``load_data(i, context)``)
  keeps its rows of the client fields, its client copies, its minibatch generator (seeded from
  (seed, i)) and its last upload in ``context.state``; on each round it runs ``client_receive`` of
  the previous download (when the algorithm has one) and then ``client_update``.

On the wire per round: to each participant, the ``messages().down`` vectors of the previous round
(those its ``client_receive`` needs, or those ``download`` starts from, each sent once), plus a small
JSON plan (round counters, round settings); back, the ``messages().up`` vectors. In float64 the
final model equals ``simulate``'s (tested to 1e-10).
"""

from __future__ import annotations

from .flower_client import client_app, handle_hello, handle_round, node_client_id
from .flower_server import checkpoint_to_resume, load_server_checkpoint, run_server, server_app
from .wire import (
    HELLO,
    INSTALL,
    ROUND,
    NodeFailure,
    decode_vectors,
    encode_vectors,
    fingerprint,
    flwr_modules,
    from_run_config,
    save_result,
    write_error,
)

__all__ = ["server_app", "client_app", "run_server", "load_server_checkpoint", "checkpoint_to_resume", "handle_round",
           "handle_hello", "node_client_id", "NodeFailure", "encode_vectors", "decode_vectors", "fingerprint",
           "save_result", "write_error", "INSTALL", "HELLO", "ROUND", "flwr_modules", "from_run_config"]
