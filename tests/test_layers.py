"""The package's layers: ``import python_algos`` stays below the application, and no module of the
package imports (directly or through others) a module that imports it back.

Layers, bottom to top: ``system`` (child processes, folder locks), ``runfolder`` (the run-folder
files, checkpoints, the progress display),
``clients``, ``algorithms``, ``simulate``, ``experiments`` (the application, with ``__main__``).
A module may import its own layer and the ones below it, never one above. The import graph is read
from the source with ``ast`` (absolute and relative imports, module level and inside functions), so
an import that runs only when a function is called counts too: it is a dependency all the same.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = "python_algos"
LAYERS = ("system", "runfolder", "clients", "algorithms", "simulate", "data", "deploy", "experiments")  # bottom to top
# ``python_algos/__init__`` re-exports simulate and what is below it; ``__main__`` is the command line
TOP = {"": LAYERS.index("simulate"), "testing": LAYERS.index("simulate"), "__main__": LAYERS.index("experiments")}

# Cycles the layering test knows about, as the sorted modules of the cycle, each with its reason.
# The clients registry (``clients/__init__``: EXECUTORS, resolve_executor) lists DistributedClients,
# whose constructor looks the registry up again for its inner executor (a function-level import).
KNOWN_CYCLES: dict = {}  # (module, module) -> why the cycle is tolerated; none is


def _modules() -> dict:
    """Module name -> source path, for every .py file of the package."""
    out = {}
    base = os.path.join(ROOT, PKG)
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, f), ROOT)[: -len(".py")].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join(rel)] = os.path.join(folder, f)
    return out


def _resolve(name: str, modules: dict) -> str:
    """The module of the package that ``name`` (a module or a name inside one) refers to."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def import_graph() -> dict:
    """Module -> {module it imports: first line of that import}, within the package."""
    modules = _modules()
    graph = {}
    for mod, path in modules.items():
        is_pkg = os.path.basename(path) == "__init__.py"
        package = mod if is_pkg else mod.rsplit(".", 1)[0]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        edges = {}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - (node.level - 1)])
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                # `from X import Y`: Y may be a submodule of X, or a name defined in X
                targets = [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                if t == PKG or t.startswith(PKG + "."):
                    target = _resolve(t, modules)
                    if target != mod:
                        edges.setdefault(target, node.lineno)
        graph[mod] = edges
    return graph


def _layer(mod: str) -> int:
    rest = mod[len(PKG) + 1:] if mod != PKG else ""
    head = rest.split(".", 1)[0]
    if head in TOP:
        return TOP[head]
    return LAYERS.index(head)


def find_cycles(graph: dict) -> list:
    """Every strongly connected component of more than one module (Tarjan), each as a sorted tuple."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(tuple(sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _cycle_path(graph: dict, comp: tuple) -> str:
    """One cycle through the component, as `a -> b -> a` with the line of each import."""
    members = set(comp)
    start = comp[0]
    path, seen = [start], {start}
    while True:
        nxt = next(w for w in sorted(graph[path[-1]]) if w in members)
        if nxt in seen:
            loop = path[path.index(nxt):] + [nxt]
            return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(loop, loop[1:])) + f" -> {nxt}"
        path.append(nxt)
        seen.add(nxt)


_LIBRARY_USE = """
import os, sys, tempfile, torch, python_algos
from python_algos import History, make, simulate
from python_algos.runfolder.callbacks import ShowProgress
before = sorted(m for m in sys.modules if m.startswith("python_algos.experiments"))
torch.manual_seed(0)
X, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64)
model = torch.nn.Linear(3, 1).double()
hist = simulate(make("fedavg", lr=0.1, local_steps=1), model, torch.nn.functional.mse_loss,
                [(X[:4], y[:4]), (X[4:], y[4:])], rounds=2, callbacks=[ShowProgress()])
path = os.path.join(tempfile.mkdtemp(), "run")
hist.save(path)
assert History.load(path).metrics[-1]["round"] == 2
after = sorted(m for m in sys.modules if m.startswith("python_algos.experiments"))
print(" ".join(before) + "|" + " ".join(after))
"""


def test_the_library_loads_nothing_of_the_experiments_layer():
    """``import python_algos``, then simulate with ShowProgress, History.save and History.load: the run
    folder and the progress display they use sit below ``simulate``, not in the application."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", _LIBRARY_USE], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    on_import, after_use = out.stdout.strip().split("|")
    assert on_import == "", f"`import python_algos` imported {on_import}"
    assert after_use == "", f"simulate(callbacks=[ShowProgress()]) / History.save / History.load imported {after_use}"


