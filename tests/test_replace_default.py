"""The Python API does not delete a finished run by default (issue 17, item 6): ``run_experiment`` and
``compare_experiments`` into a folder that holds a run refuse, naming ``replace=True`` and the folder,
and leave every byte of it as it was; ``replace=True`` replaces it. Ground truth for "untouched": the
sha256 of every file before the call."""

import pytest
from test_run_folders import folder_state as run_folder_state
from test_run_folders import quiet

from python_algos.experiments.compare import compare_experiments
from python_algos.experiments.config import Config
from python_algos.experiments.run import run_experiment
from python_algos.runfolder.files import RunExistsError, RunFolderError, read_metrics

TINY = dict(algorithm="fedcanon", dataset="sparse_logistic", data_opts={"n": 80, "dim": 6, "nnz": 2},
            num_clients=3, lr=0.1, local_steps=2, rounds=2, batch_size=None, reg="l1", reg_strength=0.01,
            checkpoint_every=1, dtype="float64")


def tiny(**kw) -> Config:
    return Config.from_dict({**TINY, **kw})


def folder_state(path) -> dict:
    return run_folder_state(path, mtime=True)  # same bytes and not rewritten


def test_finished_run_not_touched_by_a_second_run_experiment(tmp_path):
    out = str(tmp_path / "run")
    assert run_experiment(tiny(), out, progress=False, log=quiet)["status"] == "completed"
    before = folder_state(out)
    with pytest.raises(RunExistsError, match=r"already holds a run.*replace=True") as e:
        run_experiment(tiny(rounds=3, seed=7), out, progress=False, log=quiet)
    assert out in str(e.value)
    assert isinstance(e.value, FileExistsError) and isinstance(e.value, RunFolderError)
    assert folder_state(out) == before
    # asked for: replaced
    s = run_experiment(tiny(rounds=3, seed=7), out, progress=False, log=quiet, replace=True)
    assert s["status"] == "completed" and [r["round"] for r in read_metrics(out)] == [0, 1, 2, 3]


def test_finished_comparison_not_touched_by_a_second_compare(tmp_path):
    out = str(tmp_path / "cmp")
    compare_experiments(tiny(), ["fedcanon", "fedavg"], out, progress=False, log=quiet)
    before = folder_state(out)
    with pytest.raises(RunExistsError, match=r"already holds files.*replace=True") as e:
        compare_experiments(tiny(seed=7), ["fedcanon", "fedavg"], out, progress=False, log=quiet)
    assert out in str(e.value)
    assert folder_state(out) == before
    compare_experiments(tiny(seed=7), ["fedcanon", "fedavg"], out, progress=False, log=quiet, replace=True)
    assert folder_state(out) != before


def test_replace_must_be_a_bool(tmp_path):
    out = str(tmp_path / "run")
    run_experiment(tiny(), out, progress=False, log=quiet)
    before = folder_state(out)
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match="replace must be True or False"):
            run_experiment(tiny(seed=7), out, progress=False, log=quiet, replace=bad)
        with pytest.raises(TypeError, match="replace must be True or False"):
            compare_experiments(tiny(seed=7), ["fedcanon"], out, progress=False, log=quiet, replace=bad)
    assert folder_state(out) == before
