"""Making and emptying run folders: the one place that decides which folder a run gets and what of
an earlier run may be deleted.

* :func:`claim_new_folder` — a default folder (``results/<stamp>-<name>``): created when its name is
  chosen, with ``os.mkdir``, which fails if the folder exists; then the next suffix is tried. Two
  commands started in the same second therefore never share a folder (choosing a free name and
  creating it later would let both choose the same one; issue 26, defect 1).
* :func:`check_fresh_start` — may a fresh run start in a folder: refuses a folder that holds a run
  unless asked to replace it, and a replacement in a folder that holds anything a run does not write.
* :func:`clear_for_fresh_run` — removes every entry an earlier run left (its files, TensorBoard events,
  checkpoint shards, Flower states, figures, temp files), and nothing else.
* :func:`check_group_replaceable`, :func:`clear_group` — the same two for a folder of runs (a
  comparison: its record files, its figures and one run folder per algorithm).
* :func:`unused_claims_removed` — around a command: a claimed folder still empty when it ends (an
  error before anything was written) is removed, so a failed command leaves no folder behind.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
from typing import Iterator, List, Sequence

from .files import RUN_DIRS, RUN_FILES, RUN_MARKS, RunExistsError, RunFolderError, holds_run

__all__ = ["claim_new_folder", "timestamp", "check_fresh_start", "clear_for_fresh_run", "foreign_entries",
           "unused_claims_removed", "check_group_replaceable", "clear_group"]

# Figures the package draws into a run folder: `run`/`compare` the overview, `plot DIR` one per metric
# and x axis (experiments/plotting: "overview", "<metric>_vs_round", "<metric>_vs_time"). A figure of
# another name or format counts as the user's file: a replacement then refuses rather than delete it.
_FIGURE = re.compile(r"(overview|\w+_vs_(round|time))\.(png|pdf|svg)")

_claimed: List[str] = []  # folders this process created with claim_new_folder (and the roots made for them)


def timestamp() -> str:
    """The time part of a default folder's name (tests replace it to force two claims into one second)."""
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def claim_new_folder(root: str, name: str) -> str:
    """Create and return a new, empty folder ``root/<stamp>-<name>`` (``-2``, ``-3``, ... when taken).

    The folder exists when this returns and no other call (thread or process) got it: ``os.mkdir``
    is the check, atomic on every local file system."""
    stamp, k = timestamp(), 1
    while True:
        path = os.path.join(root, f"{stamp}-{name}" + (f"-{k}" if k > 1 else ""))
        try:
            os.mkdir(path)
        except FileExistsError:
            k += 1
            continue
        except FileNotFoundError:  # no root yet (or a failed command that made it has just removed it)
            _make_root(root)
            continue
        _claimed.append(path)
        return path


def _make_root(root: str) -> None:
    """Create the results root; one made here is removed with the claim if the command writes nothing."""
    try:
        os.makedirs(root)
    except FileExistsError:
        return
    _claimed.append(root)


@contextlib.contextmanager
def unused_claims_removed() -> Iterator[None]:
    """Remove, on leaving, every folder claimed inside that is still empty (the command failed or was
    interrupted before it wrote anything). ``os.rmdir`` removes empty folders only, so nothing written
    there by this command, its workers or anyone else is ever lost."""
    start = len(_claimed)
    try:
        yield
    finally:
        for path in reversed(_claimed[start:]):  # a claimed folder before the results root made for it
            with contextlib.suppress(OSError):
                os.rmdir(path)
        del _claimed[start:]


def _of_a_run(entry: str) -> bool:
    """Whether ``entry`` (a name in a run folder) is something a run or its figures write."""
    return entry in RUN_FILES or entry in RUN_DIRS or ".tmp-" in entry or bool(_FIGURE.fullmatch(entry))


def foreign_entries(out_dir: str) -> List[str]:
    """The names in ``out_dir`` that no run writes (sorted); [] for a missing folder."""
    if not os.path.isdir(out_dir):
        return []
    return sorted(e for e in os.listdir(out_dir) if not _of_a_run(e))


