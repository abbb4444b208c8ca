"""Joining the process group: NCCL gets the same bounded timeout as gloo (checked on CPU by
recording what ensure_group hands to torch.distributed)."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from python_algos.clients import process_group


@pytest.mark.parametrize("device,backend", [("cuda", "nccl"), ("cpu", "gloo")])
@pytest.mark.parametrize("timeout,env,want",
                         [(7.0, None, 7.0), (None, "11", 11.0), (None, None, process_group.DEFAULT_TIMEOUT)])
def test_every_backend_gets_the_bounded_timeout(monkeypatch, device, backend, timeout, env, want):
    seen = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.setdefault("device", d))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(backend=backend, **kw))
    monkeypatch.delenv("RANK", raising=False)
    if env is None:
        monkeypatch.delenv(process_group.TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(process_group.TIMEOUT_ENV, env)
    process_group.ensure_group(torch.device(device), timeout)
    assert seen["backend"] == backend
    assert seen["timeout"] == datetime.timedelta(seconds=want)


def test_a_bad_timeout_is_refused():
    with pytest.raises(ValueError, match="timeout must be > 0"):
        process_group.timeout_seconds(0)
