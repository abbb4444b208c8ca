"""The one engine loop (runfolder.callbacks.run_rounds) as simulate drives it: hook order, stopping,
checkpoints of accepted rounds only, and resuming from an in-memory snapshot."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms import FedAvg
from python_algos.runfolder.callbacks import Callback, Checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _problem():
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(8, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (8,), generator=g))
               for _ in range(3)]
    torch.manual_seed(0)
    return nn.Linear(3, 2).double(), clients


def _run(rounds, **kw):
    model, clients = _problem()
    return simulate(FedAvg(lr_local=0.1, local_steps=2), model, nn.functional.cross_entropy, clients, rounds,
                    regularizer=fk.Zero(), batch_size=4, seed=1, **kw)


class Recorder(Callback):
    def __init__(self, log, stop_at=None):
        self.log, self.stop_at = log, stop_at

    def on_start(self, run):
        self.log.append(("start", run.start, run.rounds, run.initial["round"]))

    def after_round(self, t, state, row):
        self.log.append(("after", t, row["round"]))
        return t == self.stop_at

    def commit(self, t, state):
        self.log.append(("commit", t))

    def on_end(self):
        self.log.append(("end",))


def test_hooks_run_in_order_and_a_stopped_round_is_never_committed_or_checkpointed():
    log, saved, calls = [], [], []
    hist = _run(5, callbacks=[Recorder(log, stop_at=3), lambda t, s, m: calls.append(t),
                              Checkpoint(lambda s: saved.append(s["round"]), 1)])
    assert log == [("start", 1, 5, 0), ("after", 1, 1), ("commit", 1), ("after", 2, 2), ("commit", 2),
                   ("after", 3, 3), ("end",)]
    assert calls == [1, 2, 3]  # a plain function callback, called every round up to the stop
    assert saved == [0, 1, 2] and [m["round"] for m in hist.metrics] == [1, 2, 3]


def test_on_end_runs_when_a_round_raises():
    log = []

    def boom(t, state, row):
        if t == 2:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _run(4, callbacks=[Recorder(log), boom])
    assert log[-1] == ("end",) and ("commit", 2) not in log


def test_resume_from_an_in_memory_snapshot_keeps_each_round_once():
    """The snapshot's metrics is the run's live list, which grew after the snapshot was taken; the
    resumed History holds rounds 1..T once each (before, rounds 3 and 4 appeared twice)."""
    full = _run(6)
    snaps = []

    def keep(s):  # the state copied now (it is live), the metrics as the live list
        snaps.append({**copy.deepcopy({k: v for k, v in s.items() if k != "metrics"}), "metrics": s["metrics"]})

    _run(4, callbacks=[Checkpoint(keep, 2)])
    assert snaps[1]["round"] == 2 and len(snaps[1]["metrics"]) == 4  # the live list
    resumed = _run(6, resume=snaps[1])
    assert [m["round"] for m in resumed.metrics] == [1, 2, 3, 4, 5, 6]
    assert torch.equal(resumed.params, full.params)
    assert resumed.series("f+h") == full.series("f+h")


def test_a_resume_from_the_checkpoint_of_round_0_is_not_a_fresh_run():
    """Round 0 is neither checkpointed again nor its row written again (the run folder's metrics.jsonl
    would hold round 0 twice)."""
    snaps = []
    _run(0, callbacks=[Checkpoint(lambda s: snaps.append(copy.deepcopy({k: v for k, v in s.items()
                                                                        if k != "metrics"})))])
    assert [s["round"] for s in snaps] == [0]
    saved, log = [], []
    hist = _run(2, resume=snaps[0], callbacks=[Recorder(log), Checkpoint(lambda s: saved.append(s["round"]))])
    assert saved == [2] and log[0] == ("start", 1, 2, 0)
    assert [m["round"] for m in hist.metrics] == [1, 2]
