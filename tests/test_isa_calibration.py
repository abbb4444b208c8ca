"""The elementwise kernels' CPU variant chosen by measurement (fedkernels/_calibrate.py, issue 40):
the calibration picks a variant this CPU runs, writes the cache and a later process reads it, a
corrupt or foreign cache is ignored, FEDKERNELS_CPU_ISA wins, backend_info says which; results are
bitwise equal under every choice, and the gathered linear kernels never follow it.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

import fedkernels as fk
from fedkernels import _C, _calibrate

VARIANTS = _C.cpu_isa_variants().split(",")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_two = pytest.mark.skipif(len(VARIANTS) < 2, reason="this CPU runs one variant: nothing to calibrate")


def _run(cache_home, isa_env=None):
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home))
    env.pop("FEDKERNELS_CPU_ISA", None)
    if isa_env:
        env["FEDKERNELS_CPU_ISA"] = isa_env
    code = ("import fedkernels as fk; i = fk.backend_info(); "
            "print(i['cpu_isa'], i['cpu_isa_source'], i['cpu_isa_gather'], i['cpu_isa_cache'], i['cpu_isa_plain'], "
            "sep='|')")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split("|")


def _cache_file(cache_home):
    return cache_home / "fedkernels" / _calibrate.CACHE_FILE


def _write(cache_home, text):
    _cache_file(cache_home).parent.mkdir(parents=True, exist_ok=True)
    _cache_file(cache_home).write_text(text)


@needs_two
def test_first_use_calibrates_to_a_variant_this_cpu_runs_and_writes_the_cache(tmp_path):
    isa, source, gather, cache, plain = _run(tmp_path)
    assert (isa in VARIANTS, plain in VARIANTS, source, gather, cache) == (
        True, True, "calibrated", VARIANTS[-1], str(_cache_file(tmp_path)))
    entry = json.loads(_cache_file(tmp_path).read_text())[_calibrate.cache_key(_C)]
    assert (entry["isa"], entry["plain"]) == (isa, plain) and set(entry["seconds"]) == set(VARIANTS)
    assert all(set(t) == {"prox", "plain"} and min(t.values()) > 0 for t in entry["seconds"].values())
    assert _run(tmp_path) == [isa, "calibration cache", gather, cache, plain]


@needs_two
def test_a_cached_choice_is_used_without_measuring(tmp_path):
    # baseline is never the fastest where AVX2 exists, so only the cache can choose it
    cached = {"isa": VARIANTS[0], "plain": VARIANTS[1], "seconds": {}}
    _write(tmp_path, json.dumps({_calibrate.cache_key(_C): cached}))
    out = _run(tmp_path)
    assert out[:3] + out[4:] == [VARIANTS[0], "calibration cache", VARIANTS[-1], VARIANTS[1]]


@needs_two
@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"%KEY%": {"isa": "avx9000", "plain": "baseline"}}',
                                  '{"%KEY%": {"isa": "baseline"}}', '{"%KEY%": {"isa": "baseline", "plain": 1}}',
                                  '{"%KEY%": "avx2"}', '{"another cpu": {"isa": "baseline", "plain": "baseline"}}'])
def test_a_corrupt_or_foreign_cache_is_ignored_and_rewritten(tmp_path, text):
    _write(tmp_path, text.replace("%KEY%", _calibrate.cache_key(_C)))
    isa, source = _run(tmp_path)[:2]
    assert source == "calibrated" and isa in VARIANTS
    data = json.loads(_cache_file(tmp_path).read_text())
    assert data[_calibrate.cache_key(_C)]["isa"] == isa
    assert ("another cpu" in data) == ("another cpu" in text)  # another machine's entry stays


@needs_two
def test_an_older_build_entry_of_this_cpu_is_replaced(tmp_path):
    old = _calibrate.cpu_model() + " | fedkernels 0.0.1 | 1:2 | " + ",".join(VARIANTS)
    _write(tmp_path, json.dumps({old: {"isa": VARIANTS[0], "plain": VARIANTS[0], "seconds": {}}}))
    assert _run(tmp_path)[1] == "calibrated"
    assert list(json.loads(_cache_file(tmp_path).read_text())) == [_calibrate.cache_key(_C)]


@needs_two
def test_an_unwritable_cache_folder_still_calibrates(tmp_path):
    (tmp_path / "fedkernels").write_text("a file where the folder would be")
    assert _run(tmp_path)[1] == "calibrated"


@needs_two
def test_FEDKERNELS_CPU_ISA_wins_over_the_cache_and_nothing_is_measured(tmp_path):
    cached = {"isa": VARIANTS[-1], "plain": VARIANTS[-1], "seconds": {}}
    _write(tmp_path, json.dumps({_calibrate.cache_key(_C): cached}))
    out = _run(tmp_path, VARIANTS[0])
    assert out[:3] + out[4:] == [VARIANTS[0], "FEDKERNELS_CPU_ISA", VARIANTS[0], VARIANTS[0]]
    empty = tmp_path / "empty"
    _run(empty, VARIANTS[0])
    assert not _cache_file(empty).exists()


def test_the_best_supported_variant_is_kept_unless_another_is_faster_by_the_margin():
    v = ["baseline", "avx2", "avx512"]
    assert _calibrate.choose({"baseline": 3.0, "avx2": 1.0, "avx512": 1.04}, v) == "avx512"
    assert _calibrate.choose({"baseline": 3.0, "avx2": 1.0, "avx512": 1.06}, v) == "avx2"
    assert _calibrate.choose({"baseline": 0.5, "avx2": 1.0, "avx512": 1.0}, v) == "baseline"


@needs_two
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_choice_gives_the_same_bits_and_only_the_elementwise_kernels_follow_it(dtype):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(40_003, generator=gen, dtype=torch.float64).mul_(3).to(dtype)
    x[:4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")], dtype=dtype)
    cases = [("l1", 0.3, 1.0, 0.0), ("mcp", 0.3, 1.0, 3.0), ("mcp", 3.5, 1.0, 3.0), ("scad", 0.3, 1.0, 3.7),
             ("scad", 3.0, 1.0, 3.7)]
    before = (_C.cpu_isa(), _C.cpu_plain_isa(), _C.cpu_isa_source())
    results = {}
    try:
        for isa in VARIANTS:
            plain = VARIANTS[-1] if isa != VARIANTS[-1] else VARIANTS[0]
            _C.choose_elementwise_isa(isa, plain, "calibrated")
            assert (_C.cpu_isa(), _C.cpu_plain_isa(), _C.cpu_gather_isa()) == (isa, plain, VARIANTS[-1])
            results[isa] = [fk.raw.prox(x, *case).view(torch.int64 if dtype == torch.float64 else torch.int32)
                            for case in cases]
        _C.set_cpu_isa(VARIANTS[0])  # the test hook wins over the choice
        assert (_C.cpu_isa(), _C.cpu_isa_source()) == (VARIANTS[0], "set_cpu_isa")
        _C.set_cpu_isa("auto")  # back to the last choice
        assert (_C.cpu_isa(), _C.cpu_isa_source()) == (VARIANTS[-1], "calibrated")
    finally:
        _C.set_cpu_isa("auto")
        _C.choose_elementwise_isa(before[0], before[1], before[2] if before[2] != "detected" else "calibrated")
    for isa in VARIANTS[1:]:
        for a, b in zip(results[VARIANTS[0]], results[isa]):
            assert torch.equal(a, b), isa


def test_choose_elementwise_isa_refuses_an_unknown_variant_or_source():
    with pytest.raises(ValueError, match="isa must be 'auto' or a variant this CPU runs"):
        _C.choose_elementwise_isa("avx9000", VARIANTS[-1], "calibrated")
    with pytest.raises(ValueError, match="plain must be 'auto' or a variant this CPU runs"):
        _C.choose_elementwise_isa(VARIANTS[-1], "avx9000", "calibrated")
    with pytest.raises(ValueError, match="source must be 'calibrated' or 'calibration cache'"):
        _C.choose_elementwise_isa(VARIANTS[-1], VARIANTS[-1], "a guess")
