"""The one writer of a Flower app project folder (its ``pyproject.toml``): ``run --flower``'s app and
the benchmarks' apps are the same format with other components and settings."""

from __future__ import annotations

import json
import os

__all__ = ["write_app_project", "toml_value"]


def write_app_project(folder: str, name: str, description: str, serverapp: str, clientapp: str,
                      config: dict) -> str:
    """``folder/name/pyproject.toml`` for a Flower app whose components are ``serverapp`` and
    ``clientapp`` (``module:attr``) and whose run config is ``config`` (str, bool, int or float values);
    returns the app folder. ``name`` must be a valid Flower app name (it is the folder's name too)."""
    app = os.path.join(folder, name)
    os.makedirs(app, exist_ok=True)
    settings = "\n".join(f"{key} = {toml_value(key, value)}" for key, value in config.items())
    with open(os.path.join(app, "pyproject.toml"), "w") as f:
        f.write(f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = {json.dumps(name)}
version = "1.0.0"
description = {json.dumps(description)}
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "python-algos"

[tool.flwr.app.components]
serverapp = {json.dumps(serverapp)}
clientapp = {json.dumps(clientapp)}

[tool.flwr.app.config]
{settings}
""")
    return app


def toml_value(key: str, value) -> str:
    """``value`` (str, bool, int or float) as TOML spells it: a pyproject's config, and the values of
    ``flwr run --run-config`` and ``flower-supernode --node-config``, which Flower parses as TOML."""
    if isinstance(value, float):
        return repr(value)  # inf and nan as TOML spells them (JSON has no spelling)
    if isinstance(value, (bool, int, str)):
        return json.dumps(value, ensure_ascii=False)  # JSON's spelling of these is TOML's
    raise TypeError(f"config {key}: a str, bool, int or float (what Flower's configs hold), got {type(value).__name__}")
