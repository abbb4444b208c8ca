"""Command-line refusals in the user's terms (audit findings 7, 8, 9, 14): each names the flag or the
config file and key, says the rule, and leaves no run folder behind."""

import inspect
import json

import pytest

from python_algos.experiments.build import build_algorithm
from python_algos.experiments.cli import main
from python_algos.experiments.config import Config
from python_algos.experiments.models import MODELS, build_model, count_parameters
from python_algos.experiments.run import run_experiment

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["--dataset", "sparse_logistic", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt", "nnz=3",
         "-N", "4", "-K", "2", "-T", "1", "--no-progress", "--no-plot"]


def refused(tmp_path, capsys, *argv, command="run"):
    """The one-line error of ``argv`` (asserting rc 1 and that no folder was written)."""
    out = tmp_path / "r"
    rc = main([command, *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert not out.exists(), err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err[len("error: "):].rstrip("\n")


# --- 7: --alg-opt local_steps --------------------------------------------------------------------------- #


@pytest.mark.parametrize("alg", ["fedcanon", "fedavg", "scaffnew"])
def test_alg_opt_local_steps_is_refused_naming_K(tmp_path, capsys, alg):
    """K is a run setting (config.json, the setup line and the metrics' step read -K): a second value
    through --alg-opt used to run K=5 while config.json said local_steps=2 (or, earlier, fail with
    'make() got multiple values for keyword argument')."""
    err = refused(tmp_path, capsys, *SMALL, "-a", alg, "--alg-opt", "local_steps=5")
    assert err == ("--alg-opt local_steps=5: the number of local steps is a run setting; give it with "
                   "-K/--local-steps (-K 5)"), err


def test_alg_opt_local_steps_is_refused_in_compare_and_config_files(tmp_path, capsys):
    err = refused(tmp_path, capsys, *SMALL, "-a", "fedcanon", "fedavg", "--alg-opt", "fedavg.local_steps=3",
                  command="compare")
    assert "local_steps=3" in err and "-K/--local-steps" in err
    cfg = tmp_path / "c.toml"
    cfg.write_text('rounds = 1\nalg_opts = {local_steps = 4}\n')
    err = refused(tmp_path, capsys, "--config", str(cfg), *SMALL)
    assert "local_steps=4" in err and "-K 4" in err


def test_K_reaches_the_algorithm_and_the_hyper_parameter_list_points_to_it(tmp_path, capsys):
    alg = build_algorithm(Config.from_dict({"algorithm": "fedcanon", "lr": 0.1, "local_steps": 5}))
    assert alg.local_steps == 5 and alg.alpha == pytest.approx(0.5)  # alpha = lr * K (registry's mapping)
    err = refused(tmp_path, capsys, *SMALL, "-a", "fedcanon", "--alg-opt", "alpah=0.1")
    assert err.endswith("its hyper-parameters: alpha, beta; the local steps: -K/--local-steps"), err


# --- 8: --model-opt ------------------------------------------------------------------------------------- #


@pytest.mark.parametrize("flags, expected", [
    (["--model", "mlp", "--model-opt", "hidden=abc"],
     "--model mlp --model-opt hidden=abc: model 'mlp': hidden must be an int or a list of ints, each >= 1 "
     "(the hidden layers' widths), got 'abc'"),
    (["--model-opt", "hidden=8"], "--model linear --model-opt hidden=8: model 'linear' takes no options (got hidden)"),
    (["--model", "mlp", "--model-opt", "hidden=8", "--model-opt", "foo=1"],
     "--model mlp --model-opt foo=1: model 'mlp' has no option(s) foo; its options: hidden"),
    (["--model", "mlp", "--model-opt", "hidden=[8,true]"], None),
    (["--model", "sigmoid_net", "--model-opt", "hidden=[8]"],
     "--model sigmoid_net --model-opt hidden=[8]: model 'sigmoid_net': hidden must be an int >= 1, got [8]"),
    (["--model", "cnn", "--model-opt", "pool_padding=2"], None),
    (["--model", "cnn", "--model-opt", "in_channels=3"], None),  # set from the data, not an option
    (["--model", "resnet18", "--model-opt", "zero_init_residual=1"], None),
])
def test_model_opt_errors_name_the_option_not_torch(tmp_path, capsys, flags, expected):
    """These used to print torch's 'empty(): argument 'size' ... must be tuple of ints' or
    'LinearModel.__init__() got an unexpected keyword argument 'hidden''."""
    err = refused(tmp_path, capsys, *SMALL, "-a", "fedcanon", *flags)
    if expected is not None:
        assert err == expected
    assert "--model-opt " + flags[-1].replace(",", ", ") in err, err
    for internal in ("empty()", "__init__", "unexpected keyword", "position"):
        assert internal not in err, err


def test_model_options_are_the_constructors_keywords():
    """MODEL_OPTIONS lists every model, and each option is a keyword of the model's constructor."""
    from python_algos.experiments import models
    from python_algos.experiments.models import MODEL_OPTIONS

    assert set(MODEL_OPTIONS) == set(MODELS)
    ctor = {"linear": models.LinearModel, "mlp": models.MLP, "cnn": models.CNN, "sigmoid_net": models.SigmoidNet}
    for name, options in MODEL_OPTIONS.items():
        params = inspect.signature(ctor.get(name, models.ResNet)).parameters
        assert set(options) <= set(params), (name, options)


def test_build_model_checks_options_from_python_too():
    from python_algos.experiments.models import ModelOptionError

    with pytest.raises(ModelOptionError, match=r"model 'mlp': hidden must be an int or a list of ints") as e:
        build_model("mlp", (10,), 2, hidden="abc")
    assert e.value.options == ("hidden",)
    with pytest.raises(ValueError, match=r"model 'linear' takes no options \(got hidden\)"):
        build_model("linear", (10,), 2, hidden=4)
    # hidden=16 for mlp is one hidden layer of 16 (as the error's "an int or a list of ints" promises)
    assert count_parameters(build_model("mlp", (10,), 3, hidden=16)) == 10 * 16 + 16 + 16 * 3 + 3
    assert count_parameters(build_model("mlp", (10,), 3, hidden=[16, 4])) == 10 * 16 + 16 + 16 * 4 + 4 + 4 * 3 + 3
    assert count_parameters(build_model("cnn", (1, 8, 8), 2, channels=[2, 3], hidden=5, kernel_size=3, padding=1,
                                        pool_padding=0)) == ((9 * 2 + 2) + (18 * 3 + 3) + (3 * 2 * 2 * 5 + 5)
                                                             + (5 * 2 + 2))


# --- 9: partition settings the partition does not use --------------------------------------------------- #


@pytest.mark.parametrize("flags, expected", [
    (["--eta", "0.1"], "--eta 0.1: applies only to --partition dirichlet or writers (got iid)"),
    (["--min-size", "5"], "--min-size 5: applies only to --partition dirichlet or writers (got iid)"),
    (["--shards-per-client", "3"], "--shards-per-client 3: applies only to --partition shards (got iid)"),
    (["--partition", "shards", "--eta", "0.1"], "--eta 0.1: applies only to --partition dirichlet or writers "
                                                "(got shards)"),
    (["--partition", "dirichlet", "--shards-per-client", "2"],
     "--shards-per-client 2: applies only to --partition shards (got dirichlet)"),
])
def test_partition_settings_the_partition_ignores_are_refused(tmp_path, capsys, flags, expected):
    """They used to run iid with rc 0: the flag changed nothing."""
    assert refused(tmp_path, capsys, *SMALL, *flags) == expected


def test_partition_settings_in_a_config_file(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('rounds = 1\neta = 0.2\n')
    assert refused(tmp_path, capsys, "--config", str(cfg), *SMALL) == \
        f"{cfg}: eta = 0.2: applies only to --partition dirichlet or writers (got iid)"
    # the file's partition, overridden on the command line: the value is ignored again
    cfg.write_text('rounds = 1\neta = 0.2\npartition = "dirichlet"\n')
    assert "(got iid)" in refused(tmp_path, capsys, "--config", str(cfg), *SMALL, "--partition", "iid")
    # the partition that uses it, and the defaults with any partition: accepted
    assert main(["run", "--config", str(cfg), *SMALL, "--min-size", "2", "--out", str(tmp_path / "d")]) == 0
    saved = json.loads((tmp_path / "d" / "config.json").read_text())
    assert (saved["partition"], saved["eta"], saved["min_size"]) == ("dirichlet", 0.2, 2)
    assert main(["run", *SMALL, "--partition", "shards", "--out", str(tmp_path / "s")]) == 0


def test_a_saved_run_with_an_ignored_partition_setting_still_resumes(tmp_path, capsys):
    """A run folder written before the check (config.json: eta 0.3 with iid) loads and resumes: the
    check is on the settings the user gives, not on a loaded Config."""
    out = str(tmp_path / "old")
    cfg = Config.from_dict({"dataset": "sparse_logistic", "data_opts": {"n": 160, "dim": 8, "nnz": 3},
                            "num_clients": 4, "local_steps": 2, "rounds": 1, "eta": 0.3, "partition": "iid"})
    run_experiment(cfg, out, progress=False, log=lambda *a: None)
    assert main(["run", "--resume", out, "-T", "2", "--no-progress", "--no-plot"]) == 0
    assert json.loads(open(f"{out}/summary.json").read())["rounds_done"] == 2


def test_a_sweep_over_partitions_may_set_eta(tmp_path, capsys):
    """--eta with --grid partition=iid,dirichlet applies to the dirichlet points: not refused here."""
    from python_algos.experiments.cli import build_parser
    from python_algos.experiments.cli.settings import merge_settings

    args = build_parser().parse_args(["sweep", "-a", "fedcanon", "--eta", "0.1", "--grid", "partition=iid,dirichlet"])
    assert merge_settings(args, extra_keys=("algorithms",))["eta"] == 0.1
    args = build_parser().parse_args(["sweep", "-a", "fedcanon", "--eta", "0.1", "--grid", "lr=0.1,0.2"])
    with pytest.raises(ValueError, match=r"--eta 0.1: applies only to --partition dirichlet"):
        merge_settings(args, extra_keys=("algorithms",))


# --- 14: config-file errors ----------------------------------------------------------------------------- #


@pytest.mark.parametrize("command", ["run", "compare"])
def test_missing_config_file_names_the_flag(tmp_path, capsys, command):
    missing = tmp_path / "nonexistent.toml"
    assert refused(tmp_path, capsys, "--config", str(missing), command=command) == f"--config {missing}: no such file"


def test_unknown_config_key_names_the_file(tmp_path, capsys):
    cfg = tmp_path / "c5.toml"
    cfg.write_text("lrr = 3\nrounds = 1\n")
    err = refused(tmp_path, capsys, "--config", str(cfg))
    assert err.startswith(f"{cfg}: unknown key(s) lrr; valid keys: alg_opts, algorithm, "), err
    assert "lr, " in err and "rounds" in err


@pytest.mark.parametrize("name, text", [("c5.toml", 'rounds = "2"\n'), ("c5.json", '{"rounds": "2"}'),
                                        ("c5.yaml", "rounds: '2'\n")])
def test_a_string_in_a_config_file_keeps_its_quotes(tmp_path, capsys, name, text):
    """It used to say 'rounds = 2: must be an integer >= 0', which reads as a contradiction."""
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    cfg = tmp_path / name
    cfg.write_text(text)
    assert refused(tmp_path, capsys, "--config", str(cfg)) == \
        f"{cfg}: rounds = '2': must be an integer >= 0, got a string"
