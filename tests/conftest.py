
import signal

import pytest
import torch

import fedkernels as fk

FLOAT_DTYPES = [torch.float32, torch.float64]
ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _hangup_as_in_a_terminal(request):
    """A test of what SIGHUP does (its id names SIGHUP) runs with SIGHUP's default action, as a command
    started from a terminal has it. Under ``nohup`` the test process ignores SIGHUP and every command it
    starts inherits that, and the library keeps an ignored SIGHUP ignored on purpose (runfolder/signals.py):
    those tests would see no hang-up at all."""
    hup = getattr(signal, "SIGHUP", None)
    if hup is None or "SIGHUP" not in request.node.name or signal.getsignal(hup) is not signal.SIG_IGN:
        yield
        return
    signal.signal(hup, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(hup, signal.SIG_IGN)


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


def pytest_addoption(parser):
    parser.addoption("--fuzz-long", action="store_true", default=False,
                     help="run the differential fuzzers (tests/test_fuzz_*.py) for many more examples: hours, not the "
                          "default run's ~2 minutes; combine with --fuzz-seed to explore other seeds")
    parser.addoption("--fuzz-seed", type=int, default=0,
                     help="first seed of the differential fuzzers (default 0: the seeds CI runs)")


@pytest.fixture
def fuzz_budget(request):
    """``budget(default_examples)`` -> (first seed, number of examples) for a seeded fuzzer: the default run
    is fixed and reproducible; ``--fuzz-long`` multiplies the number of examples by 1000."""
    long_run = request.config.getoption("--fuzz-long")
    first = request.config.getoption("--fuzz-seed")

    def budget(default_examples: int):
        return first, default_examples * (1000 if long_run else 1)
    return budget


class SimulatedKill(BaseException):
    """Raised at a write point: like SIGKILL, nothing in the code under test catches it."""


class _WritePoints:
    """The run folder's write points (``python_algos.runfolder.faults.point``) in this process, for
    the in-process kill tests (a real run's are armed by ``faults.KILL_POINT_ENV`` instead)."""

    Killed = SimulatedKill

    def __init__(self, monkeypatch):
        from python_algos.runfolder import faults
        self._set = lambda f: monkeypatch.setattr(faults, "point", f)

    def record(self) -> list:
        """From now on each point's name is appended to the list returned."""
        names: list = []
        self._set(names.append)
        return names

    def kill_at(self, n: int) -> None:
        """The n-th point from now raises :class:`SimulatedKill` (named by the point)."""
        seen = [0]

        def point(name):
            seen[0] += 1
            if seen[0] == n:
                raise SimulatedKill(name)
        self._set(point)

    def off(self) -> None:
        self._set(lambda name: None)


@pytest.fixture
def write_points(monkeypatch):
    """:class:`_WritePoints` over ``monkeypatch`` (undone at the test's end)."""
    return _WritePoints(monkeypatch)
