"""Smoke test of ``python -m bench.gather_linear`` (collected by the default ``python -m pytest``): a
row per layer width with both paths' columns, the machine and its load named, and bad flags refused
before anything is measured. Nothing here is timed."""

from __future__ import annotations

import pytest

from . import gather_linear


def test_gather_linear_prints_a_row_per_width(capsys):
    gather_linear.main(["--o", "3", "7", "--clients", "2", "--batch", "4", "--inputs", "20", "--rows", "600",
                        "--rounds", "1"])
    out = capsys.readouterr().out
    assert "load average before" in out and "load average after" in out and "fedkernels CPU variant" in out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in ("3", "7")]
    assert [r[0] for r in rows] == ["3", "7"]
    assert all(len(r) == len(gather_linear.COLUMNS) and float(r[3]) > 0 and float(r[7]) > 0 for r in rows)


@pytest.mark.parametrize("argv, message", [(["--rounds", "0"], "--rounds must be >= 1"),
                                           (["--o", "0"], "--o must be >= 1"),
                                           (["--rows", "10"], "--rows must be at least")])
def test_gather_linear_refuses_bad_flags(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        gather_linear.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
