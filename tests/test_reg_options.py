"""The regularizer of --reg / --reg-strength / --reg-opt (and --reg-param): every option is checked
against the regularizer's own, a penalty's strength has one place (--reg-strength), a constraint
(box, nonneg, l2ball, zero) takes no strength and reads only its options (l2ball: radius=, default 1),
and each refusal names only the flags the user gave, before anything is written. Ground truth: the
fedkernels object built directly."""

import json
import os

import pytest
from torch import nn

import fedkernels as fk
from python_algos.experiments.build import build_per_parameter, build_run_regularizer
from python_algos.experiments.cli import main
from python_algos.experiments.config import Config
from python_algos.runfolder import checkpoint as ckpt

SMALL = ["-a", "fedcanon", "--dataset", "sparse_logistic", "--data-opt", "n=60", "--data-opt", "dim=5",
         "--data-opt", "nnz=2", "-N", "2", "-K", "1", "-T", "1", "--no-progress", "--no-plot"]


def refused(tmp_path, capsys, *flags) -> str:
    """Run the CLI with ``flags``; it must fail before writing the run folder. Returns the error line."""
    out = tmp_path / "run"
    assert main(["run", *SMALL, *flags, "--out", str(out)]) == 1
    assert not out.exists()
    return capsys.readouterr().err.strip()


@pytest.mark.parametrize("flags,expected", [
    (["--reg", "mcp", "--reg-opt", "gama=3"], "error: --reg-opt gama=3: mcp has no option gama; its options: gamma"),
    (["--reg", "scad", "--reg-opt", "gamma=3", "--reg-opt", "b=1"],
     "error: --reg-opt gamma=3 --reg-opt b=1: scad has no option gamma, b; its options: a"),
    (["--reg", "l1", "--reg-opt", "gamma=2"], "error: --reg-opt gamma=2: l1 has no option gamma; it takes no options"),
    (["--reg", "box", "--reg-opt", "radius=2"],
     "error: --reg-opt radius=2: box has no option radius; its options: lo, hi"),
    (["--reg", "l2ball", "--reg-opt", "strength=3"],
     "error: --reg-opt strength=3: l2ball has no option strength; its options: radius"),
])
def test_unknown_reg_opt_is_refused_naming_the_flag(tmp_path, capsys, flags, expected):
    assert refused(tmp_path, capsys, *flags) == expected


def test_unknown_reg_opt_wording_is_that_of_reg_param(tmp_path, capsys):
    """One source of truth: --reg-param words an unknown option the same way (its options add the strength's)."""
    flag = refused(tmp_path, capsys, "--reg", "mcp", "--reg-opt", "gama=3")
    param = refused(tmp_path, capsys, "--reg-param", "*=mcp,gama=3")
    assert flag.split(": ", 2)[2].startswith("mcp has no option gama; its options: ")
    assert param.split(": ", 2)[2].startswith("mcp has no option gama; its options: ")


