"""DEPOSITUM Figs. 4–7 analogue on scikit-learn's digits (standing in for MNIST): momentum OPTION I
(SHB) vs II (SNAG) against β (Fig. 4), the communication period τ at a fixed iteration count
(Fig. 5), the graph: complete / ring / star (Fig. 6), and linear speedup in the number of clients
N (Fig. 7).

    python -m examples.depositum_figs4to7 [--quick]

Paper setting (DEPOSITUM §6, Figs. 4–7): MNIST, a small neural network, MCP, minibatch gradients.
Here: scikit-learn's bundled digits (1797 8x8 images, 10 classes, standardized on the training
split, 20 % test; nothing downloaded) **instead of MNIST**, an MLP with one hidden layer of 32
units (2410 parameters), h = MCP(λ = 1e-4, γ = 3), α = 0.2, γ = 1, minibatch B = 8, T = 300
iterations (--quick: 12), metrics every 10 iterations, ‖G_s(x̄)‖² at s = 0.1. The tail of a
curve is its mean over the last 20 % of the metric rounds, averaged over the seeds (2; --quick 1).
Fig. 4: 20 clients i.i.d. on a ring, τ = 1, β ∈ {0, 0.5, 0.9, 0.99} for SHB and SNAG, at α = 0.1
and at α = 0.5 (--quick: 0.5 only; the curves drawn are α = 0.5's).
Fig. 5: 10 clients, Dirichlet label skew (η = 0.3), ring, β = 0.9, τ ∈ {1, 2, 5, 10, 20}.
Fig. 6: 10 clients, Dirichlet (η = 0.3), β = 0.9, τ = 1 on the complete graph, the ring and the star.
Fig. 7: ring, i.i.d., β = 0.9, τ = 1, B = 1 (so that gradient noise, which N averages out,
dominates), N ∈ {4, 8, 16, 32}: the log-log slope of the stationarity tail against N (−1 would be a
linear speedup). Needs scikit-learn.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from examples._common import Runner, loglog_slope, parser, sklearn_missing, table, tail_mean, write_report
from python_algos.experiments.config import Config
from python_algos.runfolder.files import read_metrics

BETAS = (0.0, 0.5, 0.9, 0.99)
FIG4_ALPHAS = (0.1, 0.5)  # momentum's effect depends on the step: both are shown
TAUS = (1, 2, 5, 10, 20)
GRAPHS = ("complete", "ring", "star")
NS = (4, 8, 16, 32)
KEYS = ("f+h", "grad_map_sq", "test_acc", "consensus_x")


def main(argv=None) -> int:
    args = parser("depositum_figs4to7", __doc__).parse_args(argv)
    if sklearn_missing():
        return 1
    q = args.quick
    note = ("dataset: scikit-learn's bundled digits (sklearn.datasets.load_digits; nothing downloaded), standing in "
            "for the paper's MNIST")
    print(note)
    base = Config(algorithm="depositum", dataset="sklearn:digits", partition="iid", num_clients=10, model="mlp",
                  model_opts={"hidden": 32}, reg="mcp", reg_strength=1e-4, reg_opts={"gamma": 3.0}, lr=0.2,
                  local_steps=1, rounds=12 if q else 300, batch_size=8, metric_step=0.1,
                  metrics_every=4 if q else 10, checkpoint_every=0, seed=0)
    seeds = (0,) if q else (0, 1)
    runner = Runner(args.out, progress=args.progress)

    def run(label, cfg, **opts):
        """Tails of KEYS over the seeds; ``opts`` are DEPOSITUM's options over the defaults."""
        alg = {"alpha": cfg.lr, "gamma": 1.0, "beta": 0.9, "period": 1, "topology": "ring", "momentum": "shb", **opts}
        tails = []
        for seed in seeds:
            s = runner.run(cfg.replace(seed=seed, local_steps=alg["period"], alg_opts=alg), f"{label}-seed={seed}")
            tails.append([tail_mean(read_metrics(s["out_dir"]), k, frac=0.2) for k in KEYS])
        return dict(zip(KEYS, np.mean(tails, axis=0).tolist()))

    betas, taus, graphs, ns = (BETAS[::2], TAUS[::2], GRAPHS, NS[:2]) if q else (BETAS, TAUS, GRAPHS, NS)
    print("Fig. 4: momentum OPTION I (shb) and II (snag) against beta; 20 clients iid, ring")
    alphas4 = FIG4_ALPHAS[1:] if q else FIG4_ALPHAS
    f4 = {(a, m, b): run(f"fig4-alpha={a:g}-{m}-beta={b:g}", base.replace(num_clients=20, lr=a), momentum=m, beta=b)
          for a in alphas4 for m in ("shb", "snag") for b in betas}
    print("Fig. 5: period tau at a fixed iteration count; 10 clients Dirichlet, ring")
    dirichlet = base.replace(partition="dirichlet", eta=0.3)
    f5 = {t: run(f"fig5-tau={t}", dirichlet, period=t) for t in taus}
    print("Fig. 6: complete / ring / star; 10 clients Dirichlet")
    f6 = {g: run(f"fig6-{g}", dirichlet, topology=g) for g in graphs}
    print("Fig. 7: linear speedup in N; ring, iid, B = 1")
    f7 = {n: run(f"fig7-N={n}", base.replace(num_clients=n, batch_size=1)) for n in ns}
    tabs, outcomes = _tables(f4, f5, f6, f7, base.rounds)
    for t, o in zip(tabs, outcomes):
        print(t)
        print(o)
    plots = [] if args.no_plot else _plot(args.out, seeds[0], alphas4[-1], betas, taus, graphs, f7)
    cmd = "python -m examples.depositum_figs4to7" + (" --quick" if q else "")
    body = "\n\n".join(f"{t}\n\n**Outcome (Fig. {i}):** {o}" for i, (t, o) in enumerate(zip(tabs, outcomes), 4))
    body = body.replace("**Outcome (Fig. 4):**", "**Outcome:** (Fig. 4)", 1)
    body += f"\n\nFigures: {', '.join(os.path.basename(p) for p in plots)}"
    write_report(args.out, "DEPOSITUM Figs. 4–7 analogue on digits (momentum, τ, graph, speedup in N)", cmd, note,
                 body, {"fig4": {f"alpha={a:g}-{m}-beta={b:g}": v for (a, m, b), v in f4.items()}, "fig5": f5,
                        "fig6": f6, "fig7": f7, "outcome": " ".join(outcomes), "outcomes": outcomes})
    print(f"results written to {args.out}")
    return 0


