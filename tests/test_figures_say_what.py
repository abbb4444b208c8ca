"""Figures that say what they show (issue 38 item 6): runs overlaid on a stationarity panel with
different steps s name each s; runs overlaid on an f+h axis with different penalties name each h;
the setup line names the participation; the sweep heat map's best cell says so in words.

Ground truth: the legend texts and cell texts matplotlib holds, against the runs' own settings."""

import pytest
from test_run_folders import quiet, tiny

from python_algos.experiments.run import run_experiment

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
pytest.importorskip("matplotlib")
from python_algos.experiments import plotting  # noqa: E402
from python_algos.experiments.plotting.axes import line_plot  # noqa: E402


def _legend(runs, metric):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        assert line_plot(ax, runs, metric)
        return [line.get_label() for line in ax.get_lines()]
    finally:
        plt.close(fig)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("say")
    cfgs = {"l1_s1": tiny(rounds=2, metric_step=1.0), "l1_s025": tiny(rounds=2, metric_step=0.25),
            "scad": tiny(rounds=2, reg="scad", metric_step=1.0),
            "k2": tiny(rounds=2, algorithm="fedavg", clients_per_round=2)}
    out = {}
    for name, cfg in cfgs.items():
        out[name] = str(root / name)
        run_experiment(cfg, out[name], progress=False, log=quiet)
    return {k: plotting.load_run(v) for k, v in out.items()}


def test_a_stationarity_panel_names_each_step(runs):
    labels = _legend([runs["l1_s1"], runs["l1_s025"]], "stationarity")
    assert any(lab.endswith("(s=1)") for lab in labels) and any(lab.endswith("(s=0.25)") for lab in labels)
    assert all("(s=" not in lab for lab in _legend([runs["l1_s1"], runs["scad"]], "stationarity"))  # same s


def test_an_objective_axis_names_each_penalty(runs):
    labels = _legend([runs["l1_s1"], runs["scad"]], "f+h")
    assert any("(h=L1" in lab for lab in labels) and any("(h=SCAD" in lab for lab in labels), labels
    assert all("(h=" not in lab for lab in _legend([runs["l1_s1"], runs["l1_s025"]], "f+h"))  # same h


def test_the_setup_line_names_the_participation(runs):
    assert "2 of 4 clients per round" in plotting.setup_line([runs["k2"]])
    assert "clients per round" not in plotting.setup_line([runs["l1_s1"]])


def test_the_best_cell_of_a_heat_map_says_best():
    import matplotlib.pyplot as plt

    from python_algos.experiments.plotting import heatmaps

    fig = heatmaps._draw_heatmap(plt, [[1.0, 2.0], [3.0, 0.5]], [1, 2], [3, 4], "a", "b", "f+h", "t", (1, 1))
    try:
        texts = {t.get_text(): t.get_fontweight() for t in fig.axes[0].texts}
        assert texts["0.5\nbest"] == "bold" and "1" in texts and not any("best" in t for t in texts if t != "0.5\nbest")
    finally:
        plt.close(fig)


def test_the_step_in_use_is_recorded_when_the_algorithm_chose_it(tmp_path):
    from python_algos.algorithms.registry import build

    out = str(tmp_path / "d")
    cfg = tiny(rounds=1)
    run_experiment(cfg, out, progress=False, log=quiet)
    want = build(cfg.algorithm, cfg.lr, cfg.local_steps, cfg.alg_opts).metric_step()
    assert cfg.metric_step is None and plotting.load_run(out)["summary"]["metric_step"] == want
