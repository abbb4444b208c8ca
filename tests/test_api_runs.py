"""History.save / History.load: a simulate() result as a command-line run folder (round trip, refusal
to overwrite, no half-written folder, `run --resume` refuses it, `plot` draws it), and
simulate's progress display (the ShowProgress callback; no progress= keyword beside callbacks=).

Ground truth: the History that simulate returned (save -> load must give it back), and the files
the command line itself writes (the same names, readable by the same readers)."""

import json
import math
import os

import pytest
import torch
from test_run_folders import folder_state, quiet, tiny

import fedkernels as fk
from python_algos import FedCanon, FedMiD, History, simulate
from python_algos.experiments.cli import main
from python_algos.experiments.run import run_experiment
from python_algos.runfolder.callbacks import Checkpoint, ShowProgress
from python_algos.runfolder.files import read_metrics


def _problem(dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    model = torch.nn.Linear(5, 3).to(dtype)
    clients = [(torch.randn(12, 5, generator=g, dtype=dtype), torch.randint(3, (12,), generator=g)) for _ in range(3)]
    return model, clients


def _run(rounds=4, **kw):
    model, clients = _problem()
    nan_metric = lambda params: {"probe": float("nan") if params.abs().sum() > 0 else 0.0}  # noqa: E731
    return simulate(FedCanon(alpha=0.2, beta=0.05, local_steps=2), model, torch.nn.functional.cross_entropy,
                    clients, rounds, regularizer=fk.L1(1e-2), eval_fn=nan_metric, **kw), model


def _same(a, b) -> bool:
    """Equal values, NaN equal to NaN (metrics.jsonl stores non-finite numbers as null)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def test_save_load_round_trip(tmp_path):
    hist, model = _run()
    out = tmp_path / "api"
    assert hist.save(str(out), model=model, label="FedCanon (API)", f_star=0.25) == str(out)
    assert sorted(os.listdir(out)) == ["config.json", "metrics.jsonl", "model.pt", "summary.json"]
    back = History.load(str(out))
    assert torch.equal(back.params, hist.params) and back.params.dtype == torch.float64
    assert len(back.metrics) == len(hist.metrics) == 4
    for got, want in zip([back.initial, *back.metrics], [hist.initial, *hist.metrics]):
        assert set(got) == set(want)
        assert all(_same(got[k], want[k]) for k in want), (got, want)
    assert math.isnan(back.metrics[-1]["probe"])
    assert back.algorithm == "FedCanon" and back.hparams == hist.hparams and back.executor == hist.executor
    assert back.setup == hist.setup and back.setup["regularizer"] == "L1(kappa=0.01)"
    assert back.setup["rounds"] == 4 and back.setup["num_clients"] == 3 and back.setup["batch_size"] is None
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["api_run"] is True and cfg["algorithm"] == "FedCanon" and cfg["seed"] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["label"] == "FedCanon (API)" and summary["f_star"] == 0.25 and summary["status"] == "completed"
    saved = torch.load(out / "model.pt", weights_only=True)
    assert torch.equal(saved["state_dict"]["weight"], model.weight.detach())
    # the command line's own reader sees the same rows
    assert [r["round"] for r in read_metrics(str(out))] == [0, 1, 2, 3, 4]


def test_save_refuses_to_overwrite_and_leaves_the_folder_as_it_was(tmp_path):
    hist, _ = _run(rounds=2)
    out = tmp_path / "api"
    hist.save(str(out))
    before = folder_state(out)
    other, _ = _run(rounds=3)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        other.save(str(out))
    assert folder_state(out) == before
    other.save(str(out), overwrite=True)
    assert len(History.load(str(out)).metrics) == 3
    assert sorted(os.listdir(tmp_path)) == ["api"]  # no temporary folder left beside it
    # a folder of other files is never replaced, not even with overwrite=True
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a run folder"):
        hist.save(str(tmp_path / "notes"), overwrite=True)
    assert (tmp_path / "notes" / "a.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="f_star"):
        hist.save(str(tmp_path / "new"), f_star=float("inf"))
    assert not (tmp_path / "new").exists()


def test_failed_save_leaves_no_folder(tmp_path, monkeypatch):
    hist, _ = _run(rounds=2)
    from python_algos.runfolder import history as api_runs

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(api_runs, "write_metrics", boom)
    with pytest.raises(OSError, match="disk full"):
        hist.save(str(tmp_path / "api"))
    assert os.listdir(tmp_path) == []


def test_run_resume_refuses_an_api_run(tmp_path, capsys):
    hist, _ = _run(rounds=2)
    out = tmp_path / "api"
    hist.save(str(out))
    before = folder_state(out)
    assert main(["run", "--resume", str(out)]) == 1
    err = capsys.readouterr().err
    assert "History.save" in err and "plot" in err and err.count("\n") == 1, err
    assert folder_state(out) == before


@pytest.mark.slow
def test_plot_draws_an_api_run_next_to_a_cli_run(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    hist, _ = _run(rounds=3)
    hist.save(str(tmp_path / "api"))
    run_experiment(tiny(rounds=2), str(tmp_path / "cli"), progress=False, log=quiet)
    assert main(["plot", str(tmp_path / "api"), str(tmp_path / "cli"), "--out", str(tmp_path / "figs"),
                 "--formats", "png"]) == 0
    files = capsys.readouterr().out.split()
    assert os.path.join(str(tmp_path / "figs"), "overview.png") in files
    assert (tmp_path / "figs" / "f_plus_h_vs_round.png").read_bytes()[:4] == b"\x89PNG"


def test_load_reads_a_cli_run_folder(tmp_path):
    out = str(tmp_path / "cli")
    summary = run_experiment(tiny(rounds=2), out, progress=False, log=quiet)
    back = History.load(out)
    assert back.algorithm == summary["algorithm"] and back.hparams == summary["hparams"]
    assert back.metrics[-1]["f+h"] == summary["final"]["f+h"] and back.setup["dataset"] == "sparse_logistic"
    assert torch.equal(back.params, torch.load(os.path.join(out, "model.pt"), weights_only=True)["params"])


def test_progress_prints_only_when_asked(capsys):
    _run(rounds=3, callbacks=[ShowProgress("FedCanon")])
    err = capsys.readouterr().err
    assert "FedCanon round 3/3" in err and "f+h=" in err
    _run(rounds=3)
    assert capsys.readouterr().err == ""
    for door in ("progress", "checkpoint", "checkpoint_every"):  # one way in: callbacks=
        with pytest.raises(TypeError, match=door):
            _run(rounds=1, **{door: True})


def test_progress_counts_from_the_resumed_round(capsys):
    model, clients = _problem()
    snaps = []
    alg = FedMiD(lr_client=0.1, local_steps=2)
    simulate(alg, model, torch.nn.functional.cross_entropy, clients, 2, regularizer=fk.L1(1e-2),
             callbacks=[Checkpoint(lambda s: snaps.append({**s, "metrics": list(s["metrics"])}))])
    capsys.readouterr()
    simulate(alg, model, torch.nn.functional.cross_entropy, clients, 4, regularizer=fk.L1(1e-2),
             resume=snaps[-1], callbacks=[ShowProgress()])
    err = capsys.readouterr().err
    assert "round 4/4" in err and "round 1/4" not in err and "round 2/4" not in err


def test_load_of_a_comparison_or_seeds_folder_names_the_runs_inside(tmp_path):
    """A `compare` folder (and a `--seeds` folder) is not one run: History.load says what it is and
    which run folders inside it load, in the comparison's -a order; loading one of them works."""
    from python_algos.experiments.compare import compare_experiments

    cmp = str(tmp_path / "cmp")
    compare_experiments(tiny(rounds=1), ["fedmid", "fedcanon"], cmp, progress=False, log=quiet)
    with pytest.raises(FileNotFoundError) as e:
        History.load(cmp)
    assert str(e.value) == (f"History.load: {cmp} is a comparison of runs (`compare`), not one run: load one of "
                            f"{os.path.join(cmp, '<name>')} (fedmid, fedcanon)")
    assert History.load(os.path.join(cmp, "fedmid")).algorithm == "FedMiD"
    seeds = tmp_path / "seeds"  # what `run --seeds 2` leaves (seeds.json and seed-<k>/), built by hand
    for k in (0, 1):
        (seeds / f"seed-{k}").mkdir(parents=True)
    (seeds / "seeds.json").write_text(json.dumps({"kind": "run", "seeds": [0, 1]}))
    with pytest.raises(FileNotFoundError, match=r"several seeds \(`--seeds`\), not one run: load one of .*"
                                                r"<name> \(seed-0, seed-1\)"):
        History.load(str(seeds))
    with pytest.raises(FileNotFoundError, match=r"is not a run folder \(no config.json, metrics.jsonl\)"):
        History.load(str(seeds / "seed-0"))  # an empty run of the seeds: as before
