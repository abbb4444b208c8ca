"""The command line through its real entry point (``python -m python_algos``, in a subprocess), plus
in-process checks of argument handling and error messages."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from python_algos.experiments.cli import main
from python_algos.runfolder.files import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--dataset", "sparse_logistic", "--data-opt", "n=200", "--data-opt", "dim=10", "--data-opt", "nnz=3",
        "-N", "4", "-K", "2", "--lr", "0.1", "--no-plot"]  # figures: test_demo_entry_point, tests/test_figures.py


def cli(*args, timeout=120):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("_FEDKERNELS_TEST_KILL_AT_ROUND", None)
    return subprocess.run([sys.executable, "-m", "python_algos", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_demo_entry_point(tmp_path):
    """The README's main job (``python -m python_algos`` = ``demo``), shortened to 3 rounds."""
    p = cli("run", "--demo", "-T", "3", "--out", str(tmp_path / "demo"))
    assert p.returncode == 0, p.stderr
    for name in ("fedcanon", "fedavg", "za1", "fednmap", "fedmid"):
        assert f"| {name}" in p.stdout
        assert len(read_metrics(tmp_path / "demo" / name)) == 4
    assert "support F1" in p.stdout and f"results written to {tmp_path / 'demo'}" in p.stdout
    for ext in ("png", "pdf") if importlib.util.find_spec("matplotlib") else ():  # the main job's figure
        fig = tmp_path / "demo" / f"overview.{ext}"
        assert f"figure: {fig}" in p.stdout and fig.stat().st_size > 1000
    assert "round 3/3" in p.stderr  # progress lines when stderr is not a terminal
    assert "FedAvg is a smooth method" in p.stderr
    _check_verdict(p.stdout.strip().splitlines()[-1], tmp_path / "demo")


_DISPLAY = {"fedcanon": "FedCanon", "fedavg": "FedAvg", "za1": "ZA1", "fednmap": "FedNMap", "fedmid": "FedMiD"}


def _check_verdict(line, out):
    """The demo's last line against its metrics files (numpy): the lowest final f+h, the highest final
    support F1, and a "coincide" note exactly for the pairs whose f+h curves agree to 1e-4 (relative)
    over the second half of the rounds."""
    import numpy as np

    rows = {n: read_metrics(out / n) for n in _DISPLAY}
    fh = {n: np.array([r["f+h"] for r in rows[n]]) for n in rows}
    best = min(fh, key=lambda n: fh[n][-1])
    assert line.startswith(f"lowest f+h: {_DISPLAY[best]} ("), line
    f1 = {n: rows[n][-1]["support_f1"] for n in rows}
    top = [_DISPLAY[n] for n in rows if f1[n] == max(f1.values())]
    assert f"best support recovery: {(', '.join(top[:-1]) + ' and ' + top[-1]) if len(top) > 1 else top[0]}" in line
    names = list(rows)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            t = np.arange(len(fh[a]))
            rel = np.abs(fh[a] - fh[b]) / np.maximum(np.abs(fh[a]), np.abs(fh[b]))
            together = bool((rel[t >= t[-1] / 2] < 1e-4).all())
            assert (f"{_DISPLAY[a]} and {_DISPLAY[b]} coincide" in line) == together, (a, b, line)


def test_verdict_names_a_pair_of_identical_curves(tmp_path):
    """Two runs of one config are the same trajectory: the verdict line says they coincide, and
    names them both where they tie for the lowest f+h."""
    from test_run_folders import quiet, tiny

    from python_algos.experiments.compare import verdict_line
    from python_algos.experiments.run import run_experiment

    sums = [run_experiment(tiny(**kw), str(tmp_path / label), label=label, progress=False, log=quiet)
            for label, kw in (("a", {}), ("b", {}), ("c", {"algorithm": "fedmid"}))]
    for s, name in zip(sums, ("A", "B", "C")):
        s["algorithm"] = name  # display names that tell the two identical runs apart
    line = verdict_line(sums)
    assert "A and B coincide (the same trajectory" in line, line
    assert "A and C coincide" not in line and "B and C coincide" not in line
    fa, fc = read_metrics(tmp_path / "a")[-1]["f+h"], read_metrics(tmp_path / "c")[-1]["f+h"]
    assert line.startswith("lowest f+h: A and B (" if fa < fc else "lowest f+h: C ("), line


