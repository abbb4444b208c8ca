"""Smoke tests of the peers table (bench/peers.py), collected by the default ``python -m pytest``.

The table's own rows on a toy size with pfl treated as absent (its rows need pfl, which is never a
dependency): the script must still write the table, name the install step and exit 0. Where pfl is
installed, ``test_pfl_fedavg_is_plain_fedavg`` also runs pfl's FedAvg on a toy size and holds it to
an in-order plain PyTorch FedAvg loop. Nothing here is timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from . import peers
from .clients import make_clients

TOY = ["--clients", "4", "--samples", "64", "--batch", "32", "--rounds", "1"]


def test_peers_without_pfl(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(peers, "pfl_available", lambda: False)
    monkeypatch.setattr(peers, "distributed_available", lambda: False)  # no torchrun in the default run
    readme = tmp_path / "README.md"
    readme.write_text(f"# top\n\n{peers.README_BEGIN}\nold table\n{peers.README_END}\n\n## after\n")
    out = tmp_path / "results" / "peers_table.md"
    peers.main(TOY + ["--out", str(out), "--readme", str(readme)])  # returns: exit status 0

    res = json.loads(out.with_suffix(".json").read_text())
    names = [r["name"] for r in res["rows"]]
    assert names == ["fedkernels sequential", "fedkernels batched", "plain PyTorch loop (deepcopy + SGD)"]
    assert res["K"] == 2  # one local epoch: 64 samples / batch 32
    for r in res["rows"]:
        assert r["s_per_round"] > 0
        # Same draws as the sequential executor: the batched executor and the plain PyTorch loop
        # (an independent implementation) end at the same model, up to float32 summation order.
        assert r["rel_dev"] < 1e-5, r
        assert r["loss"] < res["start_loss"]  # 2 rounds of SGD on separable data lower the loss
    assert any("pip install pfl==0.6.0" in n for n in res["notes"])
    assert "pip install pfl==0.6.0" in capsys.readouterr().err

    text = readme.read_text()
    assert (text.startswith("# top\n\n" + peers.README_BEGIN + "\n")
            and text.endswith(peers.README_END + "\n\n## after\n"))
    assert "old table" not in text and "| fedkernels batched | 1 |" in text
    assert out.read_text().strip() in text


def test_peers_bad_flag_writes_nothing(tmp_path, capsys):
    out = tmp_path / "t.md"
    with pytest.raises(SystemExit) as e:
        peers.main(["--samples", "60", "--batch", "32", "--out", str(out)])
    assert e.value.code == 2
    assert "--samples (60) must be a multiple of --batch (32)" in capsys.readouterr().err
    assert not os.path.exists(out)


def test_pfl_fedavg_is_plain_fedavg(tmp_path):
    pytest.importorskip("pfl")
    out = tmp_path / "r.json"
    # A child process: importing pfl sets torch's start method and builds its distributed context.
    subprocess.run([sys.executable, "-m", "bench.pfl_fedavg", "--clients", "3", "--samples", "64", "--rounds", "2",
                    "--out", str(out)], cwd=peers.REPO_ROOT, check=True, timeout=300)
    res = json.loads(out.read_text())
    got = torch.tensor(res["params"])
    ref = peers.fedavg_in_order(make_clients(3, 64), batch=32, rounds=2, lr=0.01)
    assert len(res["round_s"]) == 2 and res["world_size"] == 1
    assert float((got - ref).norm() / ref.norm()) < 1e-5


def test_a_failing_peer_is_retried_once_then_shown_with_its_reason(monkeypatch):
    calls = []

    def fail(module, procs, w, args, extra=()):
        calls.append(module)
        raise RuntimeError(f"`{module}` exited 1:\nConnectionError: gloo rendezvous timed out ({len(calls)})")

    monkeypatch.setattr(peers, "_launch", fail)
    monkeypatch.setattr(peers, "pfl_available", lambda: True)
    monkeypatch.setattr(peers, "distributed_available", lambda: False)
    args = peers.argparse.Namespace(no_pfl=False, procs=2, rounds=1, lr=0.01)
    w = peers.WORKLOADS["cross-device"]
    notes = []
    rows = peers._launched_rows(w, [], None, args, notes, lambda s: None)
    assert calls == ["bench.pfl_fedavg"] * 4  # 1 and 2 processes, each tried twice
    assert [r["s_per_round"] for r in rows] == [None, None]
    assert "attempt 1: ConnectionError: gloo rendezvous timed out (1)" in rows[0]["failure"]
    assert "attempt 2: ConnectionError: gloo rendezvous timed out (2)" in rows[0]["failure"]
    line = peers._table_row(rows[1], None, 1.0, 100)
    assert line.startswith("| pfl on 2 processes (torchrun, gloo) | 2 | failed |") and "(4)" in line
    assert line.count("|") == 9  # all 8 columns of the header, as a measured row


def test_cross_device_workload_shape_and_flags(capsys, tmp_path):
    def parse(workload):
        return peers.workload_from_args(peers.argparse.Namespace(
            workload=workload, clients=None, samples=None, batch=None, K=None, cohort=None))

    w = parse("cross-device")
    assert (w.model, w.clients, w.cohort, w.samples, w.K, w.batch) == ("logreg", 1000, 100, 32, 5, 8)
    assert sum(p.numel() for p in peers.make_model(w.model).parameters()) <= 10_000
    assert parse("mlp").K == 256 // 32  # one local epoch, what pfl runs
    # pfl-research's CIFAR-10 benchmark: 50 of 1,000 users of 50 images per round, one epoch of batch 10
    w = parse("cifar10")
    assert (w.model, w.clients, w.cohort, w.samples, w.K, w.batch) == ("cifar_cnn", 1000, 50, 50, 5, 10)
    out = tmp_path / "t.md"
    with pytest.raises(SystemExit):
        peers.main(["--workload", "cross-device", "--cohort", "2000", "--out", str(out)])
    assert "--cohort (2000) must be at most --clients (1000)" in capsys.readouterr().err
    assert not out.exists()


def test_sampled_cohort_rows_share_draws_with_the_sequential_executor(tmp_path, monkeypatch):
    """With clients sampled per round, the plain PyTorch loop draws python_algos' cohorts (its own
    copy of the sampler) and minibatches: its final model is the sequential executor's up to
    float32 summation order, and so is the batched executor's."""
    monkeypatch.setattr(peers, "distributed_available", lambda: False)
    out = tmp_path / "t.md"
    peers.main(["--workload", "cross-device", "--clients", "12", "--cohort", "3", "--samples", "16", "--batch", "4",
                "-K", "2", "--rounds", "2", "--no-pfl", "--out", str(out)])
    res = json.loads(out.with_suffix(".json").read_text())
    assert [r["name"] for r in res["rows"]][2] == "plain PyTorch loop (deepcopy + SGD)"
    for r in res["rows"][1:]:
        assert r["rel_dev"] < 1e-5, r
    assert "| client updates / s |" in out.read_text()


