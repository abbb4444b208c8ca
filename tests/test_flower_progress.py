"""What ``run --flower`` shows while it starts (issue 38 item 7), without starting Flower: the
deployment is replaced by a stand-in that fails at once. The algorithm's warnings reach the
terminal (the server's own go to its log file), the line saying what the first round's time is
spent on comes before the progress display starts (one writer at a time)."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr", reason='Flower is not installed: pip install ".[flower]"')

from python_algos.experiments import flower_run  # noqa: E402
from python_algos.experiments.cli import main  # noqa: E402

ARGS = ["run", "-a", "scaffold", "--reg", "l1", "--dataset", "sparse_logistic", "--data-opt", "n=60",
        "--data-opt", "dim=12", "-N", "3", "-T", "2", "--flower"]


def test_the_algorithms_warning_and_a_first_round_note_come_before_the_progress(tmp_path, monkeypatch, capsys):
    events = []

    class Deployment:  # a stand-in LocalDeployment: it starts, and the run fails at once
        def __init__(self, *a, **kw):
            self.dir = str(tmp_path / "dep")

        def __enter__(self):
            (tmp_path / "dep").mkdir()
            return self

        def __exit__(self, *exc):
            return False

        def start_run(self, *a, **kw):
            raise flower_run.DeploymentError("stand-in deployment: no run")

    class Shown(flower_run.Progress):
        def __init__(self, *a, **kw):
            seen = capsys.readouterr()  # what the terminal had when the progress display starts
            events.append(seen.out + seen.err)
            super().__init__(*a, **kw)

    monkeypatch.setattr(flower_run, "LocalDeployment", Deployment)
    monkeypatch.setattr(flower_run, "Progress", Shown)
    main([*ARGS, "--out", str(tmp_path / "run")])
    before = events[0] if events else ""
    assert "warning: SCAFFOLD is a smooth method: its update ignores the regularizer" in before
    assert "round 1 also starts the server's and each node's app process" in before
