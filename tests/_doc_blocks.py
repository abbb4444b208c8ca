"""The code blocks of a markdown page (README.md, docs/*.md), as the doc tests read them.

A page's ```python blocks are pasted in order into one fresh interpreter (in an empty folder); the
`python -m python_algos ...` commands of its ```bash blocks must parse; its ```toml blocks must
parse. A block that cannot run here (a GPU, torchrun, several machines, a fragment of the user's
own program) is marked on the line right before its fence with ``<!-- doc-test: skip (why) -->``;
only those are skipped. Untagged blocks (output, file layouts, synopses with placeholders) are text.
"""

import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = re.compile(r"^\s*<!--\s*doc-test:\s*skip\s*\(.+\)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def blocks(text: str, lang: str, name: str = "page"):
    """[(number, line, code, skipped)] of the ```lang blocks of ``text``, numbered from 1 in order;
    line is the 1-based line of the block's first code line. Fences may be indented (inside a list
    item); the indentation is removed."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, tag, start = m.group(1), m.group(2), i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{name} line {start + 1}: a ``` block that is never closed")
        i += 1
        if tag == lang:
            skipped = start > 0 and bool(SKIP.match(lines[start - 1]))
            found.append((len(found) + 1, start + 2, "\n".join(body) + "\n", skipped))
    return found


def commands(code: str, strict: bool = True):
    """The shell commands of a bash block: continuation lines joined, comments dropped. With
    strict=False a line that is not a whole command (inside a multi-line quoted string) is skipped."""
    joined = re.sub(r"\\\n", " ", code)
    for line in joined.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            if strict:
                raise
            continue
        if words:
            yield words


def module_commands(text: str, name: str = "page"):
    """(block number, line, command text, module, argv after `-m MODULE`) of every bash-block command
    that runs a module with `-m` (`python -m ...`, torchrun's `-m ...`). A literal `...` (the pages'
    placeholder for other flags) is dropped."""
    found = []
    for number, line, code, skipped in blocks(text, "bash", name):
        if skipped:
            continue
        for words in commands(code):
            if "-m" in words[:-1]:
                k = words.index("-m")
                argv = [w for w in words[k + 2:] if w != "..."]
                found.append((number, line, " ".join(words), words[k + 1], argv))
    return found


# The driver runs in a fresh interpreter, in an empty folder (files the blocks write land there),
# and execs the blocks in one namespace, as if pasted one after another into `python`.
_DRIVER = r"""
import json, sys, traceback
name = sys.argv[2]
ns = {"__name__": "__main__"}
for number, line, code in json.load(open(sys.argv[1])):
    first = code.strip().splitlines()[0]
    try:
        exec(compile(code, f"{name} python block {number} (line {line})", "exec"), ns)
    except BaseException:
        print(f"{name} python block {number} (line {line}: {first}) failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def run_python_blocks(text: str, name: str, tmp_path, timeout: float = 300):
    """Run the page's unskipped ```python blocks in order in one fresh interpreter, in the empty
    folder ``tmp_path / "work"``; return (completed process, work folder, number of blocks run)."""
    run = [(n, line, code) for n, line, code, skipped in blocks(text, "python", name) if not skipped]
    (tmp_path / "blocks.json").write_text(json.dumps(run))
    (tmp_path / "driver.py").write_text(_DRIVER)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    p = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "blocks.json"), name],
                       cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    return p, work, len(run)


def parse_errors(text: str, name: str):
    """The `python -m python_algos ...` commands of the page whose flags do not parse, and the
    `python -m MODULE` commands whose module does not exist, as one line each."""
    import importlib.util

    from python_algos.experiments.cli import build_parser

    bad = []
    for number, line, cmd, module, argv in module_commands(text, name):
        where = f"{name} bash block {number} (line {line}): {cmd}"
        if module == "python_algos":
            try:
                build_parser().parse_args(argv)
            except SystemExit as e:  # argparse printed why on stderr (or, for --help, the help: code 0)
                if e.code != 0:
                    bad.append(where)
        elif module.split(".")[0] in ("examples", "bench", "python_algos", "fedkernels"):
            if importlib.util.find_spec(module) is None:
                bad.append(f"{where}: no module {module}")
    return bad


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (but - and _), spaces to -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose(text: str) -> str:
    """The page without its ``` blocks."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line) or (fenced and line.strip() == "```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def anchors(text: str):
    """The anchors of a page's headings."""
    return {slug(line.lstrip("#")) for line in prose(text).splitlines() if line.startswith("#")}


def broken_links(path: str):
    """The relative links [text](target) of the markdown page ``path`` whose file does not exist, or
    whose #anchor names no heading of a markdown target."""
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(read(path))):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        where, dest_name = f"{os.path.relpath(path, ROOT)}: ({target})", os.path.relpath(dest, ROOT)
        if not os.path.exists(dest):
            bad.append(f"{where}: no file {dest_name}")
        elif anchor and dest.endswith(".md") and anchor not in anchors(read(dest)):
            bad.append(f"{where}: no heading #{anchor} in {dest_name}")
    return bad
