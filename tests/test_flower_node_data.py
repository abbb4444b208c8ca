"""A ``run --flower`` node reads its own rows from its state folder after its first message.

Ground truth: the rows of the whole federation built by ``prepare_data`` (what the one-process run
uses). The partitioning is counted: the second read of the same settings must not call it; other
settings, a damaged file or one whose bytes were changed are rebuilt, never trusted.
"""

from __future__ import annotations

import os

import pytest
import torch

from python_algos.deploy.data_cache import CACHE_DIR, ClientDataCache
from python_algos.experiments import node_data
from python_algos.experiments.build import prepare_data
from python_algos.experiments.config import Config


def _cfg(**kw):
    base = dict(dataset="sparse_logistic", data_opts={"n": 240, "dim": 12}, num_clients=3, seed=3, dtype="float64")
    return Config(**{**base, **kw})


@pytest.fixture
def counted(monkeypatch):
    calls = []

    def prepare(cfg):
        calls.append(cfg)
        return prepare_data(cfg)

    monkeypatch.setattr(node_data, "prepare_data", prepare)
    return calls


def _same_rows(got, cfg, i):
    (X, y), shape = got
    fed = prepare_data(cfg)
    want_X, want_y = fed.clients[i]
    assert torch.equal(X, want_X) and X.dtype == want_X.dtype and torch.equal(y, want_y) and y.dtype == want_y.dtype
    assert (shape.task, shape.in_shape, shape.outputs) == (fed.dataset.task, fed.dataset.in_shape, fed.dataset.outputs)


def test_the_second_message_reads_the_cache_instead_of_partitioning(tmp_path, counted):
    cfg = _cfg()
    _same_rows(node_data.node_rows(cfg, 1, str(tmp_path)), cfg, 1)
    assert len(counted) == 1
    _same_rows(node_data.node_rows(cfg, 1, str(tmp_path)), cfg, 1)
    assert len(counted) == 1  # read from the file
    assert os.listdir(tmp_path / CACHE_DIR) == ["client-1.pt"]  # written atomically: no temp file left


@pytest.mark.parametrize("change", [{"seed": 4}, {"data_opts": {"n": 240, "dim": 13}}, {"partition": "dirichlet"},
                                    {"num_clients": 4}, {"dtype": "float32"}, {"data_seed": 9}])
def test_other_settings_rebuild_the_rows(tmp_path, counted, change):
    node_data.node_rows(_cfg(), 1, str(tmp_path))
    cfg = _cfg(**change)
    _same_rows(node_data.node_rows(cfg, 1, str(tmp_path)), cfg, 1)
    assert len(counted) == 2
    node_data.node_rows(cfg, 1, str(tmp_path))
    assert len(counted) == 2  # and the new settings' rows are the cached ones now


def test_each_client_has_its_own_entry(tmp_path, counted):
    cfg = _cfg()
    for i in (0, 2, 0, 2):
        _same_rows(node_data.node_rows(cfg, i, str(tmp_path)), cfg, i)
    assert len(counted) == 2


def _damage_bytes(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        f.write(b"\x00garbage\xff" * 8)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 3)


def _change_a_value(path):  # a readable file whose rows were edited: its digest no longer matches
    blob = torch.load(path, weights_only=True)
    blob["tensors"]["X"][0, 0] += 1.0
    torch.save(blob, path)


@pytest.mark.parametrize("damage", [_damage_bytes, _truncate, _change_a_value, lambda p: open(p, "w").close()],
                         ids=["overwritten-bytes", "truncated", "edited-value", "empty"])
def test_a_damaged_or_edited_cache_is_rebuilt_not_trusted(tmp_path, counted, damage):
    cfg = _cfg()
    node_data.node_rows(cfg, 1, str(tmp_path))
    path = ClientDataCache(str(tmp_path), 1).path
    damage(path)
    _same_rows(node_data.node_rows(cfg, 1, str(tmp_path)), cfg, 1)
    assert len(counted) == 2
    node_data.node_rows(cfg, 1, str(tmp_path))
    assert len(counted) == 2  # the rebuilt file is good again


def test_without_a_state_folder_every_message_builds(counted):
    cfg = _cfg()
    for _ in range(2):
        _same_rows(node_data.node_rows(cfg, 0, None), cfg, 0)
    assert len(counted) == 2
