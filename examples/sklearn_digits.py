"""Real data without downloads: scikit-learn's bundled handwritten digits (1797 8x8 images, 10
classes), split over 10 clients by Dirichlet label skew, sparse multinomial logistic regression.
FedCanon, FedMiD and FedAvg from the same initial model on the same split; one figure for a paper.

    python -m examples.sklearn_digits [--quick] [--formats png,pdf,svg]

Setting: --dataset sklearn:digits (features standardized on the training split, 20 % test),
--partition dirichlet --eta 0.3, N = 10, linear model (650 parameters), h = 1e-3·‖x‖₁, full local
gradients, K = 5, one local step size 0.05 (FedCanon α = βK), T = 60 rounds. Needs scikit-learn
(pip install scikit-learn). About 15 s on 2 cores.
"""

from __future__ import annotations

import os
import sys

from examples._common import parser, sklearn_missing, table, write_report
from python_algos.experiments.compare import compare_experiments
from python_algos.experiments.config import Config
from python_algos.experiments.plotting import DEFAULT_FORMATS, parse_formats

METHODS = ("fedcanon", "fedmid", "fedavg")


def main(argv=None) -> int:
    p = parser("sklearn_digits", __doc__)
    p.add_argument("--formats", default=",".join(DEFAULT_FORMATS), help="figure formats, e.g. png,pdf,svg")
    args = p.parse_args(argv)
    formats = parse_formats(args.formats)  # before any run: a typo costs nothing
    if sklearn_missing():
        return 1
    q = args.quick
    cfg = Config(dataset="sklearn:digits", partition="dirichlet", eta=0.3, num_clients=10, model="linear",
                 reg="l1", reg_strength=1e-3, lr=0.05, local_steps=2 if q else 5, rounds=3 if q else 60,
                 metrics_every=1 if q else 2, checkpoint_every=0, seed=0)
    note = "dataset: scikit-learn's bundled digits (sklearn.datasets.load_digits; nothing downloaded)"
    print(note)
    # replace=True: running the script again regenerates its results (the folder is the script's own)
    summaries = compare_experiments(cfg, list(METHODS), args.out, progress=args.progress, log=lambda *a: None,
                                    replace=True)
    rows = [[s["label"], s["final"]["f+h"], s["final"]["test_acc"], s["final"]["sparsity"], s["elapsed"]]
            for s in summaries]
    tab = table(["method", "f+h", "test accuracy", "sparsity", "time (s)"], rows)
    best = max(summaries, key=lambda s: s["final"]["test_acc"])
    outcome = (f"after {cfg.rounds} rounds {best['label']} has the best test accuracy "
               f"({best['final']['test_acc']:.3f}); "
               + ", ".join(f"{s['label']} f+h = {s['final']['f+h']:.4g}" for s in summaries))
    print(tab)
    print(outcome)
    plots = []
    if not args.no_plot:
        from python_algos.experiments.plotting import plot_runs

        plots = plot_runs([args.out], out_dir=args.out, metrics=["f+h", "accuracy", "stationarity", "sparsity"],
                          x_axes=["round"], per_metric=False, name="digits", formats=formats)
        for f in plots:
            print(f"figure: {f}")
    cmd = "python -m examples.sklearn_digits" + (" --quick" if q else "")
    body = f"{tab}\n\n**Outcome:** {outcome}\n\nFigure: {', '.join(os.path.basename(f) for f in plots)}"
    write_report(args.out, "Real data without downloads: sklearn digits, Dirichlet(0.3) over 10 clients", cmd, note,
                 body, {"results": {s["label"]: s["final"] for s in summaries}, "outcome": outcome})
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
