"""Run folders as the command line names and reads them: the default folder, the commands that
resume a run or a comparison, and a run's settings read back from its ``config.json``."""

from __future__ import annotations

import datetime
import json
import os
import shlex

from .config import Config, ConfigError
from ..runfolder.files import RunFolderError

__all__ = ["default_out_dir", "resume_command", "compare_resume_command"]


def default_out_dir(name: str, root: str = "results") -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = os.path.join(root, f"{stamp}-{name}")
    k = 1
    while os.path.exists(path):
        k += 1
        path = os.path.join(root, f"{stamp}-{name}-{k}")
    return path


def _read_config_json(path: str) -> Config:
    try:
        with open(path) as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise RunFolderError(f"{path}, line {e.lineno}: {e.msg}: the run's settings are damaged; restore the file "
                             f"from a copy") from None
    if not isinstance(d, dict):
        raise RunFolderError(f"{path}: expected a JSON object of settings")
    if d.get("api_run") is True:  # written by History.save: no checkpoint, no data recipe to rebuild the run
        folder = os.path.dirname(path) or "."
        raise RunFolderError(f"cannot resume {folder}: it is a run saved from Python with History.save (a simulate() "
                             f"result), which has no checkpoint or data settings to continue from; draw it with "
                             f"`python -m python_algos plot {shlex.quote(folder)}` (nothing was changed)")
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
