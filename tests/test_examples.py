"""Smoke test of the paper-experiment scripts in --quick mode (a few rounds each; the outcomes
are checked by running them in full, see examples/RESULTS.md)."""

import json
import os

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedcanon_fig2", "fedcanon_fig1", "za1_fig1", "fednmap_figs34"])
def test_example_quick(tmp_path, name, capsys):
    import importlib

    mod = importlib.import_module(f"examples.{name}")
    plot = [] if importlib.util.find_spec("matplotlib") else ["--no-plot"]
    assert mod.main(["--quick", "--out", str(tmp_path), *plot]) == 0
    out = capsys.readouterr().out
    assert "built-in generator" in out or name == "za1_fig1"
    report = (tmp_path / "RESULTS.md").read_text()
    assert "**Outcome:**" in report and "--quick" in report
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["outcome"]
    if not plot:
        assert any(f.endswith(".png") for f in os.listdir(tmp_path))


def test_feature_selection_quick(tmp_path, capsys):
    from examples import feature_selection

    assert feature_selection.main(["--quick", "--out", str(tmp_path)]) == 0
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["lam"] for r in runs] == [0.0, 0.05]
    assert runs[0]["kept"] == 100  # no penalty: every column nonzero
    assert all(r["true_positives"] + r["false_negatives"] == 20 for r in runs)
    assert "| lam | features kept |" in capsys.readouterr().out


