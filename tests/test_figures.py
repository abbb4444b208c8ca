"""Figures for papers: every format, the setup line, test vs training named on the axes, the
suboptimality f + h − F*, distinguishable overlapping curves, readable log ticks, the figure of the
main job, and errors that name --metrics / --formats / --f-star before anything is written.

Ground truth: the run folders' own metrics.jsonl and config (read independently), and the files'
format signatures."""

import json
import os

import pytest
import torch
from test_run_folders import quiet, tiny

import fedkernels as fk
from python_algos import FedCanon, simulate
from python_algos.experiments.cli import main
from python_algos.experiments.run import run_experiment
from python_algos.runfolder.files import read_metrics

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
pytest.importorskip("matplotlib")
from python_algos.experiments import plotting  # noqa: E402

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF-", "svg": b"<?xml"}


def _api_run(path, rounds=4, seed=0, f_star=None, label=None):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(4, 2).double()
    clients = [(torch.randn(10, 4, generator=g, dtype=torch.float64), torch.randint(2, (10,), generator=g))
               for _ in range(3)]
    h = simulate(FedCanon(alpha=0.3, beta=0.05, local_steps=2), model, torch.nn.functional.cross_entropy, clients,
                 rounds, regularizer=fk.L1(1e-2))
    return h.save(str(path), f_star=f_star, label=label)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("figs") / "run")
    run_experiment(tiny(rounds=3, partition="dirichlet", eta=0.5), out, progress=False, log=quiet)
    return out


def test_every_format_with_the_setup_line_in_the_svg_text(cli_run, tmp_path):
    files = plotting.plot_runs([cli_run], out_dir=str(tmp_path), metrics=["f+h"], x_axes=["round"],
                               formats="png,pdf,svg", title="Figure 3")
    names = sorted(os.path.basename(f) for f in files)
    assert names == sorted(f"{b}.{e}" for b in ("f_plus_h_vs_round", "overview") for e in ("png", "pdf", "svg"))
    for f in files:
        with open(f, "rb") as fh:
            assert fh.read(len(MAGIC[f[-3:]])) == MAGIC[f[-3:]], f
    cfg = json.load(open(os.path.join(cli_run, "config.json")))
    for f in (tmp_path / "f_plus_h_vs_round.svg", tmp_path / "overview.svg"):
        svg = f.read_text()
        assert "Figure 3" in svg and "training objective f + h" in svg
        for item in ("FedCanon", cfg["dataset"], "Dir(0.5)", f"N={cfg['num_clients']}", cfg["model"],
                     "h=L1(kappa=0.01)", f"K={cfg['local_steps']}", f"lr={cfg['lr']:g}"):
            assert item in svg, item


def test_setup_line_shows_shared_values_once_and_differences_joined(tmp_path):
    a = str(tmp_path / "a")
    b = str(tmp_path / "b")
    run_experiment(tiny(rounds=1), a, progress=False, log=quiet)
    run_experiment(tiny(rounds=1, algorithm="fedavg", lr=0.2), b, progress=False, log=quiet)
    line = plotting.setup_line([plotting.load_run(a), plotting.load_run(b)])
    assert line.startswith("FedCanon, FedAvg · sparse_logistic · iid · N=4 · linear") and "lr=0.1/0.2" in line
    assert line.count("K=2") == 1


def test_axis_labels_say_test_or_training(tmp_path):
    import matplotlib.pyplot as plt

    with_test = str(tmp_path / "t")
    no_test = str(tmp_path / "n")
    run_experiment(tiny(rounds=1), with_test, progress=False, log=quiet)
    run_experiment(tiny(rounds=1, test_fraction=0.0), no_test, progress=False, log=quiet)
    assert "test_acc" in read_metrics(with_test)[-1] and "train_acc" in read_metrics(no_test)[-1]
    labels = {}
    for metric in ("accuracy", "f+h", "stationarity"):
        for name, path in (("test", with_test), ("none", no_test)):
            fig, ax = plt.subplots()
            assert plotting.line_plot(ax, [plotting.load_run(path)], metric)
            labels[metric, name] = ax.get_ylabel()
            plt.close(fig)
    assert labels["accuracy", "test"] == "test accuracy" and labels["accuracy", "none"] == "training accuracy"
    assert "training" in labels["f+h", "test"] and "training" in labels["stationarity", "test"]
    fig, ax = plt.subplots()  # runs that measured different things: the legend says which
    plotting.line_plot(ax, [plotting.load_run(with_test), plotting.load_run(no_test)], "accuracy")
    assert [ln.get_label().rsplit(" ", 1)[-1] for ln in ax.lines] == ["(test)", "(training)"]
    plt.close(fig)