@pytest.mark.slow
def test_run_with_config_file_and_flag_override(tmp_path):
    cfg = tmp_path / "exp.toml"
    cfg.write_text('algorithm = "za1"\nrounds = 50\nlocal_steps = 2\nnum_clients = 4\nreg = "mcp"\n'
                   'reg_strength = 0.01\nlr = 0.1\n[data_opts]\nn = 200\ndim = 10\nnnz = 3\n[reg_opts]\ngamma = 4.0\n')
    out = tmp_path / "run"
    p = cli("run", "--config", str(cfg), "--rounds", "4", "-B", "16", "--seed", "2", "--out", str(out))
    assert p.returncode == 0, p.stderr
    conf = json.loads((out / "config.json").read_text())
    assert conf["rounds"] == 4 and conf["algorithm"] == "za1" and conf["batch_size"] == 16
    assert conf["reg_opts"] == {"gamma": 4.0} and conf["data_opts"]["dim"] == 10
    rows = read_metrics(out)
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
    assert all("f+h" in r and "test_acc" in r for r in rows) and "grad_evals" in rows[1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["regularizer"].startswith("MCP")
    assert summary["dim"] == 11 and (out / "model.pt").exists() and (out / "checkpoint.pt").exists()
    part = json.loads((out / "partition.json").read_text())
    assert sum(part["sizes"]) == 160 and len(part["label_histograms"]) == 4
    assert "results written to" in p.stdout and "f+h" in p.stdout


@pytest.mark.slow
def test_compare_then_plot(tmp_path):
    out = tmp_path / "cmp"
    p = cli("compare", "-a", "fedcanon", "scaffold", *TINY, "-T", "3", "--reg", "zero",
            "--alg-opt", "fedcanon.alpha=0.3", "--out", str(out), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "| fedcanon" in p.stdout and "| scaffold" in p.stdout and "round 3/3" not in p.stderr
    runs = json.loads((out / "comparison.json").read_text())["runs"]
    assert runs[0]["hparams"]["alpha"] == 0.3 and runs[1]["algorithm"] == "SCAFFOLD"
    # same split and initialization: identical starting point
    assert read_metrics(out / "fedcanon")[0]["f+h"] == read_metrics(out / "scaffold")[0]["f+h"]
    assert (out / "comparison.md").read_text().count("completed") == 2

    p = cli("plot", str(out), "--out", str(tmp_path / "figs"))
    assert p.returncode == 0, p.stderr
    files = set(os.listdir(tmp_path / "figs"))
    for f in ("overview.png", "f_plus_h_vs_round.png", "f_plus_h_vs_time.png", "accuracy_vs_round.png",
              "stationarity_vs_round.png", "sparsity_vs_time.png"):
        assert f in files
    assert (tmp_path / "figs" / "overview.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_metrics_exits_0_without_a_figure_and_plot_refuses_it(tmp_path):
    """--metrics-every 0 records no objective: the run's results are written and it exits 0, its overview
    figure skipped with a note (it exited 1 on the figure after writing them); `plot` still refuses the folder
    naming the metrics it holds."""
    out = tmp_path / "run"
    p = cli("run", "-a", "fedavg", *TINY[:-1], "-T", "2", "--metrics-every", "0", "--out", str(out), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "no figure:" in p.stdout and not list(out.glob("*.png"))
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    p = cli("plot", str(out), "--out", str(tmp_path / "figs"))
    assert p.returncode != 0 and "hold no metric to plot" in p.stderr and "give --metrics" in p.stderr


def test_algorithms_table(capsys):
    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    assert "| `fedcanon` |" in out and "| `scaffnew` |" in out


def test_missing_dataset_is_a_clear_error(tmp_path, capsys):
    assert main(["run", "--dataset", "mnist", "--data-dir", str(tmp_path), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: MNIST: expected train-images-idx3-ubyte") and str(tmp_path) in err


@pytest.mark.slow
def test_json_config_resume_extension_and_bad_input(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"algorithm": "fedmid", "rounds": 2, "bogus_key": 1}))
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 1
    assert f"{cfg}: unknown key(s) bogus_key; valid keys: " in capsys.readouterr().err
    cfg.write_text(json.dumps({"algorithm": "fedmid", "rounds": 2, "local_steps": 2, "num_clients": 3,
                               "data_opts": {"n": 90, "dim": 6, "nnz": 2}}))
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["algorithm"] == "FedMiD"
    capsys.readouterr()
    assert main(["run", "--resume", str(tmp_path / "r"), "--lr", "0.5"]) == 1
    assert "error: --resume takes its settings from" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "r"), "-T", "4", "--no-progress"]) == 0  # extend the run
    assert [r["round"] for r in read_metrics(tmp_path / "r")] == [0, 1, 2, 3, 4]
    capsys.readouterr()
    assert main(["run", "-a", "nope", "--out", str(tmp_path / "x")]) == 1
    assert "-a nope: unknown algorithm" in capsys.readouterr().err  # the flag as typed
    with pytest.raises(SystemExit):
        main(["run", "--partition", "weird"])


def test_yaml_config(tmp_path):
    pytest.importorskip("yaml")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algorithm: fednmap\nrounds: 1\nlocal_steps: 1\nnum_clients: 2\n"
                   "data_opts: {n: 40, dim: 4, nnz: 1}\n")
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r"), "--no-progress"]) == 0


