"""Your own per-client data (``--dataset folder:PATH``, issue 38 item 1), federated standardisation
(``--standardize``, item 2) and the data-set options derived from the generators' signatures (issue 36
item 7).

Ground truth: the arrays the test writes into the files, numpy's pooled / per-client statistics in
float64, ``inspect.signature`` of the generators, and ``simulate`` run here on the files read with
numpy (the 6-hospital task through the command line equals it to 1e-10 in float64)."""

from __future__ import annotations

import inspect
import json
import os
import re
from typing import Annotated

import numpy as np
import pytest
import torch

import fedkernels as fk
from python_algos import FedAvg, FedCanon, simulate
from python_algos.data import check_data_options, federate, load_dataset, standardize, synthetic
from python_algos.data.datasets import DATA_OPTIONS, MAKERS
from python_algos.data.folder import read_client
from python_algos.data.options import Opt, options_of
from python_algos.data.standardize import client_moments, combine_moments
from python_algos.experiments import node_data
from python_algos.experiments.build import prepare_data
from python_algos.experiments.cli import main
from python_algos.experiments.config import Config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COLUMNS = ["age", "bmi", "chol", "x4", "outcome"]


def _hospitals(folder, k=6, seed=0, test=True):
    """``k`` CSV files (with a header, the label in column ``outcome``), label-skewed and on very
    different scales; ``test/`` with 6 rows per client. Returns {name: (X, y)} of the training files."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder / "test", exist_ok=True)
    w, data = rng.normal(size=4), {}
    for i in range(k):
        n = 20 + 5 * i
        X = rng.normal(loc=i, scale=1 + i, size=(n + 6, 4)) * [1.0, 10.0, 100.0, 0.1] + [50, 0, 200, 0]
        y = ((X - X.mean(0)) / X.std(0) @ w + rng.normal(size=n + 6) > 0.3 * (i - 2)).astype(int)
        for where, rows in ((folder, slice(0, n)), (folder / "test", slice(n, n + 6))):
            if where == folder / "test" and not test:
                continue
            lines = [",".join(COLUMNS)] + [",".join(repr(float(v)) for v in x) + f",{c}" for x, c in zip(X[rows],
                                                                                                     y[rows])]
            (where / f"site{i}.csv").write_text("\n".join(lines) + "\n")
        data[f"site{i}"] = (X[:n], y[:n])
    if not test:
        os.rmdir(folder / "test")
    return data


# --- issue 36 item 7: the options are the generators' parameters ------------------------------------- #

def _gen(k: Annotated[int, Opt(2, 9, "things")] = 3, rate: float = 0.5, on: bool = True, seed: int = 0):
    return k


def test_each_data_sets_options_are_its_generators_parameters():
    for name, (fn, hidden) in MAKERS.items():
        params = {k: p.default for k, p in inspect.signature(fn).parameters.items()
                  if k not in (*hidden, "seed") and p.kind is p.POSITIONAL_OR_KEYWORD}
        assert {k: o.default for k, o in DATA_OPTIONS[name].items()} == params, name
    assert "n" in DATA_OPTIONS["sparse_logistic"] and "task" not in DATA_OPTIONS["sparse_logistic"]
    assert set(DATA_OPTIONS["folder"]) == {"label", "header"}

    opts = options_of(_gen)
    assert set(opts) == {"k", "rate", "on"}  # a new parameter is an option, with no table to update
    assert opts["k"].rule_broken("k", 10) == "k must be an integer in [2, 9] (things), got 10"
    assert opts["rate"].rule_broken("rate", "x") == "rate must be a finite number, got 'x'"
    assert opts["on"].rule_broken("on", 1) == "on must be true or false"


def test_a_bad_option_is_named_with_its_rule_before_anything_runs(tmp_path, capsys):
    assert check_data_options("image_like", {"shape": [1, 8]}) == (
        "shape", "shape must be a list of 3 integers in [1, 4096] (channels, height, width), got [1, 8]")
    assert check_data_options("synthetic", {"samples": None}) is None  # Optional: null allowed
    assert check_data_options("synthetic", {"num_classes": 1})[0] == "num_classes"
    assert check_data_options("folder:/x", {"label": 2.5})[1].startswith("label must be an integer or a non-empty")
    assert main(["run", "--dataset", "image_like", "--data-opt", "modes=0", "--out", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err == ("error: --data-opt modes=0: modes must be an integer in [1, 2147483647] "
                                       "(prototypes per class), got 0\n")
    assert not (tmp_path / "r").exists()
    # the defaults the size check uses are the signature's: synthetic's 30 clients x 2000 x dim
    assert check_data_options("synthetic", {"dim": 40_000})[1].startswith("synthetic would generate 2,400,000,000")
    assert synthetic.fedprox_synthetic.__defaults__[2:4] == (30, 60)


# --- item 2: standardisation --------------------------------------------------------------------------- #

def test_standardize_equals_pooled_and_per_client_numpy_statistics():
    rng = np.random.default_rng(1)
    clients = [(torch.from_numpy(rng.normal(1e4 + i, 1 + 3 * i, size=(5 + 7 * i, 3))), torch.zeros(5 + 7 * i))
               for i in range(4)]
    clients[2][0][:, 1] = 7.0  # constant within a client: local leaves it centred, unscaled
    pooled = np.concatenate([X.numpy() for X, _ in clients])
    got, test = standardize(clients, "global", test=(clients[0][0][:2], torch.zeros(2)))
    mean, std = pooled.mean(0), pooled.std(0)
    for (X, _), (Z, _) in zip(clients, got):
        np.testing.assert_allclose(Z.numpy(), (X.numpy() - mean) / std, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(test[0].numpy(), (clients[0][0][:2].numpy() - mean) / std, rtol=1e-10, atol=1e-10)
    for (X, _), (Z, _) in zip(clients, standardize(clients, "local")):
        s = X.numpy().std(0)
        np.testing.assert_allclose(Z.numpy(), (X.numpy() - X.numpy().mean(0)) / np.where(s > 0, s, 1), atol=1e-9)
    assert standardize(clients, "none")[1][0] is clients[1][0]
    with pytest.raises(ValueError, match="a pooled test set's rows belong to no client"):
        standardize(clients, "local", test=(clients[0][0], None))
    with pytest.raises(ValueError, match="standardize mode must be one of global, local, none"):
        standardize(clients, "pooled")


def test_the_clients_shared_moments_combine_to_numpys_pooled_statistics():
    """What a Flower node sends (count, mean, M2 of its rows) and the server's combination of them:
    numpy's mean and std of the pooled rows, on large offsets (a raw sum of squares loses them)."""
    rng = np.random.default_rng(7)
    for case in range(20):
        k = int(rng.integers(1, 6))
        Xs = [rng.normal(rng.normal(0, 1e6), rng.uniform(0.01, 10), size=(int(rng.integers(1, 30)), 3))
              for _ in range(k)]
        mean, std = combine_moments([client_moments(torch.from_numpy(X)) for X in Xs])
        pooled = np.concatenate(Xs)
        np.testing.assert_allclose(mean.numpy(), pooled.mean(0), rtol=1e-12, err_msg=f"case {case}")
        want = pooled.std(0)
        np.testing.assert_allclose(std.numpy(), np.where(want > 0, want, 1), rtol=1e-7, err_msg=f"case {case}")


