"""History.save under real concurrency (issue 17, item 12): several processes saving different
Histories to one path at once (every rank of a torchrun job calling save). Without overwrite exactly
one succeeds, the others get FileExistsError saying another process saved first, and the folder on
disk is exactly the winner's complete content with no temporary folders beside it; with overwrite the
folder is one saver's complete content, and a failed swap puts the old run back.

The savers are forked processes released together by a barrier placed after History.save has checked
the target and written its temporary folder (the model.pt write), i.e. inside the check-then-write
window. Ground truth: each saver's own History (distinct params, metrics and label)."""

import json
import multiprocessing as mp
import os
import time

import pytest
import torch

from python_algos.runfolder import checkpoint as ckpt
from python_algos.simulate import History

N = 4


def hist(i: int) -> History:
    return History(params=torch.full((5,), float(i), dtype=torch.float64),
                   metrics=[{"round": 1, "f+h": 1.0 + i}, {"round": 2, "f+h": 0.5 + i}],
                   initial={"round": 0, "f+h": 10.0 + i}, algorithm="FedCanon", hparams={"saver": i},
                   setup={"rounds": 2})


def _saver(i, path, overwrite, barrier, delay, q):
    real = ckpt.atomic_save

    def gate(obj, p):  # History.save has checked the target; hold every saver here, then let them go
        real(obj, p)
        barrier.wait(timeout=60)
        time.sleep(delay * i)

    ckpt.atomic_save = gate
    try:
        hist(i).save(path, overwrite=overwrite, label=f"saver{i}")
        q.put((i, "ok", ""))
    except Exception as e:  # noqa: BLE001 - reported to the test
        q.put((i, type(e).__name__, str(e)))


def save_together(path, overwrite=False, delay=0.0) -> dict:
    ctx = mp.get_context("fork")
    barrier, q = ctx.Barrier(N), ctx.Queue()
    procs = [ctx.Process(target=_saver, args=(i, path, overwrite, barrier, delay, q)) for i in range(N)]
    for p in procs:
        p.start()
    results = dict((i, (kind, msg)) for i, kind, msg in (q.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def is_exactly(path, i: int):
    """The folder at ``path`` is saver i's complete save, and nothing else is beside it."""
    assert sorted(os.listdir(path)) == ["config.json", "metrics.jsonl", "model.pt", "summary.json"]
    back = History.load(path)
    want = hist(i)
    assert torch.equal(back.params, want.params)
    assert [back.initial, *back.metrics] == [want.initial, *want.metrics]
    assert back.hparams == {"saver": i}
    with open(os.path.join(path, "summary.json")) as f:
        assert json.load(f)["label"] == f"saver{i}"
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]  # no tmp / old folders left


@pytest.mark.parametrize("delay", [0.0, 0.3], ids=["simultaneous", "staggered"])
def test_concurrent_saves_exactly_one_succeeds(tmp_path, delay):
    for attempt in range(3 if delay == 0 else 1):
        path = str(tmp_path / f"a{attempt}" / "run")
        os.makedirs(os.path.dirname(path))
        results = save_together(path, delay=delay)
        winners = [i for i, (kind, _) in results.items() if kind == "ok"]
        assert len(winners) == 1, results
        for i, (kind, msg) in results.items():
            if i != winners[0]:
                assert kind == "RunExistsError" and "another process saved a run" in msg and "rank 0" in msg \
                    and path in msg, (i, kind, msg)
        is_exactly(path, winners[0])


def test_concurrent_saves_into_an_empty_folder(tmp_path):
    path = str(tmp_path / "d" / "run")
    os.makedirs(path)  # an empty folder is fine to replace, by one saver only
    results = save_together(path)
    winners = [i for i, (kind, _) in results.items() if kind == "ok"]
    assert len(winners) == 1, results
    is_exactly(path, winners[0])


def test_concurrent_overwrites_leave_one_complete_run(tmp_path):
    path = str(tmp_path / "o" / "run")
    os.makedirs(os.path.dirname(path))
    hist(99).save(path, label="saver99")
    results = save_together(path, overwrite=True)
    ok = [i for i, (kind, _) in results.items() if kind == "ok"]
    assert ok, results
    final = History.load(path).hparams["saver"]
    assert final in ok
    is_exactly(path, final)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_failed_swap_puts_the_old_run_back(tmp_path, monkeypatch, exchange):
    from python_algos.runfolder import history as hmod

    path = str(tmp_path / "o" / "run")
    os.makedirs(os.path.dirname(path))
    hist(7).save(path, label="saver7")

    def failing(real):
        def f(src, dst, *a, **k):
            if ".tmp-" in os.path.basename(src) and not src.endswith(".old") and os.fspath(dst) == path:
                raise OSError(5, "I/O error (injected)", dst)
            return real(src, dst, *a, **k)
        return f

    monkeypatch.setattr(os, "rename", failing(os.rename))
    monkeypatch.setattr(os, "replace", failing(os.replace))
    def no_exchange(a, b):  # renameat2 is one system call: it fails as a whole, or (False) is not supported
        if exchange:
            raise OSError(5, "I/O error (injected)", b)
        return False

    monkeypatch.setattr(hmod, "exchange_paths", no_exchange, raising=False)
    with pytest.raises(OSError, match="injected"):
        hist(8).save(path, overwrite=True)
    is_exactly(path, 7)
