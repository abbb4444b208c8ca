"""Every page under docs/ as a reader uses it: its ```python blocks, pasted in order into one fresh
interpreter, run; the `python -m ...` commands of its ```bash blocks name modules and flags that
exist; its ```toml blocks parse; its links lead somewhere. A block that cannot run here (a GPU,
torchrun, several machines) is marked ``<!-- doc-test: skip (why) -->`` on the line before its fence
(tests/_doc_blocks.py). Every docs/X.md that a shipped file names exists."""

import os
import re

import pytest

from tests._doc_blocks import ROOT, blocks, broken_links, parse_errors, read, run_python_blocks

DOCS = os.path.join(ROOT, "docs")
PAGES = sorted(f for f in os.listdir(DOCS) if f.endswith(".md"))


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run_in_order(page, tmp_path):
    text = read(os.path.join(DOCS, page))
    if not any(not skipped for *_, skipped in blocks(text, "python", page)):
        pytest.skip(f"docs/{page} has no Python block to run")
    p, _, _ = run_python_blocks(text, f"docs/{page}", tmp_path)
    assert p.returncode == 0, p.stderr[-6000:]


@pytest.mark.parametrize("page", PAGES)
def test_commands_in_bash_blocks_parse(page):
    assert parse_errors(read(os.path.join(DOCS, page)), f"docs/{page}") == []


@pytest.mark.parametrize("page", PAGES)
def test_toml_blocks_parse(page):
    tomllib = pytest.importorskip("tomllib")
    for number, line, code, skipped in blocks(read(os.path.join(DOCS, page)), "toml", page):
        if not skipped:
            try:
                tomllib.loads(code)
            except tomllib.TOMLDecodeError as e:
                pytest.fail(f"docs/{page} toml block {number} (line {line}): {e}")


@pytest.mark.parametrize("page", PAGES)
def test_links_resolve(page):
    assert broken_links(os.path.join(DOCS, page)) == []


def test_every_cited_docs_page_exists():
    """Help texts, error messages and other pages cite docs pages by path (`docs/algorithms.md §3`):
    each must exist."""
    cited = {}
    for top in ("python_algos", "fedkernels", "examples", "bench", "tests", "README.md", "docs"):
        path = os.path.join(ROOT, top)
        files = [path] if os.path.isfile(path) else [
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith((".py", ".md", ".toml"))]
        for f in files:
            for page in re.findall(r"\bdocs/([\w-]+\.md)", read(f)):
                cited.setdefault(page, os.path.relpath(f, ROOT))
    missing = {page: where for page, where in cited.items() if page not in PAGES and page != "X.md"}
    assert missing == {}, "docs pages cited but absent (page: a file citing it)"
