"""bench/flower_table.py's rendering and README block, on a made-up result (the measurement itself
starts Flower processes for minutes: `python -m bench.flower_table`)."""

from bench import flower_table
from bench.readme_block import publish


def _res():
    row = lambda name, s, sent, diff: {"name": name, "s_per_round": s, "command_s": 3.0, "sent_bytes": sent,  # noqa
                                      "recv_bytes": sent, "params": [0.0], "max_diff": diff}
    floor = {**row(flower_table.FLOOR, 4.0, 896, None), "params": None,
             "runs": [{"s_per_round": 4.0, "load": "1.50, 1.00, 0.50"}, {"s_per_round": 4.2, "load": "2.00, 1, 1"}]}
    ours = {**row("--flower", 8.0, 928, 3e-17), "floor_ratio": 2.0,
            "runs": [{"s_per_round": 8.0, "load": "1.70, 1, 1"}, {"s_per_round": 8.5, "load": "2.10, 1, 1"}]}
    return {"machine": {}, "uptime_before": "0.1", "uptime_after": "0.2", "rounds": 4, "date": "2026-11-23",
            "pairs": 2, "rows": [row("one process", 0.01, None, 0.0), row("--workers 2", 0.02, 208, 0.0), floor, ours]}


def test_the_table_names_each_engine_its_bytes_its_floor_ratio_and_its_deviation(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(flower_table, "machine_line", lambda m: "a test machine")
    md = flower_table.render_markdown(_res())
    lines = md.splitlines()
    assert "a test machine" in lines[0] and "load average before 0.1, after 0.2" in lines[0]
    assert lines[4] == "| one process | 0.01 | – | – (nothing leaves the process) | 3.0 s | – |"
    assert lines[5] == "| --workers 2 | 0.02 | – | 208 sent + 208 received | 3.0 s | equal (max diff 0.0) |"
    assert lines[6] == f"| {flower_table.FLOOR} | 4 | 1 | 896 sent + 896 received | 3.0 s | – (echoes only) |"
    assert lines[7] == "| --flower | 8 | 2.00 | 928 sent + 928 received | 3.0 s | max diff 3.0e-17 |"
    assert "2 times each" in md and "4 (1.50), 4.2 (2.00)" in md and "8 (1.70), 8.5 (2.10)" in md
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- flower-table:begin -->\nold\n<!-- flower-table:end -->\ntail\n")
    publish(md, _res(), str(tmp_path / "out.md"), str(readme), flower_table.README_BEGIN, flower_table.README_END)
    text = readme.read_text()
    assert "old" not in text and md in text and text.endswith("<!-- flower-table:end -->\ntail\n")
    assert (tmp_path / "out.json").exists() and capsys.readouterr().out.strip() == md
