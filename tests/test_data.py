"""Data loaders (on tiny files the tests write in the real formats) and built-in generators."""

import gzip
import json
import os
import pickle

import numpy as np
import pytest
import torch

from python_algos.data import (
    DataNotFoundError,
    federate,
    fedprox_synthetic,
    image_like,
    load_a9a,
    load_cifar10,
    load_dataset,
    load_femnist,
    load_libsvm,
    load_mnist,
    read_idx,
    sparse_regression,
)


def write_idx(path, array, gz=False):
    codes = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D, np.float64: 0x0E}
    a = np.asarray(array)
    head = bytes([0, 0, codes[a.dtype.type], a.ndim]) + np.array(a.shape, dtype=">i4").tobytes()
    body = a.astype(a.dtype.newbyteorder(">")).tobytes()
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(head + body)


def write_mnist(folder, n=12, n_test=5, gz=False, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    data = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for name, a in data.items():
        write_idx(os.path.join(folder, name + (".gz" if gz else "")), a, gz=gz)
    return data


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_torchvision_layout(tmp_path, gz):
    data = write_mnist(tmp_path / "MNIST" / "raw", gz=gz)
    X, y, Xt, yt = load_mnist(tmp_path)
    assert X.shape == (12, 1, 28, 28) and X.dtype == torch.float32 and Xt.shape == (5, 1, 28, 28)
    assert torch.equal(X[:, 0], torch.from_numpy(data["train-images-idx3-ubyte"].astype(np.float32) / 255))
    assert torch.equal(y, torch.from_numpy(data["train-labels-idx1-ubyte"].astype(np.int64)))
    assert torch.equal(yt, torch.from_numpy(data["t10k-labels-idx1-ubyte"].astype(np.int64)))
    ds = load_dataset("mnist", data_dir=str(tmp_path))
    assert ds.task == "multiclass" and ds.num_classes == 10 and ds.in_shape == (1, 28, 28)


def test_fashion_mnist_layout_and_kind(tmp_path):
    write_mnist(tmp_path / "fashion-mnist", gz=True, seed=1)
    X, y, _, _ = load_mnist(tmp_path, kind="fashion_mnist")
    assert X.shape == (12, 1, 28, 28)
    with pytest.raises(DataNotFoundError):
        load_mnist(tmp_path, kind="mnist")  # fashion files are not MNIST
    assert load_dataset("fmnist", data_dir=str(tmp_path)).name == "fashion_mnist"


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int16, np.int8])
def test_read_idx_dtypes(tmp_path, dtype):
    a = (np.arange(24).reshape(2, 3, 4) - 7).astype(dtype)
    write_idx(tmp_path / "a.idx", a)
    b = read_idx(str(tmp_path / "a.idx"))
    assert b.dtype == dtype and np.array_equal(a, b)


def test_read_idx_rejects_garbage(tmp_path):
    (tmp_path / "x").write_bytes(b"\x01\x02\x03\x04hello")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(str(tmp_path / "x"))
    write_idx(tmp_path / "t", np.zeros((10, 3), np.uint8))
    (tmp_path / "t").write_bytes((tmp_path / "t").read_bytes()[:-5])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(str(tmp_path / "t"))


def test_missing_files_say_what_and_where(tmp_path):
    with pytest.raises(DataNotFoundError) as e:
        load_mnist(tmp_path)
    msg = str(e.value)
    assert "train-images-idx3-ubyte" in msg and str(tmp_path) in msg and "MNIST/raw" in msg
    assert "never downloads" in msg and "torchvision" in msg
    for fn, needle in ((load_cifar10, "cifar-10-batches-py"), (load_a9a, "a9a.t"), (load_femnist, "train/*.json")):
        with pytest.raises(DataNotFoundError, match="never downloads") as e:
            fn(tmp_path)
        assert needle in str(e.value)
    with pytest.raises(DataNotFoundError, match="--data-dir"):
        load_dataset("cifar10", data_dir=None)


def write_cifar(folder, per_batch=4, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    out = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        d = {b"batch_label": name.encode(), b"labels": rng.integers(0, 10, per_batch).tolist(),
             b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8), b"filenames": [b"x.png"] * per_batch}
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(d, f, protocol=2)
        out[name] = d
    return out


