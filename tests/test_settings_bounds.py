"""Crashes instead of errors (issue 26, defect 13) and what a flag error says (item 9): every numeric
flag of run / compare / sweep is type-checked and bounded, and a bad value is a one-line error naming
the flag as the user typed it, exit status 2 (unparsable) or 1 (out of bounds), no traceback, nothing
written. An unknown flag is answered with the nearest known one."""

import pytest

from python_algos.data import check_data_options
from python_algos.experiments.cli import build_parser, main
from python_algos.experiments.config import MAX_THREADS, SETTINGS, Config, ConfigError
from python_algos.experiments.values import parse_float, parse_int

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COMMAND_ARGS = {"run": [], "compare": ["-a", "fedcanon"], "sweep": ["-a", "fedcanon", "--grid", "alpha=0.1"]}
NUMERIC = [s for s in SETTINGS.values() if s.parse not in (str, ) and s.parse.__name__ not in ("_text", "parse_option",
                                                                                             "parse_reg_param")]
# the numeric flags that are not settings of one run, and the commands that take them
COMMAND_FLAGS = [("run", "--workers"), ("compare", "--workers"), ("run", "--seeds"), ("compare", "--seeds"),
                 ("sweep", "--seeds"), ("run", "--round-timeout"), ("sweep", "--jobs"), ("sweep", "--optuna")]
BIG_INT, BIG_FLOAT = "1" + "0" * 30, "1e999"  # 1e999 reads as inf


def _cases():
    for s in NUMERIC:
        is_int = s.parse is not parse_float
        for command in COMMAND_ARGS:
            if s.single_run and command != "run":
                continue
            # run: every spelling; compare and sweep (the same flags, their own paths to Config): the long one
            for spelling in s.flags if command == "run" else (s.flag,):
                for bad in ("abc", "-1", BIG_INT if is_int else BIG_FLOAT):
                    yield command, spelling, bad
    for command, flag in COMMAND_FLAGS:
        for bad in ("abc", "-1", BIG_INT):
            yield command, flag, bad


def test_the_audit_covers_every_numeric_setting():
    assert {s.name for s in NUMERIC} == {
        "lr", "local_steps", "test_fraction", "num_clients", "eta", "min_size", "shards_per_client",
        "samples_per_client", "participation",
        "clients_per_round", "reg_strength", "rounds", "batch_size", "seed", "data_seed", "metrics_every",
        "metric_step", "checkpoint_every", "time_budget", "threads"}


@pytest.mark.parametrize("command, flag, bad", list(_cases()))
def test_every_numeric_flag_refuses_a_bad_value_naming_the_flag(tmp_path, capsys, command, flag, bad):
    out = tmp_path / "never"
    try:
        rc = main([command, *COMMAND_ARGS[command], flag, bad, "--out", str(out), "--no-progress"])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc in (1, 2), err
    assert "Traceback" not in err and "error: " in err, err
    line = next(x for x in err.splitlines() if "error: " in x)
    assert f"{flag} " in line or f"argument {flag}:" in line, line
    assert not out.exists()