def test_suboptimality_is_f_plus_h_minus_f_star_on_a_log_axis(tmp_path):
    import matplotlib.pyplot as plt

    run = str(tmp_path / "api")
    _api_run(run, f_star=0.3)
    want = [(r["round"], r["f+h"] - 0.3) for r in read_metrics(run) if r["f+h"] - 0.3 > 0]
    fig, ax = plt.subplots()
    assert plotting.line_plot(ax, [plotting.load_run(run)], "suboptimality")  # F* from summary.json
    assert list(zip(ax.lines[0].get_xdata(), ax.lines[0].get_ydata())) == want
    assert ax.get_yscale() == "log" and "F*" in ax.get_ylabel()
    plt.close(fig)
    files = plotting.plot_runs([run], out_dir=str(tmp_path / "f"), x_axes=["round"], formats="png")
    assert os.path.join(str(tmp_path / "f"), "suboptimality_vs_round.png") in files  # the default replaces f+h
    # without F*: not available, and the error says how to give it
    other = str(tmp_path / "noF")
    _api_run(other)
    with pytest.raises(ValueError, match="--metrics suboptimality.*--f-star"):
        plotting.plot_runs([other], metrics=["suboptimality"], formats="png")
    files = plotting.plot_runs([other], out_dir=str(tmp_path / "g"), metrics=["suboptimality"], f_star=0.1,
                               x_axes=["round"], formats="png", per_metric=False)
    assert files == [os.path.join(str(tmp_path / "g"), "overview.png")]


def test_overlapping_runs_get_distinct_styles_and_sparse_staggered_markers(tmp_path):
    import matplotlib.pyplot as plt

    runs = []
    for i in range(5):
        _api_run(tmp_path / f"r{i}", rounds=24, seed=0, label=f"run {i}")  # identical curves
        runs.append(plotting.load_run(str(tmp_path / f"r{i}")))
    fig, ax = plt.subplots()
    plotting.line_plot(ax, runs, "f+h")
    lines = ax.lines
    styles = [(ln.get_linestyle(), ln.get_marker(), ln.get_color()) for ln in lines]
    assert len(set(styles)) == 5 and len({s[1] for s in styles}) == 5 and len({s[2] for s in styles}) == 5
    starts = [ln.get_markevery()[0] for ln in lines]
    steps = {ln.get_markevery()[1] for ln in lines}
    assert steps == {3} and len(set(starts)) > 1  # 25 points: a marker every 3rd, not at the same points
    assert [ln.get_label() for ln in lines] == [f"run {i}" for i in range(5)]
    plt.close(fig)


@pytest.mark.parametrize("lo, hi", [(1e-9, 1.0), (0.35, 0.9)])
def test_log_axis_has_at_least_two_labelled_ticks(lo, hi):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    run = {"label": "x", "rows": [{"round": t, "f+h": lo * (hi / lo) ** (t / 9)} for t in range(10)], "f_star": None}
    plotting.line_plot(ax, [run], "f+h")
    fig.canvas.draw()
    ymin, ymax = ax.get_ylim()
    shown = [t.get_text() for t in ax.get_yticklabels(minor=False) + ax.get_yticklabels(minor=True)
             if t.get_text() and ymin <= t.get_position()[1] <= ymax]
    assert ax.get_yscale() == "log" and len(shown) >= 2, shown
    plt.close(fig)


