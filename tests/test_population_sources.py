"""Population sources (python_algos/data/population_sources.py, issue 39 item 3): a folder of per-client
files as a population (the run equals the eager folder run bit for bit; only built clients' files are
opened; a bad or vanished file is refused naming it when first read; what the resume fingerprint sees),
and a data set's rows dealt to many clients (``cyclic``: client i's rows a function of i and the seed;
``run --partition cyclic`` on A9A with 10^5 clients builds only its cohorts)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from python_algos import simulate
from python_algos.algorithms import SCAFFOLD
from python_algos.clients.population import FINGERPRINT_CLIENTS, PROBE_CLIENTS, Population
from python_algos.data import (
    FolderClients,
    RowClients,
    cyclic,
    federate,
    label_histograms,
    load_dataset,
    population_sources,
)
from python_algos.data.standardize import client_moments, combine_moments
from python_algos.experiments import build as build_module
from python_algos.experiments.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _folder(path, k=24, seed=0):
    """``k`` client files, alternately .npz and .csv (no header, label last), labels in {-1, 1}, features
    on different scales per client; returns {file name: (X, y)} as written."""
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    data = {}
    for i in range(k):
        n = 4 + i % 5
        X = rng.normal(loc=i % 3, scale=1 + i % 4, size=(n, 3))
        y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
        name = f"client_{i:04d}." + ("npz" if i % 2 else "csv")
        if i % 2:
            np.savez(path / name, X=X, y=y)
        else:
            (path / name).write_text("".join(",".join(repr(float(v)) for v in (*x, c)) + "\n" for x, c in zip(X, y)))
        data[name] = (X, y)
    return data


def _scaffold_run(clients, **kw):
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    h = simulate(SCAFFOLD(lr_local=0.1, local_steps=3), model, F.cross_entropy, clients, rounds=4,
                 clients_per_round=5, metrics_every=0, seed=1, threads=1, **kw)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), h


@pytest.mark.parametrize("mode", ["none", "local", "global"])
@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_a_folder_population_run_equals_the_eager_folder_run(tmp_path, mode, executor):
    data = _folder(tmp_path / "f")
    ds = load_dataset(f"folder:{tmp_path / 'f'}", test_fraction=0.25, seed=2)  # reads every file now
    fed = federate(ds, "natural", len(data), standardize=mode)
    scale = mode
    if mode == "global":  # the pooled statistics as whoever reads every file computes them
        raw = federate(load_dataset(f"folder:{tmp_path / 'f'}", test_fraction=0.25, seed=2), "natural", len(data),
                       standardize="none").clients
        pooled = np.concatenate([X.numpy() for X, _ in raw])
        for (X, _), (R, _) in zip(fed.clients, raw):  # the eager run's scaling is numpy's, to rounding
            assert np.abs(X.numpy() - (R.numpy() - pooled.mean(0)) / pooled.std(0)).max() < 1e-12
        scale = combine_moments([client_moments(X) for X, _ in raw])
    src = FolderClients(str(tmp_path / "f"), test_fraction=0.25, seed=2, classes=[-1, 1], standardize=scale)
    pop = Population(len(src), src, cache=2)
    want, _ = _scaffold_run(fed.clients, executor=executor)
    got, _ = _scaffold_run(pop, executor=executor)
    assert torch.equal(got, want)
    assert pop.builds <= 4 * 5 + 4 and src.opened <= pop.builds + 1  # cohorts, the probe, client 0's shape
    for i in (0, 5, 23):  # each client's rows are the eager split's bit for bit
        X, y = src(i)
        assert torch.equal(X, fed.clients[i][0]) and torch.equal(y, fed.clients[i][1])


def test_only_the_built_clients_files_are_opened(tmp_path, monkeypatch):
    _folder(tmp_path / "f", k=40)
    built, opened, real_open = [], [], open
    src = FolderClients(str(tmp_path / "f"), test_fraction=0, classes=[-1, 1])  # the listing: no file opened

    def spy(file, *args, **kwargs):
        if not isinstance(file, int):
            opened.append(os.path.basename(os.fspath(file)))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    pop = Population(len(src), lambda i: built.append(i) or src(i), cache=2, recipe=src.recipe)
    _scaffold_run(pop, executor="sequential")
    monkeypatch.undo()
    files = [f for f in opened if f.startswith("client_")]
    assert len(src) == 40 and sorted(set(files)) == sorted({f"client_{i:04d}.{'npz' if i % 2 else 'csv'}"
                                                            for i in built})
    assert len(files) == len(built) == src.opened and len(set(built)) < 40  # each build one read; not every file


def test_a_bad_or_vanished_file_is_refused_naming_it_when_first_read(tmp_path):
    _folder(tmp_path / "f", k=12)
    (tmp_path / "f" / "client_0007.npz").write_bytes(b"not an archive")
    os.remove(tmp_path / "f" / "client_0008.csv")
    (tmp_path / "f" / "client_0008.csv").write_text("1.0,2.0,3.0,0\nx,1,2,1\n")
    src = FolderClients(str(tmp_path / "f"), test_fraction=0, classes=[-1, 0, 1])  # built: nothing read yet
    assert src.opened == 0
    with pytest.raises(ValueError, match=r"client_0007\.npz: not a readable \.npz file"):
        src(7)
    with pytest.raises(ValueError, match=r"client_0008\.csv:2: column 0: 'x' is not a number"):
        src(8)
    os.remove(tmp_path / "f" / "client_0009.npz")
    with pytest.raises(ValueError, match=r"client_0009\.npz: client 9's file cannot be read \(no such file"):
        src(9)
    (tmp_path / "f" / "client_0010.csv").write_text("1.0,2.0,5\n")
    with pytest.raises(ValueError, match=r"client_0010\.csv: features of shape \(2,\), .*client_0000\.csv has "
                                         r"\(3,\)"):
        src(10)  # client 0's file sets the features (read now, once)
    with pytest.raises(ValueError, match=r"client_0011\.npz: label 1 is not one of the classes \[-1\.0, 0\.0\]"):
        FolderClients(str(tmp_path / "f"), test_fraction=0, classes=[-1, 0])(10)  # 9 is gone: 11 is 10th
    with pytest.raises(ValueError, match="standardize='global': 'none', 'local' or the pooled"):
        FolderClients(str(tmp_path / "f"), standardize="global")
    with pytest.raises(Exception, match="nowhere: no such folder"):
        FolderClients(str(tmp_path / "nowhere"))
    # in a run: the round that first builds client 7 (a full round builds 0, 1, ... in order) stops there
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"client_0007\.npz: not a readable \.npz file"):
        simulate(SCAFFOLD(lr_local=0.1, local_steps=1), nn.Linear(3, 3).double(), F.cross_entropy,
                 Population(len(src), src), rounds=1, metrics_every=0)


def test_the_resume_fingerprint_sees_a_changed_sampled_file_and_any_resized_one(tmp_path):
    _folder(tmp_path / "f", k=30)

    def fingerprint():
        src = FolderClients(str(tmp_path / "f"), test_fraction=0, classes=[-1, 1])
        return Population(len(src), src).fingerprint()

    first = fingerprint()
    sampled = set(first["sampled"])
    assert 0 in sampled and 29 in sampled and 5 not in sampled

    def edit(i, X_scale=1.0, extra_row=False):
        p = tmp_path / "f" / f"client_{i:04d}.npz"
        d = dict(np.load(p))
        X = d["X"] * X_scale
        y = d["y"]
        if extra_row:
            X, y = np.concatenate([X, X[:1]]), np.concatenate([y, y[:1]])
        np.savez(p, X=X, y=y)

    edit(5, X_scale=2.0)  # same size, a client it does not sample: unseen (the documented limit)
    assert fingerprint() == first
    edit(5, extra_row=True)  # resized: the listing's sizes differ
    assert fingerprint()["recipe"] != first["recipe"]
    edit(5, extra_row=False)
    second = fingerprint()
    edit(29, X_scale=3.0)  # a sampled client's rows, same size: its content hash
    third = fingerprint()
    assert third["recipe"] == second["recipe"] and third["content"] != second["content"]


def test_cyclic_rows_depend_on_the_client_and_the_seed_alone():
    n, s = 101, 3
    a, b = cyclic(n, 10, s, seed=4), cyclic(n, 1000, s, seed=4)
    assert np.array_equal(a, b[:10]) and not np.array_equal(a, cyclic(n, 10, s, seed=5))
    perm = np.random.default_rng([4, 4]).permutation(n)  # written here: windows of s along the permutation
    for i in (0, 33, 34, 999):
        assert np.array_equal(b[i], np.sort([perm[(i * s + j) % n] for j in range(s)]))
    counts = np.bincount(cyclic(n, n, s, seed=4).ravel(), minlength=n)  # N·s = s·n draws: each row s times
    assert (counts == s).all()
    y = torch.tensor(np.random.default_rng(0).integers(0, 3, n))
    parts = cyclic(n, 50, s, seed=1)
    assert np.array_equal(label_histograms(y, parts, 3), label_histograms(y, list(parts), 3))
    assert np.array_equal(label_histograms(y, parts, 2), label_histograms(y, list(parts), 2))


def test_a_row_population_equals_the_list_of_its_rows_and_never_builds_all():
    X, y = load_dataset("a9a").X.double(), load_dataset("a9a").y
    parts = cyclic(len(X), 2000, 3, seed=0)
    src = RowClients(X, y, parts, name="a9a")
    listed = [(X[torch.from_numpy(p)], y[torch.from_numpy(p)]) for p in parts]  # fancy indexing, here
    pop = Population(len(src), src)
    torch.manual_seed(0)
    w0 = nn.Linear(123, 2).double()

    def run(clients):
        model = nn.Linear(123, 2).double()
        model.load_state_dict(w0.state_dict())
        simulate(SCAFFOLD(lr_local=0.1, local_steps=2), model, F.cross_entropy, clients, rounds=3,
                 clients_per_round=20, state="ram", metrics_every=0, seed=0, threads=1)
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    assert torch.equal(run(pop), run(listed))
    assert pop.builds <= 3 * 20 + 4 and src.nbytes_estimate() == X.nbytes + y.nbytes
    assert RowClients(X, y, parts, name="a9a").recipe == src.recipe != RowClients(X, y, parts[:-1]).recipe


A9A_RUN = ["run", "--dataset", "a9a", "--partition", "cyclic", "--samples-per-client", "3", "--clients-per-round",
           "100", "-a", "scaffold", "-T", "2", "--state", "ram", "--metrics-every", "0", "--dtype", "float64",
           "--threads", "1", "--no-progress", "--no-plot"]


def test_more_clients_than_rows_is_refused_naming_the_cyclic_partition(tmp_path, capsys):
    assert main(["run", "--dataset", "a9a", "-N", "100000", "--clients-per-round", "100", "--no-progress", "--out",
                 str(tmp_path / "never")]) != 0
    err = capsys.readouterr().err
    assert "--partition iid -N 100000: cannot split 26049 samples over 100000 clients (partition 'cyclic'" in err
    assert not (tmp_path / "never").exists()


def test_a9a_as_100000_clients_from_the_command_line_builds_only_its_cohorts(tmp_path, monkeypatch):
    got = []
    real = RowClients.__getitem__
    monkeypatch.setattr(RowClients, "__getitem__", lambda self, i: got.append(i) or real(self, i))
    assert main(A9A_RUN + ["-N", "100000", "--out", str(tmp_path / "big")]) == 0
    assert 0 < len(got) <= 2 * 100 + PROBE_CLIENTS + FINGERPRINT_CLIENTS  # cohorts, probe, resume fingerprint
    part = json.loads((tmp_path / "big" / "partition.json").read_text())
    assert part["num_clients"] == 100000 and set(part["sizes"]) == {3} and len(part["label_histograms"]) == 100000
    summary = json.loads((tmp_path / "big" / "summary.json").read_text())
    assert summary["estimate"]["data_bytes"] < 50e6  # the shared rows, not 10^5 clients' copies


def test_the_command_lines_cyclic_population_equals_its_list_run(tmp_path, monkeypatch):
    args = A9A_RUN + ["-N", "300", "--clients-per-round", "7"]
    assert main(args + ["--out", str(tmp_path / "pop")]) == 0
    monkeypatch.setattr(build_module, "Population", lambda n, src, recipe: [src(i) for i in range(n)])  # a list
    assert main(args + ["--out", str(tmp_path / "list")]) == 0
    pop, listed = (torch.load(tmp_path / d / "model.pt")["params"] for d in ("pop", "list"))
    assert torch.equal(pop, listed)


@pytest.mark.parametrize("mode", ["global", "local", "none"])
def test_a_large_folder_under_partial_participation_runs_as_a_population_equal_to_the_eager_run(tmp_path,
                                                                                                 monkeypatch, mode):
    _folder(tmp_path / "f", k=24)
    args = ["run", "--dataset", f"folder:{tmp_path / 'f'}", "--partition", "natural", "-N", "24", "--clients-per-round",
            "5", "-a", "scaffold", "-T", "3", "--standardize", mode, "--model", "linear", "--dtype", "float64",
            "--threads", "1", "--executor", "sequential", "--no-progress", "--no-plot"]
    built = []
    real = FolderClients.__call__
    monkeypatch.setattr(FolderClients, "__call__", lambda self, i: built.append(i) or real(self, i))
    monkeypatch.setattr(population_sources, "FOLDER_POPULATION", 10)  # 24 files: a population
    assert main(args + ["--out", str(tmp_path / "pop")]) == 0
    if mode == "none":  # without metric passes (each reads every client), only the cohorts' files are built
        built.clear()
        assert main(args + ["--metrics-every", "0", "--out", str(tmp_path / "quiet")]) == 0
        assert 0 < len(built) <= 3 * 5 + PROBE_CLIENTS + FINGERPRINT_CLIENTS
    monkeypatch.setattr(population_sources, "FOLDER_POPULATION", 10**9)  # read whole, as before
    assert main(args + ["--out", str(tmp_path / "eager")]) == 0
    pop, eager = (torch.load(tmp_path / d / "model.pt")["params"] for d in ("pop", "eager"))
    assert torch.equal(pop, eager)
    rows = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
            for d in ("pop", "eager")]
    assert len(rows[0]) == len(rows[1]) >= 2
    for a, b in zip(*rows):
        assert a["test_loss"] == b["test_loss"] and a["test_acc"] == b["test_acc"] and abs(a["f"] - b["f"]) < 1e-12
    assert "each read when its client is sampled" in json.loads((tmp_path / "pop" / "summary.json").read_text())[
        "dataset"]


def test_a_folder_population_from_the_command_line_is_refused_without_test_rows(tmp_path, monkeypatch, capsys):
    _folder(tmp_path / "f", k=12)
    monkeypatch.setattr(population_sources, "FOLDER_POPULATION", 10)
    base = ["run", "--dataset", f"folder:{tmp_path / 'f'}", "--partition", "natural", "--clients-per-round", "2",
            "--no-progress", "--out", str(tmp_path / "never")]
    assert main(base + ["-N", "12", "--test-fraction", "0"]) != 0
    assert "no test rows" in capsys.readouterr().err and not (tmp_path / "never").exists()
    assert main(base + ["-N", "11"]) != 0
    assert "-N 11: the folder's files are its clients: use --partition natural -N 12" in capsys.readouterr().err


def test_the_full_participation_benchmark_runs_scaled_down(tmp_path):
    """A smoke of `python -m bench.population --workload fedcanon` (A9A as clients of 3 rows, every client
    every round, a streamed RAM store beside the dense stack, each against the state's read+write floor)."""
    from bench import population as bench

    out = tmp_path / "fedcanon.md"
    bench.main(["--workload", "fedcanon", "--clients", "300", "--rounds", "2", "-K", "1", "--repeats", "1",
                "--out", str(out)])
    rows = [line for line in out.read_text().splitlines() if line.startswith("| FedCanon |")]
    assert [(r.split("|")[3].strip(), r.split("|")[4].strip()) for r in rows] == [("batched", "ram"),
                                                                                  ("batched", "dense")]
    assert all("| 300 |" in r and float(r.split("|")[6]) > 0 for r in rows)  # the floor, ms


@pytest.mark.parametrize("tests, mode", [("per-client", "local"), ("pooled", "global")])
def test_a_folder_population_with_a_test_folder_equals_the_eager_run(tmp_path, monkeypatch, tests, mode):
    data = _folder(tmp_path / "f", k=12)
    os.makedirs(tmp_path / "f" / "test")
    rng = np.random.default_rng(5)
    for name, (X, y) in list(data.items())[: 12 if tests == "per-client" else 1]:  # a client's held rows
        X, y = X + rng.normal(size=X.shape), y[::-1].copy()
        target = tmp_path / "f" / "test" / (name if tests == "per-client" else "pooled.npz")
        np.savez(target, X=X, y=y) if target.suffix == ".npz" else target.write_text(
            "".join(",".join(repr(float(v)) for v in (*x, c)) + "\n" for x, c in zip(X, y)))
    args = ["run", "--dataset", f"folder:{tmp_path / 'f'}", "--partition", "natural", "-N", "12", "--clients-per-round",
            "4", "-a", "fedavg", "-T", "2", "--standardize", mode, "--model", "linear", "--dtype", "float64",
            "--threads", "1", "--no-progress", "--no-plot"]
    for limit, out in ((10, "pop"), (10**9, "eager")):
        monkeypatch.setattr(population_sources, "FOLDER_POPULATION", limit)
        assert main(args + ["--out", str(tmp_path / out)]) == 0
    pop, eager = (torch.load(tmp_path / d / "model.pt")["params"] for d in ("pop", "eager"))
    assert torch.equal(pop, eager)
    rows = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
            for d in ("pop", "eager")]
    assert len(rows[0]) == len(rows[1]) >= 2
    assert all(a["test_loss"] == b["test_loss"] and a["test_acc"] == b["test_acc"] for a, b in zip(*rows))


