"""``python -m bench.gpu_check`` without a GPU: the --cpu-smoke pipeline runs end to end and writes
its report, a plain run refuses with a clear message, and the sanitizer workload calls every op."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fedkernels as fk

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gpu_check, gpu_report, gpu_workload  # noqa: E402


@pytest.mark.slow
def test_cpu_smoke_writes_the_report(tmp_path):
    out = tmp_path / "report.md"
    p = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--cpu-smoke", "--out", str(out)], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout
    text = out.read_text()
    assert "CPU smoke run" in text
    for title in gpu_report.TITLES.values():
        assert f"| {title} |" in text
    assert "| fail |" not in text and "| not run |" not in text
    assert "## Ops against the copy bandwidth" in text and "## Client executors" in text
    for row in ("| sequential |", "| batched |", "| plain loop |"):  # the MLP table, then the CIFAR-10 one
        assert text.count(row) == 2, row
    assert "## pfl-research's CIFAR-10 benchmark configuration" in text and "client updates per second" in text
    for step in gpu_report.STEPS + ("machine",):
        assert (tmp_path / "report" / f"{step}.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_without_gpu_refuses_with_exit_2(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "--cpu-smoke" in err
    assert not (tmp_path / "r").exists()  # nothing written


@pytest.mark.parametrize("argv,flag", [(["--steps", "build,nope"], "--steps"), (["--out", "x.txt"], "--out"),
                                       (["--sanitizer-tools", "leakcheck"], "--sanitizer-tools")])
def test_bad_flags_name_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(argv)
    assert flag in capsys.readouterr().err


def test_workload_calls_every_op():
    r = gpu_workload.run("cpu", check=True, dtypes=("float32",), shapes=[(5,), (2, 3)], log=lambda m: None)
    assert r["ops"] == sorted(fk.ops.__all__)
    assert r["mismatches"] == []


def test_sanitizer_summary_parsing():
    assert gpu_check._sanitizer_errors("========= ERROR SUMMARY: 0 errors\n") == 0
    assert gpu_check._sanitizer_errors("========= ERROR SUMMARY: 3 errors\n") == 3
    assert gpu_check._sanitizer_errors("RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)") == 2
    assert gpu_check._sanitizer_errors("Traceback ...") is None
