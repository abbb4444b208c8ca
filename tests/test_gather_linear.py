"""fk.raw.linear_gathered / linear_gathered_weight_grad (csrc/cpu/gather_linear.cpp) against plain
PyTorch (X[idx] then torch.bmm) in every CPU variant; each client's bits independent of the thread
count, the batch and its position; every refused argument refused before anything is written.
"""

import pytest
import torch

import fedkernels as fk
from fedkernels import _C

VARIANTS = _C.cpu_isa_variants().split(",")
FWD, GRAD = fk.raw.linear_gathered, fk.raw.linear_gathered_weight_grad

# (c, o, i, P, n): the target shape, sizes of 1, i and P off every vector width and block size,
# o off the output block size, o = 64 and 128 (several output blocks), zero sizes
SHAPES = [(3, 10, 784, 32, 500), (1, 1, 1, 1, 1), (2, 1, 17, 1, 5), (5, 7, 33, 5, 40), (4, 13, 17, 9, 30),
          (2, 64, 100, 3, 10), (2, 128, 65, 6, 9), (3, 6, 16, 4, 7), (6, 3, 15, 7, 11), (2, 11, 129, 33, 50),
          (0, 4, 8, 3, 5), (2, 3, 0, 4, 5), (2, 3, 8, 0, 5), (2, 0, 8, 3, 5)]


def _strided(c, o, k, dtype, pad, gen):
    """[c, o, k] as the caller passes it: a column slice of a wider [c, d] stack (stride(0) > o*k)."""
    stack = torch.randn(c, o * k + 2 * pad, generator=gen, dtype=torch.float64).to(dtype)
    return stack[:, pad:pad + o * k].view(c, o, k)


def _case(c, o, i, P, n, dtype=torch.float64, pad=0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, i, generator=gen, dtype=torch.float64).to(dtype)
    idx = torch.randint(0, n, (c, P), generator=gen)
    W = _strided(c, o, i, dtype, pad, gen)
    D = _strided(c, o, P, dtype, pad, gen)
    return W, D, X, idx


def _run(fn, isa, threads, *args):
    before = fk.get_num_threads()
    _C.set_cpu_isa(isa)
    fk.set_num_threads(threads)
    try:
        return fn(*args)
    finally:
        _C.set_cpu_isa("auto")
        fk.set_num_threads(before)