def test_threads_are_bounded_before_any_thread_starts(tmp_path, capsys):
    """--threads 100000 segfaulted (20000 failed inside libgomp)."""
    with pytest.raises(ConfigError, match=rf"^--threads 100000: must be an integer in \[1, {MAX_THREADS}\]$"):
        Config(threads=100_000).check()
    Config(threads=MAX_THREADS).check()
    assert main(["run", "--threads", "20000", "--out", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err == f"error: --threads 20000: must be an integer in [1, {MAX_THREADS}]\n"
    assert not (tmp_path / "r").exists()


def test_data_options_are_typed_from_the_data_sets_declared_options(tmp_path, capsys):
    """--data-opt n=abc used to fail inside the generator: "'<' not supported between instances of
    'str' and 'int'"."""
    assert main(["run", "--data-opt", "n=abc", "--out", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err == ("error: --data-opt n=abc: n must be an integer in [1, 2147483647] (samples), "
                                       "got 'abc'\n")
    assert check_data_options("synthetic", {"iid": 1}) == ("iid", "iid must be true or false")
    assert check_data_options("image_like", {"shape": [1, 8]})[0] == "shape"
    assert check_data_options("sparse_logistic", {"noise": -1.0})[0] == "noise"
    assert check_data_options("sparse_logistic", {"n": 10**6, "dim": 10**5})[1].startswith(
        "sparse_logistic would generate 100,000,000,000 values")
    assert check_data_options("sparse_logistic", {"n": 160, "dim": 8, "nnz": 3, "noise": 0.1}) is None
    cfg = tmp_path / "c.toml"
    cfg.write_text('[data_opts]\nn = "abc"\n')
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err.startswith(f"error: {cfg}: data_opts = n=abc: n must be an integer")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("algorithm", ["za1", "fedmid", "fedavg", "fedcanon"])
def test_lr_whose_step_is_not_finite_names_lr(tmp_path, capsys, algorithm):
    """--lr 1e308 gave 'step must be finite, got inf', naming no flag (za1, fedmid, fedda, fedavg, ...)."""
    assert main(["run", "-a", algorithm, "--lr", "1e308", "-K", "2", "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --lr 1e+308: lr × local steps = 1e+308 × 2 is not a finite number"), err
    assert not (tmp_path / "r").exists()


def test_int_and_float_texts():
    assert parse_int("12") == 12 and parse_float("1e-3") == 1e-3
    for bad in ("1.5", "1e3", "x", ""):
        with pytest.raises(ValueError, match="must be an integer"):
            parse_int(bad)


# --- item 9: what a flag error tells its user ----------------------------------------------------------- #


@pytest.mark.parametrize("argv, expected", [
    (["run", "--roudns", "3"], "error: unrecognized argument --roudns; did you mean --rounds?"),
    (["run", "--local-stesp=3"], "error: unrecognized argument --local-stesp=3; did you mean --local-steps?"),
    (["compare", "--lrr", "0.1"], "error: unrecognized argument --lrr; did you mean --lr?"),
    (["sweep", "--gird", "lr=0.1"], "error: unrecognized argument --gird; did you mean --grid?"),
    (["run", "--zzzzzz"], "error: unrecognized argument --zzzzzz"),
])
def test_an_unknown_flag_suggests_the_nearest(capsys, argv, expected):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(expected)


@pytest.mark.parametrize("argv, expected", [
    (["-K", "0"], "error: -K 0: must be an integer >= 1\n"),
    (["--local-steps", "0"], "error: --local-steps 0: must be an integer >= 1\n"),
    (["-N", "0"], "error: -N 0: must be an integer >= 1\n"),
    (["-T", "-3"], "error: -T -3: must be an integer >= 0\n"),
    (["--kappa", "-1"], "error: --kappa -1: must be a finite number >= 0\n"),
    (["-a", "nope"], "error: -a nope: unknown algorithm; valid: "),
])
def test_errors_name_the_flag_as_typed(tmp_path, capsys, argv, expected):
    assert main(["run", *argv, "--out", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err.startswith(expected)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv, expected", [
    (["-K", "abc"], "error: -K abc: must be an integer"),
    (["--lr", "abc"], "error: --lr abc: must be a number"),
    (["-B", "0"], "error: -B 0: must be an integer >= 1 (samples per minibatch), or 'full' for full local gradients"),
    (["--alg-opt", "alpha"], "error: --alg-opt alpha: expected KEY=VALUE"),
])
def test_unparsable_values_name_the_flag_as_typed(capsys, argv, expected):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["run", *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(expected[len("error: "):])


def test_an_unknown_config_key_suggests_the_nearest(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("lrr = 3\n")
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {cfg}: unknown key(s) lrr; valid keys: ") and err.endswith("; did you mean lr?\n")
