"""Test metrics of a command-line run (experiments/evaluation.py ``make_eval``) measure the model in
``eval()`` mode without changing it: BatchNorm uses its running statistics (not each chunk's), Dropout
is off, no buffer changes, the metrics do not depend on the evaluation chunk size, and the model's
modes are restored. Ground truth: a plain PyTorch eval loop over the whole test set."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from python_algos.data.datasets import Dataset
from python_algos.experiments.evaluation import make_eval


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3)).double()
    with torch.no_grad():  # running statistics that differ from any test chunk's own statistics
        for _ in range(3):
            m(torch.randn(50, 5, dtype=torch.float64) * 2 + 1)
    return m.train()


def dataset(n_test=61) -> Dataset:
    g = torch.Generator().manual_seed(1)
    X = torch.randn(40, 5, generator=g, dtype=torch.float64)
    Xt = torch.randn(n_test, 5, generator=g, dtype=torch.float64)
    return Dataset(name="t", X=X, y=torch.randint(0, 3, (40,), generator=g), X_test=Xt,
                   y_test=torch.randint(0, 3, (n_test,), generator=g), task="multiclass", num_classes=3)


def buffers(m):
    return {k: v.clone() for k, v in m.named_buffers()}


def params_of(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def plain_eval(m, ds):
    """The reference: one eval-mode forward pass over the whole test set, on a copy of the model."""
    ref = bn_model()
    ref.load_state_dict(m.state_dict())
    ref.eval()
    with torch.no_grad():
        o = ref(ds.X_test)
    return float(F.cross_entropy(o, ds.y_test)), float((o.argmax(1) == ds.y_test).double().mean())


def test_test_metrics_in_eval_mode_independent_of_chunk_and_leave_buffers():
    ds = dataset()
    m = bn_model()
    before = buffers(m)
    loss_ref, acc_ref = plain_eval(m, ds)
    got = {}
    for chunk in (7, 4096):
        out = make_eval(ds, m, chunk=chunk)(params_of(m))
        got[chunk] = out
        after = buffers(m)
        assert before.keys() == after.keys()
        for k in before:  # running mean / var and num_batches_tracked untouched
            assert torch.equal(before[k], after[k]), (chunk, k)
        assert m.training and all(x.training for x in m.modules())  # the mode it had
    for chunk, out in got.items():
        assert out["test_loss"] == pytest.approx(loss_ref, rel=1e-12, abs=0), chunk
        assert out["test_acc"] == pytest.approx(acc_ref, rel=1e-12, abs=0), chunk
    assert got[7]["test_loss"] == pytest.approx(got[4096]["test_loss"], rel=1e-12, abs=0)
    assert got[7]["test_acc"] == got[4096]["test_acc"]


def test_each_submodule_mode_restored():
    ds = dataset()
    m = bn_model()
    m[3].eval()  # the caller had switched Dropout off only
    make_eval(ds, m, chunk=7)(params_of(m))
    assert [x.training for x in m.modules()] == [True, True, True, True, False, True]
    m.eval()
    make_eval(ds, m, chunk=7)(params_of(m))
    assert not any(x.training for x in m.modules())


def test_train_set_metrics_also_in_eval_mode():
    ds = dataset()
    ds.X_test = ds.y_test = None  # no test set: the metrics are on the training data
    m = bn_model()
    before = buffers(m)
    a = make_eval(ds, m, chunk=7)(params_of(m))
    b = make_eval(ds, m, chunk=4096)(params_of(m))
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-12, abs=0)
    assert all(torch.equal(before[k], v) for k, v in buffers(m).items())


def test_batchnorm_without_running_stats_refused():
    m = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8, track_running_stats=False), nn.Linear(8, 3)).double()
    with pytest.raises(ValueError, match=r"model: 1 is a BatchNorm with track_running_stats=False"):
        make_eval(dataset(), m)
    with pytest.raises(ValueError, match="chunk must be an integer >= 1"):
        make_eval(dataset(), bn_model(), chunk=0)