def test_standardize_from_the_command_line_is_the_pooled_scaling_and_recorded(tmp_path, capsys):
    base = dict(dataset="sparse_logistic", data_opts={"n": 200, "dim": 5, "nnz": 2, "num_groups": 4, "shift": 3.0},
                num_clients=4, partition="natural")
    raw, fed = prepare_data(Config(**base)), prepare_data(Config(**base, standardize="global"))
    pooled = torch.cat([X for X, _ in raw.clients]).double().numpy()
    mean, std = pooled.mean(0), pooled.std(0)
    for (X, _), (Z, _) in zip(raw.clients, fed.clients):
        np.testing.assert_allclose(Z.numpy(), (X.double().numpy() - mean) / std, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fed.dataset.X_test.numpy(), (raw.dataset.X_test.double().numpy() - mean) / std,
                               rtol=1e-6, atol=1e-6)
    assert raw.dataset.source in fed.dataset.source and "standardized global" in fed.dataset.source
    out = tmp_path / "r"
    flags = ["run", "--data-opt", "n=200", "--data-opt", "dim=5", "--data-opt", "nnz=2", "-T", "1", "--no-plot",
             "--out", str(out)]
    assert main([*flags, "--standardize", "local"]) == 1
    assert capsys.readouterr().err.startswith("error: --standardize local: 'local' scales each client by its own "
                                              "statistics, and the test rows of sparse_logistic belong to no client")
    assert not out.exists()
    assert main([*flags, "--standardize", "global", "--no-progress"]) == 0
    assert "standardized global (pooled statistics" in json.loads((out / "summary.json").read_text())["dataset"]
    assert json.loads((out / "config.json").read_text())["standardize"] == "global"


