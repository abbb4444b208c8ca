"""``simulate(resume=...)`` refuses a snapshot taken under other settings (naming each differing
keyword with both values) before anything is changed, and a bare ``fk.GroupLasso`` is refused
before any round, for every algorithm."""

import copy
import json
import warnings

import pytest
import torch
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms.registry import ALGORITHMS, make
from python_algos.runfolder import checkpoint as ckpt
from python_algos.runfolder import setup_record as sc
from python_algos.runfolder.callbacks import Checkpoint

LOSS = nn.functional.cross_entropy


def problem(seed=0, n_clients=4, n=24, d_in=5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, d_in, generator=g, dtype=torch.float64) + 0.5 * i, torch.randint(0, 3, (n,), generator=g))
            for i in range(n_clients)]


def tiny_model(bn=True):
    torch.manual_seed(1)
    layers = [nn.Linear(5, 8)] + ([nn.BatchNorm1d(8)] if bn else []) + [nn.Tanh(), nn.Linear(8, 3)]
    return nn.Sequential(*layers).double()


ALG = dict(name="fedmid", lr=0.05, local_steps=2)  # composite, partial participation
BASE = dict(regularizer=fk.L1(0.01), batch_size=7, seed=3, clients_per_round=2)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run checkpointed at round 2 (through the checkpoint file, as a user would), and the
    uninterrupted 6-round run of the same settings. Each test reads the file afresh: a resume
    continues in the snapshot's own state tensors."""
    path = tmp_path_factory.mktemp("ck") / "ck.pt"
    saver = ckpt.Checkpointer(path)
    simulate(make(**ALG), tiny_model(), LOSS, problem(), 4, **BASE,
             callbacks=[lambda t, s, m: t == 3, Checkpoint(saver, 2)])  # "dies" in round 3
    full = simulate(make(**ALG), tiny_model(), LOSS, problem(), 6, **BASE)
    return path, full


def test_same_settings_resume_bit_identically_and_may_extend_rounds(saved):
    path, full = saved
    snap = ckpt.load(path)
    assert snap["round"] == 2 and snap["setup"]["batch_size"] == 7
    resumed = simulate(make(**ALG), tiny_model(), LOSS, problem(), 6, **BASE, resume=snap)
    assert torch.equal(resumed.params, full.params)  # the uninterrupted run is the ground truth
    # a checkpoint holds the state, not the history: the resumed History holds the rounds it ran
    assert resumed.series("round") == [3, 4, 5, 6]
    assert resumed.series("f+h") == full.series("f+h")[2:]


def _other_data():
    clients = problem()
    X, y = clients[1]
    clients[1] = (X + 1e-3, y)  # same shapes and counts, other values
    return clients


CHANGES = {
    "regularizer": ({"regularizer": fk.L1(0.02)}, "regularizer: snapshot L1(kappa=0.01), given L1(kappa=0.02)"),
    # the same 6-digit repr, another penalty: compared at full precision
    "regularizer precision": ({"regularizer": fk.L1(0.01 * (1 + 1e-9))}, f"given L1(kappa={0.01 * (1 + 1e-9)!r})"),
    "regularizer mapping": ({"regularizer": {"*.weight": fk.L1(0.01)}}, "given PerParameter("),
    "batch_size": ({"batch_size": 8}, "batch_size: snapshot 7, given 8"),
    "full batch": ({"batch_size": None}, "batch_size: snapshot 7, given None"),
    "seed": ({"seed": 4}, "seed: snapshot 3, given 4"),
    "clients_per_round": ({"clients_per_round": 3},
                          "participation/clients_per_round: snapshot 2 client(s) per round, given 3 client(s)"),
    "participation": ({"clients_per_round": None, "participation": 1.0},
                      "participation/clients_per_round: snapshot 2 client(s) per round, given all clients"),
    "metrics_every": ({"metrics_every": 2}, "metrics_every: snapshot 1, given 2"),
    "metric_step": ({"metric_step": 0.5}, "metric_step: snapshot 0.1, given 0.5"),
    "loss_fn": ({"loss_fn": nn.CrossEntropyLoss(label_smoothing=0.1)},
                "loss_fn: snapshot torch.nn.functional.cross_entropy, given torch.nn.modules.loss.CrossEntropyLoss("),
    "data values": ({"clients": _other_data()}, "clients: snapshot 4 client(s) with [24, 24, 24, 24] samples"),
    "data counts": ({"clients": [(X[:-1], y[:-1]) if i == 0 else (X, y) for i, (X, y) in enumerate(problem())]},
                    "given 4 client(s) with [23, 24, 24, 24] samples"),
    "model dtype": ({"model": "float32"}, "model (dtype): snapshot float64, given float32"),
    "model shape": ({"model": "wider"}, "model (trainable parameters): snapshot d = "),
}


