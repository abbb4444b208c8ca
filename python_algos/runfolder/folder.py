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
* :func:`check_group_start`, :func:`open_group_folder` — may a group of runs (a comparison, seeds, a
  sweep, a random search) start in a folder, and starting it there: the group's first file is
  written exclusively, so two commands given the same ``--out`` at once never share it;
* :func:`check_group_replaceable`, :func:`clear_group` — what replacing a group checks and removes
  (its record files, its figures and its run folders, nested ones included).
* :func:`unused_claims_removed` — around a command: a claimed folder still empty when it ends (an
  error before anything was written) is removed, so a failed command leaves no folder behind.
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import os
import re
import shutil
from typing import Any, Iterator, List, Mapping, Sequence

from ..system.lock import folders_locked, lock_folder
from .files import RUN_DIRS, RUN_FILES, RUN_MARKS, RunExistsError, RunFolderError, create_json, holds_run

__all__ = ["claim_new_folder", "timestamp", "check_fresh_start", "clear_for_fresh_run", "foreign_entries",
           "unused_claims_removed", "check_group_replaceable", "clear_group", "check_group_start", "open_group_folder"]

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
    there by this command, its workers or anyone else is ever lost. The folders the command opens
    are locked meanwhile (:mod:`python_algos.system.lock`): no other command enters them."""
    start = len(_claimed)
    try:
        with folders_locked():
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


def _check_target(out_dir: str, replace) -> None:
    """Refuse a ``replace`` that is no bool (a truthy string must not delete a run) and an ``out_dir``
    that is a file or lies under one (the nearest of its parents that exists is not a folder)."""
    if not isinstance(replace, bool):
        raise TypeError(f"replace must be True or False, got {replace!r}")
    path = os.path.abspath(out_dir)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise RunFolderError(f"{path} is a file, not a folder; choose another --out (nothing was changed)")


def check_fresh_start(out_dir: str, replace: bool, *, how_to_resume: str = "") -> None:
    """Raise before anything is written unless a fresh run may start in ``out_dir``.

    A folder holding a run is refused (:class:`RunExistsError`) unless ``replace``; a replacement is
    refused (:class:`RunFolderError`) when the folder also holds entries no run writes, which
    :func:`clear_for_fresh_run` would have to keep beside the new run or delete. A folder without a
    run must be empty (or hold only what a run writes): a run among the user's own files is refused."""
    _check_target(out_dir, replace)
    if not holds_run(out_dir):
        foreign = foreign_entries(out_dir)
        if foreign:  # the user's own folder: a run written among its files could not be told apart or replaced
            raise RunFolderError(f"{out_dir} holds {', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''} "
                                 f"and no run: a run goes into a new or empty folder, so nothing was changed: "
                                 f"choose another --out")
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
    lock_folder(out_dir)
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


def _of_the_group(entry: str, records: Sequence[str]) -> bool:
    """Whether the file ``entry`` of a group folder is one of its ``records`` (names, or patterns such
    as ``heatmap-*``), a figure or a temp file."""
    return any(fnmatch.fnmatchcase(entry, r) for r in records) or ".tmp-" in entry or bool(_FIGURE.fullmatch(entry))


def _group_foreign(out_dir: str, records: Sequence[str]) -> List[str]:
    """What in the group folder ``out_dir`` is neither one of its ``records``, a figure, a temp file,
    a run folder holding nothing but a run, nor a folder of those (a comparison of one seed, a sweep's
    ``<algorithm>/<point>/``); a subfolder holding anything else (or nothing) is named as ``name/``."""
    foreign = []
    for entry in sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else ():
        path = os.path.join(out_dir, entry)
        if not (os.path.isdir(path) and not os.path.islink(path)):
            if not _of_the_group(entry, records):
                foreign.append(entry)
        elif not _group_subfolder(path, records):
            foreign.append(entry + "/")
    return foreign


def _group_subfolder(path: str, records: Sequence[str]) -> bool:
    """Whether the subfolder ``path`` of a group is the group's: a run folder holding nothing but its
    run, or a folder holding nothing but the group's entries (an empty one is the user's)."""
    if holds_run(path):
        return not foreign_entries(path)
    return bool(os.listdir(path)) and not _group_foreign(path, records)


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


def check_group_start(out_dir: str, records: Sequence[str], replace: bool, *, how_to_resume: str) -> None:
    """Raise before anything is written unless a new group of runs (a comparison, seeds, a sweep, a
    random search) may start in ``out_dir``: a missing or empty folder, or with ``replace`` one that
    holds nothing but an earlier group (:func:`check_group_replaceable`). A folder holding files is
    refused (:class:`RunExistsError`, naming ``how_to_resume``) unless ``replace``."""
    _check_target(out_dir, replace)
    lock_folder(out_dir)
    if not (os.path.isdir(out_dir) and os.listdir(out_dir)):
        return
    if not replace:
        raise RunExistsError(f"{out_dir} already holds files: continue them with `{how_to_resume}`, or choose "
                             f"another --out; --replace (from Python, replace=True) replaces them (nothing was "
                             f"changed)")
    check_group_replaceable(out_dir, records)


def open_group_folder(out_dir: str, mark: str, record: Mapping[str, Any], records: Sequence[str], *,
                      replace: bool) -> None:
    """Start a group in ``out_dir``, checked by :func:`check_group_start`: the folder is created (with
    ``replace``, emptied of the earlier group: :func:`clear_group`), then its ``mark`` file (the
    group's first, e.g. comparison.json) is written with ``record``, exclusively. Of two commands that
    checked the same folder and start a group there at once, one starts and the other is refused
    (:class:`RunExistsError`) before it writes anything else, so neither runs in the other's folder."""
    if replace:
        clear_group(out_dir, records)
    else:
        os.makedirs(out_dir, exist_ok=True)
    lock_folder(out_dir)
    try:
        if not replace and os.listdir(out_dir):
            raise FileExistsError(out_dir)
        create_json(os.path.join(out_dir, mark), dict(record))
    except FileExistsError:
        raise RunExistsError(f"{out_dir}: another command started in this folder after this one had checked it; "
                             f"what it wrote was left alone and this command did not start: choose another "
                             f"--out") from None

