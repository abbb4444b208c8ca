"""Replacing a run leaves nothing of it (issue 26, defect 9: ``replace=True`` kept the old run's
``tensorboard/`` events, so TensorBoard showed the old run beside the new one), and never deletes
what the user put in the folder. Ground truth: the folder listing and the events on disk."""

import os

import pytest

from python_algos.experiments.config import Config
from python_algos.experiments.run import run_experiment
from python_algos.runfolder.files import RunExistsError, RunFolderError, read_metrics
from python_algos.simulate import History

TINY = dict(algorithm="fedcanon", dataset="sparse_logistic", data_opts={"n": 80, "dim": 6, "nnz": 2},
            num_clients=3, lr=0.1, local_steps=2, rounds=2, batch_size=None, reg="l1", reg_strength=0.01,
            checkpoint_every=1, dtype="float64")


def tiny(**kw) -> Config:
    return Config.from_dict({**TINY, **kw})


def quiet(*a, **k):
    pass


def listing(path) -> set:
    return {os.path.relpath(os.path.join(r, f), path) for r, ds, fs in os.walk(path) for f in fs + ds}


def test_replace_removes_the_old_runs_tensorboard_events(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install tensorboard")
    from python_algos.experiments.tensorboard import live_events

    out = str(tmp_path / "run")
    with live_events():  # what --tensorboard does
        run_experiment(tiny(), out, progress=False, log=quiet)
    assert os.listdir(os.path.join(out, "tensorboard"))  # the old run's events
    s = run_experiment(tiny(rounds=3, seed=7), out, progress=False, log=quiet, replace=True)
    assert s["status"] == "completed" and [r["round"] for r in read_metrics(out)] == [0, 1, 2, 3]
    assert not os.path.exists(os.path.join(out, "tensorboard"))  # the new run wrote none


def test_replace_removes_everything_an_old_run_left(tmp_path):
    """Shards of a checkpoint written by several processes, Flower states, figures, a torn temp
    file: all of the old run; none of them may remain beside the new one."""
    out = tmp_path / "run"
    run_experiment(tiny(), str(out), progress=False, log=quiet)
    left = ["checkpoint.pt.shards/round2.rank0-of-2.pt", "flower-nodes/node-0.pt", "flower-points/round-1.pt",
            "overview.png", "overview.pdf", "f_plus_h_vs_round.svg", ".checkpoint.pt.tmp-123", "flower.json"]
    for name in left:
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text("old run")
    run_experiment(tiny(seed=7), str(out), progress=False, log=quiet, replace=True)
    assert listing(out) == {"config.json", "partition.json", "metrics.jsonl", "checkpoint.pt", "summary.json",
                            "model.pt"}


def test_replace_refuses_a_folder_holding_the_users_files(tmp_path):
    out = tmp_path / "run"
    run_experiment(tiny(), str(out), progress=False, log=quiet)
    (out / "notes.txt").write_text("mine")
    (out / "analysis").mkdir()
    before = {p: (out / p).stat().st_mtime_ns for p in listing(out)}
    with pytest.raises(RunFolderError, match=r"analysis, notes\.txt.*no run writes") as e:
        run_experiment(tiny(seed=7), str(out), progress=False, log=quiet, replace=True)
    assert not isinstance(e.value, RunExistsError)
    assert {p: (out / p).stat().st_mtime_ns for p in listing(out)} == before  # nothing changed
    assert (out / "notes.txt").read_text() == "mine"


def test_a_folder_of_the_users_files_without_a_run_is_refused(tmp_path):
    """Issue 36, defect 14: --out of a folder holding the user's files and no run is refused (it used
    to take the run beside them), and nothing in it changes."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "overview.png").write_text("mine too")  # named like a figure, but no run drew it
    with pytest.raises(RunFolderError, match=r"mine holds notes\.txt and no run"):
        run_experiment(tiny(), str(out), progress=False, log=quiet)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "overview.png"]
    assert (out / "notes.txt").read_text() == "mine" and (out / "overview.png").read_text() == "mine too"


def test_history_save_overwrite_keeps_the_users_files(tmp_path):
    """overwrite=True swaps out the whole folder: one holding a file no run writes is refused, and
    the file is kept."""
    out = tmp_path / "run"
    run_experiment(tiny(), str(out), progress=False, log=quiet)
    (out / "notes.txt").write_text("mine")
    hist = History.load(str(out))
    with pytest.raises(FileExistsError, match=r"not a run folder \(notes\.txt\)"):
        hist.save(str(out), overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "checkpoint.pt").is_file()
    (out / "notes.txt").unlink()
    hist.save(str(out), overwrite=True)  # a run folder alone: replaced
    assert not (out / "checkpoint.pt").exists()


def test_replacing_a_comparison_leaves_no_run_of_the_old_one(tmp_path):
    """An algorithm of the old comparison that the new one leaves out must not stay in the folder
    (``plot`` would draw it beside the new runs)."""
    from python_algos.experiments.compare import compare_experiments

    out = tmp_path / "cmp"
    compare_experiments(tiny(), ["fedcanon", "fedavg"], str(out), progress=False, log=quiet)
    (out / "overview.png").write_text("old figure")
    compare_experiments(tiny(seed=7), ["fedcanon"], str(out), progress=False, log=quiet, replace=True)
    assert sorted(os.listdir(out)) == ["comparison.json", "comparison.md", "fedcanon"]


def test_replacing_a_comparison_refuses_a_folder_holding_the_users_files(tmp_path):
    from python_algos.experiments.compare import compare_experiments

    out = tmp_path / "cmp"
    compare_experiments(tiny(), ["fedcanon"], str(out), progress=False, log=quiet)
    (out / "drafts").mkdir()
    (out / "fedcanon" / "notes.txt").write_text("mine")
    before = listing(out)
    with pytest.raises(RunFolderError, match=r"drafts/, fedcanon/.*not its runs"):
        compare_experiments(tiny(seed=7), ["fedcanon"], str(out), progress=False, log=quiet, replace=True)
    assert listing(out) == before and (out / "fedcanon" / "notes.txt").read_text() == "mine"


def test_a_replacement_stopped_midway_leaves_a_folder_that_still_holds_a_run(tmp_path, monkeypatch):
    """The files that mark a run go last: a replacement stopped after its first removals leaves a
    folder that is still a run (refused without replace=True), and the next replacement clears the rest."""
    from python_algos.runfolder.files import holds_run
    from python_algos.runfolder.folder import clear_for_fresh_run

    out = tmp_path / "run"
    run_experiment(tiny(), str(out), progress=False, log=quiet)
    (out / "overview.png").write_text("old figure")
    real, removed = os.remove, []

    def remove(path, *a, **k):
        removed.append(os.path.basename(path))
        if len(removed) == 2:
            raise KeyboardInterrupt  # Ctrl-C between two removals
        real(path, *a, **k)

    monkeypatch.setattr(os, "remove", remove)
    with pytest.raises(KeyboardInterrupt):
        clear_for_fresh_run(str(out), replace=True)
    monkeypatch.setattr(os, "remove", real)
    assert holds_run(str(out)) and removed[0] in ("overview.png", "partition.json", "model.pt")
    clear_for_fresh_run(str(out), replace=True)
    assert os.listdir(out) == []
