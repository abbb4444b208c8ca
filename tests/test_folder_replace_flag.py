"""`run --replace` / `compare --replace`: the user's way to replace a run in a folder they named.

Ground truth: the files on disk. The old run's marker file and TensorBoard events must be gone, and
the new run's config must be the new settings; without the flag nothing of the old run changes."""

import hashlib
import json
import os

import pytest

from python_algos.experiments.cli import main

TINY = ["--data-opt", "n=120", "--data-opt", "dim=6", "--data-opt", "nnz=2", "-N", "3", "-K", "2", "--rounds", "2",
        "--no-plot",
        "--no-progress"]


def _digest(folder):
    out = {}
    for root, _dirs, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def test_run_into_a_folder_holding_a_run_is_refused_and_names_replace(tmp_path, capsys):
    out = str(tmp_path / "r")
    assert main(["run", "-a", "fedavg", "--out", out, *TINY]) == 0
    before = _digest(out)
    capsys.readouterr()
    assert main(["run", "-a", "fedavg", "--out", out, "--lr", "0.2", *TINY]) == 1
    err = capsys.readouterr().err
    assert "--replace" in err and "already holds a run" in err
    assert _digest(out) == before  # nothing changed


def test_run_replace_leaves_nothing_of_the_old_run(tmp_path):
    out = tmp_path / "r"
    assert main(["run", "-a", "fedavg", "--out", str(out), *TINY]) == 0
    (out / "tensorboard").mkdir(exist_ok=True)
    (out / "tensorboard" / "events.out.tfevents.old").write_bytes(b"old run")
    assert main(["run", "-a", "fedavg", "--out", str(out), "--lr", "0.2", "--replace", *TINY]) == 0
    assert not (out / "tensorboard" / "events.out.tfevents.old").exists()
    assert json.loads((out / "config.json").read_text())["lr"] == 0.2
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def test_replace_without_a_named_folder_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-a", "fedavg", "--replace", *TINY]) == 1
    assert "--replace" in capsys.readouterr().err
    assert not (tmp_path / "results").exists() or not os.listdir(tmp_path / "results")


@pytest.mark.parametrize("command", [["run", "-a", "fedavg"], ["compare", "-a", "fedavg", "fedmid"]])
def test_resume_refuses_replace(tmp_path, command, capsys):
    out = str(tmp_path / "r")
    assert main([*command, "--out", out, *TINY]) == 0
    capsys.readouterr()
    assert main([command[0], "--resume", out, "--replace"]) in (1, 2)
    assert "--replace" in capsys.readouterr().err


def test_compare_replace_replaces_the_comparison(tmp_path):
    out = tmp_path / "c"
    assert main(["compare", "-a", "fedavg", "fedmid", "--out", str(out), *TINY]) == 0
    assert main(["compare", "-a", "fedavg", "--out", str(out), "--replace", *TINY]) == 0
    assert not (out / "fedmid").exists()  # the dropped algorithm's run went with the old comparison
    assert (out / "fedavg" / "summary.json").exists()
