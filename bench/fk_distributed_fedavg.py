"""FedAvg with python_algos on several processes: one rank of a ``torchrun`` job, on the workload of
``bench/pfl_fedavg.py`` (the peers table's multi-process row for this project). Started by
``python -m bench.peers``.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m bench.fk_distributed_fedavg --out r.json

Each rank runs its shard of the clients with the ``--inner`` executor (``executor="distributed"``);
rank 0 writes ``--out``: seconds of each round (simulate's ``wall_time``) and the final model.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fk_distributed_fedavg", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--inner", default="sequential", choices=["sequential", "batched"])
    p.add_argument("--model", default="mlp", help="a bench.clients model (mlp, logreg, cnn, cifar_cnn)")
    p.add_argument("--steps", type=int, default=None, help="local steps per round (default: samples / batch)")
    p.add_argument("--cohort", type=int, default=None, help="clients per round (default: all)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    import fedkernels as fk
    import python_algos as pa
    from python_algos.experiments.launch import finish

    from .clients import input_shape, make_clients, make_model

    fk.set_num_threads(1)
    K = args.steps or args.samples // args.batch  # default: one local epoch, as pfl
    hist = pa.simulate(pa.FedAvg(lr_local=args.lr, local_steps=K), make_model(args.model), F.cross_entropy,
                       make_clients(args.clients, args.samples, in_shape=input_shape(args.model)), args.rounds,
                       batch_size=args.batch,
                       metrics_every=0, executor="distributed", executor_options={"inner": args.inner},
                       clients_per_round=args.cohort)
    if int(os.environ.get("RANK", "0")) == 0:
        res = {"round_s": [r["wall_time"] for r in hist.metrics], "params": hist.params.tolist(),
               "threads": torch.get_num_threads(), "inner": args.inner}
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f)
        os.replace(tmp, args.out)
    finish()


if __name__ == "__main__":
    main()
