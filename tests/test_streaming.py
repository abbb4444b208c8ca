"""Full participation on a client-state store streams every client's rows through the executor in chunks
(issue 39 item 1; python_algos/algorithms/streamed.py): every server–client algorithm × {ram, disk} ×
{sequential, batched} × chunk sizes that do not divide N equals the dense run bit for bit (float64, clients
of unequal sizes), on a list and on a population; the chunk-invariant row sum (clients/row_sum.py) against
the order written out here; what cannot stream is refused naming state='dense'; state='auto' streams when
the dense stacks do not fit; the estimate names the chunk and the bytes streamed a round."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms.fedcanon import FedCanon
from python_algos.algorithms.fednmap import FedNMap
from python_algos.algorithms.registry import ALGORITHMS, make
from python_algos.clients import BatchedClients, SequentialClients, state_plan
from python_algos.clients.base import ClientSet
from python_algos.clients.population import Population
from python_algos.clients.row_sum import BLOCK, RowSum, sum_rows
from python_algos.clients.state_store import ClientStateStore

N = 11
SIZES = [3, 9, 5, 17, 2, 6, 30, 4, 8, 11, 7]  # unequal: the batched executor pads


def _clients():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, 4, dtype=torch.float64, generator=g), torch.randint(0, 3, (n,), generator=g))
            for n in SIZES]


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def _alg(name):
    return make(name, lr=0.05, local_steps=2, **({"init_from": "code"} if name == "feddr" else {}))


def _run(name, clients, **kw):
    alg = _alg(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate(alg, _model(), nn.functional.cross_entropy, clients, 3,
                        fk.L1(0.01) if alg.composite else fk.Zero(), seed=4, **kw)


def _rows(v):
    return v.to_dense() if isinstance(v, ClientStateStore) else v


def _untimed(rows):
    return [{k: v for k, v in r.items() if "time" not in k and k != "elapsed"} for r in rows]


def _same(got, want):
    """Bit for bit: the final model, every metric of every round, every client's rows of every stack."""
    assert torch.equal(got.params, want.params), (got.params - want.params).abs().max()
    assert _untimed(got.metrics) == _untimed(want.metrics) and got.initial == want.initial
    for f in type(want.state).client_fields:
        assert torch.equal(_rows(getattr(got.state, f)), getattr(want.state, f)), f


STREAMABLE = [n for n in ALGORITHMS if n != "depositum"]  # DEPOSITUM's gossip: tests/test_streaming_depositum.py


@pytest.mark.parametrize("executor", ["sequential", "batched"])
@pytest.mark.parametrize("name", STREAMABLE)
def test_every_server_client_algorithm_streams_bit_for_bit(name, executor, monkeypatch):
    clients = _clients()
    dense = _run(name, clients, executor=executor, batch_size=None if name in ("fedcanon", "za1") else 4)
    ran, real = [], ClientSet.stream_chunks

    def spy(self, n):  # the chunks each streamed round runs (SequentialClients' calls it through super())
        ran.append(real(self, n))
        return ran[-1]
    monkeypatch.setattr(ClientSet, "stream_chunks", spy)
    streams = bool(type(dense.state).client_fields)  # ProxFedAvg's clients keep no state: nothing to stream
    cases = (("ram", 3), ("disk", 4), ("ram", 1)) if executor == "sequential" else (("ram", 3), ("disk", 4))
    for state, size in cases:  # 11 clients: chunks 3+3+3+2, 4+4+3, eleven of 1
        ran.clear()
        monkeypatch.setattr(state_plan, "stream_rows", lambda *a, size=size: size)
        got = _run(name, clients, executor=executor, state=state,
                   batch_size=None if name in ("fedcanon", "za1") else 4)
        assert not streams or (ran and all(b - a <= size for c in ran for a, b in c) and ran[0][-1][1] == N), ran
        assert all(isinstance(getattr(got.state, f), ClientStateStore) for f in type(got.state).client_fields)
        _same(got, dense)


@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_a_population_streams_its_clients_bit_for_bit(executor, monkeypatch):
    clients = _clients()
    listed = _run("fedcanon", clients, executor=executor, batch_size=4)
    dense = _run("fedcanon", Population(N, lambda i: clients[i], cache=4), executor=executor, batch_size=4)
    monkeypatch.setattr(state_plan, "stream_rows", lambda *a: 3)
    pop = Population(N, lambda i: clients[i], cache=4)
    got = _run("fedcanon", pop, executor=executor, batch_size=4, state="disk")
    _same(got, dense)  # (the batched metric pass on a population sums blocks of its cache: the list's up to order)
    assert torch.equal(got.params, listed.params)
    assert pop.cache < N  # never all clients built at once


