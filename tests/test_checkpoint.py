"""Checkpoint / resume: atomic files, every algorithm resumes bit-identically, a real SIGKILL of the
command line mid-run, and divergence keeping the last good checkpoint."""

import json
import os
import pickle
import subprocess
import sys

import pytest
import torch
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms.registry import ALGORITHMS, make
from python_algos.experiments.config import Config
from python_algos.experiments.run import KILL_ENV, run_experiment
from python_algos.runfolder import checkpoint as ckpt
from python_algos.runfolder.callbacks import Checkpoint
from python_algos.runfolder.files import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_problem(seed=0, n_clients=3, n=24, d_in=5):
    g = torch.Generator().manual_seed(seed)
    clients = []
    for i in range(n_clients):
        X = torch.randn(n, d_in, generator=g) + 0.5 * i
        y = torch.randint(0, 3, (n,), generator=g)
        clients.append((X, y))
    return clients


def tiny_model(bn=False):
    torch.manual_seed(1)
    layers = [nn.Linear(5, 8)] + ([nn.BatchNorm1d(8)] if bn else []) + [nn.Tanh(), nn.Linear(8, 3)]
    return nn.Sequential(*layers).double()


def test_encode_decode_namedtuple_states(tmp_path):
    from python_algos.algorithms.fednmap import FedNMapState

    st = FedNMapState(z=torch.randn(4), c=torch.randn(2, 4), d=torch.zeros(2, 4), dbar=torch.ones(4), z_prev=None, t=3)
    snap = {"round": 3, "state": st, "metrics": [{"f": float("nan")}], "nested": [(st, 1)]}
    ckpt.save(tmp_path / "c.pt", snap)
    back = ckpt.load(tmp_path / "c.pt")
    assert type(back["state"]) is FedNMapState and back["state"].t == 3 and back["state"].z_prev is None
    assert torch.equal(back["state"].c, st.c) and type(back["nested"][0][0]) is FedNMapState
    assert back["round"] == 3 and back["extra"] == {}
    # a state class that is not an imported NamedTuple is refused rather than imported
    bad = ckpt.encode({"state": st})
    bad["state"]["__namedtuple__"] = "os:system"
    with pytest.raises(ValueError, match="not an imported NamedTuple"):
        ckpt.decode(bad)


def test_atomic_save_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / "c.pt"
    ckpt.atomic_save({"a": torch.ones(3)}, path)
    # pickle refuses a local lambda with AttributeError (Python < 3.14) or PicklingError
    with pytest.raises((AttributeError, pickle.PicklingError)):
        ckpt.atomic_save({"a": lambda: 0}, path)  # unpicklable: the write fails midway
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))
    assert os.listdir(tmp_path) == ["c.pt"]  # no temp file left behind


class _CtrlCWhilePickled:
    """Presses Ctrl-C (SIGINT to this process) while torch.save is in the middle of the file."""

    def __reduce__(self):
        import collections
        import signal

        os.kill(os.getpid(), signal.SIGINT)
        return collections.OrderedDict, ()


def test_ctrl_c_during_a_write_lets_it_finish_then_interrupts(tmp_path):
    import signal

    path = str(tmp_path / "c.pt")
    ckpt.atomic_save({"round": 1}, path)
    # Python's own Ctrl-C handler, as in a terminal: pytest started with `&` from a script inherits
    # SIGINT ignored, and then there is nothing to hold.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            ckpt.atomic_save({"round": 2, "x": torch.ones(4096), "ctrl_c": _CtrlCWhilePickled(), "y": torch.ones(3)},
                             path)
    finally:
        signal.signal(signal.SIGINT, previous)
    got = torch.load(path, weights_only=True)  # the new file, whole: the interrupt waited for the write
    assert got["round"] == 2 and torch.equal(got["y"], torch.ones(3))
    assert os.listdir(tmp_path) == ["c.pt"]  # no temporary file left