def test_fastfedda_lasso_quick(tmp_path, capsys):
    """Fast-FedDA's Lasso experiment in --quick mode: three runs, a report, the figure."""
    import importlib

    from examples import fastfedda_lasso

    plot = [] if importlib.util.find_spec("matplotlib") else ["--no-plot"]
    assert fastfedda_lasso.main(["--quick", "--out", str(tmp_path), *plot]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert sorted(data["results"]) == ["fastfedda", "fedda", "fedmid"] and data["outcome"]
    assert all(len(r["dist"]) == 6 for r in data["results"].values())  # every round measured in --quick
    assert "**Outcome:**" in (tmp_path / "RESULTS.md").read_text()
    assert plot or (tmp_path / "lasso.png").exists()
    assert "Fast-FedDA" in capsys.readouterr().out


def test_tcga_brca_quick(tmp_path, capsys):
    """Sparse federated Cox on Fed-TCGA-BRCA in --quick mode: C-index rows, the pooled fit, a report."""
    import importlib

    from examples import tcga_brca

    plot = [] if importlib.util.find_spec("matplotlib") else ["--no-plot"]
    assert tcga_brca.main(["--quick", "--out", str(tmp_path), *plot]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert sorted(data["results"]) == ["fedcanon", "pooled", "za1"]
    runs = [r for rs in data["results"].values() for r in rs]
    assert all(0.5 < r["cindex"] <= 1 and len(r["names"]) == r["selected"] for r in runs)
    assert "**Outcome:**" in (tmp_path / "RESULTS.md").read_text() and "C-index" in capsys.readouterr().out


def test_fednmap_fig5_quick(tmp_path, capsys):
    """FedNMap's Fig. 5 (local step rules) in --quick mode: the three rules at two Q, a report."""
    from examples import fednmap_fig5

    assert fednmap_fig5.main(["--quick", "--out", str(tmp_path), "--no-plot"]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert sorted(data["results"]) == sorted(f"{r} Q={q}" for r in ("α/Q", "α/√Q", "α") for q in (1, 2))
    assert data["outcome"] and "built-in generator" in capsys.readouterr().out


def test_fednmap_fig6_quick(tmp_path, capsys):
    """FedNMap's Fig. 6 scaled down in --quick mode: the digits' label-sorted split against
    scikit-learn's own labels, a depthwise-separable net, and each method's last Hoyer sparsity
    equal to numpy's Hoyer of the parameters in its model.pt."""
    import numpy as np
    import torch

    from examples import fednmap_fig6

    load_digits = pytest.importorskip("sklearn.datasets").load_digits

    clients = fednmap_fig6.digits_label_sorted(4)
    labels = np.concatenate([y.numpy() for _, y in clients])
    assert np.array_equal(labels, np.sort(load_digits().target)) and max(X.max() for X, _ in clients) == 1.0
    assert {len(y) for _, y in clients} <= {449, 450}
    convs = [m for m in fednmap_fig6.TinyMobileNet().modules() if isinstance(m, torch.nn.Conv2d)]
    assert sum(c.groups == c.in_channels > 1 for c in convs) == 3  # three depthwise convs
    assert fednmap_fig6.main(["--quick", "--out", str(tmp_path), "--no-plot"]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert sorted(data["results"]) == ["fedcanon", "fednmap", "za1"] and data["outcome"]
    for name, (run,) in data["results"].items():
        assert run["rounds"] == [0, 1, 2] and run["f"][-1] < run["f"][0]
        sd = torch.load(tmp_path / f"{name}-seed=0" / "model.pt", weights_only=True)["state_dict"]
        x = np.concatenate([v.numpy().ravel() for v in sd.values()]).astype(np.float64)
        d = x.size
        hoyer = (np.sqrt(d) - np.abs(x).sum() / np.sqrt((x * x).sum())) / (np.sqrt(d) - 1)
        assert abs(run["hoyer"][-1] - hoyer) < 1e-5
    assert "scikit-learn's digits" in capsys.readouterr().out


def test_depositum_fig3_quick(tmp_path, capsys):
    """DEPOSITUM Fig. 3 in --quick mode: same-product (α, γ) pairs give the same curve (with zero
    trackers y and m scale with γ, so x moves by αγ·(...), up to the prox step α), and the
    consensus error of x falls at every gossip iteration (‖(W − J)v‖ ≤ ‖v − v̄‖ for a symmetric
    doubly-stochastic W), counted here from the run folders, not from the script's numbers."""
    import importlib

    from examples import depositum_fig3
    from python_algos.runfolder.files import read_metrics

    plot = [] if importlib.util.find_spec("matplotlib") else ["--no-plot"]
    assert depositum_fig3.main(["--quick", "--out", str(tmp_path), *plot]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    runs = {(r["alpha"], r["gamma"]): r for r in data["runs"]}
    assert sorted(runs) == [(0.1, 1.0), (0.2, 0.5), (0.2, 1.0)]
    assert abs(runs[(0.1, 1.0)]["level"] - runs[(0.2, 0.5)]["level"]) < 1e-3
    assert runs[(0.2, 1.0)]["level"] < runs[(0.1, 1.0)]["level"] - 1e-2  # a larger αγ trains faster
    for (a, g), r in runs.items():
        rows = {m["round"]: m["consensus_x"] for m in read_metrics(str(tmp_path / f"alpha={a:g}-gamma={g:g}"))
                if m.get("consensus_x") is not None}
        gossips = [k for k in rows if k > 1 and k % 5 == 0]
        assert len(gossips) >= 7 and all(rows[k] < rows[k - 1] for k in gossips)
        assert r["saw_x"][0] == 1.0
    assert "**Outcome:**" in (tmp_path / "RESULTS.md").read_text() and data["outcome"]
    assert plot or (tmp_path / "fig3_sawtooth.png").exists()
    assert "αγ" in capsys.readouterr().out


def test_depositum_figs4to7_quick(tmp_path, capsys):
    """DEPOSITUM Figs. 4–7 on digits in --quick mode: one outcome per figure; β = 0 makes SHB and
    SNAG the same update (dir = y), and the complete graph (W = J) leaves no consensus error."""
    import importlib

    from examples import depositum_figs4to7

    plot = [] if importlib.util.find_spec("matplotlib") else ["--no-plot"]
    assert depositum_figs4to7.main(["--quick", "--out", str(tmp_path), *plot]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data["outcomes"]) == 4 and all(data["outcomes"])
    f4 = data["fig4"]
    assert f4["alpha=0.5-shb-beta=0"] == f4["alpha=0.5-snag-beta=0"]
    assert f4["alpha=0.5-shb-beta=0.9"] != f4["alpha=0.5-snag-beta=0.9"]
    assert data["fig6"]["complete"]["consensus_x"] < 1e-10 < data["fig6"]["ring"]["consensus_x"]
    assert sorted(int(t) for t in data["fig5"]) == [1, 5, 20] and sorted(int(n) for n in data["fig7"]) == [4, 8]
    assert "**Outcome:**" in (tmp_path / "RESULTS.md").read_text()
    assert plot or (tmp_path / "figs4to7.png").exists()
    assert "instead of MNIST" in capsys.readouterr().out or "standing in" in (tmp_path / "RESULTS.md").read_text()


def test_depositum_table_quick(tmp_path, capsys):
    """DEPOSITUM's comparison table in --quick mode: the four methods, and equal work: DEPOSITUM
    runs R·K iterations (a gossip every K) where the server methods run R rounds of K steps."""
    from examples import depositum_table
    from python_algos.runfolder.files import read_metrics

    assert depositum_table.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert sorted(data["results"]) == [f"digits/iid/{m}" for m in ("depositum", "fedadmm", "feddr", "fedmid")]
    assert all(0.1 < v["acc"] <= 1 for v in data["results"].values()) and data["outcome"]
    last = {m: max(r["round"] for r in read_metrics(str(tmp_path / f"digits-iid-{m}-seed=0")))
            for m in ("depositum", "fedmid")}
    assert last == {"depositum": 4 * depositum_table.K, "fedmid": 4}
    assert "**Outcome:**" in (tmp_path / "RESULTS.md").read_text() and "depositum" in capsys.readouterr().out


def test_depositum_speedup_verdict():
    """Fig. 7's verdict reads every doubling of N: a slope fitted over all N can hide a plateau."""
    from examples.depositum_figs4to7 import _speedup

    tails = lambda *v: {n: {"grad_map_sq": x} for n, x in zip((4, 8, 16, 32), v)}  # noqa: E731
    assert _speedup(tails(1.0, 0.5, 0.25, 0.125)) == "the speedup holds over N = 4..32."
    assert _speedup(tails(1.0, 0.09, 0.024, 0.023)).startswith("the speedup holds up to N = 16, then stops (×1.04")
    assert _speedup(tails(1.0, 0.9, 0.1, 0.01)) == "no speedup here."
