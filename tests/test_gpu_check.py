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


def test_clients_report_shows_pfl_rows_and_failures(monkeypatch):
    """The CIFAR-10 section: pfl-research's row where its run succeeded, its reason where it failed,
    and fedkernels' best executor (never pfl's or the loop's) as the number to publish."""
    from bench import gpu_clients, peers

    w = gpu_clients.cifar10_workload(2)
    monkeypatch.setattr(peers, "pfl_available", lambda: True)
    monkeypatch.setattr(peers, "launch_retrying", lambda *a, **k: (
        {"round_s": [9.0, 0.5, 0.25, 0.75], "pfl_version": "0.6.0", "device": "cuda:0"}, None))
    row = gpu_clients.pfl_row(w, "cuda", rounds=3, log=lambda s: None)
    assert row["s_per_round"] == 0.5 and row["ran_as"] == "pfl on cuda:0"  # median after the warm-up round
    monkeypatch.setattr(peers, "launch_retrying", lambda *a, **k: (None, "attempt 2: out of memory"))
    assert gpu_clients.pfl_row(w, "cuda", rounds=3, log=lambda s: None)["failure"] == "attempt 2: out of memory"

    def rows(*names_and_s):
        return [{"executor": n, "s_per_round": s, "client_updates_per_s": 2 / s} for n, s in names_and_s]

    cl = {"clients": 3, "samples": 8, "params": 10, "local_steps": 1, "batch": 4, "rounds": 1, "device": "cuda",
          "rows": rows(("sequential", 1.0), ("batched", 0.5), ("plain loop", 1.0)), "speedup": 2.0,
          "cifar10": {"description": "d", "rounds": 1, "failed": [], "pfl": "measured",
                      "rows": rows(("sequential", 1.0), ("batched", 0.5), ("plain loop", 0.25), ("pfl 0.6.0", 0.2)),
                      "best": {"executor": "batched", "client_updates_per_s": 4.0}}}
    text = gpu_report.render({"clients": {"status": "pass", "result": cl}})
    assert "| pfl 0.6.0 | 0.2000 | 10.0 |" in text
    assert "4.0 (fedkernels batched); pfl-research 10.0" in text
    cl["cifar10"]["rows"].pop()
    cl["cifar10"].update(failed=[{"executor": "pfl", "failure": "attempt 2: out of memory"}],
                         pfl="attempt 2: out of memory")
    text = gpu_report.render({"clients": {"status": "pass", "result": cl}})
    assert "| pfl | failed: attempt 2: out of memory | – |" in text


def test_readme_block_takes_a_gpu_run_and_refuses_a_smoke_run(tmp_path, capsys):
    """--readme writes the report into the gpu-check block (headings demoted, code untouched) for a
    GPU run's parts, and leaves the file untouched, with the reason, for a smoke run's."""
    readme = tmp_path / "performance.md"
    begin, end = (f"<!-- gpu-check:{w} -->" for w in ("begin", "end"))
    readme.write_text(f"# Perf\n\n## On a GPU\n\n{begin}\nold\n{end}\n\n## After\n")
    parts = {"machine": {"gpus": ["NVIDIA H100 80GB HBM3"], "date": "today"},
             "tests": {"status": "fail", "seconds": 1.0, "summary": "1 failed", "details": ["```", "# not a heading",
                                                                                          "```"]}}
    gpu_report.publish_readme(parts, str(readme))
    text = readme.read_text()
    assert text.startswith("# Perf\n\n## On a GPU\n\n" + begin + "\n### GPU check\n")
    assert text.endswith(end + "\n\n## After\n") and "old" not in text
    assert "* GPU: NVIDIA H100 80GB HBM3" in text and "#### Summary" in text and "\n# not a heading\n" in text

    before = readme.read_text()
    for bad in ({**parts, "tests": {**parts["tests"], "mode": "cpu-smoke"}}, {"tests": parts["tests"]}, {}):
        with pytest.raises(ValueError, match="not writing these results into the docs"):
            gpu_report.publish_readme(bad, str(readme))
    assert readme.read_text() == before
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--cpu-smoke", "--readme", str(readme)])
    assert "never written into the docs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--readme", str(tmp_path / "missing.md")])
    assert "no such file" in capsys.readouterr().err
