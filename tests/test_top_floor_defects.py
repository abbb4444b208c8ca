"""Issue 36's defects of the command line's top floor (7, 9, 10, 11, 12, 14), each as a user meets it:
the command, its exit status, its one-line error and what it leaves on disk.

Ground truth: the files in the folders (config.json, summary.json), the thread count torch reports
inside the run (read by a callback-free probe: the summary's ``threads``, compared with the number
the test chose), and the exit status of `main`."""

import json
import os

import pytest

from python_algos.experiments.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["--dataset", "sparse_logistic", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt", "nnz=3",
         "-N", "4", "-K", "2", "-T", "2", "--no-progress", "--no-plot"]


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --- 7: a resume keeps the thread count ------------------------------------------------------------ #


def test_resume_keeps_the_thread_count_of_the_run(tmp_path, monkeypatch, capsys):
    """The fresh run chose 3 threads from OMP_NUM_THREADS; the resume runs where OMP_NUM_THREADS says 1
    and must still use 3 (another count changes torch's sums), recorded in config.json."""
    out = tmp_path / "r"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert main(["run", *SMALL, "--checkpoint-every", "1", "--out", str(out)]) == 0
    assert json.load(open(out / "config.json"))["threads"] == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main(["run", "--resume", str(out), "-T", "3", "--no-progress", "--no-plot"]) == 0, capsys.readouterr().err
    assert json.load(open(out / "summary.json"))["threads"] == 3  # History.threads: what simulate set for the rounds


# --- 9: a sweep point that failed is "failed", with its reason, and the command fails ------------------ #


def test_a_failed_sweep_point_is_failed_with_its_reason_and_exits_non_zero(tmp_path, capsys):
    out = tmp_path / "sw"
    rc = main(["sweep", "-a", "fedavg", "--grid", "num_clients=4,500", *SMALL, "--out", str(out)])
    text = capsys.readouterr()
    assert rc == 1, text.err
    assert "1 not started" not in text.out, text.out
    row = [ln for ln in text.out.splitlines() if "num_clients=500" in ln and ln.startswith("|")]
    assert row and "failed" in row[0], text.out
    assert "cannot split 128 samples over 500 clients" in text.out + text.err
    summary = json.load(open(out / "summary.json"))
    assert any("cannot split" in why for why in summary["failed"].values()), summary["failed"]


# --- 10: compare refuses the same algorithm twice, before anything is run ------------------------------- #


def test_compare_refuses_an_algorithm_given_twice(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["compare", "-a", "fedavg", "fedmid", "fedavg", *SMALL, "--out", str(out)]) == 1
    err = _error(capsys)
    assert "fedavg" in err and "twice" in err and "-a" in err, err
    assert not out.exists()


# --- 11: --reseed-data where it means nothing ------------------------------------------------------------ #


@pytest.mark.parametrize("argv", [["run"], ["compare", "-a", "fedavg", "fedmid"], ["run", "--seed", "3"],
                                  ["sweep", "-a", "fedavg", "--grid", "lr=0.1,0.2"]])  # a sweep: a traceback before
def test_reseed_data_without_several_seeds_is_refused(tmp_path, capsys, argv):
    out = tmp_path / "r"
    assert main([*argv, *SMALL, "--reseed-data", "--out", str(out)]) == 1
    err = _error(capsys)
    assert "--reseed-data" in err and "seeds" in err, err
    assert not out.exists()


# --- 12: an OSError is one line naming the path ---------------------------------------------------------- #


def test_a_file_where_the_out_folder_should_be_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "sub"
    assert main(["run", *SMALL, "--out", str(out)]) == 1
    err = _error(capsys)
    assert str(tmp_path / "afile") in err, err


# --- 14: a 1-sample data set, a sweep folder given to run --resume, --out into the user's own files --------- #


