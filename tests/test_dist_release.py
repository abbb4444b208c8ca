"""Leaving the process group leaves nothing of it running.

``launch.finish()`` (the end of every distributed command) ends with ``destroy_process_group``; the group's
gloo threads and its TCPStore server must end there, not at interpreter teardown, where they now and then
abort a rank that has already written its results (SIGABRT, "terminate called without an active
exception": a CI run and a rehearsal before it each lost one test to it). Two things kept the group alive:

- ``DistributedClients`` held the group (``self.group``), so a script still holding its executor when it
  leaves kept the group;
- ``torch.distributed.nn.functional`` binds ``group.WORLD`` as a default argument of its collectives when it
  is first imported, and ``torch._dynamo`` imports it; ``torch.func`` (the batched executor's gradients)
  imports ``torch._dynamo`` on first use, after the group exists.

Each case runs in a fresh interpreter, where ``torch._dynamo`` is not loaded yet (checked: else the case
could not fail); the spawned ranks of the distributed tests check the same after their ``finish()``
(``_dist_cases.finish_released``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

SCRIPT = r"""
import importlib, sys
sys.path.insert(0, sys.argv[2])
import torch, torch.distributed as dist
from torch import nn
import _dist_cases
import python_algos as pa

for name in ("torch._dynamo", "torch.distributed.nn.functional"):
    assert name not in sys.modules, f"{name} is loaded already: the case could not fail"
if sys.argv[1] == "caller-group":  # the caller's own group, then torch.distributed.nn imported after it
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    functional = importlib.import_module("torch.distributed.nn.functional")
    assert functional.all_reduce.__defaults__[-1] is dist.group.WORLD  # bound, as torch._dynamo's import binds it
g = torch.Generator().manual_seed(0)
data = [(torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(20)]
clients = pa.DistributedClients(nn.Linear(3, 2), torch.nn.functional.cross_entropy, data, inner="batched")
assert "torch._dynamo" in sys.modules  # the batched executor's torch.func loaded it, after the group
assert _dist_cases.group_threads(), "no thread of the group to watch"
_dist_cases.finish_released()  # the executor is still referenced here, as in a script that ends
print("released")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the threads' names from /proc")
@pytest.mark.parametrize("case", ["own-group", "caller-group"])
def test_finish_leaves_no_thread_of_the_group(case):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # a group of one, not a launcher's
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-c", SCRIPT, case, TESTS], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0 and "released" in done.stdout, done.stderr[-3000:]
