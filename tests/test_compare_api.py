"""compare() from Python (python_algos.experiments.api, issue 38 item 4): algorithms × seeds through simulate
into the group folder `compare --seeds` writes, its aggregate.jsonl and mean ± std table.

Ground truth: the command line itself on the same data (`compare -a A B --seeds 2`: its aggregate.jsonl,
to 1e-10 in float64, and its folder's file names), plain simulate calls seeded by hand (what a seed
changes), the test metrics recomputed here with plain PyTorch, and the samples a loss function sees
(which rows a fractional test_clients split holds out)."""

import json
import os

import pytest
import torch
import torch.nn.functional as F
from test_run_folders import TINY, tiny

import fedkernels as fk
from python_algos import FedAvg, FedCanon, make, simulate
from python_algos.experiments.api import compare
from python_algos.experiments.build import prepare_data
from python_algos.experiments.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
TIMINGS = {"wall_time", "elapsed", "prox_time", "grad_time", "fwd_bwd_time"}


class Logistic(torch.nn.Module):
    """The command line's `--model linear` of a binary task (one nn.Linear, output as a vector), in plain torch."""

    def __init__(self, d):
        super().__init__()
        self.linear = torch.nn.Linear(d, 1)

    def forward(self, x):
        return self.linear(x).reshape(-1)


def _bce(out, y):
    return F.binary_cross_entropy_with_logits(out, y.to(out.dtype))


def _tree(root):
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


def test_python_compare_equals_the_command_line(tmp_path):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps({**TINY, "rounds": 3}))
    cli, api = str(tmp_path / "cli"), str(tmp_path / "api")
    assert main(["compare", "-a", "fedcanon", "fedavg", "--config", str(cfg), "--seeds", "2", "--out", cli,
                 "--no-progress", "--no-plot"]) == 0
    fed = prepare_data(tiny())  # the clients the command line trained on; its pooled test set, cut per client
    ds, n = fed.dataset, len(fed.clients)
    test = list(zip(ds.X_test.tensor_split(n), ds.y_test.tensor_split(n)))
    lr, k = TINY["lr"], TINY["local_steps"]
    algs = {a: make(a, lr=lr, local_steps=k) for a in ("fedcanon", "fedavg")}  # what -a fedcanon fedavg builds
    res = compare(algs, lambda: Logistic(8).double(), _bce, fed.clients, 3, out=api, seeds=2, test_clients=test,
                  regularizer=fk.L1(0.01), batch_size=TINY["batch_size"], metric_step=lr * k)  # compare's s = lr·K
    got = [json.loads(line) for line in open(os.path.join(api, "aggregate.jsonl"))]
    want = [json.loads(line) for line in open(os.path.join(cli, "aggregate.jsonl"))]
    assert [(r["label"], r["round"], r["n"]) for r in got] == [(r["label"], r["round"], r["n"]) for r in want]
    assert len(got) == 2 * 4 and all(r["n"] == 2 for r in got)
    for g, w in zip(got, want):
        assert {"f+h", "grad_map_sq", "test_acc", "test_loss", "sparsity"} <= set(g)
        for key in set(g) - TIMINGS - {"label", "round", "n"}:
            for s in ("mean", "std", "min", "max"):
                assert g[key][s] == pytest.approx(w[key][s], rel=1e-10, abs=1e-12), (g["label"], g["round"], key, s)
    # the command line's folder format: every file compare() writes is one the command line writes there
    assert _tree(api) <= _tree(cli) and {"seeds.json", "aggregate.md", "seed-1/comparison.json",
                                         "seed-1/fedavg/metrics.jsonl"} <= _tree(api)
    for k in (0, 1):
        for a in ("fedcanon", "fedavg"):
            p = [torch.load(os.path.join(d, f"seed-{k}", a, "model.pt"), weights_only=True) for d in (api, cli)]
            torch.testing.assert_close(p[0]["params"], p[1]["params"], rtol=1e-10, atol=1e-12)
    assert res.table == open(os.path.join(api, "aggregate.md")).read().rstrip("\n") and "±" in res.table
    assert res.final["fedavg"]["f+h"]["n"] == 2 and res.seeds == [0, 1]


