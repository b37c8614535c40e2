"""Test-wide settings. One BLAS thread: on 2 shared cores multi-threaded OpenBLAS is many times
slower for the matrix sizes here (set before any test module imports numpy)."""

import os

import pytest

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:        # the hypothesis tests skip with their reason
    pass
else:
    # no per-example deadline anywhere (a test's own @settings keeps its other choices): a wall-clock
    # limit on an example fails a correct test at a load average of 20 on 2 cores, and says nothing
    # about correctness; a hang is still bounded by the test's own (load-stretched) timeout
    _hypothesis_settings.register_profile("leap-suite", deadline=None)
    _hypothesis_settings.load_profile("leap-suite")


pytest_plugins = ["term_unwinds",   # TERM unwinds as Ctrl-C: fixtures stop their servers
                  "either_half"]    # the files this process runs (scripts/pytest_two_halves.sh's queue)


def pytest_collection_modifyitems(config, items):
    """vLLM engines first, the compiled-kernel tests last: once numba's compiled objects are in ``sys.modules``,
    vLLM 0.32's triton dispatcher (its scan of every module at engine start) fails on one of them
    ('_lib_fn_wrapper' object has no attribute 'get'), so a vLLM engine started later in the same
    process does not come up. A real run uses one or the other, never both in one process."""
    items.sort(key=_run_order)


#: The test module whose engine vLLM compiles in the pytest process (tests/test_live_compiled.py).
IN_PROCESS_COMPILED_ENGINE = "test_live_compiled.py"


def _run_order(item) -> int:
    """Tests that start a vLLM engine in this process (marker ``capture``) first, the compiled-kernel
    identity tests last, everything else (most of which runs the kernel: it is the default) between."""
    if item.get_closest_marker("capture") is not None:
        # the one module that builds a torch.compile'd engine in this process goes after the eager ones
        return 1 if item.path.name == IN_PROCESS_COMPILED_ENGINE else 0
    return 3 if item.path.name.startswith("test_compiled") else 2


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A test's time limit (pytest-timeout: the ini's, or its own ``timeout`` marker) is a bound on a
    hang measured on a quiet machine: stretched by the load when the test starts (``core.patience``),
    so that a test that passes alone does not fail at a load average of 20 on 2 cores. Runs before
    pytest-timeout reads the limit (an outer hook wrapper)."""
    from core.patience import load_factor

    factor = load_factor()
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        base = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    else:
        try:
            base = item.config.getini("timeout")
        except ValueError:   # pytest-timeout is not installed: no limit to stretch
            base = None
    if factor > 1 and base:
        item.add_marker(pytest.mark.timeout(float(base) * factor), append=False)
    yield


@pytest.fixture(autouse=True, scope="session")
def _one_kernel_cache(tmp_path_factory):
    """One numba cache of the compiled kernel for the session, inherited by the subprocesses the tests
    start: the kernel runs by default, and a test that gives a run its own ``LEAP_CACHE_DIR`` would
    otherwise compile it again (~20 CPU-s a process). A cache the caller set is kept (the test
    command sets one for all its pytest processes: scripts/pytest_two_halves.sh)."""
    if "NUMBA_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["NUMBA_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "numba")
    yield
    del os.environ["NUMBA_CACHE_DIR"]


@pytest.fixture(scope="session")
def readout_path(tmp_path_factory):
    """The LEAP read-out trained on lmsys, exported as the live plugin loads it (``--readout``)."""
    from live.readout import export_readout

    path = tmp_path_factory.mktemp("readout") / "leap_readout.npz"
    export_readout("lmsys", path)
    return path


@pytest.fixture
def server_factory(tmp_path):
    """Start real ``vllm serve`` processes (``tests/vllm_server.Server``); stop them all afterwards and
    check that no process of their groups is left."""
    from vllm_server import Server, assert_gone

    servers = []

    def start(cfg, name: str, extra: tuple[str, ...] = (), env: dict[str, str] | None = None):
        s = Server(cfg, tmp_path / f"{name}.log", extra, env)
        servers.append(s)
        return s

    def start_command(command: str, name: str, cwd, extra: str = ""):
        s = Server.from_command(command, tmp_path / f"{name}.log", cwd, extra)
        servers.append(s)
        return s

    start.command = start_command

    yield start
    for s in servers:
        s.stop()
        assert_gone(s)


@pytest.fixture(scope="session")
def fcfs_server(tmp_path_factory):
    """One real ``vllm serve`` (FCFS, one decode slot of 8, no wait cap), shared by the tests that
    only send it requests and read its log (tests/test_serve_plugin.py, tests/test_serve_client.py):
    one engine start instead of one per test. A test reads the log lines after its own
    ``server.mark()``; the server is stopped at the end of the session and no process of its group
    may be left."""
    from vllm_server import HAVE, SKIP_REASON, running

    from live.config import LiveSchedulerConfig

    if not HAVE:
        pytest.skip(SKIP_REASON)
    cfg = LiveSchedulerConfig(policy="fcfs", predictor="none", max_resident=8, decode_slots=1, wait_cap=0)
    with running(cfg, tmp_path_factory.mktemp("fcfs-server") / "fcfs.log") as server:
        yield server