def test_progress_bar_on_a_terminal():
    import io

    from python_algos.runfolder.progress import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    bar = Progress(total=5, desc="fedcanon", stream=out)
    for t in range(1, 6):
        bar.update(t, {"f+h": 1.0 / t, "test_acc": 0.5 + t / 20})
    bar.close()
    text = out.getvalue()
    assert "fedcanon" in text and "5/5" in text and "f+h=0.2" in text and "acc=0.75" in text
    plain = io.StringIO()  # not a terminal: a few plain lines with an ETA
    bar = Progress(total=20, desc="za1", stream=plain)
    for t in range(1, 21):
        bar.update(t, {"f+h": 0.5})
    assert plain.getvalue().count("\n") <= 11 and "ETA" in plain.getvalue() and "round 20/20" in plain.getvalue()


@pytest.mark.slow
def test_per_parameter_regularizers_table_and_flag(tmp_path, capsys):
    """A [regularizers] table (group lasso on the weight's columns, no penalty on the bias) runs,
    is recorded, and resumes; --reg-param adds entries; bad entries name the flag / file and key
    and leave no folder behind."""
    cfg = tmp_path / "exp.toml"
    cfg.write_text('algorithm = "fedmid"\nrounds = 2\nlocal_steps = 2\nnum_clients = 3\nmodel = "linear"\n'
                   '[data_opts]\nn = 90\ndim = 6\nnnz = 2\n'
                   '[regularizers]\n"linear.weight" = {reg = "group_lasso", lam = 0.05, groups = "cols"}\n'
                   '"*.bias" = "none"\n')
    out = tmp_path / "r"
    assert main(["run", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["regularizer"] == ("PerParameter({'linear.weight': GroupLasso(lam=0.05, groups='cols'), "
                                      "'*.bias': None})")
    assert json.loads((out / "config.json").read_text())["regularizers"] == {
        "linear.weight": {"reg": "group_lasso", "lam": 0.05, "groups": "cols"}, "*.bias": "none"}
    assert main(["run", "--resume", str(out), "-T", "3", "--no-progress"]) == 0
    capsys.readouterr()

    bad = [
        (["--reg-param", "nope.*=l1"], "--reg-param nope.*=l1: regularizer key 'nope.*' matches no parameter"),
        (["--reg-param", "*=l1,kappa=-1"], "--reg-param *=l1,kappa=-1: kappa must be >= 0"),
        (["--reg-param", "*=group_lasso,lam=0.1,groupz=cols"], "group_lasso has no option groupz"),
        (["--reg-param", "linear.bias=group_lasso"], "needs a parameter with 2 or more dimensions"),
        (["--reg", "l1", "--reg-param", "*=l1"], "give --reg (one penalty for the whole model) or --reg-param"),
        (["--reg", "group_lasso"], "--reg group_lasso: group_lasso needs a parameter's shape"),
    ]
    for flags, message in bad:
        target = tmp_path / "bad"
        assert main(["run", "-a", "fedmid", "-T", "1", "--model", "linear", "--data-opt", "n=90",
                     "--data-opt", "dim=6", "--data-opt", "nnz=2", *flags, "--out", str(target),
                     "--no-progress"]) == 1, flags
        assert message in capsys.readouterr().err, flags
        assert not target.exists()
    cfg.write_text('algorithm = "fedmid"\nrounds = 1\n[regularizers]\n"*" = {reg = "scad", lam = 0.1, a = 1.5}\n')
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "bad"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {cfg}: regularizers = *=scad,lam=0.1,a=1.5:"), err


# --------------------------------------------------------------------------- #
# Error messages before anything runs (issue 17, item 17)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("text,expected", [
    ("rounds = 3\nalg_opts = {alpha = [1, 2\n", "at the end of the file: Unclosed array"),
    ("rounds = 3\nlr = = 2\n", "line 2, column 6: Invalid value"),
])
def test_toml_syntax_error_keeps_tomllibs_message(tmp_path, capsys, text, expected):
    # the message used to lose every space when tomllib gave no line: 'Unclosedarray(atendofdocument)'
    cfg = tmp_path / "exp.toml"
    cfg.write_text(text)
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err == f"error: {cfg}, {expected}\n"
    assert not (tmp_path / "r").exists()