def _run_args(change: dict) -> tuple:
    kw = {**BASE, "loss_fn": LOSS, "clients": problem()}
    model = tiny_model()
    for k, v in change.items():
        if k == "model":
            torch.manual_seed(1)
            model = tiny_model().float() if v == "float32" else nn.Sequential(
                nn.Linear(5, 9), nn.BatchNorm1d(9), nn.Tanh(), nn.Linear(9, 3)).double()
        else:
            kw[k] = v
    return model, kw


@pytest.mark.parametrize("what", list(CHANGES))
def test_resume_under_other_settings_is_refused_naming_the_key(saved, what):
    snap = ckpt.load(saved[0])
    change, expected = CHANGES[what]
    model, kw = _run_args(change)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ptrs = [p.data_ptr() for p in model.parameters()]
    rng = torch.get_rng_state()
    kw_loss, kw_clients = kw.pop("loss_fn"), kw.pop("clients")
    with pytest.raises(ValueError, match="cannot resume") as e:
        simulate(make(**ALG), model, kw_loss, kw_clients, 6, **kw, resume=snap)
    assert expected in str(e.value)
    assert "nothing was changed" in str(e.value)
    # refused before anything changed: torch's generator, the model's parameters and buffers
    assert torch.equal(torch.get_rng_state(), rng)
    assert [p.data_ptr() for p in model.parameters()] == ptrs  # not even rebound to a flat buffer
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_every_difference_is_named_at_once(saved):
    snap = ckpt.load(saved[0])
    with pytest.raises(ValueError) as e:
        simulate(make(**ALG), tiny_model(), LOSS, _other_data(), 6, **{**BASE, "seed": 5, "batch_size": 2}, resume=snap)
    msg = str(e.value)
    assert "clients: snapshot" in msg and "batch_size: snapshot 7, given 2" in msg
    assert "seed: snapshot 3, given 5" in msg


def test_other_algorithm_and_rounds_below_the_snapshot(saved):
    snap = ckpt.load(saved[0])
    with pytest.raises(ValueError, match=r"algorithm: snapshot FedMiD .*given FedMiD .*lr_client.: 0\.07"):
        simulate(make("fedmid", lr=0.07, local_steps=2), tiny_model(), LOSS, problem(), 6, **BASE, resume=snap)
    with pytest.raises(ValueError, match=r"rounds must be >= the snapshot's round 2 .* got 1"):
        simulate(make(**ALG), tiny_model(), LOSS, problem(), 1, **BASE, resume=snap)
    with pytest.raises(TypeError, match="resume must be a snapshot dict"):
        simulate(make(**ALG), tiny_model(), LOSS, problem(), 6, **BASE, resume=[snap])


