"""The paper-style panels of the FedCanon Fig. 1 / Fig. 2 sweeps (examples/sweeps/fedcanon_fig*.toml),
drawn from the sweeps' folders (the sweep itself writes the table, the heat map and best.png):

    python -m examples.sweeps.plot_fedcanon --fig1 results/fedcanon-fig1 --fig2 results/fedcanon-fig2 [--out DIR]

Fig. 1: ‖G_s‖² and f+h against rounds for β = 0.02 with α varied, and for α = 0.05 with β varied
(the paper's two panels), each curve the mean over the seeds with a ± std band.
Fig. 2: test accuracy against rounds per heterogeneity level (the four methods), and the final test
accuracy against heterogeneity (mean ± std over the seeds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from python_algos.runfolder.records import SUMMARY

NAMES = {"fedavg": "FedAvg", "scaffold": "SCAFFOLD", "scaffnew": "SCAFFNEW", "fedcanon": "FedCanon"}


def _points(sweep: str) -> list:
    with open(os.path.join(sweep, SUMMARY)) as f:
        return json.load(f)["points"]


def _setup(sweep: str) -> str:
    """The setup line of a Fig. 1 panel, from the sweep's own record (what it ran, not what it was
    meant to run); plot_runs' own setup line would show the lr, which FedCanon's α and β replace."""
    with open(os.path.join(sweep, "sweep.json")) as f:
        rec = json.load(f)
    c = rec["config"]
    opts = "".join(f", {k} = {v:g}" for k, v in c["reg_opts"].items())
    return (f"{c['dataset']}, {c['partition']}, N = {c['num_clients']}, {c['model']}, "
            f"h = {c['reg'].upper()}(λ = {c['reg_strength']:g}{opts}), K = {c['local_steps']}, B = {c['batch_size']}, "
            f"T = {c['rounds']}\n{len(rec['seeds'])} seeds: mean, band mean ± std")


def fig1(sweep: str, out: str, formats) -> list:
    from python_algos.experiments.plotting import plot_runs

    pts, setup = _points(sweep), _setup(sweep)
    left = sorted((p for p in pts if p["point"]["beta"] == 0.02), key=lambda p: p["point"]["alpha"])
    right = sorted((p for p in pts if p["point"]["alpha"] == 0.05), key=lambda p: p["point"]["beta"])
    files = plot_runs([p["dir"] for p in left], out_dir=out, metrics=["grad_map_sq", "f+h"], x_axes=["round"],
                      title="FedCanon, β = 0.02, α varied\n" + setup, name="fedcanon_fig1_alpha", per_metric=False,
                      setup=False,
                      labels=[f"α = {p['point']['alpha']:g}" for p in left], formats=formats)
    files += plot_runs([p["dir"] for p in right], out_dir=out, metrics=["grad_map_sq", "f+h"], x_axes=["round"],
                       title="FedCanon, α = 0.05, β varied\n" + setup, name="fedcanon_fig1_beta", per_metric=False,
                       setup=False,
                       labels=[f"β = {p['point']['beta']:g}" for p in right], formats=formats)
    return files


def fig2(sweep: str, out: str, formats) -> list:
    from python_algos.experiments.plotting import plot_runs, pyplot
    from python_algos.experiments.plotting.style import save_figure

    pts = _points(sweep)
    etas = list(dict.fromkeys(p["point"]["eta"] for p in pts))
    algs = list(dict.fromkeys(p["algorithm"] for p in pts))
    files = []
    for eta in etas:
        ps = [p for p in pts if p["point"]["eta"] == eta]
        files += plot_runs([p["dir"] for p in ps], out_dir=out, metrics=["test_acc", "test_loss"], x_axes=["round"],
                           title=f"h = 0, Dir({eta:g})", name=f"fedcanon_fig2_dir{eta:g}", per_metric=False,
                           labels=[NAMES.get(p["algorithm"], p["algorithm"]) for p in ps], formats=formats)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for i, a in enumerate(algs):
        ys = [next(p["final"]["test_acc"] for p in pts if p["algorithm"] == a and p["point"]["eta"] == e) for e in etas]
        x = [j + (i - (len(algs) - 1) / 2) * 0.06 for j in range(len(etas))]  # side by side, not on top
        ax.errorbar(x, [y["mean"] for y in ys], yerr=[y["std"] for y in ys], marker="o", capsize=3,
                    label=NAMES.get(a, a))
    ax.set_xticks(range(len(etas)), [f"Dir({e:g})" for e in etas])
    ax.set_xlabel("label skew Dir(η): smaller η, more heterogeneous")
    ax.set_ylabel("final test accuracy (mean ± std)")
    n = len(pts[0]["statuses"])
    ax.set_title(f"h = 0, N = 10, {n} seeds", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    files += save_figure(fig, out, "fedcanon_fig2_acc_vs_skew", formats, 110)
    plt.close(fig)
    return files


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fig1", metavar="SWEEP", help="the folder of the fedcanon_fig1.toml sweep")
    p.add_argument("--fig2", metavar="SWEEP", help="the folder of the fedcanon_fig2.toml sweep")
    p.add_argument("--out", help="where the figures go (default: each sweep's folder)")
    p.add_argument("--formats", default="png", help="png,pdf,svg (default png)")
    args = p.parse_args(argv)
    if not (args.fig1 or args.fig2):
        p.error("give --fig1 SWEEP and/or --fig2 SWEEP")
    formats = args.formats.split(",")
    files = []
    if args.fig1:
        files += fig1(args.fig1, args.out or args.fig1, formats)
    if args.fig2:
        files += fig2(args.fig2, args.out or args.fig2, formats)
    for f in files:
        print(f"figure: {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
