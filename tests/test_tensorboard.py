"""--tensorboard: each run (seed, grid point) writes TensorBoard events of its per-round metrics while
it runs, read back here (also during the run) with TensorBoard's own EventAccumulator and compared
with the run's metrics.jsonl."""

import glob
import json
import math
import os
import sys

import numpy as np
import pytest
from test_run_folders import TINY

from python_algos.experiments import tensorboard as tb
from python_algos.experiments.cli import main
from python_algos.experiments.tensorboard import tag_of
from python_algos.runfolder import callbacks as callbacks_module
from python_algos.runfolder.files import read_metrics
from python_algos.runfolder.progress import Progress

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


# --------------------------------------------------------------------------- #
# Live events: read while the run runs
# --------------------------------------------------------------------------- #

def _expected(run_dir):
    """What the events must hold, from metrics.jsonl by the rule written out here (every finite
    number but the round, under tag_of, step = round, float32 as TensorBoard stores scalars)."""
    want = {}
    with np.errstate(over="ignore"):  # a float64 value past float32's range is stored as inf
        rows = [(r, {k: float(np.float32(v)) for k, v in r.items() if k != "round" and isinstance(v, (int, float))
                     and not isinstance(v, bool) and math.isfinite(v)}) for r in read_metrics(run_dir)]
    for r, stored in rows:
        for k, v in stored.items():
            want.setdefault(tag_of(k), []).append((r["round"], v))
    return want


def _events_of(run_dir):
    d = os.path.join(run_dir, "tensorboard")
    return _scalars(d) if os.path.isdir(d) else {}


def _runs_under(root):
    return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(str(root), "**", "metrics.jsonl"),
                                                           recursive=True))


def _watch(monkeypatch, root, stop_at=None, error=KeyboardInterrupt):
    """After every round's row (the progress bar's update comes right after it), record for every run
    folder under ``root`` whether its events equal its metrics.jsonl, and the rounds the events show.
    ``stop_at``: raise ``error`` after that round (Ctrl-C, or a failure inside the run)."""
    seen = []

    class Watching(Progress):  # the real one, not an earlier _watch's
        def update(self, t, metrics):
            super().update(t, metrics)
            seen.append({"round": t, "equal": {d: _events_of(d) == _expected(d) for d in _runs_under(root)},
                         "steps": {d: [s for s, _ in _events_of(d).get("objective/f+h", [])]
                                   for d in _runs_under(root)}})
            if stop_at is not None and t == stop_at:
                raise error("stopped by the test")

    monkeypatch.setattr(callbacks_module, "Progress", Watching)  # the display callback's bar
    return seen


def test_run_events_grow_round_by_round_while_it_runs(tmp_path, monkeypatch):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**TINY, "rounds": 4}))
    out = str(tmp_path / "r")
    seen = _watch(monkeypatch, out)
    assert main(["run", "--config", str(cfg), "--out", out, "--no-progress", "--no-plot", "--tensorboard"]) == 0
    assert [s["round"] for s in seen] == [1, 2, 3, 4]
    for s in seen:  # after round t the events hold rounds 0..t, each value as metrics.jsonl has it
        assert s["steps"] == {out: list(range(s["round"] + 1))}
        assert s["equal"] == {out: True}
    assert _events_of(out) == _expected(out)
    assert tb.LIVE_ENV not in os.environ  # the switch ends with the command


def test_seeds_and_sweep_runs_write_their_events_live(tmp_path, monkeypatch):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**TINY, "rounds": 2}))
    out = tmp_path / "s"
    seen = _watch(monkeypatch, out)
    assert main(["run", "--config", str(cfg), "--seeds", "2", "--out", str(out), "--no-progress", "--no-plot",
                 "--tensorboard"]) == 0
    seed1 = str(out / "seed-1")
    assert [(s["round"], s["steps"].get(seed1)) for s in seen] == [(1, None), (2, None), (1, [0, 1]), (2, [0, 1, 2])]
    assert all(all(s["equal"].values()) for s in seen)
    out = tmp_path / "w"
    seen = _watch(monkeypatch, out)
    assert main(["sweep", "-a", "fedcanon", "--grid", "alpha=0.1", "--config", str(cfg), "--out", str(out),
                 "--no-progress", "--no-plot", "--tensorboard", "--jobs", "1"]) == 0
    run = str(out / "fedcanon" / "alpha=0.1" / "seed-0")
    assert [(s["round"], s["steps"], s["equal"]) for s in seen] == [(1, {run: [0, 1]}, {run: True}),
                                                                      (2, {run: [0, 1, 2]}, {run: True})]


