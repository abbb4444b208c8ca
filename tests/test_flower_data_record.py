"""Issue 36, defects 5 and 6: the data the Flower nodes hold is part of the run's record.

5: after the data file changed, ``run --resume DIR --flower`` is refused, naming the data, as the
   one-process resume of the same folder is (it used to continue, its model from the nodes' old rows
   and its metrics from the new file).
6: ``--data-opt file=d.txt`` relative to the command's folder reaches the deployment as an absolute
   path (config.json records it), so the nodes find the file (it used to fail inside the deployment).

Ground truth: the exit status, the error line, config.json and the one-process run of the same
settings. Real Flower processes: marked ``processes`` and ``slow``."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("flwr", reason='Flower is not installed: pip install ".[flower]"')

from test_flower_cli import _cli, _output  # noqa: E402

from python_algos.experiments.cli import main  # noqa: E402

ARGS = ["-a", "fedavg", "-N", "3", "-B", "8", "--dtype", "float64", "--executor", "sequential", "--seed", "3",
        "--checkpoint-every", "1", "--no-progress", "--no-plot"]


def _libsvm(path, seed=0, n=90, d=5):
    g = torch.Generator().manual_seed(seed)
    X, y = torch.randn(n, d, generator=g), torch.randint(0, 2, (n,), generator=g) * 2 - 1
    path.write_text("".join(f"{int(y[i])} " + " ".join(f"{j + 1}:{float(X[i, j]):.6f}" for j in range(d)) + "\n"
                            for i in range(n)))


def _error_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.processes
@pytest.mark.slow
def test_a_flower_resume_on_changed_data_is_refused_as_one_process_is(tmp_path, capsys):
    data = tmp_path / "d.txt"
    _libsvm(data)
    data_args = ["--dataset", "libsvm", "--data-opt", f"file={data}"]
    one, fl = tmp_path / "one", tmp_path / "fl"
    assert main(["run", *ARGS, *data_args, "-T", "2", "--out", str(one)]) == 0
    p = _cli([*ARGS, *data_args, "-T", "2", "--flower", "--out", str(fl)], tmp_path)
    log = _output(p, 400)
    assert p.returncode == 0, log
    _libsvm(data, seed=1)  # other rows in the same file
    capsys.readouterr()
    assert main(["run", "--resume", str(one), "-T", "3", "--no-progress", "--no-plot"]) == 1
    assert "clients" in _error_line(capsys.readouterr().err)
    before = (fl / "summary.json").read_text()
    p = _cli(["--resume", str(fl), "--flower", "-T", "3"], tmp_path)
    log = _output(p, 400)
    assert p.returncode == 1, log
    err = _error_line(log)
    assert "the clients' data" in err and "nothing was changed" in err, err
    assert (fl / "summary.json").read_text() == before


@pytest.mark.processes
@pytest.mark.slow
def test_a_relative_data_file_reaches_the_flower_nodes(tmp_path):
    _libsvm(tmp_path / "d.txt")
    fl = tmp_path / "fl"
    p = _cli([*ARGS, "--dataset", "libsvm", "--data-opt", "file=d.txt", "-T", "2", "--flower", "--out", "fl"],
             tmp_path)  # the command runs in tmp_path, where d.txt is
    log = _output(p, 400)
    assert p.returncode == 0, log
    config = json.load(open(fl / "config.json"))
    assert config["data_opts"]["file"] == os.path.join(str(tmp_path), "d.txt")
    assert json.load(open(fl / "summary.json"))["status"] == "completed"
