"""Test-wide settings. One BLAS thread: on 2 shared cores multi-threaded OpenBLAS is many times
slower for the matrix sizes here (set before any test module imports numpy)."""

import os

import pytest

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def pytest_collection_modifyitems(config, items):
    """vLLM engines first, the compiled-kernel tests last: once numba's compiled objects are in ``sys.modules``,
    vLLM 0.32's triton dispatcher (its scan of every module at engine start) fails on one of them
    ('_lib_fn_wrapper' object has no attribute 'get'), so a vLLM engine started later in the same
    process does not come up. A real run uses one or the other, never both in one process."""
    items.sort(key=_run_order)


def _run_order(item) -> int:
    """Tests that start a vLLM engine in this process (marker ``capture``) first, the compiled-kernel
    identity tests last, everything else (some of which runs the kernel) between."""
    if item.get_closest_marker("capture") is not None:
        return 0
    return 2 if item.path.name == "test_compiled.py" else 1


@pytest.fixture
def server_factory(tmp_path):
    """Start real ``vllm serve`` processes (``tests/vllm_server.Server``); stop them all afterwards and
    check that no process of their groups is left."""
    from vllm_server import Server, group_members

    servers = []

    def start(cfg, name: str, extra: tuple[str, ...] = ()):
        s = Server(cfg, tmp_path / f"{name}.log", extra)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()
        assert not group_members(s.pgid), f"processes left after stopping the server: {group_members(s.pgid)}"
