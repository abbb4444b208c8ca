"""--tensorboard: each run (seed, grid point) writes TensorBoard events of its per-round metrics,
read back here with TensorBoard's own EventAccumulator and compared with the run's metrics.jsonl."""

import json
import os

import pytest

from python_algos.experiments.cli import main
from python_algos.runfolder.files import read_metrics
from test_run_folders import TINY

pytest.importorskip("tensorboard", reason="pip install tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _scalars(events_dir):
    acc = EventAccumulator(events_dir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_run_seeds_write_events_per_seed(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**TINY, "rounds": 3}))
    out = tmp_path / "s"
    assert main(["run", "--config", str(cfg), "--seeds", "2", "--out", str(out), "--no-progress", "--no-plot",
                 "--tensorboard"]) == 0
    for k in (0, 1):
        run = str(out / f"seed-{k}")
        got = _scalars(os.path.join(run, "tensorboard"))
        rows = read_metrics(run)
        for tag, key in (("objective/f+h", "f+h"), ("objective/h", "h"), ("model/sparsity", "sparsity"),
                         ("accuracy/test_acc", "test_acc")):
            want = [(r["round"], r[key]) for r in rows if r.get(key) is not None]
            assert [s for s, _ in got[tag]] == [s for s, _ in want]
            assert [v for _, v in got[tag]] == pytest.approx([v for _, v in want], rel=1e-6)  # stored as float32


def test_sweep_writes_one_events_folder_per_point_and_seed(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**TINY, "rounds": 2}))
    out = tmp_path / "w"
    assert main(["sweep", "-a", "fedcanon", "--grid", "alpha=0.1,0.2", "--config", str(cfg), "--out", str(out),
                 "--no-progress", "--no-plot", "--tensorboard"]) == 0
    dirs = sorted(os.path.relpath(r, out) for r, d, _ in os.walk(out) if os.path.basename(r) == "tensorboard")
    assert dirs == [os.path.join("fedcanon", f"alpha={a}", "seed-0", "tensorboard") for a in ("0.1", "0.2")]
    assert [s for s, _ in _scalars(str(out / dirs[0]))["objective/f+h"]] == [0, 1, 2]
