"""A refused hyper-parameter or regularizer option names the flag whose value breaks the rule, found by
checking each flag's value alone over the defaults, never by looking for option names in the error's
text: an option whose name the rule mentions, but whose value is fine, is not named."""

import pytest
from torch import nn

from python_algos.experiments.build import build_per_parameter
from python_algos.experiments.cli import main
from python_algos.experiments.config import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["--dataset", "sparse_logistic", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt", "nnz=3",
         "-N", "4", "-K", "2", "-T", "1", "--no-progress", "--no-plot"]


def refused(tmp_path, *argv, capsys) -> str:
    """The one-line error of ``run argv`` (asserting rc 1 and that no folder was written)."""
    out = tmp_path / "r"
    rc = main(["run", *SMALL, *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert not out.exists(), err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err[len("error: "):].rstrip("\n")


def test_the_option_at_fault_is_named_not_the_one_the_rule_mentions(tmp_path, capsys):
    """DEPOSITUM's prox-step rule reads 'alpha < 1/rho, or alpha*gamma < 1/rho ...': with MCP's rho = 2,
    alpha = 0.9 breaks it, and gamma = 0.5 (fine: the step is alpha alone) was named too when the
    flags were found by searching the message for the options' names."""
    err = refused(tmp_path, "-a", "depositum", "--reg", "mcp", "--reg-strength", "1", "--reg-opt", "gamma=0.5",
                  "--alg-opt", "alpha=0.9", "--alg-opt", "gamma=0.5", capsys=capsys)
    named, rule = err.split(": ", 1)
    assert named == "--alg-opt alpha=0.9", err
    assert "alpha*gamma" in rule and "step * rho = 1.8" in rule, err


@pytest.mark.parametrize("opts, named", [
    # each option's own check fails: that option alone, whatever else was given
    (["lam=-1", "downlink=z"], "--alg-opt lam=-1: lam must be a finite number > 0, got -1"),
    (["downlink=z", "eta=-2"], "--alg-opt eta=-2: eta must be a finite number > 0, got -2"),
    # a rule between two options: both (each fine alone), not the third
    (["downlink=z", "c_update_at=round_end", "lam=0.5"], "--alg-opt downlink=z c_update_at=round_end: "),
])
def test_fednmap_options_each_checked_alone_then_together(tmp_path, capsys, opts, named):
    argv = [a for o in opts for a in ("--alg-opt", o)]
    err = refused(tmp_path, "-a", "fednmap", *argv, capsys=capsys)
    assert err.startswith(named), err


def test_the_lr_mapping_is_named_when_its_values_break_the_rule(tmp_path, capsys):
    """--alg-opt beta (fine) with an --lr whose alpha = lr * K breaks the prox-step rule: the --lr
    mapping is at fault, and the option given is not named."""
    err = refused(tmp_path, "--reg", "mcp", "--reg-strength", "1", "--reg-opt", "gamma=0.5", "--lr", "0.3",
                  "--alg-opt", "beta=0.01", capsys=capsys)
    assert err.startswith("--lr 0.3 with --local-steps 2 sets FedCanon's alpha = 0.6 ("), err
    assert "beta=0.01" not in err, err


def test_many_local_steps_still_name_the_option(tmp_path, capsys):
    """With -K 100 the default --lr's alpha = 0.05 * 100 breaks MCP's rule too: the option is checked
    over the user's own (passing) --lr mapping instead, and named alone."""
    err = refused(tmp_path, "-K", "100", "--lr", "0.001", "--reg", "mcp", "--reg-strength", "1", "--reg-opt",
                  "gamma=0.5", "--alg-opt", "alpha=0.9", capsys=capsys)
    assert err.startswith("--alg-opt alpha=0.9: FedCanon: alpha = 0.9 violates"), err


def test_an_option_from_a_config_file_is_named_by_its_file_and_key(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('algorithm = "fednmap"\nalg_opts = {lam = -1, downlink = "z"}\n')
    err = refused(tmp_path, "--config", str(cfg), capsys=capsys)
    assert err == f"{cfg}: alg_opts = lam=-1: lam must be a finite number > 0, got -1", err


@pytest.mark.parametrize("flags, expected", [
    # lo alone breaks lo <= hi against hi's default 1
    (["--reg", "box", "--reg-opt", "lo=2"], "--reg-opt lo=2: lo must be <= hi, got lo=2.0 > hi=1.0"),
    (["--reg", "box", "--reg-opt", "hi=5", "--reg-opt", "lo=2"], None),
    # l2's own check, with a strength given: the option alone
    (["--reg", "elastic_net", "--reg-strength", "0.1", "--reg-opt", "l2=-1"], "--reg-opt l2=-1: l2 must be >= 0"),
    (["--reg", "mcp", "--reg-strength", "0.1", "--reg-opt", "gamma=-1"], "--reg-opt gamma=-1: gamma must be > 0"),
])
def test_reg_opts_each_checked_alone(tmp_path, capsys, flags, expected):
    if expected is None:  # lo = 2 is fine with the hi given
        assert main(["run", *SMALL, *flags, "--out", str(tmp_path / "r")]) == 0
        return
    err = refused(tmp_path, *flags, capsys=capsys)
    assert err.startswith(expected), err


def test_per_parameter_entries_at_fault():
    """A pattern that matches nothing is named alone; a pattern shadowed by an earlier one is a rule
    between the two, and both are named, the entry that matches nothing of its own (exact) is not."""
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    with pytest.raises(ConfigError) as e:
        build_per_parameter({"*": "l1", "nope": "l1", "1.bias": "none"}, model)
    assert str(e.value).startswith("--reg-param nope=l1: regularizer key 'nope' matches no parameter"), e.value
    with pytest.raises(ConfigError) as e:
        build_per_parameter({"1.bias": "none", "*": "l1", "0.*": "l1"}, model)
    assert str(e.value).startswith("--reg-param *=l1 --reg-param 0.*=l1: regularizer key '0.*' decides no "
                                   "parameter"), e.value