def test_a_folder_population_resumes_bit_for_bit_and_refuses_a_changed_sampled_file(tmp_path, monkeypatch, capsys):
    _folder(tmp_path / "f", k=16)
    monkeypatch.setattr(population_sources, "FOLDER_POPULATION", 10)
    args = ["--dataset", f"folder:{tmp_path / 'f'}", "--partition", "natural", "-N", "16", "--clients-per-round", "4",
            "-a", "scaffold", "--standardize", "none", "--dtype", "float64", "--threads", "1", "--no-progress",
            "--no-plot"]
    assert main(["run", *args, "-T", "4", "--out", str(tmp_path / "whole")]) == 0
    assert main(["run", *args, "-T", "2", "--out", str(tmp_path / "cut")]) == 0
    assert main(["run", "--resume", str(tmp_path / "cut"), "-T", "4", "--no-progress", "--no-plot"]) == 0
    whole, cut = (torch.load(tmp_path / d / "model.pt")["params"] for d in ("whole", "cut"))
    assert torch.equal(whole, cut)
    d = dict(np.load(tmp_path / "f" / "client_0015.npz"))  # the last client: one the fingerprint samples
    np.savez(tmp_path / "f" / "client_0015.npz", X=d["X"] * 2, y=d["y"])  # same size, other rows
    capsys.readouterr()
    assert main(["run", "--resume", str(tmp_path / "cut"), "-T", "6", "--no-progress", "--no-plot"]) != 0
    err = capsys.readouterr().err  # same recipe (same listing and sizes), other content at a sampled client
    assert "cannot resume from the snapshot" in err and "content hash" in err and "listing=" in err