def test_unknown_reg_opt_in_a_config_file_names_the_file(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('reg = "mcp"\n[reg_opts]\ngama = 3\n')
    assert refused(tmp_path, capsys, "--config", str(cfg)) == \
        f"error: {cfg}: reg_opts = gama=3: mcp has no option gama; its options: gamma"


@pytest.mark.parametrize("reg,key", [("l1", "kappa"), ("elastic_net", "l1"), ("mcp", "lam"), ("scad", "lam"),
                                     ("l1", "strength"), ("mcp", "strength")])
def test_a_penalty_strength_as_reg_opt_is_refused_naming_reg_strength(tmp_path, capsys, reg, key):
    """--reg l1 --reg-opt kappa=0.5 ran with kappa 0.001 (the option dropped); the strength has one place."""
    err = refused(tmp_path, capsys, "--reg", reg, "--reg-opt", f"{key}=0.5")
    assert err == (f"error: --reg-opt {key}=0.5: {key} is {reg}'s strength, which --reg-strength sets: "
                   f"give --reg-strength 0.5 instead")


@pytest.mark.parametrize("reg,hint", [("l2ball", "--reg-opt radius=R"), ("box", "--reg-opt lo=LO --reg-opt hi=HI"),
                                      ("nonneg", "leave --reg-strength out")])
def test_a_strength_given_to_a_constraint_is_refused(tmp_path, capsys, reg, hint):
    err = refused(tmp_path, capsys, "--reg", reg, "--reg-strength", "5")
    assert err.startswith(f"error: --reg-strength 5: {reg} is a constraint and has no strength") and hint in err


def test_zero_takes_any_strength_and_is_no_regularizer():
    """--reg zero is no h: a strength (e.g. shared by an ablation grid over reg=zero,l1) weighs nothing."""
    from python_algos.experiments.build import _flag_regularizer

    assert isinstance(_flag_regularizer("zero", 5.0, {}), fk.Zero)


@pytest.mark.parametrize("cfg,want", [
    (dict(reg="l2ball", reg_opts={"radius": 5}), fk.L2Ball(5.0)),
    (dict(reg="l2ball"), fk.L2Ball(1.0)),  # not --reg-strength's default 1e-3
    (dict(reg="l2ball", reg_strength=0.0, reg_opts={"radius": 0.25}), fk.L2Ball(0.25)),
    (dict(reg="box", reg_opts={"lo": -0.5, "hi": 2}), fk.Box(-0.5, 2.0)),
    (dict(reg="box"), fk.Box(-1.0, 1.0)),
    (dict(reg="nonneg"), fk.NonNeg()),
    (dict(reg="zero", reg_strength=0.0), fk.Zero()),
    (dict(reg="l1", reg_strength=0.5), fk.L1(0.5)),
    (dict(reg="elastic_net", reg_strength=0.2), fk.ElasticNet(0.2, 0.2)),
    (dict(reg="elastic_net", reg_strength=0.2, reg_opts={"l2": 0.7}), fk.ElasticNet(0.2, 0.7)),
    (dict(reg="mcp", reg_strength=0.3, reg_opts={"gamma": 4}), fk.MCP(0.3, 4.0)),
    (dict(reg="scad", reg_strength=0.3, reg_opts={"a": 5}), fk.SCAD(0.3, 5.0)),
])
def test_the_run_regularizer_is_the_one_the_options_name(cfg, want):
    got = build_run_regularizer(Config(**cfg), None)
    assert type(got) is type(want) and repr(got) == repr(want)


@pytest.mark.parametrize("spec,want", [("l2ball", fk.L2Ball(1.0)), ({"reg": "l2ball", "radius": 5}, fk.L2Ball(5.0)),
                                       ({"reg": "box", "lo": 0}, fk.Box(0.0, 1.0)),
                                       ({"reg": "l1", "kappa": 0.5}, fk.L1(0.5)), ("mcp", fk.MCP(1e-3, 3.0))])
def test_reg_param_constraints_read_their_options_not_the_strength(spec, want):
    """--reg-param '*=l2ball' was L2Ball(radius=0.001): the run's --reg-strength (default 1e-3) as its radius."""
    model = nn.Linear(3, 2)
    got = build_per_parameter({"*": spec}, model, default_strength=1e-3)
    assert repr(got) == repr(fk.PerParameter(model, {"*": want}))


@pytest.mark.parametrize("spec", [{"reg": "l2ball", "strength": 2}, {"reg": "box", "strength": 2}])
def test_reg_param_constraint_with_a_strength_is_refused(spec):
    with pytest.raises(ValueError, match=f"{spec['reg']} has no option strength"):
        build_per_parameter({"*": spec}, nn.Linear(3, 2), default_strength=1e-3)


def test_box_error_names_only_the_flags_given(tmp_path, capsys):
    """It echoed --reg-strength 0.001, a flag the user never typed."""
    err = refused(tmp_path, capsys, "--reg", "box", "--reg-opt", "lo=0.2", "--reg-opt", "hi=0.1")
    assert err == "error: --reg-opt lo=0.2 --reg-opt hi=0.1: lo must be <= hi, got lo=0.2 > hi=0.1"


def test_l2ball_radius_reaches_the_run_and_its_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", *SMALL, "--reg", "l2ball", "--reg-opt", "radius=5", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["regularizer"] == repr(fk.L2Ball(5.0))
    assert main(["run", "--resume", str(out), "-T", "2", "--no-progress", "--no-plot"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["regularizer"] == repr(fk.L2Ball(5.0)) and summary["rounds_done"] == 2


def test_a_folder_whose_l2ball_radius_would_change_is_refused(tmp_path, capsys):
    """A folder written before the fix by `--reg l2ball` (config.json: reg_strength 0.001, no radius, no
    format version) ran with radius 0.001; it now means radius 1, so resuming it is refused (its format
    is not this version's: runfolder.records.check_format) and no round is added."""
    out = tmp_path / "run"
    assert main(["run", *SMALL, "--reg", "l2ball", "--reg-opt", "radius=0.001", "--out", str(out)]) == 0
    for path in (out / "config.json",):  # what the old version wrote for `--reg l2ball`
        conf = json.loads(path.read_text())
        conf["reg_opts"] = {}
        del conf["format_version"]
        path.write_text(json.dumps(conf))
    snap = ckpt.load(str(out / "checkpoint.pt"))
    extra = snap.pop("extra")
    extra["config"]["reg_opts"] = {}
    ckpt.save(str(out / "checkpoint.pt"), snap, extra)
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    capsys.readouterr()
    # -T 4: a resume that extends the run would rewrite config.json's rounds, so the refusal must come first
    assert main(["run", "--resume", str(out), "-T", "4", "--no-progress", "--no-plot"]) == 1
    err = capsys.readouterr().err
    assert f"cannot resume {out}: it was written in run-folder format 1, this version continues format" in err
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