def _tables(f4, f5, f6, f7, rounds):
    cols = ["f+h", "‖G_s‖²", "test acc.", "consensus x"]
    row = lambda v: [v[k] for k in KEYS]  # noqa: E731
    tabs = [table(["α", "option", "β", *cols], [[a, m, b, *row(v)] for (a, m, b), v in f4.items()]),
            table(["τ", "gossips in T", *cols], [[t, rounds // t, *row(v)] for t, v in f5.items()]),
            table(["graph", *cols], [[g, *row(v)] for g, v in f6.items()]),
            table(["N", *cols], [[n, *row(v)] for n, v in f7.items()])]
    o = []
    for a in sorted({a for a, _, _ in f4}):
        best = {m: min((b for aa, mm, b in f4 if (aa, mm) == (a, m)), key=lambda b: f4[(a, m, b)]["f+h"])
                for m in ("shb", "snag")}
        helps = all(best[m] > 0 for m in best)
        o.append(f"α = {a:g}: best β = {best['shb']:g} for SHB (f+h {f4[(a, 'shb', best['shb'])]['f+h']:.4f}), "
                 f"{best['snag']:g} for SNAG ({f4[(a, 'snag', best['snag'])]['f+h']:.4f}), β = 0: "
                 f"{f4[(a, 'shb', 0.0)]['f+h']:.4f}; momentum {'helps' if helps else 'does not help'}")
    gap = max(abs(f4[(a, "snag", b)]["f+h"] / f4[(a, "shb", b)]["f+h"] - 1) for a, m, b in f4)
    outcomes = ["; ".join(o) + f". SNAG and SHB differ by at most {gap:.0%} in f+h at the same (α, β)."]
    ts = list(f5)
    mono = all(f5[b]["f+h"] >= f5[a]["f+h"] for a, b in zip(ts, ts[1:]))
    mid = max((t for t in ts if f5[t]["f+h"] <= 1.1 * f5[ts[0]]["f+h"]), default=ts[0])
    outcomes.append(f"at T = {rounds} iterations f+h goes from {f5[ts[0]]['f+h']:.4f} (τ = {ts[0]}) to "
                    f"{f5[ts[-1]]['f+h']:.4f} (τ = {ts[-1]}, {ts[-1]}x fewer gossips), "
                    + ("growing with τ" if mono else "not monotone in τ")
                    + f"; up to τ = {mid} ({mid}x fewer gossips) f+h stays within 10 % of τ = {ts[0]}'s.")
    order = sorted(f6, key=lambda g: f6[g]["f+h"])
    fh = ", ".join(f"{g} {f6[g]['f+h']:.4f}" for g in order)
    cx = ", ".join(f"{g} {f6[g]['consensus_x']:.2g}" for g in order)
    spread6 = max(v["f+h"] for v in f6.values()) / min(v["f+h"] for v in f6.values()) - 1
    outcomes.append(f"f+h after T: {fh}; consensus error of x: {cx}"
                    + (" — the complete graph is best, as in the paper." if order[0] == "complete" else
                       f" — f+h differs by {spread6:.0%} at most: the graph orders the consensus errors, "
                       "not the loss, at this size."))
    ns = list(f7)
    slope = loglog_slope(ns, [f7[n]["grad_map_sq"] for n in ns])
    tail = loglog_slope(ns[1:], [f7[n]["grad_map_sq"] for n in ns[1:]]) if len(ns) > 2 else slope
    shrink = ", ×".join(f"{f7[m]['grad_map_sq'] / f7[n]['grad_map_sq']:.2f}" for m, n in zip(ns, ns[1:]))
    outcomes.append(f"log-log slope of the ‖G_s‖² tail against N = {ns[0]}..{ns[-1]}: {slope:.2f}, against "
                    f"N = {ns[min(1, len(ns) - 2)]}..{ns[-1]}: {tail:.2f} (−1 would be a linear speedup; the tail "
                    f"shrinks ×{shrink} per doubling of N): " + _speedup(f7))
    return tabs, outcomes


def _speedup(f7: dict) -> str:
    """The verdict per doubling of N: a linear speedup halves the tail, ×1.6 or more counts."""
    ns = list(f7)
    steps = [(n, m, f7[n]["grad_map_sq"] / f7[m]["grad_map_sq"]) for n, m in zip(ns, ns[1:])]
    bad = next((i for i, (_, _, r) in enumerate(steps) if r < 1.6), None)
    if bad is None:
        return f"the speedup holds over N = {ns[0]}..{ns[-1]}."
    n, m, r = steps[bad]
    if bad == 0:
        return "no speedup here."
    return f"the speedup holds up to N = {n}, then stops (×{r:.2f} from {n} to {m})."


def _curves(ax, out, labels, names, key):
    for lab, name in zip(labels, names):
        rows = [r for r in read_metrics(os.path.join(out, lab)) if r.get(key) is not None]
        ax.semilogy([r["round"] for r in rows], [r[key] for r in rows], linewidth=1.2, label=name)
    ax.set_xlabel("iteration")
    ax.grid(True, which="both", linestyle=":", alpha=0.5)
    ax.legend(fontsize=7, frameon=False)


def _plot(out, seed, alpha4, betas, taus, graphs, f7):
    from python_algos.experiments.plotting import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 5, figsize=(22, 3.8))
    for ax, m in zip(axes[:2], ("shb", "snag")):
        _curves(ax, out, [f"fig4-alpha={alpha4:g}-{m}-beta={b:g}-seed={seed}" for b in betas],
                [f"β = {b:g}" for b in betas], "f+h")
        ax.set_title(f"Fig. 4: {m.upper()} (OPTION {'I' if m == 'shb' else 'II'}), α = {alpha4:g}, f+h", fontsize=10)
    _curves(axes[2], out, [f"fig5-tau={t}-seed={seed}" for t in taus], [f"τ = {t}" for t in taus], "f+h")
    axes[2].set_title("Fig. 5: period τ, f+h", fontsize=10)
    _curves(axes[3], out, [f"fig6-{g}-seed={seed}" for g in graphs], list(graphs), "consensus_x")
    axes[3].set_title("Fig. 6: graphs, consensus error of x", fontsize=10)
    ns, ys = list(f7), [v["grad_map_sq"] for v in f7.values()]
    axes[4].loglog(ns, ys, "o-", label="DEPOSITUM")
    axes[4].loglog(ns, [ys[0] * ns[0] / n for n in ns], "k:", label="slope −1")
    axes[4].set_xticks(ns, [str(n) for n in ns])
    axes[4].xaxis.set_minor_locator(plt.NullLocator())
    axes[4].set_xlabel("number of clients N")
    axes[4].set_title(r"Fig. 7: $\|G_s(\bar x)\|^2$ tail against N", fontsize=10)
    axes[4].legend(fontsize=7, frameon=False)
    axes[4].grid(True, which="both", linestyle=":", alpha=0.5)
    fig.suptitle("DEPOSITUM on digits (for MNIST), MLP, MCP", fontsize=11)
    fig.tight_layout()
    path = os.path.join(out, "figs4to7.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


if __name__ == "__main__":
    sys.exit(main())