def _bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_both_products_match_index_select_and_bmm_in_float64(shape, isa):
    c, o, i, P, n = shape
    for pad in (0, 3):  # contiguous stacks, and column slices of wider stacks
        W, D, X, idx = _case(*shape, pad=pad)
        out = _strided(c, o, P, torch.float64, pad, torch.Generator().manual_seed(9))
        grad = _strided(c, o, i, torch.float64, pad, torch.Generator().manual_seed(9))
        assert _run(FWD, isa, 1, W, X, idx, out) is out
        assert _run(GRAD, isa, 1, D, X, idx, grad) is grad
        torch.testing.assert_close(out, torch.bmm(W, X[idx].transpose(1, 2)), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad, torch.bmm(D, X[idx]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("isa", VARIANTS)
def test_float32_matches_the_float64_products(isa):
    W, D, X, idx = _case(5, 10, 784, 32, 300, dtype=torch.float32, pad=5)
    out, grad = torch.empty(5, 10, 32), torch.empty(5, 10, 784)
    _run(FWD, isa, 1, W, X, idx, out)
    _run(GRAD, isa, 1, D, X, idx, grad)
    Xd = X.double()[idx]
    torch.testing.assert_close(out.double(), torch.bmm(W.double(), Xd.transpose(1, 2)), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad.double(), torch.bmm(D.double(), Xd), rtol=1e-5, atol=1e-4)


def test_duplicate_rows_within_a_client_count_every_time():
    W, D, X, idx = _case(3, 5, 40, 6, 20)
    idx[0] = 7  # one row six times
    idx[1, :3] = idx[1, 3:]
    out, grad = torch.empty(3, 5, 6, dtype=torch.float64), torch.empty(3, 5, 40, dtype=torch.float64)
    torch.testing.assert_close(FWD(W, X, idx, out), torch.bmm(W, X[idx].transpose(1, 2)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(GRAD(D, X, idx, grad), torch.bmm(D, X[idx]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("isa", VARIANTS)
def test_each_clients_bits_do_not_depend_on_threads_batch_or_position(isa, dtype):
    # c * P * i = 8 * 9 * 601 > 32 K: the call is split over threads when 2 are allowed
    c, o, i, P = 8, 7, 601, 9
    W, D, X, idx = _case(c, o, i, P, 400, dtype=dtype, pad=2)
    for fn, mat, k in ((FWD, W, P), (GRAD, D, i)):
        want = _run(fn, isa, 1, mat, X, idx, torch.empty(c, o, k, dtype=dtype))
        got = _run(fn, isa, 2, mat, X, idx, torch.empty(c, o, k, dtype=dtype))
        assert torch.equal(_bits(got), _bits(want)), fn.__name__
        rev = torch.arange(c - 1, -1, -1)
        got = _run(fn, isa, 2, mat[rev], X, idx[rev].contiguous(), torch.empty(c, o, k, dtype=dtype))
        assert torch.equal(_bits(got[rev]), _bits(want)), fn.__name__
        for j in (0, 3, c - 1):
            alone = _run(fn, isa, 1, mat[j:j + 1], X, idx[j:j + 1], torch.empty(1, o, k, dtype=dtype))
            assert torch.equal(_bits(alone[0]), _bits(want[j])), (fn.__name__, j)


def test_no_clients_is_a_no_op():
    X = torch.randn(4, 3)
    idx = torch.empty(0, 2, dtype=torch.int64)
    assert FWD(torch.empty(0, 5, 3), X, idx, torch.empty(0, 5, 2)).shape == (0, 5, 2)
    assert GRAD(torch.empty(0, 5, 2), X, idx, torch.empty(0, 5, 3)).shape == (0, 5, 3)


def test_outputs_interleaved_with_the_weights_in_one_stack_are_accepted():
    # W and out are disjoint column slices of the same [c, d] stack: their spans overlap, their bytes do not
    c, o, i, P = 4, 3, 5, 2
    stack = torch.randn(c, o * i + o * P + 1, dtype=torch.float64)
    W, out = stack[:, :o * i].view(c, o, i), stack[:, o * i + 1:].view(c, o, P)
    X, idx = torch.randn(6, i, dtype=torch.float64), torch.randint(0, 6, (c, P))
    want = torch.bmm(W, X[idx].transpose(1, 2))
    torch.testing.assert_close(FWD(W, X, idx, out), want, rtol=1e-12, atol=1e-12)


def _valid(weight_grad):
    c, o, i, P, n = 3, 4, 6, 5, 10
    W, D, X, idx = _case(c, o, i, P, n)
    out = torch.zeros(c, o, i if weight_grad else P, dtype=torch.float64)
    return {"mat": D if weight_grad else W, "X": X, "idx": idx, "out": out}


def _bad_cases():
    """(name, change to the valid arguments, exception, words in the message)"""
    f32 = torch.float32
    return [
        ("mat not a tensor", lambda a: a.update(mat=[[1.0]]), TypeError, "must be a torch.Tensor"),
        ("X on meta", lambda a: a.update(X=torch.empty(a["X"].shape, device="meta", dtype=torch.float64)),
         ValueError, "CPU tensors only"),
        ("mat float16", lambda a: a.update(mat=a["mat"].half()), TypeError, "float32 or float64"),
        ("X int", lambda a: a.update(X=a["X"].long()), TypeError, "X must be float32 or float64"),
        ("mat float32", lambda a: a.update(mat=a["mat"].to(f32)), TypeError, "share a dtype"),
        ("idx int32", lambda a: a.update(idx=a["idx"].int()), TypeError, "idx must be an int64"),
        ("X 1-D", lambda a: a.update(X=a["X"][0]), ValueError, "X must be 2-D"),
        ("idx 1-D", lambda a: a.update(idx=a["idx"][0]), ValueError, "idx must be 2-D"),
        ("mat 2-D", lambda a: a.update(mat=a["mat"][0]), ValueError, "must be 3-D"),
        ("mat wrong c", lambda a: a.update(mat=a["mat"][:2]), ValueError, "expected"),
        ("mat wrong inner", lambda a: a.update(mat=a["mat"][:, :, :-1].contiguous()), ValueError, "expected"),
        ("out wrong shape", lambda a: a.update(out=a["out"][:, :-1]), ValueError, "out has shape"),
        ("X not contiguous", lambda a: a.update(X=torch.randn(a["X"].shape[1], 10, dtype=torch.float64).t()),
         ValueError, "X must be contiguous"),
        ("idx not contiguous", lambda a: a.update(idx=a["idx"].t().contiguous().t()), ValueError,
         "idx must be contiguous"),
        ("mat inner transposed", lambda a: a.update(mat=a["mat"].transpose(1, 2).contiguous().transpose(1, 2)),
         ValueError, "contiguous"),
        ("out clients overlap",
         lambda a: a.update(out=a["out"].as_strided(a["out"].shape, (1,) + a["out"].stride()[1:])),
         ValueError, "stride(0)"),
        ("idx negative", lambda a: a["idx"].__setitem__((1, 2), -1), ValueError, "got -1"),
        ("idx too large", lambda a: a["idx"].__setitem__((2, 0), 10), ValueError, "[0, 10)"),
        ("out requires grad", lambda a: a.update(out=a["out"].requires_grad_()), RuntimeError, "requires grad"),
    ]


@pytest.mark.parametrize("weight_grad", [False, True], ids=["forward", "weight_grad"])
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_arguments_are_refused_before_anything_is_written(case, weight_grad):
    _, change, exc, words = case
    args = _valid(weight_grad)
    change(args)
    out = args["out"]
    before = out.detach().clone()
    fn = GRAD if weight_grad else FWD
    with pytest.raises(exc) as info:
        fn(args["mat"], args["X"], args["idx"], out)
    assert words in str(info.value)
    assert torch.equal(out.detach(), before)


@pytest.mark.parametrize("weight_grad", [False, True], ids=["forward", "weight_grad"])
@pytest.mark.parametrize("target", ["mat", "X", "idx"])
def test_an_output_overlapping_an_input_is_refused(target, weight_grad):
    args = _valid(weight_grad)
    shape = args["out"].shape
    src = args[target]
    # out's first client block inside the input's memory (idx: its int64 bytes seen as float64)
    flat = src.view(torch.float64).reshape(-1) if target == "idx" else src.reshape(-1)
    store = torch.zeros(flat.numel() + shape.numel(), dtype=torch.float64)
    store[: flat.numel()] = flat
    if target == "X":
        args["X"] = store[: flat.numel()].view(src.shape)
    elif target == "idx":
        args["idx"] = store[: flat.numel()].view(torch.int64).view(src.shape)
    else:
        args["mat"] = store[: flat.numel()].view(src.shape)
    out = store[1: 1 + shape.numel()].view(shape)
    before = store.clone()
    with pytest.raises(ValueError, match="shares memory with"):
        (GRAD if weight_grad else FWD)(args["mat"], args["X"], args["idx"], out)
    assert torch.equal(store, before)


FMA_VARIANTS = [v for v in VARIANTS if v != "baseline"]


@pytest.mark.skipif(len(FMA_VARIANTS) < 2, reason="one FMA variant on this CPU: nothing to compare")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_which_variants_share_the_bits(dtype):
    """What a calibration among the gathered kernels' CPU variants could keep bit for bit
    (fedkernels.first_layer, issue 40): the weight gradient is the same in every FMA variant (each
    value a fused multiply-add per sample, in sample order, whatever the vector width); the forward
    product's lane sums follow the vector width, so its variants are not interchangeable."""
    for shape in SHAPES:
        c, o, i, P, _ = shape
        W, D, X, idx = _case(*shape, dtype=dtype)
        grads = [_run(GRAD, v, 1, D, X, idx, torch.empty(c, o, i, dtype=dtype)) for v in FMA_VARIANTS]
        assert all(torch.equal(_bits(g), _bits(grads[0])) for g in grads[1:]), shape