def test_fednmap_keeps_its_upload_in_its_own_field_and_each_chunk_its_copies(monkeypatch):
    """FedNMap uploads its field d (read back from it) and keeps replicated client copies (dbar, z_prev),
    which every chunk must start from as each client does: both downlinks, chunks of 2."""
    clients = _clients()
    monkeypatch.setattr(state_plan, "stream_rows", lambda *a: 2)
    for downlink in ("z_dbar", "z"):
        alg = FedNMap(lam=0.5, eta=0.05, local_steps=2, downlink=downlink)
        runs = [simulate(alg, _model(), nn.functional.cross_entropy, clients, 3, fk.L1(0.01), seed=4, state=s)
                for s in ("dense", "ram")]
        _same(runs[1], runs[0])


@pytest.mark.parametrize("state", ["ram", "disk"])
def test_what_cannot_stream_is_refused_naming_state_dense(state):
    class Mine(FedCanon):
        def round(self, state, clients, reg, rng=None):
            return super().round(state, clients, reg, rng)

    with pytest.raises(ValueError, match="Mine overrides round: .* use state='dense'"):
        simulate(Mine(alpha=0.5, beta=0.05, local_steps=2), _model(), nn.functional.cross_entropy, _clients(), 2,
                 state=state)
    with pytest.raises(ValueError, match=rf"state='{state}' under full participation streams .* sequential and "
                                         r"batched executors only"):
        _run("fedcanon", _clients(), state=state, executor="distributed")


def test_auto_keeps_dense_stacks_that_fit_and_streams_those_that_do_not(monkeypatch):
    clients = _clients()
    dense = _run("fedcanon2", clients)
    assert isinstance(_run("fedcanon2", clients, state="auto").state.c, torch.Tensor)
    assert isinstance(_run("depositum", clients, state="auto").state.x, torch.Tensor)  # a dense W: cannot stream
    # the dense stacks (2 x 11 x 38 float64 and 4 workspaces: 20 kB) do not fit, the streamed store does
    monkeypatch.setattr(state_plan, "memory_available", lambda: 12_000)
    monkeypatch.setattr(state_plan, "STREAM_BYTES", 3 * (2 + 1 + state_plan.WORKSPACES) * 38 * 8)  # 3 clients
    got = _run("fedcanon2", clients, state="auto")
    assert got.state.c.backend == "disk"
    _same(got, dense)