def test_every_module_is_in_a_layer():
    for mod in import_graph():
        _layer(mod)  # raises ValueError for a top-level module or package no layer names


def test_no_import_cycle():
    graph = import_graph()
    cycles = [c for c in find_cycles(graph) if c not in KNOWN_CYCLES]
    assert not cycles, "import cycles:\n" + "\n".join(_cycle_path(graph, c) for c in cycles)


def test_lower_layers_never_import_higher_ones():
    graph = import_graph()
    bad = [f"{a} (line {line}) imports {b}" for a, edges in sorted(graph.items()) for b, line in sorted(edges.items())
           if _layer(b) > _layer(a)]
    assert not bad, "imports that go up a layer (order: " + " < ".join(LAYERS) + "):\n" + "\n".join(bad)


def test_the_graph_sees_relative_absolute_and_function_level_imports():
    """The parser itself, on imports the package is known to have (a test of the test)."""
    graph = import_graph()
    assert f"{PKG}.clients.base" in graph[f"{PKG}.algorithms.base"]  # from ..clients.base import ClientSet
    assert f"{PKG}.experiments.launch" in graph[f"{PKG}.experiments.cli.commands"]  # from .. import launch
    assert f"{PKG}.clients.batched" in graph[f"{PKG}.clients.distributed"]  # from .batched import (in a function)
    assert f"{PKG}.algorithms.registry" in graph[f"{PKG}.experiments.config"]  # function-level, two dots
    assert f"{PKG}.experiments.cli" in graph[f"{PKG}.__main__"]
    assert find_cycles({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}) == [("a", "b", "c")]


# --- size budgets (issue 36, item 7): guards that were only promises ---------------------------------- #

MAX_FUNCTION_LINES = 80  # a function's body, docstring included (the developers' guide)
# all lines of the files, counted as `cat FILES | wc -l`
# experiments/: issue 36 asks for <= 8,400; it is 9,228 (9,051 before issue 36, whose deletions there were offset
# by issue 37's bundled data sets, survival task and loaders). Held where it is so that it cannot grow further;
# lower it as the remaining item-7 deletions (label maps, one folder format, build.py's trial rebuilds) land.
# runfolder/: issue 36's 2,050, with issue 38's records.run_warning (31 lines) paid for by deletions of repeats.
# data/: 1,700 held issue 37/38's readers; issue 39 item 3 adds a mechanism none of them had (clients built from a
# folder or a data set's rows when sampled: population_sources.py, the cyclic partition), hence 1,880.
LINE_BUDGETS = {"python_algos/simulate.py": 480, "python_algos/runfolder": 2050, "python_algos/deploy": 2050,
                "python_algos/experiments": 8400, "python_algos/data": 1880}


def _package_files():
    for folder, dirs, files in os.walk(os.path.join(ROOT, PKG)):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        yield from (os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))


def _tree(path):
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def test_no_function_body_is_over_80_lines():
    long = []
    for path in _package_files():
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.body[0].lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name}: {size} lines")
    assert not long, f"function bodies over {MAX_FUNCTION_LINES} lines (docstring included):\n" + "\n".join(long)


def test_no_module_imports_another_modules_private_name():
    bad = []
    for path in _package_files():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom):
                bad += [f"{os.path.relpath(path, ROOT)}:{node.lineno} imports {a.name} from "
                        f"{'.' * node.level}{node.module or ''}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
            elif isinstance(node, ast.Import):
                bad += [f"{os.path.relpath(path, ROOT)}:{node.lineno} imports {a.name}" for a in node.names
                        if any(part.startswith("_") and not part.startswith("__") for part in a.name.split("."))
                        and a.name.startswith(PKG)]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_the_private_import_check_sees_one():
    """A test of the test: the AST walk finds `from .x import _y`."""
    tree = ast.parse("from .files import _tmp_name\n")
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names]
    assert names == ["_tmp_name"] and names[0].startswith("_")


def _lines(path: str) -> int:
    """All lines of the file, or of the folder's .py files (nested ones included)."""
    full = os.path.join(ROOT, path)
    files = [full] if os.path.isfile(full) else [os.path.join(d, f) for d, _, fs in os.walk(full) for f in fs
                                                  if f.endswith(".py")]
    total = 0
    for name in files:
        with open(name, encoding="utf-8") as f:
            total += sum(1 for _ in f)
    return total


@pytest.mark.parametrize("path", sorted(LINE_BUDGETS))
def test_line_budget(path):
    lines = _lines(path)
    assert lines <= LINE_BUDGETS[path], f"{path}: {lines} lines, over its budget of {LINE_BUDGETS[path]}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
