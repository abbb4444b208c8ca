"""README.md as a new user reads it: every ```python block, pasted in order into one interpreter,
runs; every `python -m python_algos ...` command in a ```bash block names flags that exist; every
```toml block parses.

A block that cannot run here (a GPU, torchrun) is marked on the line right before its fence with
``<!-- readme-test: skip (why) -->``; only those are skipped."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
SKIP = re.compile(r"^\s*<!--\s*readme-test:\s*skip\b.*-->\s*$")


def readme_blocks(lang: str, text: str = None):
    """[(number, line, code, skipped)] of the ```lang blocks, numbered from 1 in README order; line is
    the 1-based line of the block's first code line. Fences may be indented (inside a list item);
    the indentation is removed."""
    lines = (open(README, encoding="utf-8").read() if text is None else text).splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
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
            raise AssertionError(f"README.md line {start + 1}: a ``` block that is never closed")
        i += 1
        if tag == lang:
            skipped = start > 0 and bool(SKIP.match(lines[start - 1]))
            blocks.append((len(blocks) + 1, start + 2, "\n".join(body) + "\n", skipped))
    return blocks


def test_extractor_reads_blocks_and_skip_marks():
    text = "x\n```python\na = 1\n```\n<!-- readme-test: skip (needs a GPU) -->\n```python\nb\n```\n  ```bash\n  ls\n  ```\n"
    assert readme_blocks("python", text) == [(1, 3, "a = 1\n", False), (2, 7, "b\n", True)]
    assert readme_blocks("bash", text) == [(1, 10, "ls\n", False)]


# The driver runs in a fresh interpreter, in an empty folder (results/api-run lands there), and
# execs the blocks in one namespace, as if pasted one after another into `python`.
_DRIVER = r"""
import json, sys, traceback
ns = {"__name__": "__main__"}
for number, line, code in json.load(open(sys.argv[1])):
    first = code.strip().splitlines()[0]
    try:
        exec(compile(code, f"README.md python block {number} (line {line})", "exec"), ns)
    except BaseException:
        print(f"README.md python block {number} (line {line}: {first}) failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def test_python_blocks_run_in_order(tmp_path):
    blocks = readme_blocks("python")
    run = [(n, line, code) for n, line, code, skipped in blocks if not skipped]
    assert len(run) >= 5, "README.md lost its Python examples"
    (tmp_path / "blocks.json").write_text(json.dumps(run))
    (tmp_path / "driver.py").write_text(_DRIVER)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    p = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "blocks.json")], cwd=work,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-6000:]
    assert (work / "results" / "api-run" / "summary.json").is_file()  # the quick start's saved run


def _commands(code: str, strict: bool = True):
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


def cli_commands():
    """(block number, line, argv after `-m python_algos`) of every bash-block command that runs the
    CLI: `python -m python_algos ...` and torchrun's `-m python_algos ...`. A literal `...` (the
    README's placeholder for other flags) is dropped; what remains must parse."""
    found = []
    for number, line, code, skipped in readme_blocks("bash"):
        if skipped:
            continue
        for words in _commands(code):
            if "-m" in words and "python_algos" in words[words.index("-m") + 1:words.index("-m") + 2]:
                argv = [w for w in words[words.index("-m") + 2:] if w != "..."]
                found.append((number, line, " ".join(words), argv))
    return found


def test_cli_commands_in_bash_blocks_parse():
    from python_algos.experiments.cli import build_parser

    commands = cli_commands()
    assert len(commands) >= 4, "README.md lost its command-line examples"
    bad = []
    for number, line, text, argv in commands:
        try:
            build_parser().parse_args(argv)
        except SystemExit:  # argparse printed why on stderr
            bad.append(f"bash block {number} (line {line}): {text}")
    assert bad == []


def test_cli_command_check_catches_a_flag_that_does_not_exist(capsys):
    from python_algos.experiments.cli import build_parser

    text = "```bash\npython -m python_algos run -a fedcanon --no-such-flag 3 \\\n    -T 5   # comment\n```\n"
    (number, line, code, _), = readme_blocks("bash", text)
    (argv,) = list(_commands(code))
    assert argv[3:] == ["run", "-a", "fedcanon", "--no-such-flag", "3", "-T", "5"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv[3:])
    assert "--no-such-flag" in capsys.readouterr().err


def test_toml_blocks_parse():
    tomllib = pytest.importorskip("tomllib")
    blocks = readme_blocks("toml")
    for number, line, code, skipped in blocks:
        if not skipped:
            try:
                tomllib.loads(code)
            except tomllib.TOMLDecodeError as e:
                pytest.fail(f"README.md toml block {number} (line {line}): {e}")


def test_ci_installs_as_the_cpu_only_readme_lines_say():
    """The README's first install block is the CPU-only one: its pip lines skip CUDA (with nvcc on
    PATH a plain `pip install .` compiles the CUDA kernels for minutes, useless to a CPU-only torch),
    and .ci/run runs those lines word for word (its CUDA compile check is a separate build)."""
    number, line, code, _ = readme_blocks("bash")[0]
    pip = [words for words in _commands(code) if "pip" in words]
    assert any("download.pytorch.org/whl/cpu" in w for words in pip for w in words), "not the CPU-only block"
    install = [words for words in pip if "install" in words and any(w.startswith(".") for w in words)]
    assert install and all("FEDKERNELS_CPU_ONLY=1" in words for words in install), \
        f"README.md line {line}: the CPU-only install must set FEDKERNELS_CPU_ONLY=1"
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = list(_commands(f.read(), strict=False))
    missing = [" ".join(words) for words in pip if words not in ci]
    assert missing == [], "README.md install lines that .ci/run does not run as written"
