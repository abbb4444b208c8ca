"""Defect 10 for the Flower server: its checkpoint holds the state of its round, not the round
records so far; those are appended to a records file beside it and read back by load_server."""

from __future__ import annotations

import os

import pytest
import torch

from python_algos.deploy import persist
from python_algos.runfolder.checkpoint import CheckpointError
from python_algos.runfolder.files import append_row, write_jsonl


def _snap(t):
    return {"round": t, "state": {"x": torch.ones(8)}, "metrics": [{"round": r, "wall_time": 0.5} for r in
                                                                  range(1, t + 1)]}


def test_server_checkpoint_size_does_not_grow_with_the_round(tmp_path):
    path = str(tmp_path / "server.pt")
    write_jsonl(persist.history_path(path), [{"round": 0}])
    sizes = {}
    with open(persist.history_path(path), "a") as f:  # as the run's MetricsFile appends them
        for t in range(1, 201):
            append_row(f, {"round": t, "wall_time": 0.5, "participants": [0, 1, 2]})
            if t in (10, 200):
                persist.save_server(path, _snap(t))
                sizes[t] = os.path.getsize(path)
    assert abs(sizes[200] - sizes[10]) <= 64, sizes  # before: every record rewritten into every checkpoint
    blob = torch.load(path, weights_only=True)
    assert "metrics" not in str(blob["snapshot"].keys())
    back = persist.load_server(path)
    assert [r["round"] for r in back["metrics"]] == list(range(1, 201))
    assert back["metrics"][0]["participants"] == [0, 1, 2]


def test_records_past_the_checkpoint_are_dropped_and_missing_ones_refused(tmp_path):
    path = str(tmp_path / "server.pt")
    write_jsonl(persist.history_path(path), [{"round": r} for r in range(6)])
    with open(persist.history_path(path), "a") as f:
        f.write('{"round": 6, "wall')  # torn by a kill
    persist.save_server(path, _snap(4))
    assert [r["round"] for r in persist.load_server(path)["metrics"]] == [1, 2, 3, 4]
    write_jsonl(persist.history_path(path), [{"round": r} for r in (0, 1, 2)])
    with pytest.raises(CheckpointError, match="lacks round 3 of the rounds 0..4"):
        persist.load_server(path)


def test_a_replaced_run_folder_drops_the_flower_records_too():
    """The records file is one of the run files a replaced run folder deletes (item 1: nothing of the
    old run survives)."""
    from python_algos.runfolder.files import FLOWER_CHECKPOINT, RUN_FILES

    assert os.path.basename(persist.history_path(FLOWER_CHECKPOINT)) in RUN_FILES
