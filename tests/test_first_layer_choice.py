"""The batched executor's first-layer path (fedkernels.first_layer, issue 40 item 1): every path gives
a plain-PyTorch float64 reference's gradients; "auto" (whichever of the two bitwise-identical paths
the calibration picks) gives the bits of "in_place"; the calibration is cached per shape in the
elementwise calibration's entry and read back without measuring; FEDKERNELS_FIRST_LAYER and the
executor option override it; a corrupt cache is ignored; the choice is refused where it cannot
apply, shown by backend_info() and recorded in the run's setup.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedkernels as fk
import python_algos as pa
from fedkernels import _C, _calibrate
from fedkernels import first_layer as fl
from python_algos.algorithms.registry import make
from python_algos.clients import BatchedClients

N, D, K = 6, 23, 5  # 23 inputs: the gathered kernels' vector tails are exercised too


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test calibrates into a cache folder of its own, from an empty in-process memo."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(fl.ENV, raising=False)
    monkeypatch.setattr(fl, "_made", {})
    return tmp_path / "fedkernels" / _calibrate.CACHE_FILE


def _clients(dtype, sizes=(9, 12, 7, 12, 10, 12)):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, D, generator=g, dtype=dtype), torch.randint(0, K, (n,), generator=g)) for n in sizes]


def _net(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, K)).to(dtype)


def _grads(path, dtype, batch_size=None, data=None):
    model, data = _net(dtype), data if data is not None else _clients(dtype)
    cs = BatchedClients(model, F.cross_entropy, data, batch_size=batch_size, seed=3, first_layer=path)
    X = fk.FlatParams(model).params.detach().expand(N, -1).clone()
    X.add_(torch.randn(X.shape, generator=torch.Generator().manual_seed(2), dtype=dtype) * 0.1)
    G = torch.empty_like(X)
    cs.gradients_(X, G)
    return cs, X, G


def _force(monkeypatch, fastest):
    """The calibration measures `fastest` as the fastest path."""
    monkeypatch.setattr(fl, "measure", lambda *a: {p: (0.5 if p == fastest else 1.0) for p in fl.PATHS})


@pytest.mark.parametrize("path", ["auto", *(p for p in fl.PATHS if p not in fl.LOWER_PRECISION)])
def test_every_path_gives_the_float64_reference(path):
    cs, X, G = _grads(path, torch.float64)
    assert cs.first_layer in fl.IDENTICAL if path == "auto" else cs.first_layer == path
    model = _net(torch.float64)
    for j, (x, y) in enumerate(_clients(torch.float64)):  # full batches: each client's whole data
        fk.FlatParams(model).params.data.copy_(X[j])
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        want = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        torch.testing.assert_close(G[j], want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fastest", fl.IDENTICAL)
def test_auto_gives_the_bits_of_in_place_whichever_it_picks(monkeypatch, dtype, fastest):
    _force(monkeypatch, fastest)
    data = _clients(dtype, sizes=(40, 33, 57, 40, 64, 35))
    cs, _, G = _grads("auto", dtype, batch_size=16, data=data)
    assert (cs.first_layer, cs.first_layer_source) == (fastest, "calibrated")
    _, _, want = _grads("in_place", dtype, batch_size=16, data=data)
    assert torch.equal(G, want)
    _, _, other = _grads("gather_bmm", dtype, batch_size=16, data=data)  # another order: close, not chosen
    torch.testing.assert_close(other, want)


def test_the_calibration_is_cached_per_shape_and_read_back_without_measuring(monkeypatch, private_cache):
    _force(monkeypatch, "gather")
    cs, _, _ = _grads("auto", torch.float32, batch_size=4)
    key = fl.shape_key(cs._X_rows, 8, 4)
    threads = f"{fk.get_num_threads()}/{torch.get_num_threads()}"
    assert key == f"float32 i={D} o=8 P=4 {_C.cpu_gather_isa()} threads={threads}"
    entry = json.loads(private_cache.read_text())[_calibrate.cache_key(_C)]
    assert entry["first_layer"][key]["path"] == "gather" and set(entry["first_layer"][key]["seconds"]) == set(fl.PATHS)
    assert fk.backend_info()["first_layer"]["choices"][key]["path"] == "gather"

    def no_measuring(*a):
        raise AssertionError("measured again")

    monkeypatch.setattr(fl, "measure", no_measuring)
    monkeypatch.setattr(fl, "_made", {})  # a new process: only the file remembers
    cs, _, _ = _grads("auto", torch.float32, batch_size=4)
    assert (cs.first_layer, cs.first_layer_source) == ("gather", "calibration cache")
    _force(monkeypatch, "in_place")  # another shape (P = 5) is measured, the first one's entry stays
    cs, _, _ = _grads("auto", torch.float32, batch_size=5)
    table = json.loads(private_cache.read_text())[_calibrate.cache_key(_C)]["first_layer"]
    assert (cs.first_layer_source, table[key]["path"], len(table)) == ("calibrated", "gather", 2)


def test_the_cache_keeps_a_bounded_number_of_shapes(monkeypatch, private_cache):
    monkeypatch.setattr(fl, "_MAX_SHAPES", 3)
    _force(monkeypatch, "gather")
    X = torch.randn(50, 7)
    for P in range(1, 6):
        fl.choose(X, 2, P, 4)
    table = json.loads(private_cache.read_text())[_calibrate.cache_key(_C)]["first_layer"]
    assert sorted(table) == sorted(fl.shape_key(X, 2, P) for P in (3, 4, 5))


def test_the_elementwise_entry_and_the_first_layer_share_the_file(monkeypatch, private_cache):
    key = _calibrate.cache_key(_C)
    _calibrate.write_cache(str(private_cache), key, ("avx2", "baseline"), {"avx2": {}})
    _force(monkeypatch, "in_place")
    _grads("auto", torch.float32, batch_size=4)
    entry = json.loads(private_cache.read_text())[key]
    assert (entry["isa"], entry["plain"], len(entry["first_layer"])) == ("avx2", "baseline", 1)
    _calibrate.write_cache(str(private_cache), key, ("avx512", "avx2"), {})  # a recalibration keeps it
    assert len(json.loads(private_cache.read_text())[key]["first_layer"]) == 1


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"%KEY%": "gather"}', '{"%KEY%": {"first_layer": 3}}',
                                  '{"%KEY%": {"first_layer": {"%SHAPE%": {"path": "gather_bmm"}}}}',
                                  '{"%KEY%": {"first_layer": {"%SHAPE%": "gather"}}}'])
def test_a_corrupt_cache_is_ignored_and_rewritten(monkeypatch, private_cache, text):
    shape = f"float32 i={D} o=8 P=4 {_C.cpu_gather_isa()} threads={fk.get_num_threads()}/{torch.get_num_threads()}"
    private_cache.parent.mkdir(parents=True, exist_ok=True)
    private_cache.write_text(text.replace("%KEY%", _calibrate.cache_key(_C)).replace("%SHAPE%", shape))
    _force(monkeypatch, "gather")
    cs, _, _ = _grads("auto", torch.float32, batch_size=4)
    assert (cs.first_layer, cs.first_layer_source) == ("gather", "calibrated")
    assert json.loads(private_cache.read_text())[_calibrate.cache_key(_C)]["first_layer"][shape]["path"] == "gather"


def test_the_environment_variable_and_the_option_override_the_calibration(monkeypatch):
    monkeypatch.setattr(fl, "measure", lambda *a: pytest.fail("measured under an override"))
    monkeypatch.setenv(fl.ENV, "gather_bmm")
    cs, _, _ = _grads("auto", torch.float32)
    assert (cs.first_layer, cs.first_layer_source, cs.rows_in_place) == ("gather_bmm", fl.ENV, False)
    assert fk.backend_info()["first_layer"]["override"] == "gather_bmm"
    cs, _, _ = _grads("gather", torch.float32)  # the executor option wins
    assert (cs.first_layer, cs.first_layer_source) == ("gather", "executor option")
    monkeypatch.setenv(fl.ENV, "bmm")
    with pytest.raises(ValueError, match=f"FEDKERNELS_FIRST_LAYER='bmm'.*{', '.join(fl.REQUESTS)}"):
        _grads("auto", torch.float32)


def test_a_choice_that_cannot_apply_is_refused():
    with pytest.raises(ValueError, match="first_layer must be one of auto, auto_bf16, in_place, gather, gather_bmm, "
                                         "bf16, got 'fast'"):
        _grads("fast", torch.float32)
    conv = nn.Sequential(nn.Unflatten(1, (1, D)), nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(2 * (D - 2), K))
    with pytest.raises(ValueError, match="first_layer='gather_bmm' cannot apply: the model runs through torch.func"):
        BatchedClients(conv, F.cross_entropy, _clients(torch.float32), first_layer="gather_bmm")
    act_first = nn.Sequential(nn.Tanh(), nn.Linear(D, K))
    with pytest.raises(ValueError, match="first_layer='in_place' cannot apply: .*starts with a Linear layer"):
        BatchedClients(act_first, F.cross_entropy, _clients(torch.float32), first_layer="in_place")
    cs = BatchedClients(act_first, F.cross_entropy, _clients(torch.float32))
    assert (cs.first_layer, cs.first_layer_source) == ("gather_bmm", "only path")
    assert BatchedClients(conv, F.cross_entropy, _clients(torch.float32)).first_layer is None


def test_the_run_records_the_path(monkeypatch):
    _force(monkeypatch, "gather")
    hist = pa.simulate(make("fedavg", lr=0.1, local_steps=2), _net(torch.float32), F.cross_entropy,
                       _clients(torch.float32), 2, batch_size=4, seed=3, executor="batched")
    assert hist.setup["first_layer"] == {"path": "gather", "source": "calibrated"}


@pytest.mark.processes
@pytest.mark.parametrize("path", ["gather", "bf16"])
def test_a_run_on_workers_records_the_path_as_one_process_does(tmp_path, path):
    """run --workers 2 with the batched executor records its ranks' first-layer path in summary.json
    (it recorded nothing: the distributed executor did not pass its inner executor's choice on)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "FEDKERNELS_FIRST_LAYER": path, "OMP_NUM_THREADS": "1"}
    got = {}
    for name, extra in (("one", []), ("two", ["--workers", "2"])):
        out = tmp_path / name
        p = subprocess.run([sys.executable, "-m", "python_algos", "run", "-a", "fedavg", "--dataset", "synthetic",
                            "-N", "4", "-K", "2", "-B", "8", "-T", "2", "--model", "mlp", "--executor", "batched",
                            *extra, "--no-progress", "--no-plot", "--out", str(out)],
                           env=env, capture_output=True, text=True, timeout=300, cwd=root)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        got[name] = json.loads((out / "summary.json").read_text()).get("first_layer")
    assert got["one"] == got["two"] == {"path": path, "source": "FEDKERNELS_FIRST_LAYER"}


# --- "bf16": the first layer's products in bfloat16, only when asked for --------------------------------------- #
# bfloat16 keeps 8 significant bits: rounding to nearest moves a value by at most U = 2^-8 of itself. A product of two
# bfloat16 values is exact in float32 (16 bits), so a float32 sum of k of them errs by at most (k - 1) 2^-24
# sum |a_j b_j| in any order; the one rounding of the result to bfloat16 adds U |result|.
U = 2.0**-8


def _bf16_bound(ref, A16, B16):
    """The bound above, with a factor 2 for the second-order terms: ``|bmm_bf16(A, B) - ref| <= this``."""
    k = A16.shape[-1]
    return 2 * (U * ref.abs() + k * 2.0**-24 * torch.bmm(A16.abs(), B16.abs()))


@pytest.mark.parametrize("c, m, k, n", [(3, 10, 784, 32), (4, 128, 32, 784), (2, 7, 23, 5)])
def test_bmm_bf16_is_a_bfloat16_product_summed_in_float32(c, m, k, n):
    """Forward ([c, o, i] x [c, i, P]) and weight-gradient ([c, o, P] x [c, P, i]) shapes against the
    float64 product of the bfloat16-rounded inputs."""
    g = torch.Generator().manual_seed(c * m)
    A = torch.randn(c, m, k, generator=g)
    B16 = torch.randn(c, n, k, generator=g).to(torch.bfloat16).transpose(1, 2)  # a transposed view, as the chain's
    got = fl.bmm_bf16(A, B16, torch.empty(c, m, n))
    A16 = A.to(torch.bfloat16).double()
    ref = torch.bmm(A16, B16.double())
    assert ((got.double() - ref).abs() <= _bf16_bound(ref, A16, B16.double())).all()
    assert torch.equal(got, got.to(torch.bfloat16).float())  # rounded to bfloat16 once, at the end
    f32 = torch.bmm(A, B16.float())  # the float32 product of the same samples: A's rounding shows
    assert (got - f32).abs().max() > 1e-3 * f32.abs().max()


def test_bf16_gradients_are_within_the_bfloat16_bound_of_a_float64_reference():
    """Logistic regression through the executor with first_layer='bf16' (both products of the first layer in
    bfloat16) against float64 autograd on the bfloat16-rounded samples and weights. The bound carries the forward
    product's error (the bound above) through the softmax (its Jacobian's infinity norm is at most 1/2) into the
    weight gradient's product."""
    torch.manual_seed(0)
    model, data = nn.Linear(D, K), _clients(torch.float32)
    cs = BatchedClients(model, F.cross_entropy, data, seed=3, first_layer="bf16")
    X = fk.FlatParams(model).params.detach().expand(N, -1).clone()
    X.add_(torch.randn(X.shape, generator=torch.Generator().manual_seed(2)) * 0.3)
    G = cs.gradients_(X, torch.empty_like(X))
    for j, (x, y) in enumerate(data):
        W16, b = X[j, : K * D].view(K, D).bfloat16().double(), X[j, K * D :].double()
        x16 = x.bfloat16().double().unsqueeze(0)
        prod = torch.bmm(W16.unsqueeze(0), x16.transpose(1, 2))  # [1, K, n]
        z = (prod[0].T + b).requires_grad_(True)
        F.cross_entropy(z, y).backward()
        d = z.grad.T.unsqueeze(0)  # [1, K, n]: d loss / d logits
        e_d = 0.5 * _bf16_bound(prod, W16.unsqueeze(0), x16.transpose(1, 2)).amax(1, keepdim=True) / x.shape[0]
        e_d = e_d + 1e-6 / x.shape[0]  # the float32 softmax
        gw = torch.bmm(d, x16)[0]
        e_gw = _bf16_bound(gw.unsqueeze(0), d, x16)[0] + 2 * torch.bmm(U * d.abs() + e_d, x16.abs())[0]
        assert ((G[j, : K * D].view(K, D).double() - gw).abs() <= e_gw).all(), j
        assert ((G[j, K * D :].double() - d[0].sum(1)).abs() <= e_d[0].sum(1) * 2).all(), j
    want = BatchedClients(model, F.cross_entropy, data, seed=3, first_layer="in_place").gradients_(X, X.clone())
    # lower precision indeed, in both products: the weight gradient is a bfloat16 product's (8 significant bits),
    # and the bias gradient (float32 sums of the loss's gradient) carries the forward product's rounding
    assert torch.equal(G[:, : K * D], G[:, : K * D].bfloat16().float())
    assert not torch.allclose(G[:, K * D :], want[:, K * D :], rtol=1e-4, atol=0)


def test_the_forward_product_rounds_the_weights_to_bfloat16():
    """Weights (k + 1)(1 + 2^-10) (bfloat16: k + 1) on samples in {-1, 0, 1}: the logits (k + 1) sum(x) are integers
    below 256, exact in bfloat16, so the bf16 path's loss is the float64 loss of the rounded weights (to float32's
    rounding); the unrounded weights' loss is 2^-10 away (relative)."""
    g = torch.Generator().manual_seed(5)
    data = [(torch.randint(-1, 2, (n, D), generator=g).float(), torch.randint(0, K, (n,), generator=g)) for n in (6, 9)]
    model = nn.Linear(D, K)
    with torch.no_grad():
        model.weight.copy_(torch.arange(1.0, K + 1).unsqueeze(1).expand(K, D) * (1 + 2.0**-10))
        model.bias.zero_()
    x = fk.FlatParams(model).params.detach().clone()
    f = BatchedClients(model, F.cross_entropy, data, first_layer="bf16").full_objective_(x, torch.empty_like(x))

    def loss(scale):
        return sum(float(F.cross_entropy(scale * X.double().sum(1, keepdim=True) * torch.arange(1.0, K + 1, dtype=
                                         torch.float64), y)) for X, y in data) / len(data)

    assert abs(f - loss(1.0)) <= 1e-5 * loss(1.0) and abs(f - loss(1 + 2.0**-10)) >= 5e-4 * loss(1.0)


def test_bf16_bits_do_not_depend_on_how_clients_are_cut_into_passes():
    data = _clients(torch.float32, sizes=(40, 33, 57, 40, 64, 35))
    runs = [BatchedClients(_net(torch.float32), F.cross_entropy, data, batch_size=16, seed=3, first_layer="bf16",
                           chunk_clients=cc) for cc in (None, 2, 4)]
    X = fk.FlatParams(_net(torch.float32)).params.detach().expand(N, -1).clone()
    Gs = [cs.gradients_(X, torch.empty_like(X)) for cs in runs]
    assert torch.equal(Gs[0], Gs[1]) and torch.equal(Gs[0], Gs[2])


def test_a_short_bf16_run_stays_close_to_the_float32_run():
    f = {}
    for path in ("in_place", "bf16"):
        hist = pa.simulate(make("fedavg", lr=0.1, local_steps=2), _net(torch.float32), F.cross_entropy,
                           _clients(torch.float32), 3, batch_size=4, seed=3, executor="batched",
                           executor_options={"first_layer": path})
        f[path] = hist.last["f"]
        assert hist.setup["first_layer"] == {"path": path, "source": "executor option"}
    assert f["bf16"] != f["in_place"] and abs(f["bf16"] - f["in_place"]) < 1e-2 * abs(f["in_place"])


def test_bf16_is_refused_outside_float32(monkeypatch):
    for request in ("bf16", "auto_bf16"):
        with pytest.raises(ValueError, match=f"first_layer='{request}' computes the first layer in bfloat16, which "
                                             "only a float32 run allows; this run is float64: use first_layer='auto'"):
            _grads(request, torch.float64)
    monkeypatch.setenv(fl.ENV, "bf16")
    with pytest.raises(ValueError, match="FEDKERNELS_FIRST_LAYER='bf16' computes .* float64: unset FEDKERNELS_FIRST"):
        _grads("auto", torch.float64)
    cs, _, _ = _grads("auto", torch.float32)  # a float32 run takes it
    assert (cs.first_layer, cs.first_layer_source, cs.rows_in_place) == ("bf16", fl.ENV, False)


def test_auto_never_takes_bf16_and_auto_bf16_takes_it_only_where_faster(monkeypatch, private_cache):
    _force(monkeypatch, "bf16")
    cs, _, _ = _grads("auto", torch.float32, batch_size=4)
    assert cs.first_layer in fl.IDENTICAL and cs._X_bf16 is None
    cs, _, G = _grads("auto_bf16", torch.float32, batch_size=4)
    # the forced measurement timed bf16 under "auto" too: the cached seconds serve "auto_bf16"
    assert (cs.first_layer, cs.first_layer_source) == ("bf16", "calibration cache, auto_bf16")
    assert torch.equal(G, _grads("bf16", torch.float32, batch_size=4)[2])
    key = fl.shape_key(cs._X_rows, 8, 4)
    assert fk.backend_info()["first_layer"]["choices"][f"{key} auto_bf16"]["path"] == "bf16"
    monkeypatch.setattr(fl, "_made", {})
    private_cache.unlink()
    _force(monkeypatch, "gather")  # bf16 slower: the identical path
    assert _grads("auto_bf16", torch.float32, batch_size=4)[0].first_layer == "gather"


def test_auto_bf16_measures_once_then_reads_the_cache(monkeypatch, private_cache):
    timed = []
    real = fl.measure
    monkeypatch.setattr(fl, "measure", lambda *a: timed.append(a[4] is not None) or real(*a))
    _grads("auto", torch.float32, batch_size=4)  # bf16 not timed under "auto"
    monkeypatch.setattr(fl, "_made", {})
    cs, _, _ = _grads("auto_bf16", torch.float32, batch_size=4)  # the cached entry lacks bf16: timed now
    assert timed == [False, True]
    assert set(fl.choices_made()[f"{fl.shape_key(cs._X_rows, 8, 4)} auto_bf16"]["seconds"]) == set(fl.PATHS)
    monkeypatch.setattr(fl, "_made", {})
    for request in ("auto", "auto_bf16"):
        cs, _, _ = _grads(request, torch.float32, batch_size=4)
        assert cs.first_layer_source.startswith("calibration cache")
    assert timed == [False, True]