class _SignalWhilePickled:
    """Sends ``signum`` to this process while torch.save is in the middle of the file."""

    def __init__(self, signum):
        self.signum = signum

    def __reduce__(self):
        import collections

        os.kill(os.getpid(), self.signum)
        return collections.OrderedDict, ()


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_during_a_write_lets_it_finish_then_stops(tmp_path, signame):
    """Inside a command (terminate_as_interrupt) SIGTERM/SIGHUP raise Terminated; a write holds them as
    it holds Ctrl-C. Failed before: the signal cut the write and the old file stayed."""
    import signal

    from python_algos.runfolder.signals import Terminated, terminate_as_interrupt

    path = str(tmp_path / "c.pt")
    ckpt.atomic_save({"round": 1}, path)
    signum = getattr(signal, signame)
    with terminate_as_interrupt():
        with pytest.raises(Terminated) as e:
            ckpt.atomic_save({"round": 2, "x": torch.ones(4096), "sig": _SignalWhilePickled(signum),
                              "y": torch.ones(3)}, path)
    assert e.value.signum == signum
    got = torch.load(path, weights_only=True)
    assert got["round"] == 2 and torch.equal(got["y"], torch.ones(3))
    assert os.listdir(tmp_path) == ["c.pt"]


def test_default_sigterm_during_a_write_ends_the_process_after_it(tmp_path):
    """Outside a command's handlers (SIGTERM's default action: die), the process still dies, but
    after the write: the new file is whole."""
    code = ("import collections, os, signal, torch\n"
            "from python_algos.runfolder import checkpoint as ckpt\n"
            "class S:\n"
            "    def __reduce__(self):\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "        return collections.OrderedDict, ()\n"
            f"ckpt.atomic_save({{'round': 2, 's': S(), 'y': torch.ones(3)}}, {str(tmp_path / 'c.pt')!r})\n"
            "print('not reached')\n")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -15 and "not reached" not in p.stdout, (p.returncode, p.stderr)
    got = torch.load(tmp_path / "c.pt", weights_only=True)
    assert got["round"] == 2 and torch.equal(got["y"], torch.ones(3))
    assert os.listdir(tmp_path) == ["c.pt"]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_resume_is_bit_identical_for_every_algorithm(tmp_path, name):
    """Minibatch gradients (client generators) and SCAFFNEW's coin (server generator) included."""
    clients = tiny_problem()
    reg = fk.Zero() if not make(name, lr=0.05, local_steps=2).composite else fk.L1(0.01)
    run = dict(loss_fn=nn.functional.cross_entropy, clients=clients, rounds=6, regularizer=reg, batch_size=7, seed=3)
    alg = make(name, lr=0.05, local_steps=2)
    full = simulate(alg, tiny_model(bn=name == "fedavg"), **run)

    path = tmp_path / "ck.pt"
    saver = ckpt.Checkpointer(path)
    crash = lambda t, state, m: t == 5  # noqa: E731  (the process "dies" during round 5)
    simulate(alg, tiny_model(bn=name == "fedavg"), **run, callbacks=[crash, Checkpoint(saver, 2)])
    assert saver.last_round == 4
    snap = ckpt.load(path)
    assert snap["round"] == 4 and "metrics" not in snap  # the file holds the state, not the history
    resumed = simulate(alg, tiny_model(bn=name == "fedavg"), **run, resume=snap)
    assert torch.equal(resumed.params, full.params)
    assert resumed.series("f+h") == full.series("f+h")[4:]  # the rounds this call ran
    assert [m["round"] for m in resumed.metrics] == [5, 6]
    assert resumed.initial == full.initial
    # the caller hands the history back (the command line reads it from metrics.jsonl): the whole run
    snap = ckpt.load(path)
    resumed = simulate(alg, tiny_model(bn=name == "fedavg"), **run, resume={**snap, "metrics": full.metrics[:4]})
    assert torch.equal(resumed.params, full.params) and resumed.series("f+h") == full.series("f+h")
    assert [m["round"] for m in resumed.metrics] == list(range(1, 7))
    with pytest.raises(ValueError, match="cannot resume"):
        simulate(make(name, lr=0.07, local_steps=2), tiny_model(), **run, resume=snap)