# --- item 1: the folder --------------------------------------------------------------------------------- #

def test_every_format_reads_the_arrays_written(tmp_path):
    rng = np.random.default_rng(2)
    X = [rng.normal(size=(n, 3)).round(6) for n in (4, 5, 6, 7, 3)]
    y = [rng.integers(0, 3, size=len(x)) for x in X]
    (tmp_path / "a.csv").write_text("f1,f2,y,f3\n" + "".join(f"{r[0]},{r[1]},{c},{r[2]}\n" for r, c in zip(X[0], y[0])))
    (tmp_path / "b.tsv").write_text("".join(f"{c}\t" + "\t".join(map(str, r)) + "\n" for r, c in zip(X[1], y[1])))
    np.savez(tmp_path / "c.npz", X=X[2], y=y[2])
    torch.save({"X": torch.from_numpy(X[3]), "y": torch.from_numpy(y[3])}, tmp_path / "d.pt")
    (tmp_path / "e.libsvm").write_text("".join(f"{c} " + " ".join(f"{j + 1}:{v}" for j, v in enumerate(r) if j < 2)
                                               + "\n" for r, c in zip(X[4], y[4])))  # its 3rd feature left out
    X[4][:, 2] = 0.0
    with pytest.raises(ValueError, match=r"b\.tsv:1: label='y' names a column, but the file has no header row"):
        load_dataset(f"folder:{tmp_path}", test_fraction=0, label="y")
    # label=2 is a's 'y' column by index; b's label is its column 0: one label= for every file, so b gets a header
    (tmp_path / "b.tsv").write_text("f1\tf2\ty\tf3\n" + "".join(f"{r[0]}\t{r[1]}\t{c}\t{r[2]}\n"
                                                              for r, c in zip(X[1], y[1])))
    ds = load_dataset(f"folder:{tmp_path}", test_fraction=0, label="y")
    assert ds.task == "multiclass" and ds.num_classes == 3 and ds.X_test is None and ds.X.dtype == torch.float64
    assert torch.equal(ds.X, torch.from_numpy(np.concatenate(X))) and torch.equal(ds.y, torch.from_numpy(
        np.concatenate(y)))
    fed = federate(ds, "natural", 5, standardize="none")
    assert [len(c[1]) for c in fed.clients] == [4, 5, 6, 7, 3]  # the files, in sorted name order
    with pytest.raises(ValueError, match=r"files are its clients: use partition 'natural' \(--partition natural -N 5"):
        federate(ds, "iid", 5)


