"""--dataset sklearn:NAME: scikit-learn's bundled data sets, every partition that applies, and the
errors (sklearn missing, unknown NAME, a label partition of the regression set).

Ground truth: sklearn's own loaders and a plain numpy standardization of the same seeded split."""

import sys

import numpy as np
import pytest
import torch

from python_algos.data import federate, load_dataset
from python_algos.data.split import train_test_indices
from python_algos.experiments.build import prepare_data
from python_algos.experiments.cli import main
from python_algos.experiments.config import Config, ConfigError

sk = pytest.importorskip("sklearn.datasets")

TASKS = {"digits": ("load_digits", "multiclass", 10), "breast_cancer": ("load_breast_cancer", "binary", 2),
         "wine": ("load_wine", "multiclass", 3), "iris": ("load_iris", "multiclass", 3),
         "diabetes": ("load_diabetes", "regression", 0)}


@pytest.mark.parametrize("name", list(TASKS))
def test_matches_sklearn_standardized_on_the_training_split(name):
    loader, task, classes = TASKS[name]
    b = getattr(sk, loader)()
    ds = load_dataset(f"sklearn:{name}", seed=3, test_fraction=0.25)
    tr, te = train_test_indices(len(b.target), 0.25, 3)
    X = b.data.astype(np.float64)
    mu, sd = X[tr].mean(0), X[tr].std(0)
    Z = (X - mu) / np.where(sd > 0, sd, 1)
    assert ds.task == task and ds.num_classes == classes and ds.groups is None
    np.testing.assert_allclose(ds.X.numpy(), Z[tr], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ds.X_test.numpy(), Z[te], rtol=1e-5, atol=1e-5)
    if task == "regression":
        y = (b.target - b.target[tr].mean()) / b.target[tr].std()
        np.testing.assert_allclose(ds.y.numpy(), y[tr], rtol=1e-5, atol=1e-6)
        assert ds.y.dtype == torch.float32
    else:
        assert ds.y.dtype == torch.int64 and ds.y.tolist() == b.target[tr].tolist()
    raw = load_dataset(f"sklearn:{name}", seed=3, test_fraction=0.25, standardize=False)
    np.testing.assert_allclose(raw.X.numpy(), X[tr], rtol=1e-6)


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "shards"])
@pytest.mark.parametrize("name", ["digits", "breast_cancer", "wine", "iris"])
def test_classification_sets_take_every_label_partition(name, partition):
    ds = load_dataset(f"sklearn:{name}", seed=0)
    fed = federate(ds, partition, 4, seed=0, eta=0.3)
    idx = np.sort(np.concatenate(fed.parts))
    assert idx.tolist() == list(range(ds.X.shape[0]))  # every training sample on exactly one client
    for (X, y), p, h in zip(fed.clients, fed.parts, fed.histograms):
        assert torch.equal(X, ds.X[torch.from_numpy(p)])
        assert np.bincount(y.numpy(), minlength=len(h)).tolist() == h.tolist()


def test_regression_set_takes_iid_and_names_the_rule_otherwise():
    ds = load_dataset("sklearn:diabetes")
    assert len(federate(ds, "iid", 5).clients) == 5
    for part in ("dirichlet", "shards"):
        with pytest.raises(ValueError, match="regression task.*iid"):
            federate(ds, part, 5)
    with pytest.raises(ValueError, match="needs writer / client ids"):
        federate(ds, "natural", 5)


def test_unknown_name_lists_the_valid_ones(capsys):
    with pytest.raises(ConfigError, match="--dataset sklearn:mnist: unknown scikit-learn data set; valid: "
                                          "sklearn:digits, sklearn:breast_cancer, sklearn:wine, sklearn:iris"):
        Config.from_dict({"dataset": "sklearn:mnist"})
    with pytest.raises(ValueError, match="valid: sklearn:digits"):
        load_dataset("sklearn:mnist")
    with pytest.raises(ValueError, match=r"does not take option\(s\) \['n'\]"):
        load_dataset("sklearn:iris", n=10)


def test_missing_sklearn_names_the_flag_and_the_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn now raises ImportError
    with pytest.raises(ValueError, match="--dataset sklearn:iris: .*pip install scikit-learn"):
        prepare_data(Config.from_dict({"dataset": "sklearn:iris", "num_clients": 3}))
    out = tmp_path / "run"
    assert main(["run", "--dataset", "sklearn:iris", "-N", "3", "-T", "1", "--out", str(out), "--no-progress"]) == 1
    assert "pip install scikit-learn" in capsys.readouterr().err and not out.exists()


def test_cli_run_on_digits_learns(tmp_path, capsys):
    out = tmp_path / "digits"
    assert main(["run", "-a", "fedcanon", "--dataset", "sklearn:digits", "--partition", "dirichlet", "--eta", "0.5",
                 "-N", "5", "--lr", "0.05", "-K", "5", "-T", "8", "--reg", "l1", "--reg-strength", "1e-3",
                 "--out", str(out), "--no-progress", "--no-plot"]) == 0
    from python_algos.runfolder.files import read_metrics

    rows = read_metrics(str(out))
    assert rows[-1]["f+h"] < rows[0]["f+h"] and rows[-1]["test_acc"] > 0.5  # chance is 0.1


def test_example_quick(tmp_path, capsys):
    from examples import sklearn_digits

    assert sklearn_digits.main(["--quick", "--out", str(tmp_path), "--formats", "png,svg"]) == 0
    out = capsys.readouterr().out
    assert "nothing downloaded" in out and f"figure: {tmp_path / 'digits.svg'}" in out
    assert "**Outcome:**" in (tmp_path / "RESULTS.md").read_text()
    assert sorted(d.name for d in tmp_path.iterdir() if d.is_dir()) == ["fedavg", "fedcanon", "fedmid"]
    assert "sklearn:digits" in (tmp_path / "digits.svg").read_text()
