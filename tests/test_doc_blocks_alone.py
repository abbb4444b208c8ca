"""Issue 38 item 8: every ```python block of README.md and docs/*.md runs pasted alone, or its first
line says which block it continues (``# continues the block above (model, ...)``). The doc tests
(tests/test_docs_pages.py) paste a page's blocks in order into one interpreter, so a block that uses
a name only an earlier block defines passes there and fails with NameError for a reader who pastes
it alone; two did (README's ProxSGD line, docs/executors.md's simulate call), among seven.

Ground truth: the names a block reads that nothing in it binds, from Python's own parser (``ast``)
and ``builtins``; no code of the package is involved.
"""

from __future__ import annotations

import ast
import builtins
import os
import re

import pytest

from tests._doc_blocks import ROOT, blocks, read

PAGES = ["README.md", *(os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                        if f.endswith(".md"))]
CONTINUES = re.compile(r"^# continues the blocks? above \(.+\)$")


def free_names(code: str) -> set:
    """The names ``code`` reads (at any depth) that it never binds and that are not builtins."""
    bound, read_ = set(), set()
    for n in ast.walk(ast.parse(code)):
        if isinstance(n, ast.Name):
            (read_ if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
    return {x for x in read_ - bound if not hasattr(builtins, x)}


def test_free_names_sees_what_an_earlier_block_would_have_to_define():
    assert free_names("opt = fk.optim.ProxSGD(model.parameters())") == {"fk", "model"}
    assert free_names("import torch as t\ndef f(a, *b, c=1, **d):\n    return a, b, c, d, t, len\n") == set()
    assert free_names("class A:\n    pass\nx = [A() for i in range(3)]\ntry:\n    pass\nexcept E as e:\n    e\n") \
        == {"E"}


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_runs_alone_or_says_what_it_continues(page):
    bad = []
    for number, line, code, skipped in blocks(read(os.path.join(ROOT, page)), "python", page):
        if skipped:  # marked as not runnable here (a fragment of the user's program, torchrun, ...)
            continue
        missing = free_names(code)
        first = code.strip().splitlines()[0] if code.strip() else ""
        if missing and not CONTINUES.match(first):
            bad.append(f"{page} line {line} (block {number}) uses {', '.join(sorted(missing))}, defined by no line "
                       f"of it: begin it with '# continues the block above (...)' or make it self-contained")
    assert not bad, "\n".join(bad)
