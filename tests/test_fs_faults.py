"""The file system says no (issue 36, item 6's second harness, defect 12): a read-only ``--out``, a
file where a folder should be, and a disk that fills up in the middle of a run. Each ends in one
line ``error: PATH: what failed`` (no traceback, exit status 1), and the full disk leaves a folder
that ``run --resume`` finishes, once space is freed, with the model of an uninterrupted run.

The read-only and the full file systems are small tmpfs mounts made here (the tests run as root in
CI); where mounting is not allowed the tests are skipped, saying so. Ground truth: the exit status,
stderr, the folders' files, and model.pt of the same run made on a file system with room."""

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest
import torch

from python_algos.experiments.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["--dataset", "sparse_logistic", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt", "nnz=3",
         "-N", "4", "-K", "2", "--no-progress", "--no-plot"]


def _mount(path, *options):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=1m", *options)), "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        path.rmdir()
        pytest.skip(f"cannot mount a tmpfs here ({(r.stderr or r.stdout).strip() or 'mount failed'}): the "
                    f"file-system faults need one")


@pytest.fixture
def tmpfs():
    """A 1 MiB tmpfs (unmounted afterwards), outside pytest's own temporary folders: another pytest
    session's cleanup may rename those, and a mount inside one would then outlive the test."""
    mnt = pathlib.Path(tempfile.mkdtemp(prefix="fs-faults-"))
    mnt.rmdir()
    _mount(mnt)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        shutil.rmtree(mnt, ignore_errors=True)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_read_only_out_is_one_line_naming_it(tmpfs, capsys):
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    out = tmpfs / "r"
    assert main(["run", *SMALL, "-T", "2", "--out", str(out)]) == 1
    err = _one_line_error(capsys)
    assert str(tmpfs) in err and "Read-only file system" in err, err
    assert not out.exists()


@pytest.mark.parametrize("command", [["run"], ["compare", "-a", "fedavg", "fedmid"],
                                     ["sweep", "-a", "fedavg", "--grid", "lr=0.1,0.2"]])
def test_a_file_where_a_folder_should_be_is_one_line_naming_it(tmp_path, capsys, command):
    (tmp_path / "afile").write_text("mine")
    assert main([*command, *SMALL, "-T", "2", "--out", str(tmp_path / "afile" / "sub")]) == 1
    err = _one_line_error(capsys)
    assert str(tmp_path / "afile") in err, err
    assert (tmp_path / "afile").read_text() == "mine"


def _params(folder):
    m = torch.load(os.path.join(folder, "model.pt"), map_location="cpu", weights_only=True)
    return m["params"] if isinstance(m, dict) and "params" in m else m


def test_a_disk_that_fills_mid_run_leaves_a_resumable_folder(tmp_path, tmpfs, capsys):
    rounds = 300
    args = [*SMALL, "-T", str(rounds), "--checkpoint-every", "7", "--dtype", "float64"]
    ref = tmp_path / "ref"  # the same run on a disk with room
    assert main(["run", *args, "--out", str(ref)]) == 0
    capsys.readouterr()
    free = os.statvfs(tmpfs).f_bavail * os.statvfs(tmpfs).f_frsize
    filler = tmpfs / "filler"
    filler.write_bytes(b"\0" * (free - 96 * 1024))  # room for the run's start and some rounds, not all
    out = tmpfs / "r"
    assert main(["run", *args, "--out", str(out)]) == 1
    err = _one_line_error(capsys)
    assert "No space left on device" in err and str(out) in err, err
    assert f"run --resume {out}" in err, err
    filler.unlink()
    assert main(["run", "--resume", str(out), "--no-progress", "--no-plot"]) == 0, capsys.readouterr().err
    summary = json.load(open(out / "summary.json"))
    assert summary["status"] == "completed" and summary["rounds_done"] == rounds
    assert torch.equal(_params(out), _params(ref))
    rows = [json.loads(ln) for ln in open(out / "metrics.jsonl")]
    assert [r["round"] for r in rows] == list(range(rounds + 1))
    ref_rows = [json.loads(ln) for ln in open(ref / "metrics.jsonl")]
    assert [r.get("f+h") for r in rows] == [r.get("f+h") for r in ref_rows]
