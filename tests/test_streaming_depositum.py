"""DEPOSITUM on a client-state store streams its clients through the executor in chunks, gossip included
(issue 39 item 1; python_algos/algorithms/depositum_stream.py): every topology the registry offers ×
{ram, disk} × {float64, float32} × chunks of 1, 5 and N equals the dense run bit for bit (the model, every
metric of every round, every client's rows of x, y, m, g), gossip and local iterations both; the batched
executor and a population too; a resumed streamed run equals the uninterrupted one; the kept boundary rows
are few on a ring; a dense W is refused naming the topology, state='dense' and mixing='sparse', a gradient
tracker start naming state='dense'. A ring, star or torus past topology.SPARSE_BUILD nodes is built as its
non-zeros, with the dense build's weights."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms import depositum_stream
from python_algos.algorithms import topology as topo
from python_algos.algorithms.depositum import DEPOSITUM
from python_algos.algorithms.topology import NAMES
from python_algos.clients import state_plan
from python_algos.clients.base import ClientSet
from python_algos.clients.population import Population
from python_algos.clients.state_store import ClientStateStore

SIZES = [3, 9, 5, 17, 2, 6, 30, 4, 8, 11, 7, 5]  # 12 clients of unequal sizes: the torus is 3 x 4
N = len(SIZES)


def _clients(dtype):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, 4, generator=g).to(dtype), torch.randint(0, 3, (n,), generator=g)) for n in SIZES]


def _model(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).to(dtype)


def _alg(topology="ring", **kw):
    return DEPOSITUM(**{"alpha": 0.05, "gamma": 0.7, "beta": 0.8, "topology": topology, "mixing": "sparse", **kw})


def _run(alg, dtype=torch.float64, rounds=4, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate(alg, _model(dtype), nn.functional.cross_entropy, _clients(dtype), rounds, fk.L1(0.01),
                        seed=4, batch_size=4, **kw)


def _untimed(rows):
    return [{k: v for k, v in r.items() if "time" not in k and k != "elapsed"} for r in rows]


def _same(got, want):
    assert torch.equal(got.params, want.params), (got.params - want.params).abs().max()
    assert _untimed(got.metrics) == _untimed(want.metrics)
    for f in ("x", "y", "m", "g"):
        v = getattr(got.state, f)
        assert isinstance(v, ClientStateStore), f
        assert torch.equal(v.to_dense(), getattr(want.state, f)), f


def _chunked(monkeypatch, size):
    """Chunks of ``size`` clients; returns the list of the chunks the estimate and each streamed round asked."""
    ran, real = [], ClientSet.stream_chunks

    def spy(self, n):
        ran.append(real(self, n))
        return ran[-1]
    monkeypatch.setattr(ClientSet, "stream_chunks", spy)
    monkeypatch.setattr(state_plan, "stream_rows", lambda *a: size)
    return ran


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("topology", NAMES)
def test_every_topology_streams_bit_for_bit(topology, dtype, monkeypatch):
    alg = _alg(topology, period=2 if topology == "ring" else 1)  # the ring: local iterations between gossips
    dense = _run(alg, dtype)
    for state, size in (("ram", 1), ("disk", 5), ("ram", N)):
        ran = _chunked(monkeypatch, size)
        got = _run(alg, dtype, state=state)
        assert len(ran) == 1 + 4 and all(c == [(a, min(a + size, N)) for a in range(0, N, size)] for c in ran), ran
        _same(got, dense)


def test_the_batched_executor_streams_bit_for_bit(monkeypatch):
    alg = _alg("torus", momentum="snag", prox_step="alpha*gamma")
    dense = _run(alg, executor="batched")
    _chunked(monkeypatch, 5)
    _same(_run(alg, executor="batched", state="ram"), dense)


@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_a_population_streams_bit_for_bit(executor, monkeypatch):
    """Clients built on demand (a cache of 4: the batched executor streams its own blocks of 4)."""
    clients = _clients(torch.float64)

    def run(**kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return simulate(_alg("torus"), _model(torch.float64), nn.functional.cross_entropy,
                            Population(N, lambda i: clients[i], cache=4), 4, fk.L1(0.01), seed=4, batch_size=4,
                            executor=executor, **kw)
    dense = run()
    _chunked(monkeypatch, 3)
    _same(run(state="disk"), dense)


def test_a_ring_keeps_its_boundary_rows_only(monkeypatch):
    """Chunks of 3 on a ring of 12: a chunk keeps its last row (its successor's first reader) and chunk 0
    its first (read by client 11); slots are reused once read, so 2 rows at most are kept at once."""
    _chunked(monkeypatch, 3)
    alg = _alg("ring")
    got = _run(alg, state="ram")
    plan = next(iter(alg._stream_plans.values()))
    assert [c.keep.tolist() for c in plan.chunks] == [[0, 2], [5], [8], []]
    assert plan.slots == 2 and depositum_stream._SIDES[got.state.x].rows == 2  # 0 and the last chunk's last row


def test_a_streamed_run_resumes_from_its_checkpoint_bit_identically(tmp_path, monkeypatch):
    """Stopped a round past its checkpoint (the store's files ahead of it), a streamed state='disk' run resumes
    from the checkpoint to the uninterrupted dense run's model, metrics and rows."""
    from python_algos.runfolder import checkpoint as ckpt
    from python_algos.runfolder.callbacks import Checkpoint

    _chunked(monkeypatch, 5)
    alg = _alg("torus", period=2)
    full = _run(alg, rounds=6)
    where, saver = str(tmp_path / "state"), ckpt.Checkpointer(str(tmp_path / "ck.pt"))
    _run(alg, rounds=6, state="disk", state_folder=where, callbacks=[lambda t, s, m: t == 4, Checkpoint(saver, 3)])
    snap = ckpt.load(str(tmp_path / "ck.pt"))
    assert snap["round"] == 3
    resumed = _run(alg, rounds=6, state="disk", state_folder=where, resume=snap)
    assert torch.equal(resumed.params, full.params)
    assert _untimed(resumed.metrics) == _untimed(full.metrics[3:])
    for f in ("x", "y", "m", "g"):
        assert torch.equal(getattr(resumed.state, f).to_dense(), getattr(full.state, f)), f


@pytest.mark.parametrize("state", ["ram", "disk"])
def test_a_dense_mixing_matrix_is_refused_naming_the_topology_and_the_fixes(state):
    """A dense W's product is a BLAS gemm (its own order): refused, before anything is built."""
    for alg, why in ((_alg("ring", mixing="auto"), r"mixing='auto' keeps W dense when it has N\^2/32 entries or "
                                                   r"more: 36 of 144"),
                     (_alg("complete", mixing="auto"), "144 of 144"),
                     (_alg("torus", mixing="dense"), "mixing='dense'")):
        name = alg.topology
        with pytest.raises(ValueError, match=rf"state='{state}' under full participation: DEPOSITUM's mixing matrix W "
                                             rf"of the '{name}' topology on 12 clients is dense \(.*{why}\).* use "
                                             r"state='dense', or mixing='sparse'"):
            _run(alg, state=state)
    assert _alg("ring", mixing="auto").stream_refusal(97) == ""  # 291 < 97^2 / 32 entries: sparse, streams


def test_auto_keeps_a_dense_mixing_run_dense():
    got = _run(_alg("ring", mixing="auto"), state="auto")
    assert isinstance(got.state.x, torch.Tensor)


def test_a_gradient_tracker_start_is_refused_naming_state_dense():
    """tracker_init='gradient' starts every client's g and y apart (g_i(x^0)): no store starts so."""
    with pytest.raises(ValueError, match=r"state='disk': DEPOSITUM.init writes every client's row .* "
                                         r"use state='dense'"):
        _run(_alg("ring", tracker_init="gradient"), state="disk")
    assert isinstance(_run(_alg("ring", tracker_init="gradient"), state="auto").state.g, torch.Tensor)


# -- a large ring, star or torus: W as its non-zeros (topology.SparseTopology), never N x N ----------------------


@pytest.mark.parametrize("name", ["ring", "torus", "star"])
def test_a_graph_past_sparse_build_has_the_dense_builds_weights(name, monkeypatch):
    dense = topo.build(name, 12)
    monkeypatch.setattr(topo, "SPARSE_BUILD", 8)
    sparse = topo.build(name, 12)
    assert isinstance(sparse, topo.SparseTopology) and not isinstance(dense, topo.SparseTopology)
    np.testing.assert_allclose(sparse.W, dense.W, rtol=0, atol=1e-15)  # a star's centre sums its weights apart
    assert np.array_equal(sparse.adjacency, dense.adjacency) and list(sparse.degrees) == list(dense.degrees)
    assert sparse.nnz == dense.nnz and sparse.lambda_w == pytest.approx(dense.lambda_w, abs=1e-14)
    assert sparse == dense and hash(sparse) == hash(dense)
    for layout in ("sparse", "dense"):
        got, want = sparse.matrix(layout=layout), dense.matrix(layout=layout)
        assert got.layout == want.layout and torch.equal(got.to_dense(), torch.tensor(sparse.W))
    if name != "star":
        assert np.array_equal(sparse.W, dense.W)


def test_a_ring_of_a_hundred_thousand_is_its_non_zeros():
    ring = topo.ring(10**5)  # dense: an 80 GB W and an O(N^3) eigen-decomposition
    assert isinstance(ring, topo.SparseTopology) and ring.nnz == 3 * 10**5 and ring.mean_degree == 2
    W = ring.matrix(layout="auto")
    assert W.layout == torch.sparse_coo and W._nnz() == 3 * 10**5
    with pytest.raises(ValueError, match="connected"):
        topo.SparseTopology(4, np.array([0, 2]), np.array([1, 3]), "two edges")


@pytest.mark.parametrize("name", ["ring", "torus"])
def test_a_streamed_run_on_a_sparse_built_graph_is_the_dense_built_runs(name, monkeypatch):
    """The same W, built without its N x N array: a streamed run on it equals the dense run on the dense-built W."""
    dense = _run(_alg(name))
    monkeypatch.setattr(topo, "SPARSE_BUILD", 8)
    _chunked(monkeypatch, 5)
    alg = _alg(name)
    got = _run(alg, state="disk")
    assert isinstance(alg.graph(N), topo.SparseTopology)
    _same(got, dense)