def _one_line_error(capsys, args, tmp_path):
    out = tmp_path / "out"
    assert main(["run", *args, "--partition", "natural", "-N", "2", "-T", "1", "--out", str(out), "--no-plot"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists(), err
    return err


BAD = [("a,b,y\n1,2,0\n1,x,1\n", [], r"c1\.csv:3: column b: 'x' is not a number"),
       ("a,b,y\n1,2,0\n1,2\n", [], r"c1\.csv:3: 2 fields, the first row has 3 \(ragged rows\)"),
       ("a,b,y\n1,2,0\n1,inf,1\n", [], r"c1\.csv:3: column b: 'inf' is not a finite number"),
       ("a,b,y\n1,2,0\n1,nan,1\n", [], r"c1\.csv:3: column b: 'nan' is not a finite number"),
       ("a,b,y\n", [], r"c1\.csv: no samples; every client needs at least 1 row"),
       ("a,b,y\n1,2,0\n", ["--data-opt", "label=outcome"], r"c1\.csv:1: no label column 'outcome'; the header has "
                                                           r"a, b, y"),
       ("1,2,0\n3,4,1\n", ["--data-opt", "label=7"], r"c1\.csv:1: no label column 7: the rows have 3 columns"),
       ("a,b,c,y\n1,2,3,0\n", [], r"c2\.csv: features of shape \(2,\), .*c1\.csv has \(3,\): every client's file "
                                  r"needs the same columns"),
       ("a,c,y\n1,2,0\n", [], r"c2\.csv:1: its columns a, b differ from .*c1\.csv's a, c")]


@pytest.mark.parametrize("text,flags,message", BAD)
def test_bad_input_is_one_line_naming_the_file_line_and_rule_before_anything_is_written(tmp_path, capsys, text,
                                                                                        flags, message):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "c1.csv").write_text(text)
    (tmp_path / "d" / "c2.csv").write_text("a,b,y\n1,2,0\n3,4,1\n5,6,1\n")
    err = _one_line_error(capsys, ["--dataset", f"folder:{tmp_path / 'd'}", *flags], tmp_path)
    assert err.startswith(f"error: --dataset folder:{tmp_path / 'd'}") and re.search(message, err), err


def test_a_npz_without_its_arrays_and_a_stray_file_are_named(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    np.savez(tmp_path / "d" / "c1.npz", X=np.ones((3, 2)), labels=np.zeros(3))
    (tmp_path / "d" / "c2.csv").write_text("1,2,0\n")
    assert "c1.npz: needs arrays 'X' and 'y' (features, labels), has X, labels" in _one_line_error(
        capsys, ["--dataset", f"folder:{tmp_path / 'd'}"], tmp_path)
    np.savez(tmp_path / "d" / "c1.npz", X=np.array([[1.0, np.nan]]), y=np.zeros(1))
    assert "c1.npz: row 1: NaN or Inf" in _one_line_error(capsys, ["--dataset", f"folder:{tmp_path / 'd'}"], tmp_path)
    (tmp_path / "d" / "notes.txt").write_text("hello")
    assert "notes.txt: not a client file" in _one_line_error(capsys, ["--dataset", f"folder:{tmp_path / 'd'}"],
                                                             tmp_path)


def test_the_test_folder_per_client_pooled_or_held_out(tmp_path):
    data = _hospitals(tmp_path / "h", k=3)
    ds = load_dataset(f"folder:{tmp_path / 'h'}", label="outcome")
    assert len(ds.y) == sum(len(v[1]) for v in data.values()) and len(ds.y_test) == 18
    assert ds.test_groups.tolist() == [0] * 6 + [1] * 6 + [2] * 6
    fed = federate(ds, "natural", 3, standardize="local")  # each client's test rows by its own statistics
    X0 = data["site0"][0]
    np.testing.assert_allclose(fed.clients[0][0].numpy(), (X0 - X0.mean(0)) / X0.std(0), rtol=1e-10)
    for f in ("site1.csv", "site2.csv"):
        os.remove(tmp_path / "h" / "test" / f)
    os.rename(tmp_path / "h" / "test" / "site0.csv", tmp_path / "h" / "test" / "all.csv")
    ds = load_dataset(f"folder:{tmp_path / 'h'}", label="outcome")
    assert ds.test_groups is None and len(ds.y_test) == 6  # one pooled file
    with pytest.raises(ValueError, match="the test rows of folder belong to no client"):
        federate(ds, "natural", 3, standardize="local")
    (tmp_path / "h" / "test" / "other.csv").write_text((tmp_path / "h" / "test" / "all.csv").read_text())
    with pytest.raises(ValueError, match=r"all\.csv: no client file all\.\* in"):
        load_dataset(f"folder:{tmp_path / 'h'}", label="outcome")
    for f in ("all.csv", "other.csv"):
        os.remove(tmp_path / "h" / "test" / f)
    os.rmdir(tmp_path / "h" / "test")
    ds = load_dataset(f"folder:{tmp_path / 'h'}", label="outcome", test_fraction=0.25, seed=4)
    assert ds.test_groups.unique().tolist() == [0, 1, 2]  # each client holds out its own quarter
    assert len(ds.y_test) == sum(round(0.25 * len(v[1])) for v in data.values())


# --- the 6-hospital task: the command line equals simulate --------------------------------------------- #

def _reference(data, algorithm, T):
    """simulate on the files read here, standardised with numpy's pooled float64 statistics."""
    pooled = np.concatenate([X for X, _ in data.values()])
    mean, std = pooled.mean(0), pooled.std(0)
    clients = [(torch.from_numpy((X - mean) / std), torch.from_numpy(y).long()) for X, y in data.values()]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).double()
    hist = simulate(algorithm, model, torch.nn.functional.cross_entropy, clients, T, regularizer=fk.SCAD(0.01),
                    seed=0, threads=1)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), hist