def test_a_one_sample_data_set_is_refused_before_the_folder_exists(tmp_path, capsys):
    data = tmp_path / "one.txt"
    data.write_text("1 1:0.5 2:1\n")
    out = tmp_path / "r"
    args = ["run", "--dataset", "libsvm", "--data-opt", f"file={data}", "-N", "1", "-T", "1", "--no-progress",
            "--no-plot", "--out", str(out)]
    assert main(args) == 1
    err = _error(capsys)
    assert str(data) in err and "1 sample" in err, err
    assert not out.exists()
    assert main(args) == 1  # the same --out again: the same refusal, not "a run exists"
    assert "1 sample" in _error(capsys)


def test_run_resume_of_a_sweep_folder_points_to_sweep_resume(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", "-a", "fedavg", "--grid", "lr=0.1", *SMALL, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--no-progress", "--no-plot"]) == 1
    err = _error(capsys)
    assert f"sweep --resume {out}" in err, err


def test_out_refuses_a_folder_of_the_users_own_files(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    assert main(["run", *SMALL, "--out", str(out)]) == 1
    err = _error(capsys)
    assert "notes.txt" in err and str(out) in err, err
    assert sorted(os.listdir(out)) == ["notes.txt"]


# --- 6 (the part without Flower): a relative data path is recorded absolute ------------------------------ #


def test_a_relative_data_file_is_recorded_absolute_and_resumes_from_another_folder(tmp_path, monkeypatch, capsys):
    """config.json names the file absolutely, so a resume (or a Flower node) started in another folder
    finds it; the path is read relative to the command's folder, as before."""
    (tmp_path / "a").mkdir()
    rows = "".join(f"{i % 2} 1:{i / 10:.1f} 2:{(i * 7 % 5) / 5:.1f}\n" for i in range(40))
    (tmp_path / "a" / "d.txt").write_text(rows)
    monkeypatch.chdir(tmp_path / "a")
    out = tmp_path / "r"
    assert main(["run", "--dataset", "libsvm", "--data-opt", "file=d.txt", "-N", "2", "-T", "1", "--checkpoint-every",
                 "1", "--no-progress", "--no-plot", "--out", str(out)]) == 0
    assert json.load(open(out / "config.json"))["data_opts"]["file"] == str(tmp_path / "a" / "d.txt")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--resume", str(out), "-T", "2", "--no-progress", "--no-plot"]) == 0, capsys.readouterr().err
    assert json.load(open(out / "summary.json"))["rounds_done"] == 2


# --- 8: Optuna trials stopped by --time-budget are resumable, and resumed ---------------------------------- #


def test_optuna_trials_stopped_by_the_time_budget_are_continued_by_resume(tmp_path, capsys):
    optuna = pytest.importorskip("optuna", reason="needs optuna: pip install optuna")
    out = tmp_path / "s"
    # every run stops after its first round (its budget is spent by then), checkpointed there
    assert main(["sweep", "-a", "fedavg", "--optuna", "2", "--space", "lr=log:0.01:0.1", *SMALL, "-T", "3",
                 "--time-budget", "1e-6", "--out", str(out)]) == 0
    study = optuna.load_study(study_name="fedavg", storage=f"sqlite:///{out / 'optuna.db'}")
    assert [t.state.name for t in study.get_trials()] == ["RUNNING"], "a stopped trial is resumable, not failed"
    assert "--time-budget" in capsys.readouterr().out
    for _ in range(8):  # each resume runs every stopped run one round further
        assert main(["sweep", "--resume", str(out), "--no-progress", "--no-plot"]) == 0
        study = optuna.load_study(study_name="fedavg", storage=f"sqlite:///{out / 'optuna.db'}")
        if [t.state.name for t in study.get_trials()] == ["COMPLETE", "COMPLETE"]:
            break
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE", "COMPLETE"]
    for t in study.get_trials():
        lr = t.params["lr"]
        name = f"lr={float(f'{lr:.6g}'):g}"
        summary = json.load(open(out / "fedavg" / name / "seed-0" / "summary.json"))
        assert summary["status"] == "completed" and summary["rounds_done"] == 3
        assert t.value == pytest.approx(summary["final"]["f+h"])