@pytest.mark.parametrize("name", [n for n, e in ALGORITHMS.items() if e.cls.partial_participation])
def test_resume_with_partial_participation(tmp_path, name):
    """The participant sampler's generator is part of the checkpoint too."""
    clients = tiny_problem(n_clients=4)
    run = dict(loss_fn=nn.functional.cross_entropy, clients=clients, rounds=5, batch_size=7, seed=1,
               clients_per_round=2,
               regularizer=fk.L1(0.01) if make(name, lr=0.05, local_steps=2).composite else fk.Zero())
    alg = make(name, lr=0.05, local_steps=2)
    full = simulate(alg, tiny_model(), **run)
    saver = ckpt.Checkpointer(tmp_path / "ck.pt")
    simulate(alg, tiny_model(), **run, callbacks=[lambda t, s, m: t == 4, Checkpoint(saver, 3)])
    snap = ckpt.load(tmp_path / "ck.pt")
    assert snap["round"] == 3 and "participation_rng" in snap["client_rng"]
    resumed = simulate(alg, tiny_model(), **run, resume=snap)
    assert torch.equal(resumed.params, full.params)


def cfg_dict(**kw):
    base = dict(algorithm="fedcanon", dataset="sparse_logistic", data_opts={"n": 160, "dim": 8, "nnz": 3},
                num_clients=4, lr=0.1, local_steps=2, rounds=8, batch_size=10, reg="l1", reg_strength=0.01,
                checkpoint_every=2, dtype="float64")
    base.update(kw)
    return base


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    cfg = Config.from_dict(cfg_dict())
    ref = run_experiment(cfg, str(tmp_path / "ref"), progress=False, log=lambda s: None)
    assert ref["status"] == "completed"

    killed = tmp_path / "killed"
    cfgfile = tmp_path / "cfg.json"
    cfgfile.write_text(json.dumps(cfg_dict()))
    env = {**os.environ, KILL_ENV: "5", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-m", "python_algos", "run", "--config", str(cfgfile), "--out", str(killed)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr  # SIGKILL
    assert not os.path.exists(killed / "summary.json")
    assert [r["round"] for r in read_metrics(killed)] == list(range(6))  # rounds 0..5 logged, 5 not checkpointed
    assert ckpt.load(killed / "checkpoint.pt")["round"] == 4

    env.pop(KILL_ENV)
    p = subprocess.run([sys.executable, "-m", "python_algos", "run", "--resume", str(killed)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "resuming" in p.stdout and "from round 4" in p.stdout
    a = torch.load(tmp_path / "ref" / "model.pt", weights_only=True)
    b = torch.load(killed / "model.pt", weights_only=True)
    assert torch.equal(a["params"], b["params"])  # bit-identical
    ra, rb = read_metrics(tmp_path / "ref"), read_metrics(killed)
    assert [r["round"] for r in rb] == list(range(9))
    assert [r["f+h"] for r in ra] == [r["f+h"] for r in rb]


def test_divergence_stops_and_keeps_last_good_checkpoint(tmp_path):
    cfg = Config.from_dict(cfg_dict(algorithm="fedavg", dataset="sparse_linear", lr=0.3, local_steps=5,
                                    batch_size=None, rounds=40,
                                    reg="zero", checkpoint_every=1, dtype="float32",
                                    data_opts={"n": 160, "dim": 8, "nnz": 3, "shift": 4.0, "num_groups": 4}))
    s = run_experiment(cfg, str(tmp_path / "div"), progress=False, log=lambda s: None)
    assert s["status"] == "diverged", s
    assert "diverged at round" in s["message"] and "last good checkpoint" in s["message"]
    snap = ckpt.load(tmp_path / "div" / "checkpoint.pt")
    assert snap["round"] == s["last_checkpoint_round"] < s["rounds_done"]
    assert torch.isfinite(snap["state"].x).all()
    assert not os.path.exists(tmp_path / "div" / "model.pt")
