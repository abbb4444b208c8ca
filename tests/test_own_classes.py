"""A user's own algorithm and penalty, in a module outside the repository, through every way in:
``run`` / ``compare`` / ``sweep`` / ``--seeds`` / a config file (in process), and ``--workers`` and
``--flower`` (real processes), named as ``module:Class``. Ground truth: the one-process ``run``
(float64; ``--workers`` and ``--flower`` to 1e-10), whose prepared run holds the user's classes
with the options given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from python_algos.experiments.cli import main
from python_algos.runfolder.records import load_model, read_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODULE = textwrap.dedent('''
    import dataclasses
    from typing import NamedTuple

    import torch

    import fedkernels as fk
    from python_algos.algorithms.base import Costs, Messages, ServerClientAlgorithm


    class BoundedL1(fk.Regularizer):
        strength_arg = "lam"

        def __init__(self, lam, bound=1.0):
            if not (lam >= 0 and bound > 0):
                raise ValueError(f"BoundedL1 needs lam >= 0 and bound > 0, got {lam}, {bound}")
            self.lam, self.bound = float(lam), float(bound)

        def value(self, x):
            return x.new_full((), float("inf")) if bool((x.abs() > self.bound).any()) else self.lam * x.abs().sum()

        def prox_(self, x, step, *, fast=False):
            return x.copy_(x.abs().sub_(step * self.lam).clamp_(0, self.bound).mul_(x.sign()))

        def prox(self, x, step, *, fast=False):
            return self.prox_(x.clone(), step)

        def __repr__(self):
            return f"BoundedL1(lam={self.lam!r}, bound={self.bound!r})"


    class AvgMState(NamedTuple):
        x: torch.Tensor
        m: torch.Tensor
        t: int
        client_fields = ()


    @dataclasses.dataclass(frozen=True)
    class ProxAvgM(ServerClientAlgorithm):
        lr: float
        local_steps: int
        momentum: float = 0.5
        partial_participation = True

        def costs(self, n):
            return Costs(client_prox=0, server_prox=1, up=1, down=1, grads=self.local_steps)

        def messages(self):
            return Messages(up=("dx",), down=("x",))

        def metric_step(self):
            return self.lr * self.local_steps

        def init(self, x0, clients):
            return AvgMState(clients.new_vector(x0), clients.new_vector(torch.zeros_like(x0)), 0)

        def download(self, state, rng=None):
            return {"x": state.x}

        def client_update(self, state, down, clients, reg, ids):
            k = clients.active_rows(ids)
            X, G = clients.workspace("x", k), clients.workspace("g", k)
            X.copy_(down["x"].expand_as(X))
            for _ in range(self.local_steps):
                clients.gradients_(X, G, ids)
                X.sub_(G, alpha=self.lr)
            return {"dx": X.sub_(down["x"]).neg_()}

        def server_update(self, state, up, down, reg):
            state.m.mul_(self.momentum).add_(up["dx"])
            state.x.sub_(state.m)
            reg.prox_(state.x, self.metric_step())
            return state._replace(t=state.t + 1), {"x": state.x}

        def report(self, state, reg):
            return state.x
''')

COMMON = ["--dataset", "sparse_logistic", "--data-opt", "n=240", "--data-opt", "dim=12", "-N", "3", "-T", "3",
          "-B", "8", "--dtype", "float64", "--executor", "sequential", "--seed", "3", "--no-progress", "--no-plot",
          "--lr", "0.05", "-K", "2"]
OWN = ["-a", "mylab:ProxAvgM", "--alg-opt", "momentum=0.3", "--reg", "mylab:BoundedL1", "--reg-strength", "0.01",
       "--reg-opt", "bound=0.5"]


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """mylab.py in a folder of its own, the current folder (as a user's script folder is)."""
    (tmp_path / "mylab.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("mylab", None)


def _params(folder) -> torch.Tensor:
    return load_model(str(folder))["params"]


def test_run_builds_the_users_classes_with_their_options(lab):
    assert main(["run", *OWN, *COMMON, "--out", "one"]) == 0
    cfg = json.loads((lab / "one" / "config.json").read_text())
    assert cfg["algorithm"] == "mylab:ProxAvgM" and cfg["reg"] == "mylab:BoundedL1"
    from mylab import BoundedL1, ProxAvgM

    from python_algos.experiments.prepare import prepare_run

    prep = prepare_run(None, str(lab / "one"), resume=True)  # the same data, model and x0 as the run
    assert isinstance(prep.algorithm, ProxAvgM) and prep.algorithm.momentum == 0.3
    assert isinstance(prep.reg, BoundedL1) and (prep.reg.lam, prep.reg.bound) == (0.01, 0.5)
    got = _params(lab / "one")
    assert got.dtype == torch.float64 and float(got.abs().max()) <= 0.5  # the bound held
    assert read_summary(str(lab / "one"))["status"] == "completed"


def test_compare_sweep_seeds_and_a_config_file_take_the_classes(lab):
    assert main(["run", *OWN, *COMMON, "--out", "one"]) == 0
    want = _params(lab / "one")
    assert main(["compare", "-a", "mylab:ProxAvgM", "fedmid", "--alg-opt", "mylab:ProxAvgM.momentum=0.3", *OWN[4:],
                 *COMMON, "--out", "cmp"]) == 0
    assert torch.equal(_params(lab / "cmp" / "mylab-ProxAvgM"), want)  # a folder name without the colon
    assert main(["sweep", "-a", "mylab:ProxAvgM", "--grid", "momentum=0.3,0.6", *OWN[2:], *COMMON,
                 "--out", "sw"]) == 0
    summaries = [read_summary(d) for d, _, fs in os.walk(lab / "sw") if "summary.json" in fs and "seed-" in d]
    assert {round(s["hparams"]["momentum"], 6) for s in summaries} == {0.3, 0.6}
    assert main(["run", *OWN, *COMMON, "--seeds", "2", "--out", "seeds"]) == 0
    (lab / "c.toml").write_text('algorithm = "mylab:ProxAvgM"\nreg = "mylab:BoundedL1"\nreg_strength = 0.01\n'
                                '[alg_opts]\nmomentum = 0.3\n[reg_opts]\nbound = 0.5\n')
    assert main(["run", "--config", "c.toml", *COMMON, "--out", "fromfile"]) == 0
    assert torch.equal(_params(lab / "fromfile"), want)


@pytest.mark.parametrize("args,message", [
    (["-a", "mylab:Nope"], "-a mylab:Nope: 'mylab:Nope': module 'mylab' has no attribute 'Nope'"),
    (["-a", "nolab:X"], "cannot import module 'nolab'"),
    (["-a", "mylab:BoundedL1"], "is not a python_algos algorithm"),
    (["-a", "mylab:ProxAvgM", "--alg-opt", "beta=1"], "--alg-opt beta=1: ProxAvgM has no such hyper-parameter"),
    (["-a", "mylab:ProxAvgM", "--alg-opt", "momentum=abc"], "momentum must be a float"),
    (["--reg", "mylab:ProxAvgM"], "is not a fedkernels.Regularizer subclass"),
    (["--reg", "mylab:BoundedL1", "--reg-opt", "cap=1"], "--reg-opt cap=1: mylab:BoundedL1 has no option cap"),
])
def test_a_bad_reference_is_one_line_naming_the_flag_before_anything_is_written(lab, capsys, args, message):
    assert main(["run", *args, *COMMON, "--out", "bad"]) != 0
    assert message in capsys.readouterr().err
    assert not (lab / "bad").exists()


def _cli(args, cwd, timeout=900):
    env = {**os.environ, "TMPDIR": str(cwd), "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    p = subprocess.run([sys.executable, "-m", "python_algos", "run", *args], env=env, cwd=str(cwd),
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]


@pytest.mark.processes
@pytest.mark.slow
def test_workers_and_flower_equal_one_process(tmp_path):
    """The module lies in the command's folder only: every process of --workers and every Flower
    node must import it from there."""
    (tmp_path / "mylab.py").write_text(MODULE)
    _cli([*OWN, *COMMON, "--out", "one"], tmp_path)
    want = _params(tmp_path / "one")
    _cli([*OWN, *COMMON, "--workers", "2", "--out", "two"], tmp_path)
    assert float((_params(tmp_path / "two") - want).abs().max()) <= 1e-10 * (1 + float(want.abs().max()))
    _cli([*OWN, *COMMON, "--flower", "--out", "fl"], tmp_path)
    got = _params(tmp_path / "fl")
    assert got.dtype == torch.float64
    assert float((got - want).abs().max()) <= 1e-10 * (1 + float(want.abs().max()))


def test_an_installed_package_registers_its_algorithm_by_name(lab, capsys):
    """An entry point in the fedkernels.algorithms group (what pip install of a package with
    [project.entry-points."fedkernels.algorithms"] leaves): -a NAME runs it, `algorithms` lists it."""
    info = lab / "mylab_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedkernels.algorithms]\nproxavgm = mylab:ProxAvgM\n")
    assert main(["algorithms"]) == 0
    assert "proxavgm  (mylab:ProxAvgM)" in capsys.readouterr().out
    assert main(["run", "-a", "proxavgm", *OWN[2:], *COMMON, "--out", "plugin"]) == 0
    assert main(["run", *OWN, *COMMON, "--out", "one"]) == 0
    assert torch.equal(_params(lab / "plugin"), _params(lab / "one"))


@pytest.mark.slow
def test_an_optuna_search_over_the_users_own_field(lab):
    pytest.importorskip("optuna")
    assert main(["sweep", "-a", "mylab:ProxAvgM", "--optuna", "2", "--space", "momentum=float:0:0.9", *OWN[4:],
                 *COMMON, "--out", "search"]) == 0
    summaries = [read_summary(d) for d, _, fs in os.walk(lab / "search") if "summary.json" in fs and "seed-" in d]
    assert len(summaries) == 2 and all(s["status"] == "completed" for s in summaries)
    assert all(0 <= s["hparams"]["momentum"] <= 0.9 for s in summaries)
    assert all(os.sep + "mylab-ProxAvgM" + os.sep in d for d, _, fs in os.walk(lab / "search") if "seed-" in d)
