"""Run folders as the command line names and reads them: the default folder (created when named),
the commands that resume a run or a comparison, and a run's settings read back from its ``config.json``."""

from __future__ import annotations

import os
import shlex

from ..runfolder.files import RunFolderError, read_json_object
from ..runfolder.folder import claim_new_folder
from ..runfolder.records import FORMAT_KEY, run_folder_name
from .config import Config, ConfigError

__all__ = ["default_out_dir", "resume_command", "compare_resume_command", "read_config_json"]


def default_out_dir(name: str, root: str = "results") -> str:
    """A new, empty folder ``root/<date>-<time>-<name>`` for a command given no ``--out``, created
    here (:func:`~python_algos.runfolder.folder.claim_new_folder`): two commands started in the same
    second get two folders. Being new, it is never a run to replace. A user's class given as
    ``package.module:Class`` is named without the ``:`` (``run_folder_name``)."""
    return claim_new_folder(root, run_folder_name(name))


def read_config_json(path: str) -> Config:
    try:
        d = read_json_object(path)
    except RunFolderError as e:
        raise RunFolderError(f"{e}: the run's settings are damaged; restore the file from a copy") from None
    if d.get("api_run") is True:  # written by History.save: no checkpoint, no data recipe to rebuild the run
        folder = os.path.dirname(path) or "."
        raise RunFolderError(f"cannot resume {folder}: it is a run saved from Python with History.save (a simulate() "
                             f"result), which has no checkpoint or data settings to continue from; draw it with "
                             f"`python -m python_algos plot {shlex.quote(folder)}` (nothing was changed)")
    d.pop(FORMAT_KEY, None)  # the folder's format (records.check_format), not a setting
    try:
        return Config.from_dict(d)
    except ConfigError as e:
        raise e.in_file(path) from None
    except ValueError as e:
        raise RunFolderError(f"{path}: {e}") from None


def resume_command(out_dir: str) -> str:
    return f"python -m python_algos run --resume {shlex.quote(out_dir)}"


def compare_resume_command(out_dir: str) -> str:
    return f"python -m python_algos compare --resume {shlex.quote(out_dir)}"
