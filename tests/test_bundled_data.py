"""The data sets inside the package (a9a, Fed-TCGA-BRCA) against hand-read slices of their files, their
checksums, and the survival task: the Cox partial likelihood (Breslow ties) and Harrell's C against
brute-force loops written here, the executors on the coupled Cox loss (exact, or refused for
minibatches), and the command line end to end."""

from __future__ import annotations

import json
import math
import os
import warnings

import pytest
import torch
from torch import nn

import python_algos as pa
from python_algos.data import bundled, federate, load_dataset
from python_algos.experiments.losses import concordance_index, cox_breslow

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a9a_is_the_file_read_by_hand():
    X, y = bundled.load_a9a_bundled()
    assert X.shape == (32561, 123) and X.dtype == torch.float32
    assert int(y.sum()) == 7841 and set(y.unique().tolist()) == {0, 1}  # 7,841 of +1, 24,720 of −1
    assert set(X.unique().tolist()) == {0.0, 1.0}
    # the file's first line: "-1 3:1 11:1 14:1 19:1 39:1 42:1 55:1 64:1 67:1 73:1 75:1 76:1 80:1 83:1"
    assert int(y[0]) == 0 and (X[0].nonzero().reshape(-1) + 1).tolist() == [3, 11, 14, 19, 39, 42, 55, 64, 67, 73,
                                                                             75, 76, 80, 83]
    # its last line: "+1 5:1 8:1 18:1 22:1 36:1 40:1 51:1 61:1 67:1 72:1 75:1 76:1 80:1 83:1"
    assert int(y[-1]) == 1 and (X[-1].nonzero().reshape(-1) + 1).tolist() == [5, 8, 18, 22, 36, 40, 51, 61, 67, 72,
                                                                               75, 76, 80, 83]


def test_a9a_without_a_data_dir_is_the_bundled_copy_with_a_held_out_test_split():
    ds = load_dataset("a9a", test_fraction=0.25, seed=3)
    assert ds.X.shape[0] + ds.X_test.shape[0] == 32561 and ds.X_test.shape[0] == round(0.25 * 32561)
    assert "bundled" in ds.source and ds.num_classes == 2 and ds.outputs == 2
    fed = federate(ds, "dirichlet", 10, eta=0.3, seed=0)  # the usual partitions apply
    assert sum(len(p) for p in fed.parts) == ds.X.shape[0]


def test_tcga_brca_is_the_files_read_by_hand():
    X, y, Xt, yt, c, ct, features = bundled.load_tcga_brca()
    assert (X.shape, Xt.shape, len(features)) == ((866, 39), (222, 39), 39)
    assert torch.bincount(c).tolist() == [248, 156, 164, 129, 129, 40]  # train_c of train_test_split.csv
    assert torch.bincount(ct).tolist() == [63, 40, 42, 33, 33, 11]
    assert features[0] == "age_at_index" and features[-1] == "tumor_stage_stage iiic"
    # brca.csv's first patient, TCGA-E2-A9RU (test_0): age 90, censored (E = 0) at T = 538 days
    first = (Xt[:, 0] == 90) & (yt[:, 0] == 0) & (yt[:, 1] == 538) & (ct == 0)
    assert int(first.sum()) == 1
    assert set(y[:, 0].unique().tolist()) <= {0.0, 1.0} and bool((y[:, 1] >= 0).all())


def test_tcga_brca_dataset_natural_partition_is_the_six_centres():
    ds = load_dataset("tcga_brca")
    assert ds.task == "survival" and ds.outputs == 1
    assert torch.allclose(ds.X.mean(0), torch.zeros(39), atol=1e-5)  # standardised with the pooled training stats
    fed = federate(ds, "natural", 6)
    assert [len(c[1]) for c in fed.clients] == [248, 156, 164, 129, 129, 40] and fed.histograms is None
    with pytest.raises(ValueError, match="partition 'dirichlet' needs class labels.*survival task"):
        federate(ds, "dirichlet", 6)


