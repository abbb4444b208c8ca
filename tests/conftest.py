
import pytest
import torch

import fedkernels as fk

FLOAT_DTYPES = [torch.float32, torch.float64]
ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: intra-op threads only add overhead (and stall on a loaded machine). Modules use
    it with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def mem_available_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


# Every regularizer the tests sweep: (name, constructor).
REGULARIZERS = {
    "zero": lambda: fk.Zero(),
    "l1": lambda: fk.L1(0.3),
    "elastic_net": lambda: fk.ElasticNet(0.3, 0.5),
    "mcp": lambda: fk.MCP(0.5, 1.5),
    "scad": lambda: fk.SCAD(0.5, 3.7),
    "box": lambda: fk.Box(-0.5, 0.7),
    "nonneg": lambda: fk.NonNeg(),
}