def test_batch_size_zero_is_refused_like_simulate_and_config_files(tmp_path, capsys):
    """One rule for a batch size: an int >= 1, or full gradients (None in simulate, null in a config
    file, 'full' on the command line). -B 0 used to mean 'full' on the command line alone."""
    import torch

    from python_algos import FedAvg, simulate

    with pytest.raises(SystemExit) as e:
        main(["run", "-B", "0", "--out", str(tmp_path / "r")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error: -B 0: must be an integer >= 1" in err and "'full' for full local gradients" in err
    with pytest.raises(ValueError, match="batch_size"):  # the library refuses 0 as well
        simulate(FedAvg(lr_local=0.1, local_steps=1), torch.nn.Linear(2, 1), torch.nn.functional.mse_loss,
                 [(torch.zeros(4, 2), torch.zeros(4, 1))], rounds=1, batch_size=0)
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"batch_size": 0}))
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 1
    assert "batch_size = 0: must be an integer >= 1 or null" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    # 'full' and a size still work: the run records them as None / the size
    for flag, recorded in (("full", None), ("3", 3)):
        out = tmp_path / f"r-{flag}"
        assert main(["run", *TINY, "-T", "1", "-B", flag, "--out", str(out), "--no-progress"]) == 0
        assert json.loads((out / "config.json").read_text())["batch_size"] == recorded


def test_compare_checks_algorithm_names_before_printing(tmp_path):
    p = cli("compare", "-a", "fedcannon", "fedavg", "--out", str(tmp_path / "c"), *TINY, "-T", "1")
    assert p.returncode == 1
    assert p.stdout == ""  # no "comparing ... -> folder" line for a comparison that never starts
    assert p.stderr.startswith("error: --algorithm fedcannon: unknown algorithm 'fedcannon'; valid names: fedcanon,")
    assert not (tmp_path / "c").exists()