def test_interrupted_then_resumed_run_shows_each_round_once(tmp_path, monkeypatch):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(TINY))  # 6 rounds, a checkpoint every 2
    out = str(tmp_path / "r")
    _watch(monkeypatch, out, stop_at=3)  # Ctrl-C after round 3: the checkpoint is round 2
    assert main(["run", "--config", str(cfg), "--out", out, "--no-progress", "--no-plot", "--tensorboard"]) == 130
    assert [r["round"] for r in read_metrics(out)] == [0, 1, 2, 3]
    assert _events_of(out) == _expected(out)  # the interrupted run's events are its metrics
    stale = dict(_events_of(out)["time/elapsed"])[3]
    open_reader = EventAccumulator(os.path.join(out, "tensorboard"))  # a TensorBoard left open across the resume
    open_reader.Reload()

    seen = _watch(monkeypatch, out)
    assert main(["run", "--resume", out, "--no-progress", "--no-plot", "--tensorboard"]) == 0
    assert [s["round"] for s in seen] == [3, 4, 5, 6]  # round 3 is redone from the checkpoint
    for s in seen:  # during the resume: rounds 0..t once each (the dropped round 3 is gone), values of the file
        assert s["steps"] == {out: list(range(s["round"] + 1))}
        assert s["equal"] == {out: True}
    got, want = _events_of(out), _expected(out)
    assert got == want
    for tag, points in got.items():
        assert len({step for step, _ in points}) == len(points), tag  # every (tag, step) exactly once
    assert dict(got["time/elapsed"])[3] != stale  # the redone round's own values, not the dropped row's
    open_reader.Reload()
    assert {t: [(e.step, e.value) for e in open_reader.Scalars(t)] for t in open_reader.Tags()["scalars"]} == want


@pytest.mark.parametrize("how", ["diverged", "failed"])
def test_diverged_and_failed_runs_leave_events_equal_to_metrics(tmp_path, monkeypatch, how):
    cfg = tmp_path / "c.json"
    blowup = dict(algorithm="fedavg", dataset="sparse_linear", lr=1e80)  # a least-squares step far past 2/L
    cfg.write_text(json.dumps({**TINY, "rounds": 4, **(blowup if how == "diverged" else {})}))
    out = str(tmp_path / "r")
    _watch(monkeypatch, out, stop_at=2 if how == "failed" else None, error=RuntimeError)
    code = main(["run", "--config", str(cfg), "--out", out, "--no-progress", "--no-plot", "--tensorboard"])
    assert code == (3 if how == "diverged" else 1)
    rows = read_metrics(out)
    assert [r["round"] for r in rows] == ([0, 1] if how == "diverged" else [0, 1, 2])
    if how == "diverged":  # f+h overflowed (written as null); h is finite in float64 but not in float32
        assert rows[-1]["f+h"] is None and rows[-1]["h"] > 3.4e38
    assert _events_of(out) == _expected(out)


def test_write_events_after_a_live_run_keeps_the_file(tmp_path):
    """The sweep and seeds call write_events for every run at the end: a folder the run wrote live is
    left alone, a stale one gets a file that supersedes (never deletes) the earlier one."""
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**TINY, "rounds": 2}))
    out = str(tmp_path / "r")
    assert main(["run", "--config", str(cfg), "--out", out, "--no-progress", "--no-plot", "--tensorboard"]) == 0
    before = os.listdir(os.path.join(out, "tensorboard"))
    assert len(before) == 1
    tb.write_events(out)
    assert os.listdir(os.path.join(out, "tensorboard")) == before
    rows = read_metrics(out)
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:  # metrics.jsonl now has one round fewer
        f.writelines(json.dumps(r) + "\n" for r in rows[:-1])
    tb.write_events(out)
    assert _events_of(out) == _expected(out) and max(s for s, _ in _events_of(out)["objective/f+h"]) == 1
    assert set(before) < set(os.listdir(os.path.join(out, "tensorboard")))


def test_missing_tensorboard_fails_before_the_run(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**TINY, "rounds": 2}))
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard -> ImportError
    out = tmp_path / "r"
    assert main(["run", "--config", str(cfg), "--out", str(out), "--no-progress", "--no-plot", "--tensorboard"]) == 1
    assert "pip install tensorboard" in capsys.readouterr().err
    assert not out.exists() and tb.LIVE_ENV not in os.environ
