"""The readers of a run folder's records (runfolder.records: one owner per file format): what they give
back for the files as written, for damaged files (an error naming the file and line, or None where a
missing summary is normal), and a folder of runs listed in its own order (a comparison's -a order,
the seeds as given), which `plot` follows. Ground truth: the files written here by hand."""

import json
import os

import pytest

from python_algos.experiments.plotting.runs import find_runs
from python_algos.runfolder.files import RunFolderError, parse_json
from python_algos.runfolder.records import group_runs, read_config, read_summary


def test_read_config_gives_the_settings_and_names_the_damaged_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"algorithm": "fedcanon", "lr": 0.1}, indent=2))
    assert read_config(str(tmp_path)) == {"algorithm": "fedcanon", "lr": 0.1}
    (tmp_path / "config.json").write_text('{\n  "lr": 0.1,\n  "rounds": \n}\n')
    with pytest.raises(RunFolderError, match=r"config\.json, line 4: Expecting value"):
        read_config(str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2]\n")
    with pytest.raises(RunFolderError, match=r"config\.json: expected a JSON object"):
        read_config(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        read_config(str(tmp_path / "missing"))


def test_read_summary_is_none_for_a_missing_or_damaged_summary(tmp_path):
    assert read_summary(str(tmp_path)) is None
    (tmp_path / "summary.json").write_text('{"status": "compl')  # a kill while writing it
    assert read_summary(str(tmp_path)) is None
    (tmp_path / "summary.json").write_text('"completed"')
    assert read_summary(str(tmp_path)) is None
    (tmp_path / "summary.json").write_text('{"status": "completed", "rounds": 3}')
    assert read_summary(str(tmp_path)) == {"status": "completed", "rounds": 3}


def test_parse_json_names_the_file_and_line():
    assert parse_json('{"a": [1, 2]}', "x.json") == {"a": [1, 2]}
    with pytest.raises(ValueError, match=r"^x\.json, line 2: Expecting"):
        parse_json('{"a": 1,\n}', "x.json")


def _run(folder, rounds=2):
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps({"round": t, "f+h": 1.0 / (t + 1)}) + "\n" for t in range(rounds + 1))


def test_group_runs_lists_a_comparison_and_seeds_in_their_own_order(tmp_path):
    cmp = tmp_path / "cmp"
    for name in ("fedavg", "za1"):
        _run(str(cmp / name))
    (cmp / "comparison.json").write_text(json.dumps({"algorithms": ["za1", "fedavg"], "runs": []}))
    assert group_runs(str(cmp)) == ["za1", "fedavg"]
    assert find_runs([str(cmp)]) == [str(cmp / "za1"), str(cmp / "fedavg")]

    seeds = tmp_path / "seeds"  # seed-10 before seed-2 in the folder listing, not in the experiment
    for k in (2, 10):
        _run(str(seeds / f"seed-{k}"))
    (seeds / "seeds.json").write_text(json.dumps({"kind": "run", "seeds": [2, 10]}))
    assert group_runs(str(seeds)) == ["seed-2", "seed-10"]
    assert find_runs([str(seeds)]) == [str(seeds / "seed-2"), str(seeds / "seed-10")]

    (seeds / "seeds.json").write_text('{"seeds": [2,')  # damaged: the folder listing alone
    assert group_runs(str(seeds)) is None
    assert sorted(find_runs([str(seeds)])) == sorted([str(seeds / "seed-2"), str(seeds / "seed-10")])
    assert group_runs(str(tmp_path / "cmp" / "za1")) is None  # a run, not a group
