"""numba's disk cache for this project, and compiling plain-Python rule modules in place.

Below every package that compiles (the simulator's kernel, the predictors' rules), so that a rule
written once for both kernels never has to import the simulator to be compiled."""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from contextlib import contextmanager
from pathlib import Path


def numba_cache_base() -> str:
    """``$NUMBA_CACHE_DIR``, else leap-sched's cache: where every compiled function's folder lies."""
    from core.io import cache_dir

    return os.environ.get("NUMBA_CACHE_DIR") or str(cache_dir() / "numba")


def cached_per_numba(fn):
    """``fn`` cached apart for the process before and after it loads numba: a rule first run as plain
    Python (a live scheduler's, before any kernel) is compiled when a kernel later loads numba."""
    cached = functools.cache(lambda numba_loaded, *args: fn(*args))

    @functools.wraps(fn)
    def by_numba_state(*args):
        return cached("numba" in sys.modules, *args)

    return by_numba_state


def compile_in_place(namespace: dict, names, source_file: str) -> bool:
    """numba-compile a rule module's plain-Python functions ``names`` in place, as the kernel is
    compiled (no reference counts), cached in a folder named by the module's source (numba
    re-validates a cached function by its own file only; the rules call nothing outside it): True.
    False without numba, when the plain Python runs (the same operations, so the same bits)."""
    # NOTE(live): only where the process has loaded numba already (the compiled kernel's runs): once
    # loaded, numba trips vLLM 0.32's dispatcher scan in any vLLM engine started later in the process,
    # so the live scheduler's rules run as plain Python
    if "numba" not in sys.modules:
        return False
    import numba

    source = Path(source_file)
    folder = f"rules-{source.stem}-{hashlib.sha256(source.read_bytes()).hexdigest()[:12]}"
    saved, numba.config.CACHE_DIR = numba.config.CACHE_DIR, os.path.join(numba_cache_base(), folder)
    try:
        jit = numba.njit(nogil=True, cache=True, _nrt=False)
        for name in names:
            namespace[name] = jit(namespace[name])
    finally:
        numba.config.CACHE_DIR = saved
    return True


@contextmanager
def compile_lock(folder: str):
    """Held while a process compiles (or loads from numba's cache) the functions cached in
    ``folder``: processes that start together (a sweep's pool workers) compile each kernel once,
    the others wait and then load it from the cache. No lock where the folder cannot be made or
    the platform has no ``fcntl`` (each process compiles, as numba alone does)."""
    try:
        import fcntl

        os.makedirs(folder, exist_ok=True)
        handle = open(os.path.join(folder, ".compile.lock"), "a")
    except (ImportError, OSError):
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)   # released when the file closes (or the process dies)
        yield
