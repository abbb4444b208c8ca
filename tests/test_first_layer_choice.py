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


@pytest.mark.parametrize("path", ["auto", *fl.PATHS])
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
    with pytest.raises(ValueError, match="FEDKERNELS_FIRST_LAYER='bmm'.*auto, in_place, gather, gather_bmm"):
        _grads("auto", torch.float32)


def test_a_choice_that_cannot_apply_is_refused():
    with pytest.raises(ValueError, match="first_layer must be one of auto, in_place, gather, gather_bmm"):
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
def test_a_run_on_workers_records_the_path_as_one_process_does(tmp_path):
    """run --workers 2 with the batched executor records its ranks' first-layer path in summary.json
    (it recorded nothing: the distributed executor did not pass its inner executor's choice on)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "FEDKERNELS_FIRST_LAYER": "gather", "OMP_NUM_THREADS": "1"}
    got = {}
    for name, extra in (("one", []), ("two", ["--workers", "2"])):
        out = tmp_path / name
        p = subprocess.run([sys.executable, "-m", "python_algos", "run", "-a", "fedavg", "--dataset", "synthetic",
                            "-N", "4", "-K", "2", "-B", "8", "-T", "2", "--model", "mlp", "--executor", "batched",
                            *extra, "--no-progress", "--no-plot", "--out", str(out)],
                           env=env, capture_output=True, text=True, timeout=300, cwd=root)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        got[name] = json.loads((out / "summary.json").read_text()).get("first_layer")
    assert got["one"] == got["two"] == {"path": "gather", "source": "FEDKERNELS_FIRST_LAYER"}
