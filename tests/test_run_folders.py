"""Run folders as a user meets them: nothing changes before every check has passed, resume refuses a
foreign or edited checkpoint, kills at any write point resume to the bit-identical result, Ctrl-C
leaves a summary and the resume command, and bad input names the flag the user typed.

Ground truth for "bit-identical" is an uninterrupted run of the same config (a separate folder)."""

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from _signals import sigint_as_in_a_terminal

from python_algos.experiments.cli import main
from python_algos.experiments.config import Config
from python_algos.experiments.run import run_experiment
from python_algos.runfolder.files import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(algorithm="fedcanon", dataset="sparse_logistic", data_opts={"n": 160, "dim": 8, "nnz": 3},
            num_clients=4, lr=0.1, local_steps=2, rounds=6, batch_size=10, reg="l1", reg_strength=0.01,
            checkpoint_every=2, dtype="float64")


def tiny(**kw) -> Config:
    return Config.from_dict({**TINY, **kw})


def quiet(*a, **k):
    pass


def folder_state(path, mtime: bool = False) -> dict:
    """name -> sha256 of every file under ``path`` (to prove that nothing changed); with
    ``mtime=True`` also its modification time (nothing was even rewritten with the same bytes)."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            out[os.path.relpath(p, path)] = (digest, os.stat(p).st_mtime_ns) if mtime else digest
    return out


def params_of(run_dir) -> torch.Tensor:
    return torch.load(os.path.join(run_dir, "model.pt"), weights_only=True)["params"]


def env_for_subprocess(**extra):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}
    env.pop("_FEDKERNELS_TEST_KILL_AT_ROUND", None)
    return env


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of TINY (the ground truth of every resume below)."""
    out = str(tmp_path_factory.mktemp("ref") / "ref")
    s = run_experiment(tiny(), out, progress=False, log=quiet)
    assert s["status"] == "completed"
    return out


def write_config(path, **kw):
    path.write_text(json.dumps({**TINY, **kw}))
    return str(path)


# --------------------------------------------------------------------------- #
# 11-13: checks before anything changes; resume against config.json; rounds
# --------------------------------------------------------------------------- #