def test_the_six_hospital_task_through_the_command_line_equals_simulate(tmp_path):
    data = _hospitals(tmp_path / "h", test=False)
    out = tmp_path / "cmp"
    assert main(["compare", "-a", "fedcanon", "fedavg", "--dataset", f"folder:{tmp_path / 'h'}", "--data-opt",
                 "label=outcome", "--test-fraction", "0", "--partition", "natural", "-N", "6", "--model", "linear",
                 "--reg", "scad", "--reg-strength", "0.01", "--lr", "0.05", "-K", "3", "-T", "4", "--dtype",
                 "float64", "--seed", "0", "--threads", "1", "--no-progress", "--no-plot", "--out", str(out)]) == 0
    for name, alg in (("fedcanon", FedCanon(alpha=0.15, beta=0.05, local_steps=3)),
                      ("fedavg", FedAvg(lr_local=0.05, lr_global=1.0, local_steps=3))):
        want, hist = _reference(data, alg, 4)
        got = torch.load(out / name / "model.pt")["params"]
        assert (got - want).abs().max() < 1e-10, name
        rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
        assert abs(rows[-1]["f+h"] - hist.series("f+h")[-1]) < 1e-10
        summary = json.loads((out / name / "summary.json").read_text())
        assert "standardized global (pooled statistics" in summary["dataset"]


@pytest.mark.parametrize("mode", ["global", "local", "none"])
def test_a_flower_node_builds_its_rows_from_its_own_file_and_the_shared_statistics(tmp_path, monkeypatch, mode):
    """The node side of the exchange (data_exchange): each node's moments, combined as the server does,
    give each node its rows, standardised as numpy does on the written arrays, opening only its files."""
    data = _hospitals(tmp_path / "h", k=3)
    cfg = Config(dataset=f"folder:{tmp_path / 'h'}", data_opts={"label": "outcome"}, partition="natural",
                 num_clients=3, standardize=mode, dtype="float64")
    shared = [node_data.folder_moments(cfg, i, (4,)) for i in range(3)]
    mean, std = combine_moments([s[:3] for s in shared])
    classes = torch.from_numpy(np.unique(np.concatenate([s[3].numpy() for s in shared])))
    info = {"name": "folder", "task": "multiclass", "in_shape": [4], "outputs": 2, "source": "test"}
    opened, real_open = [], open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: opened.append(os.path.basename(os.fspath(f))) or
                        real_open(f, *a, **k))
    node_data.keep_folder_rows(cfg, 2, str(tmp_path / "node"), {"mean": mean, "std": std, "classes": classes}, info)
    monkeypatch.undo()
    assert [f for f in opened if f.endswith(".csv")] == ["site2.csv", "site2.csv"]  # its file and its test file
    (X, y), shape = node_data.node_rows(cfg, 2, str(tmp_path / "node"))
    pooled, X2 = np.concatenate([d[0] for d in data.values()]), data["site2"][0]
    want = {"global": (X2 - pooled.mean(0)) / pooled.std(0), "local": (X2 - X2.mean(0)) / X2.std(0), "none": X2}
    np.testing.assert_allclose(X.numpy(), want[mode], rtol=1e-12, atol=1e-12)
    assert torch.equal(y, torch.from_numpy(data["site2"][1])) and shape.in_shape == (4,) and shape.outputs == 2
    with pytest.raises(ValueError, match="client 1: its rows of folder data were not built"):
        node_data.node_rows(cfg, 1, str(tmp_path / "node"))  # never the whole data set on a node


