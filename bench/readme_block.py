"""Where a table script's results go: ``--out`` (markdown, plus the raw results as JSON beside it)
and, with ``--readme FILE``, a block of that markdown file between two HTML-comment markers.

Every table script (``prox_table``, ``clients_table``, ``peers``, ``distributed_table``) takes
``--readme FILE`` and writes its table into the block ``<!-- NAME:begin -->`` ... ``<!-- NAME:end -->``
of that file, so the README's numbers are always one run's output, never hand-copied.
"""

from __future__ import annotations

import json
import os
from typing import Tuple


def markers(name: str) -> Tuple[str, str]:
    """The begin / end markers of the block ``name`` (e.g. ``"clients-table"``)."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def update_readme(path: str, body: str, begin: str, end: str) -> None:
    """Put ``body`` between ``begin`` and ``end`` in ``path``; append the block if the file has none.

    Written to a temporary file and renamed over ``path``: an interrupted run leaves the old README.
    """
    text = open(path).read() if os.path.exists(path) else ""
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        a, b = text.index(begin), text.index(end) + len(end)
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_results(out: str, md: str, results: dict) -> None:
    """``md`` to ``out`` and ``results`` to the same path with ``.json`` (re-render it with ``--from-json``)."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write(md + "\n")
    with open(os.path.splitext(out)[0] + ".json", "w") as f:
        json.dump(results, f, indent=1, default=str)


def publish(md: str, results: dict, out: str, readme, begin: str, end: str) -> None:
    """What every table script does with its table: ``md`` and the raw ``results`` to ``out``, the
    block ``begin``..``end`` of ``readme`` (when given) replaced by ``md``, and ``md`` printed."""
    write_results(out, md, results)
    if readme:
        update_readme(readme, md, begin, end)
    print(md)
