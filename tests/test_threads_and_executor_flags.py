"""The thread policy (``--threads``, python_algos.system.threads) and the ``--executor`` flag
through the run folder: what was chosen is what ran, and is recorded in summary.json."""

import json

import pytest
import torch

from python_algos.experiments.cli import main
from python_algos.system.threads import SMALL_MODEL, choose_threads

TINY = ["--dataset", "sparse_logistic", "--data-opt", "n=200", "--data-opt", "dim=10", "--data-opt", "nnz=3",
        "-N", "4", "-K", "2", "--lr", "0.1", "-T", "3", "--no-progress", "--no-plot"]


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_policy(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpu = torch.device("cpu")
    assert choose_threads(None, SMALL_MODEL - 1, cpu) == 1
    assert choose_threads(None, SMALL_MODEL, cpu) >= 1
    assert choose_threads(None, 10**8, torch.device("cuda")) == 1
    assert choose_threads(3, 10, cpu) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert choose_threads(None, 10, cpu) == 2
    for bad in (0, -1, 1.5, True, "2", 100_000):  # 100000 segfaulted inside OpenMP
        with pytest.raises(ValueError, match="threads must be an int >= 1"):
            choose_threads(bad, 10, cpu)


@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_executor_and_threads_recorded(tmp_path, executor):
    out = tmp_path / executor
    torch.set_num_threads(2)
    assert main(["run", *TINY, "--executor", executor, "--threads", "1", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["executor"] == executor and summary["threads"] == 1
    assert torch.get_num_threads() == 2  # set for the run only (simulate's threads=, issue 38 item 3)


def test_executors_give_the_same_run(tmp_path):
    finals = {}
    for ex in ("sequential", "batched"):
        assert main(["run", *TINY, "--dtype", "float64", "--executor", ex, "--out", str(tmp_path / ex)]) == 0
        finals[ex] = torch.load(tmp_path / ex / "model.pt")["params"]
    assert torch.allclose(finals["batched"], finals["sequential"], rtol=1e-10, atol=1e-12)


def test_bad_executor_flag_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "never"
    with pytest.raises(SystemExit):
        main(["run", *TINY, "--executor", "gpu", "--out", str(out)])
    assert not out.exists()
    assert "--executor" in capsys.readouterr().err
