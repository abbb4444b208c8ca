"""``--dataset folder:PATH`` (issue 38 item 1) under the engines with processes of their own: ``--flower``
(one SuperNode per client file, each reading only its own file; ``--standardize global``'s pooled
statistics from the nodes' counts, means and sums of squares in one exchange before the handshake) and
``--workers 2`` (torchrun ranks), each from a relative folder path.

Ground truth: the one-process run of the same settings (its final model, to 1e-10 in float64). Real
processes: marked ``processes`` and ``slow``."""

from __future__ import annotations

import pytest
import torch
from test_data_folder import _hospitals
from test_flower_cli import _cli, _output

from python_algos.experiments.cli import main

ARGS = ["-a", "fedavg", "--dataset", "folder:h", "--data-opt", "label=outcome", "--partition", "natural", "-T", "2",
        "--dtype", "float64", "--executor", "sequential", "--no-progress", "--no-plot"]


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("engine, k, scaling", [(["--flower"], 6, "global"), (["--flower"], 3, "local"),
                                                (["--workers", "2"], 3, "global")])
def test_the_folder_runs_under_flower_and_workers_as_in_one_process(tmp_path, monkeypatch, engine, k, scaling):
    if engine == ["--flower"]:
        pytest.importorskip("flwr", reason='Flower is not installed: pip install ".[flower]"')
    _hospitals(tmp_path / "h", k=k)
    monkeypatch.chdir(tmp_path)
    args = [*ARGS, "-N", str(k), "--standardize", scaling]
    assert main(["run", *args, "--out", "one"]) == 0
    p = _cli([*args, *engine, "--out", "other"], tmp_path)
    out = _output(p, 500)
    assert p.returncode == 0, out[-3000:]
    want, got = (torch.load(tmp_path / run / "model.pt")["params"] for run in ("one", "other"))
    assert (want - got).abs().max() < 1e-10