def check_fresh_start(out_dir: str, replace: bool, *, how_to_resume: str = "") -> None:
    """Raise before anything is written unless a fresh run may start in ``out_dir``.

    A folder holding a run is refused (:class:`RunExistsError`) unless ``replace``; a replacement is
    refused (:class:`RunFolderError`) when the folder also holds entries no run writes, which
    :func:`clear_for_fresh_run` would have to keep beside the new run or delete. A folder without a
    run takes the run beside what it holds, as it always has."""
    if not isinstance(replace, bool):  # a truthy string must not delete a run
        raise TypeError(f"replace must be True or False, got {replace!r}")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise RunFolderError(f"{out_dir} is a file, not a folder; choose another --out (nothing was changed)")
    if not holds_run(out_dir):
        return
    if not replace:
        raise RunExistsError(f"{out_dir} already holds a run: continue it with `{how_to_resume}`, or choose "
                             f"another --out; --replace (from Python, replace=True) replaces it (nothing was changed)")
    foreign = foreign_entries(out_dir)
    if foreign:
        raise RunFolderError(f"{out_dir} holds a run and also {', '.join(foreign)}, which no run writes; replacing "
                             f"the run would leave them beside the new one, so nothing was changed: move them out "
                             f"of the folder, or choose another --out")


def clear_for_fresh_run(out_dir: str, replace: bool = True) -> None:
    """Create ``out_dir`` if needed; with ``replace``, remove every entry an earlier run left there: its
    files, ``tensorboard/`` events, checkpoint shards, Flower states, figures and temp files. Entries no
    run writes are kept (:func:`check_fresh_start` refused to replace a run beside them), and so is
    everything in a folder that holds no run (a figure there is the user's, not a run's). Without
    ``replace`` nothing is removed: a run that another command started there since the check is not
    this call's to delete (the fresh run's exclusive config.json then refuses to start).

    The files that mark a run (:func:`~.files.holds_run`) go last: a kill midway leaves a folder that
    still holds a run, which a later replacement clears of the rest."""
    os.makedirs(out_dir, exist_ok=True)
    if not (replace and holds_run(out_dir)):
        return
    entries = [e for e in os.listdir(out_dir) if _of_a_run(e)]
    for entry in sorted(entries, key=lambda e: e in RUN_MARKS):
        _remove_entry(os.path.join(out_dir, entry))

def _remove_entry(path: str) -> None:
    """Remove one entry of a folder: a folder with its contents, or a file (a link is removed, never
    followed); one already gone is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _group_foreign(out_dir: str, records: Sequence[str]) -> List[str]:
    """What in the group folder ``out_dir`` is neither one of its ``records``, a figure, a temp file,
    nor a run folder holding nothing but a run."""
    foreign = []
    for entry in sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else ():
        path = os.path.join(out_dir, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            if not (holds_run(path) and not foreign_entries(path)):
                foreign.append(entry + "/")
        elif not (entry in records or ".tmp-" in entry or _FIGURE.fullmatch(entry)):
            foreign.append(entry)
    return foreign


def check_group_replaceable(out_dir: str, records: Sequence[str]) -> None:
    """Raise :class:`RunFolderError` (before anything is written) when replacing the group folder
    ``out_dir`` (e.g. a comparison, ``records`` = its comparison.json / .md) would delete something
    that is not the group's: a file, or a subfolder that is not a run or holds files no run writes."""
    foreign = _group_foreign(out_dir, records)
    if foreign:
        raise RunFolderError(f"{out_dir} holds {', '.join(foreign)}, which are not its runs or records; replacing "
                             f"it would delete them, so nothing was changed: move them out of the folder, or choose "
                             f"another --out")


def clear_group(out_dir: str, records: Sequence[str]) -> None:
    """Create the group folder ``out_dir`` if needed and remove what an earlier group left there: its
    ``records``, figures, temp files and run folders (checked by :func:`check_group_replaceable`), so
    no run of the old group is shown beside the new ones."""
    os.makedirs(out_dir, exist_ok=True)
    if _group_foreign(out_dir, records):  # changed since the check: keep everything
        check_group_replaceable(out_dir, records)
    for entry in os.listdir(out_dir):
        _remove_entry(os.path.join(out_dir, entry))