def test_old_snapshot_without_setup_is_refused(saved):
    """A snapshot that does not record its settings (an older version's) is refused: nothing shows it
    belongs to the run (it used to resume with a warning); a command-line checkpoint (its config
    compared by the command line) resumes quietly."""
    path, full = saved
    snap = ckpt.load(path)
    old = {k: v for k, v in snap.items() if k != "setup"}
    with pytest.raises(ValueError, match="does not record its run's settings"):
        simulate(make(**ALG), tiny_model(), LOSS, problem(), 6, **BASE, resume=old)
    cli = {**old, "extra": {"config": {"algorithm": "fedmid"}}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        simulate(make(**ALG), tiny_model(), LOSS, problem(), 3, **BASE, resume=cli)


def test_another_executor_resumes_with_a_warning():
    """The executor changes the summation order, not the algorithm (the command line may resume
    under another one too): a warning, and the same run up to rounding."""
    snaps = []
    full = simulate(make(**ALG), tiny_model(bn=False), LOSS, problem(), 4, **BASE, executor="sequential",
                    callbacks=[Checkpoint(lambda s: snaps.append(copy.deepcopy(s)), 2)])  # live references
    snap = snaps[1]
    assert snap["round"] == 2 and snap["executor"] == "sequential"
    with pytest.warns(UserWarning, match="not bit-identical"):
        resumed = simulate(make(**ALG), tiny_model(bn=False), LOSS, problem(), 4, **BASE, resume=snap,
                           executor="batched")
    assert torch.allclose(resumed.params, full.params, rtol=1e-10, atol=1e-12)


class _Counting(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n, self.reads = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return torch.zeros(5, dtype=torch.float64), 0


def test_fingerprint_counts_lazy_clients_without_reading_them(monkeypatch):
    ds = _Counting(10)
    loader = torch.utils.data.DataLoader(_Counting(7), batch_size=3)
    X, y = torch.randn(6, 5, dtype=torch.float64), torch.arange(6)
    fp = sc.fingerprint_clients([ds, loader, (X, y), torch.utils.data.TensorDataset(X, y)])
    assert fp["samples"] == [10, 7, 6, 6] and ds.reads == 0 and loader.dataset.reads == 0
    # the tensor clients' content is in the hash (a TensorDataset is hashed like the pair it holds) ...
    Y = X.clone()
    Y[3, 2] += 1e-12
    assert sc.fingerprint_clients([(Y, y)])["content"] != sc.fingerprint_clients([(X, y)])["content"]
    assert sc.fingerprint_clients([torch.utils.data.TensorDataset(X, y)]) == sc.fingerprint_clients([(X, y)])
    # ... and does not depend on the memory layout or on how many rows are hashed at a time
    Xt = X.t().contiguous().t()
    assert not Xt.is_contiguous()
    whole = sc.fingerprint_clients([(X, y)])
    monkeypatch.setattr(sc, "_CHUNK_BYTES", 16)
    assert sc.fingerprint_clients([(Xt, y)]) == whole


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fingerprint_of_gpu_data_equals_the_host_copy(monkeypatch):
    X, y = torch.randn(40, 5, dtype=torch.float64), torch.arange(40)
    host = sc.fingerprint_clients([(X, y)])
    monkeypatch.setattr(sc, "_CHUNK_BYTES", 100)  # several pieces copied to the host
    assert sc.fingerprint_clients([(X.cuda(), y.cuda())]) == host


# --------------------------------------------------------------------------- #
# A bare GroupLasso
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_bare_group_lasso_is_refused_before_any_round(name):
    model = tiny_model(bn=False)
    before = [p.detach().clone() for p in model.parameters()]
    seen = []
    with pytest.raises(ValueError) as e:
        simulate(make(name, lr=0.05, local_steps=2), model, LOSS, problem(), 2, regularizer=fk.GroupLasso(0.01),
                 callbacks=[lambda t, s, m: seen.append(t)], metrics_every=0)
    msg = str(e.value)
    assert msg.startswith("regularizer: GroupLasso(lam=0.01, groups='rows') needs a matrix")
    assert "regularizer={'0.weight': fk.GroupLasso(0.01, groups='rows')}" in msg  # the model's first matrix
    assert "'2.weight' (3, 8)" in msg
    assert seen == [] and all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_scaled_group_lasso_and_a_model_without_matrices():
    with pytest.raises(ValueError, match=r"regularizer=\{'0.weight': fk.GroupLasso\(0.04, groups='cols'\)\}"):
        simulate(make(**ALG), tiny_model(bn=False), LOSS, problem(), 1, regularizer=2.0 * fk.GroupLasso(0.02, "cols"))

    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(5, dtype=torch.float64))

        def forward(self, X):
            return (X * self.w)[:, :3]

    with pytest.raises(ValueError, match="no trainable parameter with 2 or more dimensions"):
        simulate(make(**ALG), Scale(), LOSS, problem(), 1, regularizer=fk.GroupLasso(0.01))


def test_per_parameter_group_lasso_still_runs():
    hist = simulate(make(**ALG), tiny_model(bn=False), LOSS, problem(), 2,
                    regularizer={"0.weight": fk.GroupLasso(0.5, groups="cols")})
    assert len(hist.metrics) == 2


# --------------------------------------------------------------------------- #
# The command line's resume check: one function, naming the flag (issue 26, item 3)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("edit, words", [
    ({"data_seed": 11}, "data_seed (--data-seed): snapshot None, given 11"),
    ({"clients_per_round": 3}, "clients_per_round (--clients-per-round / --participation): snapshot 2 client(s) per "
                               "round, given 3 client(s) per round"),
    ({"reg_strength": 0.0100000001}, "reg_strength (--reg-strength): snapshot 0.01, given 0.0100000001"),
])
def test_an_edited_config_is_refused_naming_the_setting_its_flag_and_both_values(tmp_path, capsys, edit, words):
    """The one-process resume refuses config.json edited after the run with the same check (and the
    same words) as ``run --resume DIR --flower`` (tests/test_flower_signals.py); h at full precision."""
    from python_algos.experiments.cli import main

    out = tmp_path / "r"
    assert main(["run", "-a", "fedmid", "--dataset", "sparse_logistic", "--data-opt", "n=60", "--data-opt", "dim=12",
                 "-N", "3", "--clients-per-round", "2", "-T", "2", "--reg-strength", "0.01", "--checkpoint-every", "1",
                 "--no-progress", "--no-plot", "--out", str(out)]) == 0
    (out / "summary.json").unlink()  # as a run stopped after its checkpoint
    good = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**good, **edit}))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--no-progress", "--no-plot"]) == 1
    err = capsys.readouterr().err
    assert words in err and "nothing was changed" in err, err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == before


def test_a_command_line_checkpoint_records_the_run_setup(tmp_path):
    """`run` checkpoints through the engine's Checkpoint callback: its snapshots must carry the setup
    record (data content hash, h at full precision, ...), or a resume could not check them."""
    from python_algos.experiments.cli import main

    out = tmp_path / "run"
    assert main(["run", "--data-opt", "n=120", "--data-opt", "dim=6", "--data-opt", "nnz=2", "-N", "3", "-K", "2",
                 "-T", "2", "--reg", "l1", "--reg-strength", "0.0123456789", "--out", str(out), "--no-progress",
                 "--no-plot"]) == 0
    setup = ckpt.load(str(out / "checkpoint.pt"))["setup"]
    assert isinstance(setup, dict) and setup["clients"]["content"]
    assert "0.0123456789" in setup["regularizer"]