def test_bad_flags_are_named_and_nothing_is_written(cli_run, tmp_path, capsys):
    figs = tmp_path / "figs"
    with pytest.raises(SystemExit) as e:
        main(["plot", cli_run, "--formats", "png,gif", "--out", str(figs)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--formats" in err and "gif" in err and "png, pdf, svg" in err
    assert main(["plot", cli_run, "--metrics", "f+h", "nonsense", "--out", str(figs)]) == 1
    err = capsys.readouterr().err
    assert "--metrics nonsense" in err and "f+h" in err
    assert main(["plot", cli_run, "--f-star", "nan", "--out", str(figs)]) == 1
    assert "--f-star" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--formats bmp: unknown format bmp"):
        plotting.plot_runs([cli_run], out_dir=str(figs), formats=["bmp"])
    with pytest.raises(SystemExit):
        main(["run", "--formats", "jpg", "--out", str(tmp_path / "r")])
    assert "--formats" in capsys.readouterr().err
    assert not figs.exists() and not (tmp_path / "r").exists()


def test_run_writes_its_figure_and_prints_the_path(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt", "nnz=3", "-N", "4", "-K", "2",
                 "-T", "2", "--no-progress", "--out", str(out), "--formats", "svg,png"]) == 0
    stdout = capsys.readouterr().out
    for ext in ("svg", "png"):
        assert f"figure: {out / ('overview.' + ext)}" in stdout
    assert "FedCanon" in (out / "overview.svg").read_text() and not (out / "overview.pdf").exists()
    assert main(["run", "--resume", str(out), "--rounds", "3", "--no-plot", "--no-progress"]) == 0
    assert "figure:" not in capsys.readouterr().out


def test_compare_writes_its_figure_with_both_algorithms(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "-a", "fedavg", "fedcanon", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt",
                 "nnz=3", "-N", "4", "-K", "2", "-T", "2", "--reg", "zero", "--no-progress", "--out", str(out),
                 "--formats", "svg"]) == 0
    assert f"figure: {out / 'overview.svg'}" in capsys.readouterr().out
    svg = (out / "overview.svg").read_text()
    # setup line and legend, both in the algorithms' own spelling (not the registry names fedavg, fedcanon)
    assert "FedAvg, FedCanon" in svg and svg.count("FedAvg") >= 2 and svg.count("FedCanon") >= 2
    assert "fedavg" not in svg and "fedcanon" not in svg


# --------------------------------------------------------------------------- #
# Issue 19 item 5: figures a paper can use (checked on the Axes, not on pixels)
# --------------------------------------------------------------------------- #


def _fake_run(label, rows, algorithm=None, reg=None, path=None):
    return {"label": label, "rows": rows, "path": path or f"/nowhere/{label}", "config": {},
            "summary": {"algorithm": algorithm or label, "regularizer": reg}, "f_star": None}


def _labelled_ticks(ax):
    ax.figure.canvas.draw()
    lo, hi = ax.get_ylim()
    return [t.get_position()[1] for t in ax.yaxis.get_majorticklabels()
            if t.get_text() and lo - 1e-12 <= t.get_position()[1] <= hi + 1e-12]