def _problem(n_clients=3, rows=20, d=4):
    g = torch.Generator().manual_seed(5)
    w = torch.randn(d, generator=g, dtype=torch.float64)
    out = []
    for i in range(n_clients):
        X = torch.randn(rows, d, generator=g, dtype=torch.float64) + 0.3 * i
        out.append((X, (X @ w > 0).long()))
    return out


def _net():
    return torch.nn.Linear(4, 2).double()


def test_a_seed_sets_the_models_init_and_the_runs_are_simulates(tmp_path):
    clients, test = _problem(), _problem(rows=7)
    algs = {"canon": FedCanon(alpha=0.2, beta=0.05, local_steps=2), "avg": FedAvg(lr_local=0.1, local_steps=2)}
    res = compare(algs, _net, F.cross_entropy, clients, 4, out=str(tmp_path / "g"), seeds=[3, 7], test_clients=test,
                  regularizer=fk.L1(1e-3), batch_size=5, metric_step=0.2)
    Xt, yt = torch.cat([t[0] for t in test]), torch.cat([t[1] for t in test])
    for label, alg in algs.items():
        for j, k in enumerate((3, 7)):
            torch.manual_seed(k)
            model = _net()
            ref = simulate(alg, model, F.cross_entropy, clients, 4, regularizer=fk.L1(1e-3), batch_size=5, seed=k,
                           metric_step=0.2)
            hist = res.histories[label][j]
            assert torch.equal(hist.params, ref.params), (label, k)
            assert [r["f+h"] for r in hist.metrics] == [r["f+h"] for r in ref.metrics]
            with torch.no_grad():  # the test metrics: model's accuracy and mean loss on the pooled test rows
                out = model(Xt)
            assert hist.metrics[-1]["test_acc"] == (out.argmax(1) == yt).double().mean().item()
            assert hist.metrics[-1]["test_loss"] == pytest.approx(F.cross_entropy(out, yt).item(), rel=1e-12)
    assert not torch.equal(res.histories["canon"][0].params, res.histories["canon"][1].params)
    assert "canon" in res.table and "avg" in res.table and "test acc" in res.table


