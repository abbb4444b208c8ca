"""Folders of runs (seeds, a sweep, a random search, a comparison) start, refuse and are replaced as
one run folder is (issue 26, item 1): a folder holding a finished group is refused and left as it was
unless ``replace=True``; a replacement leaves nothing of the old group (no run of a seed, point or
algorithm left out now) and refuses a folder holding the user's files; two commands given the same
folder at once never share it (one starts, the other is refused before it writes anything).

Ground truth: the folder listing, the bytes of every file before and after a refused call, and the
settings each run recorded in its own config.json."""

import json
import os
import threading

import pytest
from test_replace_default import tiny
from test_run_folders import folder_state, quiet

from python_algos.experiments.seeds import compare_seeds, run_seeds
from python_algos.experiments.sweep import run_sweep
from python_algos.runfolder.files import RunExistsError, RunFolderError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

def listing(path) -> set:
    return {os.path.relpath(os.path.join(r, f), path) for r, ds, fs in os.walk(path) for f in fs + ds}


def read_config(run_dir) -> dict:
    with open(os.path.join(run_dir, "config.json")) as f:
        return json.load(f)


def seeds_of_runs(out) -> dict:
    """seed-<k> folder -> the seed its run recorded in its own config.json."""
    return {d: read_config(os.path.join(out, d))["seed"] for d in sorted(os.listdir(out)) if d.startswith("seed-")}


def test_a_folder_holding_finished_seeds_is_refused_untouched_without_replace(tmp_path):
    out = str(tmp_path / "seeds")
    run_seeds(tiny(), [0, 1], out, progress=False, log=quiet)
    before = folder_state(out, mtime=True)
    with pytest.raises(RunExistsError, match=r"already holds files.*replace=True") as e:
        run_seeds(tiny(lr=0.05), [0, 1], out, progress=False, log=quiet)
    assert out in str(e.value) and isinstance(e.value, FileExistsError)
    with pytest.raises(RunExistsError, match=r"already holds files.*replace=True"):
        compare_seeds(tiny(), ["fedcanon"], [0], out, progress=False, log=quiet)
    assert folder_state(out, mtime=True) == before


def test_replacing_seeds_leaves_nothing_of_the_old_group(tmp_path):
    out = str(tmp_path / "seeds")
    run_seeds(tiny(), [0, 1, 2], out, progress=False, log=quiet)
    (tmp_path / "seeds" / "overview.png").write_text("old figure")
    result = run_seeds(tiny(), [5], out, progress=False, log=quiet, replace=True)
    assert [s["status"] for s in result["summaries"]] == ["completed"]
    assert sorted(os.listdir(out)) == ["aggregate.json", "aggregate.jsonl", "aggregate.md", "seed-5", "seeds.json"]
    assert seeds_of_runs(out) == {"seed-5": 5}


def test_replacing_compare_seeds_leaves_no_algorithm_or_seed_of_the_old_one(tmp_path):
    out = str(tmp_path / "cs")
    compare_seeds(tiny(), ["fedcanon", "fedavg"], [0, 1], out, progress=False, log=quiet)
    compare_seeds(tiny(), ["fedcanon"], [3], out, progress=False, log=quiet, replace=True)
    assert {p for p in listing(out) if p.count(os.sep) <= 1} == {
        "aggregate.json", "aggregate.jsonl", "aggregate.md", "seeds.json", "seed-3",
        os.path.join("seed-3", "comparison.json"), os.path.join("seed-3", "comparison.md"),
        os.path.join("seed-3", "fedcanon")}
    assert read_config(os.path.join(out, "seed-3", "fedcanon"))["seed"] == 3


def test_replacing_seeds_refuses_a_folder_holding_the_users_files(tmp_path):
    out = tmp_path / "seeds"
    run_seeds(tiny(), [0, 1], str(out), progress=False, log=quiet)
    (out / "notes.txt").write_text("mine")
    (out / "seed-1" / "plot.py").write_text("mine")
    before = folder_state(str(out), mtime=True)
    with pytest.raises(RunFolderError, match=r"notes.txt, seed-1/.*not its runs"):
        run_seeds(tiny(), [7], str(out), progress=False, log=quiet, replace=True)
    assert folder_state(str(out), mtime=True) == before


def test_replace_must_be_a_bool_for_groups(tmp_path):
    out = str(tmp_path / "seeds")
    run_seeds(tiny(), [0], out, progress=False, log=quiet)
    before = folder_state(out, mtime=True)
    with pytest.raises(TypeError, match="replace must be True or False"):
        run_seeds(tiny(), [1], out, progress=False, log=quiet, replace="yes")
    assert folder_state(out, mtime=True) == before