def test_cifar10_pickle_batches(tmp_path):
    data = write_cifar(tmp_path / "cifar-10-batches-py")
    X, y, Xt, yt = load_cifar10(tmp_path)
    assert X.shape == (20, 3, 32, 32) and Xt.shape == (4, 3, 32, 32)
    first = data["data_batch_1"][b"data"][0]
    # CIFAR rows are 1024 red, then 1024 green, then 1024 blue values, row-major
    assert X[0, 1, 0, 5] == pytest.approx(first[1024 + 5] / 255)
    assert X[0, 2, 31, 31] == pytest.approx(first[3071] / 255)
    assert y.tolist()[:4] == data["data_batch_1"][b"labels"] and yt.tolist() == data["test_batch"][b"labels"]


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_cifar_loader_refuses_code_in_pickles(tmp_path):
    write_cifar(tmp_path / "cifar-10-batches-py")
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({b"data": _Evil(), b"labels": []}, f)
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_cifar10(tmp_path)


LIBSVM = """# a comment line
+1 1:0.5 3:2 qid:7
-1 2:1.5   # trailing comment
+1 5:-1 1:1

-1 4:0.25
"""


def test_libsvm_dense_and_sparse(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text(LIBSVM)
    X, y = load_libsvm(str(p))
    assert X.shape == (4, 5) and y.tolist() == [1, -1, 1, -1]
    assert X[0].tolist() == [0.5, 0, 2, 0, 0] and X[2].tolist() == [1, 0, 0, 0, -1]
    Xs, _ = load_libsvm(str(p), n_features=8, sparse=True)
    assert Xs.layout == torch.sparse_csr and Xs.shape == (4, 8)
    assert torch.equal(Xs.to_dense()[:, :5], X)
    gz = tmp_path / "d.txt.gz"
    gz.write_bytes(gzip.compress(LIBSVM.encode()))
    assert torch.equal(load_libsvm(str(gz))[0], X)
    with pytest.raises(ValueError, match="exceeds n_features"):
        load_libsvm(str(p), n_features=3)
    (tmp_path / "bad.txt").write_text("1 0:3\n")
    with pytest.raises(ValueError, match="bad.txt:1.*1-based"):
        load_libsvm(str(tmp_path / "bad.txt"))
    ds = load_dataset("libsvm", data_dir=str(tmp_path), file="d.txt", test_fraction=0.25)
    assert ds.task == "multiclass" and ds.num_classes == 2 and set(ds.y.tolist()) <= {0, 1}
    assert ds.X.shape[0] + ds.X_test.shape[0] == 4


def test_a9a(tmp_path):
    (tmp_path / "a9a").write_text("-1 3:1 11:1 123:1\n+1 1:1 5:1\n")
    (tmp_path / "a9a.t").write_text("+1 2:1\n")
    X, y, Xt, yt = load_a9a(tmp_path)
    assert X.shape == (2, 123) and Xt.shape == (1, 123)  # the test file's max index is smaller
    assert y.tolist() == [0, 1] and yt.tolist() == [1] and X[0, 122] == 1
    ds = load_dataset("a9a", data_dir=str(tmp_path))
    model_params = 2 * (123 + 1)  # FedCanon Fig. 1's linear model: 248 parameters
    assert ds.outputs * (ds.in_shape[0] + 1) == model_params


def write_leaf(folder, writers, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    blob = {"users": [], "num_samples": [], "user_data": {}}
    for u, n in writers.items():
        blob["users"].append(u)
        blob["num_samples"].append(n)
        blob["user_data"][u] = {"x": rng.random((n, 784)).round(3).tolist(), "y": rng.integers(0, 62, n).tolist()}
    with open(os.path.join(folder, "all_data_0.json"), "w") as f:
        json.dump(blob, f)
    return blob


def test_femnist_leaf_json_keeps_writers(tmp_path):
    root = tmp_path / "femnist" / "data"
    tr = write_leaf(root / "train", {"f0001_01": 6, "f0002_07": 4, "f0003_11": 5})
    write_leaf(root / "test", {"f0002_07": 2, "f0001_01": 1}, seed=1)
    X, y, w, Xt, yt, wt, names = load_femnist(tmp_path)
    assert X.shape == (15, 1, 28, 28) and names[:3] == ["f0001_01", "f0002_07", "f0003_11"]
    assert w.tolist() == [0] * 6 + [1] * 4 + [2] * 5
    assert wt.tolist() == [1, 1, 0]  # same writer, same index in train and test
    assert y[:6].tolist() == tr["user_data"]["f0001_01"]["y"]
    ds = load_dataset("femnist", data_dir=str(tmp_path))
    fed = federate(ds, "natural", 3)
    assert [len(p) for p in fed.parts] == [6, 4, 5]
    fed = federate(ds, "writers", 2, eta=100.0, min_size=1)
    for p in fed.parts:  # a Dirichlet over writers splits writers' samples, never invents new ones
        assert len(p) >= 1
    assert sorted(np.concatenate(fed.parts).tolist()) == list(range(15))


def test_fedprox_synthetic():
    X, y, g = fedprox_synthetic(alpha=1, beta=1, num_clients=5, samples=40, seed=3)
    assert X.shape == (200, 60) and y.shape == (200,) and g.tolist() == sum([[k] * 40 for k in range(5)], [])
    X2, y2, _ = fedprox_synthetic(alpha=1, beta=1, num_clients=5, samples=40, seed=3)
    assert torch.equal(X, X2) and torch.equal(y, y2)
    assert not torch.equal(fedprox_synthetic(1, 1, 5, samples=40, seed=4)[0], X)
    Xd, _, gd = fedprox_synthetic(num_clients=8, seed=0)  # FedProx's lognormal sample counts
    counts = torch.bincount(gd)
    assert counts.min() >= 50 and counts.max() <= 2000 and len(set(counts.tolist())) > 1
    # beta drives the spread of the clients' feature means

    def spread(b):
        X = fedprox_synthetic(0, b, 10, samples=100, seed=0)[0]
        return torch.stack([X[k * 100:(k + 1) * 100].mean(0) for k in range(10)]).std(0).mean()

    assert spread(5.0) > 3 * spread(0.0)
    ds = load_dataset("synthetic", alpha=0.5, beta=0.5, num_clients=6, samples=30)
    assert ds.groups.unique().numel() == 6 and ds.X.shape[0] + ds.X_test.shape[0] == 180


def test_sparse_regression_ground_truth():
    X, y, x_true, g = sparse_regression(n=300, dim=40, nnz=5, task="linear", noise=0.0, num_groups=3, shift=2.0)
    assert int((x_true != 0).sum()) == 5 and x_true.abs().max() <= 2 and x_true[x_true != 0].abs().min() >= 1
    assert torch.allclose(y, X @ x_true, atol=1e-4)
    assert g.tolist()[:4] == [0, 1, 2, 0]
    Xl, yl, xt, _ = sparse_regression(n=300, dim=40, nnz=5, task="logistic", noise=0.0)
    assert torch.equal(yl, (Xl @ xt > 0).long())
    ds = load_dataset("sparse_logistic", n=100, dim=8, nnz=2)
    assert ds.task == "binary" and ds.outputs == 1 and ds.x_true.shape == (8,)
    with pytest.raises(ValueError, match="does not take"):
        load_dataset("sparse_logistic", alpha=1)


def test_image_like():
    X, y = image_like(n=500, num_classes=4, shape=(3, 8, 8), seed=1)
    assert X.shape == (500, 3, 8, 8) and X.dtype == torch.float32 and set(y.tolist()) == {0, 1, 2, 3}
    assert torch.equal(image_like(n=500, num_classes=4, shape=(3, 8, 8), seed=1)[0], X)
    # the class prototypes are visible through the noise: nearest class mean beats chance by far
    means = torch.stack([X[y == c].mean(0) for c in range(4)]).flatten(1)
    pred = torch.cdist(X.flatten(1), means).argmin(1)
    assert (pred == y).float().mean() > 0.5
