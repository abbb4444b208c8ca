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


def test_algorithms_table(capsys):
    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    assert "| `fedcanon` |" in out and "| `scaffnew` |" in out


def test_missing_dataset_is_a_clear_error(tmp_path, capsys):
    assert main(["run", "--dataset", "mnist", "--data-dir", str(tmp_path), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: MNIST: expected train-images-idx3-ubyte") and str(tmp_path) in err


def test_json_config_resume_extension_and_bad_input(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"algorithm": "fedmid", "rounds": 2, "bogus_key": 1}))
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 1
    assert f"{cfg}: unknown key(s) bogus_key; valid keys: " in capsys.readouterr().err
    cfg.write_text(json.dumps({"algorithm": "fedmid", "rounds": 2, "local_steps": 2, "num_clients": 3,
                               "data_opts": {"n": 90, "dim": 6, "nnz": 2}}))
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["algorithm"] == "FedMiD"
    with pytest.raises(SystemExit, match="only --rounds"):
        main(["run", "--resume", str(tmp_path / "r"), "--lr", "0.5"])
    assert main(["run", "--resume", str(tmp_path / "r"), "-T", "4", "--no-progress"]) == 0  # extend the run
    assert [r["round"] for r in read_metrics(tmp_path / "r")] == [0, 1, 2, 3, 4]
    capsys.readouterr()
    assert main(["run", "-a", "nope", "--out", str(tmp_path / "x")]) == 1
    assert "--algorithm nope: unknown algorithm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--partition", "weird"])


def test_yaml_config(tmp_path):
    pytest.importorskip("yaml")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algorithm: fednmap\nrounds: 1\nlocal_steps: 1\nnum_clients: 2\ndata_opts: {n: 40, dim: 4, nnz: 1}\n")
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
                     "--data-opt", "dim=6", "--data-opt", "nnz=2", *flags, "--out", str(target), "--no-progress"]) == 1, flags
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
    assert "argument -B/--batch-size: must be an integer >= 1" in err and "'full' for full local gradients" in err
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
    assert p.stderr.startswith("error: --algorithm fedcannon: unknown algorithm(s); valid names: fedcanon,")
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
    assert out == "" and err.startswith("error: --algorithm fedcannon: unknown algorithm(s); valid names: fedcanon,")


def test_an_alg_opt_named_lr_sets_the_algorithms_own_lr():
    """SCAFFNEW's own step size is called ``lr``, like the common --lr: ``--alg-opt lr=0.3`` must set it
    (it clashed with the mapping's keyword before), with the other hyper-parameters still mapped."""
    from python_algos.algorithms.scaffnew import SCAFFNEW
    from python_algos.experiments.build import build_algorithm
    from python_algos.experiments.config import Config

    alg = build_algorithm(Config.from_dict({"algorithm": "scaffnew", "lr": 0.05, "local_steps": 4,
                                            "alg_opts": {"lr": 0.3}}))
    assert alg == SCAFFNEW(lr=0.3, p=0.25)
