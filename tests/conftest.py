"""Test-wide settings. One BLAS thread: on 2 shared cores multi-threaded OpenBLAS is many times
slower for the matrix sizes here (set before any test module imports numpy)."""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def pytest_collection_modifyitems(config, items):
    """The compiled-kernel tests run last: once numba's compiled objects are in ``sys.modules``,
    vLLM 0.32's triton dispatcher (its scan of every module at engine start) fails on one of them
    ('_lib_fn_wrapper' object has no attribute 'get'), so a vLLM engine started later in the same
    process does not come up. A real run uses one or the other, never both in one process."""
    items.sort(key=lambda item: item.path.name == "test_compiled.py")