def _at_once(calls, monkeypatch):
    """Run ``calls`` in threads held together after their folder checks (at their first run check,
    prepare_run), so each has checked the folder before any writes: the interleaving in which two
    commands given one folder both find it free is certain, not a matter of timing. Returns each
    call's result or exception."""
    from python_algos.experiments import prepare

    real, gate = prepare.prepare_run, threading.Barrier(len(calls), timeout=120)
    waited = set()

    def held(*a, **k):
        me = threading.get_ident()
        if me not in waited:
            waited.add(me)
            gate.wait()
        return real(*a, **k)

    monkeypatch.setattr(prepare, "prepare_run", held)
    got = [None] * len(calls)

    def call(i):
        try:
            got[i] = calls[i]()
        except Exception as e:  # noqa: BLE001 - the test inspects it
            got[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_two_seeds_commands_into_one_folder_at_once_do_not_share_it(tmp_path, monkeypatch):
    out = str(tmp_path / "named")  # `run --seeds 2 --name named`, started twice at once
    got = _at_once([lambda: run_seeds(tiny(), [0, 1], out, progress=False, log=quiet),
                    lambda: run_seeds(tiny(), [4, 5], out, progress=False, log=quiet)], monkeypatch)
    refused = [g for g in got if isinstance(g, Exception)]
    done = [g for g in got if not isinstance(g, Exception)]
    assert len(done) == 1 and len(refused) == 1, got
    assert isinstance(refused[0], RunExistsError) and "another command" in str(refused[0])
    seeds = done[0]["seeds"]
    assert [s["status"] for s in done[0]["summaries"]] == ["completed", "completed"]
    assert seeds_of_runs(out) == {f"seed-{s}": s for s in seeds}  # only the started command's runs


def _sweep(out, grid, **kw):
    return run_sweep(tiny(), ["fedcanon"], grid, [0], out_dir=out, jobs=1, progress=False, log=quiet, **kw)


def test_a_sweep_is_refused_untouched_without_replace_and_replaced_whole_with_it(tmp_path):
    out = str(tmp_path / "sweep")
    _sweep(out, {"alpha": [0.05, 0.3]})
    (tmp_path / "sweep" / "heatmap-fedcanon.png").write_text("old figure")
    before = folder_state(out, mtime=True)
    with pytest.raises(RunExistsError, match=r"already holds files.*sweep --resume.*replace=True"):
        _sweep(out, {"alpha": [0.1]})
    assert folder_state(out, mtime=True) == before
    result = _sweep(out, {"alpha": [0.1]}, replace=True)
    assert [p["statuses"] for p in result["points"]] == [["completed"]]
    assert sorted(os.listdir(out)) == ["fedcanon", "summary.json", "summary.md", "sweep.json"]
    assert os.listdir(os.path.join(out, "fedcanon")) == ["alpha=0.1"]


def test_two_sweeps_into_one_folder_at_once_do_not_share_it(tmp_path, monkeypatch):
    out = str(tmp_path / "named")
    got = _at_once([lambda: _sweep(out, {"alpha": [0.05]}), lambda: _sweep(out, {"alpha": [0.3]})], monkeypatch)
    refused = [g for g in got if isinstance(g, Exception)]
    done = [g for g in got if not isinstance(g, Exception)]
    assert len(done) == 1 and len(refused) == 1, got
    assert isinstance(refused[0], RunExistsError) and "another command" in str(refused[0])
    assert os.listdir(os.path.join(out, "fedcanon")) == [done[0]["points"][0]["name"]]


@pytest.mark.slow  # ~10 s: optuna's study storage
def test_a_random_search_is_refused_without_replace_and_replaced_whole_with_it(tmp_path):
    pytest.importorskip("optuna", reason="pip install optuna")
    from python_algos.experiments.optuna_search import parse_space, run_study

    out = str(tmp_path / "study")

    def study(space, **kw):
        return run_study(tiny(), ["fedcanon"], parse_space(space), 1, [0], out_dir=out, log=quiet, **kw)

    study({"alpha": "float:0.05:0.3"})
    assert "optuna.db" in os.listdir(out)
    before = folder_state(out, mtime=True)
    with pytest.raises(RunExistsError, match=r"already holds files.*sweep --resume.*replace=True"):
        study({"beta": "log:0.01:0.1"})
    assert folder_state(out, mtime=True) == before
    result = study({"beta": "log:0.01:0.1"}, replace=True)
    assert [list(t["point"]) for t in result["trials"]] == [["beta"]]  # the old study's trials are gone
    points = os.listdir(os.path.join(out, "fedcanon"))
    assert len(points) == 1 and points[0].startswith("beta="), points