def test_plain_loop_cohorts_are_python_algos_participants():
    import python_algos as pa

    from .clients import cohorts

    cs = pa.SequentialClients(peers.make_model("logreg"), torch.nn.functional.cross_entropy, make_clients(12, 4))
    cs.set_participation(3, seed=0)
    got = cohorts(12, 3, 4)
    assert got == [cs.participants().tolist() for _ in range(4)]
    assert len({tuple(c) for c in got}) > 1 and all(len(set(c)) == 3 for c in got)
    assert cohorts(12, None, 2) == [list(range(12))] * 2


def test_cifar10_model_is_pfl_researchs_cnn():
    """pfl-research's CIFAR-10 CNN, counted layer by layer: 3x3 convs 3->32->64 (valid), 2x2 pool to
    14x14, dense 12,544->128->10."""
    from .clients import input_shape

    model = peers.make_model("cifar_cnn")
    expected = (3 * 9 * 32 + 32) + (32 * 9 * 64 + 64) + (64 * 14 * 14 * 128 + 128) + (128 * 10 + 10)
    assert sum(p.numel() for p in model.parameters()) == expected == 1_626_442
    assert input_shape("cifar_cnn") == (3, 32, 32)
    assert model(torch.zeros(2, *input_shape("cifar_cnn"))).shape == (2, 10)
    assert peers.draws_random_numbers("cifar_cnn") and not peers.draws_random_numbers("mlp")
    X, y = make_clients(2, 5, in_shape=input_shape("cifar_cnn"))[0]
    assert X.shape == (5, 3, 32, 32) and y.shape == (5,)
