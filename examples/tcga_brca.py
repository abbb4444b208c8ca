"""Sparse federated survival analysis on Fed-TCGA-BRCA: a linear Cox model with an L1 penalty, trained
over the data set's 6 natural centres (regions), scored by Harrell's C on the pooled test set.

    python -m examples.tcga_brca [--quick]

Data: Fed-TCGA-BRCA inside the package (1,088 patients, 39 clinical features standardised with the
pooled training statistics, the fixed train/test split 866 / 222; FLamby's split into 6 regions).
Loss: the negative Cox partial log-likelihood with Breslow's ties, full local batches (the loss
couples a centre's patients, so minibatches are refused). h = λ‖w‖₁, λ = 0.005. FedCanon, ZA1,
FedNMap, Prox-FedAvg (FedAvg with the prox; its server step α = lr·K, as FedCanon's α = βK) and
FedProx (smooth: it ignores h), K = 5 local steps, lr = 0.1, T = 150 rounds, 5 seeds (the seed
sets the initial model). The pooled fit is the same code (FedCanon) on one client holding every
training patient: what a centralised sparse Cox fit reaches. --quick: 2 methods, 2 seeds, 5 rounds.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from examples._common import Runner, parser, table, write_report
from python_algos.data import bundled
from python_algos.experiments.config import Config
from python_algos.runfolder.files import read_metrics

METHODS = {"fedcanon": "FedCanon", "za1": "ZA1", "fednmap": "FedNMap", "prox_fedavg": "Prox-FedAvg",
           "fedprox": "FedProx"}
ALG_OPTS = {"prox_fedavg": {"alpha": 0.5}}  # α = lr·K (the registry's α = 1 shrinks 5× more per round than it steps)
FEATURES = bundled.load_tcga_brca()[6]


def selected(params) -> dict:
    w = params[: len(FEATURES)].detach().cpu()  # the linear model's weights (its bias is last)
    return {"selected": int((w != 0).sum()), "selected_names": [FEATURES[i] for i in (w != 0).nonzero().view(-1)]}


def mean_std(values) -> str:
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1) if len(values) > 1 else 0.0:.3f}"


def main(argv=None) -> int:
    args = parser("tcga_brca", __doc__).parse_args(argv)
    q = args.quick
    methods = list(METHODS)[:2] if q else list(METHODS)
    seeds = range(2 if q else 5)
    base = Config(dataset="tcga_brca", partition="natural", num_clients=6, model="linear", reg="l1",
                  reg_strength=0.005, lr=0.1, local_steps=5, rounds=5 if q else 150, metrics_every=5 if not q else 1,
                  checkpoint_every=0, test_fraction=0.0)
    note = ("data: Fed-TCGA-BRCA inside the package (6 natural centres, the fixed split 866 / 222); linear Cox, "
            "Breslow ties, h = 0.005‖w‖₁, full local batches, float32")
    print(note)
    runner = Runner(args.out, progress=args.progress)
    results = {}
    for m in methods + ["pooled"]:
        runs = []
        for seed in seeds:
            cfg = (base.replace(algorithm="fedcanon", num_clients=1, partition="iid", seed=seed) if m == "pooled"
                   else base.replace(algorithm=m, seed=seed, alg_opts=ALG_OPTS.get(m, {})))
            s = runner.run(cfg, f"{m}-seed{seed}", extra_eval=selected)
            last = [r for r in read_metrics(s["out_dir"]) if r.get("test_cindex") is not None][-1]
            runs.append({"cindex": last["test_cindex"], "f+h": last["f+h"], "selected": last["selected"],
                         "names": last["selected_names"], "status": s["status"]})
        results[m] = runs
    rows = [[METHODS.get(m, "pooled (one client)"), mean_std([r["cindex"] for r in rs]),
             mean_std([r["f+h"] for r in rs]), mean_std([r["selected"] for r in rs])] for m, rs in results.items()]
    tab = table(["method", "test C-index (mean ± std)", "f+h", "features selected of 39"], rows)
    pooled = np.mean([r["cindex"] for r in results["pooled"]])
    best = max(methods, key=lambda m: np.mean([r["cindex"] for r in results[m]]))
    common = sorted(set.intersection(*[set(r["names"]) for rs in results.values() for r in rs]))
    scores = ", ".join(f"{METHODS[m]} {mean_std([r['cindex'] for r in results[m]])}" for m in methods)
    outcome = (f"pooled test C-index: {scores}; the pooled fit on one client reaches {pooled:.3f}. Best federated: "
               f"{METHODS[best]}. Features every run keeps ({len(common)}): {', '.join(common) or 'none'}. (f+h is "
               f"not comparable between the two: federated, each centre's risk sets hold its own patients only, a Cox "
               f"model stratified by centre; pooled, they hold every patient.)")
    print(tab)
    print(outcome)
    plots = []
    if not args.no_plot:
        from python_algos.experiments.plotting import plot_runs

        plots = plot_runs([os.path.join(args.out, f"{m}-seed0") for m in methods + ["pooled"]], out_dir=args.out,
                          metrics=["test_cindex", "f+h"], x_axes=["round"], title="Fed-TCGA-BRCA, seed 0",
                          name="tcga_brca.png", per_metric=False,
                          labels=[METHODS.get(m, "pooled") for m in methods + ["pooled"]])
    cmd = "python -m examples.tcga_brca" + (" --quick" if q else "")
    body = f"{tab}\n\n**Outcome:** {outcome}\n\nFigure: {', '.join(os.path.basename(p) for p in plots)}"
    write_report(args.out, "Sparse federated Cox regression on Fed-TCGA-BRCA", cmd, note, body,
                 {"results": results, "outcome": outcome})
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
