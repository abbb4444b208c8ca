"""Independent seeds (`run` / `compare` with --seeds K or --seed 1,2,3): one folder per seed, the data
fixed unless --reseed-data, per-round statistics, mean ± std tables, bands in the figures, resume.

Ground truth: single runs of the same seeds (run_experiment into separate folders), and the
statistics recomputed here with numpy from each seed's metrics.jsonl."""

import json
import os

import numpy as np
import pytest
import torch
from test_run_folders import TINY, folder_state, params_of, quiet, tiny

from python_algos.experiments.cli import main
from python_algos.experiments.run import run_experiment
from python_algos.runfolder.files import read_metrics

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _config(tmp_path, **kw):
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps({**TINY, "rounds": 4, "checkpoint_every": 2, **kw}))
    return str(p)


def _numpy_stats(runs_rows, t, key):
    vals = np.array([r[key] for rows in runs_rows for r in rows if r["round"] == t and r.get(key) is not None])
    return {"mean": vals.mean(), "std": vals.std(ddof=1), "min": vals.min(), "max": vals.max()}


def test_run_seeds_fixed_data_and_aggregate(tmp_path, capsys):
    out = str(tmp_path / "s")
    assert main(["run", "--config", _config(tmp_path), "--seeds", "3", "--seed", "4", "--out", out,
                 "--no-progress", "--no-plot"]) == 0
    printed = capsys.readouterr().out
    assert "±" in printed and "seeds 4, 5, 6" in printed
    dirs = [os.path.join(out, f"seed-{k}") for k in (4, 5, 6)]
    # the data stay those of the first seed; the runs are the single runs of each seed on them
    parts = {open(os.path.join(d, "partition.json")).read() for d in dirs}
    assert len(parts) == 1
    for k, d in zip((4, 5, 6), dirs):
        ref = str(tmp_path / f"ref{k}")
        run_experiment(tiny(rounds=4, seed=k, data_seed=4), ref, progress=False, log=quiet)
        assert torch.equal(params_of(d), params_of(ref))
    assert torch.equal(params_of(dirs[0]), params_of(_plain(tmp_path, seed=4)))  # seed 4 = a plain --seed 4 run
    assert not torch.equal(params_of(dirs[0]), params_of(dirs[1]))
    rows = [read_metrics(d) for d in dirs]
    agg = [json.loads(line) for line in open(os.path.join(out, "aggregate.jsonl"))]
    assert [a["round"] for a in agg] == list(range(5)) and all(a["n"] == 3 for a in agg)
    for a in agg:
        for key in ("f+h", "grad_map_sq", "test_acc", "sparsity"):
            want = _numpy_stats(rows, a["round"], key)
            for s in want:
                assert a[key][s] == pytest.approx(want[s], rel=1e-12, abs=1e-15), (a["round"], key, s)
    final = json.load(open(os.path.join(out, "aggregate.json")))["groups"]["fedcanon"]["final"]
    assert final["f+h"]["mean"] == pytest.approx(np.mean([r[-1]["f+h"] for r in rows]), rel=1e-12)
    assert "±" in open(os.path.join(out, "aggregate.md")).read()


def _plain(tmp_path, **kw):
    ref = str(tmp_path / "plain")
    run_experiment(tiny(rounds=4, **kw), ref, progress=False, log=quiet)
    return ref


def test_seed_list_with_reseeded_data(tmp_path):
    out = str(tmp_path / "s")
    assert main(["run", "--config", _config(tmp_path, partition="dirichlet", eta=0.5), "--seed", "1,2",
                 "--reseed-data", "--out", out, "--no-progress", "--no-plot"]) == 0
    a, b = (os.path.join(out, f"seed-{k}") for k in (1, 2))
    assert open(os.path.join(a, "partition.json")).read() != open(os.path.join(b, "partition.json")).read()
    assert torch.equal(params_of(b), params_of(_plain(tmp_path, seed=2, partition="dirichlet", eta=0.5)))


def test_resume_keeps_completed_seeds_and_finishes_the_others(tmp_path):
    out = str(tmp_path / "s")
    assert main(["run", "--config", _config(tmp_path), "--seeds", "2", "--out", out, "--no-progress",
                 "--no-plot"]) == 0
    ref = params_of(os.path.join(out, "seed-1"))
    for f in ("summary.json", "model.pt"):  # seed 1 as a kill after its last checkpoint leaves it
        os.remove(os.path.join(out, "seed-1", f))
    kept = folder_state(os.path.join(out, "seed-0"))
    assert main(["run", "--resume", out, "--no-progress", "--no-plot"]) == 0
    assert folder_state(os.path.join(out, "seed-0")) == kept
    assert torch.equal(params_of(os.path.join(out, "seed-1")), ref)
    assert main(["run", "--config", _config(tmp_path), "--seeds", "2", "--out", out, "--no-progress"]) == 1


def test_compare_seeds_table_and_bands(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from python_algos.experiments import plotting

    out = str(tmp_path / "c")
    assert main(["compare", "-a", "fedcanon", "fedavg", "--config", _config(tmp_path), "--seeds", "2",
                 "--out", out, "--no-progress", "--formats", "png"]) == 0
    table = capsys.readouterr().out
    assert table.count("±") >= 4 and "fedavg" in table
    assert os.path.isfile(os.path.join(out, "overview.png"))
    runs = plotting.group_seeds([plotting.load_run(p) for p in plotting.find_runs([out])], "minmax")
    assert [r["label"] for r in runs] == ["FedCanon", "FedAvg"] and all(r["seeds"] == [0, 1] for r in runs)
    fig, ax = plt.subplots()
    assert plotting.line_plot(ax, runs, "f+h", "round")
    seeds_rows = [read_metrics(os.path.join(out, f"seed-{k}", "fedcanon")) for k in (0, 1)]
    mean = [np.mean([rows[t]["f+h"] for rows in seeds_rows]) for t in range(5)]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), mean, rtol=1e-12)
    bands = [c for c in ax.collections if c.__class__.__name__ in ("PolyCollection", "FillBetweenPolyCollection")]
    assert len(bands) == 2
    verts = bands[0].get_paths()[0].vertices[:, 1]
    lo = min(min(r[t]["f+h"] for r in seeds_rows) for t in range(5))
    hi = max(max(r[t]["f+h"] for r in seeds_rows) for t in range(5))
    assert verts.min() == pytest.approx(lo, rel=1e-12) and verts.max() == pytest.approx(hi, rel=1e-12)
    assert "2 seeds: mean, band min to max" in plotting.setup_line(runs)
    plt.close(fig)


@pytest.mark.parametrize("argv, code, words", [
    (["--seeds", "0"], 2, ["--seeds"]),
    (["--seed", "1,1"], 2, ["--seed", "repeated"]),
    (["--seed", "1,x"], 2, ["--seed"]),
    (["--seeds", "2", "--reseed-data", "--data-seed", "3"], 1, ["--reseed-data", "--data-seed"]),
    (["--seeds", "2", "--workers", "2"], 1, ["--workers", "seeds"]),
])
def test_bad_seed_flags_name_the_flag_and_write_nothing(tmp_path, capsys, argv, code, words):
    out = tmp_path / "s"
    with pytest.raises(SystemExit) if code == 2 else _nothing():
        rc = main(["run", "--config", _config(tmp_path), "--out", str(out), "--no-progress", *argv])
        assert rc == code
    err = capsys.readouterr().err
    for w in words:
        assert w in err, (w, err)
    assert not out.exists()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