@pytest.mark.parametrize("ys", [[0.7, 0.5, 0.4, 0.33], [0.9, 0.6, 0.45], [5.0, 0.33, 0.02], [0.31, 0.30]])
def test_labelled_y_ticks_cover_the_data(ys):
    """The f+h panel's lowest label was 0.4 while the curves ended at 0.33: the reader could not read
    the final value off the axis. Now a labelled tick sits at or below the lowest value and at or
    above the highest."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    assert plotting.line_plot(ax, [_fake_run("A", [{"round": t, "f+h": y} for t, y in enumerate(ys)])], "f+h")
    ticks = _labelled_ticks(ax)
    assert min(ticks) <= min(ys) * (1 + 1e-9) and max(ticks) >= max(ys) * (1 - 1e-9), (ticks, ys)
    plt.close(fig)


def test_an_all_dense_sparsity_axis_is_zero_to_one():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    assert plotting.line_plot(ax, [_fake_run("A", [{"round": t, "sparsity": 0.0} for t in range(4)])], "sparsity")
    assert ax.get_ylim() == (0.0, 1.0)
    ax2 = fig.add_subplot(2, 1, 2)
    plotting.line_plot(ax2, [_fake_run("A", [{"round": t, "sparsity": s} for t, s in enumerate((0.2, 0.5, 0.7))])],
                       "sparsity")
    lo, hi = ax2.get_ylim()
    assert 0.0 <= lo <= 0.2 and 0.7 <= hi <= 1.0
    plt.close(fig)


def test_coinciding_curves_are_named_together_in_the_legend(tmp_path):
    """ZA1 and FedNMap give the same iterates here (h = 0, the same step): one curve hid the other."""
    import matplotlib.pyplot as plt

    rows = [{"round": t, "f+h": 1.0 / (t + 1), "sparsity": 0.1} for t in range(5)]
    other = [{"round": t, "f+h": 2.0 / (t + 1), "sparsity": 0.1} for t in range(5)]
    runs = plotting.merge_identical([_fake_run("ZA1", rows), _fake_run("FedNMap", [dict(r) for r in rows]),
                                     _fake_run("FedAvg", other)], ["f+h", "sparsity"])
    fig, ax = plt.subplots()
    plotting.line_plot(ax, runs, "f+h")
    assert ax.get_legend_handles_labels()[1] == ["ZA1 = FedNMap", "FedAvg"]
    assert "ZA1, FedNMap, FedAvg" in plotting.setup_line(runs)
    plt.close(fig)


def test_legend_and_setup_line_spell_the_algorithm_alike(tmp_path):
    out = str(tmp_path / "cmp")
    assert main(["compare", "-a", "za1", "fedcanon", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt",
                 "nnz=3", "-N", "4", "-K", "2", "-T", "2", "--no-progress", "--no-plot", "--out", out]) == 0
    runs = [plotting.load_run(p) for p in plotting.find_runs([out])]
    assert [r["label"] for r in runs] == ["ZA1", "FedCanon"]
    assert plotting.setup_line(runs).startswith("ZA1, FedCanon ·")


def test_a_per_parameter_regularizer_is_short_in_the_setup_line():
    reg = fk.PerParameter(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)),
                          {"0.weight": fk.L1(0.01), "*.bias": None, "*": fk.L1(1e-4)})
    line = plotting.setup_line([_fake_run("A", [], reg=repr(reg))])
    assert "h=per-parameter(0.weight: L1(0.01), *.bias: none, *: L1(0.0001))" in line
    long = "PerParameter({" + ", ".join(f"'layer{i}.weight': L1(kappa=0.01)" for i in range(12)) + ", '*': None})"
    line = plotting.setup_line([_fake_run("A", [], reg=long)])
    assert "h=per-parameter(L1, none; 13 rules)" in line and len(line) < 80


def test_a_band_of_a_fraction_stays_within_zero_and_one():
    """mean − std of a sparsity that is 0 in most seeds is negative; a fraction's band is cut at 0 and 1."""
    from python_algos.experiments.plotting.curves import band_series

    rows = [{"round": t, "sparsity": 0.001} for t in range(3)]
    run = {"rows": rows, "band_rows": ([{"round": t, "sparsity": -0.002} for t in range(3)],
                                       [{"round": t, "sparsity": 1.5} for t in range(3)],
                                       [{"round": t, "sparsity": 0.0} for t in range(3)])}
    xs, lo, hi = band_series(run, "sparsity", "round")
    assert xs == [0, 1, 2] and min(lo) == 0.0 and max(hi) == 1.0


def _alg_hparams(path):
    """The hyper-parameters the run's algorithm was built with (its summary.json, written from the
    algorithm object itself): the ground truth the setup line must agree with."""
    with open(os.path.join(path, "summary.json")) as f:
        return json.load(f)["hparams"]


