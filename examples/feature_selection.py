"""Federated feature selection with a per-parameter group lasso: an MLP learns which of its inputs
matter, and the first-layer columns of the others go to exactly zero.

    python -m examples.feature_selection [--quick]

Setting: 100 input features, of which a known 20 carry the signal. The label of a sample is the
argmax of a random two-layer teacher network that reads only those 20 features (3 classes);
the other 80 are noise. 10 clients, each with its own shift of the feature means (heterogeneous
f_i), 300 samples each; a held-out test set of 2,000. Student: MLP 100 -> 32 -> 3 (ReLU).

h is given per parameter:

    regularizer = {"0.weight": fk.GroupLasso(lam, groups="cols"), "*.bias": None, "*": None}

Column j of the first layer's weight is everything the network reads from feature j, so the
group lasso on columns either keeps a feature or removes it exactly (block soft-thresholding sets
the whole column to 0). FedCanon (its server step z <- prox_{alpha h}(z - alpha dbar) is where the
columns vanish), full local gradients, float64. A feature is *kept* when its column is nonzero in
the model FedCanon reports; we compare the kept set with the known support.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from torch import nn

import fedkernels as fk
import python_algos as pa

D, INFORMATIVE, CLASSES, HIDDEN = 100, 20, 3, 32


def make_data(num_clients: int, per_client: int, test: int, seed: int = 0):
    """Clients' (X, y), the test set, and the known support (feature indices)."""
    g = torch.Generator().manual_seed(seed)
    support = torch.randperm(D, generator=g)[:INFORMATIVE].sort().values
    W1 = torch.randn(INFORMATIVE, 16, generator=g, dtype=torch.float64)
    W2 = torch.randn(16, CLASSES, generator=g, dtype=torch.float64)

    def label(X):
        return (torch.tanh(X[:, support] @ W1 / INFORMATIVE ** 0.5) @ W2).argmax(dim=1)

    clients = []
    for _ in range(num_clients):
        shift = 0.5 * torch.randn(D, generator=g, dtype=torch.float64)
        X = torch.randn(per_client, D, generator=g, dtype=torch.float64) + shift
        clients.append((X, label(X)))
    Xt = torch.randn(test, D, generator=g, dtype=torch.float64)
    return clients, (Xt, label(Xt)), support


def run(rounds: int, lam: float, num_clients: int = 10, per_client: int = 300, seed: int = 0, log=print) -> dict:
    clients, (Xt, yt), support = make_data(num_clients, per_client, 2000, seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(D, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)).double()
    regularizer = {"0.weight": fk.GroupLasso(lam, groups="cols"), "*.bias": None, "*": None}
    alg = pa.FedCanon(alpha=0.5, beta=0.05, local_steps=5)
    t0 = time.perf_counter()
    hist = pa.simulate(alg, model, nn.functional.cross_entropy, clients, rounds, regularizer=regularizer,
                       metrics_every=max(1, rounds // 5))
    seconds = time.perf_counter() - t0
    with torch.no_grad():  # the model holds hist.params after simulate
        acc = float((model(Xt).argmax(dim=1) == yt).double().mean())
        kept = (model[0].weight != 0).any(dim=0).nonzero().flatten()
    truth, found = set(support.tolist()), set(kept.tolist())
    result = {
        "rounds": rounds, "lam": lam, "seconds": round(seconds, 2), "test_acc": round(acc, 4),
        "kept": len(found), "true_positives": len(found & truth), "false_positives": len(found - truth),
        "false_negatives": len(truth - found), "support": sorted(truth), "kept_features": sorted(found),
        "f+h": hist.metrics[-1].get("f+h"),
    }
    log(f"FedCanon, {rounds} rounds, GroupLasso(lam={lam:g}, cols) on 0.weight: kept {len(found)} of {D} features; "
        f"true positives {result['true_positives']}/{INFORMATIVE}, false positives {result['false_positives']}, "
        f"false negatives {result['false_negatives']}; test accuracy {acc:.3f}; {seconds:.1f} s")
    return result


LAMS = (0.0, 0.01, 0.03, 0.05, 0.06, 0.08)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m examples.feature_selection", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few rounds, two values of lam (smoke test, seconds)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per run (default 300)")
    p.add_argument("--lam", type=float, action="append", default=None,
                   help="group-lasso weight on the first layer's columns "
                        f"(repeatable; default {' '.join(map(str, LAMS))})")
    p.add_argument("--out", default=os.path.join("results", "examples", "feature_selection"))
    args = p.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (5 if args.quick else 300)
    lams = args.lam or ((0.0, 0.05) if args.quick else LAMS)
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a 3 k-parameter model: extra threads only wait on each other
    results = [run(rounds, lam) for lam in lams]
    header = "| lam | features kept | true positives (of 20) | false positives | false negatives | test accuracy |"
    lines = [header, "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['lam']:g} | {r['kept']} | {r['true_positives']} | {r['false_positives']} | "
              f"{r['false_negatives']} | {r['test_acc']:.3f} |" for r in results]
    print("\n".join(lines))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"quick": args.quick, "runs": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