def test_compare_takes_the_algorithms_of_its_config_file(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('algorithms = ["fedavg", "fedmid"]\n')
    out = tmp_path / "c"
    assert main(["compare", "--config", str(cfg), *TINY, "-T", "1", "--out", str(out), "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["fedavg", "fedmid"]
    cfg.write_text('algorithms = ["fedavg", "fedcannon"]\n')
    capsys.readouterr()
    assert main(["compare", "--config", str(cfg), *TINY, "-T", "1", "--out", str(tmp_path / "d")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(
        "error: --algorithm fedcannon: unknown algorithm 'fedcannon'; valid names: fedcanon,")


def test_an_alg_opt_named_lr_sets_the_algorithms_own_lr():
    """SCAFFNEW's own step size is called ``lr``, like the common --lr: ``--alg-opt lr=0.3`` must set it
    (it clashed with the mapping's keyword before), with the other hyper-parameters still mapped."""
    from python_algos.algorithms.scaffnew import SCAFFNEW
    from python_algos.experiments.build import build_algorithm
    from python_algos.experiments.config import Config

    alg = build_algorithm(Config.from_dict({"algorithm": "scaffnew", "lr": 0.05, "local_steps": 4,
                                            "alg_opts": {"lr": 0.3}}))
    assert alg == SCAFFNEW(lr=0.3, p=0.25)


@pytest.mark.parametrize("argv, flag, counted", [
    (["run", "--seeds", "0"], "--seeds", "independent runs, one per seed"),
    (["run", "--workers", "0"], "--workers", "processes"),
    (["compare", "--workers", "x"], "--workers", "processes"),
    (["sweep", "--jobs", "0"], "--jobs", "worker processes"),
    (["sweep", "--optuna", "-2"], "--optuna", "trials per algorithm"),
])
def test_each_count_flag_says_what_it_counts(tmp_path, capsys, argv, flag, counted):
    """--seeds, --workers, --jobs and --optuna each word their own rule (--seeds 0 is not about
    processes), and nothing is written."""
    with pytest.raises(SystemExit):
        main([*argv, "--out", str(tmp_path / "never")])
    err = capsys.readouterr().err
    bad = argv[-1]
    assert f"argument {flag}: must be an integer >= 1 ({counted}), got {bad!r}" in err
    assert not (tmp_path / "never").exists()


def _table_rows(text: str, first: str) -> list:
    """The cells of each row of the markdown table whose header starts with ``first``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_algorithms_command_prints_the_rows_of_the_readme_table(capsys):
    """python_algos/README.md says `algorithms` prints a shorter form of its table: the same
    algorithms in the same order, with the same section and status (the README's status may add a
    note in parentheses)."""
    assert main(["algorithms"]) == 0
    printed = _table_rows(capsys.readouterr().out, "name")
    with open(os.path.join(ROOT, "python_algos", "README.md")) as f:
        readme_text = f.read()
    assert "prints a shorter form of the table below" in readme_text
    readme = _table_rows(readme_text, "registry name")
    assert [r[0] for r in printed] == [r[0] for r in readme]
    for p, r in zip(printed, readme):
        assert p[2] == r[2], (p[0], p[2], r[2])  # section
        assert r[3] == p[3] or r[3].startswith(p[3] + " ("), (p[0], p[3], r[3])  # status


# --------------------------------------------------------------------------- #
# --resume: which flags may differ (a resumed run ends with the uninterrupted run's bits)
# --------------------------------------------------------------------------- #

RESUMABLE = [*TINY, "-a", "fedcanon", "--dtype", "float64", "-B", "8", "--no-progress"]
TIMES = ("wall_time", "elapsed", "prox_time", "grad_time", "fwd_bwd_time")


def _results(out):
    """model.pt's parameters and every metrics row without its timings."""
    import torch

    rows = [{k: v for k, v in r.items() if k not in TIMES} for r in read_metrics(out)]
    return torch.load(os.path.join(out, "model.pt"), weights_only=True)["params"], rows


def test_resume_with_another_checkpoint_interval_ends_with_the_uninterrupted_bits(tmp_path, monkeypatch):
    """--checkpoint-every may differ on run --resume: the resumed run writes its checkpoints at the new
    interval (and config.json records it), and ends with the model and metrics, bit for bit, of the
    run that was never interrupted (float64, minibatches: a checkpoint must not disturb any generator)."""
    from python_algos.experiments import launch

    ref, part = str(tmp_path / "ref"), str(tmp_path / "part")
    assert main(["run", *RESUMABLE, "-T", "4", "--checkpoint-every", "4", "--out", ref]) == 0
    assert main(["run", *RESUMABLE, "-T", "2", "--checkpoint-every", "4", "--out", part]) == 0
    saved = []
    write = launch.SingleFileCheckpointer.__call__
    monkeypatch.setattr(launch.SingleFileCheckpointer, "__call__", lambda self, snap: (saved.append(snap["round"]),
                                                                                     write(self, snap))[1])
    assert main(["run", "--resume", part, "-T", "4", "--checkpoint-every", "1", "--no-progress", "--no-plot"]) == 0
    assert saved == [3, 4]  # the old interval (4) would have saved round 4 alone
    with open(os.path.join(part, "config.json")) as f:
        assert json.load(f)["checkpoint_every"] == 1
    (x_ref, rows_ref), (x, rows) = _results(ref), _results(part)
    assert x.dtype == x_ref.dtype and x.dtype.is_floating_point and x.tolist() == x_ref.tolist()
    assert rows == rows_ref and [r["round"] for r in rows] == list(range(5))


ACCEPTED_ON_RUN_RESUME = ["--rounds", "--workers", "--no-progress", "--formats", "--no-plot", "--band",
                          "--tensorboard", "--checkpoint-every", "--time-budget"]


@pytest.mark.parametrize("flag, why", [
    (["--executor", "sequential"], "--executor: another executor"),
    (["--threads", "1"], "--threads: another number of threads"),
    (["--lr", "0.5"], None),
    (["--out", "OTHER"], None),
])
def test_resume_refuses_what_changes_results_listing_every_accepted_flag(tmp_path, capsys, flag, why):
    """--executor and --threads change the floating-point summation order (not bit-identical), so a
    resume refuses them like any setting: an `error:` line listing every flag it accepts, nothing
    changed and no other folder created."""
    import re

    run = str(tmp_path / "r")
    assert main(["run", *RESUMABLE, "-T", "2", "--out", run]) == 0
    before = {n: open(os.path.join(run, n), "rb").read() for n in sorted(os.listdir(run))}
    capsys.readouterr()
    flag = [str(tmp_path / "other") if a == "OTHER" else a for a in flag]
    assert main(["run", "--resume", run, "-T", "3", *flag]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --resume takes its settings from {run}, so only ") and err.count("\n") == 1, err
    listed = re.search(r"so only (.*) may be given \(got (.*?)\)", err)
    assert re.split(r", | and ", listed[1]) == ACCEPTED_ON_RUN_RESUME
    assert listed[2] == flag[0]
    if why:  # the reason, after the list
        assert why in err and "bits of an uninterrupted one" in err
    else:
        assert "bits of an uninterrupted one" not in err
    assert {n: open(os.path.join(run, n), "rb").read() for n in sorted(os.listdir(run))} == before
    assert not (tmp_path / "other").exists()


def test_compare_resume_keeps_the_checkpoint_interval_and_says_what_it_accepts(tmp_path, capsys):
    """compare --resume does not pass --checkpoint-every on: it refuses it (not silently ignored), and
    its list of accepted flags leaves it out."""
    out = str(tmp_path / "c")
    assert main(["compare", *TINY, "-a", "fedcanon", "-T", "1", "--no-progress", "--out", out]) == 0
    capsys.readouterr()
    assert main(["compare", "--resume", out, "--checkpoint-every", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --resume takes its settings from") and "(got --checkpoint-every)" in err
    assert "only --rounds, --workers, --no-progress, --formats, --no-plot, --band and --tensorboard may" in err


def test_metric_names_are_the_same_words_in_every_table(tmp_path, capsys):
    """One run's table, a comparison's and a seeds table head each metric with the same words
    (issue 26: `grad_map_sq` in one, `‖G_s‖²` in another)."""
    from python_algos.experiments.tables import column_name

    def header(text):
        line = next(ln for ln in text.splitlines() if ln.startswith("| ") and ("round" in ln or "algorithm" in ln))
        return [c.strip() for c in line.strip("|").split("|")]

    step = 0.1 * 2  # lr·K: the s of ‖G_s‖² in every table below
    common = [*TINY, "-T", "2", "--no-progress", "--metric-step", str(step)]
    assert main(["run", "-a", "fedcanon", *common, "--out", str(tmp_path / "r")]) == 0
    run = header(capsys.readouterr().out)
    assert main(["compare", "-a", "fedcanon", "fedavg", *common, "--out", str(tmp_path / "c")]) == 0
    cmp_ = header(capsys.readouterr().out)
    assert main(["compare", "-a", "fedcanon", "fedavg", *common, "--seeds", "2", "--out", str(tmp_path / "s")]) == 0
    seeds = header(capsys.readouterr().out)
    for k in ("f+h", "grad_map_sq", "sparsity", "test_acc", "support_f1"):
        name = column_name(k, step)
        assert name in run and name in cmp_ and name in seeds, (k, run, cmp_, seeds)
    raw = {"grad_map_sq", "normal_map_sq", "test_acc", "train_acc", "support_f1", "elapsed"}
    assert not raw & {c.split(" (")[0] for c in run + cmp_ + seeds}, (run, cmp_, seeds)  # no raw metric key


def test_a_closed_pipe_ends_the_command_quietly():
    """`python -m python_algos algorithms | head -1`: no BrokenPipeError traceback on stderr."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "python_algos", "algorithms"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()  # the reader goes away after one line, as `head -1` does
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