def _rows_seen(tmp_path, reseed: bool) -> list:
    """Per seed 0, 1, 2: (rows trained on, rows tested on), read from the calls of the loss. y holds row ids
    (client i: 100·i + r); the test metrics are the only call that sees several clients' rows."""
    clients = [(torch.randn(20, 2, dtype=torch.float64), torch.arange(20, dtype=torch.float64) + 100 * i)
               for i in range(3)]
    calls = []

    def loss(out, y):
        calls.append({int(v) for v in y.tolist()})
        return F.mse_loss(out.reshape(-1), y * 0)

    res = []
    for k in range(3):  # one folder per seed, so the calls of each seed are apart
        calls.clear()
        compare([FedAvg(lr_local=0.01, local_steps=1)], lambda: torch.nn.Linear(2, 1).double(), loss, clients, 1,
                out=str(tmp_path / f"s{k}"), seeds=[0, k] if k else [0], test_clients=0.25, reseed_data=reseed)
        last = [c for c in calls if len({v // 100 for v in c}) > 1][-1]  # the last seed's test rows
        res.append((set().union(*(c for c in calls if len({v // 100 for v in c}) == 1)), last))
    return res


@pytest.mark.parametrize("reseed", [False, True])
def test_a_fraction_holds_out_rows_of_each_client_drawn_once_unless_reseed_data(tmp_path, reseed):
    seen = _rows_seen(tmp_path, reseed)
    for train, test in seen:
        for i in range(3):
            mine = {v for v in test if v // 100 == i}
            assert len(mine) == 5  # round(20 · 0.25) rows of every client
        assert {v for v in train if v in test} == set() or reseed  # never trained on (one split per folder)
        assert train | test == {100 * i + r for i in range(3) for r in range(20)}
    tests = [frozenset(t) for _, t in seen]
    # seed 0, then seeds 0 and 1, then 0 and 2: the last seed tests on the first seed's rows, or on its own
    assert len(set(tests)) == (3 if reseed else 1)


@pytest.mark.parametrize("kw, error, words", [
    ({"seeds": 0}, ValueError, ["seeds=0"]),
    ({"seeds": [1, 1]}, ValueError, ["seeds", "repeated"]),
    ({"algorithms": [FedAvg(lr_local=0.1, local_steps=1), FedAvg(lr_local=0.2, local_steps=1)]}, ValueError,
     ["algorithms", "FedAvg", "twice"]),
    ({"algorithms": {"a:b": FedAvg(lr_local=0.1, local_steps=1), "a-b": FedAvg(lr_local=0.1, local_steps=1)}},
     ValueError, ["algorithms", "twice"]),
    ({"test_clients": [(torch.zeros(2, 4), torch.zeros(2).long())]}, ValueError, ["test_clients", "1 entries", "3"]),
    ({"test_clients": 1.5}, ValueError, ["test_clients=1.5"]),
    ({"test_clients": 0.99}, ValueError, ["test_clients=0.99", "client 0"]),
    ({"reseed_data": True}, ValueError, ["reseed_data", "fraction"]),
    ({"model": _net()}, TypeError, ["model must be a function"]),
    ({"seed": 3}, TypeError, ["seed"]),
    ({"rounds": -1}, ValueError, ["rounds"]),
    ({"algorithms": ["fedavg"]}, TypeError, ["algorithms", "'fedavg'", "python_algos.make"]),
    ({"batch_sise": 3}, TypeError, ["batch_sise"]),
    ({"participation": 0.5, "algorithms": [FedCanon(alpha=0.1, beta=0.1, local_steps=1)]}, ValueError,
     ["partial participation"]),
])
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, kw, error, words):
    out = tmp_path / "g"
    args = {"algorithms": [FedAvg(lr_local=0.1, local_steps=1)], "model": _net, "loss_fn": F.cross_entropy,
            "clients": _problem(), "rounds": 2, "out": str(out), **kw}
    with pytest.raises(error) as e:
        compare(**args)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert not out.exists()


def test_a_used_folder_is_refused_unless_replace_and_no_resume_continues_it(tmp_path, capsys):
    out = str(tmp_path / "g")
    kw = dict(model=_net, loss_fn=F.cross_entropy, clients=_problem(), rounds=1, out=out, seeds=1)
    compare([FedAvg(lr_local=0.1, local_steps=1)], **kw)
    before = _tree(out)
    with pytest.raises(FileExistsError, match="replace=True"):
        compare([FedAvg(lr_local=0.2, local_steps=1)], **kw)
    assert _tree(out) == before
    compare({"other": FedAvg(lr_local=0.2, local_steps=1)}, **kw, replace=True)
    assert not os.path.exists(os.path.join(out, "seed-0", "FedAvg")) and "other" in open(f"{out}/aggregate.md").read()
    for argv in (["compare", "--resume", out], ["compare", "--resume", os.path.join(out, "seed-0")]):
        assert main(argv + ["--no-progress"]) == 1
        assert "compare() from Python" in capsys.readouterr().err


def test_a_diverged_seed_is_left_out_as_on_the_command_line(tmp_path):
    clients = [(X.double(), X.sum(1, keepdim=True)) for X, _ in _problem()]  # least squares, step far past 2/L
    res = compare({"wild": FedAvg(lr_local=10.0, local_steps=3)}, lambda: torch.nn.Linear(4, 1).double(), F.mse_loss,
                  clients, 8, out=str(tmp_path / "g"), seeds=2)
    assert [s["status"] for s in res.summaries["wild"]] == ["diverged", "diverged"]
    assert "0 of 2" in res.table and "left out" in res.table and res.final["wild"] == {}


def test_the_group_plots_with_the_command_line(tmp_path):
    pytest.importorskip("matplotlib")
    out = str(tmp_path / "g")
    res = compare([make(a, lr=0.1, local_steps=2) for a in ("fedcanon", "fedavg")], _net, F.cross_entropy,
                  _problem(), 3, out=out, seeds=2, test_clients=0.25)
    assert main(["plot", out, "--formats", "png"]) == 0
    assert os.path.isfile(os.path.join(out, "overview.png"))
    files = res.plot(formats="png", name="again")
    assert files and all(os.path.isfile(f) for f in files)
