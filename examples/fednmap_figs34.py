"""FedNMap Figs. 3–4 analogue: stationarity after T rounds falls as the number of clients N grows
(Fig. 3) and as the number of local steps K = Q grows (Fig. 4); the log-log slopes are reported.

    python -m examples.fednmap_figs34 [--quick] [--data-dir DIR]

Paper setting (FedNMap §6, numbers stripped): MNIST, one-hidden-layer sigmoid network, elastic
net, label-sorted split, minibatch gradients; N and Q varied with η = α/Q so that the effective
step α stays fixed. Here: MNIST if its IDX files are in --data-dir, otherwise the built-in
image_like task (10 classes, 1x12x12); SigmoidNet with 32 hidden units; h = elastic net
(λ1 = λ2 = 1e-4); label-sorted contiguous split; single-sample stochastic gradients (B = 1, so
that gradient noise, which N and Q average out, dominates after T rounds); α = 1, λ = α (prox
parameter of the normal map), η = α/Q; T = 100 rounds. Stationarity: ‖F_nor^λ(z)‖² (§3 M3)
averaged over the last 20 % of the rounds and over 3 seeds. Fig. 3: N ∈ {2, 4, 8, 16} at Q = 4;
Fig. 4: Q ∈ {1, 2, 4, 8, 16} at N = 8.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from examples._common import Runner, loglog_slope, paper_data, parser, save_figure, table, tail_mean, write_report
from python_algos.experiments.config import Config
from python_algos.runfolder.files import read_metrics

ALPHA = 1.0


def main(argv=None) -> int:
    args = parser("fednmap_figs34", __doc__).parse_args(argv)
    q = args.quick
    dataset, opts, data_dir, note = paper_data("mnist", args.data_dir, "image_like",
                                               {"n": 600 if q else 2000, "shape": [1, 12, 12], "modes": 2,
                                                "noise": 1.0})
    base = Config(algorithm="fednmap", dataset=dataset, data_opts=opts, data_dir=data_dir, partition="shards",
                  model="sigmoid_net", model_opts={"hidden": 32}, reg="elastic_net", reg_strength=1e-4,
                  reg_opts={"l2": 1e-4}, rounds=100 if not q else 3, batch_size=1, metrics_every=1,
                  checkpoint_every=0)
    Ns, Qs = ((2, 4, 8, 16), (1, 2, 4, 8, 16)) if not q else ((2, 4), (1, 2))
    seeds = (0, 1, 2) if not q else (0,)
    runner = Runner(args.out, progress=args.progress)

    cache = {}

    def stationarity(N, Q):
        if (N, Q) in cache:  # (N = 8, Q = 4) is in both sweeps
            return cache[(N, Q)]
        vals = []
        for seed in seeds:
            cfg = base.replace(num_clients=N, local_steps=Q, lr=ALPHA / Q, seed=seed,
                               alg_opts={"lam": ALPHA, "eta": ALPHA / Q, "server_scale": 1.0})
            s = runner.run(cfg, f"N={N}-Q={Q}-seed={seed}")
            vals.append(tail_mean(read_metrics(s["out_dir"]), "normal_map_sq", frac=0.2))
        cache[(N, Q)] = float(np.mean(vals))
        return cache[(N, Q)]

    q_fixed, n_fixed = (4, 8) if not q else (2, 2)
    print(f"Fig. 3: N varied, Q = {q_fixed}")
    by_n = {N: stationarity(N, q_fixed) for N in Ns}
    print(f"Fig. 4: Q varied, N = {n_fixed}")
    by_q = {Q: stationarity(n_fixed, Q) for Q in Qs}
    slope_n = loglog_slope(list(by_n), list(by_n.values()))
    slope_q = loglog_slope(list(by_q), list(by_q.values()))
    tab_n = table([f"N (Q = {q_fixed})", "‖F_nor‖² after T (mean of seeds)"], [[n, v] for n, v in by_n.items()])
    tab_q = table([f"Q (N = {n_fixed})", "‖F_nor‖² after T (mean of seeds)"], [[k, v] for k, v in by_q.items()])
    falls_n = all(b < a for a, b in zip(list(by_n.values()), list(by_n.values())[1:]))
    falls_q = all(b < a for a, b in zip(list(by_q.values()), list(by_q.values())[1:]))
    mono_n = 'monotonically' if falls_n else 'not monotonically'
    mono_q = 'monotonically' if falls_q else 'not monotonically'
    outcome = (f"log-log slope of stationarity after T = {base.rounds} rounds: {slope_n:.2f} in N, {slope_q:.2f} in Q "
               f"(-1 would be a linear speedup); stationarity falls {mono_n} in N and {mono_q} in Q.")
    print(tab_n)
    print(tab_q)
    print(outcome)
    plots = []
    if not args.no_plot:
        plots = _plot(args.out, by_n, by_q, slope_n, slope_q)
    cmd = "python -m examples.fednmap_figs34" + (" --quick" if q else "")
    body = f"{tab_n}\n\n{tab_q}\n\n**Outcome:** {outcome}\n\nFigure: {', '.join(os.path.basename(p) for p in plots)}"
    write_report(args.out, "FedNMap Figs. 3–4 analogue (stationarity vs N and vs Q)", cmd, note, body,
                 {"by_N": by_n, "by_Q": by_q, "slope_N": slope_n, "slope_Q": slope_q, "outcome": outcome})
    print(f"results written to {args.out}")
    return 0


def _plot(out, by_n, by_q, slope_n, slope_q):
    from python_algos.experiments.plotting import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, data, slope, xl in ((axes[0], by_n, slope_n, "number of clients N"),
                                (axes[1], by_q, slope_q, "local steps Q")):
        xs, ys = list(data), list(data.values())
        ax.loglog(xs, ys, "o-", linewidth=1.6, label=f"FedNMap (slope {slope:.2f})")
        ax.loglog(xs, [ys[0] * (x / xs[0]) ** -1 for x in xs], "k:", linewidth=1, label="slope −1")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_xlabel(xl)
        ax.set_ylabel(r"$\|F^{\lambda}_{nor}(z^T)\|^2$")
        ax.grid(True, which="both", linestyle=":", alpha=0.6)
        ax.legend(frameon=False)
    return [save_figure(fig, out, "figs34.png")]


if __name__ == "__main__":
    sys.exit(main())
