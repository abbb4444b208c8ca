"""Metric code reading a client stack under the distributed executor: reductions over the client
dimension must equal torch's on the full [N, d] stack (keepdim, dtype, tuple and negative dims),
and the ones it cannot all-reduce must raise, never give a rank's partial answer.

Ground truth: the same op on the plain [N, d] tensor. One rank in-process (a gloo group of one),
and 2 ranks spawned as under torchrun (slow)."""

from __future__ import annotations

import _dist_cases as C
import pytest
import torch
import torch.distributed as dist


def _check(results: dict, d: int) -> None:
    for dtype in (torch.float32, torch.float64):
        full = C.row_stack(dtype, d)
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        for name, op in C.row_ops().items():
            got, want = results[(str(dtype), name)], op(full)
            assert not isinstance(got, str), (dtype, name, got)
            assert type(got) is torch.Tensor and got.dtype == want.dtype and got.shape == want.shape, \
                (dtype, name, type(got), got.dtype, want.dtype, got.shape, want.shape)
            t = 1e-12 if want.dtype == torch.float64 else tol
            torch.testing.assert_close(got, want, rtol=t, atol=t, msg=f"{dtype} {name}")
        for name in C.row_ops_refused():
            assert results[(str(dtype), name)] == "NotImplementedError", (dtype, name, results[(str(dtype), name)])


@pytest.fixture
def one_rank():
    import python_algos as pa

    made = not dist.is_initialized()
    cs = pa.DistributedClients(C.model(), C.loss, C.problem(), inner="sequential")
    yield cs
    if made:
        dist.destroy_process_group()


def test_reductions_over_client_rows_match_torch_on_one_rank(one_rank):
    assert one_rank.world_size == 1
    _check(C.rows_results(one_rank), one_rank.dim)


def test_out_of_range_dim_raises_like_torch(one_rank):
    X = C.row_stack(torch.float64, one_rank.dim)
    with pytest.raises(IndexError, match="Dimension out of range"):
        one_rank.report(C._OpReport(lambda X: X.mean(2)), C.RowsState(X), None)
    with pytest.raises(RuntimeError, match="appears multiple times"):
        one_rank.report(C._OpReport(lambda X: X.sum((0, -2))), C.RowsState(X), None)


@pytest.mark.processes
@pytest.mark.slow
def test_reductions_over_client_rows_match_torch_on_two_ranks(tmp_path):
    from test_distributed import _spawn

    _spawn(C.rank_rows_main, 2, str(tmp_path), timeout=180)
    d = sum(p.numel() for p in C.model().parameters())
    import python_algos as pa

    f_ref, g_ref = C.objective(pa.SequentialClients(C.model(), C.loss, C.problem()))  # one process: ground truth
    for r in range(2):
        got = torch.load(tmp_path / f"rows.rank{r}.pt", weights_only=False)
        _check(got, d)
        f, g = got["objective"]  # float64 end to end: equal to 1e-12, not to float32's 1e-7
        assert type(f) is float and f == pytest.approx(f_ref, rel=1e-12, abs=0), (r, f, f_ref)
        assert g.dtype == torch.float64
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)


# --- the gossip plan: cached by W's content, not its address ------------------------------------


def _gossip(cs, X, W):
    Y = X.clone()
    cs.gossip_(Y, W)
    return Y


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_gossip_plan_follows_a_w_changed_in_place(one_rank, layout):
    from python_algos.algorithms import topology

    n, d = one_rank.num_clients, one_rank.dim
    X = C.row_stack(torch.float64, d)
    ring, full = (topology.build(t, n).matrix(torch.float64, layout=layout) for t in ("ring", "complete"))
    W = ring.clone()
    torch.testing.assert_close(_gossip(one_rank, X, W), ring.to_dense() @ X, rtol=1e-12, atol=1e-12)
    if layout == "dense":
        W.copy_(full)  # the same tensor (address) now holds another matrix
    else:
        W = W.coalesce()
        W.values().mul_(0.5)  # same indices, new values, in place
        want_w = W.to_dense()
    want_w = full if layout == "dense" else want_w
    torch.testing.assert_close(_gossip(one_rank, X, W), want_w @ X, rtol=1e-12, atol=1e-12)


def test_gossip_plan_of_a_transposed_view_is_its_own(one_rank):
    n, d = one_rank.num_clients, one_rank.dim
    X = C.row_stack(torch.float64, d)
    A = torch.rand(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    A = A / A.sum(1, keepdim=True)  # not symmetric; A.t() has A's address and shape
    torch.testing.assert_close(_gossip(one_rank, X, A), A @ X, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_gossip(one_rank, X, A.t()), A.t() @ X, rtol=1e-12, atol=1e-12)