def test_the_estimate_names_the_chunk_the_executor_cuts_and_the_bytes_streamed_a_round():
    """The chunk is the executor's (a population's cache of 1,000 here), not the rows the budget holds."""
    asked = []

    class Executor:
        num_clients, dim = 10**5, 124

        def stream_chunks(self, size):
            asked.append(size)
            return [(a, min(a + 1000, 10**5)) for a in range(0, 10**5, 1000)]
    shape = state_plan.stream_cost(object(), Executor(), 1, 1, 4)
    est = state_plan.StateEstimate(10**5, 124, 4, fields=1, cohort=None, rounds=5, uploads=1, streaming=shape)
    assert asked == [state_plan.STREAM_BYTES // ((1 + 1 + state_plan.WORKSPACES) * 124 * 4)]
    assert est.chunk == 1000 and est.working_bytes == 6 * 1000 * 124 * 4
    assert est.streamed_bytes == (4 + 2) * 10**5 * 124 * 4  # each row read and written twice, each upload once
    assert f"streamed in chunks of 1000 clients ({6 * 10**5 * 124 * 4 / 2**30:.3g} GiB" in est.describe()
    assert state_plan.StateEstimate(10**5, 124, 4, 1, cohort=100, rounds=5).chunk is None
    with pytest.raises(ValueError, match="streamed round's shape"):
        state_plan.StateEstimate(10**5, 124, 4, 1, cohort=None, rounds=5)


# -- the row sum: one fixed order, whatever the chunks -----------------------------------------------------------


def _in_order(S: torch.Tensor) -> torch.Tensor:
    """The order row_sum promises, written out: blocks of BLOCK rows, each summed from its first row, the
    block sums added to a total from zero, one row at a time."""
    total = torch.zeros(S.shape[1], dtype=S.dtype)
    for a in range(0, S.shape[0], BLOCK):
        part = S[a].clone()
        for r in S[a + 1 : a + BLOCK]:
            part += r
        total += part
    return total


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_row_sum_is_the_written_order_whatever_the_chunks(dtype):
    g = torch.Generator().manual_seed(0)
    for n in (1, 5, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 7):
        S = torch.randn(n, 9, generator=g, dtype=dtype) * torch.logspace(-6, 6, n, dtype=dtype)[:, None]
        want = _in_order(S)
        assert torch.equal(sum_rows(S), want)
        for _ in range(5):
            cuts = sorted(torch.randint(0, n + 1, (4,), generator=g).tolist())
            acc = RowSum(9, dtype)
            for a, b in zip([0, *cuts], [*cuts, n]):
                acc.add_(S[a:b])
            assert torch.equal(acc.sum(), want), cuts
        row = S[0].expand(n, 9)  # a store's stack during init: a stride-0 view sums as its dense copy
        assert torch.equal(sum_rows(row), _in_order(row.contiguous()))


@pytest.mark.parametrize("dtype,wire", [(torch.float32, torch.float32), (torch.float32, torch.float64),
                                        (torch.float64, torch.float64)])
def test_a_running_sum_handed_on_through_its_state_continues_in_order(dtype, wire):
    """RowSum.state / load, as the distributed executor's ranks hand a mean's (and the metric pass's) running
    sum on: each shard loads its predecessor's state (2d + 1 numbers, sent as ``wire``) and adds its rows."""
    g = torch.Generator().manual_seed(1)
    for n in (1, BLOCK - 1, BLOCK + 1, 3 * BLOCK + 7):
        S = torch.randn(n, 5, generator=g, dtype=dtype) * torch.logspace(-6, 6, n, dtype=dtype)[:, None]
        for _ in range(6):
            cuts, buf = sorted(torch.randint(0, n + 1, (3,), generator=g).tolist()), None
            for a, b in zip([0, *cuts], [*cuts, n]):
                acc = RowSum(5, dtype) if buf is None else RowSum(5, dtype).load(buf)
                buf = acc.add_(S[a:b]).state(torch.full((2 * 5 + 1,), float("nan"), dtype=wire))
            assert torch.equal(acc.sum(), _in_order(S)) and int(buf[-1]) == n % BLOCK, cuts


def test_every_executor_means_in_that_order():
    """The dense path is the row sum (a streamed round's sums equal it), over the rows or the divisor."""
    S = torch.randn(200, 7, dtype=torch.float64) * torch.logspace(-8, 8, 200, dtype=torch.float64)[:, None]
    for executor in ("sequential", "batched"):
        cs = _clientset(executor)
        assert torch.equal(cs.mean(S), _in_order(S) / 200)
        assert torch.equal(cs.mean(S[:30], torch.arange(30), divisor=200), _in_order(S[:30]) / 200)


def _clientset(executor):
    cls = SequentialClients if executor == "sequential" else BatchedClients
    return cls(_model(), nn.functional.cross_entropy, _clients())


def test_run_streams_full_participation_on_disk_as_dense_and_prints_the_chunk(tmp_path, capsys):
    from python_algos.experiments.cli import main
    from python_algos.runfolder.files import read_metrics

    base = ["run", "--dataset", "sparse_logistic", "--data-opt", "n=240", "--data-opt", "dim=10", "--data-opt", "nnz=3",
            "-N", "12", "-K", "2", "-B", "4", "--dtype", "float64", "--executor", "sequential", "--no-progress",
            "--no-plot", "-a", "fedcanon", "-T", "3"]
    for state in ("dense", "disk"):
        assert main([*base, "--state", state, "--out", str(tmp_path / state)]) == 0
    out = capsys.readouterr().out

    def results(folder):
        rows = [{k: v for k, v in r.items() if "time" not in k and k != "elapsed"} for r in read_metrics(str(folder))]
        return torch.load(folder / "model.pt", weights_only=True)["params"], rows

    (x, rows), (x_disk, rows_disk) = results(tmp_path / "dense"), results(tmp_path / "disk")
    assert torch.equal(x_disk, x) and rows_disk == rows
    line = [s for s in out.splitlines() if s.startswith("memory: state ")][1]
    assert "(disk: rows written only, in files)" in line and "streamed in chunks of 12 clients" in line, line


def test_a_streamed_disk_run_resumes_from_its_checkpoint_bit_identically(tmp_path, monkeypatch):
    """Stopped a round past its checkpoint (the store's files ahead of it), a streamed state='disk' run resumes
    from the checkpoint to the uninterrupted dense run's model, metrics and rows."""
    from python_algos.runfolder import checkpoint as ckpt
    from python_algos.runfolder.callbacks import Checkpoint

    monkeypatch.setattr(state_plan, "stream_rows", lambda *a: 4)
    clients, alg = _clients(), FedCanon(alpha=0.5, beta=0.05, local_steps=2)

    def run(**kw):
        return simulate(alg, _model(), nn.functional.cross_entropy, clients, 6, fk.L1(0.01), seed=4, batch_size=4,
                        **kw)
    full = run()
    where, saver = str(tmp_path / "state"), ckpt.Checkpointer(str(tmp_path / "ck.pt"))
    run(state="disk", state_folder=where, callbacks=[lambda t, s, m: t == 3, Checkpoint(saver, 2)])
    snap = ckpt.load(str(tmp_path / "ck.pt"))
    assert snap["round"] == 2
    resumed = run(state="disk", state_folder=where, resume=snap)
    assert torch.equal(resumed.params, full.params)
    assert _untimed(resumed.metrics) == _untimed(full.metrics[2:])
    assert torch.equal(resumed.state.c.to_dense(), full.state.c)
