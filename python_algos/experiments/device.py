"""``--device`` as a torch device, checked against the machine (its own module: the launcher needs it too)."""

from __future__ import annotations

import torch

from .config import ConfigError

__all__ = ["resolve_device"]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", name, f"CUDA is not available here (torch {torch.__version__}); use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError("device", name, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev
