"""`sweep` as a user sees it: one step s of ‖G_s‖² for every point (recorded, shown in the table,
kept on --resume; --select stationarity refused on an old sweep whose points differ), one progress
line per finished run, warnings printed as `run` prints them and once, and the figure settings of
the sweep kept by --resume.

Ground truth: ‖G_s‖² of a point's final model recomputed here in plain PyTorch (the loss's gradient
by autograd over the clients' data, the L1 prox in closed form from tests/_reference.py), the runs'
own summary.json files, and the files in the folder."""

import json
import os

import pytest
import torch
from _reference import prox
from test_run_folders import TINY, params_of

from python_algos.experiments.cli import main
from python_algos.experiments.sweep import STOP_AFTER_ENV

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMOOTH = "FedAvg is a smooth method"


def _config(tmp_path, **kw):
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps({**TINY, "rounds": 2, "checkpoint_every": 0, **kw}))
    return str(p)


def _summary(run_dir):
    return json.load(open(os.path.join(run_dir, "summary.json")))


def _grad_map_sq_by_hand(run_dir, step):
    """‖G_s(x)‖² = ‖(x − prox_{s h}(x − s ∇f(x))) / s‖² at the run's final model, f the mean over the
    clients of each client's mean loss (float64 throughout)."""
    from python_algos.experiments.build import build_model, prepare_data
    from python_algos.experiments.folders import read_config_json
    from python_algos.experiments.losses import loss_function

    cfg = read_config_json(os.path.join(run_dir, "config.json"))
    fed = prepare_data(cfg)
    model = build_model(cfg, fed.dataset)
    x = params_of(run_dir).to(torch.float64)
    torch.nn.utils.vector_to_parameters(x, model.parameters())
    loss = loss_function(fed.dataset.task)
    f = sum(loss(model(X.to(torch.float64)), y) for X, y in fed.clients) / len(fed.clients)
    g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(f, list(model.parameters()))])
    G = (x - prox("l1", x - step * g, step, cfg.reg_strength)) / step
    return float(G.dot(G))


def test_every_point_measures_grad_map_at_one_step_shown_recorded_and_kept_on_resume(tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "s")
    cfg = _config(tmp_path)  # lr 0.1, K = 2 as the base; the grid varies lr, so each point's own lr·K differs
    monkeypatch.setenv(STOP_AFTER_ENV, "1")  # Ctrl-C after the first run: the resume runs the other one
    assert main(["sweep", "-a", "fedcanon", "--grid", "lr=0.05,0.2", "--config", cfg, "--out", out,
                 "--no-progress", "--no-plot"]) == 130
    monkeypatch.delenv(STOP_AFTER_ENV)
    assert main(["sweep", "--resume", out, "--no-progress", "--no-plot"]) == 0
    printed = capsys.readouterr().out
    s = 0.05 * 2  # the rule: the smallest lr times the smallest K of the grid (K is not swept: the base 2)
    assert json.load(open(os.path.join(out, "sweep.json")))["config"]["metric_step"] == s
    assert json.load(open(os.path.join(out, "summary.json")))["metric_step"] == s
    assert f"‖G_s‖² (s={s:g})" in printed
    runs = [os.path.join(out, "fedcanon", p, "seed-0") for p in ("lr=0.05", "lr=0.2")]
    for d in runs:
        assert _summary(d)["final"]["grad_map_step"] == s, d
    final = _summary(runs[1])["final"]  # the point whose own lr·K (0.4) is not s
    assert final["grad_map_sq"] == pytest.approx(_grad_map_sq_by_hand(runs[1], s), rel=1e-10)


def test_a_sweep_from_before_one_s_per_sweep_is_refused_on_resume(tmp_path, capsys):
    out = str(tmp_path / "s")
    assert main(["sweep", "-a", "fedcanon", "--grid", "lr=0.05,0.2", "--config", _config(tmp_path), "--out", out,
                 "--no-progress", "--no-plot"]) == 0
    # a sweep as sweeps made them before they had one s: no metric_step (each point measured ‖G_s‖² at
    # its own α = lr·K); resuming one is refused in one place, whatever is asked of it
    path = os.path.join(out, "sweep.json")
    old = json.load(open(path))
    old["config"]["metric_step"] = None
    json.dump(old, open(path, "w"))
    before = open(os.path.join(out, "summary.md")).read()
    for select in ([], ["--select", "stationarity"]):
        assert main(["sweep", "--resume", out, *select, "--no-progress", "--no-plot"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: cannot resume {out}:") and "one step s" in err and "new --out" in err, err
    assert open(os.path.join(out, "summary.md")).read() == before  # nothing rewritten


def test_metric_step_is_not_a_grid_key(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sweep", "-a", "fedcanon", "--grid", "metric_step=0.1,0.2", "--config", _config(tmp_path),
                 "--out", str(out), "--no-progress"]) == 1
    assert "--grid metric_step" in capsys.readouterr().err and not out.exists()


def test_one_progress_line_per_run_and_each_warning_once(tmp_path, capsys):
    out = str(tmp_path / "s")
    assert main(["sweep", "-a", "fedavg", "--grid", "lr=0.05,0.2", "--config", _config(tmp_path), "--out", out,
                 "--no-plot"]) == 0
    err = capsys.readouterr().err
    assert err.count(f"warning: {SMOOTH}") == 1 and "UserWarning" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert [ln.split("]")[0] for ln in lines] == ["[1/2", "[2/2"]
    for ln, point in zip(lines, ("lr=0.05", "lr=0.2")):
        fh = _summary(os.path.join(out, "fedavg", point, "seed-0"))["final"]["f+h"]
        assert f"fedavg {point} seed 0: completed  f+h={fh:.4g}  elapsed " in ln and "ETA" in ln, ln
    assert main(["sweep", "--resume", out, "--no-progress", "--no-plot"]) == 0
    assert "[" not in capsys.readouterr().err  # --no-progress: silent (and nothing left to run)


@pytest.mark.slow
def test_worker_processes_report_progress_and_warnings_like_run(tmp_path, capfd):
    out = str(tmp_path / "s")
    assert main(["sweep", "-a", "fedavg", "fedcanon", "--grid", "lr=0.05,0.2", "--config", _config(tmp_path),
                 "--out", out, "--jobs", "2", "--no-plot"]) == 0
    err = capfd.readouterr().err  # the workers' own stderr too (file descriptor 2)
    assert err.count(f"warning: {SMOOTH}") == 1 and "UserWarning" not in err and "simulate.py" not in err, err
    assert sorted(ln.split("]")[0] for ln in err.splitlines() if ln.startswith("[")) == [f"[{k}/4" for k in range(1, 5)]


@pytest.mark.slow
def test_resume_keeps_the_sweeps_figure_formats_unless_given_again(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    out = str(tmp_path / "s")
    monkeypatch.setenv(STOP_AFTER_ENV, "1")
    assert main(["sweep", "-a", "fedcanon", "--grid", "lr=0.05,0.2", "--config", _config(tmp_path), "--out", out,
                 "--no-progress", "--formats", "png", "--band", "minmax"]) == 130
    monkeypatch.delenv(STOP_AFTER_ENV)
    assert main(["sweep", "--resume", out, "--no-progress"]) == 0
    figures = sorted(f for f in os.listdir(out) if f.endswith((".png", ".pdf", ".svg")))
    assert figures == ["best.png"]
    assert json.load(open(os.path.join(out, "sweep.json")))["figures"] == {"formats": ["png"], "band": "minmax"}
    assert main(["sweep", "--resume", out, "--no-progress", "--formats", "svg"]) == 0  # given again: it wins
    assert "best.svg" in os.listdir(out) and "best.pdf" not in os.listdir(out)
    assert json.load(open(os.path.join(out, "sweep.json")))["figures"]["formats"] == ["png"]  # the sweep's own kept


def test_examples_print_warnings_as_the_cli_once(tmp_path, capsys):
    from examples._common import Runner, parser
    from python_algos.experiments.config import Config

    parser("x", "doc")  # every example script starts here
    runner = Runner(str(tmp_path), log=lambda *a: None)
    cfg = Config.from_dict({**TINY, "algorithm": "fedavg", "rounds": 1, "checkpoint_every": 0})
    runner.run(cfg, "a")
    runner.run(cfg.replace(lr=0.2), "b")
    err = capsys.readouterr().err
    assert err.count(f"warning: {SMOOTH}") == 1 and "UserWarning" not in err, err