def test_a_node_reads_only_its_own_file_and_its_own_test_file(tmp_path, monkeypatch):
    data = _hospitals(tmp_path / "h", k=3)
    opened, real_open = [], open

    def spy(file, *args, **kwargs):
        opened.append(os.path.basename(os.fspath(file)) if not isinstance(file, int) else file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    X, y, Xt, yt = read_client(str(tmp_path / "h"), 1, "outcome", features=(4,))
    monkeypatch.undo()
    assert opened == ["site1.csv", "site1.csv"]  # its file, then its test/ file: no other client's
    np.testing.assert_array_equal(X, data["site1"][0])
    np.testing.assert_array_equal(y, data["site1"][1])
    assert Xt.shape == (6, 4) and yt.shape == (6,)
    with pytest.raises(ValueError, match=r"site1\.csv: features of shape \(4,\), the server has \(5,\)"):
        read_client(str(tmp_path / "h"), 1, "outcome", features=(5,))
    with pytest.raises(ValueError, match="client 3: the folder has 3 client files"):
        read_client(str(tmp_path / "h"), 3, "outcome")
    ds = load_dataset(f"folder:{tmp_path / 'h'}", label="outcome")  # the rows load_folder gives client 1
    np.testing.assert_array_equal(ds.X[ds.groups == 1].numpy(), X)
    np.testing.assert_array_equal(ds.X_test[ds.test_groups == 1].numpy(), Xt)


# --- a fuzzer: every folder either reads as written or is refused naming the file (and the line) ------ #

def _fuzz_case(rng, folder):
    """Random client CSV files (a header or not), possibly with one defect in one data row; returns the
    clients' (X, y) as written and (the defective client, where its error starts, the rule), or None."""
    k, d, header = int(rng.integers(1, 4)), int(rng.integers(1, 4)), bool(rng.integers(2))
    clients, texts = [], []
    for _ in range(k):
        n = int(rng.integers(2, 6))
        X, y = rng.normal(size=(n, d)).round(4), np.r_[0, 1, rng.integers(0, 3, size=n - 2)]
        clients.append((X, y))
        texts.append([[f"c{j}" for j in range(d)] + ["y"]] * header + [[repr(float(v)) for v in x] + [str(c)]
                                                                      for x, c in zip(X, y)])
    i, defect = int(rng.integers(k)), int(rng.integers(5))
    r = int(rng.integers(1, len(texts[i])))  # a data row after the first line (which sets the width)
    rows = texts[i]
    if defect == 1:
        rows[r] = [*rows[r]]
        rows[r][int(rng.integers(d + 1))] = str(rng.choice(["abc", "", "1,5"]))
    elif defect == 2:
        rows[r] = rows[r][:-1] if rng.integers(2) else rows[r] + ["7"]
    elif defect == 3:
        rows[r] = [*rows[r]]
        rows[r][int(rng.integers(d + 1))] = str(rng.choice(["nan", "inf", "-inf", "NaN"]))
    elif defect == 4:
        del rows[header:]
    for j, text in enumerate(texts):
        (folder / f"c{j}.csv").write_text("".join(",".join(f'"{c}"' if "," in c else c for c in row) + "\n"
                                                  for row in text))
    want = {1: (f":{r + 1}: column ", "is not a number"), 2: (f":{r + 1}: ", "(ragged rows)"),
            3: (f":{r + 1}: column ", "is not a finite number"), 4: (": no samples", "")}.get(defect)
    return clients, (None if want is None else (i, *want))


def test_fuzz_folder_reads_as_written_or_names_the_file_and_line(tmp_path, fuzz_budget):
    first, examples = fuzz_budget(150)
    for seed in range(first, first + examples):
        rng, folder = np.random.default_rng(seed), tmp_path / f"f{seed}"
        folder.mkdir()
        clients, want = _fuzz_case(rng, folder)
        try:
            ds = load_dataset(f"folder:{folder}", test_fraction=0)
        except ValueError as e:
            assert want is not None, (seed, str(e))
            i, where, rule = want
            assert str(e).startswith(f"{folder / f'c{i}.csv'}{where}") and rule in str(e), (seed, str(e))
            continue
        assert want is None, (seed, want)
        np.testing.assert_array_equal(ds.X.numpy(), np.concatenate([X for X, _ in clients]), err_msg=str(seed))
        assert ds.groups.tolist() == [i for i, (X, _) in enumerate(clients) for _ in range(len(X))], seed
