"""Values typed on the command line (``KEY=VALUE``), shared by the CLI's flags and ``sweep --grid``.

Standard library only, so the CLI can parse its arguments before importing torch."""

from __future__ import annotations

import json

__all__ = ["parse_value"]


def parse_value(text: str):
    """A KEY=VALUE value: JSON (numbers, true/false/null, [lists]), else the raw string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
