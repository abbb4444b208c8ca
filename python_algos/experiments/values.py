"""Values typed on the command line, shared by the CLI's flags and ``sweep --grid``: each parser
takes the text the user typed and returns the value, or raises ``ValueError`` with the rule it
breaks (the caller puts the flag, as typed, in front: ``-K abc: must be an integer``).

Standard library only: these run while the arguments are parsed."""

from __future__ import annotations

import json

__all__ = ["parse_value", "parse_int", "parse_float", "parse_batch", "parse_option", "parse_reg_param",
           "parse_seed"]


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


def parse_int(text: str) -> int:
    """An integer; its bounds are the setting's check."""
    try:
        return int(text)
    except ValueError:
        raise ValueError("must be an integer") from None


def parse_float(text: str) -> float:
    """A number (``nan`` and ``inf`` read as themselves: the setting's check names them)."""
    try:
        return float(text)
    except ValueError:
        raise ValueError("must be a number") from None


def parse_batch(text: str):
    """-B: a minibatch size >= 1, or 'full' (full local gradients). One rule everywhere: simulate's
    batch_size and a config file's batch_size are an int >= 1 or None / null for full gradients,
    so 0 is refused here too instead of meaning 'full' on the command line alone."""
    if text.strip().lower() in ("full", "none"):
        return None
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise ValueError("must be an integer >= 1 (samples per minibatch), or 'full' for full local gradients")
    return v


def parse_option(text: str):
    """KEY=VALUE (``--alg-opt``, ``--data-opt``, ...) -> (KEY, the value by :func:`parse_value`)."""
    if "=" not in text:
        raise ValueError("expected KEY=VALUE")
    k, v = text.split("=", 1)
    if not k.strip():
        raise ValueError("expected KEY=VALUE with a non-empty KEY")
    return k.strip(), parse_value(v)


def parse_reg_param(text: str):
    """--reg-param PATTERN=NAME[,KEY=VALUE...] -> (PATTERN, "NAME" or {"reg": NAME, KEY: VALUE})."""
    if "=" not in text:
        raise ValueError("expected PATTERN=SPEC (e.g. '*.bias=none' or "
                         "'net.0.weight=group_lasso,lam=0.01,groups=cols')")
    pattern, spec = (s.strip() for s in text.split("=", 1))
    name, *options = (s.strip() for s in spec.split(","))
    if not pattern or not name:
        raise ValueError("expected PATTERN=SPEC with both parts non-empty")
    if not options:
        return pattern, name
    entry = {"reg": name}
    for o in options:
        if "=" not in o:
            raise ValueError(f"options after the name are KEY=VALUE, got {o!r}")
        k, v = o.split("=", 1)
        entry[k.strip()] = parse_value(v)
    return pattern, entry


def parse_seed(text: str):
    """--seed: an integer, or a comma-separated list of them (one run per seed: integers >= 0, none
    repeated, the rule of :func:`~.seeds.seed_list` for a config file's list)."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()] if "," in text else int(text)
    except ValueError:
        raise ValueError("expected an integer or a comma-separated list such as 1,2,3") from None
    if isinstance(seeds, list):
        if not seeds or any(s < 0 for s in seeds):
            raise ValueError("seeds must be integers >= 0")
        if len(set(seeds)) != len(seeds):
            raise ValueError("a seed is repeated (each seed is one independent run)")
    return seeds