def test_foreign_checkpoint_changes_nothing(tmp_path, capsys):
    """Item 11/12: another run's checkpoint (other seed) is refused before metrics.jsonl is touched."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run_experiment(tiny(rounds=4), a, progress=False, log=quiet)
    run_experiment(tiny(rounds=4, seed=7), b, progress=False, log=quiet)
    shutil.copy(os.path.join(b, "checkpoint.pt"), os.path.join(a, "checkpoint.pt"))
    before = folder_state(a)
    assert main(["run", "--resume", a, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "seed" in err and "checkpoint" in err
    assert folder_state(a) == before


def test_resume_refuses_edited_config_naming_the_keys(tmp_path, capsys):
    """Item 12: an edited seed / partition / hyper-parameter in config.json is refused, naming each key;
    execution settings (executor, threads, checkpoint_every) may change and the result stays identical."""
    out = str(tmp_path / "r")
    cfgfile = write_config(tmp_path / "c.json", rounds=6)
    assert main(["run", "--config", cfgfile, "--out", out, "--no-progress"]) == 0
    ref = params_of(out)
    os.remove(os.path.join(out, "summary.json"))
    os.remove(os.path.join(out, "model.pt"))
    path = os.path.join(out, "config.json")
    good = json.loads(open(path).read())
    for edit in ({"seed": 3}, {"num_clients": 5, "eta": 0.1}, {"alg_opts": {"alpha": 0.3}}, {"reg_strength": 0.02}):
        with open(path, "w") as f:
            json.dump({**good, **edit}, f)
        before = folder_state(out)
        capsys.readouterr()
        assert main(["run", "--resume", out, "--no-progress"]) == 1
        err = capsys.readouterr().err
        for k in edit:
            assert k in err, (edit, err)
        assert folder_state(out) == before
    with open(path, "w") as f:
        json.dump({**good, "executor": "sequential", "threads": 1, "checkpoint_every": 3}, f)
    assert main(["run", "--resume", out, "--no-progress"]) == 0
    assert torch.equal(params_of(out), ref)


def test_resume_rounds_below_the_checkpoint_is_rejected(tmp_path, capsys):
    """Item 13: --rounds below the checkpoint's round cannot 'resume'; nothing is rewritten."""
    out = str(tmp_path / "r")
    run_experiment(tiny(rounds=6), out, progress=False, log=quiet)
    before = folder_state(out)
    assert main(["run", "--resume", out, "--rounds", "3", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "--rounds 3" in err and "6" in err
    assert folder_state(out) == before
    assert main(["run", "--resume", out, "--rounds", "-1", "--no-progress"]) == 1
    assert folder_state(out) == before


# --------------------------------------------------------------------------- #
# 14: crash consistency
# --------------------------------------------------------------------------- #


class SimulatedKill(BaseException):
    """Raised at a write point: like SIGKILL, no handler of the runner catches it."""


def _kill_at_nth_replace(monkeypatch, n):
    """Make the n-th ``os.replace`` (every atomic write ends in one) 'kill' the process instead."""
    real, calls = os.replace, [0]

    def replace(src, dst, *a, **k):
        calls[0] += 1
        if calls[0] == n:
            raise SimulatedKill(f"killed before replacing {dst}")
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    return calls


def test_kill_at_every_atomic_write_resumes_bit_identically(tmp_path, monkeypatch, reference):
    """Item 14: a kill at each of the run's atomic writes (config, partition, checkpoints, summary,
    model) leaves a folder that `run --resume` completes to the reference result."""
    with monkeypatch.context() as m:
        calls = _kill_at_nth_replace(m, 0)
        run_experiment(tiny(), str(tmp_path / "count"), progress=False, log=quiet)
        total = calls[0]
    assert total >= 6
    for n in range(1, total + 1):
        out = str(tmp_path / f"k{n}")
        with monkeypatch.context() as m:
            _kill_at_nth_replace(m, n)
            with pytest.raises(SimulatedKill):
                run_experiment(tiny(), out, progress=False, log=quiet)
        s = finish(out)
        assert s["status"] == "completed", (n, s)
        assert torch.equal(params_of(out), params_of(reference)), n
        assert [r.get("f+h") for r in read_metrics(out)] == [r.get("f+h") for r in read_metrics(reference)], n
        assert not [f for f in os.listdir(out) if ".tmp-" in f], (n, os.listdir(out))


def test_kill_at_every_write_point_resumes_bit_identically(tmp_path, write_points, reference):
    """Item 14: the runner's own kill points (inside checkpoint writes, in the middle of a metrics
    line, between rounds) and a resumed run killed again: always the reference result."""
    names = write_points.record()
    run_experiment(tiny(), str(tmp_path / "count"), progress=False, log=quiet)
    write_points.off()
    assert {"metrics append", "checkpoint write"} <= set(names), names
    rng = random.Random(0)
    for n in range(1, len(names) + 1):
        out = str(tmp_path / f"k{n}")
        for attempt in range(2):  # kill the first run at point n, then its resume at a random point
            write_points.kill_at(n if attempt == 0 else rng.randint(1, len(names)))
            try:
                finish(out)
            except write_points.Killed:
                pass
        write_points.off()
        s = finish(out)
        assert s["status"] == "completed", (n, names[n - 1], s)
        assert torch.equal(params_of(out), params_of(reference)), (n, names[n - 1])
        rows = read_metrics(out)
        assert [r["round"] for r in rows] == list(range(7)), (n, names[n - 1])
        assert [r.get("f+h") for r in rows] == [r.get("f+h") for r in read_metrics(reference)]
        assert not [f for f in os.listdir(out) if ".tmp-" in f], (n, os.listdir(out))


def finish(out):
    """What a user does after a kill: `run --resume`, or `run` again if no run had started."""
    if not os.path.exists(os.path.join(out, "config.json")):
        if os.path.isdir(out):
            with pytest.raises(ValueError, match="start it again"):
                run_experiment(None, out, resume=True, progress=False, log=quiet)
        return run_experiment(tiny(), out, progress=False, log=quiet, replace=False)
    return run_experiment(None, out, resume=True, progress=False, log=quiet)


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume(tmp_path, reference):
    """Item 14 with real SIGKILLs of the command line at random write points (bounded: 4 kills)."""
    from python_algos.runfolder.faults import KILL_POINT_ENV

    cfgfile = write_config(tmp_path / "c.json")
    rng = random.Random(1)
    for i, n in enumerate(sorted(rng.sample(range(1, 40), 4))):
        out = str(tmp_path / f"k{i}")
        p = subprocess.run([sys.executable, "-m", "python_algos", "run", "--config", cfgfile, "--out", out,
                            "--no-progress"], env=env_for_subprocess(**{KILL_POINT_ENV: str(n)}),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode in (-9, 0), p.stderr
        if not os.path.isdir(out):  # killed before the folder existed: nothing to resume, run again
            continue
        p = subprocess.run([sys.executable, "-m", "python_algos", "run", "--resume", out, "--no-progress"],
                           env=env_for_subprocess(), capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (n, p.stderr)
        assert torch.equal(params_of(out), params_of(reference)), n


# --------------------------------------------------------------------------- #
# 15: Ctrl-C
# --------------------------------------------------------------------------- #


def test_ctrl_c_writes_summary_and_prints_the_resume_command(tmp_path):
    out = str(tmp_path / "r")
    cfgfile = write_config(tmp_path / "c.json", rounds=20000, checkpoint_every=5, batch_size=None)
    p = subprocess.Popen([sys.executable, "-m", "python_algos", "run", "--config", cfgfile, "--out", out],
                         env=env_for_subprocess(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=sigint_as_in_a_terminal)
    try:
        while True:  # wait for the first progress line (round 1 is done), then press Ctrl-C
            line = p.stderr.readline()
            assert line, "the run ended before it printed progress"
            if " round " in line:
                break
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["status"] == "interrupted" and summary["rounds_done"] >= 1
    assert f"python -m python_algos run --resume {out}" in stderr
    last = summary["last_checkpoint_round"]
    assert last is not None and last % 5 == 0
    assert main(["run", "--resume", out, "--rounds", str(last + 2), "--no-progress"]) == 0
    assert [r["round"] for r in read_metrics(out)] == list(range(last + 3))


def test_ctrl_c_between_the_checkpoint_rename_and_its_bookkeeping(tmp_path, monkeypatch, reference):
    """Ctrl-C landing right after a new checkpoint.pt was renamed into place, before the run noted
    it: the summary must name the checkpoint on disk (round 4), where a resume starts, not round 2."""
    from python_algos.experiments.run import Interrupted
    from python_algos.runfolder import checkpoint as ckpt

    real_save = ckpt.save

    def save_then_ctrl_c(path, snapshot, extra=None):
        real_save(path, snapshot, extra)
        if snapshot["round"] == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "save", save_then_ctrl_c)
    out = str(tmp_path / "r")
    with pytest.raises(Interrupted) as e:
        run_experiment(tiny(), out, progress=False, log=quiet)
    monkeypatch.undo()
    assert e.value.summary["last_checkpoint_round"] == 4, e.value.summary["message"]
    assert "the last checkpoint is round 4" in e.value.summary["message"]
    assert main(["run", "--resume", out, "--no-progress", "--no-plot"]) == 0
    assert torch.equal(params_of(out), params_of(reference))


# --------------------------------------------------------------------------- #
# 16-18: input checks, config files, damaged checkpoints
# --------------------------------------------------------------------------- #

SMALL = ["--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt", "nnz=3", "-N", "4", "-K", "2", "-T", "2",
         "--no-progress", "--no-plot"]


@pytest.mark.parametrize("flags, says, never", [
    (["--lr", "-0.1"], ["--lr -0.1"], ["alpha", "-1.0"]),
    (["--lr", "nan"], ["--lr nan"], ["alpha"]),
    (["--participation", "0.5"], ["--participation 0.5", "FedCanon"], []),
    (["--partition", "natural", "-N", "10"], ["--data-opt num_groups=10", "-N 1"], []),
    # MCP(lam=1, gamma=0.5) is rho = 2 weakly convex; FedCanon's alpha = lr*K = 0.6 breaks alpha < 1/rho
    (["-a", "fedcanon", "--reg", "mcp", "--reg-strength", "1", "--reg-opt", "gamma=0.5", "--lr", "0.3"],
     ["--lr 0.3", "alpha"], []),
    (["--alg-opt", "alpha=-2"], ["--alg-opt alpha=-2"], []),
    (["--rounds", "-3"], ["--rounds -3"], []),
    (["--data-opt", "bogus=1"], ["--data-opt", "bogus"], []),
])
def test_bad_input_leaves_no_folder_and_names_the_flag(tmp_path, capsys, flags, says, never):
    """Item 16."""
    out = tmp_path / "r"
    rc = main(["run", *SMALL, *flags, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert not out.exists(), err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for s in says:
        assert s in err, (s, err)
    for s in never:
        assert s not in err, (s, err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_gpu_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", *SMALL, "--device", "cuda", "--out", str(out)]) == 1
    assert "--device cuda" in capsys.readouterr().err and not out.exists()


def test_existing_run_folder_is_not_overwritten(tmp_path, capsys):
    """Item 11: `run --out DIR` onto a finished run refuses (and suggests --resume) instead of
    deleting its metrics."""
    out = str(tmp_path / "r")
    assert main(["run", *SMALL, "--out", out]) == 0
    before = folder_state(out)
    assert main(["run", *SMALL, "--seed", "3", "--out", out]) == 1
    assert "--resume" in capsys.readouterr().err and folder_state(out) == before


def test_config_file_values_are_type_checked(tmp_path, capsys):
    """Item 17: `lr = "fast"` is refused naming the file and key (it used to print 'fastfast…')."""
    cfg = tmp_path / "exp.toml"
    cfg.write_text('lr = "fast"\nrounds = 2\n')
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert "exp.toml" in err and "lr = 'fast'" in err and "number" in err and "fastfast" not in err
    assert not (tmp_path / "r").exists()
    cfg.write_text('rounds = 2.5\n')
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 1
    assert "rounds = 2.5" in capsys.readouterr().err
    cfg.write_text('rounds = 2\nnum_clients = 4\nalg_opts = "x"\n')
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 1
    assert "alg_opts" in capsys.readouterr().err


@pytest.mark.parametrize("ext, text, line", [
    (".yaml", "algorithm: fedcanon\nrounds: [2\nlr: 0.1\n", 3),
    (".toml", "algorithm = 'fedcanon'\nrounds = = 2\n", 2),
    (".json", '{"algorithm": "fedcanon",\n "rounds": }\n', 2),
])
def test_malformed_config_file_is_one_line_naming_file_and_line(tmp_path, capsys, ext, text, line):
    """Item 17."""
    if ext == ".yaml":
        pytest.importorskip("yaml")
    cfg = tmp_path / f"exp{ext}"
    cfg.write_text(text)
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(cfg) in err and f"line {line}" in err, err


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "not_a_checkpoint"])
def test_damaged_checkpoint_gives_a_clear_message(tmp_path, capsys, damage):
    """Item 18: never the advice to load with weights_only=False; nothing else changes."""
    out = str(tmp_path / "r")
    run_experiment(tiny(rounds=4), out, progress=False, log=quiet)
    os.remove(os.path.join(out, "summary.json"))
    path = os.path.join(out, "checkpoint.pt")
    data = open(path, "rb").read()
    blob = {"truncate": data[: len(data) // 2], "garbage": os.urandom(300), "empty": b""}.get(damage)
    if blob is None:
        torch.save({"x": torch.ones(2)}, path)
    else:
        with open(path, "wb") as f:
            f.write(blob)
    before = folder_state(out)
    assert main(["run", "--resume", out, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "checkpoint.pt" in err and "weights_only" not in err and err.count("\n") == 1, err
    assert folder_state(out) == before


# --------------------------------------------------------------------------- #
# 19: plot / compare
# --------------------------------------------------------------------------- #


def test_plot_unknown_metric_fails_listing_the_metrics(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = str(tmp_path / "r")
    run_experiment(tiny(rounds=2), out, progress=False, log=quiet)
    assert main(["plot", out, "--metrics", "bogus", "--out", str(tmp_path / "figs")]) == 1
    err = capsys.readouterr().err
    assert "bogus" in err and "f+h" in err and "sparsity" in err
    assert not (tmp_path / "figs").exists()


def test_compare_with_an_invalid_algorithm_fails_before_writing(tmp_path, capsys):
    out = tmp_path / "cmp"
    # MCP(lam=1, gamma=0.5) is rho = 2 weakly convex: FedCanon's alpha = lr*K = 0.8 breaks alpha < 1/rho
    rc = main(["compare", "-a", "fedavg", "fedcanon", *SMALL, "--lr", "0.4", "--reg", "mcp", "--reg-strength", "1",
               "--reg-opt", "gamma=0.5", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and "fedcanon" in err.lower() and "alpha" in err, err
    assert not out.exists()


def test_compare_resume_finishes_an_interrupted_comparison(tmp_path, capsys):
    ref, out = str(tmp_path / "ref"), str(tmp_path / "cmp")
    args = ["compare", "-a", "fedcanon", "fedmid", *SMALL, "-T", "4", "-B", "10", "--checkpoint-every", "2"]
    assert main([*args, "--out", ref]) == 0
    assert main([*args, "--out", out]) == 0
    # fedmid was "killed" after its round-2 checkpoint: no summary, no model, rows past round 2 torn
    for f in ("summary.json", "model.pt", "comparison.md"):
        p = os.path.join(out, "fedmid" if f != "comparison.md" else "", f)
        if os.path.exists(p):
            os.remove(p)
    import python_algos.runfolder.checkpoint as ckpt

    snap = ckpt.load(os.path.join(ref, "fedmid", "checkpoint.pt"))
    assert snap["round"] == 4
    done = folder_state(os.path.join(out, "fedcanon"))
    assert main(["compare", "--resume", out, "--no-progress"]) == 0
    assert folder_state(os.path.join(out, "fedcanon")) == done  # a finished run is not run again
    for name in ("fedcanon", "fedmid"):
        assert torch.equal(params_of(os.path.join(out, name)), params_of(os.path.join(ref, name)))
    assert os.path.exists(os.path.join(out, "comparison.md"))
    capsys.readouterr()
    assert main(["compare", "--resume", out, "--lr", "0.3"]) == 1  # settings come from the folder
    assert "error: --resume takes its settings from" in capsys.readouterr().err


# --------------------------------------------------------------------------- #
# 20: the project's own algorithm reference
# --------------------------------------------------------------------------- #


def _shipped_files():
    for top in ("python_algos", "README.md"):
        path = os.path.join(ROOT, top)
        if os.path.isfile(path):
            yield path
        for root, _, files in os.walk(path):
            for f in files:
                if f.endswith((".py", ".md", ".txt", ".toml")):
                    yield os.path.join(root, f)


def test_no_shipped_file_cites_the_internal_spec():
    offenders = [os.path.relpath(p, ROOT) for p in _shipped_files() if "ALGORITHMS.md" in open(p).read()]
    assert offenders == []


def test_algorithm_reference_covers_every_algorithm_and_every_cited_section():
    import re

    from python_algos.algorithms.registry import ALGORITHMS, make

    doc = open(os.path.join(ROOT, "docs", "algorithms.md")).read()
    sections = set(re.findall(r"^#+ (§[\d.]+)", doc, flags=re.M))
    for key in ALGORITHMS:
        alg = make(key, lr=0.01, local_steps=2)
        cited = re.findall(r"§[\d.]+", alg.spec)
        assert cited and set(cited) <= sections, (key, alg.spec)
        assert alg.name in doc, key
    for p in _shipped_files():
        for ref in re.findall(r"docs/algorithms\.md ((?:§[\d.]+(?:[,/ ]+|$))+)", open(p).read()):
            for s in re.findall(r"§[\d.]+", ref):
                assert s.rstrip(".") in sections, (p, s)
