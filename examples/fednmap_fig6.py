"""FedNMap Fig. 6, scaled down: a small MobileNet-style convnet with an L1 penalty; training loss
and Hoyer sparsity against rounds for FedNMap, ZA1 ("Zhang") and FedCanon.

    python -m examples.fednmap_fig6 [--quick]

Paper setting (FedNMap §5.2, numbers stripped): MobileNetV3-Small, an L1 regularizer, label-sorted
split, full participation, the same rounds and initial model for every method, averaged over
trials; its claim: FedNMap reaches higher sparsity and lower training loss than Zhang (ZA1) and
FedCanon. Here, scaled to 2 CPU cores and no downloads: scikit-learn's digits (1,797 8x8 images,
10 classes, pixels 0..16 scaled to [0, 1]) stand in for the paper's images, all of them training
data (the figure is of the training loss); a MobileNet-style convnet of depthwise-separable blocks
(a 3x3 stem, then three blocks of a depthwise 3x3 conv and a pointwise 1x1 conv, the last two with
stride 2, GroupNorm and hard-swish, global average pooling, a linear head: 1,994 parameters;
GroupNorm rather than BatchNorm, whose running statistics are client state no method here
aggregates; without a norm layer the net stays at loss log 10); N = 10 clients of the label-sorted
split (one class each: the paper's heterogeneity at its sharpest), h = 3e-3·‖x‖₁ on every
parameter, minibatches of 32, Q = 5 local steps of η = 0.05, the same effective step α = ηQ for
every method (FedNMap: λ = α, γ_s = 1; ZA1: τ = Q, η_g = 1; FedCanon: β = η, K = Q, α = βK),
T = 200 rounds, 3 seeds (the seed sets the initial model, torch's default initialisation, and the
minibatches). Hoyer sparsity (√d − ‖x‖₁/‖x‖₂)/(√d − 1) of the reported model (§3 M6).
--quick: N = 4, width 4, 2 rounds, 1 seed.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch
from torch import nn

import fedkernels as fk
import python_algos as pa
from examples._common import parser, save_figure, sklearn_missing, table, write_report

METHODS = {"fednmap": "FedNMap", "za1": "ZA1", "fedcanon": "FedCanon"}
FULL = dict(N=10, Q=5, eta=0.05, mu=3e-3, batch=32, rounds=200, every=10, seeds=(0, 1, 2), width=8)
QUICK = dict(FULL, N=4, rounds=2, every=1, seeds=(0,), width=4)


class TinyMobileNet(nn.Sequential):
    """A MobileNet in miniature for 1x8x8 images: a 3x3 stem, three depthwise-separable blocks
    (depthwise 3x3, pointwise 1x1; the last two halve the resolution), global average pooling and a
    linear head; GroupNorm and hard-swish (MobileNetV3's activation) after every conv."""

    def __init__(self, width: int = 8, num_classes: int = 10):
        def norm_act(c):
            return [nn.GroupNorm(min(4, c), c), nn.Hardswish()]

        def separable(cin, cout, stride):
            return [nn.Conv2d(cin, cin, 3, stride, 1, groups=cin), *norm_act(cin),
                    nn.Conv2d(cin, cout, 1), *norm_act(cout)]

        w = width
        super().__init__(nn.Conv2d(1, w, 3, 1, 1), *norm_act(w), *separable(w, 2 * w, 1),
                         *separable(2 * w, 2 * w, 2), *separable(2 * w, 4 * w, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, num_classes))


def digits_label_sorted(num_clients: int):
    """scikit-learn's digits, pixels scaled to [0, 1], sorted by label (stable) and cut into
    ``num_clients`` contiguous chunks (the FedNMap paper's split)."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)  # 0..16 -> [0, 1]
    y = torch.tensor(y)
    order = torch.argsort(y, stable=True)
    return [(X[c], y[c]) for c in torch.tensor_split(order, num_clients)]


def algorithm(name: str, s: dict):
    eta, Q = s["eta"], s["Q"]
    alpha = eta * Q  # the effective step, one for every method
    if name == "fednmap":
        return pa.FedNMap(lam=alpha, eta=eta, local_steps=Q)
    if name == "za1":
        return pa.ZA1(eta=eta, local_steps=Q, eta_g=1.0)
    return pa.FedCanon(alpha=alpha, beta=eta, local_steps=Q)


def run_method(name: str, seed: int, clients, s: dict, out: str) -> dict:
    torch.manual_seed(seed)  # the seed's initial model, the same for every method
    model = TinyMobileNet(s["width"])
    t0 = time.perf_counter()
    hist = pa.simulate(algorithm(name, s), model, nn.functional.cross_entropy, clients, s["rounds"],
                       fk.L1(s["mu"]), batch_size=s["batch"], seed=seed, metrics_every=s["every"])
    hist.save(os.path.join(out, f"{name}-seed={seed}"), overwrite=True, label=METHODS[name], model=model)
    rows = [hist.initial] + [r for r in hist.metrics if r.get("f") is not None]
    return {"rounds": [r.get("round", 0) for r in rows], "f": [r["f"] for r in rows],
            "hoyer": [r["hoyer"] for r in rows], "sparsity": rows[-1]["sparsity"],
            "seconds": time.perf_counter() - t0}


def mean_std(values) -> str:
    return f"{np.mean(values):.4g} ± {np.std(values, ddof=1) if len(values) > 1 else 0.0:.2g}"


def summarise(results: dict, s: dict):
    """The table (loss, Hoyer and zeros at the end, mean ± std over the seeds) and the one-line outcome.
    "At the end": the mean over the last 10 % of the metric rounds (minibatch noise moves single rows)."""
    def tail(values):
        return float(np.mean(values[-max(1, (len(values) - 1) // 10):]))

    final = {n: {k: [tail(r[k]) for r in runs] for k in ("f", "hoyer")} for n, runs in results.items()}
    zeros = {n: [r["sparsity"] for r in runs] for n, runs in results.items()}
    tab = table(["method", "training loss f", "Hoyer sparsity", "exact zeros (last round)"],
                [[METHODS[n], mean_std(final[n]["f"]), mean_std(final[n]["hoyer"]), mean_std(zeros[n])]
                 for n in results])
    f_mean = {n: float(np.mean(v["f"])) for n, v in final.items()}
    h_mean = {n: float(np.mean(v["hoyer"])) for n, v in final.items()}
    lower = all(f_mean["fednmap"] < f_mean[n] for n in results if n != "fednmap")
    higher = all(h_mean["fednmap"] > h_mean[n] for n in results if n != "fednmap")
    verdict = ("FedNMap ends with both the lowest loss and the highest sparsity: the paper's claim holds here."
               if lower and higher else
               f"FedNMap ends {'with' if lower else 'without'} the lowest loss and {'with' if higher else 'without'} "
               "the highest sparsity: the paper's claim " + ("holds in part." if lower or higher else
                                                             "does NOT hold here."))
    outcome = (f"over the last 10 % of T = {s['rounds']} rounds (mean over {len(s['seeds'])} seed(s)) training loss "
               + ", ".join(f"{METHODS[n]} {f_mean[n]:.3g}" for n in results) + "; Hoyer sparsity "
               + ", ".join(f"{METHODS[n]} {h_mean[n]:.3f}" for n in results) + ". " + verdict)
    return tab, outcome, {"final": final, "zeros": zeros, "loss_lowest": lower, "hoyer_highest": higher}


def plot(results: dict, out: str, num_clients: int) -> str:
    from python_algos.experiments.plotting import pyplot

    plt = pyplot()
    fig, (ax_f, ax_h) = plt.subplots(1, 2, figsize=(9, 3.6))
    for name, runs in results.items():
        x = runs[0]["rounds"]
        for ax, key in ((ax_f, "f"), (ax_h, "hoyer")):
            ys = np.array([r[key] for r in runs])
            line, = ax.plot(x, ys.mean(0), label=METHODS[name])
            ax.fill_between(x, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)  # the seeds' range
    ax_f.set_yscale("log")
    ax_f.set_ylabel("training loss f (cross-entropy)")
    ax_h.set_ylabel("Hoyer sparsity of x")
    for ax in (ax_f, ax_h):
        ax.set_xlabel("round")
        ax.legend()
    fig.suptitle(f"Tiny MobileNet on digits, L1, label-sorted over {num_clients} clients (mean, seeds' range)")
    return save_figure(fig, out, "fig6.png")


def main(argv=None) -> int:
    args = parser("fednmap_fig6", __doc__).parse_args(argv)
    if sklearn_missing():
        return 1
    torch.set_num_threads(1)  # a 2k-parameter net: threads only add overhead
    s = QUICK if args.quick else FULL
    clients = digits_label_sorted(s["N"])
    note = (f"data: scikit-learn's digits standing in for the paper's images (1,797 8x8 images scaled to [0, 1], "
            f"label-sorted over N = {s['N']} clients); TinyMobileNet(width {s['width']}), h = {s['mu']:g}·‖x‖₁, "
            f"Q = {s['Q']}, η = {s['eta']}, α = ηQ, B = {s['batch']}, T = {s['rounds']}, seeds {list(s['seeds'])}")
    print(note)
    os.makedirs(args.out, exist_ok=True)
    results = {n: [] for n in METHODS}
    for seed in s["seeds"]:
        for name in METHODS:
            r = run_method(name, seed, clients, s, args.out)
            results[name].append(r)
            print(f"  {METHODS[name]:9s} seed {seed}  f = {r['f'][-1]:.4g}  Hoyer = {r['hoyer'][-1]:.4f}  "
                  f"zeros = {r['sparsity']:.3f}  [{r['seconds']:.1f}s]")
    tab, outcome, finals = summarise(results, s)
    print(tab)
    print(outcome)
    plots = [] if args.no_plot else [plot(results, args.out, s["N"])]
    cmd = "python -m examples.fednmap_fig6" + (" --quick" if args.quick else "")
    body = f"{tab}\n\n**Outcome:** {outcome}\n\nFigure: {', '.join(os.path.basename(p) for p in plots)}"
    write_report(args.out, "FedNMap Fig. 6, scaled down (tiny MobileNet on digits, L1)", cmd, note, body,
                 {"results": results, "outcome": outcome, "settings": {k: v for k, v in s.items()}, **finals})
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
