"""Smoke test of ``python -m bench.isa_table`` (collected by the default ``python -m pytest``):
every op x every variant this CPU runs x each thread count gets a cell, the machine and its load
are named, and bad flags are refused before anything runs. Nothing here is timed."""

from __future__ import annotations

import json

import pytest

from fedkernels import _C

from . import isa_table


def test_isa_table_has_every_op_variant_and_thread_count(tmp_path, capsys):
    out = tmp_path / "isa.json"
    res = isa_table.main(["--numel", "5000", "--rounds", "1", "--threads", "1", "2", "--baseline", "--json", str(out)])
    variants = _C.cpu_isa_variants().split(",")
    assert res["variants"] == variants
    assert {(r["op"], r["threads"]) for r in res["rows"]} == {(op.name, t) for op in isa_table.ops() for t in (1, 2)}
    for r in res["rows"]:
        assert set(r["percent"]) == set(variants) and all(v > 0 for v in r["percent"].values())
    assert json.loads(out.read_text())["picked"] == res["picked"] == _C.cpu_isa()
    text = capsys.readouterr().out
    assert "Machine: " in text and "Load average (1, 5, 15 min) before: " in text
    assert f"{res['picked']}*, 1 thr" in text and "SCAD/L1 time, 2 thread(s)" in text
    assert set(res["in_cache_seconds"]) == set(variants) and "In cache (float32" in text
    assert all(set(t) == set(isa_table.IN_CACHE_CASES) for t in res["in_cache_seconds"].values())


@pytest.mark.parametrize("argv, message", [(["--rounds", "0"], "--rounds must be >= 1"),
                                           (["--numel", "0"], "--numel must be >= 1"),
                                           (["--threads", "-1"], "--threads must be >= 0")])
def test_isa_table_refuses_bad_flags(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        isa_table.main(argv + ["--json", str(tmp_path / "x.json")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