def test_setup_line_of_a_sweep_names_the_hyper_parameters_it_set_not_the_unused_lr(tmp_path):
    """`sweep --grid alpha=... --grid beta=...` stores the point as alg_opts beside the default lr;
    the line said lr=0.1 although no hyper-parameter came from it."""
    from python_algos.experiments.sweep import run_sweep

    out = str(tmp_path / "sweep")
    run_sweep(tiny(rounds=1), ["fedcanon"], {"alpha": [0.01, 0.05], "beta": [0.02]}, [0], out_dir=out, log=quiet)
    runs = plotting.group_seeds([plotting.load_run(p) for p in plotting.find_runs(
        [os.path.join(out, "fedcanon", "alpha=0.01,beta=0.02"),
         os.path.join(out, "fedcanon", "alpha=0.05,beta=0.02")])])
    used = [_alg_hparams(m["path"]) for r in runs for m in r["members"]]
    assert [(h["alpha"], h["beta"], h["local_steps"]) for h in used] == [(0.01, 0.02, 2), (0.05, 0.02, 2)]
    line = plotting.setup_line(runs)
    assert "lr=" not in line, line
    assert "K=2 · alpha=0.01/0.05 · beta=0.02" in line, line


def test_setup_line_shows_lr_while_it_still_sets_a_hyper_parameter(tmp_path):
    path = str(tmp_path / "alpha")
    run_experiment(tiny(rounds=1, alg_opts={"alpha": 0.3}), path, progress=False, log=quiet)
    used = _alg_hparams(path)
    assert used["alpha"] == 0.3 and used["beta"] == 0.1  # beta = lr: lr set it
    line = plotting.setup_line([plotting.load_run(path)])
    assert line.endswith("K=2 · lr=0.1 · alpha=0.3"), line


def test_setup_line_of_a_plain_lr_run_is_unchanged(tmp_path):
    path = str(tmp_path / "plain")
    run_experiment(tiny(rounds=1), path, progress=False, log=quiet)
    assert _alg_hparams(path) == {"alpha": 0.2, "beta": 0.1, "local_steps": 2}  # FedCanon: alpha = lr·K, beta = lr
    assert plotting.setup_line([plotting.load_run(path)]) == (
        "FedCanon · sparse_logistic · iid · N=4 · linear · h=L1(kappa=0.01) · K=2 · lr=0.1")


def test_setup_line_of_a_saved_history_names_its_hyper_parameters(tmp_path):
    """History.save records the algorithm's own hyper-parameters (no lr): the line shows them."""
    path = str(tmp_path / "api")
    _api_run(path)  # FedCanon(alpha=0.3, beta=0.05, local_steps=2)
    line = plotting.setup_line([plotting.load_run(path)])
    assert "lr=" not in line and line.endswith("K=2 · alpha=0.3 · beta=0.05"), line


def test_setup_line_joins_lr_and_overrides_of_different_runs(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run_experiment(tiny(rounds=1), a, progress=False, log=quiet)
    run_experiment(tiny(rounds=1, algorithm="fedavg", alg_opts={"lr_local": 0.3}), b, progress=False, log=quiet)
    assert _alg_hparams(b) == {"lr_local": 0.3, "local_steps": 2, "lr_global": 1.0}
    line = plotting.setup_line([plotting.load_run(a), plotting.load_run(b)])
    # FedAvg's one lr-set hyper-parameter is explicit: lr=0.1 is FedCanon's alone, lr_local FedAvg's
    assert line.endswith("K=2 · lr=0.1 · lr_local=0.3"), line


def test_setup_line_leaves_out_k_when_no_hyper_parameter_comes_from_it(tmp_path):
    """SCAFFNEW's K only sets p = 1/K: with p given, K=2 would state a setting that was never used."""
    path = str(tmp_path / "scaffnew")
    run_experiment(tiny(rounds=1, algorithm="scaffnew", alg_opts={"p": 0.25}), path, progress=False, log=quiet)
    assert _alg_hparams(path) == {"lr": 0.1, "p": 0.25}
    line = plotting.setup_line([plotting.load_run(path)])
    assert "K=" not in line and line.endswith("h=L1(kappa=0.01) · lr=0.1 · p=0.25"), line
