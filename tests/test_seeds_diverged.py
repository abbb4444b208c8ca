"""A diverged seed in a seeds experiment (issue 26, defects 7 and 11).

Defect 7: the table's numbers mixed a diverged seed in some columns only (its metrics on the NaN
model at the divergence round entered every column whose value was still finite). Now every number
covers the same seeds, the completed ones, and the table says how many and names the others.
Defect 11: `run --resume` / `compare --resume` re-ran a diverged run on every resume. A diverged
run is finished: resume keeps it, untouched, and says so.

Ground truth: the seed folders are real runs (`run --seeds`, one seed replaced by a run that
diverges, written by run_experiment); the expected statistics are recomputed here with numpy from
each seed's own metrics.jsonl."""

import json
import os

import numpy as np
import pytest
from test_run_folders import TINY, folder_state, quiet, tiny

from python_algos.experiments.aggregate import write_aggregate
from python_algos.experiments.cli import main
from python_algos.experiments.run import run_experiment
from python_algos.runfolder.records import read_metrics, read_summary

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# a least-squares problem with a known support: f+h, ‖G_s‖², sparsity and support F1 in every row
LINEAR = dict(algorithm="fedavg", dataset="sparse_linear", rounds=4, checkpoint_every=1)
BLOWUP = dict(lr=1e80)  # a step far past 2/L: f+h overflows at round 1, sparsity and support F1 stay finite
DIVERGED_SEED = 1


def _seeds_folder(tmp_path, seeds=3):
    """`run --seeds` of LINEAR, then seed DIVERGED_SEED replaced by a run of the same seed that diverges."""
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**TINY, **LINEAR}))
    out = str(tmp_path / "s")
    assert main(["run", "--config", str(cfg), "--seeds", str(seeds), "--out", out, "--no-progress",
                 "--no-plot"]) == 0
    bad = os.path.join(out, f"seed-{DIVERGED_SEED}")
    s = run_experiment(tiny(**LINEAR, **BLOWUP, seed=DIVERGED_SEED, data_seed=0), bad, replace=True,
                       progress=False, log=quiet)
    assert s["status"] == "diverged", s
    last = read_metrics(bad)[-1]
    assert last["f+h"] is None and last["sparsity"] is not None  # the mixed-columns situation of defect 7
    return out


def _expected(out, seeds, key):
    """mean and std of ``key`` at the last round over the seeds that completed (numpy, from the files)."""
    vals = [read_metrics(os.path.join(out, f"seed-{k}"))[-1][key] for k in seeds if k != DIVERGED_SEED]
    return np.mean(vals), np.std(vals, ddof=1)


def test_a_diverged_seed_is_left_out_of_every_column_and_named(tmp_path):
    out = _seeds_folder(tmp_path)
    dirs = [os.path.join(out, f"seed-{k}") for k in range(3)]
    table = write_aggregate(out, [{"label": "fedavg", "seeds": [0, 1, 2], "summaries": [read_summary(d) for d in dirs],
                                   "rows": [read_metrics(d) for d in dirs]}])
    final = json.load(open(os.path.join(out, "aggregate.json")))["groups"]["fedavg"]["final"]
    for key in ("f+h", "grad_map_sq", "sparsity", "support_f1"):
        mean, std = _expected(out, range(3), key)
        assert final[key]["n"] == 2, (key, final[key])
        assert final[key]["mean"] == pytest.approx(mean, rel=1e-12, abs=1e-15), key
        assert final[key]["std"] == pytest.approx(std, rel=1e-12, abs=1e-15), key
    assert "2 of 3" in table
    assert f"seed {DIVERGED_SEED} diverged" in table and "left out" in table
    # the per-round statistics cover the same seeds: n = 2 at every round, every metric
    for a in (json.loads(line) for line in open(os.path.join(out, "aggregate.jsonl"))):
        assert a["n"] == 2 and all(v.get("n", 2) == 2 for k, v in a.items() if isinstance(v, dict)), a


def test_resume_keeps_a_diverged_seed_untouched_and_says_why(tmp_path, capsys):
    out = _seeds_folder(tmp_path)
    bad = os.path.join(out, f"seed-{DIVERGED_SEED}")
    before = folder_state(bad, mtime=True)
    capsys.readouterr()
    assert main(["run", "--resume", out, "--no-progress", "--no-plot"]) == 3  # a seed diverged: exit status 3
    printed = capsys.readouterr().out
    assert folder_state(bad, mtime=True) == before  # not run again, not even rewritten
    assert f"seed-{DIVERGED_SEED}: diverged" in printed and "kept" in printed, printed
    assert "2 of 3" in open(os.path.join(out, "aggregate.md")).read()


def test_compare_resume_keeps_a_diverged_run_untouched(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**TINY, **LINEAR}))
    out = str(tmp_path / "c")
    assert main(["compare", "-a", "fedcanon", "fedavg", "--config", str(cfg), "--out", out, "--no-progress",
                 "--no-plot"]) == 0
    bad = os.path.join(out, "fedavg")
    s = run_experiment(tiny(**LINEAR, **BLOWUP, metric_step=0.1 * 2), bad, replace=True, progress=False, log=quiet)
    assert s["status"] == "diverged", s
    before = folder_state(bad, mtime=True)
    capsys.readouterr()
    assert main(["compare", "--resume", out, "--no-progress", "--no-plot"]) == 3
    printed = capsys.readouterr().out
    assert folder_state(bad, mtime=True) == before
    assert "fedavg: diverged" in printed and "kept" in printed, printed


def test_the_figures_mean_and_band_cover_the_seeds_the_table_counts(tmp_path):
    from python_algos.experiments import plotting

    out = _seeds_folder(tmp_path)
    (run,) = plotting.group_seeds([plotting.load_run(p) for p in plotting.find_runs([out])], "minmax")
    assert run["seeds"] == [0, 2]
    rows = [read_metrics(os.path.join(out, f"seed-{k}")) for k in (0, 2)]
    want = [np.mean([r[t]["f+h"] for r in rows]) for t in range(len(rows[0]))]
    np.testing.assert_allclose([r["f+h"] for r in run["rows"]], want, rtol=1e-12)
