"""README.md as a new user reads it: every ```python block, pasted in order into one interpreter,
runs; every `python -m ...` command in a ```bash block names a module and flags that exist; every
```toml block parses; its install and test lines are what .ci/run runs; it stays short.

How blocks are read, and how a block that cannot run here is marked (``<!-- doc-test: skip (why)
-->``), is tests/_doc_blocks.py, shared with the docs pages' test (tests/test_docs_pages.py)."""

import os

import pytest

from tests._doc_blocks import (
    ROOT,
    blocks,
    broken_links,
    commands,
    module_commands,
    parse_errors,
    read,
    run_python_blocks,
)

README = os.path.join(ROOT, "README.md")


def test_extractor_reads_blocks_and_skip_marks():
    text = ("x\n```python\na = 1\n```\n<!-- doc-test: skip (needs a GPU) -->\n```python\nb\n```\n"
            "  ```bash\n  ls\n  ```\n")
    assert blocks(text, "python") == [(1, 3, "a = 1\n", False), (2, 7, "b\n", True)]
    assert blocks(text, "bash") == [(1, 10, "ls\n", False)]


def test_a_skip_mark_must_say_why():
    text = "<!-- doc-test: skip -->\n```python\nb\n```\n"
    assert blocks(text, "python") == [(1, 3, "b\n", False)]


def test_python_blocks_run_in_order(tmp_path):
    p, work, n = run_python_blocks(read(README), "README.md", tmp_path)
    assert n >= 3, "README.md lost its Python examples"
    assert p.returncode == 0, p.stderr[-6000:]
    assert (work / "results" / "api-run" / "summary.json").is_file()  # the quick start's saved run


def test_cli_commands_in_bash_blocks_parse():
    assert len([c for c in module_commands(read(README), "README.md") if c[3] == "python_algos"]) >= 4, \
        "README.md lost its command-line examples"
    assert parse_errors(read(README), "README.md") == []


def test_cli_command_check_catches_a_flag_that_does_not_exist_and_a_missing_module(capsys):
    text = ("```bash\npython -m python_algos run -a fedcanon --no-such-flag 3 \\\n    -T 5   # comment\n"
            "python -m examples.no_such_example\n```\n")
    (_, _, _, module, argv), _ = module_commands(text)
    assert module == "python_algos" and argv == ["run", "-a", "fedcanon", "--no-such-flag", "3", "-T", "5"]
    bad = parse_errors(text, "page")
    assert len(bad) == 2 and "no module examples.no_such_example" in bad[1]
    assert "--no-such-flag" in capsys.readouterr().err


def test_toml_blocks_parse():
    tomllib = pytest.importorskip("tomllib")
    for number, line, code, skipped in blocks(read(README), "toml"):
        if not skipped:
            try:
                tomllib.loads(code)
            except tomllib.TOMLDecodeError as e:
                pytest.fail(f"README.md toml block {number} (line {line}): {e}")


def _ci_commands():
    return list(commands(read(os.path.join(ROOT, ".ci", "run")), strict=False))


def test_ci_installs_as_the_cpu_only_readme_lines_say():
    """The README's first install block is the CPU-only one: its pip lines skip CUDA (with nvcc on
    PATH a plain `pip install .` compiles the CUDA kernels for minutes, useless to a CPU-only torch),
    and .ci/run runs those lines word for word (its CUDA compile check is a separate build)."""
    number, line, code, _ = blocks(read(README), "bash")[0]
    pip = [words for words in commands(code) if "pip" in words]
    assert any("download.pytorch.org/whl/cpu" in w for words in pip for w in words), "not the CPU-only block"
    install = [words for words in pip if "install" in words and any(w.startswith(".") for w in words)]
    assert install and all("FEDKERNELS_CPU_ONLY=1" in words for words in install), \
        f"README.md line {line}: the CPU-only install must set FEDKERNELS_CPU_ONLY=1"
    ci = _ci_commands()
    missing = [" ".join(words) for words in pip if words not in ci]
    assert missing == [], "README.md install lines that .ci/run does not run as written"


def _readme_test_commands():
    return [words for _, _, code, _ in blocks(read(README), "bash") for words in commands(code)
            if words[:3] == ["python", "-m", "pytest"]]


def test_ci_runs_the_readme_test_command_and_then_the_tests_it_leaves_out():
    (readme_cmd,) = _readme_test_commands()
    ci = [words for words in _ci_commands() if words[:3] == ["python", "-m", "pytest"]]
    assert ci[0] == readme_cmd, ".ci/run's first test command is not the README's"
    assert ci[1][3:] == ["-m", "slow or processes"]


def test_the_default_run_leaves_out_exactly_what_ci_runs_second():
    """pyproject's addopts deselect what .ci/run's second command selects: together, every test."""
    tomllib = pytest.importorskip("tomllib")
    opts = tomllib.loads(read(os.path.join(ROOT, "pyproject.toml")))["tool"]["pytest"]["ini_options"]
    assert "-m 'not slow and not processes'" in opts["addopts"]
    declared = {m.split(":")[0] for m in opts["markers"]}
    assert {"slow", "processes"} <= declared


def test_readme_is_short_and_its_two_commands_come_first():
    lines = read(README).splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to a page under docs/"
    head = "\n".join(lines[:40])
    assert "python -m python_algos " in head and "python -m pytest" in head
    assert "pip install" in head


def test_readme_lists_every_docs_page():
    text = read(README)
    pages = sorted(f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    missing = [p for p in pages if f"](docs/{p})" not in text]
    assert missing == [], "docs pages missing from README.md's table of pages"


def test_links_resolve():
    assert broken_links(README) == []
