"""What the Flower server checks before it trusts a node's reply or a run config: each upload's names,
shape, dtype and finiteness (a bad one stops the run naming the client and its node, before anything
enters the server's average), and ``resume=true`` with no checkpoint at the given path (refused, not a
silent new run). Unit level: the checking functions on hand-made replies; no Flower process."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

flwr = pytest.importorskip("flwr", reason='Flower is not installed: pip install ".[flower]"')

import torch  # noqa: E402
from flwr.app import Array, ArrayRecord, Context, RecordDict  # noqa: E402

from python_algos.deploy import flower as pf  # noqa: E402
from python_algos.deploy.exchange import check_upload, nonfinite_entries  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(ROOT, "examples", "flower_app")
D, WHO = 6, "client 2 (node 1014)"


def _record(**arrays):
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def test_a_good_upload_comes_back_bit_for_bit():
    x, y = np.random.default_rng(0).standard_normal((2, D))
    got = check_upload(_record(x=x, y=y), ("x", "y"), D, torch.float64, WHO, 3)
    assert set(got) == {"x", "y"} and got["x"].dtype == torch.float64
    assert np.array_equal(got["x"].numpy(), x) and np.array_equal(got["y"].numpy(), y)


@pytest.mark.parametrize("arrays, words", [
    ({"x": np.zeros(D, np.float32)}, r"uploaded 'x' as float32 of shape \(6,\), expected float64 of shape \(6,\)"),
    ({"x": np.zeros(D - 1)}, r"uploaded 'x' as float64 of shape \(5,\), expected float64 of shape \(6,\)"),
    ({"x": np.zeros((1, D))}, r"uploaded 'x' as float64 of shape \(1, 6\), expected float64 of shape \(6,\)"),
    ({"x": np.zeros(1)}, r"uploaded .x. as float64 of shape \(1,\), expected"),  # would broadcast into the update
    ({"z": np.zeros(D)}, r"uploaded \['z'\], expected \['x'\]"),
    ({"x": np.zeros(D), "z": np.zeros(D)}, r"uploaded \['x', 'z'\], expected \['x'\]"),
], ids=["float32", "short", "matrix", "scalar-broadcast", "other-name", "extra-name"])
def test_a_bad_upload_is_refused_naming_the_client_and_its_node(arrays, words):
    with pytest.raises(pf.NodeFailure, match=r"^round 3: client 2 \(node 1014\) " + words):
        check_upload(_record(**arrays), ("x",), D, torch.float64, WHO, 3)


def test_nonfinite_entries_are_passed_on_and_named():
    """NaN/Inf entries go into the average (one process averages them too, and then ends "diverged");
    they are only named, with the client and its node."""
    x = np.array([0, np.nan, np.inf, 0, 0, 0.0])
    got = check_upload(_record(x=x, y=np.zeros(D)), ("x", "y"), D, torch.float64, WHO, 3)
    assert np.array_equal(got["x"].numpy(), x, equal_nan=True)
    assert nonfinite_entries(got, WHO, 3) == ("round 3: client 2 (node 1014) uploaded 'x' with 2 NaN/Inf entries "
                                              "of 6 (its local steps diverged, or the node is faulty: a smaller step "
                                              "size, or check the node)")
    assert nonfinite_entries({"y": got["y"]}, WHO, 3) is None


def test_resume_without_a_checkpoint_at_the_path_is_refused(tmp_path):
    missing = str(tmp_path / "typo.pt")
    assert pf.checkpoint_to_resume(missing, False) is None  # a fresh run: nothing is read
    with pytest.raises(ValueError, match=r"resume=true: no server checkpoint at checkpoint='.*typo\.pt'"):
        pf.checkpoint_to_resume(missing, True)
    with pytest.raises(ValueError, match=r"resume=true needs the server checkpoint .*set checkpoint"):
        pf.checkpoint_to_resume("", True)


def test_the_example_app_refuses_resume_with_a_mistyped_checkpoint(tmp_path):
    """examples/flower_app's ServerApp with ``resume=true`` and a checkpoint path that names no file: the
    run is refused before any message (the grid is never used), naming the path and the setting."""
    sys.path.insert(0, APP)
    try:
        from pa_flower_app import server_app
    finally:
        sys.path.remove(APP)
    import tomllib

    with open(os.path.join(APP, "pyproject.toml"), "rb") as f:
        cfg = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    missing = str(tmp_path / "server-checkpont.pt")
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={**cfg, "resume": True, "checkpoint": missing})
    with pytest.raises(ValueError, match=r"resume=true: no server checkpoint at checkpoint='.*server-checkpont\.pt'"):
        server_app.main(None, context)