def test_a_folder_populations_estimate_counts_the_clients_it_keeps(tmp_path, monkeypatch):
    """The up-front estimate of a folder population counts client 0's tensors times the clients kept
    (it printed "data 0 kB": a folder shares no rows for the population to report)."""
    _folder(tmp_path / "f", k=24)
    monkeypatch.setattr(population_sources, "FOLDER_POPULATION", 10)  # 24 files: a population
    assert main(["run", "--dataset", f"folder:{tmp_path / 'f'}", "--partition", "natural", "-N", "24",
                 "--clients-per-round", "5", "-a", "scaffold", "-T", "1", "--standardize", "none", "--model", "linear",
                 "--dtype", "float64", "--threads", "1", "--no-progress", "--no-plot",
                 "--out", str(tmp_path / "pop")]) == 0
    got = json.loads((tmp_path / "pop" / "summary.json").read_text())["estimate"]["data_bytes"]
    client0 = (4 * 3 + 4) * 8  # client 0: 4 rows of 3 float64 features, 4 labels (int64 or float64: 8 bytes each)
    assert client0 <= got <= client0 * 128


@pytest.mark.parametrize("standardize", ["none", "global"])
def test_a_libsvm_folder_population_is_as_wide_as_its_widest_file(tmp_path, monkeypatch, standardize):
    """LIBSVM client files leave out trailing zero features; client 2's file is wider than client 0's. The
    population the command line builds (a folder of FOLDER_POPULATION files or more: scan_folder reads
    every file first) has the eager path's clients, every file widened to the widest: each client's X
    (float64) and y bit for bit those of the eager run's clients, which are load_folder's rows of that
    client. Without a scan client 0's width is kept, and the wider file refused naming it."""
    from python_algos.data import load_folder
    from python_algos.experiments.config import Config

    rng = np.random.default_rng(3)
    path = tmp_path / "f"
    path.mkdir()
    for i, width in enumerate((3, 2, 6, 4, 5)):
        X = np.where(rng.random((5 + i, width)) < 0.3, 0.0, rng.normal(size=(5 + i, width)))
        X[:, -1] = 1.5 + i  # the file's widest feature
        rows = (f"{c} " + " ".join(f"{j + 1}:{float(v)!r}" for j, v in enumerate(r) if v)
                for r, c in zip(X, (-1, 1) * 9))
        (path / f"c{i}.libsvm").write_text("\n".join(rows) + "\n")
    cfg = Config(dataset=f"folder:{path}", partition="natural", num_clients=5, clients_per_round=2, seed=2,
                 standardize=standardize)
    monkeypatch.setattr(population_sources, "FOLDER_POPULATION", 3)
    pop = build_module.prepare_data(cfg)
    assert isinstance(pop.clients, Population)
    monkeypatch.setattr(population_sources, "FOLDER_POPULATION", 10**9)
    eager = build_module.prepare_data(cfg)
    X, _, _, _, groups, *_ = load_folder(str(path), seed=2, test_fraction=0.2)
    for i in range(5):
        got, want = pop.clients[i], eager.clients[i]
        assert got[0].dtype == torch.float64 and got[0].shape[1] == 6
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), i
        if standardize == "none":
            assert torch.equal(got[0], X[groups == i]), i
    assert torch.equal(pop.dataset.X_test, eager.dataset.X_test)
    with pytest.raises(ValueError, match=r"c2\.libsvm: features of shape \(6,\), .*c0\.libsvm has \(3,\)"):
        FolderClients(str(path), seed=2)(2)
