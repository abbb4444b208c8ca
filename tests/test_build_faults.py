"""A refused hyper-parameter or regularizer option names the flag whose value breaks the rule, read from
the error itself: every check of the algorithms and of the penalties' constructors raises
``fk.ParameterError`` (``fk.ParameterTypeError``) whose ``fields`` name the field(s) whose values break
the rule, and the command line maps each field to the flag that set it (never by searching the error's
text: an option whose name the rule mentions, but whose value is fine, is not named; never by trying
values: the message is the one the user's own values raise, checked here against the rule computed in
the test). An error that names no field (a user's class raising a plain ValueError) names every option
given."""

from __future__ import annotations

import dataclasses
import itertools
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn

import fedkernels as fk
from python_algos.algorithms.registry import ALGORITHMS
from python_algos.experiments.build import build_per_parameter
from python_algos.experiments.cli import main
from python_algos.experiments.config import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["--dataset", "sparse_logistic", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt", "nnz=3",
         "-N", "4", "-K", "2", "-T", "1", "--no-progress", "--no-plot"]
MCP = ["--reg", "mcp", "--reg-strength", "1", "--reg-opt", "gamma=0.5"]  # rho = 1/gamma = 2


def refused(tmp_path, capsys, *argv) -> str:
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
    err = refused(tmp_path, capsys, "-a", "depositum", "--reg", "mcp", "--reg-strength", "1", "--reg-opt", "gamma=0.5",
                  "--alg-opt", "alpha=0.9", "--alg-opt", "gamma=0.5")
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
def test_fednmap_options_named_by_their_rule(tmp_path, capsys, opts, named):
    argv = [a for o in opts for a in ("--alg-opt", o)]
    err = refused(tmp_path, capsys, "-a", "fednmap", *argv)
    assert err.startswith(named), err


def test_the_lr_mapping_is_named_when_its_values_break_the_rule(tmp_path, capsys):
    """--alg-opt beta (fine) with an --lr whose alpha = lr * K breaks the prox-step rule: the --lr
    mapping is at fault, and the option given is not named."""
    err = refused(tmp_path, capsys, "--reg", "mcp", "--reg-strength", "1", "--reg-opt", "gamma=0.5", "--lr", "0.3",
                  "--alg-opt", "beta=0.01")
    assert err.startswith("--lr 0.3 with --local-steps 2 sets FedCanon's alpha = 0.6 ("), err
    assert "beta=0.01" not in err, err


def test_many_local_steps_still_name_the_option(tmp_path, capsys):
    """With -K 100 the default --lr's alpha = 0.05 * 100 would break MCP's rule too, but the alpha checked
    is the user's --alg-opt: it is named alone."""
    err = refused(tmp_path, capsys, "-K", "100", "--lr", "0.001", "--reg", "mcp", "--reg-strength", "1", "--reg-opt",
                  "gamma=0.5", "--alg-opt", "alpha=0.9")
    assert err.startswith("--alg-opt alpha=0.9: FedCanon: alpha = 0.9 violates"), err