def test_a_damaged_copy_is_refused_naming_the_file(monkeypatch):
    monkeypatch.setitem(bundled.BUNDLED, "tcga_brca/brca.csv", "0" * 64)
    with pytest.raises(ValueError, match=r"brca\.csv is damaged \(SHA-256 07cb5342.*reinstall"):
        bundled.load_tcga_brca()


# --------------------------------------------------------------------------- the survival task


def cox_brute(eta, y):
    """Breslow: (1/n) Σ_{i: E_i = 1} [log Σ_{j: T_j ≥ T_i} exp(η_j) − η_i], by loops."""
    n, total = len(eta), 0.0
    for i in range(n):
        if y[i][0] == 1:
            total += math.log(sum(math.exp(eta[j]) for j in range(n) if y[j][1] >= y[i][1])) - eta[i]
    return total / n


def cindex_brute(risk, y):
    num = den = 0.0
    for i in range(len(risk)):
        for j in range(len(risk)):
            if y[i][0] == 1 and y[i][1] < y[j][1]:
                den += 1
                num += 1.0 if risk[i] > risk[j] else 0.5 if risk[i] == risk[j] else 0.0
    return num / den


def survival_sample(n, seed, ties=True):
    g = torch.Generator().manual_seed(seed)
    time = torch.randint(1, 6 if ties else 10**6, (n,), generator=g).double()  # few distinct times: many ties
    event = (torch.rand(n, generator=g) < 0.6).double()
    return torch.randn(n, generator=g, dtype=torch.float64), torch.stack([event, time], 1)


@pytest.mark.parametrize("seed", range(6))
def test_cox_breslow_and_cindex_equal_brute_force(seed):
    eta, y = survival_sample(17 + seed, seed, ties=seed % 2 == 0)
    assert abs(float(cox_breslow(eta, y)) - cox_brute(eta.tolist(), y.tolist())) < 1e-12
    risk = eta.round(decimals=0)  # tied risks count 1/2
    assert abs(concordance_index(risk, y) - cindex_brute(risk.tolist(), y.tolist())) < 1e-15
    assert torch.autograd.gradcheck(lambda e: cox_breslow(e, y), (eta.clone().requires_grad_(),))


def test_cox_is_coupled_so_the_executors_compute_batches_whole_and_refuse_minibatches():
    ds = load_dataset("tcga_brca")
    fed = federate(ds, "natural", 6)
    clients = [(X.double(), y.double()) for X, y in fed.clients]
    runs = {}
    for executor in ("sequential", "batched"):
        torch.manual_seed(0)
        model = nn.Linear(39, 1).double()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opts = {"chunk_clients": 4} if executor == "batched" else None
            hist = pa.simulate(pa.FedAvg(lr_local=0.05, local_steps=3), model, cox_breslow, clients, 4,
                               executor=executor, executor_options=opts)
        runs[executor] = hist.series("f")
    assert max(abs(a - b) / abs(b) for a, b in zip(runs["batched"], runs["sequential"])) < 1e-10
    with pytest.raises(ValueError, match="not the mean of per-sample losses"):
        pa.simulate(pa.FedAvg(lr_local=0.05, local_steps=3), nn.Linear(39, 1).double(), cox_breslow, clients, 1,
                    batch_size=16)


def test_the_command_line_runs_sparse_cox_on_the_six_centres(tmp_path):
    from python_algos.experiments.cli import main

    out = tmp_path / "run"
    assert main(["run", "-a", "fedcanon", "--dataset", "tcga_brca", "--partition", "natural", "-N", "6", "--model",
                 "linear", "--reg", "scad", "--reg-strength", "0.01", "--lr", "0.05", "-K", "3", "-T", "4",
                 "--out", str(out), "--no-plot"]) == 0
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert 0.5 < rows[-1]["test_cindex"] <= 1.0 and rows[-1]["test_loss"] > 0