def test_an_option_from_a_config_file_is_named_by_its_file_and_key(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('algorithm = "fednmap"\nalg_opts = {lam = -1, downlink = "z"}\n')
    err = refused(tmp_path, capsys, "--config", str(cfg))
    assert err == f"{cfg}: alg_opts = lam=-1: lam must be a finite number > 0, got -1", err


@pytest.mark.parametrize("flags, expected", [
    # lo alone breaks lo <= hi against hi's default 1
    (["--reg", "box", "--reg-opt", "lo=2"], "--reg-opt lo=2: lo must be <= hi, got lo=2.0 > hi=1.0"),
    (["--reg", "box", "--reg-opt", "hi=5", "--reg-opt", "lo=2"], None),
    # l2's own check, with a strength given: the option alone
    (["--reg", "elastic_net", "--reg-strength", "0.1", "--reg-opt", "l2=-1"], "--reg-opt l2=-1: l2 must be >= 0"),
    (["--reg", "mcp", "--reg-strength", "0.1", "--reg-opt", "gamma=-1"], "--reg-opt gamma=-1: gamma must be > 0"),
])
def test_reg_opts_named_by_their_rule(tmp_path, capsys, flags, expected):
    if expected is None:  # lo = 2 is fine with the hi given
        assert main(["run", *SMALL, *flags, "--out", str(tmp_path / "r")]) == 0
        return
    err = refused(tmp_path, capsys, *flags)
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


def test_a_rule_between_two_options_names_both_with_their_values(tmp_path, capsys):
    """FedMiD's server step lr_server * lr_client * K: lr_client = 0.4 breaks it alone (with lr_server's
    mapped 1), and lr_server = 2 with it; the step is 2 * 0.4 * 2 = 1.6. Found by trial, only lr_client
    was named, with the trial's step 0.8 instead of the user's."""
    err = refused(tmp_path, capsys, "-a", "fedmid", *MCP, "--alg-opt", "lr_client=0.4", "--alg-opt", "lr_server=2")
    step = 2 * 0.4 * 2
    assert err.startswith(f"--alg-opt lr_client=0.4 lr_server=2 with --local-steps 2: FedMiD: lr_server*lr_client*K "
                          f"(server prox step) = {step:g} violates "), err
    assert f"got step * rho = {step * 2:g}." in err, err


def test_the_error_shown_is_the_one_the_given_values_raise(tmp_path, capsys):
    """FedProx with server_prox=true and server_prox_step=0.6 breaks the prox-step rule (0.6 * 2 >= 1).
    Found by trial, the message was that of server_prox_step tried without server_prox ('only used with
    server_prox=True'), which the user's values do not raise."""
    err = refused(tmp_path, capsys, "-a", "fedprox", *MCP, "--alg-opt", "server_prox=true",
                  "--alg-opt", "server_prox_step=0.6")
    assert err.startswith("--alg-opt server_prox=true server_prox_step=0.6: FedProx: server_prox_step (server prox "
                          "step s) = 0.6 violates s < 1/rho"), err
    assert "got step * rho = 1.2." in err and "only used with" not in err, err


def test_the_lr_mapping_and_an_option_of_one_rule_are_named_together(tmp_path, capsys):
    """FedProx's server step defaults to lr_local * K, set by --lr: the mapping and server_prox=true
    (which turns the step on) are both named."""
    err = refused(tmp_path, capsys, "-a", "fedprox", *MCP, "--alg-opt", "server_prox=true", "--lr", "0.3")
    assert err.startswith("--lr 0.3 with --local-steps 2 sets FedProx's lr_local = 0.3 (see `python -m python_algos "
                          "algorithms`; override with --alg-opt), with --alg-opt server_prox=true: FedProx: "
                          "server_prox_step (server prox step s) = 0.6 violates"), err


@pytest.mark.parametrize("flags, expected", [
    # lo > hi with both given: both named, and the message holds the given hi (a trial used hi's default 1)
    (["--reg", "box", "--reg-opt", "lo=3", "--reg-opt", "hi=2"],
     "--reg-opt lo=3 --reg-opt hi=2: lo must be <= hi, got lo=3.0 > hi=2.0"),
    # hi alone against lo's default: hi only
    (["--reg", "box", "--reg-opt", "hi=-5"], "--reg-opt hi=-5: lo must be <= hi, got lo=-1.0 > hi=-5.0"),
    # the strength is --reg-strength's (MCP's lam), an option is its --reg-opt
    (["--reg", "scad", "--reg-strength", "0", "--reg-opt", "a=3"], "--reg-strength 0: lam must be > 0, got 0.0"),
    (["--reg", "scad", "--reg-strength", "0.1", "--reg-opt", "a=1"], "--reg-opt a=1: a must be > 2 for SCAD, got 1.0"),
])
def test_regularizer_fields_map_to_their_flags(tmp_path, capsys, flags, expected):
    assert refused(tmp_path, capsys, *flags) == expected


def test_per_parameter_keys_named_by_the_error():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    with pytest.raises(fk.ParameterError) as e:
        fk.PerParameter(model, {"1.bias": None, "*": fk.L1(0.1), "0.*": fk.L1(0.1)})
    assert e.value.fields == ("0.*", "*"), e.value  # the shadowed key and the one that shadows it
    with pytest.raises(fk.ParameterError) as e:
        fk.PerParameter(model, {"*": fk.L1(0.1), "nope": fk.L1(0.1)})
    assert e.value.fields == ("nope",), e.value


# ------------------------------------------------------------------------------------------------ #
# Every built-in check names its field(s)
# ------------------------------------------------------------------------------------------------ #

BAD_VALUES = (-1, 0, 0.0, 2, 2.5, 1e9, float("nan"), float("inf"), "x", None, True, (1, 2))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_refused_hyper_parameter_names_its_field(name):
    """Each field of each built-in algorithm set to each of a few bad values: a refusal is a
    ParameterError naming that field (a rule between fields: that field among them)."""
    entry = ALGORITHMS[name]
    base = entry.from_lr(0.05, 2)
    entry.cls(**base)  # the mapped values pass
    refused = 0
    for f, v in itertools.product([f.name for f in dataclasses.fields(entry.cls) if f.init], BAD_VALUES):
        try:
            entry.cls(**{**base, f: v})
        except (ValueError, TypeError) as e:
            refused += 1
            assert isinstance(e, (fk.ParameterError, fk.ParameterTypeError)), (f, v, e)
            assert f in e.fields, (f, v, e.fields, e)
    assert refused > 0


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_prox_step_rule_names_the_fields_of_its_step(name):
    """A weakly convex h whose rho makes every step too large: each refusal names fields of the algorithm,
    and making the fields named small lets that rule pass (so the fields named are those that make the
    step): after at most one round per rule, validate passes."""
    entry = ALGORITHMS[name]
    reg = fk.MCP(1.0, gamma=0.01)  # rho = 100
    fields = {f.name for f in dataclasses.fields(entry.cls)}
    values = entry.from_lr(0.9, 2)
    for _ in range(4):  # one rule per step (FedMiD, ZA1, Prox-FedAvg check two)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the smooth methods warn and check no step
                entry.cls(**values).validate(reg)
            return
        except ValueError as e:
            assert isinstance(e, fk.ParameterError), e
            assert e.fields and set(e.fields) <= fields, e.fields
            small = {k: 1 if isinstance(values.get(k), int) else 1e-6 for k in e.fields
                     if isinstance(values.get(k), (int, float))}
            assert any(values.get(k) != v for k, v in small.items()), (e.fields, values)  # named, not yet made small
            values.update(small)
    raise AssertionError(f"{name}: the steps still break the rule with every field named made small: {values}")


@pytest.mark.parametrize("make, fields, kind", [
    (lambda: fk.L1(-1), ("kappa",), fk.ParameterError),
    (lambda: fk.L1("a"), ("kappa",), fk.ParameterTypeError),
    (lambda: fk.ElasticNet(0.1, -1), ("l2",), fk.ParameterError),
    (lambda: fk.MCP(0.1, gamma=0), ("gamma",), fk.ParameterError),
    (lambda: fk.MCP(float("inf")), ("lam",), fk.ParameterError),
    (lambda: fk.SCAD(0.1, a=2), ("a",), fk.ParameterError),
    (lambda: fk.Box(3, 2), ("lo", "hi"), fk.ParameterError),
    (lambda: fk.Box(float("nan"), 2), ("lo",), fk.ParameterError),
    (lambda: fk.Box(torch.ones(3), torch.zeros(3)), ("lo", "hi"), fk.ParameterError),
    (lambda: fk.L2Ball(-1), ("radius",), fk.ParameterError),
    (lambda: fk.GroupLasso(0.1, groups="diag"), ("groups",), fk.ParameterError),
    (lambda: fk.Scaled(-1, fk.L1(0.1)), ("kappa",), fk.ParameterError),
])
def test_every_refused_penalty_parameter_names_its_argument(make, fields, kind):
    with pytest.raises(kind) as e:
        make()
    assert e.value.fields == fields, e.value
    assert isinstance(e.value, ValueError if kind is fk.ParameterError else TypeError)


# ------------------------------------------------------------------------------------------------ #
# A user's own class
# ------------------------------------------------------------------------------------------------ #

MODULE = textwrap.dedent('''
    import dataclasses

    import fedkernels as fk
    from python_algos.algorithms.scaffnew import SCAFFNEW


    @dataclasses.dataclass(frozen=True)
    class Plain(SCAFFNEW):
        """SCAFFNEW with a rule of its own on two extra fields, raised as a plain ValueError."""
        name = "Plain"
        p: float = 0.5
        a: float = 0.1
        b: float = 0.1

        def __post_init__(self):
            super().__post_init__()
            if self.a * self.b > 1:
                raise ValueError(f"a * b must be <= 1, got {self.a * self.b:g}")


    @dataclasses.dataclass(frozen=True)
    class Named(Plain):
        """The same rule, raised naming the field at fault."""

        def __post_init__(self):
            SCAFFNEW.__post_init__(self)
            if self.a * self.b > 1:
                raise fk.ParameterError(f"a * b must be <= 1, got {self.a * self.b:g}", "b")


    class Capped(fk.L1):
        """kappa * |u|, refusing a cap below kappa: plainly, or naming the argument (named=True)."""
        strength_arg = "kappa"

        def __init__(self, kappa, cap=1.0, named=False):
            if cap < kappa:
                message = f"cap must be >= kappa, got cap={cap:g} < kappa={kappa:g}"
                raise fk.ParameterError(message, "cap") if named else ValueError(message)
            super().__init__(kappa)
''')


@pytest.fixture
def lab(tmp_path, monkeypatch):
    (tmp_path / "errlab.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("errlab", None)


@pytest.mark.parametrize("lr, named", [
    # lr is set by --lr's mapping (a user's class: its field lr)
    ([], "--lr 0.05 with --local-steps 2 sets Plain's lr = 0.05 (see `python -m python_algos algorithms`; override "
         "with --alg-opt), with --alg-opt a=2 b=3"),
    (["--alg-opt", "lr=0.1"], "--alg-opt a=2 b=3 lr=0.1"),
])
def test_a_users_plain_value_error_names_every_option_given(lab, tmp_path, capsys, lr, named):
    err = refused(tmp_path, capsys, "-a", "errlab:Plain", "--alg-opt", "a=2", "--alg-opt", "b=3", *lr)
    assert err == f"{named}: a * b must be <= 1, got 6", err


def test_a_users_parameter_error_names_its_field(lab, tmp_path, capsys):
    err = refused(tmp_path, capsys, "-a", "errlab:Named", "--alg-opt", "a=2", "--alg-opt", "b=3")
    assert err == "--alg-opt b=3: a * b must be <= 1, got 6", err


@pytest.mark.parametrize("named, expected", [
    ("false", "--reg-strength 0.5 --reg-opt cap=0.2 --reg-opt named=false"),  # a plain ValueError: every flag given
    ("true", "--reg-opt cap=0.2"),
])
def test_a_users_penalty_error_names_its_flags(lab, tmp_path, capsys, named, expected):
    err = refused(tmp_path, capsys, "--reg", "errlab:Capped", "--reg-strength", "0.5", "--reg-opt", "cap=0.2",
                  "--reg-opt", f"named={named}")
    assert err == f"{expected}: cap must be >= kappa, got cap=0.2 < kappa=0.5", err
